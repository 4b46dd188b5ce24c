"""Kreiss constant ``K(M) = sup_{|z|>1} (|z|−1)/σ_min(zI−M)`` with a lower value, a cheap
rigorous upper bound, and (on request) a certified bracket.

Three numbers, three guarantees:

* ``value``: the largest ``(|z|−1)/σ_min(zI−M)`` at a point actually evaluated (a coarse grid
  in ``(log(|z|−1), arg z)``, then L-BFGS-B from the best grid points with the analytic
  gradient from the singular vectors). A lower bound on ``K`` up to the rounding of one
  ``σ_min`` (about ``1e-13`` relative).
* ``upper``: ``sup_{r>1} (r−1) Σ_k ‖M^k‖ r^{−(k+1)}`` (the Neumann series of the resolvent and
  the triangle inequality), with exactly computed ``‖M^k‖`` for ``k ≤ k0`` and a geometric
  tail from submultiplicativity; the sup over ``r`` is bounded on a grid using monotonicity.
  Rigorous up to floating point (see :func:`power_upper_bound`).
* ``lo``/``hi`` (``certify=True``): branch and bound over ``|z| > 1`` with a second-order lower
  bound on ``σ_min`` per cell (see :func:`_cell_bounds`) until ``hi/lo − 1 ≤ rtol``.

What "rigorous" covers here: the bounds hold in exact arithmetic for the matrix whose
triangular form is used; floating point is covered by explicit margins (``16·n·u·(|z|+‖M‖)``
added to every residual, the Schur backward error where ``M`` was not triangular, and a
relative ``4·(k0+1)·n·u`` on power norms). Nothing is interval-verified.

Matrices with ``ρ(M) ≥ 1``: an eigenvalue outside the closed unit disk makes ``K = ∞``
(``(|z|−1)/σ_min → ∞`` as ``z`` approaches it); so does a defective (non-trivial Jordan
block) eigenvalue on the unit circle. A semisimple eigenvalue ``λ`` on the circle with
spectral projector ``P_λ`` contributes the limit ``‖P_λ‖``, approached as ``z → λ`` radially
and not attained: for a causal row-stochastic ``A`` (simple Perron root 1, ``P = 1e₁ᵀ``) this
gives ``K(A) = √n``, and ``K(I) = 1``. "On the circle" means ``||λ| − 1| ≤ δ`` with ``δ = 8u``
for triangular input (exact eigenvalues) and ``δ = 10³·(Schur backward error)`` otherwise.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.optimize
from scipy.linalg.lapack import zpotrf as _potrf

from ..errors import InputError
from ._checks import as_square
from . import guarded
from ._kernels import horner
from .sigma import TriangularForm, check_engine, sigma_min, triangular_form
from .transients import iter_power_norms, spectral_norm

__all__ = ["BranchBoundRecord", "CertificationBudgetWarning", "KreissResult", "PowerBound", "kreiss", "power_upper_bound"]

_EPS = np.finfo(np.float64).eps


class CertificationBudgetWarning(RuntimeWarning):
    """``kreiss(..., certify=True)`` stopped at its evaluation budget (``max_evals``) before the
    bracket met ``rtol``: the returned ``[lo, hi]`` is valid but wider, ``certified`` is False and
    ``branch_bound.stopped`` is ``"max_evals"``. Callers that record this themselves (the
    attention stage flags ``kreiss_B_certified = 0``) may filter it."""


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class PowerBound:
    """Record of the power-norm upper bound.

    Attributes
    ----------
    value : float
        The bound on ``K`` (``inf`` when no finite bound exists).
    r : float
        The ``r > 1`` where the bound function was largest.
    k_exact : int
        Powers ``‖M^k‖`` computed (``k = 1 … k_exact``), exactly where :attr:`exact`.
    tail : str
        ``"contraction"`` (``‖M‖ < 1``: the bound is exactly 1), ``"nilpotent"`` (no tail), ``"geometric"`` (``‖M^{s+qm}‖ ≤ ‖M^s‖‖M^m‖^q``),
        ``"unit-circle"`` (``M^k = Σ λ^k P_λ + M'^k``, geometric tail on ``M'``) or ``"none"``.
    m : int
        The power used for the geometric tail (0 if none).
    norms : ndarray
        ``a_k`` for ``k = 0 … k_exact``: ``‖M^k‖`` where ``exact``, else a rigorous upper bound
        that was at most the largest exact norm before it.
    exact : ndarray of bool
        Which ``norms`` are exact.
    """

    value: float
    r: float
    k_exact: int
    tail: str
    m: int
    norms: np.ndarray = field(default_factory=lambda: np.ones(1))
    exact: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=bool))


@dataclass(frozen=True)
class BranchBoundRecord:
    """Record of the certified branch and bound over ``|z| > 1``.

    Attributes
    ----------
    cells : int
        Cells bounded.
    evaluations : int
        ``σ_min`` evaluations at cell centres (inverse iteration).
    anchors : int
        Points with a certified lower bound on ``σ₂`` (the gap for the second-order bound)
        or, failing that, on ``σ_min``.
    cholesky : int
        Cholesky factorisations tried for those certificates (``O(n³)`` each).
    deflated : int
        Dense SVDs of ``zI − M'`` for cells next to an eigenvalue on the unit circle.
    far_radius : float
        ``R``: for ``|z| ≥ R``, ``(|z|−1)/σ_min ≤ (R−1)/(R−‖M‖)`` (a bound on ``‖M‖``).
    stopped : str
        ``"rtol"`` (bracket met) or ``"max_evals"``.
    """

    cells: int
    evaluations: int
    anchors: int
    cholesky: int
    deflated: int
    far_radius: float
    stopped: str


@dataclass(frozen=True)
class KreissResult:
    """Kreiss constant of ``M`` (discrete time, unit disk, 2-norm) with its bounds.

    Attributes
    ----------
    value : float
        Largest ``(|z|−1)/σ_min(zI−M)`` at an evaluated point: a lower bound (``inf`` when
        ``K = ∞``).
    upper : float
        Rigorous (up to floating point) upper bound from power norms; ``inf`` when not
        computed or not finite.
    argmax : complex
        The evaluated point giving ``value`` (for ``K = ∞``, the offending eigenvalue).
    n_evals : int
        ``σ_min`` evaluations used (search plus branch and bound).
    circle_limit : float
        ``max ‖P_λ‖`` over semisimple eigenvalues on the unit circle (0 if none): the limit
        of ``(|z|−1)/σ_min`` as ``z → λ`` radially, a lower bound on ``K`` not attained.
    lo, hi : float or None
        Certified bracket (``certify=True``): ``lo ≤ K ≤ hi``.
    certified : bool
        ``hi/lo − 1 ≤ rtol`` was reached (always True for ``K = ∞``).
    method : str
        How ``value`` was obtained.
    power_bound : PowerBound or None
    branch_bound : BranchBoundRecord or None
    """

    value: float
    upper: float
    argmax: complex
    n_evals: int
    circle_limit: float
    lo: float | None
    hi: float | None
    certified: bool
    method: str
    power_bound: PowerBound | None
    branch_bound: BranchBoundRecord | None


# ----------------------------------------------------------------------------- spectrum
@dataclass(frozen=True, eq=False)
class _Circle:
    """Semisimple eigenvalues on the unit circle and the deflated matrix ``M' = M(I − P_Γ)``."""

    lam: np.ndarray  # distinct unit eigenvalues
    proj_norms: np.ndarray  # ‖P_λ‖
    deflated: np.ndarray  # M' (dense, basis of M)
    complement_norm: float  # ‖I − P_Γ‖


