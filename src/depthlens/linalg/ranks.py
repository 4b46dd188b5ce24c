"""Effective ranks and singular-subspace alignment (§B2 and B3).

The rank functions accept either a matrix batch ``(..., n, n)`` or a 1-D array of singular
values ``(n,)``: a 1-D argument is read as singular values (non-negative, any order), two or
more axes as square matrices, whose singular values are computed in float64 (LAPACK
``gesdd``, O(n³) per matrix). All are scale-invariant and accurate to rounding.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..errors import InputError
from ._checks import as_square
from . import guarded

__all__ = ["erank", "erank_sigma", "participation_ratio", "self_alignment", "self_alignment_svd", "stable_rank"]


def _scaled_sv(M_or_sv: ArrayLike) -> np.ndarray:
    """``σ / σ_max`` of a matrix batch or of validated 1-D singular values.

    Every rank function here is scale-invariant; scaling keeps ``σ⁴`` from overflowing.
    """
    arr = np.asarray(M_or_sv)
    if arr.ndim == 1:
        if arr.dtype.kind not in "biuf" or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise InputError("singular values must be a non-empty 1-D array of finite, non-negative reals.")
        sv = arr.astype(np.float64)
    else:
        sv = guarded.svdvals(as_square(arr, "M", batched=True))
    top = sv.max(axis=-1, keepdims=True)
    if np.any(top == 0):
        what = f"M at batch index {tuple(int(i) for i in np.argwhere(top[..., 0] == 0)[0])}" if arr.ndim > 1 else "every singular value"
        raise InputError(f"{what} is zero; no effective rank is defined, pass a nonzero matrix.")
    return sv / top


def _entropy_rank(p: np.ndarray) -> np.ndarray:
    p = p / p.sum(axis=-1, keepdims=True)
    logs = np.log(p, out=np.zeros_like(p), where=p > 0)
    return np.exp(-np.sum(p * logs, axis=-1))


def erank(M_or_sv: ArrayLike) -> np.ndarray:
    """Effective rank ``exp(H(p))`` with ``p_i = σ_i² / Σσ²`` (§B2 default).

    Parameters
    ----------
    M_or_sv : array_like, shape (..., n, n) or (n,)
        Square matrices, or singular values (1-D).

    Returns
    -------
    numpy.ndarray, shape (...), float64 in [1, n]
        ``0 log 0`` is taken as 0.

    Raises
    ------
    InputError
        If the input is not finite, 1-D values are negative or empty, or a matrix (or the
        value vector) is zero, for which no effective rank is defined; the message names the
        batch index.
    """
    return _entropy_rank(_scaled_sv(M_or_sv) ** 2)


def erank_sigma(M_or_sv: ArrayLike) -> np.ndarray:
    """Effective rank ``exp(H(p))`` with ``p_i = σ_i / Σσ`` (Roy & Vetterli's original form).

    Parameters, returns and raises as :func:`erank`.
    """
    return _entropy_rank(_scaled_sv(M_or_sv))


def participation_ratio(M_or_sv: ArrayLike) -> np.ndarray:
    """Participation ratio ``(Σσ²)² / Σσ⁴`` in [1, n].

    Parameters, returns and raises as :func:`erank`.
    """
    s2 = _scaled_sv(M_or_sv) ** 2
    return s2.sum(axis=-1) ** 2 / np.sum(s2**2, axis=-1)


def stable_rank(M_or_sv: ArrayLike) -> np.ndarray:
    """Stable rank ``‖M‖_F² / ‖M‖² = Σσ² / σ_max²`` in [1, n].

    Parameters, returns and raises as :func:`erank`.
    """
    return np.sum(_scaled_sv(M_or_sv) ** 2, axis=-1)


def self_alignment(M: ArrayLike, k: int) -> np.ndarray:
    """Overlap of the top-k left and right singular subspaces, ``‖U_kᴴ V_k‖_F² / k`` in [0, 1].

    1 when the input and output directions of the k strongest modes coincide (e.g. symmetric
    positive definite M), near ``k/n`` for unrelated random subspaces.

    Parameters
    ----------
    M : array_like, shape (..., n, n)
        Square matrices (a matrix is needed: singular values alone do not determine it).
    k : int
        Subspace dimension, 1 ≤ k ≤ n.

    Returns
    -------
    numpy.ndarray, shape (...), float64

    Raises
    ------
    InputError
        If ``M`` is not a finite batch of square matrices or k is out of range.

    Notes
    -----
    Cost: one full SVD, O(n³) per matrix. When ``σ_k = σ_{k+1}`` the top-k subspaces are not
    unique and the value depends on LAPACK's choice of basis.
    """
    arr = as_square(M, "M", batched=True)
    _check_k(k, arr.shape[-1])
    U, _, Vh = guarded.svd(arr)
    return self_alignment_svd(U, Vh, k)


def _check_k(k: int, n: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise InputError(f"k is {k!r}; pass an integer subspace size between 1 and n = {n}.")


def self_alignment_svd(u: ArrayLike, vh: ArrayLike, k: int) -> np.ndarray:
    """:func:`self_alignment` from singular vectors already computed, ``M = u diag(σ) vh``.

    Lets a caller that needs the SVD anyway (and several k) pay for it once.

    Parameters
    ----------
    u, vh : array_like, shape (..., n, n)
        Left singular vectors (columns of ``u``) and conjugate-transposed right singular
        vectors (rows of ``vh``), in descending order of σ, as ``numpy.linalg.svd`` returns
        them.
    k : int
        Subspace dimension, 1 ≤ k ≤ n.

    Returns
    -------
    numpy.ndarray, shape (...), float64
        ``‖u_kᴴ v_k‖_F² / k``, exact to rounding; identical to ``self_alignment(M, k)`` when
        ``u, vh`` come from ``numpy.linalg.svd(M)``.

    Raises
    ------
    InputError
        If ``u`` and ``vh`` are not finite square batches of one shape, or k is out of range.

    Notes
    -----
    Cost O(n k²) per matrix.
    """
    left = as_square(u, "u", batched=True)
    right = as_square(vh, "vh", batched=True)
    if left.shape != right.shape:
        raise InputError(f"u has shape {left.shape} and vh {right.shape}; pass both factors of one SVD.")
    _check_k(k, left.shape[-1])
    overlap = np.conj(np.swapaxes(left[..., :, :k], -1, -2)) @ np.conj(np.swapaxes(right[..., :k, :], -1, -2))
    return np.sum(np.abs(overlap) ** 2, axis=(-2, -1)) / k
