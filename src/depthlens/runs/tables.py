"""Read-only access to what a run directory holds, for figures, claims and the report.

:class:`RunTables` loads ``tables/*.parquet``, the stage summaries (``attention.json``,
``topology.json``, ...), ``manifest.json`` and ``arrays/pseudospectra.safetensors`` lazily and
caches them. Anything absent (a stage that did not run or failed, a damaged file) reads as
``None`` with a one-line reason from :meth:`RunTables.why_missing`; nothing here raises on a
missing input and nothing recomputes an analysis.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from .atomic import read_safetensors
from ..schema import producer, trained_rows

#: What a run of format 2 named differently, by today's table name: the file's name then and
#: its columns renamed since (``{old: new}``); :meth:`RunTables.table` reads such a run under
#: today's names.
FORMAT_2_NAMES: dict[str, tuple[str, dict[str, str]]] = {
    "nodes": ("units", {"boundary": "boundary_index", "unit": "dim"}),
    "communities": ("communities", {"boundary": "boundary_index"}),
    "coupling": ("coupling", {"boundary": "boundary_index"}),
    "topology_profile": ("topology_profile", {"reference_boundary": "reference_boundary_index"}),
    "cumulative": ("cumulative", {"alpha": "schur_alpha"}),
}

#: How a stage status from the manifest reads in the report.
STATUS_TEXT = {"done": "done", "running": "incomplete (interrupted)", "interrupted": "interrupted (--resume continues)",
               "failed": "failed"}


class RunTables:
    """Lazy, cached, read-only view of a run directory.

    Parameters
    ----------
    run_dir : str or Path
        The run directory (need not hold a manifest; everything missing reads as ``None``).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir)
        self._cache: dict[str, Any] = {}
        self._errors: dict[str, str] = {}

    # -- raw access -------------------------------------------------------------------
    def table(self, name: str) -> pd.DataFrame | None:
        """``tables/NAME.parquet`` as a DataFrame, or ``None`` when absent or unreadable (a run
        of format 2 under today's names: :data:`FORMAT_2_NAMES`)."""
        key = f"table:{name}"
        if key not in self._cache:
            old = self.manifest.get("format_version") in (1, 2)
            file, renamed = FORMAT_2_NAMES.get(name, (name, {})) if old else (name, {})
            table = self._read(key, self.root / "tables" / f"{file}.parquet", pd.read_parquet)
            self._cache[key] = table.rename(columns=renamed) if table is not None and renamed else table
        value = self._cache[key]
        return None if value is None else value.copy()

    def trained(self, name: str) -> pd.DataFrame | None:
        """The rows of ``tables/NAME.parquet`` about the model as loaded (checkpoint
        ``trained``; every row of a table without a ``checkpoint`` column), or ``None``: what
        the claims, figures and report read of a table that may hold other checkpoints too."""
        table = self.table(name)
        return None if table is None else trained_rows(table)

    def json(self, name: str) -> dict[str, Any] | None:
        """``NAME.json`` at the top of the run directory, or ``None``."""
        key = f"json:{name}"
        if key not in self._cache:
            path = self.root / f"{name}.json"
            self._cache[key] = self._read(key, path, lambda p: json.loads(Path(p).read_text()))
        return self._cache[key]

    def derived(self, key: str, compute: Callable[[], Any]) -> Any:
        """A value computed from this run's tables, cached under ``key`` (for a quantity that
        several statistics or sample counters read, e.g. the census onsets)."""
        key = f"derived:{key}"
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest, or an empty dict when absent or damaged."""
        return self.json("manifest") or {}

    def arrays(self, name: str) -> tuple[dict[str, np.ndarray], dict[str, str]] | None:
        """``arrays/NAME.safetensors`` as (arrays, metadata), or ``None``."""
        key = f"arrays:{name}"
        if key not in self._cache:
            path = self.root / "arrays" / f"{name}.safetensors"
            self._cache[key] = self._read(key, path, read_safetensors)
        return self._cache[key]

    def _read(self, key: str, path: Path, reader) -> Any:
        if not path.is_file():
            return None
        try:
            return reader(path)
        except Exception as exc:  # a damaged file reads as missing, with its reason kept
            self._errors[key] = f"{path.name} is unreadable ({type(exc).__name__})"
            return None

    # -- stages -----------------------------------------------------------------------
    def stage_status(self, stage: str) -> str:
        """``done``, ``running``, ``failed`` (as in the manifest) or ``not run``."""
        info = (self.manifest.get("stages") or {}).get(stage)
        if isinstance(info, dict) and isinstance(info.get("status"), str):
            return info["status"]
        return "not run"

    def why_missing(self, output: str) -> str:
        """One line saying why ``output`` (a table ``NAME``, ``NAME.json`` or ``arrays/NAME`` of
        :mod:`depthlens.schema`) is not available."""
        kind, name = _split(output)
        key = f"{kind}:{name}"
        if key in self._errors:
            return self._errors[key]
        stage = producer(output)
        label = {"table": f"tables/{name}.parquet", "json": f"{name}.json",
                 "arrays": f"arrays/{name}.safetensors"}[kind]
        if stage is None:
            return f"{label} is absent"
        status = self.stage_status(stage)
        if status == "done":
            return f"{label} is absent although stage {stage} is done"
        return f"stage {stage} {STATUS_TEXT.get(status, status)}: {label} is absent"

    def has(self, output: str) -> bool:
        """Whether ``output`` (``NAME``, ``NAME.json`` or ``arrays/NAME``) can be read."""
        kind, name = _split(output)
        return {"table": self.table, "json": self.json, "arrays": self.arrays}[kind](name) is not None


def _split(output: str) -> tuple[str, str]:
    if output.startswith("arrays/"):
        return "arrays", output[len("arrays/"):]
    if output.endswith(".json"):
        return "json", output[: -len(".json")]
    return "table", output