def _spectrum_status(A: np.ndarray, tf: TriangularForm) -> tuple[str, complex, _Circle | None]:
    """Classify the spectrum: ``("inside"|"circle"|"outside"|"defective", λ, circle)``."""
    lam = tf.eigenvalues
    n = tf.n
    delta = 8 * _EPS if tf.kind != "schur" else 1e3 * tf.backward_error
    mod = np.abs(lam)
    out = np.flatnonzero(mod > 1.0 + delta)
    if out.size:
        k = out[np.argmax(mod[out])]
        return "outside", complex(lam[k]), None
    on = np.flatnonzero(mod >= 1.0 - delta)
    if not on.size:
        return "inside", 0j, None
    centres: list[complex] = []
    counts: list[int] = []
    for k in on:
        for j, c in enumerate(centres):
            if abs(lam[k] - c) <= 10 * delta:
                counts[j] += 1
                break
        else:
            centres.append(complex(lam[k]))
            counts.append(1)
    scale = max(1.0, tf.norm_upper)
    projs = []
    for c, m in zip(centres, counts):
        U, s, Vh = guarded.svd(c * np.eye(n) - A)
        if s[n - m] > 1e3 * n * _EPS * scale:
            return "defective", c, None
        Um, Vm = U[:, n - m :], Vh[n - m :].conj().T
        projs.append(Vm @ guarded.solve(Um.conj().T @ Vm, Um.conj().T))
    P = np.sum(projs, axis=0)
    Md = A - sum(c * Pc for c, Pc in zip(centres, projs))
    circle = _Circle(
        lam=np.asarray(centres),
        proj_norms=np.array([spectral_norm(Pc) for Pc in projs]),
        deflated=Md,
        complement_norm=spectral_norm(np.eye(n) - P),
    )
    return "circle", centres[0], circle


