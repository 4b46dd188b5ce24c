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
from .kreiss_search import signature_nonnegative
from .sigma import DEFAULT_TOL, TriangularForm, check_engine, triangular_form

__all__ = ["PseudospectralExtremum", "SigmaGrid", "pseudospectral_abscissa", "pseudospectral_radius", "pseudospectrum"]


@dataclass(frozen=True, eq=False)
class SigmaGrid:
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
    M: object,
    grid_x: object,
    grid_y: object,
    *,
    engine: str = "numba",
    tol: float = DEFAULT_TOL,
    device: str = "cpu",
) -> SigmaGrid:
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
    engine : {"numba", "numpy", "torch"}
        ``"torch"``: every point at once with batched triangular solves on ``device``
        (:func:`~depthlens.linalg.sigma_torch.sigma_min_torch`; same stopping rule, no warm
        starts, loads torch).
    tol : float
        Relative stopping tolerance of the inverse iteration, in ``(0, 1)``.
    device : str
        The torch device of ``engine="torch"`` (``"cpu"``, ``"cuda"``, ...); only ``"cpu"``
        with the other engines.

    Returns
    -------
    SigmaGrid

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
    if engine != "torch":
        check_engine(engine)
        if device != "cpu":
            raise InputError(f"device={device!r} needs engine='torch'; the {engine} engine runs on the CPU.")
    x, y = _axis(grid_x, "grid_x"), _axis(grid_y, "grid_y")
    if not 0.0 < tol < 1.0:
        raise InputError(f"tol={tol} is out of range; pass a relative tolerance in (0, 1).")
    tf = triangular_form(A)
    if engine == "torch":
        from .sigma_torch import sigma_min_torch  # torch loads only here

        r = sigma_min_torch(tf, x[None, :] + 1j * y[:, None], device=device, tol=tol)
        return SigmaGrid(x, y, r.sigma, r.method, r.n_fallback)
    Z = x[None, :] + 1j * y[:, None]
    Z[1::2] = Z[1::2, ::-1]
    ev = tf.evaluate(Z.reshape(-1), engine=engine, tol=tol, residuals=False)
    S = ev.sigma.reshape(Z.shape)
    S[1::2] = S[1::2, ::-1]
    method = "schur" if tf.kind == "schur" else f"triangular-{tf.kind}"
    return SigmaGrid(x, y, S, method, int(np.count_nonzero(~ev.converged)))


@dataclass(frozen=True)
class PseudospectralExtremum:
    """Pseudospectral radius or abscissa with the point attaining it.

    Attributes
    ----------
    value : float
        ``ρ_ε`` (max ``|z|``) or ``α_ε`` (max ``Re z``) over the points found on the level set
        ``σ_min(zI − M) = ε``: always the coordinate of a point actually found with
        ``σ_min ≤ ε`` up to the root-finding tolerance, hence a lower bound (see the function
        docs for when it can fall short of the true value).
    z : complex
        The boundary point attaining ``value``.
    eps : float
    n_evals : int
        ``σ_min`` evaluations.
    method : str
        ``"lines-march-pruned+brent+local-angle"``: coarse search lines marched inwards in
        batches with Newton steps (at least the Lipschitz-safe step, never past an
        eigenvalue's ε-disk), dropped once they pass below the best crossing found so far; Brent on each surviving crossing; then, around the best coarse
        line(s), Brent on the derivative of the crossing with respect to the line parameter
        (bounded scalar search where that has no sign change), each crossing found by the same
        march started 5% above the coarse peak. ``"positive-real-axis-march+brent"``: the same
        march and Brent on the positive real axis alone, where that axis attains the radius
        (:func:`pseudospectral_radius`).
    """

    value: float
    z: complex
    eps: float
    n_evals: int
    method: str


_METHOD = "lines-march-pruned+brent+local-angle"
_AXIS_METHOD = "positive-real-axis-march+brent"
_FINISH_GAP = 1e-3  # march until σ − ε ≤ this · ε, then bracket and Brent
_MAX_STEPS = 200
_NEWTON_CAP = 50.0  # a march step is at most this many Lipschitz-safe steps
_OUTER_REFINE = True  # refinement roots: outermost march from just above the peak (else local roots)
_OUTER_MARGIN = 0.05  # that march starts this fraction above the coarse peak's crossing
_N_REFINE = 2  # local maxima of the coarse profile refined in the line parameter


