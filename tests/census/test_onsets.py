"""Formation and consolidation onsets, the paired lag test and the census claims on synthetic
series with a planted lag (supported), a reversed one (falsified) and none (inconclusive)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthlens.census.onsets import head_onsets, lag_test, sustained_onset
from depthlens.report import default_claims_path, evaluate, load_claims
from depthlens.report.statistics import compute_statistic
from depthlens.report.tables import RunTables

N_CKPT = 10
STEPS = [0, *np.unique(np.geomspace(1, 5000, N_CKPT - 1).astype(int))]


def _series(formation: list[int], consolidation: list[int], *, group: str = "previous-token",
            seed: int = 0) -> pd.DataFrame:
    """census_heads of one series: head h's role score crosses its threshold at checkpoint
    ``formation[h]`` and its Δ_TR turns significant (role sign) at ``consolidation[h]``; before,
    both sit well below (with noise that never crosses)."""
    rng = np.random.default_rng(seed)
    rows = []
    for h, (f, c) in enumerate(zip(formation, consolidation)):
        for k in range(N_CKPT):
            formed, cons = k >= f, k >= c
            score = 0.6 + 0.1 * rng.random() if formed else 0.2 * rng.random()
            sign = -1.0 if group == "sink" else 1.0
            rows.append({"series": "s", "checkpoint": f"step-{STEPS[k]}", "step": float(STEPS[k]), "order": k,
                         "layer": h // 4, "head": h % 4,
                         "prev_token_score": score if group == "previous-token" else 0.05,
                         "induction_score": score if group == "induction" else 0.02,
                         "sink_mass": score if group == "sink" else 0.1,
                         "delta_TR1": sign * (0.5 if cons else 0.01 * rng.standard_normal()),
                         "null_q": 0.001 if cons else 0.5 + 0.4 * rng.random()})
    return pd.DataFrame(rows)


def test_sustained_onset_ignores_crossings_later_undone() -> None:
    assert sustained_onset(np.array([True, True, True])) == 0
    assert sustained_onset(np.array([False, True, False, False, True, True])) == 4
    assert sustained_onset(np.array([True, True, False])) is None
    assert sustained_onset(np.array([], dtype=bool)) is None


def test_onsets_recover_planted_formation_and_consolidation_steps() -> None:
    formation = [1, 2, 3, 2, 4, 3, 2, 1]
    heads = _series(formation, [f + 3 for f in formation])
    onsets = head_onsets(heads)
    assert len(onsets) == 8 and set(onsets["group"]) == {"previous-token"}
    assert onsets["formation_order"].tolist() == [float(f) for f in formation]
    assert onsets["consolidation_step"].tolist() == [float(STEPS[f + 3]) for f in formation]
    assert (onsets["lag"] == 3).all()


@pytest.mark.parametrize("group", ["induction", "sink"])
def test_groups_use_their_own_score_and_sign(group: str) -> None:
    onsets = head_onsets(_series([2] * 6, [5] * 6, group=group))
    assert set(onsets["group"]) == {group} and (onsets["lag"] == 3).all()
    flipped = _series([2] * 6, [5] * 6, group=group)
    flipped["delta_TR1"] = -flipped["delta_TR1"]  # significant, but with the other role's sign
    assert head_onsets(flipped)["consolidation_order"].isna().all()


def test_lag_test_signs() -> None:
    n, median, p = lag_test(np.array([2.0, 1, 3, 1, 2, 2]))
    assert (n, median) == (6, 2.0) and math.isclose(p, 0.5**6)
    n, median, p = lag_test(np.array([-2.0, -1, -3, -1, -2, -2]))
    assert (n, median) == (6, -2.0) and math.isclose(p, 1.0)
    n, median, p = lag_test(np.array([0.0, np.nan]))
    assert n == 0 and math.isnan(median) and p == 1.0


def _run_with(tmp_path: Path, heads: pd.DataFrame) -> RunTables:
    (tmp_path / "tables").mkdir(parents=True)
    heads = heads.assign(model="m", revision="", text="t")
    heads.to_parquet(tmp_path / "tables" / "census_heads.parquet")
    return RunTables(tmp_path)


def _verdict(tables: RunTables) -> str:
    claim = next(c for c in load_claims(default_claims_path()) if c.id == "C1-consolidation-after-formation")
    return evaluate([claim], tables)[0]["verdict"]


def test_planted_lag_recovers_its_sign(tmp_path: Path) -> None:
    formation = [1, 2, 3, 2, 1, 2, 3, 1]
    later = _run_with(tmp_path / "later", _series(formation, [f + 2 for f in formation]))
    p, _ = compute_statistic("census_onset_lag_p", later)
    assert p == pytest.approx(0.5**8) and _verdict(later) == "supported"
    earlier = _run_with(tmp_path / "earlier", _series([f + 3 for f in formation], formation))
    p, _ = compute_statistic("census_onset_lag_p", earlier)
    assert p == pytest.approx(1.0) and _verdict(earlier) == "falsified"


def test_no_lag_is_inconclusive(tmp_path: Path) -> None:
    same = _run_with(tmp_path / "same", _series([2] * 8, [2] * 8))
    value, why = compute_statistic("census_onset_lag_p", same)
    assert math.isnan(value) and "non-zero lag" in why and _verdict(same) == "inconclusive"
    rng = np.random.default_rng(3)
    formation = rng.integers(1, 5, size=12).tolist()
    mixed = [f + int(d) for f, d in zip(formation, rng.permutation([-1, 1] * 6))]  # half before, half after
    balanced = _run_with(tmp_path / "balanced", _series(formation, mixed))
    p, _ = compute_statistic("census_onset_lag_p", balanced)
    assert 0.05 < p < 0.95 and _verdict(balanced) == "inconclusive"
