"""Causal row-stochastic operators: validation, Perron deflation and exact depth products.

Every causal attention matrix ``A`` (lower triangular, non-negative, ``A 1 = 1``) has first
row ``e_1ᵀ``, so the Perron projector ``P = 1 e_1ᵀ`` satisfies ``AP = PA = P`` and the
deflated operator ``B = A − P`` carries everything that distinguishes one head from another
(§A2). For any operators with ``A_l 1 = 1`` and ``e_1ᵀ A_l = e_1ᵀ`` the depth product
factorises exactly, ``A_L ⋯ A_1 − P = B_L ⋯ B_1`` (§A6). The functions here refuse
inputs for which that identity fails (bidirectional masks, rows that do not sum to one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InputError
from ._checks import as_square
from . import guarded

__all__ = [
    "DepthProduct",
    "EigPredictions",
    "chain_operator",
    "check_causal_stochastic",
    "deflate",
    "depth_product",
    "eig_gap",
    "eig_predictions",
    "flag_nonsimple_perron",
    "mean_operator",
    "perron_projector",
    "rollout_operator",
]


def _where(batch: tuple[int, ...], name: str) -> str:
    return f"{name}[{', '.join(map(str, batch))}]" if batch else name


def check_causal_stochastic(A: ArrayLike, atol: float = 1e-10, name: str = "A") -> np.ndarray:
    """Validate a batch of causal row-stochastic matrices and return it as float64.

    Checks, per row and in this order: no weight above the diagonal (``|A_ij| ≤ atol`` for
    ``j > i``), no negative weight (``A_ij ≥ −atol``), and unit row sum
    (``|Σ_j A_ij − 1| ≤ atol``). The first offending row in C order (batch index, then row)
    is named in the error.

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        Attention matrices (rows = queries, columns = keys), any leading batch axes.
    atol : float
        Absolute tolerance for all three checks. Softmax recomputed in float64 sums to one
        within about ``n · 1e-16``; the default leaves ample room for that.
    name : str
        How the argument is called in error messages.

    Returns
    -------
    numpy.ndarray, shape (..., n, n), float64
        The input unchanged in value (a float64 view or copy).

    Raises
    ------
    InputError
        If ``A`` is not a finite real square batch, or any row is not causal, not
        non-negative or does not sum to one. The message names the batch index and the
        0-based row, says what is wrong and that the depth factorisation needs causal,
        row-stochastic attention (bidirectional masks and softmax variants that do not
        sum to one are not supported).

    Notes
    -----
    Cost O(size of A). Exact: no rounding beyond the float64 row sums.
    """
    arr = as_square(A, name, batched=True)
    if arr.dtype.kind == "c":
        raise InputError(f"{name} is complex; attention matrices must be real, non-negative and row-stochastic.")
    if not atol >= 0:
        raise InputError(f"atol is {atol}; pass a non-negative tolerance.")
    n = arr.shape[-1]
    upper = np.triu(np.ones((n, n), dtype=bool), k=1)
    above = np.where(upper, np.abs(arr), 0.0).max(axis=-1) > atol
    negative = arr.min(axis=-1) < -atol
    sums = arr.sum(axis=-1)
    off_sum = np.abs(sums - 1.0) > atol
    bad = above | negative | off_sum
    if not bad.any():
        return arr
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    batch, row = idx[:-1], idx[-1]
    vals = arr[idx]
    where = f"{_where(batch, name)} row {row} (0-based)"
    fix = "pass causal, row-stochastic attention (softmax over a causal mask, recomputed in float64)"
    if above[idx]:
        col = int(np.argmax(np.where(upper[row], np.abs(vals), 0.0)))
        raise InputError(
            f"{where} has weight {vals[col]:.3g} above the diagonal at column {col}, so it is not causal; "
            f"{fix}: bidirectional masks are not supported."
        )
    if negative[idx]:
        col = int(np.argmin(vals))
        raise InputError(f"{where} has negative weight {vals[col]:.3g} at column {col}; {fix}.")
    raise InputError(
        f"{where} sums to {float(sums[idx]):.15g}, not 1 within atol={atol:g}; {fix}: softmax variants whose rows do "
        f"not sum to one (e.g. softmax-off-by-one, attention sinks as extra logits) are not supported."
    )


def perron_projector(n: int) -> np.ndarray:
    """The Perron projector ``P = 1 e_1ᵀ`` of size n: first column ones, the rest zero.

    ``P² = P``, ``AP = PA = P`` for every causal row-stochastic ``A``, ``‖P‖ = √n``.

    Parameters
    ----------
    n : int
        Number of tokens, n ≥ 1.

    Returns
    -------
    numpy.ndarray, shape (n, n), float64

    Raises
    ------
    InputError
        If n is not a positive integer.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"n is {n!r}; pass a positive integer matrix size.")
    P = np.zeros((int(n), int(n)))
    P[:, 0] = 1.0
    return P


