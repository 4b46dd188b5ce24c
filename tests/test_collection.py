"""The skeleton of a run made of runs (``depthlens census``, ``depthlens sweep``), on toy members
that need no model: opening and overwriting, visiting with failure isolation and resume, and
closing with the tables, the manifest's record of what did not finish, and RunIncomplete."""

from __future__ import annotations

import errno
from pathlib import Path

import pandas as pd
import pytest

from depthlens.collection import Member, close_collection, open_collection, visit
from depthlens.errors import RunError, RunIncomplete, StorageError
from depthlens.runs import RunDirectory, RunMode
from depthlens.runs.directory import read_manifest
from depthlens.runs.failures import UnitFailure

KIND = "sweep"


def _open(root: Path, mode: RunMode = RunMode.NEW, digest: str = "d1") -> RunDirectory:
    return open_collection(KIND, root, mode, digest, {"cells": ["a", "b"]}, member_folders=lambda r: [r / "cells"],
                           identity={"config": {"chunks": 1}})


def _member(root: Path, name: str) -> Member:
    return Member(f"cell_{name}", name, f"cell {name}", root / "cells" / name)


def _sub_run(folder: Path) -> None:
    """A finished toy member run (a run directory with one file it wrote)."""
    run = RunDirectory.open(folder, RunMode.NEW, {"config_hash": "m", "seed": 0})
    run.write_table("t", pd.DataFrame({"x": [0]}))


def test_open_writes_the_manifest_and_marks_the_stage_running(tmp_path: Path) -> None:
    run = open_collection(KIND, tmp_path / "c", RunMode.NEW, "d1", {"cells": ["a", "b"]},
                          member_folders=lambda r: [r / "cells"], command=("depthlens", "sweep", "s.toml"))
    manifest = read_manifest(run.root)
    assert manifest["kind"] == KIND and manifest["config_hash"] == "d1" and manifest["cells"] == ["a", "b"]
    # the software and machine behind the numbers, as a run records them
    assert set(manifest["versions"]) >= {"depthlens", "numpy", "torch"} and "blas" in str(manifest["environment"])
    assert manifest["command"]["argv"] == ["depthlens", "sweep", "s.toml"] and manifest["python"]
    assert set(manifest["source"]) == {"version", "commit", "dirty"}
    assert manifest["stages"][KIND]["status"] == "running"


def test_a_member_that_finishes_is_a_unit_read_back_on_resume(tmp_path: Path) -> None:
    run = _open(tmp_path / "c")
    member = _member(run.root, "a")
    modes: list[RunMode] = []

    def work(mode: RunMode, record: dict) -> None:
        modes.append(mode)
        _sub_run(member.folder)
        record.update(loss=1.25, family="llama")

    first = visit(run, KIND, member, work, print)
    assert first.status == "done" and first.record == {"loss": 1.25, "family": "llama"} and run.has_unit(KIND, "cell_a")
    outcome = visit(run, KIND, member, work, print)  # finished: read back, the work is not run again
    assert outcome.status == "done" and outcome.error == "" and outcome.record == {"loss": 1.25, "family": "llama"}
    assert modes == [RunMode.NEW]
    resumed = _open(run.root, RunMode.RESUME)
    assert visit(resumed, KIND, member, work, print).record["loss"] == 1.25 and modes == [RunMode.NEW]


def test_a_member_folder_holding_a_run_is_resumed(tmp_path: Path) -> None:
    run = _open(tmp_path / "c")
    member = _member(run.root, "a")
    _sub_run(member.folder)  # an earlier session's member run, stopped before its unit was written
    modes: list[RunMode] = []
    visit(run, KIND, member, lambda mode, record: modes.append(mode), print)
    assert modes == [RunMode.RESUME]


def test_failed_and_incomplete_members_are_recorded_and_the_others_go_on(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    run = _open(tmp_path / "c")
    said: list[str] = []

    def fails(mode: RunMode, record: dict) -> None:
        raise ValueError("no weights here")

    def incomplete(mode: RunMode, record: dict) -> None:
        record["loss"] = 2.0  # what the work learnt before its run ended incomplete is kept
        raise RunIncomplete(tmp_path, [UnitFailure("attention", "probe_0", "boom", tmp_path / "logs" / "a.log")])

    failed = visit(run, KIND, _member(run.root, "a"), fails, said.append)
    assert failed.status == "failed" and failed.error == "ValueError: no weights here"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("depthlens: sweep: cell a failed: ValueError: no weights here")
    assert "the others go on" in err[0] and "sweep.log" in err[0]
    assert "no weights here" in (run.root / "logs" / "sweep.log").read_text()
    partial = visit(run, KIND, _member(run.root, "b"), incomplete, said.append)
    assert partial.status == "incomplete" and partial.record == {"loss": 2.0} and "attention unit probe_0" in partial.error
    assert said == [f"sweep: cell b is incomplete: {partial.error}"]
    assert [(f.unit, f.error.split(":")[0]) for f in run.failures.failures] == [("a", "ValueError"), ("b", "incomplete")]
    assert not run.has_unit(KIND, "cell_a") and not run.has_unit(KIND, "cell_b")  # --resume tries both again
    reported: list[bool] = []
    with pytest.raises(RunIncomplete) as stopped:
        close_collection(run, KIND, {}, {"a": failed.error, "b": partial.error}, lambda: reported.append(True))
    assert reported == [True] and [f.unit for f in stopped.value.failures] == ["a", "b"]
    stage = read_manifest(run.root)["stages"][KIND]
    assert stage["status"] == "done" and stage["not_done"] == {"a": failed.error, "b": partial.error}


def test_a_full_disk_stops_the_collection(tmp_path: Path) -> None:
    run = _open(tmp_path / "c")

    def full(mode: RunMode, record: dict) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    with pytest.raises(StorageError):
        visit(run, KIND, _member(run.root, "a"), full, print)
    assert run.failures.failures == []


def test_close_writes_conformed_tables_and_returns_the_root(tmp_path: Path) -> None:
    run = _open(tmp_path / "c")
    table = pd.DataFrame({"model": ["random:llama"], "revision": [""], "text": ["t.txt"], "error": [""],
                          "status": ["done"], "run_dir": ["cells/a"], "seed": [0], "cell": ["a"]})
    assert close_collection(run, KIND, {"sweep": table}, {}, lambda: None) == run.root
    written = pd.read_parquet(run.root / "tables" / "sweep.parquet")
    assert list(written.columns) == ["model", "revision", "text", "cell", "seed", "run_dir", "status", "error"]
    assert "not_done" not in read_manifest(run.root)["stages"][KIND]


def test_overwrite_removes_the_member_runs_and_a_refused_target_writes_nothing(tmp_path: Path) -> None:
    run = _open(tmp_path / "c")
    member = _member(run.root, "a")
    _sub_run(member.folder)
    stray = run.root / "cells" / "notes.txt"
    stray.write_text("mine")
    with pytest.raises(RunError):
        _open(run.root, RunMode.NEW)  # a run is there: --resume or --overwrite
    assert (member.folder / "tables" / "t.parquet").is_file()
    _open(run.root, RunMode.OVERWRITE)
    assert not (member.folder / "tables" / "t.parquet").exists() and stray.read_text() == "mine"
    with pytest.raises(RunError, match="--overwrite"):
        _open(run.root, RunMode.RESUME, digest="d2")  # another configuration: refused, nothing touched
    assert read_manifest(run.root)["config_hash"] == "d1"
