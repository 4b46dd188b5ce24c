"""Atomic writes: file modes follow the umask; writes inside a run are indexed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from depthlens.runs import atomic


@pytest.fixture
def umask() -> Iterator[None]:
    """Restore the process umask after a test that changes it."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield
    os.umask(saved)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_modes_follow_the_umask(tmp_path: Path, umask: None, mask: int) -> None:
    os.umask(mask)
    atomic.write_bytes(tmp_path / "a.bin", b"x")
    atomic.write_json(tmp_path / "b.json", {"k": 1})
    atomic.write_parquet(tmp_path / "c.parquet", pd.DataFrame({"x": [1]}))
    for name in ("a.bin", "b.json", "c.parquet"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name
    assert atomic.current_umask() == mask and os.umask(mask) == mask  # reading it changed nothing


def test_writes_outside_a_run_are_not_indexed(tmp_path: Path) -> None:
    atomic.write_bytes(tmp_path / "deep" / "er" / "f.txt", b"x")
    assert atomic.run_root(tmp_path / "deep" / "er" / "f.txt") is None
    assert not list(tmp_path.rglob(atomic.INDEX))


def test_writes_inside_a_run_are_indexed_once_each(tmp_path: Path) -> None:
    atomic.start_index(tmp_path)
    atomic.write_bytes(tmp_path / "report.html", b"<html>")
    atomic.write_bytes(tmp_path / "units" / "capture" / "u0.done", b"[]")
    atomic.write_bytes(tmp_path / "report.html", b"<html>2")
    (tmp_path / atomic.INDEX).open("a").write("tables/torn")  # a line cut short by a kill
    assert atomic.read_index(tmp_path) == ["report.html", "units/capture/u0.done"]
    assert stat.S_IMODE((tmp_path / atomic.INDEX).stat().st_mode) == 0o666 & ~atomic.current_umask()