# ----------------------------------------------------------------------------- upper bound
#: Powers whose norm the upper bound always computes exactly.
EXACT_POWERS = 12


def _norm_sequences(
    A: np.ndarray, deflated: np.ndarray | None, pi_sum: float, share: float, cap: int
) -> _BoundFunction:
    """``a_k ≥ ‖A^k‖`` (and ``b_k ≥ ‖M'^k‖`` when ``deflated`` is given, else ``b = a``), exact
    for ``k ≤ EXACT_POWERS`` and wherever a cheap bound exceeds the largest exact norm, for
    ``k = 1 … k0``, stopping when ``b`` vanishes (tail ``"nilpotent"``) or, once some
    ``b_m < 1``, when the geometric tail contributes at most ``share`` of ``max_r g(r)`` on a
    check grid. Tail ``"none"`` when that has not happened within ``cap`` powers (no finite
    bound; the norms are kept for the transient peak).
    """
    # Exact norms for the first EXACT_POWERS powers (where the bound's mass lies) and for any
    # power whose cheap bound exceeds every exact norm so far; rigorous cheap upper bounds
    # elsewhere. Upper bounds keep the bound rigorous, only slightly less tight.
    top = [0.0]
    chose = [True]

    def need_exact(k: int, bound: float) -> bool:
        chose[0] = k <= EXACT_POWERS or bound > top[0]
        return chose[0]

    a_it = iter_power_norms(A, need_exact)
    b_it = iter_power_norms(deflated, need_exact) if deflated is not None else None
    a, b, exact = [1.0], [1.0], [True]
    best_m, best_rate = 0, 0.0  # the m with b_m < 1 minimising log(b_m)/m
    # The stopping test runs on a fixed grid of r with running sums, O(grid) per power:
    # pw = r^{-(k+1)}, h = Σ_{j≤k} a_j r^{-j-1}, cum[k] = Σ_{j≤k} b_j r^{-j-1}. It only decides
    # where to stop; the returned bound function evaluates its series afresh.
    r = 1.0 + np.logspace(-4, 3, 80)
    log_r = np.log(r)
    pw = 1.0 / r
    h = pw.copy()
    cum = [pw.copy()]
    while len(a) - 1 < cap:
        a.append(next(a_it))
        exact.append(a[-1] == 0.0 or chose[0])
        top[0] = max(top[0], a[-1])
        b.append(next(b_it) if b_it is not None else a[-1])
        k = len(a) - 1
        if b[-1] == 0.0:
            return _BoundFunction(np.asarray(a), np.asarray(b), "nilpotent", 0, pi_sum, np.asarray(exact))
        with np.errstate(under="ignore"):
            pw = pw / r
            h = h + a[-1] * pw
            cum.append(cum[-1] + b[-1] * pw)
        if b[-1] < 1.0 and math.log(b[-1]) / k < best_rate:
            best_m, best_rate = k, math.log(b[-1]) / k
        if not best_m or k % 4:
            continue
        with np.errstate(under="ignore"):
            q = b[best_m] * np.exp(-best_m * log_r)
            tail = (cum[k] - cum[k - best_m]) * q / (1.0 - q)
            g = (r - 1.0) * (h + tail) + pi_sum * pw
        if ((r - 1.0) * tail).max() <= share * g.max():
            return _BoundFunction(np.asarray(a), np.asarray(b), "geometric", best_m, pi_sum, np.asarray(exact))
    return _BoundFunction(np.asarray(a), np.asarray(b), "none", 0, pi_sum, np.asarray(exact))


def _series(r: np.ndarray, coef: np.ndarray, first: int) -> np.ndarray:
    """``Σ_j coef_j r^{−(first+j)−1}`` by Horner in ``1/r`` (vector ``r > 1``)."""
    with np.errstate(under="ignore"):
        return horner(np.ascontiguousarray(coef, dtype=np.float64), 1.0 / r) * np.exp(-(first + 1) * np.log(r))