def deflate(A: ArrayLike, atol: float = 1e-10) -> np.ndarray:
    """Perron deflation ``B = A − P`` of causal row-stochastic matrices (batched).

    ``B`` is lower triangular with zero first row, first column ``A_i1 − 1`` and zero row
    sums; its eigenvalues are ``0, A_22, …, A_nn``; ``B^k = A^k − P`` for k ≥ 1.

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        Causal row-stochastic matrices.
    atol : float
        Tolerance of :func:`check_causal_stochastic`.

    Returns
    -------
    numpy.ndarray, shape (..., n, n), float64
        Exact up to one rounding in the first column.

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic (see :func:`check_causal_stochastic`).
    """
    return _minus_perron(check_causal_stochastic(A, atol))


def _minus_perron(arr: np.ndarray) -> np.ndarray:
    B = arr.copy()
    B[..., 0] -= 1.0
    return B


def flag_nonsimple_perron(A: ArrayLike, atol: float = 0.0) -> np.ndarray:
    """Flag matrices whose Perron root 1 may not be simple: some row i ≥ 2 attends only to itself.

    Such a row has ``A_ii = 1``; then ``K(A)`` can be smaller than ``√n`` (``K(I) = 1``), and
    the raw Kreiss check value of §A2 does not apply. Rows with that property are
    ``np.nonzero(np.diagonal(A, axis1=-2, axis2=-1)[..., 1:] >= 1 - atol)`` (offset by one).

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        Causal row-stochastic matrices.
    atol : float
        A diagonal entry counts as 1 when ``A_ii ≥ 1 − atol``; the default 0 flags exact
        ones only (what float64 softmax gives when every other weight underflows).

    Returns
    -------
    numpy.ndarray, shape (...), bool
        True where some row i ≥ 2 (0-based i ≥ 1) has ``A_ii = 1``.

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic.
    """
    arr = check_causal_stochastic(A)
    diag = np.diagonal(arr, axis1=-2, axis2=-1)[..., 1:]
    return np.any(diag >= 1.0 - atol, axis=-1)


def mean_operator(heads: ArrayLike) -> np.ndarray:
    """Head mean ``Ā = (1/H) Σ_h A_h`` (§A6 ``mean``, the default operator).

    Parameters
    ----------
    heads : array_like, shape (..., H, n, n)
        Per-head attention matrices; the heads axis is third from last.

    Returns
    -------
    numpy.ndarray, shape (..., n, n), float64

    Raises
    ------
    InputError
        If ``heads`` is not a finite batch of square matrices with a heads axis.
    """
    arr = as_square(heads, "heads", batched=True)
    if arr.ndim < 3:
        raise InputError(f"heads has shape {arr.shape}; expected (..., H, n, n) with a heads axis.")
    return arr.mean(axis=-3)


def rollout_operator(A: ArrayLike) -> np.ndarray:
    """Attention rollout ``½(A + I)`` (§A6 ``rollout``), batched.

    Parameters
    ----------
    A : array_like, shape (..., n, n)
        Per-layer operators (usually head means).

    Returns
    -------
    numpy.ndarray, shape (..., n, n), float64

    Raises
    ------
    InputError
        If ``A`` is not a finite batch of square matrices.
    """
    arr = as_square(A, "A", batched=True)
    return 0.5 * (arr + np.eye(arr.shape[-1]))


