"""Pre-registration (issue findings 7 and 9): minimum samples give underpowered runs an
``inconclusive: underpowered`` verdict, and re-scoring against a claims file other than the
registered one is flagged in claims.json and the report."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from depthlens.errors import InputError
from depthlens.report import render_report
from depthlens.report.statistics import SAMPLE_UNITS, STATISTICS
from depthlens.report.claims import (
    CLAIMS_COPY,
    claims_hash,
    default_claims_path,
    evaluate,
    load_claims,
)

from . import build_run, read_json, read_table, write_json, write_table
from .test_claims import GOOD

# The full leg only: rendering and claims read tables, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg

JACOBIAN_IDS = ("B1-complex-early", "B1b-symmetric-late", "B2-funnel-trained", "B3-funnel-learned", "B4-funnel-schur")


def results(run: Path, claims_path: Path | None = None) -> dict[str, dict]:
    return {r["id"]: r for r in evaluate(load_claims(claims_path), run, calibrate=False)}


# -- finding 9: minimum samples ----------------------------------------------------------
def test_every_default_claim_declares_a_minimum_its_statistic_counts():
    for claim in load_claims():
        assert claim.min_sample, claim.id
        for unit, need in claim.min_sample:
            assert unit in SAMPLE_UNITS and unit in STATISTICS[claim.statistic].samples, (claim.id, unit)
            assert isinstance(need, int) and need >= 1


def test_full_synthetic_run_meets_every_minimum(tmp_path):
    got = results(build_run(tmp_path / "run", chunks=10))  # the default preset's 10 null chunks
    assert not any(r["underpowered"] for r in got.values())
    a5 = got["A5-routing-positive"]
    assert a5["sample"] == {"null_chunks": 10, "routing_heads": 6} and a5["min_sample"] == {
        "null_chunks": 8, "routing_heads": 4}
    assert got["A6-sink-negative"]["min_sample"] == {"null_chunks": 10, "sink_heads": 5}
    assert got["B6-coupling-init"]["sample"] == {"boundaries": 40, "permutations": 1000}
    assert got["A2-eig-gap-contrast"]["sample"] == {"null_chunks": 10}


def _significant_routing(run: Path, keep: int) -> None:
    """Leave the first ``keep`` routing heads above all their nulls and put the others level
    with them (rank 4 of 8: no evidence)."""
    chunks, heads = read_table(run, "head_chunks"), read_table(run, "heads")
    routing = heads.loc[heads["role"] == "routing", ["layer", "head"]].iloc[keep:]
    level = chunks.set_index(["layer", "head"]).index.isin(routing.set_index(["layer", "head"]).index)
    chunks.loc[level & chunks["null_rank_TR1"].notna(), "null_rank_TR1"] = 4.0
    write_table(run, "head_chunks", chunks)


def test_two_chunks_no_significant_routing_head_is_underpowered_not_falsified(tmp_path):
    """The issue's case: 2 chunks and no routing head significant."""
    run = build_run(tmp_path / "run", chunks=2)
    _significant_routing(run, 0)
    got = results(run)
    a5 = got["A5-routing-positive"]
    assert a5["verdict"] == "inconclusive" and a5["underpowered"] is True
    assert a5["reason"] == "underpowered (n = 2 chunks with null samples, needs 8)"
    assert a5["value"] == 0.0  # the statistic is still reported
    for cid in ("A2-eig-gap-contrast", "A6-sink-negative", *JACOBIAN_IDS):
        assert got[cid]["verdict"] == "inconclusive" and got[cid]["underpowered"], cid
        need = 10 if cid == "A6-sink-negative" else 6
        assert "n = 2 chunks" in got[cid]["reason"] and f"needs {need})" in got[cid]["reason"], cid
    # counted in routing heads only: powered, keeps its verdict
    assert got["A5b-routing-tracks-prev-token"]["verdict"] == "supported"
    # topology is counted in boundaries and permutations, not chunks
    assert got["B6-coupling-init"]["verdict"] == "supported"


