"""Sensitivity variants, descriptive statistics and the numerical-health section, on synthetic
runs whose answers are known; the statistics helpers against independent computations."""

from __future__ import annotations

import itertools

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st

from depthlens.errors import InputError
from depthlens.report import render_report
from depthlens.report.claims import evaluate, fragile, load_claims
from depthlens.report.health import health_table, numerical_health
from depthlens.report.statistics import gap_contrasts
from depthlens.runs.tables import RunTables
from depthlens.stats import head_rank_tests, spearman

from . import NULL_CHUNKS, build_run, read_json, read_table, write_json, write_table

# The full leg only: rendering and claims read tables, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return build_run(tmp_path / "run")


def results(run: Path) -> dict[str, dict]:
    return {r["id"]: r for r in evaluate(load_claims(), run, calibrate=False)}


def test_variants_agree_on_the_synthetic_run(run):
    got = results(run)
    b4 = got["B4-funnel-schur"]
    assert [v["name"] for v in b4["sensitivity"]] == ["forward, exact products (LAPACK order)",
                                                       "in-context operators (LAPACK order)"]
    assert {v["verdict"] for v in b4["sensitivity"]} == {"supported"} and not b4["fragile"]
    assert b4["interval_kind"] == "range"
    assert got["B2-funnel-trained"]["sensitivity"][-1]["name"] == "in-context operators"


def test_a_verdict_that_flips_under_a_variant_is_fragile(run):
    cum = read_table(run, "cumulative")
    forward = (cum["direction"] == "forward") & (cum["checkpoint"] == "trained") & (cum["schur_alpha"] == 1.0)
    cum.loc[forward, "erank"] = 100.0 * 0.5 ** (cum.loc[forward, "depth"] / cum["depth"].max())  # no funnel
    write_table(run, "cumulative", cum)
    b2 = results(run)["B2-funnel-trained"]
    assert b2["verdict"] == "supported" and b2["fragile"] is True
    flipped = next(v for v in b2["sensitivity"] if v["name"] == "forward accumulation")
    assert flipped["verdict"] == "falsified" and flipped["value"] == pytest.approx(0.5)
    html = render_report(run).read_text()
    assert "fragile" in html and "forward accumulation" in html


def test_a_schur_split_that_depends_on_the_order_is_inconclusive(run):
    cum = read_table(run, "cumulative")
    canonical = (cum["schur_order"] == "canonical") & (cum["checkpoint"] == "trained")
    cum.loc[canonical, "erank"] = 100.0 * (2.0 / 100.0) ** (cum.loc[canonical, "depth"] / cum["depth"].max())
    write_table(run, "cumulative", cum)  # α = 0 keeps the whole funnel in the canonical order only
    b4 = results(run)["B4-funnel-schur"]
    assert b4["verdict"] == "inconclusive" and "range over protocol choices" in b4["reason"]
    assert b4["value"] == pytest.approx(0.949, abs=1e-3) and b4["interval"][0] == pytest.approx(0.0, abs=1e-12)

def test_fragile_rule():
    assert fragile("supported", ["supported", "falsified"]) and fragile("falsified", ["inconclusive"])
    assert not fragile("supported", ["supported", "not tested"])
    assert not fragile("inconclusive", ["supported"])  # no decisive verdict to lose
    assert not fragile("supported", [])


def test_descriptive_statistics_are_reported_beside(run):
    got = results(run)
    a2 = got["A2-eig-gap-contrast"]
    assert set(a2["descriptive"]) == {"eig_gap_e1_model_final", "eig_gap_e1_null_final", "eig_gap_contrast_sign_p"}
    assert a2["descriptive"]["eig_gap_contrast_sign_p"] == pytest.approx(2 * 0.5 ** NULL_CHUNKS)  # every chunk positive
    assert got["B3-funnel-learned"]["value"] == pytest.approx(60.0 / 2.0)
    assert got["B3-funnel-learned"]["descriptive"]["funnel_ratio_init"] == pytest.approx(0.6)
    assert all(r["protocol"] for r in got.values())


