"""Formation and consolidation onsets (least-squares steps), the layer lag test and the census
claims on synthetic series with a planted lag (supported), a reversed one (falsified) and none
(inconclusive)."""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthlens.report.onsets import head_onsets, layer_lag_test, step_onset
from depthlens.report import default_claims_path, evaluate, load_claims
from depthlens.report.statistics import compute_statistic
from depthlens.runs.tables import RunTables

N_CKPT = 10
STEPS = [0, *np.unique(np.geomspace(1, 5000, N_CKPT - 1).astype(int))]


def _series(formation: list[int], consolidation: list[int], *, group: str = "previous-token",
            seed: int = 0, per_layer: int = 2) -> pd.DataFrame:
    """census_heads of one series: head h (in layer h // per_layer) has its role score step up
    at checkpoint ``formation[h]`` and its Δ_TR (role sign) at ``consolidation[h]``; the noise
    on both is far smaller than the steps."""
    rng = np.random.default_rng(seed)
    rows = []
    for h, (f, c) in enumerate(zip(formation, consolidation)):
        for k in range(N_CKPT):
            formed, cons = k >= f, k >= c
            score = 0.6 + 0.1 * rng.random() if formed else 0.2 * rng.random()
            sign = -1.0 if group == "sink" else 1.0
            rows.append({"series": "s", "checkpoint": f"step-{STEPS[k]}", "step": float(STEPS[k]), "order": k,
                         "layer": h // per_layer, "head": h % per_layer,
                         "prev_token_score": score if group == "previous-token" else 0.05,
                         "induction_score": score if group == "induction" else 0.02,
                         "sink_mass": score if group == "sink" else 0.1,
                         "delta_TR1": sign * (0.5 if cons else 0.01 * rng.standard_normal()),
                         "null_q": 0.001 if cons else 0.5 + 0.4 * rng.random()})
    return pd.DataFrame(rows)


def _brute_step(x: np.ndarray) -> int | None:
    """The least-squares single change point by trying every split (the reference)."""
    sse = [((x[:k] - x[:k].mean()) ** 2).sum() + ((x[k:] - x[k:].mean()) ** 2).sum() for k in range(1, x.size)]
    k = int(np.argmin(sse)) + 1
    return k if x[k:].mean() > x[:k].mean() else None


def test_step_onset_matches_brute_force_least_squares() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        x = rng.standard_normal(int(rng.integers(2, 12)))
        x = x + np.where(np.arange(x.size) >= rng.integers(0, x.size), rng.normal(0, 2), 0.0)
        assert step_onset(x) == _brute_step(x)
    assert step_onset(np.array([1.0, 1.0])) is None and step_onset(np.array([0.5])) is None
    assert step_onset(np.array([0.0, np.nan, 1.0, 1.0])) == 1  # counts the finite entries


def test_the_step_rule_is_biased_and_the_calibrated_lag_is_not() -> None:
    """A common true onset (early in the series) with a noisier reserve: the raw lags of the step
    rule lean positive; minus their expected value under the same rule they are centred."""
    rng = np.random.default_rng(2)
    rows = []
    for h in range(300):
        k, onset = np.arange(10), int(rng.integers(2, 5))
        rows.append(pd.DataFrame({"order": k, "step": 2.0**k, "layer": h, "head": 0, "induction_score": 0.0,
                                  "prev_token_score": 0.1 + 0.6 * (k >= onset) + 0.05 * rng.standard_normal(10),
                                  "sink_mass": 0.1, "delta_TR1": 0.4 * (k >= onset) + 0.2 * rng.standard_normal(10)}))
    onsets = head_onsets(pd.concat(rows, ignore_index=True)).dropna(subset=["lag"])
    raw = np.sign(onsets["lag"])
    assert (raw > 0).mean() - (raw < 0).mean() > 0.05  # the rule alone leans towards consolidation later
    n, _, p = layer_lag_test(onsets)  # one head per layer: 291 layers
    assert n > 250 and 0.05 < p < 0.95


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


def _flip_p(means: np.ndarray) -> float:
    """The one-sided sign-flip p-value by brute force over every sign pattern."""
    means = np.asarray(means, dtype=float)
    patterns = [np.mean(np.array(signs) * np.abs(means)) for signs in itertools.product((-1.0, 1.0), repeat=means.size)]
    return float(np.mean([m >= means.mean() - 1e-9 for m in patterns]))


def test_layer_lag_test_counts_layers_not_heads() -> None:
    null = np.zeros(200)  # the rule gives lag 0 whenever the true lag is 0
    onsets = pd.DataFrame({"layer": [0] * 10 + [1, 2], "head": list(range(10)) + [0, 0],
                           "lag": [3.0] * 10 + [1.0, -1.0], "expected_lag": 0.0, "null_lags": [null] * 12})
    n, median, p = layer_lag_test(onsets)
    means = np.array([0.5, 0.5, -0.5])  # per layer: every head above (u = 1) or below (u = 0) its null
    assert n == 3 and median == 1.0 and math.isclose(p, _flip_p(means)) and p == 0.5  # 3 layers, not 12 heads


