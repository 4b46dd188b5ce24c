"""Aggregation and summary of the attention stage on synthetic tables, against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from depthlens.attention.analysis import aggregate_heads, summarise
from depthlens.stats import EXCESS_ZERO, aggregate_induction, induction_ratio_replicates


def _depth() -> pd.DataFrame:
    """A one-chunk depth table: the model and two null samples at depths 1 and 2."""
    rows = [{"operator": "mean", "chunk": 0, "source": src, "sample": s, "depth": d,
             "gap_e1": float(d + s), "gap_e2": float(d - s)}
            for src, s in (("model", -1), ("null", 0), ("null", 1)) for d in (1, 2)]
    return pd.DataFrame(rows)


def _heads() -> pd.DataFrame:
    """Four sink, three routing and two other heads with chosen excesses, q-values and
    induction excesses (NaN q: no null comparison)."""
    nan = math.nan
    rows = [  # role, delta_TR1, null_q, first copy, second copy, control
        ("sink", -0.3, 0.01, nan, nan, nan),    # negative and significant
        ("sink", -0.2, 0.20, nan, nan, nan),    # negative, not significant
        ("sink", 0.4, 0.01, nan, nan, nan),     # significant, positive
        ("sink", -0.1, nan, nan, nan, nan),     # negative, no q-value
        ("routing", 0.5, 0.04, 0.25, 0.5, 0.2),   # both ratios defined: 2 and 2.5
        ("routing", 0.6, 0.06, -0.1, 0.3, 1e-15),  # first ≤ 0, control zero to rounding
        ("routing", -0.7, 0.01, 0.1, 0.4, -0.3),  # negative significant, control ≤ 0
        ("other", -0.9, 0.001, nan, nan, nan),
        ("other", 0.9, 0.001, nan, nan, nan),
    ]
    table = pd.DataFrame(rows, columns=["role", "delta_TR1", "null_q", "delta_TR1_first_copy",
                                        "delta_TR1_second_copy", "delta_TR1_control"])
    table.insert(0, "layer", np.arange(len(table)) // 3)
    table.insert(1, "head", np.arange(len(table)) % 3)
    table["kreiss_A_flagged"] = 0
    second = table["delta_TR1_second_copy"]
    table["induction_ratio"] = np.where(table["delta_TR1_first_copy"] > EXCESS_ZERO, second / table["delta_TR1_first_copy"], nan)
    table["induction_ratio_control"] = np.where(table["delta_TR1_control"] > EXCESS_ZERO, second / table["delta_TR1_control"], nan)
    return table


def test_summary_fractions_and_induction_counts_by_hand() -> None:
    summary = summarise(_heads(), _depth(), q_level=0.05)
    assert summary["sink_negative_significant"] == 1 / 4  # only the first sink head
    assert summary["sink_negative"] == 3 / 4
    assert summary["routing_positive_significant"] == 1 / 3  # the first routing head (q 0.04)
    assert summary["roles"] == {"sink": 4, "routing": 3, "other": 2}
    assert summary["induction_routing_heads"] == 3
    assert summary["induction_excluded_first"] == 1  # Δ_first = −0.1
    assert summary["induction_excluded_control"] == 2  # Δ_control = 1e-15 and −0.3
    assert summary["induction_ratio_median"] == pytest.approx(np.median([0.5 / 0.25, 0.4 / 0.1]))
    assert summary["induction_ratio_control_median"] == pytest.approx(0.5 / 0.2)
    final = summary["eig_gap_final_depth"]["mean"]
    assert final["model"] == {"median_gap_e1": 1.0, "median_gap_e2": 3.0}
    assert final["null"] == {"median_gap_e1": 2.5, "median_gap_e2": 1.5}


def test_summary_without_sink_or_routing_heads() -> None:
    heads = _heads()
    heads["role"] = "other"
    summary = summarise(heads, _depth())
    assert summary["sink_negative_significant"] is None and summary["routing_positive_significant"] is None
    assert summary["induction_routing_heads"] == summary["induction_excluded_first"] == 0
    assert summary["induction_ratio_median"] is None and summary["induction_ratio_control_median"] is None


def test_aggregate_induction_by_hand() -> None:
    """Medians over sequences (a failed sequence's NaNs skipped), then the ratios where the
    denominator exceeds :data:`EXCESS_ZERO`."""
    nan = math.nan
    rows = pd.DataFrame(
        [(0, 1, 0, 0.2, 0.5, 0.1), (0, 1, 1, 0.4, 0.7, 0.3), (0, 1, 2, nan, nan, nan),
         (1, 0, 0, -0.2, 0.1, 1e-12), (1, 0, 1, 0.0, 0.3, -1e-12)],
        columns=["layer", "head", "seq", "delta_TR1_first_copy", "delta_TR1_second_copy", "delta_TR1_control"])
    out = aggregate_induction(rows).set_index(["layer", "head"])
    np.testing.assert_allclose(out.loc[(0, 1), ["delta_TR1_first_copy", "delta_TR1_second_copy", "delta_TR1_control"]]
                               .to_numpy(dtype=float), [0.3, 0.6, 0.2], rtol=1e-15)
    assert out.loc[(0, 1), "induction_ratio"] == pytest.approx(0.6 / 0.3, rel=1e-15)
    assert out.loc[(0, 1), "induction_ratio_control"] == pytest.approx(0.6 / 0.2, rel=1e-15)
    assert math.isnan(out.loc[(1, 0), "induction_ratio"]) and math.isnan(out.loc[(1, 0), "induction_ratio_control"])


def test_plain_median_recorded_per_head() -> None:
    """A scale quantity with a value ≤ 0 falls back to the plain median and is listed; others
    take the median of logs (the geometric mean of the middle pair for two chunks)."""
    chunks = pd.DataFrame({
        "layer": [0, 0, 0, 0, 0, 0], "head": [0, 0, 1, 1, 2, 2], "chunk": [0, 1, 0, 1, 0, 1],
        "extras": [True, False] * 3,
        "kreiss_A_ok": [1.0] * 6,
        "norm_B": [1.0, 4.0, 0.0, 4.0, 2.0, 8.0],
        "peak_B": [1.0, 9.0, 1.0, 9.0, 0.0, 0.0],
        "henrici_B_rel": [0.0, 0.5, 0.0, 0.5, 0.0, 0.5],  # not a scale quantity
        "num_radius_B": [0.0, math.nan, 2.0, math.nan, -1.0, math.nan],  # NaN: not computed
    })
    out = aggregate_heads(chunks).set_index("head")
    assert out["plain_median"].tolist() == ["num_radius_B", "norm_B", "peak_B,num_radius_B"]
    np.testing.assert_allclose(out["norm_B"], [2.0, 2.0, 4.0], rtol=1e-15)  # √(1·4), (0+4)/2, √(2·8)
    np.testing.assert_allclose(out["peak_B"], [3.0, 3.0, 0.0], rtol=1e-15)
    np.testing.assert_allclose(out["num_radius_B"], [0.0, 2.0, -1.0])
    np.testing.assert_allclose(out["henrici_B_rel"], [0.25] * 3)


def test_induction_ratio_replicates_redraw_sequences_and_heads(rng) -> None:
    """Each replicate equals aggregate_induction on the redrawn rows (the same sequence draw for
    every head, heads drawn with replacement) and the median over heads of its defined control
    ratios: recomputed here replicate by replicate with the generator's own draws."""
    nan = math.nan
    heads, seqs = 5, 6
    rows = pd.DataFrame({"layer": np.repeat(np.arange(heads) // 2, seqs), "head": np.repeat(np.arange(heads) % 2, seqs),
                         "seq": np.tile(np.arange(seqs), heads),
                         "delta_TR1_first_copy": rng.normal(0.2, 0.05, heads * seqs),
                         "delta_TR1_second_copy": rng.normal(0.3, 0.1, heads * seqs),
                         "delta_TR1_control": rng.normal(0.05, 0.1, heads * seqs)})  # some controls ≤ 0
    rows.loc[7, list(rows.columns[3:])] = nan  # a failed sequence
    draws = 30
    got = induction_ratio_replicates(rows, draws=draws, seed=3)
    replay = np.random.default_rng(3)
    at_seqs, at_heads = replay.integers(0, seqs, (draws, seqs)), replay.integers(0, heads, (draws, heads))
    keys = rows[["layer", "head"]].drop_duplicates().to_numpy()
    for b in range(draws):
        per_head = []
        for h in at_heads[b]:
            layer, head = keys[h]
            one = rows[(rows["layer"] == layer) & (rows["head"] == head)].set_index("seq").loc[at_seqs[b]]
            ratio = aggregate_induction(one.reset_index())["induction_ratio_control"].iloc[0]
            per_head.append(ratio)
        want = np.nanmedian(per_head) if np.isfinite(per_head).any() else nan
        np.testing.assert_allclose(got[b], want, rtol=1e-14)
    assert np.isfinite(got).sum() > draws // 2  # a test that sees defined ratios


def test_a4_interval_is_the_bootstrap_over_sequences_and_heads(rng) -> None:
    """The claim's statistic: the heads table's median with the percentile interval of the
    replicates; without induction_seqs, the distribution-free interval over heads."""
    from depthlens.report.calibration import MemoryTables
    from depthlens.report.statistics import compute_estimate
    from depthlens.stats import median_interval, percentile_interval

    heads, seqs = 8, 10
    rows = pd.DataFrame({"layer": np.repeat(np.arange(heads), seqs), "head": 0, "seq": np.tile(np.arange(seqs), heads),
                         "delta_TR1_first_copy": rng.normal(0.2, 0.02, heads * seqs),
                         "delta_TR1_second_copy": rng.normal(0.4, 0.02, heads * seqs),
                         "delta_TR1_control": rng.normal(0.2, 0.02, heads * seqs)})
    table = aggregate_induction(rows).assign(role="routing")
    estimate, _ = compute_estimate("induction_ratio_control_median",
                                   MemoryTables({"heads": table, "induction_seqs": rows}))
    assert estimate.value == pytest.approx(float(np.median(table["induction_ratio_control"])), rel=1e-15)
    assert (estimate.lo, estimate.hi) == percentile_interval(induction_ratio_replicates(rows))
    assert 1.6 < estimate.lo < estimate.value < estimate.hi < 2.4
    alone, _ = compute_estimate("induction_ratio_control_median", MemoryTables({"heads": table}))
    assert (alone.lo, alone.hi) == median_interval(table["induction_ratio_control"].to_numpy())
