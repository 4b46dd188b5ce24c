"""Atomic file writes: write to a temporary file in the same folder, then rename.

A reader (or a resumed run) therefore sees either the old file or the complete new one,
never a partial write, even after SIGKILL. The temporary file is ``.NAME.XXXXXXXX.tmp``
beside ``NAME``; one left by a killed process is removed by the next ``--resume`` or
``--overwrite`` of its run (:mod:`depthlens.runs.directory`).

Files get the mode ``0o666 & ~umask``, like any file the user creates (not the
owner-only mode of :func:`tempfile.mkstemp`).

Every write inside a run directory (a folder holding the run index ``INDEX``, at most
three folders up) is first recorded in that index, so ``--overwrite`` can delete exactly
the files depthlens wrote and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import storage_error

INDEX = "depthlens-index.txt"
"""The run index: one path per line, relative to the run directory, of every file the run wrote."""
INDEX_HEADER = "# depthlens run index: the files this run wrote; --overwrite deletes exactly these\n"
_INDEX_DEPTH = 3  # RUN/units/STAGE/FILE is the deepest file of the run layout


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    The temporary file is removed if the body raises. The rename is atomic on POSIX
    file systems because both names live in the same folder. The file gets the mode
    ``0o666 & ~umask`` whatever the body did to the temporary file's mode. When ``path``
    lies in a run directory, it is recorded in the run's index before the temporary file
    is created, so a leftover temporary file always belongs to an indexed name.

    Raises
    ------
    StorageError
        When the disk is full, the file system read-only or permission denied (the
        ``OSError`` of any step, the body's writes included, is converted; the temporary
        file is removed and ``path`` keeps its old content).
    """
    target = Path(path)
    tmp_path: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        record(target)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~current_umask())
        os.replace(tmp_path, target)
    except OSError as exc:
        error = storage_error(exc, target)
        if error is None:
            raise
        raise error from exc
    finally:
        if tmp_path is not None and tmp_path.exists():
            with contextlib.suppress(OSError):
                tmp_path.unlink()


