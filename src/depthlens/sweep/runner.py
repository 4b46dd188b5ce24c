"""``depthlens sweep SWEEP.toml``: every cell of a sweep as an ordinary run, then one
cross-model report.

Layout of a sweep directory (itself a depthlens run directory: manifest, index, ``--resume``
and ``--overwrite`` as for a run)::

    OUT/manifest.json          the sweep file's path and hash, its cells and their configurations
    OUT/sweep.toml             a copy of the sweep file
    OUT/cells/LABEL/           one run per cell (every table of its stages, its report.html)
    OUT/tables/sweep.parquet   the index: one row per cell with its axes, status and error
    OUT/compare/compare.html   the cross-model report of the cells (``depthlens compare``)

Cells run one after another in this process; each cell's numerical tasks go to the executor
of ``--executor`` (local worker processes, a Ray cluster, SLURM jobs). A cell that cannot be
loaded or analysed is recorded (``status`` ``failed`` with its one-line error, the traceback in
``logs/sweep.log``), announced in one line, and the other cells go on; the report marks it, and
the sweep ends with :class:`~depthlens.errors.RunIncomplete` naming every failed or incomplete
cell (exit 3 on the command line). A
finished cell is a unit of the sweep: ``--resume`` skips it and resumes an unfinished cell's
own run where it stopped.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..collection import Member, close_collection, open_collection, visit
from ..executors import Execution
from ..runs import RunDirectory, RunMode, atomic
from ..runs.changes import option_changes
from .spec import Cell, Sweep, read_sweep

__all__ = ["KIND", "STAGE", "run_sweep", "sweep_changes"]

STAGE = "sweep"
KIND = "sweep"
#: Where the copy of the sweep file goes in the sweep directory.
SWEEP_COPY = "sweep.toml"


def run_sweep(path: str | Path, out: str | Path, run_mode: RunMode = RunMode.NEW, execution: Execution = Execution(),
              claims: str | Path | None = None) -> Path:
    """Run every cell of the sweep file ``path`` into ``out`` and render the cross-model
    report; return the sweep directory.

    Everything is checked before anything is written: the sweep file (every key, every
    cell's configuration), every cell's plan (:func:`depthlens.workflow.check_plan`), the
    claims file, the executor and ``out`` against ``run_mode``.

    Parameters
    ----------
    claims : str or Path, optional
        A claims file for every cell, instead of the sweep file's ``claims`` (default: the
        packaged claims).

    Raises
    ------
    DepthlensError
        Bad input, before anything is written.
    StorageError
        A full disk or read-only file system (the sweep stops; ``--resume`` continues).
    RunIncomplete
        After the index and the cross-model report are written, when any cell failed or is
        incomplete (one failure per cell; ``--resume`` retries them).
    """
    from ..executors import check_execution
    from ..workflow import check_plan, claims_registration

    sweep = read_sweep(path)
    claims = Path(claims) if claims is not None else sweep.claims
    _, claims_record = claims_registration(claims)
    plans = {cell.label: check_plan(cell.config, sweep.stages) for cell in sweep.cells}
    check_execution(execution)
    manifest = {"sweep_file": str(sweep.source.resolve()), "stages": list(sweep.stages), "claims": claims_record,
                "cells": [{"label": c.label, **c.axes, "config": c.config.to_dict(), "config_hash": c.config.hash()}
                          for c in sweep.cells]}
    run_dir = open_collection(KIND, out, run_mode, Sweep(sweep.source, sweep.cells, sweep.stages, claims).digest(),
                              manifest, member_folders=lambda root: [root / "cells"], command=execution.command,
                              changes=lambda stored: sweep_changes(stored, sweep.cells))
    root = run_dir.root
    if not (root / SWEEP_COPY).is_file():
        atomic.write_bytes(root / SWEEP_COPY, sweep.source.read_bytes())
    rows = []
    for k, cell in enumerate(sweep.cells):
        execution.say(f"sweep: cell {cell.label} ({k + 1}/{len(sweep.cells)})")
        rows.append(_cell(run_dir, cell, plans[cell.label], execution, claims))
    table = pd.DataFrame(rows)
    not_done = table[table["status"] != "done"]
    return close_collection(run_dir, STAGE, {STAGE: table}, dict(zip(not_done["cell"], not_done["error"])),
                            lambda: _compare(root, table))


def sweep_changes(stored: dict, cells: Sequence[Cell]) -> list[tuple[str, str]]:
    """What differs between the sweep a directory was started with (its ``stored`` manifest)
    and this one, as ``(old, new)`` pairs for :func:`~depthlens.runs.changes.resume_refused`:
    a cell only in one of them and each option of a cell that differs (``cell LABEL: --chunks
    4``, :func:`~depthlens.runs.changes.option_changes`). Empty when only the stages or the
    claims file differ (the manifest records neither by value: the refusal then shows the two
    hashes).

    Examples
    --------
    >>> from depthlens.config import RunConfig
    >>> stored = {"cells": [{"label": "a", "config": RunConfig(chunks=4).to_dict()}]}
    >>> sweep_changes(stored, [Cell("a", RunConfig(chunks=8))])
    [('cell a: --chunks 4', 'cell a: --chunks 8')]
    """
    old = {c.get("label"): c.get("config") or {} for c in stored.get("cells") or []}
    new = {c.label: c.config.to_dict() for c in cells}
    found = []
    for label in dict.fromkeys([*new, *old]):
        if label not in old:
            found.append((f"no cell {label}", f"cell {label}"))
        elif label not in new:
            found.append((f"cell {label}", f"no cell {label}"))
        else:
            found += [(f"cell {label}: {a}", f"cell {label}: {b}")
                      for a, b in option_changes({"config": old[label]}, {"config": new[label]})]
    return found


def _cell(run_dir: RunDirectory, cell: Cell, plan: list[str], execution: Execution, claims: Path | None) -> dict:
    """Run one cell (or take its finished unit) and return its row of the ``sweep`` table."""
    from ..workflow import run

    sub = run_dir.root / "cells" / cell.label

    def work(mode: RunMode, record: dict) -> None:
        try:
            run(cell.config, sub, run_mode=mode, stages=plan, execution=execution, claims=claims, report=True)
        finally:
            gc.collect()  # the cell's model holds reference cycles: free it before the next cell loads

    outcome = visit(run_dir, STAGE, Member(f"cell_{cell.label}", cell.label, f"cell {cell.label}", sub), work,
                    execution.say)
    return {**cell.axes, "cell": cell.label, "run_dir": f"cells/{cell.label}", "status": outcome.status,
            "error": outcome.error}


def _compare(root: Path, table: pd.DataFrame) -> Path:
    """The cross-model report of the sweep's cells in ``OUT/compare`` (failed cells marked)."""
    from ..report.compare import render_comparison

    ran = table[table["status"] != "failed"]
    failed = table[table["status"] == "failed"]
    return render_comparison([root / d for d in ran["run_dir"]], root / "compare", labels=list(ran["cell"]),
                             failed=dict(zip(failed["cell"], failed["error"])))
