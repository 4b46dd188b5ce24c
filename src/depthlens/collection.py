"""Runs made of runs: the skeleton that ``depthlens census`` (one run per checkpoint) and
``depthlens sweep`` (one run per cell) share.

A collection is itself a run directory (manifest, index, ``--resume`` and ``--overwrite`` as
for a run) with one stage, named for its kind, whose units are its member runs:

1. :func:`open_collection` checks the target, removes the member runs of an overwritten
   collection, writes the manifest (with the software and machine behind the numbers, as a
   run's) and marks the stage running;
2. :func:`visit` runs one member with failure isolation, or reads back the record of a
   member that finished (``--resume``); a member that ends incomplete or fails is recorded,
   announced in one line, and the others go on;
3. :func:`close_collection` writes the collection's tables, marks the stage done (with the
   members that did not finish), and ends as a run of stages ends
   (:func:`depthlens.workflow.conclude`): the report, then
   :class:`~depthlens.errors.RunIncomplete` when a member did not finish.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .errors import RunIncomplete
from .runs import RunDirectory, RunMode, check_target
from .runs.directory import not_a_run, remove_sub_runs
from .runs.failures import UnitFailure, fatal
from .schema import conform_table
from .workflow import conclude, provenance

__all__ = ["Member", "Outcome", "close_collection", "open_collection", "visit"]

#: The unit table that holds a finished member's record.
RECORD = "member"


@dataclass(frozen=True)
class Member:
    """One run of a collection.

    ``key`` is its unit key in the collection's stage, ``name`` how its failure names it (the
    failure's unit), ``title`` how the progress lines name it, ``folder`` its run directory.
    """

    key: str
    name: str
    title: str
    folder: Path


@dataclass(frozen=True)
class Outcome:
    """How a member ended: ``status`` ``done``, ``incomplete`` or ``failed``, its one-line
    ``error`` ("" when done), and the ``record`` its work filled in (read back for a member
    that finished in an earlier session)."""

    status: str
    error: str = ""
    record: dict = field(default_factory=dict)


def open_collection(kind: str, out: str | Path, run_mode: RunMode, digest: str, manifest: dict, *,
                    member_folders: Callable[[Path], Iterable[Path]], command: Sequence[str] = (),
                    identity: dict | None = None, changes: Callable[[dict], list[tuple[str, str]]] | None = None
                    ) -> RunDirectory:
    """Open the collection ``out`` of ``kind`` (``census``, ``sweep``) and mark its stage running.

    ``out`` is checked against ``run_mode`` (:func:`~depthlens.runs.check_target`, with
    ``digest`` the collection's hash and ``identity`` or ``changes`` what a refused resume
    shows). Overwriting an existing collection first removes its member runs:
    ``member_folders(root)`` lists the folders that hold them, read before the manifest is
    replaced. The manifest
    is ``manifest`` with ``kind``, ``config_hash`` and the software and machine behind the
    numbers added (:func:`depthlens.workflow.provenance`, with the command line ``command``).

    Raises
    ------
    InputError
        ``out`` does not suit ``run_mode`` (nothing is written).
    """
    check_target(out, run_mode, digest, identity, changes=changes)
    root = Path(out)
    if run_mode is RunMode.OVERWRITE and root.is_dir() and not_a_run(root) is None:
        for folder in list(member_folders(root)):
            remove_sub_runs(folder)
    record = {"kind": kind, **manifest, "config_hash": digest, **provenance(command)}
    run_dir = RunDirectory.open(root, run_mode, record)
    run_dir.mark_stage(kind, "running")
    return run_dir


def visit(run_dir: RunDirectory, kind: str, member: Member, work: Callable[[RunMode, dict], None],
          say: Callable[[str], None]) -> Outcome:
    """Run one member of the collection ``run_dir``, or read back the one that finished.

    ``work(mode, record)`` runs the member into ``member.folder`` (``mode``: resume where a run
    is there, else new) and fills ``record`` with what the collection keeps of it (flat
    values); once it returns, ``record`` is written as the member's unit. A member whose run
    ends in :class:`~depthlens.errors.RunIncomplete` is ``incomplete`` (not a unit: ``--resume``
    goes on with it); one whose work raises is ``failed``, its traceback in
    ``logs/<kind>.log``. Both are recorded in ``run_dir.failures`` and announced in one line.

    Raises
    ------
    StorageError
        A full disk or read-only file system stops the collection (not isolated).
    """
    if run_dir.has_unit(kind, member.key):
        done = run_dir.read_units(kind, [member.key], RECORD).iloc[0]
        return Outcome("done", record={k: v for k, v in done.items() if k != "done"})
    mode = RunMode.RESUME if member.folder.is_dir() and not_a_run(member.folder) is None else RunMode.NEW
    record: dict = {}
    try:
        work(mode, record)
    except RunIncomplete as exc:
        error = exc.failures[0].line() if exc.failures else "some units failed"
        say(f"{kind}: {member.title} is incomplete: {error}")
        run_dir.failures.add(UnitFailure(kind, member.name, f"incomplete: {error}", member.folder / "logs"))
        return Outcome("incomplete", error, record)
    except Exception as exc:  # noqa: BLE001 - a member that fails is recorded and the others go on
        stop = fatal(exc)
        if stop is exc:
            raise
        if stop is not None:
            raise stop from exc
        failure = run_dir.failures.record(kind, member.name, exc)
        print(f"depthlens: {kind}: {member.title} failed: {failure.error} (details in {failure.log}); the others go on",
              file=sys.stderr, flush=True)
        return Outcome("failed", failure.error, record)
    run_dir.write_unit(kind, member.key, {RECORD: pd.DataFrame([{"done": True, **record}])})
    return Outcome("done", record=record)


def close_collection(run_dir: RunDirectory, kind: str, tables: dict[str, pd.DataFrame], not_done: dict[str, str],
                     report: Callable[[], object]) -> Path:
    """Write the collection's ``tables`` (conformed to the schema), mark its stage done with
    the members that did not finish (``not_done``: name → error, in the manifest), render the
    ``report``, and return the collection's path.

    Raises
    ------
    RunIncomplete
        After the tables and the report are written, when any member failed or is incomplete
        (its failures, as :func:`visit` recorded them).
    """
    for name, table in tables.items():
        run_dir.write_table(name, conform_table(name, table))
    run_dir.mark_stage(kind, "done", **({"not_done": not_done} if not_done else {}))
    conclude(run_dir, report)  # every member was visited: the report, then what failed
    return run_dir.root