class _Lines:
    """Search lines ``z(p, s) = base(p) + s·dir(p)``, ``s`` decreasing from outside ``Λ_ε``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def z(self, p: np.ndarray, s: np.ndarray) -> np.ndarray:
        return s * np.exp(1j * p) if self.kind == "radius" else s + 1j * p


def _disk_entry(kind: str, p: np.ndarray, lam: np.ndarray, eps: float) -> np.ndarray:
    """Largest ``s`` on each line with ``|z(p, s) − λ| ≤ ε`` for some eigenvalue ``λ`` (``-inf`` if none).

    ``σ_min(zI − T) ≤ |z − λ|`` for every eigenvalue ``λ = T_ii`` of the triangular form, so
    these points are in ``Λ_ε`` (of ``T``) without evaluation; the march never steps past them.
    """
    if kind == "radius":
        a = np.real(lam[None, :] * np.exp(-1j * p)[:, None])
        disc = a * a - np.abs(lam[None, :]) ** 2 + eps * eps
        ent = np.where(disc >= 0.0, a + np.sqrt(np.maximum(disc, 0.0)), -np.inf)
        ent = np.where(ent >= 0.0, ent, -np.inf)
    else:
        disc = eps * eps - (p[:, None] - lam.imag[None, :]) ** 2
        ent = np.where(disc >= 0.0, lam.real[None, :] + np.sqrt(np.maximum(disc, 0.0)), -np.inf)
    return ent.max(axis=1) if lam.size else np.full(p.size, -np.inf)


class _Search:
    """Evaluation counter and the scalar level function ``g(p, s) = σ_min(z(p, s)) − ε``."""

    def __init__(
        self, tf: TriangularForm, lines: _Lines, eps: float, engine: str, s_min: float, s0: float, outer: bool
    ) -> None:
        self.tf, self.lines, self.eps, self.engine, self.s_min = tf, lines, eps, engine, s_min
        self.s0, self.lam, self.outer = s0, tf.eigenvalues, outer
        self.count = 0

    def sigma(self, p: np.ndarray, s: np.ndarray) -> np.ndarray:
        self.count += int(p.size)
        return self.tf.evaluate(self.lines.z(p, s), engine=self.engine, residuals=False).sigma

    def sigma_slope(self, p: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``σ_min`` and ``c = uᴴv`` (``g = conj(c)`` is the gradient) at ``z(p, s)``."""
        self.count += int(p.size)
        ev = self.tf.evaluate(self.lines.z(p, s), vectors=True, engine=self.engine, residuals=False)
        assert ev.c is not None
        return ev.sigma, ev.c

    def g(self, pp: float, ss: float) -> float:
        return float(self.sigma(np.array([pp]), np.array([ss]))[0]) - self.eps

    def brent(self, pp: float, lo: float, hi: float) -> float:
        xtol = 1e-14 * max(1.0, abs(lo), abs(hi))
        return float(scipy.optimize.brentq(lambda t: self.g(pp, t), lo, hi, xtol=xtol, rtol=4 * np.finfo(float).eps))

    def finish(self, pp: float, hi: float, g_hi: float, floor: float, disk: float = -np.inf) -> float:
        """Crossing below ``hi`` (``g(hi) = g_hi``); ``-inf`` if it is certified below ``floor``.

        Brackets by doubling steps inwards from ``2·g_hi`` (σ − ε ≤ ``_FINISH_GAP·ε`` at
        ``hi``, so the bracket is a few times that wide), then Brent.
        """
        if g_hi <= 0.0:
            return hi
        step = 2.0 * g_hi
        lo = max(hi - step, disk) if disk < hi else hi - step
        g_lo = self.g(pp, lo)
        while g_lo > 0.0 and lo > self.s_min:
            if lo - g_lo <= floor:  # Lipschitz: no crossing in (lo − g_lo, lo]; rest is below floor
                return -np.inf
            step *= 2.0
            lo = max(hi - step, disk) if disk < lo else hi - step
            g_lo = self.g(pp, lo)
        if g_lo > 0.0:
            return -np.inf
        return self.brent(pp, lo, hi)

    def local(self, pp: float, s_ref: float) -> float:
        """A crossing on line ``pp`` near ``s_ref`` (local bracket then Brent); ``-inf`` if none."""
        g0 = self.g(pp, s_ref)
        step = max(2.0 * abs(g0), 1e-12 * max(1.0, abs(s_ref)))
        for _ in range(60):
            t = s_ref - step if g0 > 0.0 else s_ref + step
            if g0 > 0.0 and t <= self.s_min:
                return -np.inf
            gt = self.g(pp, t)
            if (gt <= 0.0) != (g0 <= 0.0):
                lo, hi = (t, s_ref) if g0 > 0.0 else (s_ref, t)
                return self.brent(pp, lo, hi)
            step *= 2.0
        return -np.inf


