"""The operating characteristic of a claim (:func:`depthlens.report.calibration.operating_characteristic`)
against an exact computation, and the strengths of the planted worlds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from depthlens.report.calibration import SCENARIOS, operating_characteristic
from depthlens.report.claims import load_claims, region
from depthlens.report.worlds import mix

# The full leg only: simulated worlds judged by the claims' code, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg


def _claim(claim_id: str):
    return next(c for c in load_claims() if c.id == claim_id)


def _exact_supported(claim, boundaries: int, rate: float) -> float:
    """P(supported) of B6 at ``boundaries`` boundaries each significant with probability ``rate``:
    the binomial sum over the counts whose value passes and whose Clopper–Pearson 95 % interval
    (scipy's beta quantiles) stays out of the falsified region."""
    total = 0.0
    for k in range(boundaries + 1):
        hi = 1.0 if k == boundaries else stats.beta.ppf(0.975, k + 1, boundaries - k)
        passes = region(claim, k / boundaries) == "pass"
        if passes and region(claim, hi) != "fail":
            total += stats.binom.pmf(k, boundaries, rate)
    return total


def test_b6_characteristic_is_the_exact_binomial_one():
    claim = _claim("B6-coupling-init")
    boundaries = SCENARIOS[claim.statistic].default["boundaries"]
    strengths = (0.0, 0.9, 0.95, 1.0)
    draws = 300
    table = operating_characteristic(claim, strengths, draws=draws, seed=3)
    for strength, observed in zip(strengths, table["p_supported"]):
        exact = _exact_supported(claim, boundaries, mix(0.3, 0.01, strength, low=0.0))
        tolerance = 4.0 * math.sqrt(exact * (1.0 - exact) / draws) + 2.0 / draws
        assert abs(observed - exact) <= tolerance, (strength, observed, exact)
    assert table["p_supported"].iloc[0] == 0.0 and table["p_supported"].iloc[-1] > 0.7
    assert (table["p_supported_marginal"] <= table["p_supported"]).all()
    assert np.allclose(table[["p_supported", "p_falsified", "p_inconclusive"]].sum(axis=1), 1.0)


@pytest.mark.parametrize("claim_id", ["A2-eig-gap-contrast", "B2-funnel-trained", "C3-coupling-trend"])
def test_typical_value_crosses_the_threshold_between_the_worlds(claim_id):
    """The typical value moves from the null world's side of the threshold to the effect world's
    side, and the verdicts follow it."""
    claim = _claim(claim_id)
    table = operating_characteristic(claim, (0.0, 0.5, 1.0, 2.0), draws=40)
    assert region(claim, table["value"].iloc[0]) != "pass"
    assert region(claim, table["value"].iloc[2]) == "pass"
    assert table["p_supported"].iloc[0] <= 0.05 and table["p_supported"].iloc[2] >= 0.5
    steps = np.diff(table["value"].to_numpy()) * np.sign(table["value"].iloc[2] - table["value"].iloc[0])
    assert np.all(steps >= -0.01 * np.abs(steps).sum()), steps  # monotone up to the median's noise at saturation


def test_no_scenario_no_characteristic():
    claim = _claim("B6-coupling-init")
    other = type(claim)(**{**claim.__dict__, "statistic": "coupling_sign_vs_symmetry"})
    assert "coupling_sign_vs_symmetry" not in SCENARIOS
    assert operating_characteristic(other, (0.0,), draws=1) is None
