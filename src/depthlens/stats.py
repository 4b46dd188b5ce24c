"""Small statistical tools shared by the analyses: BH-FDR, sign test, robust aggregation.

Functions of arrays and tidy tables; exact (no resampling) unless the docstring says otherwise.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
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

    Returns 1.0 when no non-zero value remains (no evidence either way).
    """
    arr = np.asarray(x, dtype=np.float64)
    arr = arr[~np.isnan(arr) & (arr != 0.0)]
    if arr.size == 0:
        return 1.0
    return float(_st.binomtest(int((arr > 0).sum()), arr.size, 0.5).pvalue)


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


def head_sign_tests(chunks: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per head, the median over chunks of ``column`` and the two-sided exact sign test of a
    zero median (:func:`sign_test`) over the chunks where it is finite, with BH q-values over
    every head (:func:`bh_qvalues`): columns ``layer``, ``head``, ``median``, ``n``, ``p``,
    ``q``. A head without a finite value has NaN median and p = 1 (no evidence either way)."""
    import pandas as pd

    rows = []
    for (layer, head), group in chunks.groupby(["layer", "head"], sort=True):
        values = pd.to_numeric(group[column], errors="coerce").to_numpy(dtype=np.float64)
        values = values[~np.isnan(values)]
        rows.append({"layer": layer, "head": head, "median": float(np.median(values)) if values.size else np.nan,
                     "n": int(values.size), "p": sign_test(values)})
    out = pd.DataFrame(rows, columns=["layer", "head", "median", "n", "p"])
    out["q"] = bh_qvalues(out["p"].to_numpy())
    return out
