"""Random models: a tiny model of a supported family, randomly initialised in code from a
``random:<family>[:key=value,...]`` spec (no download, offline), with the byte-level
tokenizer so that it runs on any text.
"""

from __future__ import annotations

import numbers

from ..errors import InputError, ModelError
from .hashing import config_sha256
from .pretrained import Checkpoint
from .tokenizer import random_tokenizer

__all__ = ["load_random"]


def load_random(spec: str, *, seed: int) -> Checkpoint:
    """Build the model of a ``random:<family>[:key=value,...]`` spec under ``seed``.

    Parameters
    ----------
    spec : str
        ``random:`` then a family name and optional configuration overrides.
    seed : int
        Seed of the initialisation, from 0 to ``2**64 - 1``.

    Returns
    -------
    Checkpoint
        With the byte-level tokenizer (:func:`~depthlens.models.tokenizer.random_tokenizer`);
        ``provenance['sha256']`` is that of the configuration.

    Raises
    ------
    ModelError
        No family, an unknown family or a bad override.
    InputError
        A seed that is not an integer in range.

    Examples
    --------
    >>> checkpoint = load_random("random:gpt2:n_layer=2", seed=0)
    >>> checkpoint.name, checkpoint.provenance["seed"], checkpoint.model.config.n_layer
    ('random:gpt2:n_layer=2', 0, 2)
    """
    from .families import build_random

    _, _, rest = spec.partition(":")
    family, _, overrides = rest.partition(":")
    family = family.strip()
    if not family:
        from .families import FAMILIES

        raise ModelError(f"spec {spec!r} names no family; write random:<family> with one of {', '.join(FAMILIES)}.")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**64:
        raise InputError(f"--seed {seed!r} is invalid for a random model; pass an integer from 0 to 2**64 - 1.")
    model = build_random(family, overrides.strip() or None, seed=int(seed))
    tokenizer = random_tokenizer(model)
    provenance = {
        "spec": spec,
        "revision": None,
        "source": "random",
        "seed": int(seed),
        "overrides": overrides.strip() or None,
        "sha256": config_sha256(model.config),
        "files": {},
        "weights_format": "random",
    }
    return Checkpoint(model, tokenizer, spec, provenance)
