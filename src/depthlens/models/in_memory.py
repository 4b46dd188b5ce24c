"""Models that come from another model rather than from a spec: the step-0 null of a loaded
model (:func:`init_like`, same architecture, fresh initial weights) and a ``transformers``
model already in memory (:func:`wrap_model`)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch

from ..errors import InputError, ModelError
from .hashing import config_sha256
from .loading import LoadedModel, finish_model
from .pretrained import quiet_transformers
from .tokenizer import random_tokenizer

__all__ = ["init_like", "weights_sha256", "wrap_model"]


def init_like(loaded: LoadedModel, seed: int = 0) -> LoadedModel:
    """The same architecture, configuration and tokenizer with freshly initialised weights.

    The weights come from the model class's own initialisation under ``seed`` (what
    training would have started from), so the result is the step-0 null of ``loaded``.
    The global torch RNG state is left as it was; the same seed gives identical weights.
    For a layer-streamed model, and for a ``random:...:init=layerwise`` one, each layer is
    drawn on its own (:class:`~depthlens.models.streaming.LayerwiseInit`; streamed again for a
    streamed model), so these nulls differ from the whole-model draw of the same seed.

    Parameters
    ----------
    loaded : LoadedModel
        The model to copy the architecture of.
    seed : int
        Seed of the initialisation.

    Returns
    -------
    LoadedModel
        Same dtype and device as ``loaded``; ``provenance['source']`` is ``"random"``,
        ``provenance['null_of']`` records the original (spec, revision, sha256, name).
    """
    if not isinstance(loaded, LoadedModel):
        raise InputError(f"init_like needs a LoadedModel, not {type(loaded).__name__}; pass load_model(...)'s result.")
    original = loaded.model
    config = copy.deepcopy(original.config)
    config._attn_implementation = "eager"
    try:
        param = next(original.parameters())
        dtype, device = param.dtype, param.device
    except StopIteration:  # pragma: no cover
        dtype, device = torch.float32, torch.device("cpu")
    streamer = loaded.adapter.streamer
    if streamer is not None or loaded.provenance.get("init") == "layerwise":
        from .streaming import LayerwiseInit, materialize_all, skeleton

        fresh, layers = skeleton(config), LayerwiseInit(int(seed))
        how = f"each layer of {type(original).__name__}(config) drawn on its own (init=layerwise) under seed {int(seed)}"
        if streamer is None:
            fresh, layers = materialize_all(fresh, layers), None
        else:
            dtype, device = streamer.dtype, streamer.device
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            with quiet_transformers():
                fresh = type(original)(config)
        layers, how = None, f"{type(original).__name__}(config) under torch.manual_seed({int(seed)})"
    prov = loaded.provenance
    provenance = {
        "spec": prov.get("spec"),
        "revision": prov.get("revision"),
        "source": "random",
        "seed": int(seed),
        "init": how,
        "null_of": {k: prov.get(k) for k in ("name", "spec", "revision", "source", "sha256", "commit") if k in prov},
        "sha256": config_sha256(fresh.config),
        "files": {},
        "weights_format": "random",
    }
    name = f"{loaded.name}@init{int(seed)}"
    return finish_model(fresh, loaded.tokenizer, name, provenance, layers, dtype, device)


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of a model's parameters and buffers: names, dtypes, shapes and bytes, in
    ``state_dict`` order (the identity of in-memory weights)."""
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def wrap_model(model: torch.nn.Module, tokenizer: Any = None, name: str | None = None) -> LoadedModel:
    """A model already in memory (a ``transformers`` ``*ForCausalLM`` of a supported family),
    ready for analysis like :func:`load_model`'s result.

    The model is finished in place, keeping its dtype and device: eval mode, gradients off,
    eager attention (so attention probabilities can be captured).

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    tokenizer : transformers tokenizer, optional
        Its tokenizer; without one the byte-level tokenizer of random models serves, at the
        special-token ids of the model's configuration.
    name : str, optional
        The ``model`` column of the tables; default ``memory:<name_or_path or class>@<first
        12 hex digits of the weights' SHA-256>``, so another model never resumes this one's run.

    Returns
    -------
    LoadedModel
        ``provenance['source']`` is ``"memory"`` and ``provenance['sha256']`` that of the
        weights (:func:`weights_sha256`).

    Raises
    ------
    ModelError
        When ``model`` is no torch module with a configuration of a supported family.
    """
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise ModelError(f"a {type(model).__name__} is no transformers model; pass a *ForCausalLM module or a spec.")
    try:
        param = next(model.parameters())
        dtype, device = param.dtype, param.device
    except StopIteration:
        raise ModelError(f"{type(model).__name__} has no parameters; pass a trained or initialised model.") from None
    sha = weights_sha256(model)
    label = getattr(config, "_name_or_path", "") or type(model).__name__
    name = name or f"memory:{label}@{sha[:12]}"
    provenance = {"spec": name, "revision": None, "source": "memory", "sha256": sha, "files": {},
                  "weights_format": "memory"}
    return finish_model(model, tokenizer if tokenizer is not None else random_tokenizer(model), name, provenance, None,
                   dtype, device)
