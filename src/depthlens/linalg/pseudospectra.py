"""ε-pseudospectra: ``σ_min(zI − M)`` on a grid, the pseudospectral radius and abscissa.

``Λ_ε(M) = {z : σ_min(zI − M) ≤ ε}``. The matrix is reduced to triangular form once
(:func:`~depthlens.linalg.sigma.triangular_form`), then every point costs ``O(n²)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.optimize

from ..errors import InputError
from ._checks import as_square
from .sigma import DEFAULT_TOL, TriangularForm, check_engine, triangular_form

__all__ = ["PseudospectralResult", "PseudospectrumResult", "pseudospectral_abscissa", "pseudospectral_radius", "pseudospectrum"]


@dataclass(frozen=True, eq=False)
class PseudospectrumResult:
    """``σ_min(zI − M)`` on the grid ``z = x + iy``.

    Attributes
    ----------
    x, y : ndarray
        Grid axes.
    sigma : ndarray, shape (len(y), len(x))
        ``σ_min(zI − M)`` at ``x[j] + i·y[i]``.
    method : str
        ``"triangular-lower"``, ``"triangular-upper"`` or ``"schur"``.
    n_fallback : int
        Points computed by the dense-SVD fallback.
    """

    x: np.ndarray
    y: np.ndarray
    sigma: np.ndarray
    method: str
    n_fallback: int


def _axis(v: object, name: str) -> np.ndarray:
    arr = np.asarray(v, dtype=float).reshape(-1) if np.asarray(v).dtype.kind in "biuf" else None
    if arr is None or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise InputError(f"{name} must be a non-empty 1-D array of finite real numbers.")
    return arr


def pseudospectrum(
    M: object, grid_x: object, grid_y: object, *, engine: str = "numba", tol: float = DEFAULT_TOL
) -> PseudospectrumResult:
    """``σ_min(zI − M)`` on a rectangular grid (contour it at ε for ``Λ_ε``).

    Exactness as :func:`~depthlens.linalg.sigma.sigma_min` (inverse iteration to ``tol``
    relative change, dense-SVD fallback where it does not converge within 200 steps; the
    remaining relative error is about ``tol/(1 − (σ_min/σ_2)²)``, so ``tol = 1e-11`` gives
    ``1e-8`` wherever the iteration converges). The grid is traversed
    row by row in snake order so each point starts from its neighbour's singular vector.

    Cost: one Schur form (``O(n³)``) unless ``M`` is triangular, then ``O(n²)`` per step per
    point, typically 4–8 steps.

    Parameters
    ----------
    M : array_like, shape (n, n)
    grid_x, grid_y : array_like, 1-D
        Real and imaginary axes.
    engine : {"numba", "numpy"}
    tol : float
        Relative stopping tolerance of the inverse iteration, in ``(0, 1)``.

    Returns
    -------
    PseudospectrumResult

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, an axis is empty or non-finite, or ``tol`` is
        out of range.

    Examples
    --------
    >>> import numpy as np
    >>> r = pseudospectrum(np.diag([0.5, -0.5]), [0.0, 1.0], [0.0])
    >>> np.round(r.sigma, 6).tolist()
    [[0.5, 0.5]]
    """
    A = as_square(M)
    check_engine(engine)
    x, y = _axis(grid_x, "grid_x"), _axis(grid_y, "grid_y")
    if not 0.0 < tol < 1.0:
        raise InputError(f"tol={tol} is out of range; pass a relative tolerance in (0, 1).")
    tf = triangular_form(A)
    Z = x[None, :] + 1j * y[:, None]
    Z[1::2] = Z[1::2, ::-1]
    ev = tf.evaluate(Z.reshape(-1), engine=engine, tol=tol, residuals=False)
    S = ev.sigma.reshape(Z.shape)
    S[1::2] = S[1::2, ::-1]
    method = "schur" if tf.kind == "schur" else f"triangular-{tf.kind}"
    return PseudospectrumResult(x, y, S, method, int(np.count_nonzero(~ev.converged)))


@dataclass(frozen=True)
class PseudospectralResult:
    """Pseudospectral radius or abscissa with the point attaining it.

    Attributes
    ----------
    value : float
        ``ρ_ε`` (max ``|z|``) or ``α_ε`` (max ``Re z``) over the points found on the level set
        ``σ_min(zI − M) = ε``; a lower bound if a component of ``Λ_ε`` were missed by every
        search line (see the function docs), exact to about ``1e-12`` otherwise.
    z : complex
        The boundary point attaining ``value``.
    eps : float
    n_evals : int
        ``σ_min`` evaluations.
    method : str
        ``"lines-march+brent+bounded-scalar"``: marches along search lines with
        Lipschitz-safe steps, Brent on the crossing, bounded scalar refinement across lines.
    """

    value: float
    z: complex
    eps: float
    n_evals: int
    method: str


class _Lines:
    """Search lines ``z(p, s) = base(p) + s·dir(p)``, ``s`` decreasing from outside ``Λ_ε``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def z(self, p: np.ndarray, s: np.ndarray) -> np.ndarray:
        return s * np.exp(1j * p) if self.kind == "radius" else s + 1j * p