def current_umask() -> int:
    """The process's file-mode creation mask.

    Read from ``/proc/self/status`` where the kernel reports it (Linux >= 4.7), so no
    thread ever sees a changed umask; elsewhere set and restored with :func:`os.umask`.
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def run_root(path: str | os.PathLike[str]) -> Path | None:
    """The run directory that ``path`` belongs to (nearest folder above it with an index), or None."""
    folder = Path(path).parent
    for _ in range(_INDEX_DEPTH):
        if (folder / INDEX).is_file():
            return folder
        if folder.parent == folder:
            break
        folder = folder.parent
    return None


def record(path: str | os.PathLike[str]) -> None:
    """Append ``path`` to the index of the run directory it lies in (nothing outside a run).

    One ``write`` of one line to a file opened with ``O_APPEND``, so worker processes can
    record concurrently; a duplicate line is harmless. Call it before creating the file.
    """
    target = Path(path)
    root = None if target.name == INDEX else run_root(target)  # an index is never indexed
    if root is None:
        return
    line = (target.relative_to(root).as_posix() + "\n").encode("utf-8")
    try:
        fd = os.open(root / INDEX, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:  # the index vanished since run_root looked: not a run any more
        return
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_index(root: str | os.PathLike[str]) -> list[str]:
    """The distinct entries of a run's index in first-written order (``[]`` without an index).

    Comment lines and a last line cut short by a kill (no newline) are ignored.
    """
    try:
        text = (Path(root) / INDEX).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the last piece has no newline: empty or torn
    return list(dict.fromkeys(line for line in lines if line and not line.startswith("#")))


def start_index(root: str | os.PathLike[str]) -> None:
    """Create the empty index of a new run directory ``root`` (atomically, not itself indexed)."""
    write_bytes(Path(root) / INDEX, INDEX_HEADER.encode("utf-8"))


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


#: How safetensors names the OS error of a failed write: ``... No space left on device (os error 28)``.
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def write_safetensors(
    path: str | os.PathLike[str], arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Atomically write numpy arrays as a safetensors file with string metadata.

    Raises
    ------
    StorageError
        As :func:`atomic_path`: safetensors reports a failed write (a full disk) as a
        ``SafetensorError`` naming the OS error, which is taken as that ``OSError``.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    with atomic_path(path) as tmp:
        try:
            save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(tmp), metadata=metadata)
        except SafetensorError as exc:
            code = _OS_ERROR.search(str(exc))
            if code is None:
                raise
            raise OSError(int(code[1]), os.strerror(int(code[1])), str(tmp)) from exc


#: numpy dtypes and their safetensors names, for the files :func:`create_safetensors` lays out.
_SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32"}


def create_safetensors(path: str | os.PathLike[str], shapes: Mapping[str, tuple[int, ...]], dtype: np.dtype | str,
                       metadata: Mapping[str, str] | None = None) -> dict[str, np.memmap]:
    """Lay out a safetensors file of zeros for the tensors ``shapes`` (in that order, all of
    ``dtype``) and return a writable memory map of each, so tensors larger than memory
    together can be written, or summed into, one at a time. The header is written first and
    the data area is allocated on disk (``posix_fallocate``; reads as zeros), so a full disk
    is an ``OSError`` here rather than a ``SIGBUS`` when a map is written. Not atomic by
    itself: create it at the temporary path of :func:`atomic_path` and flush and drop the
    maps before that renames it.

    Raises
    ------
    ValueError
        A dtype safetensors files here do not hold (float64, float32, float16, int64, int32).
    OSError
        The disk has no room for the file.
    """
    dt = np.dtype(dtype)
    if dt.name not in _SAFETENSORS_DTYPES:
        raise ValueError(f"dtype {dt.name} is not one of {', '.join(_SAFETENSORS_DTYPES)}.")
    layout: dict[str, Any] = {}
    offset = 0
    for name, shape in shapes.items():
        size = dt.itemsize * int(np.prod(shape, dtype=np.int64))
        layout[name] = {"dtype": _SAFETENSORS_DTYPES[dt.name], "shape": [int(n) for n in shape],
                        "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps({"__metadata__": dict(metadata or {}), **layout}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.flush()
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(f.fileno(), 0, 8 + len(header) + offset)
        else:  # no way to reserve the space here (macOS): a sparse file
            f.truncate(8 + len(header) + offset)
    return map_safetensors(path, mode="r+")


@contextlib.contextmanager
def safetensors_writer(path: str | os.PathLike[str], shapes: Mapping[str, tuple[int, ...]], dtype: np.dtype | str,
                       metadata: Mapping[str, str] | None = None) -> Iterator[dict[str, np.memmap]]:
    """Write a safetensors file one tensor at a time: yields the writable memory maps of
    :func:`create_safetensors`, laid out at the temporary path of :func:`atomic_path`; they are
    flushed and the file renamed onto ``path`` when the body ends without raising."""
    with atomic_path(path) as tmp:
        store = create_safetensors(tmp, shapes, dtype, metadata)
        yield store
        flush(store)


def flush(arrays: Mapping[str, np.ndarray]) -> None:
    """Write the changes of every memory map among ``arrays`` to its file."""
    for array in arrays.values():
        if isinstance(array, np.memmap):
            array.flush()


def map_safetensors(path: str | os.PathLike[str], mode: str = "r") -> dict[str, np.memmap]:
    """Memory maps of the tensors of a safetensors file, in its header's order, read from its
    header alone (``mode`` ``"r"`` or ``"r+"``); nothing is read into memory until used.
    Tensors of no dtype in :data:`_SAFETENSORS_DTYPES` raise ``ValueError``."""
    names = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    start = 8 + size
    out: dict[str, np.memmap] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in names:
            raise ValueError(f"tensor {name} of {path} is {info['dtype']}, which cannot be memory-mapped here.")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end == begin:
            out[name] = np.zeros(shape, dtype=names[info["dtype"]])  # np.memmap refuses empty maps
            continue
        out[name] = np.memmap(path, dtype=np.dtype(names[info["dtype"]]).newbyteorder("<"), mode=mode,
                              offset=start + begin, shape=shape)
    return out


def read_safetensors(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays (in their stored dtypes) and the string metadata of a safetensors file, as
    :func:`write_safetensors` wrote them."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")
