"""The calibration harness: every claim with a scenario keeps both error rates at most 0.05 at
the default sizes; the harness can fail (a claim that passes by construction is caught); the
in-memory tables read as a run directory does; a run's report carries the calibration at its
own sample size and turns a decisive verdict underpowered where the calibration fails."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from depthlens.report.calibration import ACCEPT, SCENARIOS, calibrate, calibration_at
from depthlens.report.claims import evaluate, judge, load_claims, write_claims_json
from depthlens.report.statistics import compute_estimate
from depthlens.report.tables import RunTables

from . import build_run, read_json, read_table, write_table

# The full leg only: thousands of simulated runs, no BLAS kernel dependence worth a leg.
pytestmark = pytest.mark.slow

#: Claims whose statistic has no planted scenario yet (the clamp chain and the contest run
#: the stages' own code; the funnel claims are point estimates of one deterministic product).
UNCALIBRATED = {"A7-clamp-chain", "A7-contest-resolvent-required", "A7-criticality-unpredicted",
                "B2-funnel-trained", "B3-funnel-learned", "B4-funnel-schur", "C2-funnel-learned-census"}


def test_every_scenario_claim_is_accepted_at_the_default_sizes():
    claims = load_claims()
    assert {c.id for c in claims if c.statistic not in SCENARIOS} == UNCALIBRATED
    for claim in claims:
        result = calibrate(claim, draws=100, seed=7)
        if result is None:
            continue
        assert result["p_supported_null"] <= ACCEPT and result["p_falsified_effect"] <= ACCEPT, (claim.id, result)
        assert result["p_supported_effect"] >= 0.15, (claim.id, result)  # the planted effect is seen at all


def test_a_claim_that_passes_by_construction_is_caught():
    tracks = next(c for c in load_claims() if c.id == "A5b-routing-tracks-prev-token")
    lenient = dataclasses.replace(tracks, threshold=-1.0, inconclusive_band=())  # any ρ passes
    result = calibrate(lenient, draws=40)
    assert result["p_supported_null"] == 1.0 and not result["accepted"]
    point = calibrate(tracks, {"routing_heads": 8}, draws=200, intervals=False)  # ρ ≥ 0.3 alone, 8 heads
    assert point["p_supported_null"] > 2 * ACCEPT  # the old rule: ρ ≥ 0.3 passes by chance


def test_memory_tables_read_as_a_run_directory(tmp_path):
    rng = np.random.default_rng(3)
    for name, found in SCENARIOS.items():
        simulated = found.simulate(rng, found.default, True)
        root = tmp_path / name
        (root / "tables").mkdir(parents=True)
        for key, df in simulated._cache.items():
            if key.startswith("table:"):
                df.to_parquet(root / "tables" / f"{key[6:]}.parquet")
            elif key.startswith("json:") and df:
                (root / f"{key[5:]}.json").write_text(json.dumps(df))
        here, there = compute_estimate(name, simulated)[0], compute_estimate(name, RunTables(root))[0]
        assert here is not None and there is not None, name
        assert (here.value == there.value or (math.isnan(here.value) and math.isnan(there.value))), name
        assert (here.lo, here.hi) == (there.lo, there.hi), name


def test_the_report_calibrates_at_the_runs_sample_and_demotes_where_it_fails(tmp_path: Path):
    run = build_run(tmp_path / "run", chunks=6)
    heads = read_table(run, "heads")
    heads.loc[heads.index[heads["role"] == "sink"][0], "role"] = "other"
    write_table(run, "heads", heads)  # 5 sink heads over 6 chunks: a real effect is falsified too often
    claims = [c for c in load_claims() if c.id in ("A2-eig-gap-contrast", "A6-sink-negative", "B2-funnel-trained")]
    results = {r["id"]: r for r in evaluate(claims, run)}
    a6 = results["A6-sink-negative"]
    assert judge(claims[1], RunTables(run)).verdict == "supported"  # by its value and interval alone
    assert a6["calibration"]["sizes"]["sink_heads"] == 5 and a6["calibration"]["sizes"]["null_chunks"] == 6
    assert a6["calibration"]["p_falsified_effect"] > ACCEPT and not a6["calibration"]["accepted"]
    assert a6["verdict"] == "inconclusive" and a6["underpowered"] and "calibration at this sample" in a6["reason"]
    a2 = results["A2-eig-gap-contrast"]
    assert a2["verdict"] == "supported" and a2["calibration"]["accepted"] and a2["interval"][0] > 5
    assert results["B2-funnel-trained"]["calibration"] is None  # no scenario: said, not invented
    doc = read_json(write_claims_json(run, list(results.values())).parent, "claims")
    assert doc["results"][0]["calibration"]["draws"] > 0
    assert calibration_at(claims[1], RunTables(run)) == a6["calibration"]  # memoised, same answer
