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
    for n in (1, 2, 5, 20, 21, 162, 500):  # the closed form against scipy's search, every count
        for k in range(n + 1):
            signs = np.r_[np.ones(k), -np.ones(n - k)]
            assert sign_test(signs) == pytest.approx(stats.binomtest(k, n).pvalue, rel=1e-10, abs=0)


def test_log_median() -> None:
    assert log_median(np.array([1.0, 100.0, 10.0])) == pytest.approx(10.0)
    assert log_median(np.array([1.0, 4.0])) == pytest.approx(2.0)
    with pytest.raises(InputError):
        log_median(np.array([1.0, 0.0]))


def test_median_interval_is_the_exact_order_statistic_interval() -> None:
    from depthlens.stats import median_interval

    for n in range(1, 40):
        x = np.arange(float(n))
        lo, hi = median_interval(x)
        if n < 6:
            assert (lo, hi) == (-np.inf, np.inf)
            continue
        k = int(lo) + 1  # [x_(k), x_(n-k+1)]
        assert hi == n - k
        coverage = 1 - 2 * stats.binom.cdf(k - 1, n, 0.5)
        assert coverage >= 0.95 and 1 - 2 * stats.binom.cdf(k, n, 0.5) < 0.95  # the narrowest that covers


def test_proportion_interval_matches_scipy_clopper_pearson() -> None:
    from depthlens.stats import proportion_interval

    for k, n in ((0, 10), (3, 10), (10, 10), (7, 60)):
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        assert proportion_interval(k, n) == pytest.approx((ci.low, ci.high))


def test_pooled_rank_test_against_enumeration_and_its_floor() -> None:
    import itertools

    from depthlens.stats import pooled_rank_test

    rng = np.random.default_rng(0)
    for _ in range(20):
        samples = rng.integers(1, 4, size=3)
        ranks = np.array([rng.integers(0, s + 1) for s in samples], dtype=float)
        sums = np.array([sum(r) for r in itertools.product(*(range(s + 1) for s in samples))], dtype=float)
        want = min(1.0, 2 * min(np.mean(sums >= ranks.sum()), np.mean(sums <= ranks.sum())))
        assert pooled_rank_test(ranks, samples) == pytest.approx(want)
    assert pooled_rank_test(np.full(8, 16.0), np.full(8, 16)) == pytest.approx(2 / 17**8)
    assert pooled_rank_test(np.array([np.nan]), np.array([4])) == 1.0


def test_spearman_interval_covers_under_the_null() -> None:
    from depthlens.stats import spearman, spearman_interval

    rng = np.random.default_rng(1)
    covered = [lo <= 0 <= hi for lo, hi in (spearman_interval(spearman(*rng.normal(size=(2, 20)))[0], 20)
                                            for _ in range(400))]
    assert np.mean(covered) >= 0.93


def test_trend_interval_is_the_spread_of_binomial_redraws() -> None:
    from depthlens.stats import trend_interval

    assert trend_interval(np.array([5, 5, 5]), np.array([60, 60, 60]))[0] == 0.0  # flat
    rho, lo, hi = trend_interval(np.array([4, 5, 6]), np.array([60, 60, 60]))
    assert rho == 1.0 and lo < 0 < hi  # three increasing counts, inside their resampling spread


def test_percentile_interval_is_the_interpolated_order_statistics() -> None:
    """Against the 2.5 and 97.5 percentiles written out (linear interpolation between order
    statistics, as numpy's default and R's type 7), NaN dropped, and unbounded below 40 values."""
    from depthlens.stats import percentile_interval

    def by_hand(x: list[float], q: float) -> float:
        x = sorted(x)
        h = (len(x) - 1) * q
        j = int(h)
        return x[j] + (h - j) * (x[min(j + 1, len(x) - 1)] - x[j])

    rng = np.random.default_rng(2)
    for n in (40, 41, 57, 150, 1000):
        x = rng.lognormal(size=n)
        lo, hi = percentile_interval(np.r_[x, np.nan, np.nan])
        assert (lo, hi) == pytest.approx((by_hand(list(x), 0.025), by_hand(list(x), 0.975)), rel=1e-14)
    assert percentile_interval(np.arange(41.0)) == pytest.approx((1.0, 39.0), rel=1e-14)
    assert percentile_interval(np.r_[np.arange(39.0), np.nan]) == (-np.inf, np.inf)
    assert percentile_interval(np.arange(19.0), level=0.9) == (-np.inf, np.inf)  # 20 values needed at 90 %
    assert percentile_interval(np.arange(20.0), level=0.9) == pytest.approx((0.95, 18.05))