def _outermost(
    tf: TriangularForm, lines: _Lines, p: np.ndarray, s0: float, eps: float, engine: str, counter: list[int]
) -> np.ndarray:
    """Largest ``s ≤ s0`` with ``σ_min(z(p, s)) ≤ ε`` on each line (``-inf`` if none above ``s_min``).

    ``σ_min`` is 1-Lipschitz in ``z`` and ``|dz/ds| = 1``, so from a point with ``σ > ε`` no
    crossing lies within ``σ − ε``: the march ``s ← s − (σ − ε)`` cannot step over the
    outermost crossing. Once within ``1e-3·ε`` (or after 200 steps) Brent's method finishes
    on a bracket certified by evaluation.
    """
    s = np.full(p.size, float(s0))
    s_min = -float(s0) if lines.kind == "abscissa" else 0.0
    active = np.ones(p.size, dtype=bool)
    for _ in range(200):
        idx = np.flatnonzero(active)
        if not idx.size:
            break
        sig = tf.evaluate(lines.z(p[idx], s[idx]), engine=engine, residuals=False).sigma
        counter[0] += idx.size
        gap = sig - eps
        s[idx] = np.where(gap > 1e-3 * eps, s[idx] - gap, s[idx])
        active[idx] = gap > 1e-3 * eps
        active &= s > s_min
    out = np.full(p.size, -np.inf)

    def g(pp: float, ss: float) -> float:
        counter[0] += 1
        return float(tf.evaluate(lines.z(np.array([pp]), np.array([ss])), engine=engine, residuals=False).sigma[0]) - eps

    for j in range(p.size):
        if s[j] <= s_min:
            continue
        hi, g_hi = s[j], g(p[j], s[j])
        if g_hi <= 0.0:
            out[j] = hi
            continue
        step = 2.0 * g_hi
        lo = hi - step
        g_lo = g(p[j], lo)
        while g_lo > 0.0 and lo > s_min:
            step *= 2.0
            lo = hi - step
            g_lo = g(p[j], lo)
        if g_lo > 0.0:
            continue
        out[j] = scipy.optimize.brentq(lambda t: g(p[j], t), lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    return out


def _extreme(M: object, eps: float, kind: str, n_lines: int, engine: str) -> PseudospectralResult:
    A = as_square(M)
    check_engine(engine)
    if not (isinstance(eps, (int, float, np.floating)) and eps > 0 and math.isfinite(eps)):
        raise InputError(f"eps={eps!r} is not a positive finite number; pass eps > 0.")
    if int(n_lines) < 3:
        raise InputError(f"n_lines={n_lines} is too small; pass at least 3.")
    tf = triangular_form(A)
    lines = _Lines(kind)
    s0 = tf.norm_upper + eps * (1.0 + 1e-12) + 1e-300
    counter = [0]
    if kind == "radius":
        lo_p, hi_p = (0.0, math.pi) if tf.real_input else (-math.pi, math.pi)
        p = np.linspace(lo_p, hi_p, n_lines, endpoint=tf.real_input)
    else:
        lo_p, hi_p = (0.0 if tf.real_input else -s0), s0
        p = np.linspace(lo_p, hi_p, n_lines)
    # Every connected component of Λ_ε contains an eigenvalue: add the lines through them.
    lam = tf.eigenvalues
    through = np.angle(lam) if kind == "radius" else lam.imag
    if tf.real_input:
        through = np.abs(through)
    p = np.unique(np.concatenate([p, through[np.abs(lam) > 0] if kind == "radius" else through]))
    s = _outermost(tf, lines, p, s0, eps, engine, counter)
    if not np.any(np.isfinite(s)):
        raise InputError(f"no point with sigma_min <= eps={eps} was found; eps is below the search resolution.")
    j = int(np.argmax(s))
    best_p, best_s = float(p[j]), float(s[j])

    def neg(pp: float) -> float:
        v = _outermost(tf, lines, np.array([pp]), s0, eps, engine, counter)[0]
        return -v if np.isfinite(v) else s0 + 1.0

    a, b = float(p[max(j - 1, 0)]), float(p[min(j + 1, p.size - 1)])
    if kind == "radius" and tf.real_input or kind == "abscissa":
        a, b = max(a, lo_p), min(b, hi_p)
    res = scipy.optimize.minimize_scalar(neg, bounds=(a, b), method="bounded", options={"xatol": 1e-10})
    if res.success and -res.fun > best_s:
        best_p, best_s = float(res.x), float(-res.fun)
    z = complex(lines.z(np.array([best_p]), np.array([best_s]))[0])
    return PseudospectralResult(best_s, z, float(eps), counter[0], "lines-march+brent+bounded-scalar")


def pseudospectral_radius(M: object, eps: float, *, n_lines: int = 64, engine: str = "numba") -> PseudospectralResult:
    """ε-pseudospectral radius ``ρ_ε(M) = max{|z| : σ_min(zI − M) ≤ ε}``.

    Method: on ``n_lines`` rays (``arg z ∈ [0, π]`` for real ``M``, by conjugate symmetry)
    plus the rays through every eigenvalue (each connected component of ``Λ_ε`` contains
    one), march inwards from ``|z| = ‖M‖ + ε`` (outside ``Λ_ε``) with steps ``σ_min − ε`` that cannot
    pass the outermost crossing, finish each crossing with Brent's method, then maximise the
    crossing radius over the angle between the neighbours of the best ray (bounded scalar
    search). For a normal matrix ``ρ_ε = ρ + ε`` exactly. The refinement is local: if the
    outermost point of a component lies between rays far from where the rays cross it, the
    value is a lower bound.

    Cost: ``O(n³)`` once (Schur) unless triangular, then ``O(n²)`` per evaluation; a few
    hundred to a few thousand evaluations.

    Parameters
    ----------
    M : array_like, shape (n, n)
    eps : float
        ``ε > 0``.
    n_lines : int
        Rays in the coarse search.
    engine : {"numba", "numpy"}

    Returns
    -------
    PseudospectralResult

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, ``eps`` is not positive, or ``n_lines < 3``.

    Examples
    --------
    >>> import numpy as np
    >>> round(pseudospectral_radius(np.diag([0.5, -0.2]), 0.1).value, 10)
    0.6
    """
    return _extreme(M, eps, "radius", n_lines, engine)


def pseudospectral_abscissa(M: object, eps: float, *, n_lines: int = 64, engine: str = "numba") -> PseudospectralResult:
    """ε-pseudospectral abscissa ``α_ε(M) = max{Re z : σ_min(zI − M) ≤ ε}``.

    Same method as :func:`pseudospectral_radius` with horizontal lines ``Im z = p``
    (``p ≥ 0`` for real ``M``), including the lines through every eigenvalue, marched leftwards from ``Re z = ‖M‖ + ε``. For a normal matrix
    ``α_ε = max Re λ + ε`` exactly.

    Parameters
    ----------
    M : array_like, shape (n, n)
    eps : float
        ``ε > 0``.
    n_lines : int
        Horizontal lines in the coarse search.
    engine : {"numba", "numpy"}

    Returns
    -------
    PseudospectralResult

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, ``eps`` is not positive, or ``n_lines < 3``.
    """
    return _extreme(M, eps, "abscissa", n_lines, engine)

