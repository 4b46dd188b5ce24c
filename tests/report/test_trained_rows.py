"""The attention tables hold a row set per checkpoint (``--revisions``); every statistic, health
check and figure of the report reads the trained rows only, and tables of runs made before
the ``checkpoint`` column read as before."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthlens.report.explorer import explorer_data
from depthlens.report.figures import SPECS, render_figure
from depthlens.report.health import numerical_health
from depthlens.report.statistics import STATISTICS, checkpoint_order, compute_statistic
from depthlens.runs.tables import RunTables
from depthlens.schema import trained_rows

from . import build_run, read_json, read_table, write_json, write_table

ATTENTION_TABLES = ("heads", "head_chunks", "depth")
pytestmark = pytest.mark.full_leg  # the full leg only: no thread count or kernel changes what it reads
#: The report's figures that read the attention tables.
FIGURES = ("pseudospectra", "transient_reserve", "depth_products", "criticality")


def _other_checkpoint(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of a revision with other numbers and roles: every float negated and shifted,
    the roles rotated."""
    other = table.assign(checkpoint="step1000", revision="step1000")
    for column in other.columns:
        if pd.api.types.is_float_dtype(other[column]):
            other[column] = 1.0 - 3.0 * other[column]
    if "role" in other.columns:
        other["role"] = other["role"].map({"routing": "sink", "sink": "other", "other": "routing"})
    return other


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A synthetic run and its copy whose attention tables also hold a revision's rows, first."""
    root = tmp_path_factory.mktemp("checkpoints")
    plain = build_run(root / "plain")
    mixed = root / "mixed"
    shutil.copytree(plain, mixed)
    for name in ATTENTION_TABLES:
        table = read_table(plain, name)
        write_table(mixed, name, pd.concat([_other_checkpoint(table), table], ignore_index=True))
    return plain, mixed


def _same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def test_statistics_read_the_trained_rows(runs: tuple[Path, Path]) -> None:
    plain, mixed = (RunTables(r) for r in runs)
    tested = 0
    for name, stat in STATISTICS.items():
        value = compute_statistic(name, plain)[0]
        assert _same(compute_statistic(name, mixed)[0], value), name
        for unit, count in stat.samples.items():
            assert count(mixed) == count(plain), (name, unit)
        tested += bool(set(stat.needs) & set(ATTENTION_TABLES)) and value is not None
    assert tested >= 10  # the attention statistics were computed, not skipped


def test_health_and_figures_read_the_trained_rows(runs: tuple[Path, Path], tmp_path: Path) -> None:
    plain, mixed = (RunTables(r) for r in runs)
    rows_failed = "rows no decomposition driver could compute"  # counts every row a table holds
    assert [c for c in numerical_health(mixed) if c.name != rows_failed] == \
        [c for c in numerical_health(plain) if c.name != rows_failed]
    for name in FIGURES:
        paths = [render_figure(SPECS[name], t, tmp_path / str(i))[0] for i, t in enumerate((plain, mixed))]
        assert paths[0].read_bytes() == paths[1].read_bytes(), name
    assert explorer_data(mixed) == explorer_data(plain)  # the head explorer's roles and Δ_TR


def test_tables_without_a_checkpoint_column_read_whole(runs: tuple[Path, Path]) -> None:
    plain, _ = runs
    heads = read_table(plain, "heads")
    old = heads.drop(columns="checkpoint")
    pd.testing.assert_frame_equal(trained_rows(old), old)
    mixed = pd.concat([_other_checkpoint(heads), heads], ignore_index=True)
    pd.testing.assert_frame_equal(trained_rows(mixed), heads)
    assert np.isfinite(RunTables(plain).trained("heads")["TR1"]).all() and RunTables(plain).trained("nothing") is None


def test_checkpoint_order_reads_the_revisions_of_either_layout(tmp_path: Path) -> None:
    """Revisions are a run option (the top of the manifest's config); runs made before kept
    them in the jacobian section."""
    run = build_run(tmp_path / "run", stages=())
    assert checkpoint_order(RunTables(run)) == ["init", "step1000", "trained"]
    manifest = read_json(run, "manifest")
    manifest["config"]["jacobian"] = {"revisions": manifest["config"].pop("revisions")}
    write_json(run, "manifest", manifest)
    assert checkpoint_order(RunTables(run)) == ["init", "step1000", "trained"]
