"""Run directories: manifest, tidy tables, arrays, per-unit files and resume.

Layout (DESIGN.md)::

    RUN/manifest.json           config, its hash, package versions, model and data hashes, seed
    RUN/tables/NAME.parquet     tidy tables
    RUN/arrays/NAME.safetensors large arrays, with the config hash and dtype in the metadata
    RUN/units/STAGE/KEY.*       one finished unit of work: its tables, then KEY.done (skipped on resume)

Every write is atomic, so a run killed at any instant (SIGKILL included) can be resumed
and ends with the same tables as an uninterrupted run.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import RunError
from . import atomic

MANIFEST = "manifest.json"


class Mode(str, Enum):
    """How to treat an existing output directory."""

    NEW = "new"
    RESUME = "resume"
    OVERWRITE = "overwrite"


def check_target(path: str | Path, mode: Mode, config_hash: str) -> None:
    """Refuse an output directory that the requested mode cannot use; touches nothing.

    Call it before any expensive work, so bad input fails fast and leaves no directory.

    Raises
    ------
    RunError
        ``new`` into a non-empty directory; ``resume`` of a directory without a manifest or
        with a different configuration; ``overwrite`` of a non-empty directory that is not a
        depthlens run (no manifest), which is never deleted.
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise RunError(f"output path {root} is a file; pass --out with a directory path.")
    non_empty = root.is_dir() and any(root.iterdir())
    has_manifest = (root / MANIFEST).is_file()
    if mode is Mode.NEW and non_empty:
        raise RunError(
            f"output directory {root} is not empty; pass --resume to continue that run or "
            "--overwrite to replace it."
        )
    if mode is Mode.OVERWRITE and non_empty and not has_manifest:
        raise RunError(f"refusing to overwrite {root}: it is not a depthlens run (no {MANIFEST}); choose another --out.")
    if mode is Mode.RESUME and non_empty:
        if not has_manifest:
            raise RunError(f"cannot resume {root}: it has no {MANIFEST}; choose another --out or use --overwrite.")
        old = read_manifest(root).get("config_hash")
        if old != config_hash:
            raise RunError(
                f"cannot resume {root}: it was started with a different configuration "
                f"(hash {old} != {config_hash}); rerun with the same options or use --overwrite."
            )


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Read ``manifest.json`` of a run directory.

    Raises
    ------
    RunError
        If the manifest is missing or not valid JSON.
    """
    file = Path(path) / MANIFEST
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise RunError(f"{path} is not a depthlens run directory (no {MANIFEST}).") from None
    except json.JSONDecodeError as exc:
        raise RunError(f"{file} is not valid JSON ({exc.msg}); the run directory is damaged, use --overwrite.") from None


def with_ident(table: pd.DataFrame, ident: dict[str, str]) -> pd.DataFrame:
    """A copy of ``table`` with identifying columns (e.g. ``model``, ``revision``) put first."""
    table = table.copy()
    for i, (name, value) in enumerate(ident.items()):
        table.insert(i, name, value)
    return table


class RunDirectory:
    """An open run directory. Create it with :meth:`open` after validating all inputs.

    Parameters
    ----------
    root : Path
        The directory.
    manifest : dict
        The manifest as written to disk (updated through :meth:`update_manifest`).
    """

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, mode: Mode, manifest: dict[str, Any]) -> "RunDirectory":
        """Create, resume or replace the run directory at ``path``.

        ``manifest`` must hold ``config_hash``. On resume the stored manifest is kept and its
        ``resumed`` list gets a timestamp; otherwise ``manifest`` is written as given.
        """
        root = Path(path)
        check_target(root, mode, manifest["config_hash"])
        if mode is Mode.OVERWRITE and root.exists():
            shutil.rmtree(root)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if mode is Mode.RESUME and (root / MANIFEST).is_file():
            stored = read_manifest(root)
            stored.setdefault("resumed", []).append(now)
            run = cls(root, stored)
        else:
            run = cls(root, {**manifest, "created": now, "stages": {}})
        root.mkdir(parents=True, exist_ok=True)
        run._write_manifest()
        return run

    # -- manifest -------------------------------------------------------------------
    def _write_manifest(self) -> None:
        atomic.write_json(self.root / MANIFEST, self.manifest)

    def update_manifest(self, **fields: Any) -> None:
        """Merge ``fields`` into the manifest and write it atomically."""
        self.manifest.update(fields)
        self._write_manifest()

    def mark_stage(self, stage: str, status: str, **info: Any) -> None:
        """Record a stage's status (``running``, ``done``, ``failed``) in the manifest."""
        self.manifest.setdefault("stages", {})[stage] = {"status": status, **info}
        self._write_manifest()

    # -- units ----------------------------------------------------------------------
    def _unit_dir(self, stage: str) -> Path:
        return self.root / "units" / stage

    def has_unit(self, stage: str, key: str) -> bool:
        """Whether unit ``key`` of ``stage`` has finished (its marker file exists)."""
        return (self._unit_dir(stage) / f"{key}.done").is_file()

    def write_unit(self, stage: str, key: str, tables: dict[str, pd.DataFrame]) -> None:
        """Store a finished unit: each table atomically, then the marker that says it is done.

        A unit killed between its tables and its marker is simply redone on resume.
        """
        folder = self._unit_dir(stage)
        for name, table in tables.items():
            atomic.write_parquet(folder / f"{key}.{name}.parquet", table)
        atomic.write_json(folder / f"{key}.done", sorted(tables))

    def read_units(self, stage: str, keys: list[str], name: str) -> pd.DataFrame:
        """Concatenate table ``name`` of the units ``keys`` in the given order.

        Raises
        ------
        RunError
            If a unit has not finished.
        """
        missing = [k for k in keys if not self.has_unit(stage, k)]
        if missing:
            raise RunError(
                f"stage {stage} of {self.root} has {len(missing)} unfinished units (first: {missing[0]}); rerun with --resume."
            )
        folder = self._unit_dir(stage)
        return pd.concat([pd.read_parquet(folder / f"{k}.{name}.parquet") for k in keys], ignore_index=True)

    # -- outputs --------------------------------------------------------------------
    def write_table(self, name: str, table: pd.DataFrame) -> Path:
        """Atomically write ``tables/NAME.parquet`` and return its path."""
        path = self.root / "tables" / f"{name}.parquet"
        atomic.write_parquet(path, table)
        return path

    def read_table(self, name: str) -> pd.DataFrame:
        """Read ``tables/NAME.parquet``."""
        return pd.read_parquet(self.root / "tables" / f"{name}.parquet")

    def write_arrays(self, name: str, arrays: dict[str, np.ndarray], **metadata: str) -> Path:
        """Atomically write ``arrays/NAME.safetensors``; the config hash and dtypes go in the metadata."""
        path = self.root / "arrays" / f"{name}.safetensors"
        meta = {"config_hash": str(self.manifest["config_hash"]), **{k: str(v) for k, v in metadata.items()}}
        meta["dtypes"] = json.dumps({k: str(np.asarray(v).dtype) for k, v in arrays.items()}, sort_keys=True)
        atomic.write_safetensors(path, arrays, meta)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        """Atomically write ``NAME.json`` at the top of the run directory."""
        path = self.root / f"{name}.json"
        atomic.write_json(path, obj)
        return path
