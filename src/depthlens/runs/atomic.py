"""Atomic file writes: write to a temporary file in the same folder, then rename.

A reader (or a resumed run) therefore sees either the old file or the complete new one,
never a partial write, even after SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    The temporary file is removed if the body raises. The rename is atomic on POSIX
    file systems because both names live in the same folder.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Atomically write ``data`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write ``obj`` as indented, key-sorted JSON (numpy scalars converted)."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=_json_default)
    write_bytes(path, (text + "\n").encode())


def write_parquet(path: str | os.PathLike[str], table: pd.DataFrame) -> None:
    """Atomically write a DataFrame as Parquet (no index)."""
    with atomic_path(path) as tmp:
        table.to_parquet(tmp, index=False)


def write_safetensors(
    path: str | os.PathLike[str], arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Atomically write numpy arrays as a safetensors file with string metadata."""
    from safetensors.numpy import save_file

    with atomic_path(path) as tmp:
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp), metadata=metadata)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")