def test_same_values_with_enough_chunks_get_normal_verdicts(tmp_path):
    run = build_run(tmp_path / "run", chunks=8)
    _significant_routing(run, 0)
    got = results(run)
    assert got["A5-routing-positive"]["verdict"] == "falsified" and not got["A5-routing-positive"]["underpowered"]
    run = build_run(tmp_path / "band", chunks=8)
    _significant_routing(run, 2)
    assert results(run)["A5-routing-positive"]["verdict"] == "inconclusive"  # 1/3: band, not power
    assert not results(run)["A5-routing-positive"]["underpowered"]
    run = build_run(tmp_path / "most", chunks=8)
    _significant_routing(run, 5)
    assert results(run)["A5-routing-positive"]["verdict"] == "supported"


def test_minimum_is_inclusive(tmp_path):
    got = results(build_run(tmp_path / "run", chunks=6))  # the minimum of the chunk claims but A5's (8) and A6's (10)
    assert sorted(cid for cid, r in got.items() if r["underpowered"]) == ["A5-routing-positive", "A6-sink-negative"]
    got = results(build_run(tmp_path / "run10", chunks=10))  # A6's minimum
    assert all(not r["underpowered"] for r in got.values())
    got = results(build_run(tmp_path / "run5", chunks=5))
    assert got["B1-complex-early"]["reason"] == "underpowered (n = 5 chunks, needs 6)"


def test_few_heads_boundaries_and_permutations_are_underpowered(tmp_path):
    run = build_run(tmp_path / "run", boundaries=6)
    heads = read_table(run, "heads")
    routing = heads.index[heads["role"] == "routing"]
    heads.loc[routing[3:], "role"] = "other"  # 3 routing heads left
    write_table(run, "heads", heads)
    manifest = read_json(run, "manifest")
    manifest["config"]["topology"]["n_perm"] = 10
    write_json(run, "manifest", manifest)
    got = results(run)
    assert got["A4-induction-doubling"]["reason"] == "underpowered (n = 3 routing heads, needs 6)"
    assert got["A5-routing-positive"]["reason"] == "underpowered (n = 3 routing heads, needs 4)"
    assert got["A6-sink-negative"]["verdict"] == "supported"
    for cid, need in (("B5-coupling-rise", 20), ("B6-coupling-init", 36)):
        assert got[cid]["verdict"] == "inconclusive", cid
        assert got[cid]["reason"] == (f"underpowered (n = 6 sub-layer boundaries, needs {need}; "
                                      "n = 10 label permutations, needs 199)"), cid


def test_no_routing_heads_is_underpowered_and_too_little_data(tmp_path):
    run = build_run(tmp_path / "run")
    heads = read_table(run, "heads")
    heads["role"] = "other"
    write_table(run, "heads", heads)
    a4 = results(run)["A4-induction-doubling"]
    assert a4["verdict"] == "inconclusive" and a4["underpowered"]
    assert a4["reason"].startswith("underpowered (n = 0 routing heads, needs 6); too little data")


def test_unrecorded_count_does_not_block_the_verdict(tmp_path):
    run = build_run(tmp_path / "run")
    manifest = read_json(run, "manifest")
    del manifest["config"]["chunks"], manifest["data"]["shape"]
    write_json(run, "manifest", manifest)
    got = results(run)
    for cid in JACOBIAN_IDS:
        assert got[cid]["verdict"] == "supported" and got[cid]["sample"]["chunks"] is None, cid


def test_not_tested_stays_not_tested(tmp_path):
    got = results(tmp_path)
    assert {r["verdict"] for r in got.values()} == {"not tested"}
    assert not any(r["underpowered"] for r in got.values())




@pytest.mark.parametrize("extra,expected", [
    ("min_routing_heads = 0", "min_routing_heads must be a positive integer"),
    ("min_routing_heads = true", "min_routing_heads must be a positive integer"),
    ("min_routing_heads = 2.5", "min_routing_heads must be a positive integer"),
    ("min_boundaries = 20", ("min_boundaries does not apply to statistic 'induction_ratio_median'; "
                             "it counts: min_routing_heads")),
    ("min_tokens = 3", "unknown field 'min_tokens'"),
])
def test_malformed_minimum_is_one_line_input_error(tmp_path, extra, expected):
    path = tmp_path / "claims.toml"
    path.write_text(GOOD + extra + "\n")
    with pytest.raises(InputError) as info:
        load_claims(path)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_claims_json_and_report_show_underpowered(tmp_path):
    run = build_run(tmp_path / "run", chunks=2)
    text = render_report(run).read_text()
    doc = json.loads((run / "claims.json").read_text())
    under = [r["id"] for r in doc["results"] if r["underpowered"]]
    assert doc["underpowered"] == len(under) >= 8
    assert all(r["verdict"] == "inconclusive" for r in doc["results"] if r["underpowered"])
    assert text.count('class="verdict underpowered"') == 2 * len(under)  # at a glance and in the full table
    assert ">inconclusive: underpowered</span>" in text
    assert "underpowered (n = 2 chunks, needs 6)" in text
    assert f"({len(under)} of the inconclusive underpowered)" in text


