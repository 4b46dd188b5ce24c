"""Run directories: refusal rules, atomic writes, units and manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file, safe_open

from depthlens.errors import RunError
from depthlens.runs import Mode, RunDirectory, check_target, read_manifest
from depthlens.runs.atomic import atomic_path


def _open(path: Path, mode: Mode, h: str = "abc") -> RunDirectory:
    return RunDirectory.open(path, mode, {"config_hash": h, "seed": 1})


def test_new_run_writes_manifest(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", Mode.NEW)
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["config_hash"] == "abc" and "created" in manifest
    run.mark_stage("capture", "done", n=3)
    assert read_manifest(run.root)["stages"]["capture"] == {"status": "done", "n": 3}


def test_refusals(tmp_path: Path) -> None:
    root = tmp_path / "r"
    _open(root, Mode.NEW)
    with pytest.raises(RunError, match="--resume"):
        _open(root, Mode.NEW)
    with pytest.raises(RunError, match="different configuration"):
        _open(root, Mode.RESUME, "other")
    stranger = tmp_path / "home"
    stranger.mkdir()
    (stranger / "precious.txt").write_text("keep")
    with pytest.raises(RunError, match="not a depthlens run"):
        check_target(stranger, Mode.OVERWRITE, "abc")
    assert (stranger / "precious.txt").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match="is a file"):
        check_target(tmp_path / "file", Mode.NEW, "abc")


def test_overwrite_and_resume(tmp_path: Path) -> None:
    root = tmp_path / "r"
    run = _open(root, Mode.NEW)
    run.write_unit("s", "u0", {"t": pd.DataFrame({"x": [1]})})
    resumed = _open(root, Mode.RESUME)
    assert resumed.has_unit("s", "u0") and len(resumed.manifest["resumed"]) == 1
    fresh = _open(root, Mode.OVERWRITE)
    assert not fresh.has_unit("s", "u0")


def test_units_round_trip(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", Mode.NEW)
    for i in range(3):
        run.write_unit("s", f"u{i}", {"t": pd.DataFrame({"x": [i, i + 10]})})
    table = run.read_units("s", ["u2", "u0", "u1"], "t")
    assert table["x"].tolist() == [2, 12, 0, 10, 1, 11]
    with pytest.raises(RunError, match="unfinished"):
        run.read_units("s", ["u0", "u9"], "t")


def test_tables_and_arrays(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", Mode.NEW)
    df = pd.DataFrame({"layer": [0, 1], "v": [0.5, 1.5]})
    run.write_table("t", df)
    pd.testing.assert_frame_equal(run.read_table("t"), df)
    arr = np.arange(6, dtype=np.float64).reshape(2, 3)
    path = run.write_arrays("a", {"J": arr}, note="x")
    np.testing.assert_array_equal(load_file(str(path))["J"], arr)
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
    assert meta["config_hash"] == "abc" and json.loads(meta["dtypes"]) == {"J": "float64"}


def test_atomic_path_leaves_nothing_on_error(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(ZeroDivisionError):
        with atomic_path(target) as tmp:
            tmp.write_text("new")
            1 / 0
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]
