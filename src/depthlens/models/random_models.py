"""Random models: a tiny model of a supported family, randomly initialised in code from a
``random:<family>[:key=value,...]`` spec (no download, offline), with the byte-level
tokenizer so that it runs on any text.
"""

from __future__ import annotations

import numbers
from typing import Any

from ..errors import InputError, ModelError
from .hashing import config_sha256
from .pretrained import Checkpoint
from .tokenizer import random_tokenizer

__all__ = ["INITS", "load_random", "random_spec"]


#: The ``init=`` values of a random spec: the model class's initialisation of the whole model
#: under the seed (default), or each layer drawn on its own (``layerwise``, streamable).
INITS = ("model", "layerwise")


def random_spec(spec: str, stream_layers: bool = False) -> tuple[str, dict[str, Any], str]:
    """The family, configuration overrides and ``init`` of a ``random:<family>[:key=value,...]``
    spec, checked without building anything (configuration keys and values included).

    Raises
    ------
    ModelError
        No family, an unknown family, a bad override or ``init`` value, or ``stream_layers``
        without ``init=layerwise``.
    """
    from .families import FAMILIES, parse_overrides, random_config

    _, _, rest = spec.partition(":")
    family, _, overrides = rest.partition(":")
    family = family.strip()
    if not family:
        raise ModelError(f"spec {spec!r} names no family; write random:<family> with one of {', '.join(FAMILIES)}.")
    values = parse_overrides(overrides.strip() or None)
    init = str(values.pop("init", "model"))
    if init not in INITS:
        raise ModelError(f"--model {spec}: init={init} is not one of {', '.join(INITS)}; write init=layerwise or leave it out.")
    if stream_layers and init != "layerwise":
        raise ModelError(f"--model {spec} is drawn as a whole, so its layers cannot be streamed; add init=layerwise "
                         f"(random:{family}:init=layerwise,...) or drop --stream-layers.")
    random_config(family, values)
    return family, values, init


def load_random(spec: str, *, seed: int, stream_layers: bool = False) -> Checkpoint:
    """Build the model of a ``random:<family>[:key=value,...]`` spec under ``seed``.

    The override ``init=layerwise`` draws each decoder layer (and the weights outside the
    layers) on its own from the class's initialisation under a seed derived from ``seed`` and
    the layer (:class:`~depthlens.models.streaming.LayerwiseInit`), so a layer can be made on
    demand: with ``stream_layers`` the model is a skeleton whose layers are generated when used
    (any size, one layer in memory), without it the same weights are made at once.

    Parameters
    ----------
    spec : str
        ``random:`` then a family name and optional configuration overrides.
    seed : int
        Seed of the initialisation, from 0 to ``2**64 - 1``.
    stream_layers : bool
        Stream the layers (needs ``init=layerwise``).

    Returns
    -------
    Checkpoint
        With the byte-level tokenizer (:func:`~depthlens.models.tokenizer.random_tokenizer`);
        ``provenance['sha256']`` is that of the configuration.

    Raises
    ------
    ModelError
        No family, an unknown family or a bad override; ``stream_layers`` without
        ``init=layerwise``.
    InputError
        A seed that is not an integer in range.

    Examples
    --------
    >>> checkpoint = load_random("random:gpt2:n_layer=2", seed=0)
    >>> checkpoint.name, checkpoint.provenance["seed"], checkpoint.model.config.n_layer
    ('random:gpt2:n_layer=2', 0, 2)
    """
    from .families import build_random, random_config

    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**64:
        raise InputError(f"--seed {seed!r} is invalid for a random model; pass an integer from 0 to 2**64 - 1.")
    family, values, init = random_spec(spec, stream_layers)
    layers = None
    if init == "layerwise":
        from .streaming import LayerwiseInit, materialize_all, skeleton

        model = skeleton(random_config(family, values))
        layers = LayerwiseInit(int(seed))
        if not stream_layers:
            model, layers = materialize_all(model, layers), None
    else:
        model = build_random(family, values, seed=int(seed))
    tokenizer = random_tokenizer(model)
    provenance = {
        "spec": spec,
        "revision": None,
        "source": "random",
        "seed": int(seed),
        "overrides": spec.partition(":")[2].partition(":")[2].strip() or None,
        "sha256": config_sha256(model.config),
        "files": {},
        "weights_format": "random",
        "init": init,
    }
    return Checkpoint(model, tokenizer, spec, provenance, layers)