def _run_with(tmp_path: Path, heads: pd.DataFrame) -> RunTables:
    (tmp_path / "tables").mkdir(parents=True)
    heads = heads.assign(model="m", revision="", text="t")
    heads.to_parquet(tmp_path / "tables" / "census_heads.parquet")
    return RunTables(tmp_path)


def _verdict(tables: RunTables) -> str:
    claim = next(c for c in load_claims(default_claims_path()) if c.id == "C1-consolidation-after-formation")
    return evaluate([claim], tables)[0]["verdict"]


def test_planted_lag_recovers_its_sign(tmp_path: Path) -> None:
    formation = [1, 2, 3, 2, 1, 2, 3, 1, 2, 3, 1, 2]
    later = _run_with(tmp_path / "later", _series(formation, [f + 2 for f in formation]))
    p, _ = compute_statistic("census_onset_lag_p", later)
    assert p == 2.0 ** -6 and _verdict(later) == "supported"  # 6 layers of 2 heads, each above its null: exact floor
    earlier = _run_with(tmp_path / "earlier", _series([f + 3 for f in formation], formation))
    p, _ = compute_statistic("census_onset_lag_p", earlier)
    assert p > 0.999 and _verdict(earlier) == "falsified"


def test_no_lag_is_inconclusive(tmp_path: Path) -> None:
    same = _run_with(tmp_path / "same", _series([2] * 12, [2] * 12))
    value, _ = compute_statistic("census_onset_lag_p", same)  # every layer's lag is its null's: u uniform
    assert 0.05 < value < 0.95 and _verdict(same) == "inconclusive"
    rng = np.random.default_rng(3)
    formation = rng.integers(1, 5, size=12).tolist()
    mixed = [f + int(d) for f, d in zip(formation, rng.permutation([-1, 1] * 6))]  # half before, half after
    balanced = _run_with(tmp_path / "balanced", _series(formation, mixed))
    p, _ = compute_statistic("census_onset_lag_p", balanced)
    assert 0.05 < p < 0.95 and _verdict(balanced) == "inconclusive"


def _replicated(n: int, formation: list[int], lag: int) -> pd.DataFrame:
    """``n`` replicate series of :func:`_series` (other noise seeds), ``replicate`` 0 … n − 1."""
    return pd.concat([_series(formation, [f + lag for f in formation], seed=r).assign(series=f"s{r}", replicate=r)
                      for r in range(n)], ignore_index=True)


def test_replicates_are_further_layers_and_keep_the_first_series_draws() -> None:
    formation = [1, 2, 3, 2]  # two layers of two heads
    pooled = head_onsets(_replicated(3, formation, 2))
    assert pooled.groupby("replicate").size().tolist() == [4, 4, 4]
    alone = head_onsets(_series(formation, [f + 2 for f in formation]))  # no replicate column: replicate 0
    first = pooled[pooled["replicate"] == 0].reset_index(drop=True)
    for a, b in zip(alone["null_lags"], first["null_lags"]):
        np.testing.assert_array_equal(a, b)  # a single series draws as before replicates existed
    other = pooled[pooled["replicate"] == 1].reset_index(drop=True)
    assert not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first["null_lags"], other["null_lags"]))
    n, _, p = layer_lag_test(pooled)
    m = _reference_layer_means(pooled, seed=0)  # the reference: the t-test over the (replicate, layer) means
    assert n == 6 == m.size and math.isclose(p, _flip_p(m))


def _reference_layer_means(onsets: pd.DataFrame, seed: int) -> np.ndarray:
    """Per (replicate, layer), the mean of its heads' ``u − ½``, with the ``V`` of the heads in
    (replicate, layer, head) order drawn from the sha256 of their packed values (struct)."""
    rows = sorted(onsets.itertuples(index=False), key=lambda row: (row.replicate, row.layer, row.head))
    digest = hashlib.sha256()
    for row in rows:
        null = row.null_lags[np.isfinite(row.null_lags)]
        digest.update(struct.pack("<5d", row.replicate, row.layer, row.head, row.lag, null.size))
        digest.update(struct.pack(f"<{null.size}d", *null))
    key = int.from_bytes(digest.digest(), "little")
    v = np.random.default_rng(np.random.SeedSequence([key, seed])).random(len(rows))
    u: dict[tuple[int, int], list[float]] = {}
    for row, w in zip(rows, v):
        null = row.null_lags[np.isfinite(row.null_lags)]
        below, tied = np.mean(null < row.lag - 1e-9), np.mean(np.abs(null - row.lag) <= 1e-9)
        u.setdefault((row.replicate, row.layer), []).append(below + w * tied - 0.5)
    return np.array([np.mean(u[k]) for k in sorted(u)])