def _coarse(search: _Search, p: np.ndarray, s0: float, floor: float, disk: np.ndarray) -> np.ndarray:
    """Outermost crossing ``s ≤ s0`` found on each line, or ``-inf`` where none lies above the floor.

    All lines march inwards together (one batched kernel call per step). A step is the Newton
    step ``(σ − ε)/(∂σ/∂s)`` from the singular vectors (``∂σ/∂s = Re(conj(dz/ds)·g)``),
    at least the Lipschitz-safe step ``σ − ε`` (``σ_min`` is 1-Lipschitz and ``|dz/ds| = 1``,
    so no crossing lies within ``σ − ε``) and at most ``_NEWTON_CAP`` times it. A step that
    lands inside ``Λ_ε`` brackets a crossing, which Brent finishes; no step goes past ``disk``,
    the line's entry into the ε-disk of an eigenvalue (known to be in ``Λ_ε``), so the component
    of ``Λ_ε`` around each eigenvalue on a line is never stepped over; a line that gets within
    ``_FINISH_GAP·ε`` of the level (or runs out of steps) is finished by
    :meth:`_Search.finish`. Lines are dropped once their march passes the floor (the largest
    crossing found so far). What is not certified: a Newton step can step over a crossing when
    ``σ_min − ε`` changes sign twice within that one step (a thin sliver of ``Λ_ε``), and Brent
    finds one crossing of the bracketed interval, not necessarily its outermost.
    """
    eps = search.eps
    s = np.full(p.size, float(s0))
    s_prev = np.full(p.size, np.nan)
    out = np.full(p.size, -np.inf)
    active = np.ones(p.size, dtype=bool)
    d = np.exp(1j * p) if search.lines.kind == "radius" else np.ones(p.size, dtype=complex)
    for _ in range(_MAX_STEPS):
        active &= s > max(search.s_min, floor)
        idx = np.flatnonzero(active)
        if not idx.size:
            break
        sig, c = search.sigma_slope(p[idx], s[idx])
        gap = sig - eps
        slope = np.real(d[idx].conj() * c.conj())
        inside = gap <= 0.0
        near = (gap <= _FINISH_GAP * eps) & ~inside
        for j in idx[inside]:  # a Newton step crossed the level: bracket [s, s_prev]
            active[j] = False
            if s_prev[j] > floor:
                out[j] = search.brent(float(p[j]), float(s[j]), float(s_prev[j]))
                floor = max(floor, out[j])
        order = np.argsort(-s[idx[near]])
        for j, gj in zip(idx[near][order], gap[near][order]):
            active[j] = False
            if s[j] > floor:
                out[j] = search.finish(float(p[j]), float(s[j]), float(gj), floor, float(disk[j]))
                floor = max(floor, out[j])
        go = ~inside & ~near
        g, sl = gap[go], slope[go]
        step = np.where(sl > 0.0, g / np.maximum(sl, 1e-300), g)
        step = np.clip(step, g, _NEWTON_CAP * g)
        jg = idx[go]
        s_prev[jg] = s[jg]
        s_new = s[jg] - step
        s[jg] = np.where((disk[jg] < s[jg]) & (s_new < disk[jg]), disk[jg], s_new)
    for j in np.flatnonzero(active & (s > max(search.s_min, floor))):
        out[j] = search.finish(float(p[j]), float(s[j]), search.g(float(p[j]), float(s[j])), floor, float(disk[j]))
        floor = max(floor, out[j])
    return out


