"""Run directories: refusal rules, atomic writes, units and manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file, safe_open

from depthlens.errors import RunError
from depthlens.runs import (
    FORMAT,
    FORMAT_VERSION,
    RunMode,
    RunDirectory,
    atomic,
    check_target,
    not_a_run,
    read_manifest,
    remove_run_files,
)
from depthlens.runs.atomic import atomic_path


def _open(path: Path, mode: RunMode, h: str = "abc") -> RunDirectory:
    return RunDirectory.open(path, mode, {"config_hash": h, "seed": 1})


def test_new_run_writes_manifest(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", RunMode.NEW)
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["config_hash"] == "abc" and "created" in manifest
    run.mark_stage("capture", "done", n=3)
    assert {"status": "done", "n": 3}.items() <= read_manifest(run.root)["stages"]["capture"].items()


def test_refusals(tmp_path: Path) -> None:
    root = tmp_path / "r"
    _open(root, RunMode.NEW)
    with pytest.raises(RunError, match="--resume"):
        _open(root, RunMode.NEW)
    with pytest.raises(RunError, match="it was started with other options .*hash abc, now other"):
        _open(root, RunMode.RESUME, "other")
    stranger = tmp_path / "home"
    stranger.mkdir()
    (stranger / "precious.txt").write_text("keep")
    with pytest.raises(RunError, match="not a depthlens run"):
        check_target(stranger, RunMode.OVERWRITE, "abc")
    assert (stranger / "precious.txt").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunError, match="is a file"):
        check_target(tmp_path / "file", RunMode.NEW, "abc")


def test_overwrite_and_resume(tmp_path: Path) -> None:
    root = tmp_path / "r"
    run = _open(root, RunMode.NEW)
    run.write_unit("s", "u0", {"t": pd.DataFrame({"x": [1]})})
    resumed = _open(root, RunMode.RESUME)
    assert resumed.has_unit("s", "u0") and len(resumed.manifest["resumed"]) == 1
    fresh = _open(root, RunMode.OVERWRITE)
    assert not fresh.has_unit("s", "u0")


def test_units_round_trip(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", RunMode.NEW)
    for i in range(3):
        run.write_unit("s", f"u{i}", {"t": pd.DataFrame({"x": [i, i + 10]})})
    table = run.read_units("s", ["u2", "u0", "u1"], "t")
    assert table["x"].tolist() == [2, 12, 0, 10, 1, 11]
    with pytest.raises(RunError, match="unfinished"):
        run.read_units("s", ["u0", "u9"], "t")



def test_a_unit_is_computed_once_and_always_read_back(tmp_path: Path) -> None:
    """``unit``: the first call computes and stores, every call returns the stored tables (the
    same bytes a resumed run reads), and a later call, even from a reopened run, computes nothing."""
    calls: list[int] = []

    def compute() -> dict[str, pd.DataFrame]:
        calls.append(1)
        return {"a": pd.DataFrame({"x": [1.0, 2.0]}), "b": pd.DataFrame({"y": ["p"]})}

    run = _open(tmp_path / "r", RunMode.NEW)
    first = run.unit("s", "k", compute)
    assert calls == [1] and sorted(first) == ["a", "b"]
    pd.testing.assert_frame_equal(first["a"], pd.read_parquet(tmp_path / "r" / "units" / "s" / "k.a.parquet"))
    again = _open(tmp_path / "r", RunMode.RESUME).unit("s", "k", compute)
    assert calls == [1]
    pd.testing.assert_frame_equal(again["b"], first["b"])


def test_an_isolated_unit_that_fails_is_recorded_and_skipped(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", RunMode.NEW)

    def broken() -> dict[str, pd.DataFrame]:
        raise ValueError("a bad chunk")

    assert run.unit("s", "k", broken, isolated=True) is None
    assert not run.has_unit("s", "k") and [f.unit for f in run.failures.failures] == ["k"]
    with pytest.raises(ValueError, match="a bad chunk"):
        run.unit("s", "k2", broken)
    with pytest.raises(KeyboardInterrupt):
        run.unit("s", "k3", lambda: (_ for _ in ()).throw(KeyboardInterrupt()), isolated=True)


def test_finished_keeps_order_and_refuses_when_every_unit_failed(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", RunMode.NEW)
    for key in ("u2", "u0"):
        run.write_unit("s", key, {"t": pd.DataFrame({"x": [0]})})
    assert run.finished("s", ["u0", "u1", "u2"]) == ["u0", "u2"]
    assert run.finished("s", ["u7"]) == []
    with pytest.raises(RunError, match="every unit of the s stage starting with u7 failed"):
        run.finished("s", ["u7", "u8"], required=True)
    # what is still to compute: the unfinished keys with their work, in order
    assert run.pending("s", zip(["u0", "u1", "u2", "u3"], "abcd")) == [("u1", "b"), ("u3", "d")]
    assert run.pending("other", [("u0", 1)]) == [("u0", 1)]


def test_tables_and_arrays(tmp_path: Path) -> None:
    run = _open(tmp_path / "r", RunMode.NEW)
    df = pd.DataFrame({"layer": [0, 1], "v": [0.5, 1.5]})
    run.write_table("t", df)
    pd.testing.assert_frame_equal(run.read_table("t"), df)
    arr = np.arange(6, dtype=np.float64).reshape(2, 3)
    path = run.write_arrays("a", {"J": arr}, note="x")
    np.testing.assert_array_equal(load_file(str(path))["J"], arr)
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
    assert meta["config_hash"] == "abc" and json.loads(meta["dtypes"]) == {"J": "float64"}
    single = np.ones(3, dtype=np.float32)
    run.write_arrays("b", {"J": arr, "s": single})
    arrays, meta = run.read_arrays("b")  # the reader of what write_arrays wrote: dtypes and metadata kept
    assert arrays["J"].dtype == np.float64 and arrays["s"].dtype == np.float32
    np.testing.assert_array_equal(arrays["J"], arr)
    assert meta["config_hash"] == "abc" and json.loads(meta["dtypes"]) == {"J": "float64", "s": "float32"}
    with pytest.raises(RunError, match="arrays/missing.safetensors of .* cannot be read"):
        run.read_arrays("missing")
    (tmp_path / "r" / "arrays" / "bad.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(RunError, match="arrays/bad.safetensors of .* cannot be read"):
        run.read_arrays("bad")


def test_atomic_path_leaves_nothing_on_error(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(ZeroDivisionError):
        with atomic_path(target) as tmp:
            tmp.write_text("new")
            1 / 0
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def _foreign_project(root: Path) -> None:
    """A folder with a manifest.json that depthlens did not write (a JS project)."""
    (root / "src").mkdir(parents=True)
    (root / "manifest.json").write_text('{"name": "app"}')
    (root / "src" / "app.js").write_text("x")


@pytest.mark.parametrize("mode", [RunMode.NEW, RunMode.RESUME, RunMode.OVERWRITE])
def test_foreign_manifest_is_not_a_run(tmp_path: Path, mode: RunMode) -> None:
    root = tmp_path / "w"
    _foreign_project(root)
    with pytest.raises(RunError, match="not a depthlens run") as err:
        _open(root, mode)
    assert "choose another --out" in str(err.value) and "--overwrite" not in str(err.value)
    assert (root / "src" / "app.js").read_text() == "x" and (root / "manifest.json").read_text() == '{"name": "app"}'


def test_manifest_carries_the_format_marker(tmp_path: Path) -> None:
    root = tmp_path / "r"
    _open(root, RunMode.NEW)
    manifest = read_manifest(root)
    assert (manifest["format"], manifest["format_version"]) == (FORMAT, FORMAT_VERSION) == ("depthlens-run", 3)
    assert not_a_run(root) is None
    assert "manifest.json" in atomic.read_index(root)
    (root / atomic.INDEX).rename(root / "index.bak")
    assert "depthlens-index.txt" in not_a_run(root)
    (root / "index.bak").rename(root / atomic.INDEX)
    (root / "manifest.json").write_text(json.dumps({**manifest, "format_version": 4}))
    assert "version 4" in not_a_run(root)
    with pytest.raises(RunError, match="not a depthlens run"):
        _open(root, RunMode.OVERWRITE)


def test_overwrite_deletes_only_what_the_run_wrote(tmp_path: Path) -> None:
    root = tmp_path / "r"
    run = _open(root, RunMode.NEW)
    run.write_unit("s", "u0", {"t": pd.DataFrame({"x": [1]})})
    run.write_table("t", pd.DataFrame({"x": [1]}))
    run.write_arrays("a", {"J": np.eye(2)})
    run.write_json("summary", {"k": 1})
    atomic.write_bytes(root / "report.html", b"<html>")  # written by report/, not RunDirectory
    with atomic_path(root / "figures" / "f.png") as tmp:
        tmp.write_bytes(b"png")
    (root / "notes.txt").write_text("mine")
    (root / "tables" / "mine.csv").write_text("mine")
    (root / "logs").mkdir()
    fresh = _open(root, RunMode.OVERWRITE, "new")
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    assert left == ["depthlens-index.txt", "logs", "manifest.json", "notes.txt", "tables", "tables/mine.csv"]
    assert fresh.manifest["config_hash"] == "new" and atomic.read_index(root) == ["manifest.json"]


def test_overwrite_never_follows_index_entries_outside_the_run(tmp_path: Path) -> None:
    root = tmp_path / "r"
    _open(root, RunMode.NEW)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (root / "linked").symlink_to(outside)
    with (root / atomic.INDEX).open("a") as index:
        index.write(f"../outside/keep.txt\n{outside / 'keep.txt'}\nlinked/keep.txt\n")
    remove_run_files(root)
    assert (outside / "keep.txt").read_text() == "keep" and (root / "linked").is_symlink()


_WRITERS: list = []  # keeps the interrupted writers from cleaning up when collected


def _interrupted_write(path: Path) -> Path:
    """The temporary file that a write killed midway leaves beside ``path``."""
    writer = atomic_path(path)
    _WRITERS.append(writer)
    tmp = writer.__enter__()
    tmp.write_bytes(b"partial")
    return tmp


@pytest.mark.parametrize("mode", [RunMode.RESUME, RunMode.OVERWRITE])
def test_temporaries_of_killed_writes_are_removed(tmp_path: Path, mode: RunMode) -> None:
    root = tmp_path / "r"
    run = _open(root, RunMode.NEW)
    run.write_unit("s", "u0", {"t": pd.DataFrame({"x": [1]})})
    tmps = [_interrupted_write(root / "units" / "s" / "u1.t.parquet"),
            _interrupted_write(root / "tables" / "t.parquet")]
    assert all(t.is_file() and t.name.startswith(".") and t.name.endswith(".tmp") for t in tmps)
    foreign = root / "tables" / ".mine.abcdefgh.tmp"  # not a temporary of an indexed name
    foreign.write_text("mine")
    resumed = _open(root, mode)
    assert not any(t.exists() for t in tmps) and foreign.read_text() == "mine"
    assert resumed.has_unit("s", "u0") == (mode is RunMode.RESUME)


def test_safetensors_laid_out_and_mapped_agree_with_the_safetensors_library(tmp_path: Path) -> None:
    """A file laid out by create_safetensors and filled through its maps reads back with the
    safetensors library (values, dtypes, metadata), and map_safetensors reads a file the
    library wrote."""
    from safetensors.numpy import save_file

    from depthlens.runs.atomic import create_safetensors, flush, map_safetensors

    rng = np.random.default_rng(0)
    values = {"b.first": rng.standard_normal((3, 5)), "a.second": rng.standard_normal(7), "empty": np.zeros((0, 4))}
    for dtype in (np.float64, np.float32):
        path = tmp_path / f"{np.dtype(dtype).name}.safetensors"
        store = create_safetensors(path, {k: v.shape for k, v in values.items()}, dtype, {"note": "x"})
        assert all(not s.any() for s in store.values())  # zeros until written
        for k, v in values.items():
            store[k][...] = v
        flush(store)
        with safe_open(str(path), framework="numpy") as f:
            assert f.metadata() == {"note": "x"} and set(f.keys()) == set(values)
            for k, v in values.items():
                assert f.get_tensor(k).dtype == dtype and np.array_equal(f.get_tensor(k), v.astype(dtype))
    save_file({k: v for k, v in values.items()}, str(tmp_path / "lib.safetensors"))
    mapped = map_safetensors(tmp_path / "lib.safetensors")
    assert all(np.array_equal(mapped[k], v) for k, v in values.items())
    with pytest.raises(ValueError, match="int8"):
        create_safetensors(tmp_path / "bad.safetensors", {"x": (2,)}, np.int8)



def test_full_disk_during_an_array_write_is_a_storage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while safetensors writes (its ``SafetensorError`` naming the OS error) or
    while a file of memory maps is laid out is the StorageError of any other write: "no space",
    what to do, and no file of the write left behind; other safetensors errors stay as they are."""
    import errno
    import os

    import safetensors.numpy
    from safetensors import SafetensorError

    from depthlens.errors import StorageError

    def save_file(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        Path(filename).write_bytes(b"half")  # a partial write, then the disk is full
        raise SafetensorError(message)

    def posix_fallocate(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    run = _open(tmp_path / "r", RunMode.NEW)
    monkeypatch.setattr(safetensors.numpy, "save_file", save_file)
    monkeypatch.setattr(os, "posix_fallocate", posix_fallocate, raising=False)
    message = "Error while serializing: I/O error: No space left on device (os error 28)"
    with pytest.raises(StorageError, match="no space.*free some space, then rerun with --resume") as caught:
        run.write_arrays("mean", {"x": np.zeros(3)})
    assert caught.value.reason == "no space"
    with pytest.raises(StorageError, match="no space"), run.array_writer("big", {"x": (4, 4)}, np.float64):
        pytest.fail("the maps of a file the disk has no room for were handed out")
    assert list((run.root / "arrays").iterdir()) == []
    message = "Error while serializing: invalid metadata"
    with pytest.raises(SafetensorError, match="invalid metadata"):
        run.write_arrays("mean", {"x": np.zeros(3)})


def test_a_resume_with_other_options_names_them(tmp_path: Path) -> None:
    """The refusal names each option that differs, old and new, as the command line gives
    it (it showed two configuration hashes); five or more are cut after four."""
    root = tmp_path / "r"
    config = {"model": "random:llama", "chunks": 4, "revision": None, "funnel_alphas": [0.0, 1.0],
              "attention": {"null_samples": 2, "thresholds": {"sink": 0.5}}}
    RunDirectory.open(root, RunMode.NEW, {"config_hash": "a", "config": config})
    changed = {**config, "chunks": 8, "revision": "step1", "attention": {"null_samples": 2, "thresholds": {"sink": 0.6}}}
    with pytest.raises(RunError) as caught:
        check_target(root, RunMode.RESUME, "b", {"config": changed})
    assert str(caught.value) == (
        f"cannot resume {root}: it was started with --chunks 4, no --revision, thresholds.sink = 0.5, not --chunks 8, "
        "--revision step1, thresholds.sink = 0.6; rerun with the options it was started with, or pass --overwrite "
        "to replace it.")
    changed = {**changed, "model": "random:gpt2", "funnel_alphas": (1.0,)}
    with pytest.raises(RunError, match=r"--model random:llama, --chunks 4, no --revision, --funnel-alphas 0.0,1.0, not "
                                       r"--model random:gpt2, --chunks 8, --revision step1, --funnel-alphas 1.0 "
                                       r"\(and 1 more\); rerun"):
        check_target(root, RunMode.RESUME, "b", {"config": changed})
    check_target(root, RunMode.RESUME, "a", {"config": config})


def test_a_run_of_an_older_format_is_read_under_todays_names_and_never_resumed(tmp_path: Path) -> None:
    """A format-2 run (``units`` with ``boundary``/``unit``, ``cumulative`` with ``alpha``) reads
    as ``nodes`` with ``boundary_index``/``dim`` and ``schur_alpha``; resuming it is refused in
    one line that names both formats, and nothing is written."""
    from depthlens.runs import RunTables
    from depthlens.runs.tables import FORMAT_2_NAMES

    root = tmp_path / "old"
    run = _open(root, RunMode.NEW)
    run.write_table("units", pd.DataFrame({"checkpoint": ["trained"], "boundary": [3], "unit": [7]}))
    run.write_table("cumulative", pd.DataFrame({"schur_order": ["lapack"], "alpha": [0.5]}))
    run.write_table("heads", pd.DataFrame({"layer": [0]}))
    run.update_manifest(format_version=2)
    tables = RunTables(root)
    assert list(tables.table("nodes").columns) == ["checkpoint", "boundary_index", "dim"]
    assert list(tables.table("cumulative").columns) == ["schur_order", "schur_alpha"]
    assert list(tables.table("heads").columns) == ["layer"]
    assert set(FORMAT_2_NAMES) <= set(__import__("depthlens.schema", fromlist=["SCHEMA"]).SCHEMA)
    before = sorted(p.name for p in root.rglob("*"))
    with pytest.raises(RunError, match="written in run format 2, and this depthlens writes format 3; pass --overwrite"):
        _open(root, RunMode.RESUME)
    assert sorted(p.name for p in root.rglob("*")) == before
    assert RunTables(_open(tmp_path / "new", RunMode.NEW).root).manifest["format_version"] == FORMAT_VERSION == 3
