"""Departure from normality and the numerical range (§A3 and B2).

Matrix functions take ``(..., n, n)`` batches; spectrum functions take eigenvalues or
singular values ``(..., n)`` (the last axis is reduced).
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
from numpy.typing import ArrayLike

from ..errors import InputError
from ._checks import as_square
from . import guarded
from .kreiss_search import signature_nonnegative

__all__ = [
    "complex_fraction",
    "expansion_fraction",
    "henrici",
    "henrici_rel",
    "numerical_abscissa",
    "numerical_radius",
    "rotation_angle_mean",
    "schur_departure",
    "symmetry_index",
]


def _fro(arr: np.ndarray) -> np.ndarray:
    return np.linalg.norm(arr, axis=(-2, -1))


def henrici(M: ArrayLike, relative: bool = False) -> np.ndarray:
    """Henrici departure from normality ``√(‖M‖_F² − Σ|λ_i|²)`` (batched).

    Parameters
    ----------
    M : array_like, shape (..., n, n)
        Real or complex square matrices.
    relative : bool
        Divide by ``‖M‖_F`` (0 for the zero matrix, which is normal).

    Returns
    -------
    numpy.ndarray, shape (...), float64

    Raises
    ------
    InputError
        If ``M`` is not a finite batch of square matrices.

    Notes
    -----
    Triangular matrices (detected per matrix, exact zeros above or below the diagonal) use
    the closed form: the eigenvalues are the diagonal, so the departure is the Frobenius
    norm of the off-diagonal part; exact to rounding, cost O(n²).
    Other matrices use the complex Schur form ``M = Q(Λ + N)Q*``: since Q is unitary,
    ``‖M‖_F² − Σ|λ|² = ‖N‖_F²`` exactly, so the departure is ``‖N‖_F``. This is the
    eigenvalue formula without its cancellation: subtracting ``Σ|λ|²`` from ``‖M‖_F²`` loses
    everything below about ``√ε ‖M‖_F`` (and can go negative, which would have to be clipped
    to 0), whereas ``‖N‖_F`` is backward stable, accurate to about ``n ε ‖M‖_F``. Cost O(n³)
    per non-triangular matrix.
    """
    arr = as_square(M, "M", batched=True)
    off = arr - np.einsum("...ii->...i", arr)[..., None] * np.eye(arr.shape[-1])
    is_lower = ~np.any(np.triu(arr, k=1) != 0, axis=(-2, -1))
    is_upper = ~np.any(np.tril(arr, k=-1) != 0, axis=(-2, -1))
    out = np.array(_fro(off))
    general = ~(is_lower | is_upper)
    if np.any(general):
        out[general] = [np.linalg.norm(np.triu(guarded.schur(m, output="complex")[0], k=1)) for m in arr[general]]
    if relative:
        fro = _fro(arr)
        out = np.divide(out, fro, out=np.zeros_like(out), where=fro > 0)
    return out


def henrici_rel(M: ArrayLike) -> np.ndarray:
    """Relative Henrici departure ``henrici(M) / ‖M‖_F`` in [0, 1]; see :func:`henrici`."""
    return henrici(M, relative=True)


def schur_departure(t: ArrayLike) -> float:
    """Henrici departure ``‖N‖_F`` of a matrix from a Schur form ``t`` of it, real or complex.

    Parameters
    ----------
    t : array_like, shape (n, n)
        A complex (upper-triangular) Schur form, or a real one (quasi-triangular: 2×2 diagonal
        blocks for the conjugate pairs, as LAPACK ``gees`` returns it, e.g.
        :func:`depthlens.linalg.guarded.schur_values`).

    Returns
    -------
    float
        ``‖N‖_F``, N the strictly upper part of the complex Schur form. For a real form, the
        unitary rotations that triangularise each 2×2 block ``[[p, b], [c, q]]`` keep the
        Frobenius norms of the rows and columns they mix, and turn the block into
        ``[[λ, x], [0, λ̄]]`` with ``|x|² = p² + b² + c² + q² − 2|λ|²`` and
        ``|λ|² = pq − bc``, so ``|x| = √((p − q)² + (b + c)²)``: the departure is the norm of
        the entries above the blocks with each block's ``b`` replaced by that ``|x|``, with no
        complex arithmetic and no cancellation against ``Σ|λ|²`` (exact to rounding, O(n²)).
    """
    t = np.asarray(t)
    if t.dtype.kind == "c":
        return float(np.linalg.norm(np.triu(t, 1)))
    rows = np.flatnonzero(np.diagonal(t, offset=-1))  # the first row of each 2×2 block
    upper = np.triu(t, 1)
    block = np.hypot(t[rows, rows] - t[rows + 1, rows + 1], t[rows, rows + 1] + t[rows + 1, rows])
    upper[rows, rows + 1] = 0.0
    return float(np.hypot(np.linalg.norm(upper), np.linalg.norm(block)))


def numerical_abscissa(M: ArrayLike) -> np.ndarray:
    """Numerical abscissa ``λ_max(½(M + Mᴴ))`` (batched): the initial growth rate of ``‖e^{tM}‖``.

    Parameters
    ----------
    M : array_like, shape (..., n, n)

    Returns
    -------
    numpy.ndarray, shape (...), float64
        Accurate to about ``n ε ‖M‖`` (symmetric eigensolver).

    Raises
    ------
    InputError
        If ``M`` is not a finite batch of square matrices.

    Notes
    -----
    Cost O(n³) per matrix.
    """
    arr = as_square(M, "M", batched=True)
    herm = 0.5 * (arr + np.conj(np.swapaxes(arr, -1, -2)))
    return guarded.eigvalsh(herm)[..., -1]


def _radius_one(M: np.ndarray, n_grid: int, xatol: float) -> float:
    herm = 0.5 * (M + M.conj().T)
    if signature_nonnegative(M):  # real, with D = I when M ≥ 0
        # N = DMD ≥ 0 for a signature D: |x*Nx| ≤ |x|ᵀ N |x|, so w(N) = λ_max(½(N + Nᵀ)),
        # and w(M) = w(N) with ½(N + Nᵀ) = D herm D orthogonally similar to herm: θ = 0 attains the maximum.
        return float(guarded.eigvalsh(herm)[-1])
    skew = 0.5j * (M - M.conj().T)

    def at(theta: float) -> np.ndarray:
        return np.cos(theta) * herm + np.sin(theta) * skew

    # H(θ + π) = −H(θ): each eigendecomposition on [0, π) gives f at θ and at θ + π.
    thetas = np.arange(n_grid) * (np.pi / n_grid)
    ends = np.array([guarded.eigvalsh(at(t))[[0, -1]] for t in thetas])
    grid = np.concatenate([thetas, thetas + np.pi])
    vals = np.concatenate([ends[:, 1], -ends[:, 0]])
    h = np.pi / n_grid
    best = float(vals.max())
    # f is ‖M‖-Lipschitz: only cells whose grid value is within ‖M‖h/2 of the best can hold the maximum.
    slack = guarded.norm2(M) * h / 2
    peaks = (vals >= np.roll(vals, 1)) & (vals >= np.roll(vals, -1)) & (vals >= best - slack)
    for k in np.flatnonzero(peaks)[np.argsort(-vals[peaks])][:8]:
        res = scipy.optimize.minimize_scalar(
            lambda t: -guarded.eigvalsh(at(t))[-1], bounds=(grid[k] - h, grid[k] + h), method="bounded", options={"xatol": xatol}
        )
        best = max(best, -float(res.fun))
    return best


def numerical_radius(M: ArrayLike, n_grid: int = 32, xatol: float = 1e-10) -> np.ndarray:
    """Numerical radius ``w(M) = max_θ λ_max(½(e^{iθ}M + e^{−iθ}Mᴴ)) = max_{‖x‖=1} |x*Mx|`` (batched).

    Parameters
    ----------
    M : array_like, shape (..., n, n)
    n_grid : int
        Eigendecompositions on the coarse grid; they give ``f(θ)`` at 2·n_grid equally
        spaced angles on [0, 2π) (``f(θ + π) = −λ_min(H(θ))``).
    xatol : float
        Angle tolerance of the bounded Brent refinement.

    Returns
    -------
    numpy.ndarray, shape (...), float64
        A value ``v`` that is attained (``v ≤ w``) and satisfies ``w − v ≤ ‖M‖ π / (2 n_grid)``
        rigorously (``f`` is ``‖M‖``-Lipschitz in θ). The grid local maxima that could hold
        the global one (at most 8, best first) are refined over ±one grid step; where the
        maximiser lies in a refined cell and ``f`` is unimodal there (the generic case),
        ``|w − v|`` is at rounding level, about ``n ε ‖M‖``.
        Real non-negative matrices (e.g. attention A) are answered exactly by θ = 0:
        ``|x*Mx| ≤ |x|ᵀ M |x|``, so ``w = λ_max(½(M + Mᵀ))``; so are real matrices with a
        signature ``D = diag(±1)`` making ``DMD`` non-negative (e.g. deflated attention
        ``B = A − 1e₁ᵀ``, :func:`~depthlens.linalg.kreiss_search.signature_nonnegative`):
        ``w`` is unitarily invariant and ``½(DMD + DMᵀD)`` has the eigenvalues of ``½(M + Mᵀ)``.

    Raises
    ------
    InputError
        If ``M`` is not a finite batch of square matrices or n_grid < 2.

    Notes
    -----
    Cost: n_grid + (about 30 per refined cell) Hermitian eigendecompositions, O(n³) each,
    per matrix; one for the two kinds answered by θ = 0 (plus an O(n²) signature check).
    """
    arr = as_square(M, "M", batched=True)
    if isinstance(n_grid, bool) or not isinstance(n_grid, (int, np.integer)) or n_grid < 2:
        raise InputError(f"n_grid is {n_grid!r}; pass an integer ≥ 2.")
    flat = arr.reshape(-1, *arr.shape[-2:])
    return np.array([_radius_one(m, int(n_grid), xatol) for m in flat]).reshape(arr.shape[:-2])


def symmetry_index(M: ArrayLike) -> np.ndarray:
    """Symmetric share of the energy ``‖(M + Mᵀ)/2‖_F² / ‖M‖_F²`` (batched).

    1 for symmetric, 0 for skew-symmetric matrices (plain transpose, also for complex M).

    Parameters
    ----------
    M : array_like, shape (..., n, n)

    Returns
    -------
    numpy.ndarray, shape (...), float64
        Exact to rounding. The zero matrix (symmetric) gives 1.

    Raises
    ------
    InputError
        If ``M`` is not a finite batch of square matrices.
    """
    arr = as_square(M, "M", batched=True)
    sym = _fro(0.5 * (arr + np.swapaxes(arr, -1, -2))) ** 2
    total = _fro(arr) ** 2
    return np.divide(sym, total, out=np.ones_like(total), where=total > 0)


def _spectrum(values: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in "biufc" or arr.ndim < 1 or arr.shape[-1] == 0:
        raise InputError(f"{name} has shape {arr.shape} and dtype {arr.dtype}; pass a non-empty numeric array (..., n).")
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{name} has non-finite values; pass finite eigenvalues or singular values.")
    return arr


def complex_fraction(eigvals: ArrayLike, rel: float = 1e-8) -> np.ndarray:
    """Fraction of eigenvalues off the real axis: ``|Im λ| > rel · max|λ|`` (§B2 ``complex_frac``).

    Parameters
    ----------
    eigvals : array_like, shape (..., n)
        Eigenvalues; the last axis is reduced.
    rel : float
        Threshold relative to the spectral radius (all-zero spectra count as real).

    Returns
    -------
    numpy.ndarray, shape (...), float64 in [0, 1]

    Raises
    ------
    InputError
        If eigvals is empty or not finite.
    """
    lam = _spectrum(eigvals, "eigvals")
    scale = np.abs(lam).max(axis=-1, keepdims=True)
    return np.mean(np.abs(np.imag(lam)) > rel * scale, axis=-1)


def rotation_angle_mean(eigvals: ArrayLike, rel: float = 1e-5) -> np.ndarray:
    """Mean rotation angle ``mean |arg μ|`` in radians, in [0, π] (§B2 ``rot_angle_mean``, on U's eigenvalues).

    Parameters
    ----------
    eigvals : array_like, shape (..., n)
        Eigenvalues; the last axis is reduced.
    rel : float
        Eigenvalues with ``|μ| ≤ rel · max|μ|`` are zero to working precision and count
        with angle 0, as an exact zero does. Their computed argument is rounding noise: a
        low-rank update (the isolated attention update has rank ≤ n_kv·head_dim) has many
        such eigenvalues, and operators averaged from float32 Jacobians carry errors of
        about 1e-7 relative, so unthresholded the mean moved by 5e-3 between thread counts.
        The default keeps a margin of 100 over that.

    Returns
    -------
    numpy.ndarray, shape (...), float64

    Raises
    ------
    InputError
        If eigvals is empty or not finite.
    """
    mu = _spectrum(eigvals, "eigvals")
    scale = np.abs(mu).max(axis=-1, keepdims=True)
    angle = np.where(np.abs(mu) > rel * scale, np.abs(np.angle(mu)), 0.0)
    return np.mean(angle, axis=-1)


def expansion_fraction(values: ArrayLike, tol: float = 1e-3) -> np.ndarray:
    """Fraction of moduli above one, ``|v| > 1 + tol`` (§B2 ``expand_eig`` on eigenvalues, ``expand_sv`` on singular values).

    Parameters
    ----------
    values : array_like, shape (..., n)
        Eigenvalues (complex allowed) or singular values; the last axis is reduced.
    tol : float
        Margin above 1.

    Returns
    -------
    numpy.ndarray, shape (...), float64 in [0, 1]

    Raises
    ------
    InputError
        If values is empty or not finite.
    """
    return np.mean(np.abs(_spectrum(values, "values")) > 1.0 + tol, axis=-1)
