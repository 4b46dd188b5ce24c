"""Pattern features of causal attention matrices (§A3, first rows of the table).

All functions take a batch of causal row-stochastic matrices ``(..., n, n)`` in float64 and
return one value per matrix ``(...)``. They are exact reductions (no iteration); the only
rounding is float64 summation. Each averages over rows (query positions); ``rows``, a bool
mask of the ``n`` rows (the analysed positions of a prompt), restricts the average to those
rows, and gives NaN where no row the feature reads is among them.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def _batch(A: np.ndarray) -> np.ndarray:
    arr = np.asarray(A, dtype=np.float64)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2] or arr.shape[-1] < 2:
        raise InputError(f"attention batch has shape {arr.shape}; expected (..., n, n) with n >= 2.")
    return arr


def selected_rows(rows: np.ndarray, n: int, first: int = 0) -> np.ndarray:
    """The indices ``i >= first`` where the bool mask ``rows`` (n,) is set.

    Raises
    ------
    InputError
        If ``rows`` is not a bool mask of length ``n``.
    """
    mask = np.asarray(rows)
    if mask.dtype != bool or mask.shape != (n,):
        raise InputError(f"rows has dtype {mask.dtype} and shape {mask.shape}; pass a bool mask of the {n} rows.")
    return np.flatnonzero(mask[first:]) + first


def row_mean(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Mean over the last axis of ``values`` at ``index``; NaN (of the batch shape) for no index."""
    if index.size == 0:
        return np.full(values.shape[:-1], np.nan)
    return values[..., index].mean(axis=-1)


def sink_mass(A: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Mean over rows ``i >= 2`` (1-based) of the weight on the first token, ``A[i, 1]``.

    Row 1 is excluded because causality forces ``A[1, 1] = 1``.

    Examples
    --------
    >>> import numpy as np
    >>> P = np.zeros((4, 4)); P[:, 0] = 1.0
    >>> float(sink_mass(P))
    1.0
    """
    arr = _batch(A)
    if rows is not None:
        return row_mean(arr[..., :, 0], selected_rows(rows, arr.shape[-1], 1))
    return arr[..., 1:, 0].mean(axis=-1)


def prev_weight(A: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Mean over rows ``i >= 2`` (1-based) of the weight on the previous token ``A[i, i-1]``."""
    arr = _batch(A)
    diagonal = np.diagonal(arr, offset=-1, axis1=-2, axis2=-1)  # entry i - 1 is row i's
    if rows is not None:
        return row_mean(diagonal, selected_rows(rows, arr.shape[-1], 1) - 1)
    return diagonal.mean(axis=-1)


def row_entropy(A: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Mean Shannon entropy (nats) over all ``n`` rows, with ``0 log 0 = 0``.

    Row 1 always has entropy 0 (it attends only to the first token), so a uniform causal
    pattern of size n has mean entropy ``(1/n) Σ_i log i``.
    """
    arr = _batch(A)
    logs = np.log(np.where(arr > 0.0, arr, 1.0))
    if rows is not None:
        return -row_mean((arr * logs).sum(axis=-1), selected_rows(rows, arr.shape[-1]))
    return -(arr * logs).sum(axis=-1).mean(axis=-1)
