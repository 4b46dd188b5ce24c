"""Small statistical tools shared by the analyses: BH-FDR, sign test, robust aggregation.

Functions of arrays and tidy tables; exact (no resampling) unless the docstring says otherwise.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import special as _sp
from scipy import stats as _st

from .errors import InputError


def bh_qvalues(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg q-values (adjusted p-values) of a family of p-values.

    ``q_(i) = min_{j >= i} min(1, m p_(j) / j)`` over the sorted p-values; NaN entries are
    left out of the family and stay NaN. A hypothesis is rejected at FDR level ``α`` when
    ``q <= α``.

    Raises
    ------
    InputError
        If a p-value lies outside [0, 1].
    """
    arr = np.asarray(p, dtype=np.float64)
    out = np.full(arr.shape, np.nan)
    ok = ~np.isnan(arr)
    vals = arr[ok]
    if np.any((vals < 0) | (vals > 1)):
        raise InputError("p-values must lie in [0, 1]; check the test that produced them.")
    m = vals.size
    if m == 0:
        return out
    order = np.argsort(vals, kind="stable")
    scaled = vals[order] * m / np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1].clip(max=1.0)
    q = np.empty(m)
    q[order] = q_sorted
    out[ok] = q
    return out


def sign_test(x: np.ndarray) -> float:
    """Two-sided exact sign test of median zero; zeros are dropped.

    The binomial is symmetric, so the two-sided p of k positives among n is
    ``min(1, 2 P(X ≤ min(k, n − k)))``, X ~ Bin(n, 1/2): what :func:`scipy.stats.binomtest`
    returns, to rounding, from one regularised incomplete beta (microseconds, where binomtest's
    search takes a millisecond). Returns 1.0 when no non-zero value remains (no evidence either
    way).
    """
    arr = np.asarray(x, dtype=np.float64)
    arr = arr[~np.isnan(arr) & (arr != 0.0)]
    if arr.size == 0:
        return 1.0
    k = int((arr > 0).sum())
    return min(1.0, 2.0 * float(_sp.bdtr(min(k, arr.size - k), arr.size, 0.5)))


def log_median(x: np.ndarray) -> float:
    """``exp(median(log x))``: the median of logs used to aggregate scale quantities.

    For an odd count it equals the plain median; for an even count it is the geometric mean
    of the two middle values.

    Raises
    ------
    InputError
        If any value is not positive.
    """
    arr = np.asarray(x, dtype=np.float64)
    if arr.size == 0 or np.any(~(arr > 0)):
        raise InputError("log_median needs positive values; aggregate this quantity with a plain median.")
    return float(np.exp(np.median(np.log(arr))))


