"""Statistics against scipy and hand computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from depthlens.errors import InputError
from depthlens.stats import bh_qvalues, log_median, sign_test


def test_bh_matches_scipy(rng: np.random.Generator) -> None:
    p = np.concatenate([rng.uniform(size=50), rng.uniform(0, 1e-3, size=10)])
    np.testing.assert_allclose(bh_qvalues(p), stats.false_discovery_control(p, method="bh"), rtol=1e-13)


def test_bh_hand_example_and_nan() -> None:
    q = bh_qvalues(np.array([0.01, np.nan, 0.04, 0.03]))
    # m = 3: sorted 0.01, 0.03, 0.04 -> 0.03, 0.045, 0.04 -> monotone 0.03, 0.04, 0.04
    np.testing.assert_allclose(q[[0, 2, 3]], [0.03, 0.04, 0.04])
    assert np.isnan(q[1])
    with pytest.raises(InputError):
        bh_qvalues(np.array([1.5]))


def test_sign_test() -> None:
    assert sign_test(np.array([1.0, 2.0, 3.0, 0.0])) == pytest.approx(0.25)  # 3 of 3 positive: 2 * 1/8
    assert sign_test(np.zeros(4)) == 1.0
    x = np.array([1, -1, 2, 3, 4, -5, 6, 7.0])
    assert sign_test(x) == pytest.approx(stats.binomtest(6, 8).pvalue)


def test_log_median() -> None:
    assert log_median(np.array([1.0, 100.0, 10.0])) == pytest.approx(10.0)
    assert log_median(np.array([1.0, 4.0])) == pytest.approx(2.0)
    with pytest.raises(InputError):
        log_median(np.array([1.0, 0.0]))
