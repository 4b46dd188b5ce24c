"""Where the Kreiss ratio ``(|z|−1)/σ_min(zI−M)`` is evaluated: the value search and the
certified branch and bound.

* :func:`search`: a coarse grid in ``(log(|z|−1), arg z)``, then L-BFGS-B from the best grid
  maxima with the analytic gradient from the singular vectors; where :func:`axis_reduction`
  holds, a grid in ``log(r−1)`` on the positive real axis, then bounded Brent (about 30
  evaluations in place of 250); its best point is the lower ``value`` of
  :func:`~depthlens.linalg.kreiss.kreiss`.
* :class:`BranchBound`: annular sectors of ``1 < |z| < R`` (``R`` from the far-field bound
  ``(|z|−1)/(|z|−w)``, ``w`` the smaller of bounds on ``‖M‖`` and on the numerical radius),
  each bounded by the numerical range (:meth:`BranchBound._sector`), else by the
  second-order bound of :meth:`BranchBound._direct` with Cholesky-certified anchors for
  ``σ₂``, and by the deflated resolvent next to semisimple unit-circle eigenvalues, until the
  bracket meets ``rtol``; its lower end is certified at evaluated points
  (:meth:`BranchBound.certified_ratio`).
* :func:`axis_reduction`: an exactly checked condition (real triangular ``M``, ``ρ(M) ≤ 1``,
  ``DMD ≥ 0`` for a signature ``D``, as for every deflated causal stochastic matrix) under
  which ``K(M)`` is the supremum over the positive real axis, so the value search is
  one-dimensional and the branch and bound covers segments of ``(1, R)`` only (about 20×
  fewer cells and Cholesky certificates on attention matrices, n = 128).

The spectrum classification and the deflated matrix come from :mod:`depthlens.linalg.kreiss_bound`.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
from scipy.linalg.lapack import dpotrf as _dpotrf, zpotrf as _zpotrf

from . import guarded
from ._brent import MAXFUN, XATOL, refine
from ._kernels import signature_proposal
from .kreiss_bound import UnitCircle
from .sigma import TriangularForm

__all__ = ["BranchBound", "Objective", "axis_reduction", "search", "signature_nonnegative"]

_EPS = np.finfo(np.float64).eps
#: Directions per half-turn of the numerical-range bound (:meth:`BranchBound._sector`).
SECTOR_DIRECTIONS = 16
#: Multiples of the computed ``σ_min`` tried, largest first, as certified lower bounds on ``σ₂``
#: (:meth:`BranchBound.add_certificates`).
GAP_FACTORS = (6.0, 3.0, 1.6, 1.15, 1.05)


# ----------------------------------------------------------------------------- value search
class Objective:
    """``f(z) = (|z|−1)/σ_min(zI−M)`` in ``x = (t, θ)``, ``z = (1 + e^t) e^{iθ}``; tracks the best."""

    def __init__(self, tf: TriangularForm, engine: str) -> None:
        self.tf, self.engine = tf, engine
        self.n_evals = 0
        self.best = -math.inf
        self.best_z = 0j

    def record(self, z: np.ndarray, f: np.ndarray) -> None:
        self.n_evals += z.size
        if z.size:
            i = int(np.argmax(f))
            if f[i] > self.best:
                self.best, self.best_z = float(f[i]), complex(z[i])

    def values(self, z: np.ndarray, tol: float = 1e-14) -> np.ndarray:
        """``f`` at many points; each ``σ`` is ≥ ``σ_min`` (so ``f`` is a lower bound) at any ``tol``."""
        ev = self.tf.evaluate(z, engine=self.engine, tol=tol, residuals=False)
        f = _ratio(np.abs(z) - 1.0, ev.sigma)
        self.record(z, f)
        return f

    def refine_axis(self, lo: float, hi: float) -> None:
        """Bounded Brent (SciPy's, to ``|Δt| ≈ 1.5·10⁻⁸·|t| + 10⁻¹⁰``; compiled with the numba
        engine, :func:`~._brent.refine`, SciPy's where a point needs the dense fallback) for the
        largest ``f(1 + e^t)``, ``t ∈ [lo, hi]``, each point started from the previous one's right
        singular vector (a cold start costs tens of steps where ``σ_min ≈ σ₂``)."""
        found = refine(self.tf, lo, hi) if self.engine == "numba" else None
        if found is not None:
            return self.record(*found)
        start = None

        def neg(t: float) -> float:
            nonlocal start
            z = np.array([1.0 + math.exp(t)], dtype=np.complex128)
            ev = self.tf.evaluate(z, vectors=True, engine=self.engine, residuals=False, start=start)
            assert ev.VL is not None
            start = ev.VL[0] if ev.converged[0] else None
            f = _ratio(np.abs(z) - 1.0, ev.sigma)
            self.record(z, f)
            return -float(f[0])

        scipy.optimize.minimize_scalar(neg, bounds=(lo, hi), method="bounded",
                                       options={"xatol": XATOL, "maxiter": MAXFUN})

    def neg_log(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        """``−log f`` and its gradient in ``(t, θ)`` (``dσ = Re(c·dz)``, ``c = uᴴv``)."""
        t, th = float(x[0]), float(x[1])
        z = (1.0 + math.exp(t)) * complex(math.cos(th), math.sin(th))
        ev = self.tf.evaluate(np.array([z]), vectors=True, engine=self.engine, warm=False, residuals=False)
        sig = float(ev.sigma[0])
        assert ev.c is not None
        c = complex(ev.c[0])
        self.record(np.array([z]), _ratio(np.array([abs(z) - 1.0]), ev.sigma))
        if sig <= 0.0:
            return math.inf, np.zeros(2)
        dz_dt = math.exp(t) * complex(math.cos(th), math.sin(th))
        g_t = (c * dz_dt).real / sig - 1.0
        g_th = (c * 1j * z).real / sig
        return math.log(sig) - t, np.array([g_t, g_th])


def _ratio(num: np.ndarray, sig: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(sig > 0.0, num / np.where(sig > 0.0, sig, 1.0), math.inf)


def _local_maxima(F: np.ndarray, k: int) -> list[tuple[int, int]]:
    """Indices of up to ``k`` largest grid values that are maxima of their 3×3 neighbourhood."""
    P = np.pad(F, 1, mode="constant", constant_values=-np.inf)
    shifts = [P[1 + di : P.shape[0] - 1 + di, 1 + dj : P.shape[1] - 1 + dj] for di in (-1, 0, 1) for dj in (-1, 0, 1)]
    nb = np.max(np.stack(shifts), axis=0)
    idx = np.argwhere(F >= nb)
    order = np.argsort(-F[idx[:, 0], idx[:, 1]])
    picks = [tuple(int(v) for v in idx[j]) for j in order[:k]]
    return picks if picks else [tuple(int(v) for v in np.unravel_index(np.argmax(F), F.shape))]


def radial_points(circle: UnitCircle | None) -> np.ndarray:
    """``λ(1 + h)`` for every unit-circle eigenvalue ``λ`` and ``h ∈ {1e-6, 1e-9}``: where the
    ratio approaches its limit ``‖P_λ‖`` (empty without such eigenvalues)."""
    if circle is None:
        return np.empty(0, dtype=np.complex128)
    return (circle.lam[:, None] * (1.0 + np.array([1e-6, 1e-9]))[None]).ravel()


def search(tf: TriangularForm, engine: str, grid: tuple[int, int], starts: int, circle: UnitCircle | None,
           axis: bool = False) -> Objective:
    """Coarse grid in ``t = log(|z|−1)`` over ``[log 10⁻³, log(2‖M‖+1)]`` (``grid[0]`` values)
    and ``arg z`` (``grid[1]`` angles over ``[0, π]`` for real ``M``, twice as many over the
    circle otherwise), then L-BFGS-B in ``(t, θ)`` from the ``starts`` best local maxima; plus
    ``|z| = 10¹²(1+‖M‖)`` and the :func:`radial_points`.

    With ``axis`` (only where :func:`axis_reduction` holds, the caller's responsibility) the
    grid is ``r = 1 + e^t`` on the positive real axis (``grid[1]`` unused) and each of the
    ``starts`` best local maxima ``t_i`` is refined by :meth:`Objective.refine_axis` on
    ``[t_{i−1}, t_{i+1}]`` (``[log 10⁻¹², t_1]`` or ``[t_{nt−2}, log(2‖M‖+1) + 2]`` at an end of
    the grid, the bounds of the L-BFGS-B search), to ``|Δt| ≲ 10⁻⁸``: the ratio is smooth at a
    simple ``σ_min``, so that leaves ``f`` within about ``10⁻¹⁵`` relative of the local maximum.
    A maximum at the top end of the grid is not refined where the numerical-abscissa bound
    ``f(r) ≤ (r−1)/(r−h)``, ``h = λ_max(½(M+Mᵀ))`` (one eigensolve, only then; exact up to the
    rounding of ``h``), shows that nothing past ``r_{nt−2}`` exceeds the best value or the
    limit 1 at infinity (there, with ``σ_min ≈ σ₂``, every evaluation costs a hundred steps or
    more).
    """
    obj = Objective(tf, engine)
    N = max(tf.norm_upper, 1e-3)
    t_hi = math.log(2.0 * N + 1.0)
    t_lo = math.log(1e-3)
    nt, nth = grid
    if axis:
        ts = np.linspace(t_lo, t_hi, nt)
        F = obj.values((1.0 + np.exp(ts)).astype(np.complex128), tol=1e-8)  # start points only
        obj.values(np.concatenate([[1e12 * (1.0 + N)], radial_points(circle)]).astype(np.complex128))
        for i, _ in _local_maxima(F[:, None], starts):
            lo = ts[i - 1] if i > 0 else math.log(1e-12)
            if i == nt - 1:
                # f(r) ≤ (r−1)/(r−h) with h = λ_max(½(M+Mᵀ)), since σ_min(rI−M) ≥ r − h: for h ≤ 1
                # f ≤ 1 = lim_{r→∞} f everywhere (K = 1, the far point holds the value); for h > 1
                # the bound decreases in r, so past r_lo nothing beats its value there.
                h = support_value(tf.L, 0.0)
                r_lo = 1.0 + math.exp(lo)
                if h <= 1.0 or (r_lo > h and (r_lo - 1.0) / (r_lo - h) <= obj.best):
                    continue
            obj.refine_axis(lo, ts[i + 1] if i < nt - 1 else t_hi + 2.0)
        return obj
    th_hi = math.pi
    th_lo = 0.0 if tf.real_input else -math.pi
    if not tf.real_input:
        nth *= 2
    ts = np.linspace(t_lo, t_hi, nt)
    ths = np.linspace(th_lo, th_hi, nth, endpoint=tf.real_input)
    Z = (1.0 + np.exp(ts))[:, None] * np.exp(1j * ths)[None, :]
    Z[1::2] = Z[1::2, ::-1]  # snake order: neighbours are consecutive for warm starts
    F = obj.values(Z.reshape(-1), tol=1e-8).reshape(Z.shape)  # start points only; polished below
    F[1::2] = F[1::2, ::-1]
    # |z| → ∞ (K ≥ 1 always) and radial approach to semisimple unit-circle eigenvalues.
    obj.values(np.concatenate([[1e12 * (1.0 + N)], radial_points(circle)]).astype(np.complex128))
    bounds = [(math.log(1e-12), t_hi + 2.0), (0.0, math.pi) if tf.real_input else (None, None)]
    for i, j in _local_maxima(F, starts):
        x0 = np.array([ts[i], ths[j]])
        scipy.optimize.minimize(
            obj.neg_log, x0, jac=True, method="L-BFGS-B", bounds=bounds,
            options={"maxiter": 60, "ftol": 1e-15, "gtol": 1e-11},
        )
    return obj


def support_value(L: np.ndarray, phi: float) -> float:
    """``h(φ) = λ_max(½(e^{−iφ}L + e^{iφ}Lᴴ))``, the support function of the numerical range of
    ``L`` in direction ``φ`` (``h(0)`` is the numerical abscissa): the largest eigenvalue only,
    by a dense eigensolve (``O(n³)``; real for ``φ = 0`` and a real ``L``), accurate to about
    ``n·u·‖L‖``."""
    H = 0.5 * (L + L.conj().T) if phi == 0.0 else 0.5 * (np.exp(-1j * phi) * L + np.exp(1j * phi) * L.conj().T)
    n = L.shape[0]
    return float(guarded.eigvalsh(H, subset_by_index=(n - 1, n - 1))[-1])


# ----------------------------------------------------------------------------- positive real axis
def signature_nonnegative(M: np.ndarray) -> bool:
    """Whether a real ``M`` has a signature matrix ``D = diag(±1)`` with ``DMD ≥ 0`` entrywise.

    ``D`` is proposed by a breadth-first 2-colouring of the graph of nonzero entries
    (``d_j = d_i·sign(M_ij)``, compiled: :func:`~depthlens.linalg._kernels.signature_proposal`)
    and then verified on every entry; the verification is exact (products with ±1 are exact in
    floating point), so True is a fact about ``M`` as stored.
    A deflated causal row-stochastic matrix ``B = A − 1e₁ᵀ`` qualifies with
    ``D = diag(−1, 1, …, 1)``.
    """
    if np.iscomplexobj(M) or M.ndim != 2 or M.shape[0] != M.shape[1]:
        return False
    if np.any(np.diagonal(M) < 0.0):
        return False
    d = signature_proposal(np.ascontiguousarray(M, dtype=np.float64))
    return bool(np.all((d[:, None] * M) * d[None, :] >= 0.0))


def axis_reduction(M: np.ndarray, tf: TriangularForm) -> bool:
    """Whether ``K(M) = sup_{r>1} (r−1)/σ_min(rI−M)``: the supremum over ``|z| > 1`` is attained
    (or approached) on the positive real axis, so the branch and bound may cover ``(1, R)``
    only.

    Sufficient condition, checked exactly: ``M`` real, triangular (``ρ(M) = max|M_ii|``
    exactly) with ``ρ(M) ≤ 1``, and :func:`signature_nonnegative`. Proof: with ``|M| = DMD``,
    for ``|z| > 1 ≥ ρ(M)`` the Neumann series gives ``|(zI−|M|)⁻¹| ≤ Σ |M|^k |z|^{−k−1} =
    (|z|I−|M|)⁻¹`` entrywise, and the 2-norm is monotone on nonnegative matrices, so
    ``‖(zI−M)⁻¹‖ = ‖(zI−|M|)⁻¹‖ ≤ ‖(|z|I−|M|)⁻¹‖ = ‖(|z|I−M)⁻¹‖`` (``D`` is orthogonal).
    Hence ``(|z|−1)/σ_min(zI−M) ≤ (|z|−1)/σ_min(|z|I−M)`` for every ``|z| > 1``.
    """
    if tf.kind == "schur" or not tf.real_input:
        return False
    if float(np.abs(tf.eigenvalues).max(initial=0.0)) > 1.0:
        return False
    return signature_nonnegative(np.asarray(M))


# ----------------------------------------------------------------------------- branch and bound
def _linfrac_max(N0: np.ndarray, a: np.ndarray, D0: np.ndarray, c: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """``max_{|w|≤ρ} (N0 + Re(a w)) / (D0 + Re(c w))`` for ``|a| = 1`` and ``D0 > |c|ρ``.

    The smallest ``τ ≥ N0/D0`` with ``τD0 − N0 ≥ ρ|a − τc|``: the larger root of
    ``(D0² − ρ²|c|²)τ² − 2(D0N0 − ρ²Re(a c̄))τ + (N0² − ρ²) = 0``.
    """
    A2 = D0 * D0 - rho * rho * np.abs(c) ** 2
    B2 = D0 * N0 - rho * rho * (a * np.conj(c)).real
    C2 = N0 * N0 - rho * rho
    disc = np.sqrt(np.maximum(B2 * B2 - A2 * C2, 0.0))
    return np.maximum((B2 + disc) / A2, N0 / D0)


class _Cells:
    """Annular sectors ``r ∈ [r0, r1]``, ``θ ∈ [t0, t1]`` with their covering disks."""

    def __init__(self, r0: np.ndarray, r1: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> None:
        self.r0, self.r1, self.t0, self.t1 = r0, r1, t0, t1
        rc, tc = 0.5 * (r0 + r1), 0.5 * (t0 + t1)
        self.zc = rc * np.exp(1j * tc)
        corners = [r * np.exp(1j * t) for r in (r0, r1) for t in (t0, t1)]
        self.rho = np.max(np.abs(np.stack(corners) - self.zc), axis=0) * (1.0 + 4 * _EPS)

    def split(self) -> _Cells:
        radial = (self.r1 - self.r0) >= 0.5 * (self.r0 + self.r1) * (self.t1 - self.t0)
        rm, tm = 0.5 * (self.r0 + self.r1), 0.5 * (self.t0 + self.t1)
        r0 = np.concatenate([self.r0, np.where(radial, rm, self.r0)])
        r1 = np.concatenate([np.where(radial, rm, self.r1), self.r1])
        t0 = np.concatenate([self.t0, np.where(radial, self.t0, tm)])
        t1 = np.concatenate([np.where(radial, self.t1, tm), self.t1])
        return _Cells(r0, r1, t0, t1)

    def take(self, idx: np.ndarray) -> _Cells:
        c = object.__new__(_Cells)
        c.r0, c.r1, c.t0, c.t1 = self.r0[idx], self.r1[idx], self.t0[idx], self.t1[idx]
        c.zc, c.rho = self.zc[idx], self.rho[idx]
        return c

    @staticmethod
    def concat(a: _Cells, b: _Cells) -> _Cells:
        c = object.__new__(_Cells)
        for name in ("r0", "r1", "t0", "t1", "zc", "rho"):
            setattr(c, name, np.concatenate([getattr(a, name), getattr(b, name)]))
        return c


class BranchBound:
    """Certified bracket for ``K(M)``; see :func:`~depthlens.linalg.kreiss.kreiss`, and
    :meth:`bounds` and :meth:`_direct` for the cell bound, :meth:`certified_ratio` for the
    lower end."""

    def __init__(
        self, tf: TriangularForm, obj: Objective, circle: UnitCircle | None, engine: str, axis: bool = False
    ) -> None:
        self.tf, self.obj, self.circle, self.engine = tf, obj, circle, engine
        #: Cover only the positive real axis ``(1, R)``: valid only where :func:`axis_reduction`
        #: holds (the caller's responsibility); cells are then segments ``θ = 0``.
        self.axis = axis
        self.n = tf.n
        self.N = tf.norm_upper
        self.za = np.empty(0, dtype=np.complex128)  # anchors with σ₂ ≥ ga
        self.ga = np.empty(0)
        self.zb = np.empty(0, dtype=np.complex128)  # anchors with σ_min ≥ gb
        self.gb = np.empty(0)
        self.n_cells = self.n_evals = self.n_deflated = self.n_cholesky = 0
        self.lo = 1.0  # certified lower bound on K: the limit at |z| → ∞, raised by certified_ratio
        self._support: tuple[np.ndarray, np.ndarray] | None = None
        L = tf.L
        self._LH = np.ascontiguousarray(L.conj().T)
        self._gram = self._LH @ L  # LᴴL, once: SᴴS = |z|²I − z̄L − zLᴴ + LᴴL costs O(n²) per point
        self._fro_L = float(np.linalg.norm(L))

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """Directions ``φ_j`` and upper bounds ``h_j`` on the support function of the numerical
        range, ``h(φ) = max_{‖x‖=1} Re(e^{−iφ} xᴴMx) = λ_max(½(e^{−iφ}M + e^{iφ}Mᴴ))``.

        ``SECTOR_DIRECTIONS`` directions over ``[0, π]`` for real ``M`` (``h(−φ) = h(φ)``), twice as
        many over the circle otherwise, only ``φ = 0`` in :attr:`axis` mode; each ``λ_max`` by a
        dense eigensolve of the largest eigenvalue only plus the rounding margin at 0
        (``O(n³)`` each, computed once; real for ``φ = 0`` and a real ``M``).
        """
        if self._support is None:
            m = SECTOR_DIRECTIONS
            phi = (np.zeros(1) if self.axis else np.linspace(0.0, math.pi, m + 1) if self.tf.real_input
                   else np.linspace(-math.pi, math.pi, 2 * m, endpoint=False))
            h = np.array([support_value(self.tf.L, float(t)) for t in phi])
            self._support = (phi, h + self.margin(np.zeros(1))[0])
        return self._support

    def numerical_radius_upper(self) -> float:
        """Upper bound on the numerical radius ``w(M) = max_{‖x‖=1} |xᴴMx|`` from :meth:`support`.

        The numerical range lies in the polygon ``∩_j {Re(e^{−iφ_j}w) ≤ h_j}``; within the wedge
        between consecutive directions ``φ_j``, ``φ_{j+1}`` its points have modulus at most
        ``max(h_j, h_{j+1}, |v_j|)``, ``v_j`` the corner of the two lines when it lies in the
        wedge (``|w|`` is convex, so its maximum is at an extreme point). Inflated by ``1 + 16u``
        for the 2×2 solves. ``σ_min(zI−M) ≥ |z| − w(M)``, so ``w`` can replace ``‖M‖`` in the
        far-field bound.
        """
        phi, h = self.support()
        if not self.tf.real_input:  # close the circle of directions
            phi, h = np.append(phi, phi[0] + 2.0 * math.pi), np.append(h, h[0])
        p0, p1, h0, h1 = phi[:-1], phi[1:], h[:-1], h[1:]
        det = np.sin(p1 - p0)
        x = (h0 * np.sin(p1) - h1 * np.sin(p0)) / det
        y = (h1 * np.cos(p0) - h0 * np.cos(p1)) / det
        ang = np.arctan2(y, x)
        inside = np.cos(ang - 0.5 * (p0 + p1)) >= np.cos(0.5 * (p1 - p0))
        corner = np.where(inside, np.hypot(x, y), 0.0)
        return float(np.maximum(np.maximum(h0, h1), corner).max()) * (1.0 + 16.0 * _EPS)

    def _sector(self, cells: _Cells) -> np.ndarray:
        """Numerical-range bound of ``(|z|−1)/σ_min(zI−M)`` on each cell, no ``σ_min`` needed.

        For unit ``x``, ``‖(zI−M)x‖ ≥ |z − xᴴMx| ≥ Re(e^{−iφ}z) − h(φ)`` for every direction
        ``φ``; on a cell ``r ∈ [r0, r1]``, ``arg z ∈ [t0, t1]`` with ``|t − φ| ≤ π/2`` throughout,
        ``Re(e^{−iφ}z) ≥ r0·min(cos(t0−φ), cos(t1−φ))``. The best of the :meth:`support`
        directions, less the margin at the cell, gives ``σ_min ≥ g`` and the bound
        ``(r1−1)/g`` (``inf`` where ``g ≤ 0``).
        """
        phi, h = self.support()
        c0 = np.cos(cells.t0[:, None] - phi[None])
        c1 = np.cos(cells.t1[:, None] - phi[None])
        ok = (c0 >= 0.0) & (c1 >= 0.0) & ((cells.t1 - cells.t0) <= math.pi)[:, None]
        g = np.where(ok, cells.r0[:, None] * np.minimum(c0, c1) - h[None], -np.inf).max(1)
        g = g - self.margin(cells.r1)
        with np.errstate(divide="ignore"):
            return np.where(g > 0.0, (cells.r1 - 1.0) / np.where(g > 0.0, g, 1.0), np.inf)

    def margin(self, z: np.ndarray) -> np.ndarray:
        """Floating-point margin on every ``σ`` and residual near ``z``."""
        return 16.0 * self.n * _EPS * (np.abs(z) + self.N) + self.tf.backward_error

    def certified_ratio(self, z: np.ndarray, s: np.ndarray, res: np.ndarray) -> np.ndarray:
        """Certified lower bounds on ``K`` from evaluated points ``z`` with value ``s`` and
        explicitly computed residual ``res = ‖(zI−L)v − s·u‖`` of unit vectors ``u``, ``v``.

        ``σ_min(zI−M) ≤ ‖(zI−L)v‖/‖v‖ + ‖M − QTQᴴ‖ ≤ s + res + μ(z)`` with ``μ`` = :meth:`margin`
        (the rounding of the residual's mat-vec, ``γ_{n+2}(|z| + ‖|L|‖)``, within ``16n·u(|z| +
        ‖M‖)``, plus the Schur backward error), inflated by ``1 + 8n·u`` for the normalisation
        of ``u``, ``v`` and the final division; the numerator ``|z| − 1`` is lowered by ``4u|z|``
        for the rounding of ``|z|``. So each value is ``≤ (|z|−1)/σ_min(zI−M) ≤ K`` whatever the
        iteration that produced ``s``, ``u``, ``v`` (it enters only through the residual).
        """
        num = np.maximum(np.abs(z) - 1.0 - 4.0 * _EPS * np.abs(z), 0.0)
        return num / ((s + res + self.margin(z)) * (1.0 + 8.0 * self.n * _EPS))

    def certify_points(self, z: np.ndarray) -> None:
        """Raise :attr:`lo` by :meth:`certified_ratio` at ``z`` (one evaluation with residuals)."""
        if z.size:
            ev = self.tf.evaluate(z, engine=self.engine)
            self.n_evals += z.size
            self.lo = max(self.lo, float(self.certified_ratio(z, ev.sigma, ev.res_right).max()))

    def add_certificates(self, z: np.ndarray, s: np.ndarray, r: np.ndarray, V: np.ndarray, floor: np.ndarray) -> None:
        """Certify lower bounds on ``σ₂`` (else on ``σ_min``) at cell centres by Cholesky (no SVD).

        With ``S = zI − M``, ``G = SᴴS`` and ``v`` the computed right singular vector: if
        ``G − γ²I + 2γ²vvᴴ`` is positive definite then ``G − γ²I`` has at most one negative
        eigenvalue (a rank-one update moves at most one eigenvalue across 0), so
        ``σ₂(S) ≥ γ``; tried for ``γ = s·GAP_FACTORS`` above ``floor``. If none succeeds,
        ``G − γ²I ≻ 0`` with ``γ = (s − r)(1 − 10⁻⁶)`` certifies ``σ_min(S) ≥ γ``.

        ``G = |z|²I − z̄L − zLᴴ + LᴴL`` is formed in ``O(n²)`` from ``LᴴL`` computed once; its
        rounding error, with that of the factorisation, is at most
        ``e = 4(n+2)u((‖L‖_F + √n|z|)² + 3γ²)`` in norm (``‖L‖_F + √n|z|`` bounds ``‖S‖_F``
        and every term's magnitude), so a successful factorisation certifies ``√(γ² − e)``,
        stored as an anchor; both ``σ₂`` and ``σ_min`` are 1-Lipschitz in ``z``. For a real ``L``
        with real points and real vectors (the positive real axis) ``G`` and ``vvᵀ`` are real and
        the factorisation runs in real arithmetic (``dpotrf``, a quarter of the work of
        ``zpotrf``); ``G`` holds the same entries either way.
        """
        n = self.n
        idx = np.arange(n)
        real = not (np.iscomplexobj(self.tf.L) or np.any(z.imag) or np.any(V.imag))
        potrf = _dpotrf if real else _zpotrf
        zs, V = (z.real, V.real) if real else (z, V)
        for k in range(z.size):
            zk = zs[k]
            G = self._gram - zk.conjugate() * self.tf.L
            G -= zk * self._LH
            G[idx, idx] += abs(zk) ** 2
            vv = np.outer(V[k], V[k].conj())
            fro2 = (self._fro_L + math.sqrt(n) * abs(zk)) ** 2
            gaps = [s[k] * f for f in GAP_FACTORS if s[k] * f > floor[k]]
            tries = [(g, True) for g in gaps] + [((s[k] - r[k]) * (1.0 - 1e-6), False)]
            for gam, second in tries:
                if gam <= 0.0:
                    break
                H = G + (2.0 * gam * gam) * vv if second else G.copy()
                H[idx, idx] -= gam * gam
                _, info = potrf(H.T, lower=True, clean=False, overwrite_a=True)  # Hᵀ = H̄, as definite as H; no copy
                self.n_cholesky += 1
                if info == 0:
                    cert = math.sqrt(max(gam * gam - 4.0 * (n + 2) * _EPS * (fro2 + 3.0 * gam * gam), 0.0))
                    if second:
                        self.za, self.ga = np.append(self.za, z[k]), np.append(self.ga, cert)
                    else:
                        self.zb, self.gb = np.append(self.zb, z[k]), np.append(self.gb, cert)
                    break

    @staticmethod
    def _lipschitz(z: np.ndarray, za: np.ndarray, ga: np.ndarray) -> np.ndarray:
        if not za.size:
            return np.full(z.size, -np.inf)
        return (ga[None] - np.abs(z[:, None] - za[None, :])).max(1)

    def bounds(self, cells: _Cells, target: float) -> np.ndarray:
        """Upper bound of ``(|z|−1)/σ_min(zI−M)`` on each cell (``inf`` if none found): the
        :meth:`_sector` bound, and where that exceeds ``target`` the :meth:`_evaluated` one."""
        U = self._sector(cells)
        todo = np.flatnonzero(U > target)
        if todo.size:
            U[todo] = np.minimum(U[todo], self._evaluated(cells.take(todo), target))
        self.n_cells += cells.r0.size
        return U

    def _evaluated(self, cells: _Cells, target: float) -> np.ndarray:
        """Bounds from ``σ_min`` and its singular vectors at the cell centres: :meth:`_direct`,
        with Cholesky certificates added where they may bring a cell below ``target``, and
        :meth:`_deflated` next to unit-circle eigenvalues."""
        zc, rho = cells.zc, cells.rho
        ev = self.tf.evaluate(zc, vectors=True, engine=self.engine)
        self.n_evals += zc.size
        self.obj.record(zc, _ratio(np.abs(zc) - 1.0, ev.sigma))
        self.lo = max(self.lo, float(self.certified_ratio(zc, ev.sigma, ev.res_right).max()))
        assert ev.c is not None and ev.VL is not None
        res = np.maximum(ev.res_right, ev.res_left)
        U = self._direct(cells, ev.sigma, ev.c, res)
        if self.circle is not None:
            near = (U > target) & (
                (np.abs(zc[:, None] - self.circle.lam[None]).min(1) < 0.5 + rho) | ~np.isfinite(U)
            )
            if near.any():
                U[near] = np.minimum(U[near], self._deflated(cells.take(np.flatnonzero(near))))
        slope = rho * (1.0 + np.abs(ev.c))
        # certificates only where the largest gap tried would bring the cell below target
        hope = self._direct(cells, ev.sigma, ev.c, res, gap=GAP_FACTORS[0] * ev.sigma) <= target
        need = np.flatnonzero((U > target) & (rho < 0.5 * ev.sigma) & hope)
        if need.size:
            r_eff = res[need] + self.margin(zc[need])
            floor = ev.sigma[need] + 1.5 * slope[need] + 3.0 * r_eff
            self.add_certificates(zc[need], ev.sigma[need], r_eff, ev.VL[need], floor)
            U = np.minimum(U, self._direct(cells, ev.sigma, ev.c, res))
        return U

    def _direct(
        self, cells: _Cells, s: np.ndarray, c: np.ndarray, res: np.ndarray, gap: np.ndarray | None = None
    ) -> np.ndarray:
        """Second-order (Li–Li) bound where a certified gap exists, else first-order bounds
        (with ``gap``, the bound that lower bound on ``σ₂(z_c)`` would give: a forecast, not a bound).

        In bases ``[u, U₂]``, ``[v, V₂]`` the matrix ``(z_c + w)I − M`` has the corner
        ``α = s + δ + c w`` (``|δ| ≤ r``), off-diagonal blocks of norm ``≤ b = r + |w|√(1−|c|²)``
        and a trailing block with ``σ_min ≥ σ₂(z_c) − r − |w|``. On the Jordan–Wielandt
        dilation the Li–Li quadratic bound gives
        ``σ_min ≥ |s + c w| − r − 2b²/(η + √(η² + 4b²))`` with
        ``η = σ₂(z_c) − r − |w| − (s + r + |c||w|) > 0``, valid when
        ``s + r < σ₂(z_c) − r`` (the computed pair is the smallest). ``σ₂(z_c)`` is bounded
        below from anchors (dense SVDs, 1-Lipschitz). The ratio is then bounded by the
        maximum of a linear-fractional function over the disk, with
        ``|z| ≤ |z_c| + Re(ẑ̄_c w) + |w|²/(2|z_c|)``.
        """
        zc, rho, r1 = cells.zc, cells.rho, cells.r1
        mu = self.margin(zc)
        r = res + mu
        g = (self._lipschitz(zc, self.za, self.ga) if gap is None else gap) - mu
        ca = np.abs(c)
        valid = s + r < g - r
        b = r + rho * np.sqrt(np.maximum(1.0 - ca * ca, 0.0))
        eta = (g - r) - rho - (s + r + ca * rho)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            q = 2.0 * b * b / (eta + np.sqrt(eta * eta + 4.0 * b * b))
            D0 = s - r - q
            ok2 = valid & (eta > 0) & (D0 - ca * rho > 0)
            za = np.abs(zc)
            N0 = za - 1.0 + rho * rho / (2.0 * za)
            a = np.conj(zc) / za
            U2 = np.where(ok2, np.minimum(_linfrac_max(N0, a, D0, c, rho), (r1 - 1.0) / (D0 - ca * rho)), np.inf)
            lo1 = np.maximum(np.where(valid, s - r - rho, -np.inf), self._lipschitz(zc, self.zb, self.gb) - mu - rho)
            U1 = np.where(lo1 > 0, (r1 - 1.0) / lo1, np.inf)
        return np.minimum(U1, U2)

    def _deflated(self, cells: _Cells) -> np.ndarray:
        """Bound near semisimple unit-circle eigenvalues λ with projectors ``P_λ``:
        ``(|z|−1)‖(zI−M)⁻¹‖ ≤ Σ ‖P_λ‖ (|z|−1)/|z−λ| + (|z|−1)‖I−P_Γ‖/σ_min(zI−M')``, using
        ``(|z|−1)/|z−λ| ≤ 1`` and a dense ``σ_min(z_c I − M')`` (1-Lipschitz)."""
        assert self.circle is not None
        circ = self.circle
        zc, rho, r1 = cells.zc, cells.rho, cells.r1
        S = zc[:, None, None] * np.eye(self.n)[None] - circ.deflated[None]
        sd = guarded.svdvals(S)[:, -1] - rho - self.margin(zc)
        self.n_deflated += zc.size
        dist = np.abs(zc[:, None] - circ.lam[None]) - rho[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            near = np.where(dist > 0, np.minimum(1.0, (r1[:, None] - 1.0) / dist), 1.0)
            rest = np.where(sd > 0, (r1 - 1.0) * circ.complement_norm / sd, np.inf)
        rest = np.where(circ.complement_norm == 0.0, 0.0, rest)
        return (near * circ.proj_norms[None]).sum(1) + rest

    def run(self, rtol: float, max_evals: int, batch: int) -> tuple[float, float, float, str]:
        """Return ``(lo, hi, far_radius, stopped)``; ``lo`` is :attr:`lo` after certifying the
        search's best point and the radial points next to unit-circle eigenvalues.

        In :attr:`axis` mode the cells are segments of ``(1, R)`` and the far field uses
        ``σ_min(rI−M) ≥ r − h(0)`` (``h(0) = λ_max(½(M+Mᵀ))``, the numerical abscissa, one
        eigensolve) in place of the numerical radius: for real ``r``,
        ``‖(rI−M)x‖ ≥ xᵀ(rI−M)x ≥ r − h(0)``."""
        self.certify_points(np.concatenate([[self.obj.best_z], radial_points(self.circle)]).astype(np.complex128))
        # Cells are retired below target/shrink, so the final hi (inflated by shrink for
        # rounding) still meets hi ≤ lo(1 + rtol) exactly instead of missing it by 1e-13.
        shrink = 1.0 + 16.0 * self.n * _EPS
        tau = max(self.lo * (1.0 + rtol), 1.0 + 0.5 * rtol) / shrink
        N = min(self.N, float(self.support()[1][0]) if self.axis else self.numerical_radius_upper())
        if N <= 1.0:
            R, far = 2.0, 1.0
        else:
            R = max(2.0, (tau * N - 1.0) / (tau - 1.0) * (1.0 + 1e-12))
            far = (R - 1.0) / (R - N)
        nr = 12
        redges = 1.0 + np.concatenate([[0.0], np.geomspace(1e-2, R - 1.0, nr)])
        if self.axis:
            R0, R1 = redges[:-1], redges[1:]
            T0 = T1 = np.zeros(nr)
        else:
            nth = 12 if self.tf.real_input else 24
            tedges = np.linspace(0.0 if self.tf.real_input else -math.pi, math.pi, nth + 1)
            R0, T0 = np.meshgrid(redges[:-1], tedges[:-1], indexing="ij")
            R1, T1 = np.meshgrid(redges[1:], tedges[1:], indexing="ij")
        cells = _Cells(R0.ravel(), R1.ravel(), T0.ravel(), T1.ravel())
        U = self.bounds(cells, tau)
        hi_retired = far
        stopped = "rtol"
        while True:
            target = max(self.lo * (1.0 + rtol), 1.0 + 0.5 * rtol) / shrink
            done = U <= target
            if done.any():
                hi_retired = max(hi_retired, float(U[done].max()))
                keep = np.flatnonzero(~done)
                cells, U = cells.take(keep), U[keep]
            if not U.size:
                break
            if self.n_evals >= max_evals:
                stopped = "max_evals"
                break
            order = np.argsort(-U)
            top, rest = order[:batch], order[batch:]
            children = cells.take(top).split()
            Uc = self.bounds(children, target)
            cells = _Cells.concat(cells.take(rest), children)
            U = np.concatenate([U[rest], Uc])
        hi = max(hi_retired, float(U.max()) if U.size else -math.inf) * shrink
        return self.lo, hi, R, stopped