def test_claims_file_variant_and_descriptive_errors(tmp_path):
    base = ('[[claim]]\nid = "x"\nprediction = "p"\nstatistic = "funnel_ratio_trained"\ntest = "<="\n'
            'threshold = 0.1\nfalsifier = "f"\nsource = "s"\n')
    cases = [(base + 'descriptive = ["nope"]\n', "descriptive must be a list of statistic names"),
             (base + '[[claim.variant]]\nname = "v"\nstatistic = "nope"\n', "variant 'v': needs a name and a known"),
             (base + '[[claim.variant]]\nname = "v"\nstatistic = "funnel_ratio_trained"\nextra = 1\n', "variant 'v'"),
             (base + "protocol = 3\n", "field 'protocol' must be a string")]
    for text, message in cases:
        path = tmp_path / "c.toml"
        path.write_text(text)
        with pytest.raises(InputError, match=message):
            load_claims(path)
    path.write_text(base + 'protocol = "METHODS B3"\n[[claim.variant]]\nname = "fwd"\n'
                    'statistic = "funnel_ratio_trained_forward"\n')
    [claim] = load_claims(path)
    assert claim.protocol == "METHODS B3" and claim.variants[0].statistic == "funnel_ratio_trained_forward"


def test_gap_contrasts_are_paired_per_chunk():
    depth = pd.DataFrame({"chunk": [0, 0, 0, 1, 1, 1, 2], "source": ["model", "null", "null"] * 2 + ["model"],
                          "gap_e1": [9.0, 1.0, 3.0, 8.0, 2.0, 2.0, 7.0]})
    np.testing.assert_array_equal(gap_contrasts(depth), [7.0, 6.0])  # chunk 2 has no null: left out


def _enumerated_p(ranks: np.ndarray, samples: int) -> float:
    """Two-sided p of the rank sum by enumerating every outcome of uniform ranks (the reference)."""
    sums = np.array([sum(r) for r in itertools.product(range(samples + 1), repeat=len(ranks))], dtype=float)
    obs = ranks.sum()
    return min(1.0, 2 * min(np.mean(sums >= obs - 1e-9), np.mean(sums <= obs + 1e-9)))


def test_head_rank_tests_and_spearman_against_references(rng):
    chunks = pd.DataFrame({"layer": np.repeat([0, 0, 1], 4), "head": np.repeat([0, 1, 0], 4),
                           "delta": rng.normal(0.3, 1.0, size=12), "rank": rng.integers(0, 4, size=12).astype(float),
                           "n": 3.0})
    chunks.loc[3, "rank"] = np.nan
    got = head_rank_tests(chunks, "delta", "rank", "n")
    for row, (key, group) in zip(got.itertuples(), chunks.groupby(["layer", "head"])):
        used = group[group["rank"].notna()]
        assert row.median == np.median(used["delta"]) and row.n == len(used)
        assert row.p == pytest.approx(_enumerated_p(used["rank"].to_numpy(), 3))
    assert head_rank_tests(chunks.assign(rank=np.nan), "delta", "rank", "n")["p"].eq(1.0).all()  # no evidence
    p_sorted = np.sort(got["p"].to_numpy())
    q_expected = np.minimum.accumulate((p_sorted * 3 / np.arange(1, 4))[::-1])[::-1].clip(max=1)
    np.testing.assert_allclose(np.sort(got["q"].to_numpy()), q_expected)
    x, y = rng.normal(size=12), rng.normal(size=12)
    rho, p = spearman(x, y)
    rx, ry = st.rankdata(x), st.rankdata(y)
    assert rho == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert 0 <= p <= 1


def test_numerical_health_section(run):
    checks = {c.name: c for c in numerical_health(RunTables(run))}
    pinned = checks["K(A) = √n for simple Perron roots (§A2, a theorem)"]
    assert pinned.value == "1.0000" and pinned.ok is True
    brackets = checks["certified Kreiss brackets"]
    assert brackets.ok is True and brackets.value.startswith("16 brackets")
    summary = read_json(run, "attention")
    summary["numerical_health"]["bracket_violations"] = 2
    write_json(run, "attention", summary)
    heads = read_table(run, "heads")
    heads.loc[0, "plain_median"] = "kreiss_B,norm_B"
    write_table(run, "heads", heads)
    checks = {c.name: c for c in numerical_health(RunTables(run))}
    assert checks["certified Kreiss brackets"].ok is False
    assert checks["heads aggregated by a plain median"].value == "1 of 16"
    assert "kreiss_B" in checks["heads aggregated by a plain median"].detail
    table = health_table(list(checks.values()))
    assert list(table.columns) == ["name", "value", "ok", "detail"] and len(table) == 5
    html = render_report(run).read_text()
    assert 'id="health"' in html and html.index('id="health"') > html.index('id="claims"')
    assert "not claims" in html


def test_health_without_inputs_says_why(tmp_path):
    checks = numerical_health(RunTables(tmp_path))
    assert all(c.ok is None and c.value == "—" and c.detail for c in checks)