class _BoundFunction:
    """``g(r) = (r−1)·H(r) + Π·r^{−k0−1}`` with ``H`` decreasing in ``r`` (see ``power_upper_bound``)."""

    def __init__(self, a: np.ndarray, b: np.ndarray, tail: str, m: int, pi_sum: float, exact: np.ndarray) -> None:
        self.a, self.b, self.tail, self.m, self.pi, self.exact = a, b, tail, m, pi_sum, exact
        self.k0 = a.size - 1

    def tail_part(self, r: np.ndarray) -> np.ndarray:
        """Geometric bound on ``Σ_{k>k0} b_k r^{−k−1}`` (0 for a nilpotent tail)."""
        if self.tail != "geometric":
            return np.zeros_like(r)
        s0 = self.k0 - self.m + 1
        q = self.b[self.m] * np.exp(-self.m * np.log(r))
        return _series(r, self.b[s0:], s0) * q / (1.0 - q)

    def H(self, r: np.ndarray) -> np.ndarray:
        return _series(r, self.a, 0) + self.tail_part(r)

    def circle(self, r: np.ndarray) -> np.ndarray:
        return self.pi * np.exp(-(self.k0 + 1) * np.log(r)) if self.pi else np.zeros_like(r)

    def at(self, r: np.ndarray) -> np.ndarray:
        return (r - 1.0) * self.H(r) + self.circle(r)

    def on(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Upper bound of ``g`` on ``[lo, hi]``: ``(hi−1)·H(lo) + Π·lo^{−k0−1}``."""
        return (hi - 1.0) * self.H(lo) + self.circle(lo)

    def ends(self, r_first: float, r_last: float) -> float:
        """Bounds on ``(1, r_first]`` and ``[r_last, ∞)``."""
        near = (r_first - 1.0) * float(self.H(np.array([1.0]))[0]) + self.pi
        far = r_last * float(self.H(np.array([r_last]))[0]) + float(self.circle(np.array([r_last]))[0])
        return max(near, far)


def power_upper_bound(M: object, *, share: float = 1e-3, cap: int | None = None, rtol_r: float = 1e-4) -> PowerBound:
    """Rigorous upper bound on ``K(M)`` from power norms.

    For ``|z| = r > 1 ≥ ρ(M)``, ``(zI−M)⁻¹ = Σ_k M^k z^{−k−1}`` gives
    ``(|z|−1)‖(zI−M)⁻¹‖ ≤ g(r) = (r−1) Σ_k a_k r^{−k−1}`` with ``a_k ≥ ‖M^k‖`` (exact for
    the first ``EXACT_POWERS`` powers and wherever the ``O(n²)`` bound ``min(‖·‖_F,
    √(‖·‖₁‖·‖_∞))`` exceeds every exact norm so far, that bound elsewhere), computed for ``k ≤ k0`` (until a power vanishes, or, once some ``a_m < 1``, until the
    tail below contributes at most ``share`` of the bound); for ``k > k0``, ``k = s + q·m`` with ``k0 − m < s ≤ k0``, ``q ≥ 1`` and
    ``a_k ≤ a_s a_m^q``: a geometric tail. With semisimple unit-circle eigenvalues,
    ``M^k = Σ λ^k P_λ + M'^k`` (``k ≥ 1``, ``M' = M(I − P_Γ)``) so ``a_k ≤ Π + ‖M'^k‖`` with
    ``Π = Σ‖P_λ‖`` beyond ``k0`` and the tail of ``M'`` is geometric. Writing
    ``g(r) = (r−1)H(r) + Π r^{−k0−1}`` with ``H`` decreasing, ``sup_r g`` is bounded by
    ``(r_{i+1}−1)H(r_i) + Π r_i^{−k0−1}`` on intervals of a grid in ``log(r−1)`` over
    ``[1e-10, 1e8]`` that is bisected until every interval bound is within ``rtol_r`` of the
    largest grid value (or 20,000 intervals); the ends use ``(r_0−1)H(1) + Π`` and
    ``r_last·H(r_last)``. The result is inflated by ``4(k0+1)·n·u`` for rounding in the norms.

    Cost: ``k0`` products and partial eigensolves, ``O(k0·n³)``, plus ``O(k0)`` vector work
    per refinement pass.

    Parameters
    ----------
    M : array_like, shape (n, n)
    share : float
        Largest share of the geometric tail in the bound, in ``(0, 1)``.
    cap : int, optional
        Most exact powers (default ``20·n + 100``).
    rtol_r : float
        Relative resolution of the sup over ``r``.

    Returns
    -------
    PowerBound
        ``value = inf`` (tail ``"none"``) when ``ρ(M) > 1``, for a defective unit eigenvalue,
        or when no power below 1 appears within ``cap``.

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or ``share`` is outside ``(0, 1)``.
    """
    A = as_square(M)
    if not 0.0 < share < 1.0:
        raise InputError(f"share={share} is out of range; pass a value in (0, 1).")
    tf = triangular_form(A)
    status, _, circle = _spectrum_status(A, tf)
    return _power_upper(A, status, circle, share, cap if cap is not None else 20 * tf.n + 100, rtol_r)


def _power_upper(A: np.ndarray, status: str, circle: _Circle | None, share: float, cap: int, rtol_r: float) -> PowerBound:
    n = A.shape[0]
    if status in ("outside", "defective"):
        return PowerBound(math.inf, math.nan, 0, "none", 0)
    if status == "circle":
        assert circle is not None
        fn = _norm_sequences(A, circle.deflated, float(circle.proj_norms.sum()), share, cap)
    else:
        fn = _norm_sequences(A, None, 0.0, share, cap)
    if fn.tail == "none":
        return PowerBound(math.inf, math.nan, fn.k0, "none", 0, fn.a, fn.exact)
    label = "unit-circle" if status == "circle" else fn.tail
    edges = 1.0 + np.logspace(-10, 8, 361)
    while True:
        U = fn.on(edges[:-1], edges[1:])
        g = fn.at(edges)
        split = U > g.max() * (1.0 + rtol_r)
        if not split.any() or edges.size > 20_000:
            break
        lo, hi = edges[:-1][split] - 1.0, edges[1:][split] - 1.0
        edges = np.sort(np.concatenate([edges, 1.0 + np.sqrt(lo * hi)]))
    best = max(float(U.max()), fn.ends(float(edges[0]), float(edges[-1])))
    value = float(best * (1.0 + 4.0 * (fn.k0 + 1) * n * _EPS))
    return PowerBound(value, float(edges[int(np.argmax(g))]), fn.k0, label, fn.m, fn.a, fn.exact)


# ----------------------------------------------------------------------------- value search
class _Objective:
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
    nb = np.max(
        np.stack([P[1 + di : P.shape[0] - 1 + di, 1 + dj : P.shape[1] - 1 + dj] for di in (-1, 0, 1) for dj in (-1, 0, 1)]),
        axis=0,
    )
    idx = np.argwhere(F >= nb)
    order = np.argsort(-F[idx[:, 0], idx[:, 1]])
    picks = [tuple(int(v) for v in idx[j]) for j in order[:k]]
    return picks if picks else [tuple(int(v) for v in np.unravel_index(np.argmax(F), F.shape))]


def _search(
    tf: TriangularForm, engine: str, grid: tuple[int, int], starts: int, circle: _Circle | None
) -> _Objective:
    """Coarse grid in ``(log(|z|−1), arg z)``, then L-BFGS-B from the best local maxima."""
    obj = _Objective(tf, engine)
    N = max(tf.norm_upper, 1e-3)
    t_hi = math.log(2.0 * N + 1.0)
    t_lo = math.log(1e-3)
    nt, nth = grid
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
    extra = [1e12 * (1.0 + N)]
    if circle is not None:
        extra += [lam * (1.0 + h) for lam in circle.lam for h in (1e-6, 1e-9)]
    obj.values(np.asarray(extra, dtype=np.complex128))
    bounds = [(math.log(1e-12), t_hi + 2.0), (0.0, math.pi) if tf.real_input else (None, None)]
    for i, j in _local_maxima(F, starts):
        x0 = np.array([ts[i], ths[j]])
        scipy.optimize.minimize(
            obj.neg_log, x0, jac=True, method="L-BFGS-B", bounds=bounds,
            options={"maxiter": 60, "ftol": 1e-15, "gtol": 1e-11},
        )
    return obj


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


class _BranchBound:
    """Certified bracket for ``K(M)``; see :func:`kreiss` and ``_bounds`` for the cell bound."""

    def __init__(self, tf: TriangularForm, obj: _Objective, circle: _Circle | None, engine: str) -> None:
        self.tf, self.obj, self.circle, self.engine = tf, obj, circle, engine
        self.n = tf.n
        self.N = tf.norm_upper
        self.za = np.empty(0, dtype=np.complex128)  # anchors with σ₂ ≥ ga
        self.ga = np.empty(0)
        self.zb = np.empty(0, dtype=np.complex128)  # anchors with σ_min ≥ gb
        self.gb = np.empty(0)
        self.n_cells = self.n_evals = self.n_deflated = self.n_cholesky = 0
        L = tf.L
        self._LH = np.ascontiguousarray(L.conj().T)
        self._gram = self._LH @ L  # LᴴL, once: SᴴS = |z|²I − z̄L − zLᴴ + LᴴL costs O(n²) per point
        self._fro_L = float(np.linalg.norm(L))

    def numerical_radius_upper(self, m: int = 32) -> float:
        """Upper bound on the numerical radius ``w(M) = max_θ λ_max(Re(e^{−iθ}M))``.

        ``σ_min(zI−M) ≥ |z| − w(M)``, so ``w`` can replace ``‖M‖`` in the far-field bound.
        ``λ_max`` on ``m`` angles plus ``‖M‖·π/m`` (the support function is ``‖M‖``-Lipschitz
        in ``θ``), plus a rounding margin; ``O(m·n³)``.
        """
        A = self.tf.L
        h = [
            float(guarded.eigvalsh(0.5 * (np.exp(-1j * t) * A + np.exp(1j * t) * A.conj().T))[-1])
            for t in np.linspace(0.0, 2.0 * math.pi, m, endpoint=False)
        ]
        return max(h) + self.N * math.pi / m + self.margin(np.zeros(1))[0]

    def margin(self, z: np.ndarray) -> np.ndarray:
        """Floating-point margin on every ``σ`` and residual near ``z``."""
        return 16.0 * self.n * _EPS * (np.abs(z) + self.N) + self.tf.backward_error

    def add_certificates(self, z: np.ndarray, s: np.ndarray, r: np.ndarray, V: np.ndarray, floor: np.ndarray) -> None:
        """Certify lower bounds on ``σ₂`` (else on ``σ_min``) at cell centres by Cholesky (no SVD).

        With ``S = zI − M``, ``G = SᴴS`` and ``v`` the computed right singular vector: if
        ``G − γ²I + 2γ²vvᴴ`` is positive definite then ``G − γ²I`` has at most one negative
        eigenvalue (a rank-one update moves at most one eigenvalue across 0), so
        ``σ₂(S) ≥ γ``; tried for ``γ = s·(6, 3, 1.6, 1.15)`` above ``floor``. If none succeeds,
        ``G − γ²I ≻ 0`` with ``γ = (s − r)(1 − 10⁻⁶)`` certifies ``σ_min(S) ≥ γ``.

        ``G = |z|²I − z̄L − zLᴴ + LᴴL`` is formed in ``O(n²)`` from ``LᴴL`` computed once; its
        rounding error, with that of the factorisation, is at most
        ``e = 4(n+2)u((‖L‖_F + √n|z|)² + 3γ²)`` in norm (``‖L‖_F + √n|z|`` bounds ``‖S‖_F``
        and every term's magnitude), so a successful factorisation certifies ``√(γ² − e)``,
        stored as an anchor; both ``σ₂`` and ``σ_min`` are 1-Lipschitz in ``z``.
        """
        n = self.n
        eye = np.eye(n)
        idx = np.arange(n)
        for k in range(z.size):
            zk = complex(z[k])
            G = self._gram - zk.conjugate() * self.tf.L - zk * self._LH
            G[idx, idx] += abs(zk) ** 2
            vv = np.outer(V[k], V[k].conj())
            fro2 = (self._fro_L + math.sqrt(n) * abs(zk)) ** 2
            gaps = [s[k] * f for f in (6.0, 3.0, 1.6, 1.15) if s[k] * f > floor[k]]
            tries = [(g, True) for g in gaps] + [((s[k] - r[k]) * (1.0 - 1e-6), False)]
            for gam, second in tries:
                if gam <= 0.0:
                    break
                H = G - gam * gam * eye + (2.0 * gam * gam) * vv if second else G - gam * gam * eye
                _, info = _potrf(H, lower=True, clean=False)
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
        """Upper bound of ``(|z|−1)/σ_min(zI−M)`` on each cell (``inf`` if none found)."""
        zc, rho = cells.zc, cells.rho
        ev = self.tf.evaluate(zc, vectors=True, engine=self.engine)
        self.n_evals += zc.size
        self.n_cells += zc.size
        self.obj.record(zc, _ratio(np.abs(zc) - 1.0, ev.sigma))
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
        need = np.flatnonzero((U > target) & (rho < 0.5 * ev.sigma))
        if need.size:
            r_eff = res[need] + self.margin(zc[need])
            floor = ev.sigma[need] + 1.5 * slope[need] + 3.0 * r_eff
            self.add_certificates(zc[need], ev.sigma[need], r_eff, ev.VL[need], floor)
            U = np.minimum(U, self._direct(cells, ev.sigma, ev.c, res))
        return U

    def _direct(self, cells: _Cells, s: np.ndarray, c: np.ndarray, res: np.ndarray) -> np.ndarray:
        """Second-order (Li–Li) bound where a certified gap exists, else first-order bounds.

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
        g = self._lipschitz(zc, self.za, self.ga) - mu
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
        """Return ``(lo, hi, far_radius, stopped)``."""
        lo = self.obj.best
        # Cells are retired below target/shrink, so the final hi (inflated by shrink for
        # rounding) still meets hi ≤ lo(1 + rtol) exactly instead of missing it by 1e-13.
        shrink = 1.0 + 16.0 * self.n * _EPS
        tau = max(lo * (1.0 + rtol), 1.0 + 0.5 * rtol) / shrink
        N = self.N
        if (tau * N - 1.0) / (tau - 1.0) > 10.0 * (N + 1.0):
            N = min(N, self.numerical_radius_upper())
        if N <= 1.0:
            R, far = 2.0, 1.0
        else:
            R = max(2.0, (tau * N - 1.0) / (tau - 1.0) * (1.0 + 1e-12))
            far = (R - 1.0) / (R - N)
        nr = 12
        redges = 1.0 + np.concatenate([[0.0], np.geomspace(1e-2, R - 1.0, nr)])
        nth = 12 if self.tf.real_input else 24
        tedges = np.linspace(0.0 if self.tf.real_input else -math.pi, math.pi, nth + 1)
        R0, T0 = np.meshgrid(redges[:-1], tedges[:-1], indexing="ij")
        R1, T1 = np.meshgrid(redges[1:], tedges[1:], indexing="ij")
        cells = _Cells(R0.ravel(), R1.ravel(), T0.ravel(), T1.ravel())
        U = self.bounds(cells, tau)
        hi_retired = far
        stopped = "rtol"
        while True:
            target = max(self.obj.best * (1.0 + rtol), 1.0 + 0.5 * rtol) / shrink
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
        lo = self.obj.best
        if self.circle is not None:
            lo = max(lo, float(self.circle.proj_norms.max()) * (1.0 - 1e3 * self.n * _EPS))
        return lo, hi, R, stopped


# ----------------------------------------------------------------------------- public entry
def _contraction(tf: TriangularForm, norm: float, certify: bool, engine: str) -> KreissResult:
    """``K = 1`` exactly for ``‖M‖ < 1``: ``(|z|−1)‖(zI−M)⁻¹‖ ≤ (|z|−1)/(|z|−‖M‖) ≤ 1`` for every
    ``|z| > 1``, and the ratio tends to 1 as ``|z| → ∞`` (a supremum approached, not attained)."""
    far = 1e6 * (1.0 + norm)
    value = float((far - 1.0) / sigma_min(tf, far, engine=engine).sigma)
    pb = PowerBound(1.0, math.inf, 1, "contraction", 1, np.array([1.0, norm]), np.array([True, True]))
    return KreissResult(value=min(value, 1.0), upper=1.0, argmax=complex(far), n_evals=1, circle_limit=0.0,
                        lo=1.0 if certify else None, hi=1.0 if certify else None, certified=certify,
                        method="closed form: ||M|| < 1 gives K = 1 (limit at infinity)", power_bound=pb,
                        branch_bound=None)


def kreiss(
    M: object,
    *,
    certify: bool = False,
    rtol: float = 1e-3,
    upper: bool = True,
    engine: str = "numba",
    grid: tuple[int, int] = (17, 14),
    starts: int = 3,
    max_evals: int = 50_000,
) -> KreissResult:
    """Kreiss constant ``K(M) = sup_{|z|>1} (|z|−1)‖(zI−M)⁻¹‖₂`` with bounds.

    ``value`` is the best point of a search (grid in ``(log(|z|−1), arg z)`` over
    ``1e-3 ≤ |z|−1 ≤ 2‖M‖``, only ``Im z ≥ 0`` for real ``M``, plus ``|z| = 10¹²(1+‖M‖)`` and
    radial points next to unit-circle eigenvalues; then L-BFGS-B in ``(log(|z|−1), arg z)`` from
    the ``starts`` best grid maxima with the analytic gradient ``dσ = Re(uᴴv·dz)``), so it is a
    lower bound that typically matches ``K`` to ``1e-10`` relative but is not guaranteed to.
    ``upper`` comes from :func:`power_upper_bound`. With ``certify=True`` a branch and bound
    over annular sectors of ``1 < |z| < R`` returns ``lo ≤ K ≤ hi`` with ``hi/lo − 1 ≤ rtol``
    (``certified``), where ``R`` is chosen so that the far-field bound
    ``(|z|−1)/σ_min ≤ (|z|−1)/(|z|−‖M‖)`` is below ``lo(1+rtol)`` (with the numerical radius in
    place of ``‖M‖`` when that makes ``R`` much smaller; cost is high when ``K`` is within a
    few ``rtol`` of 1 and ``w(M) > 1``: the far field then needs fine cells); each cell is bounded with the
    second-order bound of ``_BranchBound._direct``, Cholesky-certified anchors supply the
    lower bound on ``σ₂``, and cells next to unit-circle eigenvalues use the deflated resolvent.

    Rigour: all bounds hold in exact arithmetic for the triangular form used; rounding is
    covered by explicit margins (``16·n·u·(|z|+‖M‖)`` on residuals and singular values, the
    measured Schur backward error, ``4(k0+1)·n·u`` on power norms). Not interval-verified.

    Special cases: ``‖M‖ < 1`` gives ``K = 1`` exactly (``(|z|−1)/(|z|−‖M‖) ≤ 1``, with the
    supremum approached as ``|z| → ∞``): bracket ``[1, 1]``, no search. ``K = ∞`` (``value = upper = lo = hi = inf``, ``argmax`` the eigenvalue)
    when an eigenvalue lies outside the closed unit disk or a unit-circle eigenvalue is
    defective. Semisimple unit-circle eigenvalues give ``circle_limit = max ‖P_λ‖``, a
    supremum approached as ``z → λ`` radially: for a causal row-stochastic ``A`` with a simple
    Perron root, ``value`` approaches ``√n`` from below (to about ``1e-9``), ``upper ≥ √n`` and
    the bracket contains ``√n``; ``K(I) = 1``.

    Cost: value, about 250–300 ``σ_min`` evaluations (``O(n²)`` each) for ``O(n³)`` once for a
    non-triangular ``M``; upper, ``O(k0·n³)``; certify, a few thousand evaluations plus tens
    of dense SVDs at rtol 1e-3.

    Parameters
    ----------
    M : array_like, shape (n, n)
        Real or complex, finite.
    certify : bool
        Run the branch and bound.
    rtol : float
        Target ``hi/lo − 1`` for the bracket, in ``[1e-8, 1)``.
    upper : bool
        Compute the power-norm upper bound (``upper = inf`` otherwise).
    engine : {"numba", "numpy"}
        ``σ_min`` engine.
    grid : (int, int)
        Search grid ``(n_log_radius, n_angle)`` (angles doubled for complex ``M``).
    starts : int
        L-BFGS-B starts.
    max_evals : int
        Evaluation budget of the branch and bound; ``certified = False`` when exhausted, and a
        :class:`CertificationBudgetWarning` is issued.

    Returns
    -------
    KreissResult

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or an option is out of range.

    Warns
    -----
    CertificationBudgetWarning
        With ``certify=True``, when the branch and bound stops at ``max_evals`` before the
        bracket meets ``rtol`` (the result says so too: ``certified`` False,
        ``branch_bound.stopped == "max_evals"``).

    Examples
    --------
    >>> import numpy as np
    >>> round(kreiss(np.eye(3)).value, 6)
    1.0
    """
    A = as_square(M)
    check_engine(engine)
    if not 1e-8 <= rtol < 1.0:
        raise InputError(f"rtol={rtol} is out of range; pass a relative tolerance in [1e-8, 1).")
    if len(grid) != 2 or min(grid) < 2 or starts < 1 or max_evals < 1:
        raise InputError(f"grid={grid}, starts={starts}, max_evals={max_evals}: pass grid >= (2, 2) and positive counts.")
    tf = triangular_form(A)
    status, lam, circle = _spectrum_status(A, tf)
    if status in ("outside", "defective"):
        why = "eigenvalue outside the unit disk" if status == "outside" else "defective eigenvalue on the unit circle"
        return KreissResult(math.inf, math.inf, lam, 0, math.inf, math.inf if certify else None,
                            math.inf if certify else None, True, f"infinite: {why}", None, None)
    norm = spectral_norm(A)
    if status == "inside" and norm <= 1.0 - 8.0 * tf.n * _EPS:
        return _contraction(tf, norm, certify, engine)
    obj = _search(tf, engine, grid, starts, circle)
    limit = float(circle.proj_norms.max()) if circle is not None else 0.0
    pb = _power_upper(A, status, circle, 1e-3, 20 * tf.n + 100, 1e-4) if upper else None
    lo = hi = None
    bb = None
    certified = False
    if certify:
        run = _BranchBound(tf, obj, circle, engine)
        lo, hi, R, stopped = run.run(rtol, max_evals, 64)
        if pb is not None:
            hi = min(hi, float(pb.value))
        certified = hi <= lo * (1.0 + rtol)
        bb = BranchBoundRecord(run.n_cells, run.n_evals, run.za.size + run.zb.size, run.n_cholesky, run.n_deflated, R, stopped)
        if not certified and stopped == "max_evals":
            warnings.warn(f"kreiss: certification stopped at its evaluation budget (max_evals={max_evals}; "
                          f"{run.n_evals} σ_min evaluations used) with the bracket [{lo:.6g}, {hi:.6g}] (hi/lo − 1 = {hi / lo - 1:.2g} > rtol = {rtol:g}); "
                          "the bracket is valid but not certified to rtol: raise max_evals or rtol.",
                          CertificationBudgetWarning, stacklevel=2)
    return KreissResult(
        value=obj.best,
        upper=float(pb.value) if pb is not None else math.inf,
        argmax=obj.best_z,
        n_evals=obj.n_evals,
        circle_limit=limit,
        lo=lo,
        hi=hi,
        certified=certified,
        method="grid+L-BFGS-B" + ("+branch-and-bound" if certify else ""),
        power_bound=pb,
        branch_bound=bb,
    )
