"""Saved Hugging Face checkpoints in a local folder (``config.json``, tokenizer and weights),
and checkpoint series: a folder without ``config.json`` whose ``step-N`` sub-folders are
checkpoints (as ``depthlens train`` writes them).

Weights are read from ``*.safetensors`` when the folder has them, else from
``pytorch_model*.bin`` through torch's restricted unpickler (``weights_only=True``); no code
from the folder runs unless ``trust_remote_code=True``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..errors import ModelError, one_line
from .hashing import combined_sha256, hash_files
from .pretrained import Checkpoint, load_config, model_from_folder, quiet_transformers, remote_code_error
from .tokenizer import tokenizer_from

__all__ = ["STEP_FOLDER", "declared_context", "load_local", "series_checkpoint", "series_checkpoints"]

#: The folder name of the checkpoint after ``step`` optimiser steps in a series.
STEP_FOLDER = "step-{step}"
_STEP = re.compile(r"^step-(0|[1-9][0-9]*)$")


def series_checkpoints(folder: str | Path) -> list[tuple[str, int]]:
    """The checkpoints of the series ``folder`` as ``(name, step)`` in step order: its
    sub-folders named ``step-N`` (N a plain integer) that hold a ``config.json``.

    Empty when ``folder`` is no folder, holds a ``config.json`` itself (a single checkpoint)
    or has no such sub-folder.

    Examples
    --------
    >>> series_checkpoints("no/such/folder")
    []
    """
    path = Path(folder).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return []
    found = [(child.name, int(match[1])) for child in path.iterdir()
             if (match := _STEP.match(child.name)) and (child / "config.json").is_file()]
    return sorted(found, key=lambda item: item[1])


def series_checkpoint(folder: Path, revision: str | None) -> Path:
    """The checkpoint folder of ``revision`` (``step-N``) in the series ``folder``; its last
    checkpoint for None.

    Raises
    ------
    ModelError
        A revision the series does not hold, naming the ones it does.
    """
    held = [name for name, _ in series_checkpoints(folder)]
    if revision is None:
        return folder / held[-1]
    if revision not in held:
        raise ModelError(f"--revision {revision!r} is not a checkpoint of the series {folder}; it holds "
                         f"{', '.join(held)}.")
    return folder / revision


def _declared(folder: str | Path) -> dict:
    """A checkpoint folder's ``config.json`` as a dict, empty when it is missing or unreadable."""
    try:
        values = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return values if isinstance(values, dict) else {}


def declared_context(folder: str | Path) -> int | None:
    """The context length a checkpoint folder's ``config.json`` declares
    (``max_position_embeddings``, else GPT-2's ``n_positions`` or ``n_ctx``), read without
    loading the model; None when the folder has no readable config or it declares none."""
    values = _declared(folder)
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        if isinstance(values.get(key), int) and values[key] > 0:
            return int(values[key])
    return None


def _weight_files(folder: Path) -> tuple[list[Path], bool]:
    """The weight files of ``folder`` and whether they are safetensors (else ``pytorch_model*.bin``)."""
    safe = sorted(folder.glob("*.safetensors"))
    if safe:
        return safe, True
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    return pickles, False


def load_local(folder: Path, *, spec: str, dtype: torch.dtype, trust_remote_code: bool,
               stream_layers: bool = False) -> Checkpoint:
    """Load the model, tokenizer and weights saved in ``folder`` (which has ``config.json``).

    With ``stream_layers`` the model is a skeleton (:func:`~depthlens.models.streaming.skeleton`)
    whose weights are read from the ``*.safetensors`` files when used, one decoder layer at a
    time (:class:`~depthlens.models.streaming.SafetensorsLayers`).

    Parameters
    ----------
    folder : Path
        The resolved folder.
    spec : str
        The model spec as given.
    dtype : torch.dtype
        The dtype the weights are read in.
    trust_remote_code : bool
        Passed to transformers.
    stream_layers : bool
        Stream the decoder layers (needs ``*.safetensors`` weights).

    Returns
    -------
    Checkpoint
        Named after the folder; ``provenance`` records the weight files and their sha256.

    Raises
    ------
    ModelError
        No weights, an unreadable configuration, tokenizer or weights, an unsupported
        architecture, a checkpoint that needs its own code, or ``stream_layers`` without
        safetensors weights.
    """
    from .families import family_of

    files, safe = _weight_files(folder)
    if not files:
        raise ModelError(
            f"folder {folder} has config.json but no *.safetensors or pytorch_model*.bin weights; "
            "save the model there with save_pretrained."
        )
    try:
        with quiet_transformers():
            config = load_config(str(folder), revision=None, trust_remote_code=trust_remote_code, local=True)
    except Exception as exc:
        raise remote_code_error(spec, exc) or ModelError(
            f"cannot read {folder / 'config.json'} ({one_line(exc)}); check the file."
        ) from None
    family_of(config)  # fail before reading weights
    try:
        with quiet_transformers():
            tokenizer = tokenizer_from(str(folder), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelError(
            f"folder {folder} has no usable tokenizer ({one_line(exc)}); save the tokenizer there too "
            "(tokenizer.save_pretrained)."
        ) from None
    layers = None
    if stream_layers:
        from .streaming import SafetensorsLayers, skeleton

        if not safe:
            raise ModelError(f"--stream-layers reads *.safetensors weights and {folder} holds only pytorch_model*.bin; "
                             "save the model with save_pretrained(safe_serialization=True).")
        model = skeleton(config)
        index = folder / "model.safetensors.index.json"
        layers = SafetensorsLayers(files, model, index if index.is_file() else None)
    else:
        try:
            with quiet_transformers():
                model = model_from_folder(folder, dtype, trust_remote_code, use_safetensors=safe)
        except Exception as exc:
            raise remote_code_error(spec, exc) or ModelError(
                f"cannot load the weights in {folder} ({one_line(exc)}); check the files."
            ) from None
    hashes = hash_files(files)
    provenance = {
        "spec": spec,
        "revision": None,
        "source": "local",
        "path": str(folder),
        "sha256": combined_sha256(hashes),
        "files": hashes,
        "weights_format": "safetensors" if safe else "pytorch_bin(weights_only=True)",
    }
    return Checkpoint(model, tokenizer, folder.name, provenance, layers)