def test_the_tie_breaking_uniforms_follow_the_data_and_the_seed() -> None:
    """Every lag equal to every null draw: each ``u`` is its ``V``, so ``p`` reads the ``V``
    alone. The same table gives the same ``p``, in any row order; a table that differs in one
    lag, or another seed, draws other ``V``."""
    rows = 8 * 3
    onsets = pd.DataFrame({"replicate": 0, "layer": np.arange(rows) // 3, "head": np.arange(rows) % 3,
                           "lag": 0.0, "expected_lag": 0.0, "null_lags": [np.zeros(50)] * rows})
    n, _, p = layer_lag_test(onsets)
    m = _reference_layer_means(onsets, seed=0)
    assert n == 8 and math.isclose(p, _flip_p(m))
    assert layer_lag_test(onsets.iloc[::-1])[2] == p
    other = onsets.assign(lag=[0.0] * (rows - 1) + [1.0])  # one head's lag differs: u = 1 there
    m_other = _reference_layer_means(other, seed=0)
    assert np.all(m_other[:-1] != m[:-1])  # the other layers draw other V too
    assert math.isclose(layer_lag_test(other)[2], _flip_p(m_other))
    m_seed = _reference_layer_means(onsets, seed=1)
    assert np.all(m_seed != m)
    assert math.isclose(layer_lag_test(onsets, seed=1)[2],
                        _flip_p(m_seed))


@pytest.mark.full_leg  # the full leg only: a calibration of 400 draws, which no thread count or kernel changes
def test_no_lag_at_twenty_layers_is_rarely_supported() -> None:
    """C1's false-support rate at a true lag of 0 (the calibration scenario's null world, 20
    layers of 4 heads, through the claim's own judgement) is at most 0.05 over 400 draws: the
    tie-breaking ``V`` of the many heads whose lag equals most of their null draws is drawn
    anew for every data set."""
    from depthlens.report.calibration import SCENARIOS
    from depthlens.report.claims import judge

    claim = next(c for c in load_claims(default_claims_path()) if c.id == "C1-consolidation-after-formation")
    found = SCENARIOS[claim.statistic]
    sizes = {**found.default, "paired_layers": 20}
    worlds = (found.simulate(np.random.default_rng(np.random.SeedSequence([63, i])), sizes, False) for i in range(400))
    verdicts = [judge(claim, tables).verdict for tables in worlds]
    assert verdicts.count("supported") / 400 <= 0.05


def test_the_census_claim_pools_replicates_and_not_compared_series(tmp_path: Path) -> None:
    formation = [1, 2, 3, 2]  # two layers a series: below C1's minimum of 5 alone
    one = _run_with(tmp_path / "one", _replicated(1, formation, 2))
    assert _verdict(one) == "inconclusive"
    three = _replicated(3, formation, 2)
    pooled = _run_with(tmp_path / "three", three)
    p, _ = compute_statistic("census_onset_lag_p", pooled)
    assert p == 2.0 ** -6 and _verdict(pooled) == "supported"  # 3 replicates of 2 layers
    compared = three.assign(replicate=three["replicate"].where(three["replicate"] == 0, -1))
    assert _verdict(_run_with(tmp_path / "compared", compared)) == "inconclusive"  # --compare series: not pooled


def test_coupling_counts_are_summed_over_replicates(tmp_path: Path) -> None:
    from depthlens.report.statistics import STATISTICS
    from depthlens.stats import trend_interval

    rng = np.random.default_rng(5)
    significant = rng.integers(0, 5, size=(3, 6)).astype(float)  # replicate × checkpoint
    rows = [{"series": f"s{r}", "replicate": r, "order": k, "status": "done", "funnel_step0_over": np.nan,
             "erank_full_depth": np.nan, "coupling_significant": significant[r, k], "coupling_tested": 8.0}
            for r in range(3) for k in range(6)]
    rows[3]["status"] = "failed"  # replicate 0's fourth checkpoint: that checkpoint leaves the trend
    rows += [{**row, "series": "other", "replicate": -1, "coupling_significant": 8.0 - row["coupling_significant"]}
             for row in rows[:6]]  # a --compare series: not pooled
    (tmp_path / "tables").mkdir()
    pd.DataFrame(rows).assign(model="m", revision="", text="t").to_parquet(tmp_path / "tables" / "census.parquet")
    tables = RunTables(tmp_path)
    keep = [0, 1, 2, 4, 5]
    rho, lo, hi = trend_interval(significant.sum(axis=0)[keep], np.full(5, 24))
    stat = STATISTICS["census_coupling_trend"]
    estimate = stat.func(tables)
    assert (estimate.value, estimate.lo, estimate.hi) == (rho, lo, hi)
    assert stat.samples["boundaries"](tables) == 24 and stat.samples["checkpoints"](tables) == 5


def test_sign_flip_p_draws_patterns_above_the_exact_limit() -> None:
    """Above EXACT_FLIPS units the drawn patterns estimate the exact p (all 2^17 patterns here)."""
    from depthlens.report.onsets import EXACT_FLIPS, FLIP_DRAWS, sign_flip_p

    means = np.random.default_rng(4).normal(0.05, 0.2, EXACT_FLIPS + 1)
    n = means.size
    signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    exact = float(np.mean(signs @ np.abs(means) / n >= means.mean() - 1e-12))
    drawn = sign_flip_p(means, np.random.SeedSequence(1))
    assert abs(drawn - exact) <= 4.0 * math.sqrt(exact * (1 - exact) / FLIP_DRAWS) + 1.0 / FLIP_DRAWS
    assert 0.0 < exact < 1.0
