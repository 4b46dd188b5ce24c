"""Pattern features of causal attention matrices (METHODS A3, first rows of the table).

All functions take a batch of causal row-stochastic matrices ``(..., n, n)`` in float64 and
return one value per matrix ``(...)``. They are exact reductions (no iteration); the only
rounding is float64 summation.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError


def _batch(A: np.ndarray) -> np.ndarray:
    arr = np.asarray(A, dtype=np.float64)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2] or arr.shape[-1] < 2:
        raise InputError(f"attention batch has shape {arr.shape}; expected (..., n, n) with n >= 2.")
    return arr


def sink_mass(A: np.ndarray) -> np.ndarray:
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
    return arr[..., 1:, 0].mean(axis=-1)


def prev_weight(A: np.ndarray) -> np.ndarray:
    """Mean over rows ``i >= 2`` (1-based) of the weight on the previous token ``A[i, i-1]``."""
    arr = _batch(A)
    return np.diagonal(arr, offset=-1, axis1=-2, axis2=-1).mean(axis=-1)


def row_entropy(A: np.ndarray) -> np.ndarray:
    """Mean Shannon entropy (nats) over all ``n`` rows, with ``0 log 0 = 0``.

    Row 1 always has entropy 0 (it attends only to the first token), so a uniform causal
    pattern of size n has mean entropy ``(1/n) Σ_i log i``.
    """
    arr = _batch(A)
    logs = np.log(np.where(arr > 0.0, arr, 1.0))
    return -(arr * logs).sum(axis=-1).mean(axis=-1)
