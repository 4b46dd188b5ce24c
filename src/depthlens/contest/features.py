"""Per-head features the contest computes itself (§A7): pattern, eigenvalue and norm
features of one attention matrix, and the depth persistence of a head's deviation.

Pure array functions on float64 causal row-stochastic matrices. The per-matrix features take a
batch ``(..., n, n)`` and return one value per matrix ``(...)``; :func:`induction_mass` also takes
the chunk's token ids; :func:`persistence` takes every head of every layer of one chunk
``(L, H, n, n)``. Indices are 0-based: "rows i ≥ 2" of METHODS
are rows ``1 … n−1`` here. The row averages (:func:`mean_distance`, :func:`max_weight`,
:func:`induction_mass`) take ``rows``, a bool mask of the analysed rows of a prompt, and then
average over those rows only (NaN when none qualifies); the operator features do not.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..attention.patterns import row_mean, selected_rows
from ..errors import InputError
from ..linalg import guarded
from ..linalg.causal import check_causal_stochastic, deflate

__all__ = [
    "DIAG_QUANTILES",
    "HEAD_FEATURES",
    "SCALE_FEATURES",
    "diag_quantiles",
    "head_features",
    "induction_mass",
    "max_weight",
    "mean_distance",
    "norm_features",
    "persistence",
]

#: Percentiles of the self-attention weights A[i, i] (i ≥ 2) reported as ``diag_q<q>``.
DIAG_QUANTILES = (25, 50, 75)
#: The per-matrix features of :func:`head_features`, in table order.
HEAD_FEATURES = ("mean_distance", "max_weight", *(f"diag_q{q}" for q in DIAG_QUANTILES), "fro_B", "sigma2_B",
                 "stable_rank_B")
#: Scale quantities among them, aggregated over chunks by the median of logs (§A3).
SCALE_FEATURES = ("fro_B", "sigma2_B")


def _batch(A: ArrayLike) -> np.ndarray:
    arr = check_causal_stochastic(A)
    if arr.shape[-1] < 2:
        raise InputError(f"attention batch has shape {arr.shape}; expected (..., n, n) with n >= 2.")
    return arr


def mean_distance(A: ArrayLike, rows: np.ndarray | None = None) -> np.ndarray:
    """Mean over all rows i of ``Σ_j A[i, j] (i − j)``: the mean attention distance (tokens).

    Examples
    --------
    >>> import numpy as np
    >>> prev = np.eye(4, k=-1); prev[0, 0] = 1.0  # previous-token head
    >>> float(mean_distance(prev))
    0.75
    """
    arr = _batch(A)
    n = arr.shape[-1]
    dist = np.subtract.outer(np.arange(n), np.arange(n)).clip(min=0).astype(np.float64)
    if rows is not None:
        return row_mean((arr * dist).sum(axis=-1), selected_rows(rows, n))
    return (arr * dist).sum(axis=-1).mean(axis=-1)


def max_weight(A: ArrayLike, rows: np.ndarray | None = None) -> np.ndarray:
    """Mean over rows i ≥ 2 of ``max_j A[i, j]`` (row 1 is ``e_1ᵀ`` for every head)."""
    arr = _batch(A)
    if rows is not None:
        return row_mean(arr.max(axis=-1), selected_rows(rows, arr.shape[-1], 1))
    return arr[..., 1:, :].max(axis=-1).mean(axis=-1)


def diag_quantiles(A: ArrayLike, quantiles: tuple[float, ...] = DIAG_QUANTILES) -> np.ndarray:
    """Percentiles (linear interpolation) of the self-attention weights ``A[i, i]``, i ≥ 2: the
    non-zero eigenvalues of ``B = A − P``. Shape ``(..., len(quantiles))``."""
    arr = _batch(A)
    diag = np.diagonal(arr, axis1=-2, axis2=-1)[..., 1:]
    return np.moveaxis(np.percentile(diag, quantiles, axis=-1), 0, -1)


def induction_mass(A: ArrayLike, tokens: ArrayLike, rows: np.ndarray | None = None) -> np.ndarray:
    """Attention mass on the positions right after earlier occurrences of the query's token:
    the natural-text analogue of the probe's induction score (a pattern-only proxy, from the
    attention matrix and the chunk's token ids).

    For query i (0-based) let ``K_i = {k : k ≤ i − 2, t[k − 1] = t[i]}``: every position that
    follows an earlier occurrence of ``t[i]``, except the query itself (``k = i``, a repeated
    token) and its previous token (``k = i − 1``, which ``prev_weight`` measures). The value is
    the mean of ``Σ_{k ∈ K_i} A[i, k]`` over the queries with ``K_i`` non-empty: 1 for a perfect
    induction head, about ``|K_i| / (i + 1)`` for a uniform one. Exact (a masked sum).

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        Causal row-stochastic attention matrices of one chunk, n ≥ 2.
    tokens : array_like, shape (n,)
        The chunk's token ids.
    rows : ndarray of bool, shape (n,), optional
        Only these queries count (a prompt's analysed positions); default every one.

    Returns
    -------
    numpy.ndarray, shape (...)
        NaN when no query of the chunk has an earlier occurrence of its token (``K_i`` empty for
        every i).

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic, n < 2, or ``tokens`` is not of length n.

    Examples
    --------
    >>> import numpy as np
    >>> t = np.array([0, 5, 6, 7, 5, 6, 7])  # BOS, then a sequence and its repeat
    >>> A = np.zeros((7, 7)); A[:, 0] = 1.0
    >>> A[4:, 0] = 0.0; A[[4, 5, 6], [2, 3, 4]] = 1.0  # the second copy attends to the token after its first
    >>> float(induction_mass(A, t))
    1.0
    """
    arr = _batch(A)
    t = np.asarray(tokens).reshape(-1)
    n = arr.shape[-1]
    if t.size != n:
        raise InputError(f"induction_mass got {t.size} token ids for attention of size {n}; pass the chunk's ids.")
    i, k = np.indices((n, n))
    targets = (k >= 1) & (k <= i - 2) & (t[np.maximum(k - 1, 0)] == t[i])
    queries = targets.any(axis=1)
    if rows is not None:
        queries = queries & np.isin(np.arange(n), selected_rows(rows, n))
    if not queries.any():
        return np.full(arr.shape[:-2], np.nan)
    return (arr * targets).sum(axis=-1)[..., queries].mean(axis=-1)


def norm_features(B: np.ndarray) -> dict[str, np.ndarray]:
    """``fro_B`` (‖B‖_F), ``sigma2_B`` (second singular value) and ``stable_rank_B``
    (‖B‖_F² / ‖B‖₂², NaN for B = 0) of deflated operators ``B`` (..., n, n), n ≥ 2, from one
    batched SVD (:func:`depthlens.linalg.guarded.svdvals`)."""
    s = guarded.svdvals(B)
    fro = np.linalg.norm(B, axis=(-2, -1))
    top = s[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        stable = np.where(top > 0, fro**2 / np.where(top > 0, top, 1.0) ** 2, np.nan)
    return {"fro_B": fro, "sigma2_B": s[..., 1], "stable_rank_B": stable}


def head_features(A: ArrayLike, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every per-matrix feature of :data:`HEAD_FEATURES` for a batch ``(..., n, n)`` of causal
    row-stochastic matrices, n ≥ 2: name -> array of the batch shape. ``rows`` (a prompt's
    analysed rows) restricts the row averages ``mean_distance`` and ``max_weight``.

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic or n < 2.
    """
    arr = _batch(A)
    out = {"mean_distance": mean_distance(arr, rows), "max_weight": max_weight(arr, rows)}
    qs = diag_quantiles(arr)
    out.update({f"diag_q{q}": qs[..., i] for i, q in enumerate(DIAG_QUANTILES)})
    out.update(norm_features(deflate(arr)))
    return out


def persistence(A: ArrayLike) -> np.ndarray:
    """Depth persistence of every head's deviation in one chunk (§A7).

    ``persistence[l, h] = log ‖S_l B_{l,h}‖₂ − log ‖S_l B̄_l‖₂`` with ``S_l = B̄_{L−1} ⋯ B̄_{l+1}``
    (``S_{L−1} = I``), ``B_{l,h} = A_{l,h} − P`` and ``B̄_l`` the head mean of layer l's deflated
    operators: how much more of the head's deviation than of its layer's survives the layers
    above.

    Parameters
    ----------
    A : array_like, shape (L, H, n, n)
        Every head's attention matrix of every layer of one chunk, layer 0 first.

    Returns
    -------
    numpy.ndarray, shape (L, H), float64
        ``−inf`` where nothing of the head survives (``S_l B_{l,h} = 0``, e.g. an exact sink
        head ``A = P``) but something of its layer does; NaN for every head of a layer whose
        own surviving deviation ``S_l B̄_l`` is 0 (a ratio of zeros: e.g. a layer of exact
        sink heads and every layer below it).

    Raises
    ------
    InputError
        If ``A`` is not a (L, H, n, n) batch of causal row-stochastic matrices.

    Notes
    -----
    The suffix products are formed once, top down: ``S_{l−1} = S_l B̄_l`` is the layer term of
    layer l, so a chunk costs L + L·H matrix products and L·H + L spectral norms (one batched
    SVD per layer), not a product of length L − l per head. ``S_l`` is rescaled to unit
    Frobenius norm at every step (the ratio does not depend on its scale), so products that
    shrink by hundreds of orders over depth neither underflow nor lose accuracy; the logs are
    exact to the rounding of the products and of the SVD.
    """
    arr = check_causal_stochastic(A)
    if arr.ndim != 4:
        raise InputError(f"A has shape {arr.shape}; pass one chunk's attention as (layers, heads, n, n).")
    B = deflate(arr)
    Bbar = B.mean(axis=1)
    n_layers, n_heads, n = B.shape[:3]
    out = np.empty((n_layers, n_heads))
    S = np.eye(n)
    for layer in reversed(range(n_layers)):
        heads = S @ B[layer]
        below = S @ Bbar[layer]
        num = guarded.norm2(heads)
        den = guarded.norm2(below)
        if den > 0:
            with np.errstate(divide="ignore"):
                out[layer] = np.log(num) - np.log(den)
        else:
            out[layer] = np.nan
        scale = np.linalg.norm(below)
        S = below / scale if scale > 0 else below
    return out