def spearman(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman rank correlation of ``x`` and ``y`` (mid-ranks for ties) and its two-sided
    p-value (SciPy's t approximation; exact enough from about 10 pairs on, a description
    below that)."""
    result = _st.spearmanr(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    return float(result.statistic), float(result.pvalue)


def head_rank_tests(chunks: pd.DataFrame, column: str = "delta_TR1", rank: str = "null_rank_TR1",
                    samples: str = "null_n") -> pd.DataFrame:
    """Per head, the median over chunks of ``column`` and the pooled exchangeability test of
    the head against its matched nulls (:func:`pooled_rank_test` of the per-chunk ``rank``
    among ``samples`` null samples), over the chunks where the rank is finite, with BH
    q-values over every head of the table (:func:`bh_qvalues`): columns ``layer``, ``head``,
    ``median``, ``n``, ``p``, ``q``. A head without a finite rank has NaN median and p = 1 (no
    evidence either way)."""
    frame = pd.DataFrame({"layer": chunks["layer"].to_numpy(), "head": chunks["head"].to_numpy(),
                          "value": pd.to_numeric(chunks[column], errors="coerce").to_numpy(dtype=np.float64),
                          "rank": pd.to_numeric(chunks[rank], errors="coerce").to_numpy(dtype=np.float64),
                          "samples": pd.to_numeric(chunks[samples], errors="coerce").to_numpy(dtype=np.float64)})
    keys = frame[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"])
    used = frame[~np.isnan(frame["rank"])]
    groups = used.groupby(["layer", "head"], sort=True)
    stats = pd.DataFrame({"median": groups["value"].median(), "n": groups.size(), "sum": groups["rank"].sum(),
                          "lo": groups["samples"].min(), "hi": groups["samples"].max()})
    stats["p"] = [_rank_sum_p(row.sum, (int(row.lo),) * int(row.n)) if row.lo == row.hi
                  else _group_rank_p(groups.get_group(row.Index)) for row in stats.itertuples()] if len(used) else []
    out = keys.merge(stats.reset_index(), on=["layer", "head"], how="left")
    out["n"] = out["n"].fillna(0).astype(int)
    out["p"] = out["p"].fillna(1.0)
    out = out[["layer", "head", "median", "n", "p"]].reset_index(drop=True)
    out["q"] = bh_qvalues(out["p"].to_numpy())
    return out


# ----------------------------------------------------------------------------- intervals
#: Two-sided level of every interval the claims read (each tail 2.5 %).
LEVEL = 0.95


def median_interval(x: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Distribution-free interval for the median of ``x``: the order statistics
    ``[x_(k), x_(n−k+1)]`` with the largest ``k`` whose coverage ``1 − 2·P(Bin(n, ½) ≤ k−1)``
    is at least ``level`` (exact for continuous data, conservative with ties). NaN values are
    dropped; ``(−inf, inf)`` when no ``k`` reaches the level (n < 6 at 95 %).

    Examples
    --------
    >>> median_interval(np.arange(10.0))
    (1.0, 8.0)
    >>> median_interval(np.arange(5.0))
    (-inf, inf)
    """
    arr = np.sort(np.asarray(x, dtype=np.float64)[~np.isnan(np.asarray(x, dtype=np.float64))])
    n = arr.size
    if n == 0:
        return -np.inf, np.inf
    tail = (1.0 - level) / 2.0
    cdf = _st.binom.cdf(np.arange(n), n, 0.5)  # cdf[k-1] = P(B <= k-1)
    ok = np.flatnonzero(cdf <= tail + 1e-12)
    if ok.size == 0:
        return -np.inf, np.inf
    k = int(ok[-1]) + 1
    return float(arr[k - 1]), float(arr[n - k])


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Percentile-bootstrap interval: the ``(1 − level)/2`` and ``(1 + level)/2`` quantiles of
    bootstrap replicate values (NumPy's default linear interpolation; NaN values dropped).
    ``(−inf, inf)`` with fewer than ``⌈2/(1 − level)⌉`` values (40 at 95 %), too few to hold a
    replicate in each tail.

    Examples
    --------
    >>> lo, hi = percentile_interval(np.arange(41.0))  # positions 0.025 × 40 and 0.975 × 40
    >>> round(lo, 12), hi
    (1.0, 39.0)
    >>> percentile_interval(np.arange(39.0))
    (-inf, inf)
    """
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    if arr.size < int(np.ceil(2.0 / (1.0 - level) - 1e-9)):
        return -np.inf, np.inf
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(arr, [tail, 1.0 - tail])
    return float(lo), float(hi)


def proportion_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Clopper–Pearson (exact binomial) interval of a proportion ``k / n``; ``(0, 1)`` when
    ``n = 0``. Coverage is at least ``level`` for every true proportion.

    Examples
    --------
    >>> lo, hi = proportion_interval(0, 60)
    >>> lo, round(hi, 4)
    (0.0, 0.0596)
    """
    if n <= 0:
        return 0.0, 1.0
    tail = (1.0 - level) / 2.0
    lo = 0.0 if k <= 0 else float(_st.beta.ppf(tail, k, n - k + 1))
    hi = 1.0 if k >= n else float(_st.beta.ppf(1.0 - tail, k + 1, n - k))
    return lo, hi


def spearman_interval(rho: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Interval of a Spearman correlation ``rho`` over ``n`` pairs: Fisher's z with the
    Bonett–Wright standard error ``√((1 + ρ²/2)/(n − 3))`` (an approximation, checked by the
    claims' calibration); ``(−1, 1)`` for ``n ≤ 3``.

    Examples
    --------
    >>> lo, hi = spearman_interval(0.0, 28)
    >>> round(lo, 3), round(hi, 3)
    (-0.373, 0.373)
    """
    if n <= 3 or not np.isfinite(rho):
        return -1.0, 1.0
    r = float(np.clip(rho, -0.999999, 0.999999))
    se = np.sqrt((1.0 + r * r / 2.0) / (n - 3))
    z = _st.norm.ppf(0.5 + level / 2.0)
    return float(np.tanh(np.arctanh(r) - z * se)), float(np.tanh(np.arctanh(r) + z * se))


def pooled_rank_test(ranks: np.ndarray, samples: np.ndarray) -> float:
    """Two-sided exact test that an observed value is exchangeable with its null samples,
    pooled over independent units (chunks).

    Unit ``c`` contributes the rank ``r_c`` of the observation among its ``S_c`` null samples
    (the number of samples below it, ties counting one half). Under exchangeability ``r_c`` is
    uniform on ``{0, …, S_c}``; the statistic is ``Σ r_c`` and its null distribution the
    convolution of those uniforms, computed exactly on the half-integer grid. The p-value is
    ``min(1, 2·min(P(Σ ≥ obs), P(Σ ≤ obs)))``; its smallest attainable value is
    ``2·Π_c 1/(S_c + 1)`` (2.9e-10 for 8 chunks of 16 samples), so a handful of chunks can pass
    a Benjamini–Hochberg correction over hundreds of heads. NaN ranks are dropped; 1.0 when
    none is left.

    Examples
    --------
    >>> p = pooled_rank_test(np.array([8.0] * 6), np.array([8] * 6))  # above every null, 6 chunks
    >>> bool(np.isclose(p, 2 / 9**6))
    True
    """
    r = np.asarray(ranks, dtype=np.float64)
    s = np.asarray(samples, dtype=np.int64)
    ok = ~np.isnan(r)
    if not ok.any():
        return 1.0
    return _rank_sum_p(float(r[ok].sum()), tuple(sorted(int(x) for x in s[ok])))


def _group_rank_p(group: pd.DataFrame) -> float:
    """:func:`pooled_rank_test` of one head's chunks (columns ``rank`` and ``samples``)."""
    return pooled_rank_test(group["rank"].to_numpy(), group["samples"].to_numpy().astype(np.int64))


def _rank_sum_p(total: float, samples: tuple[int, ...]) -> float:
    """Two-sided p of the rank sum ``total`` over units of ``samples`` null samples each."""
    upper, lower = _rank_sum_tails(samples)
    obs = int(round(2.0 * total))
    up = float(upper[obs]) if 0 <= obs < upper.size else (1.0 if obs < 0 else 0.0)
    down = float(lower[obs]) if 0 <= obs < lower.size else (0.0 if obs < 0 else 1.0)
    return min(1.0, 2.0 * min(up, down))


@lru_cache(maxsize=256)
def _rank_sum_tails(samples: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(P(Σ ≥ k), P(Σ ≤ k))`` for every doubled rank sum ``k`` of independent uniform ranks
    on ``{0, …, S_c}`` (doubled: a unit takes the even values ``0, 2, …, 2 S_c``)."""
    dist = np.ones(1)
    for sc in samples:
        step = np.zeros(2 * sc + 1)
        step[::2] = 1.0 / (sc + 1)
        dist = np.convolve(dist, step)
    return np.cumsum(dist[::-1])[::-1], np.cumsum(dist)


def trend_interval(counts: np.ndarray, totals: np.ndarray, draws: int = 999, seed: int = 0
                   ) -> tuple[float, float, float]:
    """Spearman ρ between order and ``counts`` (of ``totals`` trials each, e.g. significant
    boundaries of those tested per checkpoint) with a parametric-bootstrap 95 % interval:
    each replicate redraws every count from ``Binomial(total, count/total)``, so the interval
    is the trend's resampling spread. ρ is 0 for a constant series (also in replicates).
    Monte Carlo with ``draws`` replicates from ``seed``; deterministic for a given input.

    Examples
    --------
    >>> rho, lo, hi = trend_interval(np.array([0, 14, 24]), np.array([64, 64, 64]))
    >>> rho, lo, hi  # some replicates swap the last two counts
    (1.0, 0.5, 1.0)
    """
    k = np.asarray(counts, dtype=np.float64)
    n = np.asarray(totals, dtype=np.int64)
    order = np.arange(k.size, dtype=np.float64)

    def rho(values: np.ndarray) -> np.ndarray:
        ranks = _st.rankdata(values, axis=-1)
        centred = ranks - ranks.mean(axis=-1, keepdims=True)
        x = order - order.mean()
        denom = np.sqrt((centred**2).sum(axis=-1) * (x**2).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            r = (centred * x).sum(axis=-1) / denom
        return np.where(denom > 0, r, 0.0)

    p = np.clip(k / np.maximum(n, 1), 0.0, 1.0)
    boot = np.random.default_rng(seed).binomial(n, p, size=(draws, k.size)).astype(np.float64)
    reps = rho(boot)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    return float(rho(k[None, :])[0]), float(lo), float(hi)


# ----------------------------------------------------------------------------- induction ratios (METHODS A5)
#: Per-sequence excess reserves of the induction phase
#: (:func:`~depthlens.attention.analysis.induction_row`), aggregated per routing head by the
#: median over probe sequences.
INDUCTION = ("delta_TR1_first_copy", "delta_TR1_second_copy", "delta_TR1_control")
#: Excess reserves at or below this (nats) are zero to the accuracy of the Kreiss search (about
#: 1e-10 relative per value): no induction ratio is taken over them. A head that attends only
#: to BOS, or one pattern whatever the shuffle, has an excess of about ±1e-15 in float64.
EXCESS_ZERO = 1e-8


def aggregate_induction(table: pd.DataFrame) -> pd.DataFrame:
    """Per routing head, from the :func:`~depthlens.attention.analysis.induction_row` rows of
    its probe sequences: the median over sequences of each excess reserve (:data:`INDUCTION`),
    ``induction_ratio`` = second copy / first copy where the first-copy excess is positive
    (above :data:`EXCESS_ZERO`), and ``induction_ratio_control`` = second copy /
    length-matched control where the control excess is positive (NaN otherwise)."""
    out = table.groupby(["layer", "head"])[list(INDUCTION)].median().reset_index()
    second = out["delta_TR1_second_copy"]
    for name, base in (("induction_ratio", "delta_TR1_first_copy"), ("induction_ratio_control", "delta_TR1_control")):
        out[name] = (second / out[base]).where(out[base] > EXCESS_ZERO)
    return out


def induction_ratio_replicates(seqs: pd.DataFrame, base: str = "delta_TR1_control", draws: int = 1000,
                               seed: int = 0) -> np.ndarray:
    """Bootstrap replicates of the median over routing heads of the induction ratio
    (``delta_TR1_second_copy`` / ``base``, as :func:`aggregate_induction` forms it per head),
    from the per-sequence rows ``seqs`` (the ``induction_seqs`` table: ``layer``, ``head``,
    ``seq`` and the :data:`INDUCTION` columns).

    Each replicate draws the probe sequences with replacement, the same draw for every head
    (the heads read the same sequences), and the heads with replacement, then recomputes each
    drawn head's medians over the drawn sequences, its ratio (NaN where the ``base`` median is
    not above :data:`EXCESS_ZERO`) and the median over heads of the defined ratios (NaN when
    none is). So the spread holds both the sequences' and the heads' sampling. With the
    identity draw a replicate equals the statistic itself. Seeded by ``seed``: deterministic.

    Examples
    --------
    >>> seqs = pd.DataFrame({"layer": 0, "head": [0, 0, 1, 1], "seq": [0, 1, 0, 1],
    ...                      "delta_TR1_second_copy": [0.4, 0.4, 0.3, 0.3], "delta_TR1_control": 0.2,
    ...                      "delta_TR1_first_copy": 0.2})
    >>> np.unique(induction_ratio_replicates(seqs, draws=50)).round(12).tolist()
    [1.5, 1.75, 2.0]
    """
    def wide(column: str) -> np.ndarray:
        return seqs.set_index(["layer", "head", "seq"])[column].unstack("seq").to_numpy(dtype=np.float64)

    second, reference = wide("delta_TR1_second_copy"), wide(base)
    heads, n_seqs = second.shape
    rng = np.random.default_rng(seed)
    at_seqs = rng.integers(0, n_seqs, (draws, n_seqs))
    at_heads = rng.integers(0, heads, (draws, heads))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices (failed rows) give NaN
        top = _nanmedian(second[:, at_seqs], axis=2)
        bottom = _nanmedian(reference[:, at_seqs], axis=2)
        ratio = np.where(bottom > EXCESS_ZERO, top / np.where(bottom > EXCESS_ZERO, bottom, 1.0), np.nan)
        return _nanmedian(ratio[at_heads, np.arange(draws)[:, None]], axis=1)


def _nanmedian(x: np.ndarray, axis: int) -> np.ndarray:
    """``np.nanmedian``, through the several times faster ``np.median`` when nothing is NaN."""
    return np.nanmedian(x, axis=axis) if np.isnan(x).any() else np.median(x, axis=axis)