def chain_operator(heads: ArrayLike, choice: Sequence[int]) -> np.ndarray:
    """One chosen head per layer (§A6 ``chain``).

    Parameters
    ----------
    heads : array_like, shape (L, ..., H, n, n)
        Per-layer, per-head attention matrices, layer 1 first.
    choice : sequence of int, length L
        The head index used at each layer.

    Returns
    -------
    numpy.ndarray, shape (L, ..., n, n), float64
        ``heads[l, ..., choice[l], :, :]`` stacked over layers.

    Raises
    ------
    InputError
        If the shapes do not match or a head index is out of range.
    """
    arr = as_square(heads, "heads", batched=True)
    if arr.ndim < 4:
        raise InputError(f"heads has shape {arr.shape}; expected (L, ..., H, n, n) with layer and heads axes.")
    idx = np.asarray(choice)
    n_layers, n_heads = arr.shape[0], arr.shape[-3]
    if idx.shape != (n_layers,) or idx.dtype.kind not in "iu":
        raise InputError(f"choice has shape {idx.shape}; pass {n_layers} integer head indices, one per layer.")
    if np.any((idx < 0) | (idx >= n_heads)):
        raise InputError(f"choice {idx.tolist()} has a head index outside 0..{n_heads - 1}.")
    return np.stack([np.take(arr[layer], int(h), axis=-3) for layer, h in enumerate(idx)])


def _stack_ops(ops: ArrayLike | Sequence[ArrayLike], atol: float) -> np.ndarray:
    stacked = check_causal_stochastic(ops, atol, name="ops")
    if stacked.ndim < 3:
        raise InputError(f"ops has shape {stacked.shape}; pass L per-layer operators, shape (L, ..., n, n).")
    return stacked


@dataclass(frozen=True)
class DepthProduct:
    """Depth product of per-layer causal stochastic operators (§A6).

    Attributes
    ----------
    product : numpy.ndarray, shape (..., n, n)
        ``A_L ⋯ A_1``.
    deviation : numpy.ndarray, shape (..., n, n)
        The surviving deviation ``D = B_L ⋯ B_1 = A_L ⋯ A_1 − P``, multiplied out from the
        deflated factors, so entries far below ``1e-16`` are resolved (the subtraction
        ``product − P`` would lose them to cancellation).
    profile : numpy.ndarray, shape (L, ...)
        ``‖D_{1→b}‖ = ‖B_b ⋯ B_1‖`` (spectral norm) for b = 1..L.
    row_norms : numpy.ndarray, shape (..., n)
        Euclidean norm of each row of ``deviation``.
    """

    product: np.ndarray
    deviation: np.ndarray
    profile: np.ndarray
    row_norms: np.ndarray

    @property
    def norm(self) -> np.ndarray:
        """``‖D‖`` of the full product, shape (...)."""
        return self.profile[-1]


def depth_product(ops: ArrayLike | Sequence[ArrayLike], atol: float = 1e-10) -> DepthProduct:
    """Multiply per-layer operators over depth, later layers on the left, with the deflated factors.

    Parameters
    ----------
    ops : array_like, shape (L, ..., n, n), or a sequence of L arrays (..., n, n)
        Per-layer causal row-stochastic operators; ``ops[0]`` is layer 1 (applied first).
        Any leading batch axes (e.g. chunks) are carried through.
    atol : float
        Tolerance of :func:`check_causal_stochastic`.

    Returns
    -------
    DepthProduct

    Raises
    ------
    InputError
        If ``ops`` is empty, ragged, or any operator is not causal row-stochastic (a
        bidirectional mask or a softmax whose rows do not sum to one breaks the identity
        ``A_L ⋯ A_1 − P = B_L ⋯ B_1``).

    Notes
    -----
    Cost: 2L matrix products and L spectral norms (an SVD each), O(L n³) per batch element.
    Products are float64 with the usual matmul rounding, relative to the factors' norms.
    """
    stacked = _stack_ops(ops, atol)
    deflated = _minus_perron(stacked)
    product, deviation = stacked[0], deflated[0]
    profile = [guarded.norm2(deviation)]
    for A, B in zip(stacked[1:], deflated[1:]):
        product = A @ product
        deviation = B @ deviation
        profile.append(guarded.norm2(deviation))
    return DepthProduct(
        product=product,
        deviation=deviation,
        profile=np.stack(profile),
        row_norms=np.linalg.norm(deviation, axis=-1),
    )


@dataclass(frozen=True)
class EigPredictions:
    """Eigenvalue predictions for the surviving deviation (§A6).

    Attributes
    ----------
    e1 : numpy.ndarray, shape (...)
        ``max_{i≥2} Π_l (A_l)_ii``: the exact spectral radius of ``D = B_L ⋯ B_1``.
    e2 : numpy.ndarray, shape (...)
        ``Π_l ρ(B_l)`` with ``ρ(B_l) = max_{i≥2} (A_l)_ii``.
    """

    e1: np.ndarray
    e2: np.ndarray


