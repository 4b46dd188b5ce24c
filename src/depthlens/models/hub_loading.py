"""Models from the Hugging Face hub: a hub id ``"org/name"`` at a revision.

Whether the hub can be reached is decided once by :mod:`depthlens.models.hub`; offline, only
the local Hugging Face cache is read (``local_files_only=True``). The safetensors
auto-conversion of transformers is switched off while loading (depthlens only reads).

A streamed hub model (``stream_layers``) is a snapshot of the repository in the Hugging Face
cache (configuration, tokenizer and ``*.safetensors`` files, downloaded once, on disk) read
one decoder layer at a time as a local folder (:func:`depthlens.models.local.load_local`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..errors import ModelError
from . import hub
from .hashing import combined_sha256, hash_files
from .local import load_local
from .pretrained import Checkpoint, load_config, model_from_folder, quiet_transformers, remote_code_error
from .tokenizer import tokenizer_from

__all__ = ["load_hub"]


def _hub_error(spec: str, revision: str | None, exc: BaseException) -> ModelError:
    """The one-line error of a failed hub load, with the reason in short."""
    rev = f" at revision {revision!r}" if revision else ""
    return ModelError(
        f"cannot load --model {spec!r}{rev} from the Hugging Face hub ({hub.summary(exc)}); "
        "the network or hub may be unavailable, or the id or revision is wrong; "
        "a local folder or .gguf file path works offline."
    )


def _hub_files(spec: str, revision: str | None, safe: bool) -> list[Path]:
    """Paths of the downloaded weight files of a hub checkpoint in the local HF cache."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> Path | None:
        got = try_to_load_from_cache(spec, name, revision=revision)
        return Path(got) if isinstance(got, str) and os.path.isfile(got) else None

    single, index = ("model.safetensors", "model.safetensors.index.json") if safe else (
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    )
    one = cached(single)
    if one is not None:
        return [one]
    idx = cached(index)
    if idx is None:
        return []
    shards = sorted(set(json.loads(idx.read_text()).get("weight_map", {}).values()))
    return [p for p in (cached(s) for s in shards) if p is not None]


def _hub_cached(spec: str, revision: str | None) -> bool:
    """Whether the local Hugging Face cache holds the configuration of ``spec`` at ``revision``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        got = try_to_load_from_cache(spec, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - an odd id or revision: not cached
        return False
    return isinstance(got, str) and os.path.isfile(got)


#: The files of a repository a streamed model needs: configuration and shard index, tokenizer, weights.
_SNAPSHOT_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken")


def _snapshot(spec: str, revision: str | None, local: bool) -> Path:
    """The folder of ``spec`` at ``revision`` in the Hugging Face cache, with the files of
    :data:`_SNAPSHOT_FILES` downloaded (``local``: what the cache already holds)."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(spec, revision=revision, allow_patterns=list(_SNAPSHOT_FILES),
                                        local_files_only=local))
    except Exception as exc:
        raise _hub_error(spec, revision, exc) from None
    if not any(folder.glob("*.safetensors")):
        rev = f" at revision {revision!r}" if revision else ""
        where = "the local Hugging Face cache holds" if local else "the repository has"
        raise ModelError(f"--stream-layers reads *.safetensors weights and {where} none for --model {spec!r}{rev} "
                         f"(in {folder}); download them (huggingface-cli download {spec}), or drop --stream-layers.")
    return folder


