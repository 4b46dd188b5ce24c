"""Claims: loading and strict validation, hashing, verdict logic on synthetic runs."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from depthlens.errors import InputError
from depthlens.report.statistics import STATISTICS, compute_statistic
from depthlens.report.claims import (
    TESTS,
    Claim,
    claims_hash,
    default_claims_path,
    evaluate,
    marginal,
    load_claims,
    verdict,
    write_claims_json,
)
from depthlens.report.verdict_text import verdict_label, verdict_lines
from depthlens.runs.tables import RunTables

from . import build_run, drop_stage, read_json, read_table, set_stage, write_funnel_boot, write_json, write_table

DEFAULT_IDS = ["A2-eig-gap-contrast", "A2b-eig-gap-absent-in-nulls", "A4-induction-doubling", "A5-routing-positive", "A5b-routing-tracks-prev-token",
               "A6-sink-negative", "A7-clamp-chain", "A7-contest-resolvent-required",
               "A7-criticality-unpredicted", "B1-complex-early", "B1b-symmetric-late", "B2-funnel-trained",
               "B3-funnel-learned", "B4-funnel-schur", "B5-coupling-rise", "B5b-coupling-sign", "B6-coupling-init",
               "C1-consolidation-after-formation", "C2-funnel-learned-census", "C3-coupling-trend"]


def verdicts(run: Path) -> dict[str, str]:
    """The verdicts of the statistics and their intervals alone (the calibration at the run's
    sample size, which can only turn a decisive verdict underpowered, is tested apart)."""
    return {r["id"]: r["verdict"] for r in evaluate(load_claims(), run, calibrate=False)}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return build_run(tmp_path / "run")


# -- the default file ---------------------------------------------------------------------
def test_default_claims_cover_every_reference_figure():
    claims = load_claims()
    assert [c.id for c in claims] == DEFAULT_IDS
    assert all(c.statistic in STATISTICS for c in claims)
    assert all(c.prediction and c.falsifier and c.protocol for c in claims)
    assert all(c.source.startswith("Paper A: '") or c.source.startswith("Paper B: '") for c in claims)
    assert all(re.search(r"§[AB][0-9]", c.protocol) for c in claims)  # sections of docs/methods.md
    by_id = {c.id: c for c in claims}
    assert by_id["A2-eig-gap-contrast"].test == ">=" and by_id["A2-eig-gap-contrast"].threshold == 5.0
    assert by_id["A4-induction-doubling"].threshold == (1.5, 3.0)
    assert by_id["B1-complex-early"].statistic == "rotation_gain_early"  # a contrast with step 0, not a count
    assert by_id["B2-funnel-trained"].threshold == 0.032  # twice the paper's 7/436
    assert by_id["B4-funnel-schur"].statistic == "funnel_removed_by_schur_every_order"  # every order must agree
    assert "kreiss_A_pinned_fraction" not in {c.statistic for c in claims}  # a theorem: numerical health


def test_load_claims_default_equals_packaged_path():
    assert load_claims() == load_claims(default_claims_path())


# -- verdict logic -----------------------------------------------------------------------------
def claim(test: str = ">=", threshold=1.0, band=()) -> Claim:
    return Claim("x", "p", "induction_ratio_median", test, threshold, "f", "s", tuple(band))


@pytest.mark.parametrize("test,threshold,value,expected", [
    (">=", 1.0, 1.0, "supported"), (">=", 1.0, 0.99, "falsified"), (">", 1.0, 1.0, "falsified"),
    ("<=", 1.0, 1.0, "supported"), ("<", 1.0, 0.5, "supported"), ("<", 1.0, 1.0, "falsified"),
    ("between", (1.5, 3.0), 2.0, "supported"), ("between", (1.5, 3.0), 3.0, "supported"),
    ("between", (1.5, 3.0), 3.5, "falsified"), (">=", 7.0, math.inf, "supported"),
    ("<=", 2.0, math.inf, "falsified"),
])
def test_verdict_tests(test, threshold, value, expected):
    assert verdict(claim(test, threshold), value)[0] == expected


def test_verdict_band_softens_failures_only():
    c = claim(">=", 7.0, [(5.0, 7.0)])
    assert verdict(c, 6.0)[0] == "inconclusive"
    assert verdict(c, 5.0)[0] == "inconclusive"
    assert verdict(c, 7.0)[0] == "supported"
    assert verdict(c, 4.9)[0] == "falsified"
    two = claim("between", (1.5, 3.0), [(1.2, 1.5), (3.0, 4.0)])
    assert [verdict(two, v)[0] for v in (1.0, 1.3, 2.0, 3.5, 4.5)] == [
        "falsified", "inconclusive", "supported", "inconclusive", "falsified"]


def test_verdict_missing_and_too_little_data():
    assert verdict(claim(), None)[0] == "not tested"
    assert verdict(claim(), math.nan)[0] == "inconclusive"


# -- verdicts on synthetic runs ------------------------------------------------------------------
def test_synthetic_run_supports_every_claim(run):
    got = verdicts(run)
    assert set(got.values()) == {"supported"}, got


def test_clamp_chain_not_tested_without_massive_activations_says_why(run):
    write_json(run, "interventions", {"clamp_chain": {"tested": False, "reason": "no massive activation at the first token"}})
    results = {r["id"]: r for r in evaluate(load_claims(), run, calibrate=False)}
    assert results["A7-clamp-chain"]["verdict"] == "not tested"
    assert results["A7-clamp-chain"]["reason"] == "no massive activation at the first token"
    assert results["A7-clamp-chain"]["descriptive"] == dict.fromkeys(
        ("clamp_chain_monotone", "clamp_chain_predicts", "clamp_chain_control_inert"))


def test_clamp_chain_lists_which_conditions_held(run):
    chain = read_json(run, "interventions")
    chain["clamp_chain"].update(supported=False, dims=[])
    chain["clamp_chain"]["conditions"]["control_inert"]["held"] = False
    write_json(run, "interventions", chain)
    result = next(r for r in evaluate(load_claims(), run, calibrate=False) if r["id"] == "A7-clamp-chain")
    assert result["verdict"] == "falsified"
    assert result["descriptive"] == {"clamp_chain_monotone": 1.0, "clamp_chain_predicts": 1.0,
                                     "clamp_chain_control_inert": 0.0}


def test_contest_claims_follow_the_contest_table(run):
    contest = read_table(run, "contest")
    routing_drop = (contest["target"] == "routing") & (contest["features"] == "all-R")
    write_table(run, "contest", contest.assign(required=contest["required"] & ~routing_drop))
    assert verdicts(run)["A7-contest-resolvent-required"] == "inconclusive"  # one of the two targets
    predicted = (contest["target"] == "criticality") & contest["features"].isin(["R", "S"])
    write_table(run, "contest", contest.assign(score=contest["score"].where(~predicted, 0.6),
                                               score_lo=contest["score_lo"].where(~predicted, 0.45),
                                               score_hi=contest["score_hi"].where(~predicted, 0.75),
                                               q=contest["q"].where(~predicted, 0.01)))
    assert verdicts(run)["A7-criticality-unpredicted"] == "falsified"
    unsure = (contest["target"] == "criticality") & (contest["features"] == "P")  # a wide interval: not shown absent
    write_table(run, "contest", contest.assign(score_hi=contest["score_hi"].where(~unsure, 0.5)))
    assert verdicts(run)["A7-criticality-unpredicted"] == "inconclusive"
    drop_stage(run, "contest")
    assert verdicts(run)["A7-criticality-unpredicted"] == "not tested"


def test_falsified(run):
    depth = read_table(run, "depth")
    depth.loc[depth["source"] == "model", "gap_e1"] = 3.0
    depth.loc[depth["source"] == "null", "gap_e1"] = 6.0
    write_table(run, "depth", depth)
    heads = read_table(run, "heads")
    heads["induction_ratio_control"] = heads["induction_ratio_control"].where(heads["role"] != "routing", 1.0)
    routing = heads["role"] == "routing"
    heads.loc[routing, "prev_token_score"] = heads.loc[routing, "prev_token_score"].to_numpy()[::-1]
    write_table(run, "heads", heads)
    ops = read_table(run, "operators")
    ops["symmetry_update"] = 0.9 - 0.1 * ops["layer"]
    write_table(run, "operators", ops)
    eig = read_table(run, "eigenvalues")
    trained = eig["checkpoint"] == "trained"
    eig.loc[trained, "im"], eig.loc[~trained, "im"] = 0.01 * eig.loc[trained, "im"], 20.0 * eig.loc[~trained, "im"]
    write_table(run, "eigenvalues", eig)  # training removes rotation
    cum = read_table(run, "cumulative")
    trained = cum["checkpoint"] == "trained"
    cum.loc[trained, "erank"] = 50.0 * np.exp(-cum.loc[trained, "depth"] / cum["depth"].max() * np.log(25.0))  # 50 → 2 whatever α
    cum.loc[~trained, "erank"] = 3.0  # init collapses too
    write_table(run, "cumulative", cum)
    write_funnel_boot(run)  # the bootstrap replicates follow
    coupling = read_table(run, "coupling")
    coupling["significant"] = coupling["checkpoint"] != "trained"
    coupling.loc[coupling["checkpoint"] == "trained", "significant"] = coupling["boundary_index"] % 2 == 0
    coupling["symmetry_update"] = 1.0 - coupling["symmetry_update"]
    write_table(run, "coupling", coupling)
    chunks = read_table(run, "head_chunks")
    chunks["null_rank_TR1"] = chunks["null_rank_TR1"].where(chunks["null_rank_TR1"].isna(), 4.0)  # level with nulls
    write_table(run, "head_chunks", chunks)
    got = verdicts(run)
    for cid in ("A2-eig-gap-contrast", "A4-induction-doubling", "A5b-routing-tracks-prev-token", "A6-sink-negative",
                "B1-complex-early", "B1b-symmetric-late", "B3-funnel-learned", "B4-funnel-schur", "B5-coupling-rise",
                "B5b-coupling-sign", "B6-coupling-init"):
        assert got[cid] == "falsified", cid
    assert got["B2-funnel-trained"] == "inconclusive"  # 2/50 = 0.04 lies in the band [0.032, 0.1]


def test_inconclusive(run):
    depth = read_table(run, "depth")
    null = depth["source"] == "null"
    depth.loc[null, "gap_e1"] = depth.loc[null, "gap_e1"] + 4.0  # contrast ≈ 3.8: in the band [3, 5]
    write_table(run, "depth", depth)
    heads = read_table(run, "heads")
    heads["induction_ratio_control"] = None  # routing heads present, but no ratio measured
    write_table(run, "heads", heads)
    chunks, roles = read_table(run, "head_chunks"), read_table(run, "heads")[["layer", "head", "role"]]
    routing = chunks.merge(roles, on=["layer", "head"])["role"].eq("routing") & (chunks["layer"] > 0)
    chunks.loc[routing & chunks["null_rank_TR1"].notna(), "null_rank_TR1"] = 4.0  # 2 of 6 routing heads left
    write_table(run, "head_chunks", chunks)  # a fraction of 1/3: in the band [0.25, 0.5]
    eig = read_table(run, "eigenvalues")
    trained, init = eig[eig["checkpoint"] == "trained"], eig["checkpoint"] == "init"
    eig.loc[init, ["re", "im"]] = trained[["re", "im"]].to_numpy() * [1.0, 0.9]  # step 0 rotates nearly as much
    write_table(run, "eigenvalues", eig)
    coupling = read_table(run, "coupling")
    write_table(run, "coupling", coupling[coupling["checkpoint"] != "step1000"])  # only step 0 and trained
    results = {r["id"]: r for r in evaluate(load_claims(), run, calibrate=False)}
    for cid in ("A2-eig-gap-contrast", "A4-induction-doubling", "A5-routing-positive", "B1-complex-early"):
        assert results[cid]["verdict"] == "inconclusive", cid
    assert "too little data" in results["A4-induction-doubling"]["reason"]
    assert "band" in results["A2-eig-gap-contrast"]["reason"]
    assert results["A4-induction-doubling"]["value"] is None
    b5 = results["B5-coupling-rise"]  # two checkpoints cannot show a monotone rise: a run without revisions
    assert (b5["verdict"], b5["needs"], verdict_label(b5)) == ("not tested", "--revisions",
                                                              "not tested (needs --revisions)")
    assert "only 2 checkpoint(s) (init, trained); a monotone rise needs at least 3" in b5["reason"]
    assert results["B5-coupling-rise"]["descriptive"]["coupling_significant_rise"] == 20


def test_inconclusive_without_routing_heads(run):
    heads = read_table(run, "heads")
    heads["role"] = "other"
    write_table(run, "heads", heads)
    assert verdicts(run)["A4-induction-doubling"] == "inconclusive"


def test_not_tested_when_stages_did_not_run(run):
    for stage in ("attention", "ablate", "clamp", "contest", "topology"):
        drop_stage(run, stage)
    results = {r["id"]: r for r in evaluate(load_claims(), run, calibrate=False)}
    for cid in DEFAULT_IDS:
        if cid.startswith("A") or cid.startswith("B5") or cid.startswith("B6"):
            assert results[cid]["verdict"] == "not tested", cid
            assert results[cid]["value"] is None
    assert "stage attention not run" in results["A2-eig-gap-contrast"]["reason"]
    assert results["B1-complex-early"]["verdict"] == "supported"


def test_not_tested_failed_stage_and_missing_rows_or_columns(run):
    set_stage(run, "jacobian", "failed")
    (run / "tables" / "operators.parquet").unlink()
    (run / "tables" / "eigenvalues.parquet").unlink()
    coupling = read_table(run, "coupling")
    write_table(run, "coupling", coupling[coupling["checkpoint"] == "trained"])  # no init checkpoint
    heads = read_table(run, "heads").drop(columns=["induction_ratio_control"])
    write_table(run, "heads", heads)
    depth = read_table(run, "depth")
    write_table(run, "depth", depth[depth["source"] == "model"])  # no null samples
    results = {r["id"]: r for r in evaluate(load_claims(), run, calibrate=False)}
    assert results["B1-complex-early"]["verdict"] == "not tested"
    assert "failed" in results["B1-complex-early"]["reason"]
    assert results["B5-coupling-rise"]["verdict"] == "not tested"
    assert "only 1 checkpoint(s) (trained)" in results["B5-coupling-rise"]["reason"]
    assert results["B6-coupling-init"]["verdict"] == "not tested"
    assert results["A4-induction-doubling"]["verdict"] == "not tested"
    assert results["A2-eig-gap-contrast"]["verdict"] == "not tested"  # no null samples to contrast with
    assert results["A2-eig-gap-contrast"]["needs"] == "--null-chunks 1 or more"
    assert results["B1-complex-early"]["needs"] == "the jacobian stage"  # its tables are gone with the stage
    assert all(r["needs"] is None for r in results.values() if r["verdict"] != "not tested")
    assert results["A2-eig-gap-contrast"]["descriptive"]["eig_gap_e1_model_final"] > 7


def test_a_statistic_failing_on_an_odd_table_is_not_tested_with_a_warning(run):
    write_json(run, "interventions", {"clamp_chain": {"dims": 3}})  # not a list
    assert verdicts(run)["A7-clamp-chain"] == "not tested"
    write_table(run, "cumulative", read_table(run, "cumulative").assign(erank="n/a"))
    with pytest.warns(RuntimeWarning, match=r"statistic funnel_\w+ failed"):
        results = {r["id"]: r for r in evaluate(load_claims(), run, calibrate=False)}
    assert results["B2-funnel-trained"]["verdict"] == "not tested"
    assert "could not be computed" in results["B2-funnel-trained"]["reason"]


def test_clamp_chain_is_tested_once_interventions_write_it(run):
    write_json(run, "interventions", {"clamp_chain": {"supported": True, "dims": [788, 1384, 4062]}})
    assert verdicts(run)["A7-clamp-chain"] == "supported"
    write_json(run, "interventions", {"clamp_chain": {"supported": False, "dims": []}})
    assert verdicts(run)["A7-clamp-chain"] == "falsified"


def test_empty_directory_gives_every_claim_a_verdict(tmp_path):
    results = evaluate(load_claims(), tmp_path)
    assert [r["id"] for r in results] == DEFAULT_IDS
    assert {r["verdict"] for r in results} == {"not tested"}


def test_inf_statistic_is_json_safe(run, tmp_path):
    depth = read_table(run, "depth")
    depth.loc[depth["source"] == "model", "gap_e1"] = np.inf
    write_table(run, "depth", depth)
    results = evaluate(load_claims(), run, calibrate=False)
    a2 = next(r for r in results if r["id"] == "A2-eig-gap-contrast")
    assert a2["verdict"] == "supported" and a2["value"] == "inf"
    path = write_claims_json(run, results)

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    doc = json.loads(path.read_text(), parse_constant=refuse)
    assert doc["claims_hash"] == claims_hash()
    assert doc["counts"]["supported"] == len(DEFAULT_IDS) and doc["counts"]["not tested"] == 0
    assert [r["id"] for r in doc["results"]] == DEFAULT_IDS


def test_every_statistic_computes_on_the_synthetic_run(run):
    tables = RunTables(run)
    for name in STATISTICS:
        value, note = compute_statistic(name, tables)
        if name.endswith("_isolated_observed"):  # the synthetic run has the default modes only
            assert value is None and "isolated_observed" in note, (name, note)
        else:
            assert value is not None and not math.isnan(value), (name, note)


# -- hashing -------------------------------------------------------------------------------------
def test_claims_hash_is_sha256_of_bytes_and_stable(tmp_path):
    data = default_claims_path().read_bytes()
    assert claims_hash() == hashlib.sha256(data).hexdigest() == claims_hash(default_claims_path())
    copy = tmp_path / "c.toml"
    copy.write_bytes(data)
    assert claims_hash(copy) == claims_hash()
    copy.write_bytes(data + b"\n# edited\n")
    assert claims_hash(copy) != claims_hash()


# -- malformed files -------------------------------------------------------------------------------
GOOD = """
[[claim]]
id = "c1"
prediction = "p"
statistic = "induction_ratio_median"
test = "between"
threshold = [1.5, 3.0]
falsifier = "f"
source = "s"
"""


def _edit(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


MALFORMED = {
    "bad toml": ("[[claim]\nid = 'c1'", "not valid TOML"),
    "missing field": (_edit(GOOD, 'falsifier = "f"\n', ""), "claim 'c1': missing field 'falsifier'"),
    "unknown statistic": (_edit(GOOD, "induction_ratio_median", "nonsense"),
                          "claim 'c1': unknown statistic 'nonsense'"),
    "bad test": (_edit(GOOD, '"between"', '"=="'), "claim 'c1': unknown test '=='"),
    "threshold not pair": (_edit(GOOD, "[1.5, 3.0]", "2.0"), "claim 'c1': threshold must be [lo, hi]"),
    "threshold reversed": (_edit(GOOD, "[1.5, 3.0]", "[3.0, 1.5]"), "claim 'c1': threshold [3, 1.5] needs lo < hi"),
    "threshold string": (_edit(_edit(GOOD, '"between"', '">="'), "[1.5, 3.0]", '"7"'),
                         "claim 'c1': threshold must be a number"),
    "threshold bool": (_edit(_edit(GOOD, '"between"', '">="'), "[1.5, 3.0]", "true"),
                       "claim 'c1': threshold must be a number"),
    "bad band": (GOOD + "inconclusive_band = [1.0]\n", "claim 'c1': inconclusive_band must be [lo, hi]"),
    "unknown field": (GOOD + "comment = 'x'\n", "claim 'c1': unknown field 'comment'"),
    "empty prediction": (_edit(GOOD, 'prediction = "p"', 'prediction = ""'), "claim 'c1': field 'prediction'"),
    "duplicate id": (GOOD + GOOD, "claim 'c1': duplicate id"),
    "no id": (_edit(GOOD, 'id = "c1"\n', ""), "claim #1: missing field 'id'"),
    "bad id": (_edit(GOOD, 'id = "c1"', 'id = "has space"'), "claim #1: id must be"),
    "no claims": ("title = 'x'\n", "unknown top-level key 'title'"),
    "empty file": ("", "has no [[claim]] tables"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_claims_file_is_one_line_input_error(tmp_path, case):
    text, expected = MALFORMED[case]
    path = tmp_path / "claims.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_claims(path)
    message = str(info.value)
    assert "\n" not in message
    assert expected in message, message
    assert message.startswith("claims file claims.toml")


def test_missing_claims_file_is_input_error(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        load_claims(tmp_path / "absent.toml")


def test_good_minimal_file_loads(tmp_path):
    path = tmp_path / "claims.toml"
    path.write_text(GOOD + 'inconclusive_band = [[1.2, 1.5], [3.0, 4.0]]\n')
    (c,) = load_claims(path)
    assert c.test in TESTS and c.threshold == (1.5, 3.0) and c.inconclusive_band == ((1.2, 1.5), (3.0, 4.0))
    assert c.criterion() == "in [1.5, 3]"


def test_a_decisive_verdict_whose_interval_reaches_the_band_is_marginal(run, monkeypatch):
    """A2 (≥ 5, band [3, 5]): 5.54 [4.39, 6.14] is supported but marginal, in judge's reason, the
    claims.json field and the terminal line; an interval clear of the band is not, nor is a
    range over protocol choices or an inconclusive verdict."""
    from depthlens.report import claims as claims_module
    from depthlens.report.statistics import Estimate

    a2 = next(c for c in load_claims() if c.id == "A2-eig-gap-contrast")
    assert marginal(a2, "supported", Estimate(5.54, 4.39, 6.14)) and marginal(a2, "falsified", Estimate(2, 1, 3.5))
    assert not marginal(a2, "supported", Estimate(5.54, 5.1, 6.14))
    assert not marginal(a2, "supported", Estimate(5.54, 4.39, 6.14, "range"))
    assert not marginal(a2, "inconclusive", Estimate(4.0, 3.5, 4.5))
    monkeypatch.setattr(claims_module, "compute_estimate", lambda name, tables: (Estimate(5.54, 4.39, 6.14), ""))
    judged = claims_module.judge(a2, RunTables(run))
    assert judged.verdict == "supported" and judged.marginal and "(marginal)" in judged.reason
    result = next(r for r in evaluate([a2], run, calibrate=False))
    assert result["marginal"] and verdict_label(result) == "supported (marginal)"
    write_claims_json(run, [result])
    assert "supported (marginal)" in verdict_lines(run)[0]
