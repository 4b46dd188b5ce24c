"""Run directories: manifest, tidy tables, arrays, per-unit files and resume.

Layout (DESIGN.md)::

    RUN/manifest.json           "format": "depthlens-run", "format_version": 3, config, its hash,
                                package versions, model and data hashes, seed
    RUN/depthlens-index.txt     every file the run wrote, one relative path a line
    RUN/tables/NAME.parquet     tidy tables
    RUN/arrays/NAME.safetensors large arrays, with the config hash and dtype in the metadata
    RUN/units/STAGE/KEY.*       one finished unit of work: its tables, then KEY.done (skipped on resume)

Every write is atomic, so a run killed at any instant (SIGKILL included) can be resumed
and ends with the same tables as an uninterrupted run.

A folder is a depthlens run only when its manifest carries the format marker
(``FORMAT``, ``FORMAT_VERSION``) and the run index exists. Version 3 tables follow
:mod:`depthlens.schema` (identity columns ``model``, ``revision``, ``text`` first in every
table) and its manifest's ``config`` has one section per stage. Version 2 runs (the same
layout under the names version 3 changed: :data:`depthlens.runs.tables.FORMAT_2_NAMES`) are
read under today's names; they and version 1 runs are still recognised, so ``--overwrite``
can replace them, but never resumed. ``--overwrite`` of a run deletes
exactly the files its index lists (and the temporary files of interrupted writes of those
names), then the folders that this leaves empty; files the run did not write stay where
they are. Anything that is not a run is never touched.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
import json
import os
import re
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ..errors import STORAGE_ERRNOS, RunError, StorageError, one_line
from . import atomic
from .. import drivers, interrupts
from .changes import option_changes, resume_refused
from .failures import FailureLog

MANIFEST = "manifest.json"
INDEX = atomic.INDEX
FORMAT = "depthlens-run"
FORMAT_VERSION = 3
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")  # tempfile.mkstemp(prefix=".NAME.", suffix=".tmp")
#: An item of work that a resumable unit computes (:meth:`RunDirectory.pending`).
_Work = TypeVar("_Work")


class RunMode(str, Enum):
    """How to treat an existing output directory."""

    NEW = "new"
    RESUME = "resume"
    OVERWRITE = "overwrite"


def not_a_run(path: str | Path) -> str | None:
    """Why the existing folder ``path`` is not a depthlens run, or None when it is one.

    A run has a ``manifest.json`` holding ``"format": "depthlens-run"`` with a
    ``format_version`` this depthlens reads, and its file index ``depthlens-index.txt``.
    """
    root = Path(path)
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return f"its {MANIFEST} is not readable JSON"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return f'its {MANIFEST} has no "format": "{FORMAT}" marker'
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        return f"its run format version {version!r} is not one this depthlens reads (1 to {FORMAT_VERSION})"
    if not (root / INDEX).is_file():
        return f"it has no {INDEX}"
    return None


def check_run_directory(path: str | Path) -> None:
    """Refuse ``path`` unless it is a depthlens run directory (:func:`not_a_run`), before
    anything reads or writes there: the one check of every command that takes a finished run
    (``depthlens report``, ``depthlens compare``).

    Raises
    ------
    RunError
        One line: ``path`` does not exist, is not a folder, or is a folder another tool wrote
        (its ``manifest.json`` has no depthlens marker).
    """
    root = Path(path)
    why = "it does not exist" if not root.exists() else "it is not a folder" if not root.is_dir() else not_a_run(root)
    if why is not None:
        raise RunError(f"{root} is not a depthlens run directory ({why}); pass a folder that depthlens run, a stage, "
                       "census or sweep wrote.")


def check_target(path: str | Path, run_mode: RunMode, config_hash: str,
                 options: Mapping[str, Mapping[str, Any]] | None = None,
                 changes: Callable[[Mapping[str, Any]], list[tuple[str, str]]] | None = None) -> None:
    """Refuse an output directory that the requested run mode cannot use; touches nothing.

    Call it before any expensive work, so bad input fails fast and leaves no directory.
    A missing or empty directory suits every run mode. ``options`` are the manifest fields
    that hold the options ``config_hash`` covers (``{"config": config.to_dict()}``): a resume
    with other options then names each option that differs (:func:`option_changes`).
    ``changes`` replaces that comparison where the hash covers more than one set of options
    (a sweep's cells): given the stored manifest, it returns the ``(old, new)`` pairs to name.

    Raises
    ------
    RunError
        A path that is a file; ``new`` into a non-empty directory (advice: ``--resume`` or
        ``--overwrite`` when it is a run, another ``--out`` when it is not); ``resume`` or
        ``overwrite`` of a non-empty directory that is not a depthlens run (see
        :func:`not_a_run`), which is never deleted; ``resume`` of a run made with a
        different configuration (``"it was started with --chunks 4, not --chunks 8"``).
    """
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise RunError(f"output path {root} is a file; pass --out with a directory path.")
    _check_writable(root)
    if not (root.is_dir() and any(root.iterdir())):
        return
    why = not_a_run(root)
    if run_mode is RunMode.NEW:
        if why is None:
            raise RunError(
                f"output directory {root} holds a depthlens run; pass --resume to continue that run or "
                "--overwrite to replace it."
            )
        raise RunError(f"output directory {root} is not empty and not a depthlens run ({why}); choose another --out.")
    if why is not None:
        verb = "overwrite" if run_mode is RunMode.OVERWRITE else "resume"
        raise RunError(f"refusing to {verb} {root}: it is not a depthlens run ({why}); nothing was changed, "
                       "choose another --out.")
    if run_mode is RunMode.RESUME:
        stored = read_manifest(root)
        if stored.get("format_version") != FORMAT_VERSION:
            raise RunError(f"cannot resume {root}: it was written in run format {stored.get('format_version')}, and "
                           f"this depthlens writes format {FORMAT_VERSION}; pass --overwrite to replace it, or "
                           "another --out.")
        if stored.get("config_hash") != config_hash:
            differ = changes(stored) if changes is not None else option_changes(
                {k: stored.get(k) for k in options or {}}, options or {})
            raise resume_refused(root, differ, stored.get("config_hash"), config_hash)


def _missing_folders(root: Path) -> list[Path]:
    """The folders that ``root.mkdir(parents=True)`` would create, outermost first."""
    missing = []
    folder = root
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def _check_writable(root: Path) -> None:
    """Refuse an ``--out`` that cannot be created or written: one under a file, or whose
    nearest existing folder is not writable (read-only file system, permissions). Touches
    nothing; what this cannot foresee (``/proc``) fails in :meth:`RunDirectory.open`, which
    then removes what it created."""
    try:
        missing = _missing_folders(root)
        existing = missing[0].parent if missing else root
        if not existing.is_dir():
            raise RunError(f"--out {root} lies under {existing}, which is not a folder; pass --out with a directory path.")
    except OSError as exc:
        raise RunError(f"--out {root} cannot be checked ({exc.strerror or exc}); pass another --out.") from None
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunError(f"--out {root} cannot be written: {existing} is not writable (read-only file system or "
                       "permissions); pass another --out.")


def _indexed_path(root: Path, entry: str) -> Path | None:
    """``root / entry`` when the index entry names a place inside ``root`` (no ``..``, no
    absolute path, no folder that links outside); otherwise None."""
    parts = PurePosixPath(entry).parts
    if not parts or PurePosixPath(entry).is_absolute() or ".." in parts:
        return None
    path = root.joinpath(*parts)
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(path.parent)
    if real_parent != real_root and not real_parent.startswith(real_root + os.sep):
        return None
    return path


def remove_temporaries(path: str | Path) -> list[Path]:
    """Delete the temporary files (``.NAME.XXXXXXXX.tmp``) that interrupted atomic writes of
    the run at ``path`` left beside the indexed names; return what was removed."""
    root = Path(path)
    by_folder: dict[Path, set[str]] = {}
    for entry in atomic.read_index(root):
        target = _indexed_path(root, entry)
        if target is not None:
            by_folder.setdefault(target.parent, set()).add(target.name)
    removed = []
    for folder, names in by_folder.items():
        try:
            children = list(os.scandir(folder))
        except OSError:
            continue
        for child in children:
            match = _TEMPORARY.match(child.name)
            if match and match["name"] in names and child.is_file(follow_symlinks=False):
                Path(child.path).unlink(missing_ok=True)
                removed.append(Path(child.path))
    return removed


def remove_run_files(path: str | Path) -> None:
    """Delete what the run at ``path`` wrote: the files its index lists, their leftover
    temporary files, the index itself, then the folders this leaves empty (not ``path``).

    Files the run did not write stay, and so do the folders holding them.

    Raises
    ------
    RunError
        If ``path`` is not a depthlens run (nothing is deleted then).
    """
    root = Path(path)
    why = not_a_run(root)
    if why is not None:
        raise RunError(f"refusing to overwrite {root}: it is not a depthlens run ({why}); choose another --out.")
    remove_temporaries(root)
    folders: set[Path] = set()
    for entry in atomic.read_index(root):
        target = _indexed_path(root, entry)
        if target is None:
            continue
        if target.is_symlink() or target.is_file():
            target.unlink(missing_ok=True)
        folder = target.parent
        while folder != root and root in folder.parents:
            folders.add(folder)
            folder = folder.parent
    (root / INDEX).unlink(missing_ok=True)
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:  # not empty (holds files the run did not write) or already gone
            pass


def remove_sub_runs(folder: str | Path) -> None:
    """Delete what every run directly inside ``folder`` wrote (:func:`remove_run_files`): the
    checkpoint runs of a census, the cells of a sweep (``--overwrite``). Sub-folders that are
    not runs, and files the runs did not write, stay."""
    folder = Path(folder)
    for sub in sorted(folder.iterdir()) if folder.is_dir() else ():
        if sub.is_dir() and not_a_run(sub) is None:
            remove_run_files(sub)


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
        raise RunError(f"{file} is not valid JSON ({exc.msg}); the run directory is damaged, choose another --out.") from None


def disk_usage(path: str | Path) -> int:
    """Bytes held by the regular files under ``path`` (links are not followed; 0 if absent)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                info = os.lstat(os.path.join(folder, name))
            except OSError:  # vanished meanwhile
                continue
            total += info.st_size if not os.path.islink(os.path.join(folder, name)) else 0
    return total


def timing_lines(manifest: Mapping[str, Any], order: Sequence[str] = ()) -> list[str]:
    """One line per stage recorded in ``manifest``, ``attention    done          20.9 s`` (the
    wall time of the session that finished or failed it: a resumed stage counts what was left
    only; ``-`` where none is recorded), then the sum, ``stages    90.6 s``: printed at the end
    of a run. Stages named in ``order`` come first, in that order (the manifest keeps them by
    name).

    Examples
    --------
    >>> manifest = {"stages": {"attention": {"status": "failed"}, "capture": {"status": "done", "seconds": 0.93}}}
    >>> print("\\n".join(timing_lines(manifest, order=("capture", "attention"))))
    capture      done           0.9 s
    attention    failed           - s
    stages                      0.9 s
    """
    stages = manifest.get("stages") or {}
    rank = {name: i for i, name in enumerate(order)}
    lines, total = [], 0.0
    for name, record in sorted(stages.items(), key=lambda item: rank.get(item[0], len(rank))):
        seconds = record.get("seconds")
        total += seconds or 0.0
        lines.append(f"{name:<12} {record.get('status', '?'):<10} {'-' if seconds is None else f'{seconds:.1f}':>7} s")
    return [*lines, f"{'stages':<23} {total:>7.1f} s"] if lines else []


def disk_line(path: str | Path) -> str:
    """``disk: 12.3 MB in runs/demo``: what a run directory holds, printed at the end of a run."""
    return f"disk: {disk_usage(path) / 1e6:.1f} MB in {path}"


class RunDirectory:
    """An open run directory. Create it with :meth:`open` after validating all inputs.

    Parameters
    ----------
    root : Path
        The directory.
    manifest : dict
        The manifest as written to disk (updated through :meth:`update_manifest`).

    Attributes
    ----------
    failures : depthlens.runs.failures.FailureLog
        The units and stages of this session that failed (logged under ``logs/``).
    """

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.manifest = manifest
        self.failures = FailureLog(root)
        self._drivers_seen = drivers.driver_counts()

    @classmethod
    def open(cls, path: str | Path, run_mode: RunMode, manifest: dict[str, Any]) -> "RunDirectory":
        """Create, resume or replace the run directory at ``path``.

        ``manifest`` must hold ``config_hash``. On resume the stored manifest is kept, its
        ``resumed`` list gets a timestamp and leftover temporary files are removed; otherwise
        ``manifest`` is written with the format marker. Overwrite first deletes what the old
        run wrote (:func:`remove_run_files`).

        Raises
        ------
        RunError
            See :func:`check_target`.
        """
        root = Path(path)
        check_target(root, run_mode, manifest["config_hash"])
        is_run = root.is_dir() and not_a_run(root) is None
        if run_mode is RunMode.OVERWRITE and is_run:
            remove_run_files(root)
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        if run_mode is RunMode.RESUME and is_run:
            remove_temporaries(root)
            stored = read_manifest(root)
            stored.setdefault("resumed", []).append(now)
            run = cls(root, stored)
        else:
            run = cls(root, {**manifest, "format": FORMAT, "format_version": FORMAT_VERSION,
                             "created": now, "stages": {}})
        created = _missing_folders(root)
        had = {name: (root / name).is_file() for name in (INDEX, MANIFEST)}
        try:
            root.mkdir(parents=True, exist_ok=True)
            if not had[INDEX]:
                atomic.start_index(root)  # before the manifest, so the manifest is indexed too
            run._write_manifest()
        except (OSError, StorageError) as exc:  # nothing of a run that could not start stays behind
            for name, existed in had.items():
                if not existed:
                    with contextlib.suppress(OSError):
                        (root / name).unlink(missing_ok=True)
            for folder in reversed(created):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            if isinstance(exc, StorageError):
                raise
            raise StorageError(f"cannot create the run directory --out {root} ({exc.strerror or exc}); "
                               "pass another --out.", STORAGE_ERRNOS.get(exc.errno, "cannot create"), root) from None
        return run

    # -- manifest -------------------------------------------------------------------
    def _write_manifest(self) -> None:
        atomic.write_json(self.root / MANIFEST, self.manifest)

    def update_manifest(self, **fields: Any) -> None:
        """Merge ``fields`` into the manifest and write it atomically."""
        self.manifest.update(fields)
        self._write_manifest()

    def mark_stage(self, stage: str, status: str, **info: Any) -> None:
        """Record a stage's status (``running``, ``done``, ``failed``, ``interrupted``, ``skipped``) in the manifest,
        with ``info`` beside it (a finished stage's ``seconds``: the wall time this session spent on it).

        A finished or failed stage also records the LAPACK drivers its results came from
        (``drivers``: ``{"svd:gesdd": n, ...}``) and how many were fallbacks
        (``fallbacks``); the manifest's top-level ``drivers`` sums every stage.
        """
        if status in ("done", "failed"):
            used = self.stage_drivers(stage)
            info = {**info, "drivers": used, "fallbacks": drivers.fallback_count(used)}
        stages = self.manifest.setdefault("stages", {})
        stages[stage] = {"status": status, **info}
        total: Counter[str] = Counter()
        for record in stages.values():
            total.update(record.get("drivers", {}))
        self.manifest["drivers"] = dict(sorted(total.items()))
        self._write_manifest()

    # -- units ----------------------------------------------------------------------
    def _unit_dir(self, stage: str) -> Path:
        return self.root / "units" / stage

    def has_unit(self, stage: str, key: str) -> bool:
        """Whether unit ``key`` of ``stage`` has finished (its marker file exists)."""
        return (self._unit_dir(stage) / f"{key}.done").is_file()

    def write_unit(self, stage: str, key: str, tables: dict[str, pd.DataFrame]) -> None:
        """Store a finished unit: each table atomically, then the marker that says it is done.

        A unit killed between its tables and its marker is simply redone on resume. A stop that a
        signal requested and a finaliser swallowed is raised here (:mod:`depthlens.interrupts`),
        before the unit is stored.
        """
        interrupts.raise_if_requested()
        folder = self._unit_dir(stage)
        for name, table in tables.items():
            atomic.write_parquet(folder / f"{key}.{name}.parquet", table)
        atomic.write_json(folder / f"{key}.done", {"tables": sorted(tables), "drivers": self._drivers_since_last()})

    def unit(self, stage: str, key: str, compute: Callable[[], Mapping[str, pd.DataFrame]], *,
             isolated: bool = False) -> dict[str, pd.DataFrame] | None:
        """The tables of unit ``key`` of ``stage``, computed by ``compute()`` and stored
        (:meth:`write_unit`) unless the unit has finished, then read back from the directory,
        so a fresh run and a resumed one return the same bytes.

        ``isolated``: a failure of ``compute`` is recorded
        (:meth:`~depthlens.runs.failures.FailureLog.unit`) and the result is None, so the stage
        goes on without the unit; otherwise it propagates.
        """
        if not self.has_unit(stage, key):
            if isolated:
                with self.failures.unit(stage, key):
                    self.write_unit(stage, key, dict(compute()))
            else:
                self.write_unit(stage, key, dict(compute()))
        if not self.has_unit(stage, key):
            return None
        record = json.loads((self._unit_dir(stage) / f"{key}.done").read_text())
        return {name: self.read_units(stage, [key], name) for name in record["tables"]}

    def pending(self, stage: str, work: Iterable[tuple[str, _Work]]) -> list[tuple[str, _Work]]:
        """The ``(key, item)`` pairs of ``work`` whose units of ``stage`` have not finished, in
        order: what a resumed stage still has to compute (all of it in a new run)."""
        return [(key, item) for key, item in work if not self.has_unit(stage, key)]

    def finished(self, stage: str, keys: Sequence[str], *, required: bool = False) -> list[str]:
        """The keys of ``keys`` whose units have finished, in order (failed ones are recorded
        in :attr:`failures`).

        Raises
        ------
        RunError
            With ``required``, when none did: nothing downstream of them can be computed.
        """
        done = [k for k in keys if self.has_unit(stage, k)]
        if required and keys and not done:
            raise RunError(f"every unit of the {stage} stage starting with {keys[0]} failed; see its log.")
        return done

    def _drivers_since_last(self) -> dict[str, int]:
        """Decomposition drivers used (:mod:`depthlens.linalg.guarded`) since the last call."""
        now = drivers.driver_counts()
        used = drivers.count_difference(now, self._drivers_seen)
        self._drivers_seen = now
        return used

    def stage_drivers(self, stage: str) -> dict[str, int]:
        """Decomposition drivers used by the finished units of ``stage`` (summed over their
        ``.done`` records), plus any used in this process since the last finished unit."""
        total: Counter[str] = Counter(self._drivers_since_last())
        folder = self._unit_dir(stage)
        for done in sorted(folder.glob("*.done")) if folder.is_dir() else ():
            record = json.loads(done.read_text())
            total.update(record.get("drivers", {}) if isinstance(record, dict) else {})
        return dict(sorted(total.items()))

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
        atomic.write_safetensors(path, arrays, self._array_metadata({k: np.asarray(v).dtype for k, v in arrays.items()},
                                                                    metadata))
        return path

    @contextlib.contextmanager
    def array_writer(self, name: str, shapes: Mapping[str, tuple[int, ...]], dtype: np.dtype | str,
                     **metadata: str) -> Iterator[dict[str, np.memmap]]:
        """Write ``arrays/NAME.safetensors`` (the same file and metadata as :meth:`write_arrays`)
        one array at a time: yields writable memory maps of zeros of the given shapes, all of
        ``dtype``; the file appears, atomically, when the body ends without raising."""
        path = self.root / "arrays" / f"{name}.safetensors"
        with atomic.safetensors_writer(path, shapes, dtype,
                                       self._array_metadata({k: np.dtype(dtype) for k in shapes}, metadata)) as store:
            yield store

    def _array_metadata(self, dtypes: Mapping[str, np.dtype], metadata: Mapping[str, object]) -> dict[str, str]:
        meta = {"config_hash": str(self.manifest["config_hash"]), **{k: str(v) for k, v in metadata.items()}}
        meta["dtypes"] = json.dumps({k: str(v) for k, v in dtypes.items()}, sort_keys=True)
        return meta

    def read_arrays(self, name: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Read ``arrays/NAME.safetensors`` as written by :meth:`write_arrays`: its arrays (in
        their stored dtype) and its metadata.

        Raises
        ------
        RunError
            When the file is absent or unreadable, naming it.
        """
        from safetensors import SafetensorError

        path = self.root / "arrays" / f"{name}.safetensors"
        try:
            return atomic.read_safetensors(path)
        except (OSError, SafetensorError) as exc:
            raise RunError(f"arrays/{name}.safetensors of {self.root} cannot be read ({one_line(exc)}).") from None

    def write_json(self, name: str, obj: Any) -> Path:
        """Atomically write ``NAME.json`` at the top of the run directory."""
        path = self.root / f"{name}.json"
        atomic.write_json(path, obj)
        return path