def load_hub(spec: str, *, revision: str | None, dtype: torch.dtype, trust_remote_code: bool,
             stream_layers: bool = False) -> Checkpoint:
    """Load a hub id at ``revision``: from the hub, or from the local Hugging Face cache alone
    when the hub is offline (:func:`depthlens.models.hub.offline_reason`).

    The configuration is read first, so an unsupported architecture fails before any weights
    download; safetensors are preferred and ``pytorch_model*.bin`` read with
    ``weights_only=True`` otherwise.

    Parameters
    ----------
    spec : str
        The hub id ``"org/name"``.
    revision : str or None
        Branch, tag or commit.
    dtype : torch.dtype
        The dtype the weights are read in.
    trust_remote_code : bool
        Passed to transformers.
    stream_layers : bool
        Download the repository's snapshot (configuration, tokenizer, ``*.safetensors``) to the
        Hugging Face cache and stream its decoder layers from there, one at a time.

    Returns
    -------
    Checkpoint
        ``provenance`` records the commit and the cached weight files with their sha256
        (when they can be found); a streamed one also the snapshot folder (``path``).

    Raises
    ------
    ModelError
        Offline and not cached, hub or network failures, an unsupported architecture, a
        checkpoint that needs its own code, or ``stream_layers`` for a repository (or offline
        cache) without ``*.safetensors`` weights.
    """
    from .families import family_of

    # Decided at once: HF_HUB_OFFLINE, or one quick probe; offline, the cache only (no retries).
    offline = hub.offline_reason()
    local = offline is not None
    if local and not _hub_cached(spec, revision):
        rev = f" at revision {revision!r}" if revision else ""
        raise ModelError(hub.not_cached(f"--model {spec!r}{rev}", offline, "pass --model a local folder or .gguf file"))
    try:
        with quiet_transformers():
            config = load_config(spec, revision=revision, trust_remote_code=trust_remote_code, local=local)
    except Exception as exc:
        raise remote_code_error(spec, exc) or _hub_error(spec, revision, exc) from None
    family_of(config)  # an unsupported architecture fails before any weights download
    if stream_layers:
        folder = _snapshot(spec, revision, local)
        streamed = load_local(folder, spec=spec, dtype=dtype, trust_remote_code=trust_remote_code, stream_layers=True)
        provenance = {**streamed.provenance, "revision": revision, "commit": folder.name, "source": "hub"}
        return Checkpoint(streamed.model, streamed.tokenizer, spec, provenance, streamed.layers)
    try:
        with quiet_transformers():
            tokenizer = tokenizer_from(spec, revision=revision, trust_remote_code=trust_remote_code,
                                       local_files_only=local)
    except Exception as exc:
        raise remote_code_error(spec, exc) or _hub_error(spec, revision, exc) from None

    def attempt(use_safetensors: bool) -> torch.nn.Module:
        with quiet_transformers():
            return model_from_folder(spec, dtype, trust_remote_code, use_safetensors, revision=revision, local=local)

    # The safetensors auto-conversion of transformers would ask a hub service to convert the
    # repository; depthlens only reads, so it is switched off for the duration of the load.
    previous = os.environ.get("DISABLE_SAFETENSORS_CONVERSION")
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    safe = True
    try:
        try:
            model = attempt(True)
        except OSError as exc:
            if "safetensors" not in str(exc):
                raise
            safe = False  # only pytorch_model*.bin: restricted unpickler (weights_only=True)
            model = attempt(False)
    except Exception as exc:
        raise remote_code_error(spec, exc) or _hub_error(spec, revision, exc) from None
    finally:
        if previous is None:
            os.environ.pop("DISABLE_SAFETENSORS_CONVERSION", None)
        else:
            os.environ["DISABLE_SAFETENSORS_CONVERSION"] = previous
    commit = getattr(config, "_commit_hash", None)
    try:
        paths = _hub_files(spec, revision, safe)
        hashes = hash_files(paths)
        if commit is None and paths and paths[0].parent.parent.name == "snapshots":
            commit = paths[0].parent.name  # <hf cache>/models--org--name/snapshots/<commit>/file
    except Exception:  # the hashes are a record, not a requirement
        hashes = {}
    provenance = {
        "spec": spec,
        "revision": revision,
        "commit": commit,
        "source": "hub",
        "sha256": combined_sha256(hashes) if hashes else None,
        "files": hashes,
        "weights_format": "safetensors" if safe else "pytorch_bin(weights_only=True)",
    }
    return Checkpoint(model, tokenizer, spec, provenance)