def _refine(
    search: _Search, p: np.ndarray, s: np.ndarray, k: int, lo_p: float, hi_p: float, bounded: bool
) -> tuple[float, float]:
    """Maximise the crossing ``r(q)`` over the line parameter ``q`` between the neighbours of line ``k``.

    ``r(q)`` is the outermost crossing on line ``q`` below ``(1 + _OUTER_MARGIN)`` times line
    ``k``'s crossing, found by the same march as the coarse lines (with ``_OUTER_REFINE`` off:
    a local Brent root near the last root found, cheaper but it can follow an inner branch
    past a kink of ``r``); its derivative comes
    from the gradient at the root: with ``g`` the gradient of ``σ_min``,
    ``r'(q) = −(∂σ/∂q)/(∂σ/∂s)``. A stationary coarse line (``r' = 0``, e.g. the real axis of a
    real matrix) is accepted when ``r'`` points back to it from both sides; otherwise Brent
    finds the zero of ``r'`` in the bracket where it changes sign from + to −. Where no such
    bracket exists a bounded scalar search on ``r`` is used instead. Returns the best
    ``(q, r(q))`` seen, never worse than line ``k``'s own crossing.
    """
    a = max(float(p[max(k - 1, 0)]), lo_p) if bounded else float(p[max(k - 1, 0)])
    b = min(float(p[min(k + 1, p.size - 1)]), hi_p) if bounded else float(p[min(k + 1, p.size - 1)])
    pk = float(p[k])
    best = [pk, float(s[k])]
    last = [float(s[k])]

    def root(q: float) -> float:
        if search.outer:
            qa = np.array([q])
            top = min(search.s0, float(s[k]) + _OUTER_MARGIN * max(abs(float(s[k])), search.eps))
            r = float(_coarse(search, qa, top, -np.inf, _disk_entry(search.lines.kind, qa, search.lam, search.eps))[0])
        else:
            r = search.local(q, last[0])
        if np.isfinite(r):
            last[0] = r
            if r > best[1]:
                best[0], best[1] = q, r
        return r

    def slope_at(q: float, r: float) -> float:
        _, c = search.sigma_slope(np.array([q]), np.array([r]))
        g = complex(np.conj(c[0]))
        if search.lines.kind == "radius":
            w = np.exp(-1j * q) * g
            return -r * w.imag / w.real if w.real > 0 else np.nan
        return -g.imag / g.real if g.real > 0 else np.nan

    def dr(q: float) -> float:
        r = root(q)
        return slope_at(q, r) if np.isfinite(r) else np.nan

    width = max(b - a, 0.0)
    d0 = slope_at(pk, float(s[k]))
    scale = max(1.0, abs(float(s[k])))
    if np.isfinite(d0) and abs(d0) <= 1e-10 * scale:  # stationary line: check both sides
        h = 1e-3 * width
        right = dr(pk + h) if pk + h <= b and h > 0 else -1.0
        left = dr(pk - h) if pk - h >= a and h > 0 else 1.0
        if right < 0.0 and left > 0.0:
            return best[0], best[1]
        lo_q, hi_q = (pk + h, b) if right >= 0.0 else (a, pk - h)
    elif np.isfinite(d0):
        lo_q, hi_q = (pk, b) if d0 > 0.0 else (a, pk)
    else:
        lo_q, hi_q = a, b
    if hi_q > lo_q:
        d_lo = d0 if lo_q == pk else dr(lo_q)
        d_hi = d0 if hi_q == pk else dr(hi_q)
        if np.isfinite(d_lo) and np.isfinite(d_hi) and d_lo > 0.0 > d_hi:
            def f(q: float) -> float:
                v = dr(q)
                return v if np.isfinite(v) else 0.0
            q = scipy.optimize.brentq(f, lo_q, hi_q, xtol=1e-12 * max(1.0, abs(hi_q)), rtol=1e-12)
            root(q)
        else:
            def neg(q: float) -> float:
                r = root(q)
                return -r if np.isfinite(r) else -best[1] + abs(best[1]) + 1.0
            scipy.optimize.minimize_scalar(neg, bounds=(lo_q, hi_q), method="bounded", options={"xatol": 1e-9})
    return best[0], best[1]


