"""The funnel claims' intervals (B2, B3, C2) from the chunk bootstrap (``funnel_boot``): each
against a percentile computed here by hand, the pairing of replicates between checkpoints and
step-0 seeds, the census table's interval, and what a run without replicates gets."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthlens.report.census_tables import census_tables, run_points
from depthlens.report.claims import judge, load_claims
from depthlens.report.statistics import compute_estimate
from depthlens.runs.tables import RunTables

from . import build_run, read_table, write_funnel_boot, write_table


def percentile(values: np.ndarray, q: float) -> float:
    """The q-quantile with linear interpolation between order statistics, written out."""
    x = sorted(float(v) for v in values)
    h = (len(x) - 1) * q
    lower = math.floor(h)
    return x[lower] + (h - lower) * (x[min(lower + 1, len(x) - 1)] - x[lower])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_run(tmp_path_factory.mktemp("funnel") / "run", stages=("jacobian",))
    boot = read_table(root, "funnel_boot")  # give every replicate its own spread, seeds their own
    rng = np.random.default_rng(4)
    resampled = boot["replicate"] > 0
    boot.loc[resampled, "erank_one_step"] *= np.exp(0.02 * rng.standard_normal(int(resampled.sum())))
    boot.loc[resampled, "erank_full_depth"] *= np.exp(0.2 * rng.standard_normal(int(resampled.sum())))
    write_table(root, "funnel_boot", boot)
    return root


def _rows(run: Path, checkpoint: str, seed: float | None = None) -> pd.DataFrame:
    boot = read_table(run, "funnel_boot")
    rows = boot[(boot["checkpoint"] == checkpoint) & (boot["replicate"] >= 1) & (boot["truncation"] == 64)]
    return rows if seed is None else rows[rows["init_seed"] == seed]


def test_b2_interval_is_the_percentile_interval_of_the_replicate_ratios(run: Path) -> None:
    got, _ = compute_estimate("funnel_ratio_trained", RunTables(run))
    rows = _rows(run, "trained")
    ratios = (rows["erank_full_depth"] / rows["erank_one_step"]).to_numpy()
    assert len(ratios) == 50 and got.kind == "confidence"
    assert got.value == pytest.approx(2.0 / 100.0)  # the point is the cumulative curve's
    assert got.lo == pytest.approx(percentile(ratios, 0.025), rel=1e-12)
    assert got.hi == pytest.approx(percentile(ratios, 0.975), rel=1e-12)
    init, _ = compute_estimate("funnel_ratio_init", RunTables(run))  # the run seed's null only
    own = _rows(run, "init", 0.0)
    own_ratios = (own["erank_full_depth"] / own["erank_one_step"]).to_numpy()
    assert (init.lo, init.hi) == pytest.approx((percentile(own_ratios, 0.025), percentile(own_ratios, 0.975)))


def test_b3_interval_pairs_every_seed_with_the_trained_replicate_of_the_same_chunks(run: Path) -> None:
    got, _ = compute_estimate("funnel_init_over_trained", RunTables(run))
    trained = _rows(run, "trained").set_index("replicate")["erank_full_depth"]
    ratios = [row.erank_full_depth / trained[row.replicate] for row in _rows(run, "init").itertuples()]
    assert len(ratios) == 3 * 50
    assert got.value == pytest.approx(60.0 / 2.0)
    assert (got.lo, got.hi) == pytest.approx((percentile(ratios, 0.025), percentile(ratios, 0.975)), rel=1e-12)
    assert judge(next(c for c in load_claims() if c.id == "B3-funnel-learned"), RunTables(run)).verdict == "supported"


def test_no_replicates_no_decisive_verdict(tmp_path: Path) -> None:
    """Without funnel_boot (--funnel-boot 0), or with fewer than 40 replicates, the interval
    is unbounded: the value stays, the verdict cannot be decisive. B3 with one step-0 seed is
    underpowered (min_init_seeds = 3)."""
    root = build_run(tmp_path / "run", stages=("jacobian",))
    claims = {c.id: c for c in load_claims()}
    write_funnel_boot(root, replicates=39)
    got, _ = compute_estimate("funnel_ratio_trained", RunTables(root))
    assert got.value == pytest.approx(0.02) and (got.lo, got.hi) == (-math.inf, math.inf)
    assert judge(claims["B2-funnel-trained"], RunTables(root)).verdict == "inconclusive"
    write_funnel_boot(root, seeds=1)
    b3 = judge(claims["B3-funnel-learned"], RunTables(root))
    assert b3.verdict == "inconclusive" and b3.underpowered and b3.sample["init_seeds"] == 1
    (root / "tables" / "funnel_boot.parquet").unlink()
    got, _ = compute_estimate("funnel_init_over_trained", RunTables(root))
    assert got.value == pytest.approx(30.0) and (got.lo, got.hi) == (-math.inf, math.inf)


def test_census_interval_pairs_the_reference_with_each_checkpoint(run: Path) -> None:
    """A run's checkpoints as a census series (step 0 = its init null): the trained row's
    interval is B3's, the reference's own row is exactly 1, and C2 reads the last row."""
    tables = census_tables(run_points(RunTables(run)), "synthetic")["census"].set_index("checkpoint")
    b3, _ = compute_estimate("funnel_init_over_trained", RunTables(run))
    assert tables.loc["trained", "funnel_step0_over"] == pytest.approx(b3.value)
    assert (tables.loc["trained", "funnel_step0_over_lo"], tables.loc["trained", "funnel_step0_over_hi"]) == \
        pytest.approx((b3.lo, b3.hi), rel=1e-12)
    assert (tables.loc["init", "funnel_step0_over_lo"], tables.loc["init", "funnel_step0_over_hi"]) == (1.0, 1.0)
    census = build_run(run.parent / "census", stages=("census",))
    got, _ = compute_estimate("census_funnel_learned", RunTables(census))
    rows = read_table(census, "census")
    last = rows[rows["series"] == rows["series"].iloc[0]].sort_values("order").iloc[-1]
    assert (got.value, got.lo, got.hi) == (last["funnel_step0_over"], last["funnel_step0_over_lo"],
                                           last["funnel_step0_over_hi"])
    write_table(census, "census", rows.drop(columns=["funnel_step0_over_lo", "funnel_step0_over_hi"]))
    got, _ = compute_estimate("census_funnel_learned", RunTables(census))
    assert got.value == last["funnel_step0_over"] and (got.lo, got.hi) == (-math.inf, math.inf)
