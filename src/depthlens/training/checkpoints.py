"""The series folder ``depthlens train`` writes, and its checkpoints.

Layout::

    DIR/manifest.json               "format": "depthlens-train", the options and their hash,
                                    the checkpoints written, data, tokenizer, versions
    DIR/tables/training.parquet     the ``training`` table (depthlens.schema)
    DIR/step-N/                     one checkpoint: a Hugging Face folder (model.safetensors,
                                    config.json, tokenizer files) plus optimizer.pt (AdamW's
                                    state) and trainer_state.json (step, tokens, elapsed seconds,
                                    held-out loss, the table's rows since the previous checkpoint)

A checkpoint is written into a temporary sibling folder (``DIR/.step-N.XXXXXXXX.tmp``) and
renamed into place, so ``DIR/step-N`` is always complete; the folders are the truth about what
finished (the manifest and the table are rewritten from them after every checkpoint), and a
temporary folder left by a kill is removed by the next ``--resume`` or ``--overwrite``. Nothing
else carries state from one step to the next (no dropout; the batches are drawn from the seed
and the step), so the optimizer state and the step are all a resume needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import RunError, storage_error
from ..models.local import STEP_FOLDER, series_checkpoints
from ..runs import RunMode
from ..runs.atomic import current_umask, write_json
from ..runs.changes import option_changes, resume_refused
from ..schema import SCHEMA

__all__ = ["FORMAT", "MANIFEST", "OPTIMIZER", "STATE", "TABLE", "check_out", "is_series", "read_checkpoint", "read_state",
           "remove_series", "remove_temporaries", "write_checkpoint", "write_manifest"]

FORMAT = "depthlens-train"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TABLE = SCHEMA["training"].file
OPTIMIZER = "optimizer.pt"
STATE = "trainer_state.json"
_TEMPORARY = re.compile(r"^\.step-\d+\.[a-z0-9_]{8}\.tmp$")  # tempfile.mkdtemp(prefix=".step-N.", suffix=".tmp")


def is_series(root: Path) -> bool:
    """Whether ``root`` holds a series: a ``manifest.json`` with the ``depthlens-train`` marker."""
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def check_out(root: Path, run_mode: RunMode, options: Mapping[str, Any], options_hash: str) -> None:
    """Refuse an output folder the run mode cannot use; touches nothing. A missing or empty
    folder suits every mode. ``options`` are the training options as the manifest records them
    (``TrainOptions.to_dict()``), ``options_hash`` their hash.

    Raises
    ------
    RunError
        A file; a non-empty folder without ``--resume``/``--overwrite``; resuming or
        overwriting a folder that is no series (never deleted); resuming a series trained
        with other options (naming each that differs, :func:`depthlens.runs.changes.resume_refused`).
    """
    if root.exists() and not root.is_dir():
        raise RunError(f"--out {root} is a file; pass --out with a folder path.")
    if not (root.is_dir() and any(root.iterdir())):
        return
    series = is_series(root)
    if run_mode is RunMode.NEW:
        if series:
            raise RunError(f"--out {root} holds a training series; pass --resume to continue it or --overwrite to "
                           "replace it.")
        raise RunError(f"--out {root} is not empty and holds no training series; choose another --out.")
    if not series:
        raise RunError(f"refusing to {run_mode.value} {root}: it holds no training series (no {MANIFEST} with "
                       f'"format": "{FORMAT}"); nothing was changed, choose another --out.')
    if run_mode is RunMode.RESUME:
        stored = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        if stored.get("options_hash") != options_hash:
            changes = option_changes({"options": stored.get("options")}, {"options": options})
            raise resume_refused(root, changes, stored.get("options_hash"), options_hash)


def remove_temporaries(root: Path) -> None:
    """Delete the temporary checkpoint folders that killed writes left in ``root``."""
    for child in root.iterdir():
        if _TEMPORARY.match(child.name) and child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)


def remove_series(root: Path) -> None:
    """Delete what ``depthlens train`` wrote into the series ``root``: its checkpoints, their
    temporary folders, the table and the manifest (and ``tables/`` when that empties it).
    Other files stay."""
    remove_temporaries(root)
    for name, _ in series_checkpoints(root):
        shutil.rmtree(root / name)
    (root / TABLE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (root / TABLE).parent.rmdir()
    (root / MANIFEST).unlink(missing_ok=True)


@contextlib.contextmanager
def _storage(path: Path) -> Iterator[None]:
    """Turn a full disk, read-only file system or denied permission into a one-line
    :class:`~depthlens.errors.StorageError`."""
    try:
        yield
    except OSError as exc:
        error = storage_error(exc, path)
        if error is None:
            raise
        raise error from exc


@contextlib.contextmanager
def _no_library_bars() -> Iterator[None]:
    """No progress bars from transformers while a checkpoint is saved or read (training has its
    own)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def write_checkpoint(root: Path, step: int, model: torch.nn.Module, tokenizer: Any,
                     optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> Path:
    """Write checkpoint ``DIR/step-N`` atomically (a temporary sibling folder, then a rename)
    and return its path.

    Parameters
    ----------
    root : Path
        The series folder.
    step : int
        The optimiser steps the weights have taken.
    model, tokenizer
        Saved with ``save_pretrained`` (safetensors).
    optimizer : torch.optim.Optimizer
        Its ``state_dict()`` goes to ``optimizer.pt`` (tensors and plain containers only, so
        ``torch.load(weights_only=True)`` reads it).
    state : dict
        JSON-serialisable: ``trainer_state.json``.

    Raises
    ------
    StorageError
        The folder cannot be written (full disk, read-only, permissions).
    RunError
        The checkpoint exists already.
    """
    target = root / STEP_FOLDER.format(step=step)
    if target.exists():
        raise RunError(f"checkpoint {target} exists already; pass --overwrite to retrain the series.")
    with _storage(target):
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=root))
        try:
            with _no_library_bars():
                model.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER)
            (tmp / STATE).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            mask = current_umask()
            for child in tmp.iterdir():  # like any file the user creates, whatever the writers chose
                os.chmod(child, 0o666 & ~mask)
            os.chmod(tmp, 0o777 & ~mask)
            os.rename(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_state(folder: Path) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint folder."""
    return json.loads((folder / STATE).read_text(encoding="utf-8"))


def read_checkpoint(folder: Path) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """The model (float32, training mode, scaled-dot-product attention as in training), the
    tokenizer and the optimizer state (``torch.load(weights_only=True)``) of a checkpoint
    folder, read offline."""
    from transformers import AutoModelForCausalLM

    from ..models.pretrained import quiet_transformers
    from ..models.tokenizer import tokenizer_from

    with quiet_transformers(), _no_library_bars():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa",
                                                     use_safetensors=True, local_files_only=True)
        tokenizer = tokenizer_from(str(folder), local_files_only=True)
    return model.train(), tokenizer, torch.load(folder / OPTIMIZER, weights_only=True)


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Atomically write the series' ``manifest.json`` with its format marker.

    Raises
    ------
    StorageError
        The folder cannot be written.
    """
    write_json(root / MANIFEST, {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest})
