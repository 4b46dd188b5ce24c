"""A run's tables at a glance and as CSV files: what ``depthlens tables RUN [--csv DIR]`` and
:meth:`depthlens.Run.to_csv` do.

:func:`run_tables` names every ``tables/*.parquet`` of a run (under today's names for a run of
format 2: :data:`~depthlens.runs.tables.FORMAT_2_NAMES`) with its rows, columns and the
schema's one-line description; :func:`export_csv` writes each as ``DIR/NAME.csv``, into a
temporary folder beside ``DIR`` that is renamed to ``DIR`` once every file is written, so an
error leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..errors import RunError
from ..schema import SCHEMA
from .directory import check_run_directory, read_manifest
from .tables import FORMAT_2_NAMES, RunTables

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TableInfo", "export_csv", "gist", "run_tables"]


class TableInfo(NamedTuple):
    """One table of a run: its name, rows, columns and one-line description (empty for a table
    the schema does not declare)."""

    name: str
    rows: int
    columns: int
    description: str


def gist(row: str) -> str:
    """The first clause of a table's row description (:attr:`depthlens.schema.Table.row`): what
    one row is, on one short line.

    Examples
    --------
    >>> gist("One row per (layer, head): per-chunk quantities. More.")
    'One row per (layer, head)'
    """
    first = row.split(". ")[0].split(": ")[0].strip()
    return first.rstrip(".")


def _files(root: Path) -> dict[str, Path]:
    """Table name (today's) → its parquet file, declared tables in schema order first."""
    folder = root / "tables"
    found = {p.stem: p for p in sorted(folder.glob("*.parquet"))} if folder.is_dir() else {}
    if read_manifest(root).get("format_version") in (1, 2):
        old = {file: name for name, (file, _) in FORMAT_2_NAMES.items()}
        found = {old.get(stem, stem): path for stem, path in found.items()}
    return {**{name: found[name] for name in SCHEMA if name in found},
            **{name: path for name, path in found.items() if name not in SCHEMA}}


def run_tables(run_dir: str | Path) -> list[TableInfo]:
    """Every table of the run in ``run_dir``: name, rows, columns and description.

    Raises
    ------
    RunError
        One line when ``run_dir`` is not a depthlens run directory.
    """
    import pyarrow.parquet as pq

    root = Path(run_dir)
    check_run_directory(root)
    infos = []
    for name, path in _files(root).items():
        try:
            meta = pq.ParquetFile(path).metadata
        except Exception:  # noqa: BLE001 - a damaged file is listed, not fatal
            infos.append(TableInfo(name, -1, -1, "unreadable"))
            continue
        spec = SCHEMA.get(name)
        infos.append(TableInfo(name, meta.num_rows, meta.num_columns, gist(spec.row) if spec else ""))
    return infos


def _check_folder(folder: Path, overwrite: bool, flag: str) -> None:
    """Refuse a ``folder`` the export cannot take: a file; a non-empty folder without
    ``overwrite``; with it, a folder holding anything but CSV files (never deleted)."""
    if folder.exists() and not folder.is_dir():
        raise RunError(f"{folder} is a file; pass a folder path for the CSV files.")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    if not overwrite:
        raise RunError(f"{folder} is not empty; pass another folder, or {flag} to replace its CSV files.")
    other = next((p.name for p in folder.iterdir() if not (p.is_file() and p.suffix == ".csv")), None)
    if other is not None:
        raise RunError(f"{folder} holds {other}, not only CSV files, so it is never replaced; pass another folder.")


def export_csv(run_dir: str | Path, folder: str | Path, *, overwrite: bool = False,
               flag: str = "--overwrite") -> list[Path]:
    """Write every table of the run in ``run_dir`` as ``folder/NAME.csv`` (no index column) and
    return the paths.

    The files are written into a new folder beside ``folder``, which then takes its place: an
    error leaves ``folder`` as it was and nothing else behind.

    Parameters
    ----------
    run_dir : str or Path
        A depthlens run directory.
    folder : str or Path
        Where the CSV files go: absent (created, with its parents) or empty; with
        ``overwrite``, also a folder of CSV files alone (a previous export), which is replaced.
    overwrite : bool
        Replace a previous export in ``folder``.
    flag : str
        How error messages name ``overwrite``.

    Raises
    ------
    RunError
        One line, nothing written: ``run_dir`` is not a run; ``folder`` is a file, or not empty
        without ``overwrite``, or holds other files than CSV.
    """
    root, target = Path(run_dir), Path(folder)
    check_run_directory(root)
    _check_folder(target, overwrite, flag)
    files = _files(root)
    tables = RunTables(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(staging, 0o777 & ~_umask())  # as a folder made by mkdir, not mkdtemp's 0o700
        for name, path in files.items():
            _read(tables, name, path).to_csv(staging / f"{name}.csv", index=False)
        _swap(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [target / f"{name}.csv" for name in files]


def _read(tables: RunTables, name: str, path: Path) -> "pd.DataFrame":
    """Table ``name`` of the run (under today's columns when declared); a damaged file is
    refused in one line."""
    import pandas as pd

    if name in SCHEMA:
        table = tables.table(name)
        if table is None:
            raise RunError(f"{tables.why_missing(name)}; the run's tables cannot all be exported.")
        return table
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - a damaged file of a table the schema does not declare
        raise RunError(f"{path} is unreadable ({type(exc).__name__}); the run's tables cannot all be exported.") from None


def _umask() -> int:
    """This process's file-mode creation mask."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _swap(staging: Path, target: Path) -> None:
    """Put the folder ``staging`` in the place of ``target`` (absent, empty, or a previous
    export, which is removed once replaced)."""
    if not target.exists() or not any(target.iterdir()):
        os.replace(staging, target)  # an empty folder is replaced by the rename
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, old / "export")
    os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)