def eig_predictions(
    ops: ArrayLike | Sequence[ArrayLike], atol: float = 1e-10, *, profile: bool = False
) -> EigPredictions:
    """Eigenvalue predictions E1 and E2 of the depth deviation, from the diagonals alone.

    The product of lower-triangular matrices is lower triangular with diagonal the product
    of the diagonals, and ``B_l`` has diagonal ``0, (A_l)_22, …``; so E1 is ``ρ(D)``
    exactly (up to the rounding of an L-term product) and E2 ≥ E1.

    Parameters
    ----------
    ops : array_like, shape (L, ..., n, n), or a sequence of L arrays (..., n, n)
        Per-layer causal row-stochastic operators, layer 1 first.
    atol : float
        Tolerance of :func:`check_causal_stochastic`.
    profile : bool
        Return the predictions of every partial product ``B_b ⋯ B_1`` (``b = 1 … L``) along a
        leading depth axis, from the same running products of the diagonals.

    Returns
    -------
    EigPredictions
        Float64 arrays of the batch shape (with a leading axis of length L when ``profile``).
        For n = 1 both are 0 (B = 0). They underflow to
        0 only when the true value is below about 1e-308 (or a diagonal entry is 0).

    Raises
    ------
    InputError
        As :func:`depth_product`.

    Notes
    -----
    Cost O(L n) after validation.
    """
    stacked = _stack_ops(ops, atol)
    diag = np.diagonal(stacked, axis1=-2, axis2=-1)[..., 1:]
    if diag.shape[-1] == 0:
        zero = np.zeros(stacked.shape[:-2] if profile else stacked.shape[1:-2])
        return EigPredictions(e1=zero, e2=zero.copy())
    e1 = np.cumprod(diag, axis=0).max(axis=-1)
    e2 = np.cumprod(diag.max(axis=-1), axis=0)
    return EigPredictions(e1=e1, e2=e2) if profile else EigPredictions(e1=e1[-1], e2=e2[-1])


def eig_gap(D_norm: ArrayLike, E: ArrayLike) -> np.ndarray:
    """Orders of magnitude by which an eigenvalue prediction misses: ``log10(‖D‖ / E)``.

    Parameters
    ----------
    D_norm : array_like
        ``‖D‖`` (non-negative), e.g. :attr:`DepthProduct.norm`.
    E : array_like
        The prediction (non-negative), e.g. :attr:`EigPredictions.e1`; broadcast with D_norm.

    Returns
    -------
    numpy.ndarray, float64
        Never NaN: ``+inf`` where ``E = 0 < ‖D‖`` (the prediction says the deviation dies,
        it does not), ``0.0`` where both are 0 (the prediction is exact), ``−inf`` where
        ``‖D‖ = 0 < E``. Computed as ``log10 ‖D‖ − log10 E`` so that tiny values do not
        overflow the ratio.

    Raises
    ------
    InputError
        If either argument is negative or not finite.
    """
    d = np.asarray(D_norm, dtype=np.float64)
    e = np.asarray(E, dtype=np.float64)
    for name, v in (("D_norm", d), ("E", e)):
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise InputError(f"{name} has negative or non-finite values; pass finite norms and predictions ≥ 0.")
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.log10(d) - np.log10(e)
    return np.where((d == 0) & (e == 0), 0.0, gap)


def random_causal_attention(
    n: int, rng: np.random.Generator, *, sink: float = 0.0, prev: float = 0.0, scale: float = 1.0
) -> np.ndarray:
    """A synthetic causal attention matrix: the masked softmax of random logits.

    Logits are ``scale`` times standard normals; ``sink`` is added to column 1 (the first
    token) and ``prev`` to the sub-diagonal (the previous token). The result is a float64
    ``(n, n)`` lower-triangular, non-negative, row-stochastic matrix whose diagonal entries
    are below 1 for ``n ≥ 2`` (finite logits), i.e. with a simple Perron root. Used by the
    tests and benchmarks as realistic sink / previous-token / plain heads.
    """
    logits = scale * rng.standard_normal((n, n))
    logits[:, 0] += sink
    idx = np.arange(1, n)
    logits[idx, idx - 1] += prev
    logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)
