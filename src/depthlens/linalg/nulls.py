"""Matched shuffle nulls for causal attention matrices (§A4).

Each null sample permutes the weights of every row among that row's allowed positions, so
row sums, the causal support and each row's multiset of weights are preserved exactly
(the values are moved, never recomputed).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InputError
from .causal import check_causal_stochastic

__all__ = ["NULL_MODES", "shuffle_null"]

NullMode = Literal["full", "sink", "spec"]
NULL_MODES: tuple[NullMode, ...] = ("full", "sink", "spec")


def _allowed(n: int, null_mode: NullMode) -> np.ndarray:
    """Boolean (n, n): positions each row may permute over (0-based rows and columns)."""
    row, col = np.indices((n, n))
    first = 0 if null_mode == "full" else 1
    last = row if null_mode in ("full", "sink") else row - 1
    return (col >= first) & (col <= last)


def shuffle_null(
    A: ArrayLike,
    null_mode: NullMode = "spec",
    n_samples: int = 16,
    *,
    rng: np.random.Generator,
) -> np.ndarray:
    """Draw matched shuffle nulls of causal attention matrices.

    Modes (1-based positions as in §A4): ``full`` permutes row i over {1..i};
    ``sink`` keeps ``A_i1`` and permutes over {2..i}; ``spec`` (default) keeps ``A_i1`` and
    ``A_ii`` and permutes over {2..i−1}, which keeps the exact spectrum of A and of
    ``B = A − P`` (the diagonal is untouched and the result stays triangular).

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        Causal row-stochastic matrices; every matrix and every row is shuffled independently.
    null_mode : {"full", "sink", "spec"}
        Which positions each row permutes over.
    n_samples : int
        Number of null samples S ≥ 1 per matrix.
    rng : numpy.random.Generator
        Source of randomness; the same generator state gives the same samples.

    Returns
    -------
    numpy.ndarray, shape (S, ..., n, n), float64
        Sample axis first, so ``out[s]`` is one null copy of the whole input batch. Every
        entry is an entry of the same row of ``A`` (bit-exact), so row sums, support and
        row multisets are preserved exactly.

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic, ``null_mode`` is unknown, ``n_samples < 1`` or
        ``rng`` is not a ``numpy.random.Generator``.

    Notes
    -----
    Vectorised: one uniform key per entry, an argsort per row with the fixed positions
    keyed to +inf (a stable sort keeps them in place). Cost O(S · size(A) · log n) time and
    O(S · size(A)) memory.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    >>> shuffle_null(A, "full", 2, rng=np.random.default_rng(0)).shape
    (2, 4, 4)
    """
    arr = check_causal_stochastic(A)
    if null_mode not in NULL_MODES:
        raise InputError(f"null_mode is {null_mode!r}; pass one of {', '.join(NULL_MODES)}.")
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) or n_samples < 1:
        raise InputError(f"n_samples is {n_samples!r}; pass a positive integer.")
    if not isinstance(rng, np.random.Generator):
        raise InputError(f"rng is a {type(rng).__name__}; pass a numpy.random.Generator, e.g. np.random.default_rng(seed).")
    n = arr.shape[-1]
    allowed = _allowed(n, null_mode)
    # base[i]: row i's allowed columns ascending, then its fixed columns ascending.
    base = np.argsort(~allowed, axis=-1, kind="stable")
    keys = np.where(allowed, rng.random((int(n_samples), *arr.shape)), np.inf)
    # perm[..., i, :]: the allowed columns of row i in random order, then the fixed ones ascending.
    perm = np.argsort(keys, axis=-1, kind="stable")
    # Entry base[i, k] receives the value at perm[i, k]; fixed columns map to themselves.
    source = np.take_along_axis(perm, np.broadcast_to(np.argsort(base, axis=-1), perm.shape), axis=-1)
    return np.take_along_axis(np.broadcast_to(arr, perm.shape), source, axis=-1)
