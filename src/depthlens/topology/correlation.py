"""Streaming Pearson correlation of residual coordinates and its signed top-k graph (§B5).

Nodes are the d coordinates of the residual stream at one boundary; observations are token
activations, added batch by batch. The graph keeps, per node, its k strongest correlations
in absolute value, signed, symmetrised by union.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import blas

from ..errors import InputError
from ..linalg._checks import as_square

__all__ = ["Edges", "RunningMoments", "topk_graph"]


class RunningMoments:
    """Streaming mean, covariance and Pearson correlation of ``d`` variables.

    Observations arrive in batches ``X`` of shape ``(n_obs, d)`` (any real dtype; accumulated
    in float64). Every batch is first shifted by a fixed vector ``K`` (the mean of the first
    batch), then centred on its own mean and merged into the running state by the pairwise
    update of Chan, Golub and LeVeque::

        n = n_a + n_b,   δ = m_b − m_a,   m = m_a + δ n_b / n,
        M = M_a + M_b + δ δᵀ n_a n_b / n,

    where ``M`` is the centred co-moment matrix ``Σ (x − m)(x − m)ᵀ``. No raw sum of squares
    is ever formed, and the shift keeps the running means small, so a large common offset
    (``x + 1e6``) costs no accuracy: the result
    agrees with the two-pass ``numpy.corrcoef`` of the concatenated data to rounding
    (about ``1e-14`` for well-scaled data, tested to ``1e-12`` absolute), whatever the batch
    split. Only the upper triangle of ``M`` is stored and updated, in place, by the BLAS
    symmetric rank-k update ``dsyrk`` (``M += X_cᵀ X_c``, ``X_c`` the centred batch) and
    rank-1 update ``dsyr`` (``M += δ δᵀ n_a n_b / n``); the lower triangle is its mirror
    image, so the covariance and correlation are exactly symmetric. The result is not bitwise that of the dense
    ``M + (X_cᵀ X_c + δ δᵀ n_a n_b / n)`` update used before (BLAS rounds in another order);
    the two correlations differ by about ``1e-15`` at most at ``d = 4096`` over 64 batches, as
    does either from ``numpy.corrcoef`` (``benchmarks/bench_topology.py`` prints both).

    Parameters
    ----------
    d : int
        Number of variables (columns of every batch).
    out : ndarray, optional
        A Fortran-ordered ``(d, d)`` float64 array of zeros that holds the co-moment, updated
        in place (e.g. the transpose of a memory map's ``(d, d)`` slice, so that the moments of
        many boundaries at ``d = 4096``, 134 MB each, need not fit in memory together).

    Attributes
    ----------
    count : int
        Observations added so far.
    mean : numpy.ndarray, shape (d,)
        Running mean (a copy).
    constant : numpy.ndarray of bool, shape (d,)
        Columns whose every observed value is identical (tracked exactly through the running
        minimum and maximum, so rounding in the mean cannot hide or fake one).

    Notes
    -----
    Cost per batch ``O(n_obs d²)`` (one BLAS ``dsyrk``, half the flops of ``XᵀX``, with no
    ``d × d`` temporaries), memory ``O(d²)``.

    Examples
    --------
    >>> rm = RunningMoments(3)
    >>> rm.update(np.random.default_rng(0).normal(size=(50, 3)))
    >>> rm.correlation().shape
    (3, 3)
    """

    def __init__(self, d: int, out: np.ndarray | None = None) -> None:
        if int(d) != d or d < 1:
            raise InputError(f"RunningMoments needs a positive integer d, got {d!r}; pass the number of columns.")
        self._d = int(d)
        self._n = 0
        self._shift = np.zeros(self._d)
        self._mean = np.zeros(self._d)
        if out is not None and (out.shape != (self._d, self._d) or out.dtype != np.float64 or not out.flags.f_contiguous
                                or not out.flags.writeable):
            raise InputError(f"out must be a writable Fortran-ordered ({self._d}, {self._d}) float64 array of zeros.")
        # the upper triangle, updated in place by BLAS
        self._comoment = np.zeros((self._d, self._d), order="F") if out is None else out
        self._min = np.full(self._d, np.inf)
        self._max = np.full(self._d, -np.inf)

    @property
    def d(self) -> int:
        """Number of variables."""
        return self._d

    @property
    def count(self) -> int:
        """Observations added so far."""
        return self._n

    @property
    def mean(self) -> np.ndarray:
        """Running mean, shape ``(d,)`` (a copy)."""
        return self._shift + self._mean

    @property
    def constant(self) -> np.ndarray:
        """Boolean mask of columns with a single observed value (all False before any data)."""
        return self._max == self._min

    def update(self, X: ArrayLike) -> None:
        """Add a batch of observations.

        Parameters
        ----------
        X : array_like, shape (n_obs, d)
            Real observations, one row each; converted to float64. An empty batch is a no-op.

        Raises
        ------
        InputError
            If ``X`` is not a real 2-d array with ``d`` columns, or holds NaN or infinity.
        """
        arr = np.asarray(X)
        if arr.dtype.kind not in "biuf" or arr.ndim != 2 or arr.shape[1] != self._d:
            raise InputError(
                f"batch has shape {arr.shape} and dtype {arr.dtype}; pass a real (n_obs, {self._d}) array."
            )
        if arr.shape[0] == 0:
            return
        arr = arr.astype(np.float64, copy=False)
        if not np.all(np.isfinite(arr)):
            raise InputError("batch holds NaN or infinity; drop or repair those observations first.")
        if self._n == 0:
            self._shift = arr.mean(axis=0)
        n_b = arr.shape[0]
        shifted = arr - self._shift
        m_b = shifted.mean(axis=0)
        centred = shifted - m_b
        n = self._n + n_b
        delta = m_b - self._mean
        self._comoment = blas.dsyrk(1.0, centred.T, beta=1.0, c=self._comoment, trans=0, lower=0, overwrite_c=1)
        self._comoment = blas.dsyr(self._n * n_b / n, delta, a=self._comoment, lower=0, overwrite_a=1)
        self._mean += delta * (n_b / n)
        self._n = n
        np.minimum(self._min, arr.min(axis=0), out=self._min)
        np.maximum(self._max, arr.max(axis=0), out=self._max)

    def covariance(self, ddof: int = 1) -> np.ndarray:
        """Covariance matrix ``M / (count − ddof)``, shape ``(d, d)``, exactly symmetric.

        Rows and columns of constant columns are exactly 0 (their true value).

        Raises
        ------
        InputError
            If ``count <= ddof``.
        """
        if self._n <= ddof:
            raise InputError(f"covariance needs more than {ddof} observations, got {self._n}; add more data.")
        upper = np.triu(self._comoment)
        cov = upper + upper.T
        cov[np.diag_indices(self._d)] = np.diag(upper)
        cov /= self._n - ddof
        const = self.constant
        cov[const, :] = 0.0
        cov[:, const] = 0.0
        return cov

    def correlation(self) -> np.ndarray:
        """Pearson correlation matrix, shape ``(d, d)``, exactly symmetric, never NaN.

        A constant column has no defined correlation; it gets 0 off the diagonal and 1 on it
        (so it carries no edge in :func:`topk_graph`), and is flagged in :attr:`constant`.
        Entries are clipped to ``[-1, 1]`` against rounding.

        Raises
        ------
        InputError
            If fewer than 2 observations were added.
        """
        cov = self.covariance(ddof=1)
        std = np.sqrt(np.diag(cov))
        scale = np.where(self.constant, 1.0, std)
        cov /= np.outer(scale, scale)  # s_i s_j = s_j s_i exactly: the result stays symmetric
        np.clip(cov, -1.0, 1.0, out=cov)
        np.fill_diagonal(cov, 1.0)
        return cov


@dataclass(frozen=True)
class Edges:
    """Undirected signed edges of a graph on nodes ``0 .. n−1``.

    Attributes
    ----------
    i, j : numpy.ndarray of int64, shape (m,)
        Endpoints with ``i < j``, sorted by ``(i, j)``, no duplicates.
    weight : numpy.ndarray of float64, shape (m,)
        Signed, finite, non-zero weights (correlations ``r_ij``).
    """

    i: np.ndarray
    j: np.ndarray
    weight: np.ndarray

    def __len__(self) -> int:
        return int(self.weight.shape[0])


def topk_graph(R: ArrayLike, k: int = 20) -> Edges:
    """Signed top-k graph of a correlation matrix, symmetrised by union.

    Node ``i`` nominates the ``k`` off-diagonal ``j`` with the largest ``|R_ij|``; the edge
    ``{i, j}`` is kept when either endpoint nominates the other, with weight ``R_ij``.

    Parameters
    ----------
    R : array_like, shape (d, d)
        Symmetric (to ``1e-10`` absolute), finite correlation matrix.
    k : int
        Neighbours nominated per node, ``1 <= k``; values ``>= d − 1`` keep every pair.

    Returns
    -------
    Edges
        Pairs ``i < j`` sorted by ``(i, j)``; edges with ``R_ij = 0`` exactly are dropped
        (they carry no sign; constant columns produce them).

    Raises
    ------
    InputError
        If ``R`` is not a finite symmetric square matrix or ``k`` is not a positive integer.

    Notes
    -----
    Ties in ``|R_ij|`` are broken towards the smaller column index (as a stable sort by
    decreasing ``|R_ij|`` would), so the graph is deterministic. Exact: each row's ``k``-th
    largest ``|R_ij|`` comes from a selection (``numpy.partition``), every larger entry is
    nominated, and the entries equal to it fill the remaining places in column order. Cost
    ``O(d²)`` time and memory.
    """
    arr = as_square(R, "R")
    if arr.dtype.kind == "c":
        raise InputError("R is complex; pass a real correlation matrix.")
    if int(k) != k or k < 1:
        raise InputError(f"k must be a positive integer, got {k!r}.")
    if not np.all(np.abs(arr - arr.T) <= 1e-10):
        raise InputError("R is not symmetric; pass a correlation matrix (e.g. RunningMoments.correlation()).")
    d = arr.shape[0]
    rows, cols = _nominations(np.abs(arr), min(int(k), d - 1)) if d > 1 else (np.zeros(0, np.int64),) * 2
    pairs = np.unique(np.minimum(rows, cols) * d + np.maximum(rows, cols))
    i, j = np.divmod(pairs, d)
    w = arr[i, j]
    nonzero = w != 0.0
    return Edges(i=i[nonzero], j=j[nonzero], weight=w[nonzero])


def _nominations(strength: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Row-major ``(rows, cols)`` of the ``k`` largest off-diagonal entries of every row of
    ``strength`` (non-negative, ``1 <= k <= d − 1``), ties to the smaller column index.

    ``strength`` is overwritten on its diagonal.
    """
    d = strength.shape[0]
    np.fill_diagonal(strength, -np.inf)
    kth = np.partition(strength, d - k, axis=1)[:, d - k, None]
    chosen = strength > kth
    tied = strength == kth
    places = k - chosen.sum(axis=1)
    crowded = np.flatnonzero(tied.sum(axis=1) > places)
    tied[crowded] &= np.cumsum(tied[crowded], axis=1) <= places[crowded, None]
    chosen |= tied
    return np.nonzero(chosen)