# -- finding 7: registration and re-scoring -------------------------------------------------
def register(run: Path, data: bytes) -> str:
    """What the workflow does at the start of a run: the hash in the manifest, the copy."""
    sha = hashlib.sha256(data).hexdigest()
    manifest = read_json(run, "manifest")
    manifest["claims"] = {"file": CLAIMS_COPY, "source": "/elsewhere/claims.toml", "sha256": sha}
    write_json(run, "manifest", manifest)
    (run / CLAIMS_COPY).write_bytes(data)
    return sha


def edited_default(tmp_path: Path) -> Path:
    text = default_claims_path().read_text()
    old = 'statistic = "eig_gap_e1_contrast"\ntest = ">="\nthreshold = 5.0'
    assert old in text
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, old[:-3] + "9.0"))
    return path


def test_report_uses_the_runs_registered_copy_by_default(tmp_path):
    run = build_run(tmp_path / "run")
    sep = "\n[[claim]]\n"
    only = sep.join(default_claims_path().read_text().split(sep)[:2])  # the header and the first claim only
    sha = register(run, only.encode())
    text = render_report(run).read_text()
    doc = json.loads((run / "claims.json").read_text())
    assert [r["id"] for r in doc["results"]] == ["A2-eig-gap-contrast"]
    assert doc["claims_file"] == CLAIMS_COPY
    assert doc["claims_hash"] == doc["registered_claims_hash"] == sha and doc["rescored"] is False
    assert 'id="rescored"' not in text and "the one registered with the run" in text


def test_rescoring_against_an_edited_file_is_flagged(tmp_path):
    run = build_run(tmp_path / "run")
    registered = register(run, default_claims_path().read_bytes())
    edited = edited_default(tmp_path)
    text = render_report(run, claims_path=edited).read_text()
    doc = json.loads((run / "claims.json").read_text())
    assert doc["rescored"] is True
    assert doc["registered_claims_hash"] == registered and doc["claims_hash"] == claims_hash(edited) != registered
    a2 = next(r for r in doc["results"] if r["id"] == "A2-eig-gap-contrast")
    assert a2["criterion"] == "≥ 9"
    banner = text[text.index('id="rescored"'): text.index('id="claims"')]
    assert "Re-scored" in banner and registered in banner and claims_hash(edited) in banner
    assert text.index('id="rescored"') < text.index('id="verdicts"')
    # the registered copy is untouched: the default report is the pre-registered one again
    render_report(run)
    doc = json.loads((run / "claims.json").read_text())
    assert doc["rescored"] is False and doc["claims_hash"] == registered


def test_editing_the_runs_copy_is_flagged(tmp_path):
    run = build_run(tmp_path / "run")
    registered = register(run, default_claims_path().read_bytes())
    (run / CLAIMS_COPY).write_bytes(edited_default(tmp_path).read_bytes())
    text = render_report(run).read_text()
    doc = json.loads((run / "claims.json").read_text())
    assert doc["rescored"] is True and doc["registered_claims_hash"] == registered
    assert 'id="rescored"' in text


def test_run_without_registration_is_not_flagged(tmp_path):
    run = build_run(tmp_path / "run")
    render_report(run)
    doc = json.loads((run / "claims.json").read_text())
    assert doc["registered_claims_hash"] is None and doc["rescored"] is False
    assert doc["claims_hash"] == claims_hash()


def test_a_contest_over_few_layers_is_underpowered(tmp_path):
    run = build_run(tmp_path / "run")
    features = read_table(run, "contest_features")
    write_table(run, "contest_features", features[features["layer"] < 11])
    got = results(run)
    for cid, need in (("A7-contest-resolvent-required", 18), ("A7-criticality-unpredicted", 12)):
        assert got[cid]["verdict"] == "inconclusive", cid
        assert got[cid]["reason"] == ("underpowered (n = 11 layers (the contest's folds and bootstrap clusters), "
                                      f"needs {need})")