def _extreme(M: object, eps: float, kind: str, n_lines: int, engine: str) -> PseudospectralExtremum:
    A = as_square(M)
    check_engine(engine)
    if not (isinstance(eps, (int, float, np.floating)) and eps > 0 and math.isfinite(eps)):
        raise InputError(f"eps={eps!r} is not a positive finite number; pass eps > 0.")
    if int(n_lines) < 3:
        raise InputError(f"n_lines={n_lines} is too small; pass at least 3.")
    eps = float(eps)
    tf = triangular_form(A)
    lines = _Lines(kind)
    s0 = tf.norm_upper + eps * (1.0 + 1e-12) + 1e-300
    lam = tf.eigenvalues
    axis = kind == "radius" and tf.real_input and signature_nonnegative(A)
    if axis:  # the positive real axis attains ρ_ε (pseudospectral_radius's notes): one line
        lo_p, hi_p, p = 0.0, 0.0, np.zeros(1)
    elif kind == "radius":
        lo_p, hi_p = (0.0, math.pi) if tf.real_input else (-math.pi, math.pi)
        p = np.linspace(lo_p, hi_p, n_lines, endpoint=tf.real_input)
    else:
        lo_p, hi_p = (0.0 if tf.real_input else -s0), s0
        p = np.linspace(lo_p, hi_p, n_lines)
    if not axis:  # every connected component of Λ_ε contains an eigenvalue: add the lines through them
        through = np.angle(lam) if kind == "radius" else lam.imag
        if tf.real_input:
            through = np.abs(through)
        p = np.unique(np.concatenate([p, through[np.abs(lam) > 0] if kind == "radius" else through]))
    search = _Search(tf, lines, eps, engine, -float(s0) if kind == "abscissa" else 0.0, float(s0), _OUTER_REFINE)
    # The ε-disk about each eigenvalue of the triangular form lies in Λ_ε, so the line through
    # the outermost eigenvalue crosses at or beyond this floor (margin for rounding).
    extent = np.abs(lam) if kind == "radius" else lam.real
    floor = float(extent.max()) + eps * (1.0 - _FINISH_GAP)
    disk = _disk_entry(kind, p, lam, eps)
    s = _coarse(search, p, s0, floor, disk)
    if not np.any(np.isfinite(s)):  # only possible through rounding at the floor: search again without it
        s = _coarse(search, p, s0, -np.inf, disk)
    if not np.any(np.isfinite(s)):
        raise InputError(f"no point with sigma_min <= eps={eps} was found; eps is below the search resolution.")
    j = int(np.argmax(s))
    best_p, best_s = float(p[j]), float(s[j])
    # Local refinement in the line parameter around the best coarse line(s): the largest local
    # maxima of the coarse crossing profile, each between its neighbouring lines.
    finite = np.isfinite(s)
    peaks = [k for k in range(p.size) if finite[k] and (k == 0 or s[k] >= s[k - 1]) and (k == p.size - 1 or s[k] >= s[k + 1])]
    peaks = [] if axis else sorted(peaks, key=lambda k: -s[k])[:_N_REFINE]
    bounded = kind == "abscissa" or tf.real_input
    for k in peaks:
        pk, sk = _refine(search, p, s, k, lo_p, hi_p, bounded)
        if sk > best_s:
            best_p, best_s = pk, sk
    z = complex(lines.z(np.array([best_p]), np.array([best_s]))[0])
    return PseudospectralExtremum(best_s, z, eps, search.count, _AXIS_METHOD if axis else _METHOD)