def _as_edges(edges: Edges, n: int) -> Edges:
    """Validate ``edges`` against a node count ``n`` and return them as canonical arrays.

    Raises
    ------
    InputError
        If ``n`` is not a positive integer, the arrays differ in length, an endpoint lies
        outside ``[0, n)``, a pair is not ``i < j`` or repeats, or a weight is zero or not
        finite.
    """
    if not isinstance(edges, Edges):
        raise InputError(f"edges must be an Edges record (see topk_graph), got {type(edges).__name__}.")
    if int(n) != n or n < 1:
        raise InputError(f"n must be a positive integer node count, got {n!r}.")
    i = np.asarray(edges.i)
    j = np.asarray(edges.j)
    w = np.asarray(edges.weight, dtype=np.float64)
    if not (i.ndim == j.ndim == w.ndim == 1 and i.shape == j.shape == w.shape):
        raise InputError(f"edge arrays have shapes {i.shape}, {j.shape}, {w.shape}; pass three 1-d arrays of one length.")
    if i.size and (i.dtype.kind not in "iu" or j.dtype.kind not in "iu"):
        raise InputError("edge endpoints must be integers; pass node indices.")
    i = i.astype(np.int64)
    j = j.astype(np.int64)
    if i.size and (i.min() < 0 or j.max() >= n or np.any(i >= j)):
        raise InputError(f"edge endpoints must satisfy 0 <= i < j < n = {n}; check n and the edge list.")
    if i.size and np.unique(i * int(n) + j).size != i.size:
        raise InputError("edge list repeats a pair; keep one weight per pair.")
    if not np.all(np.isfinite(w)) or np.any(w == 0.0):
        raise InputError("edge weights must be finite and non-zero; drop zero-weight edges.")
    return Edges(i=i, j=j, weight=w)
