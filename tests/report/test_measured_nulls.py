"""The measured null worlds (:mod:`depthlens.report.measured_nulls`): the reduction of a run's
null checkpoints, and every planted world against the package's measurements."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from depthlens.report import measured_nulls as mn
from depthlens.report.calibration import SCENARIOS
from depthlens.runs.tables import RunTables

from . import build_run

# The full leg only: simulated worlds against measured tables, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg


def test_every_measured_input_is_a_statistic_with_a_scenario():
    assert mn.measured(), "the package ships measured null inputs"
    for statistic, named in mn.measured().items():
        assert statistic in mn.INPUTS and statistic in SCENARIOS
        for name, m in named.items():
            values = np.asarray(m["values"])
            assert 0 < len(values) <= min(m["n"], mn.KEEP)
            assert values.min() >= m["mean"] - 10 * m["sd"] - 1e-9 and values.max() <= m["mean"] + 10 * m["sd"] + 1e-9


@pytest.mark.parametrize("statistic", sorted(mn.INPUTS))
def test_the_planted_world_matches_the_measured_one(statistic):
    """Each measured input of a claim's null world (its effect world where a random init is the
    claim's effect, B6) against the same input of the planted world over 20 draws: means within
    a quarter standard deviation plus three standard errors, spreads within a factor of 2
    (:func:`~depthlens.report.measured_nulls.matches`). A world that fails must resample the
    measurements instead of planting parameters."""
    table = mn.compare(statistic, draws=20)
    if table.empty:
        pytest.skip(f"nothing measured for {statistic} in the package's measured_nulls.json")
    mismatched = table.loc[~table["matches"], ["input", "world_mean", "world_sd", "measured_mean", "measured_sd"]]
    assert mismatched.empty, mismatched.to_string()


def test_measure_pools_the_null_checkpoints_of_random_runs(tmp_path: Path):
    """A run of a random model counts every checkpoint as a null; a trained model's only ``init``;
    the reduction's mean and spread are those of the extractor's values."""
    random_run = build_run(tmp_path / "random", model="random:llama")
    trained_run = build_run(tmp_path / "trained")
    assert mn._null_checkpoints(RunTables(random_run).manifest) == ["trained", "init"]
    assert mn._null_checkpoints(RunTables(trained_run).manifest) == ["init"]
    result = mn.measure([random_run])

    for statistic, named in result["inputs"].items():
        direct = mn.INPUTS[statistic][0](RunTables(random_run), ["trained", "init"])
        for name, m in named.items():
            values = np.asarray(direct[name], dtype=float)
            values = values[np.isfinite(values)]
            assert m["n"] == len(values)
            assert np.isclose(m["mean"], values.mean()) and np.isclose(m["sd"], values.std(ddof=1) if len(values) > 1 else 0)
    assert result["runs"][0]["model"] == "random:llama"
    out = tmp_path / "measured.json"
    assert mn.main([str(random_run), str(trained_run), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["inputs"]