def pseudospectral_radius(M: object, eps: float, *, n_lines: int = 64, engine: str = "numba") -> PseudospectralExtremum:
    """ε-pseudospectral radius ``ρ_ε(M) = max{|z| : σ_min(zI − M) ≤ ε}``.

    Method: on ``n_lines`` rays (``arg z ∈ [0, π]`` for real ``M``, by conjugate symmetry)
    plus the rays through every eigenvalue (each connected component of ``Λ_ε`` contains
    one), march inwards from ``|z| = ‖M‖ + ε`` (outside ``Λ_ε``), all rays batched per step,
    with Newton steps on ``σ_min − ε`` (at least the Lipschitz-safe step ``σ_min − ε``, at most
    50 times it, never past a ray's entry into the ε-disk of an eigenvalue); a ray is dropped
    once its march passes below the best crossing found so far (initially ``max|λ| + ε``,
    attained on the ray through the outermost eigenvalue). Each surviving
    crossing is finished with Brent's method (``xtol = 1e-14·max(1, r)``); then the crossing
    radius is maximised over the angle between the neighbours of the best two local maxima
    of the coarse profile (Brent on ``dr/dθ`` from the singular vectors, or a bounded scalar
    search), each crossing there found by the same march started 5% above the coarse peak.

    What is guaranteed: ``value`` is the radius of a point found on ``σ_min = ε`` by Brent
    (``σ_min(z) − ε`` is at rounding level there), hence a lower bound on ``ρ_ε``, and it is
    at least ``max|λ| + ε`` (up to rounding and, for a non-triangular ``M``, the Schur backward
    error). It can fall short of ``ρ_ε`` if the outermost part of ``Λ_ε`` lies between rays
    away from the best ray's neighbours, more than 5% beyond the best coarse crossing between
    two rays, or in a thin sliver that one Newton step crosses
    (``σ_min − ε`` changing sign twice within it). On the deflated causal attention heads of
    the benchmarks (n = 128, ε ∈ {1e-3, 1e-2, 1e-1}) it agrees with the previous
    Lipschitz-only march to about ``1e-15`` relative. For a normal matrix ``ρ_ε = ρ + ε``
    exactly.

    Real ``M`` with a signature ``D = diag(±1)`` making ``N = DMD`` non-negative (deflated
    causal attention ``B = A − 1e₁ᵀ``; :func:`~depthlens.linalg.kreiss_search.signature_nonnegative`,
    an exact check) take one line, the positive real axis, which then attains ``ρ_ε`` exactly:
    for ``|z| > ρ(M)`` the Neumann series gives ``|(zI − N)⁻¹| ≤ (|z|I − N)⁻¹`` entrywise and
    the 2-norm is monotone on non-negative matrices, so ``σ_min(zI − M) ≥ σ_min(|z|I − M)``
    (``D`` is orthogonal); and ``ρ_ε ≥ ρ(M) + ε``. On that axis ``σ_min(rI − M)`` increases
    with ``r > ρ(M)`` (the same entrywise argument), so the inward march meets one crossing, and
    ``ρ(M)``, the Perron root of ``N``, is an eigenvalue on it (the floor below holds). Same
    guarantee of the value (a point on the level set, to Brent's tolerance); a few dozen
    evaluations instead of hundreds.

    Cost: ``O(n³)`` once (Schur) unless triangular, then ``O(n²)`` per evaluation; a few
    hundred to about a thousand evaluations (``n_evals``).

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
    PseudospectralExtremum

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


def pseudospectral_abscissa(M: object, eps: float, *, n_lines: int = 64, engine: str = "numba") -> PseudospectralExtremum:
    """ε-pseudospectral abscissa ``α_ε(M) = max{Re z : σ_min(zI − M) ≤ ε}``.

    Same method and guarantees as :func:`pseudospectral_radius` with horizontal lines
    ``Im z = p`` (``p ≥ 0`` for real ``M``), including the lines through every eigenvalue,
    marched leftwards from ``Re z = ‖M‖ + ε``; the result is a lower bound, at least
    ``max Re λ + ε``. For a normal matrix ``α_ε = max Re λ + ε`` exactly.

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
    PseudospectralExtremum

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, ``eps`` is not positive, or ``n_lines < 3``.
    """
    return _extreme(M, eps, "abscissa", n_lines, engine)

