"""The power-norm upper bound on the Kreiss constant, and the spectrum classification it rests on.

``power_upper_bound(M)`` bounds ``K(M) = sup_{|z|>1} (|z|−1)‖(zI−M)⁻¹‖₂`` from above by
``sup_{r>1} (r−1) Σ_k ‖M^k‖ r^{−(k+1)}`` (the Neumann series of the resolvent and the triangle
inequality): exact power norms for the first powers, a geometric tail from
submultiplicativity, the series summed by Horner in ``1/r``, and the supremum over ``r``
bounded by a peak scan on a bisected grid using monotonicity. :func:`spectrum_status`
classifies the eigenvalues against the unit circle (inside, semisimple on it, defective on
it, outside) and deflates the unit-circle part; :mod:`depthlens.linalg.kreiss` uses both
for :func:`~depthlens.linalg.kreiss.kreiss`, :mod:`depthlens.linalg.kreiss_search` the
deflated matrix for cells next to unit-circle eigenvalues.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ._checks import as_square
from . import guarded
from ._kernels import horner
from .sigma import TriangularForm, triangular_form
from .transients import iter_power_norms, spectral_norm

__all__ = ["EXACT_POWERS", "NORM_ROUNDING", "PowerBound", "UnitCircle", "power_allowances", "power_upper_bound",
           "power_upper_from_status", "spectrum_status"]

_EPS = np.finfo(np.float64).eps


# ----------------------------------------------------------------------------- record
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
        ``a_k`` for ``k = 0 … k_exact``: the norm of the computed power ``X_k = fl(M·X_{k−1})``
        where ``exact``, else the cheap upper bound on it (at most the largest exact norm
        before it). Values of the computed powers, not yet bounds on ``‖M^k‖``: see
        ``allowance``.
    exact : ndarray of bool
        Which ``norms`` are exact norms of the computed powers.
    allowance : ndarray
        ``d_k`` with ``‖M^k‖₂ ≤ norms[k] + allowance[k]`` (see :func:`power_allowances`): the
        rounding of the computed power, ``γ·‖|M|^k‖₂``, plus ``4n·u·norms[k]`` for the rounding
        of its norm.
    """

    value: float
    r: float
    k_exact: int
    tail: str
    m: int
    norms: np.ndarray = field(default_factory=lambda: np.ones(1))
    exact: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=bool))
    allowance: np.ndarray = field(default_factory=lambda: np.zeros(1))


# ----------------------------------------------------------------------------- spectrum
@dataclass(frozen=True, eq=False)
class UnitCircle:
    """Semisimple eigenvalues on the unit circle and the deflated matrix ``M' = M(I − P_Γ)``."""

    lam: np.ndarray  # distinct unit eigenvalues
    proj_norms: np.ndarray  # ‖P_λ‖
    deflated: np.ndarray  # M' (dense, basis of M)
    complement_norm: float  # ‖I − P_Γ‖


def spectrum_status(A: np.ndarray, tf: TriangularForm) -> tuple[str, complex, UnitCircle | None]:
    """Classify the spectrum of ``A`` (with triangular form ``tf``) against the unit circle.

    "On the circle" means ``||λ| − 1| ≤ δ`` with ``δ = 8u`` for triangular input and
    ``δ = 10³·(Schur backward error)`` otherwise; eigenvalues within ``10δ`` of each other
    count as one.

    Returns
    -------
    status : str
        ``"inside"`` (``ρ(A) < 1``), ``"circle"`` (semisimple unit-circle eigenvalues),
        ``"outside"`` (an eigenvalue outside the closed disk) or ``"defective"`` (a defective
        unit-circle eigenvalue).
    lam : complex
        The largest outside eigenvalue, the offending or first unit-circle one, else 0.
    circle : UnitCircle or None
        The unit-circle eigenvalues, projector norms and deflated matrix (``"circle"`` only).
    """
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
    circle = UnitCircle(
        lam=np.asarray(centres),
        proj_norms=np.array([spectral_norm(Pc) for Pc in projs]),
        deflated=Md,
        complement_norm=spectral_norm(np.eye(n) - P),
    )
    return "circle", centres[0], circle


# ----------------------------------------------------------------------------- upper bound
#: Powers whose norm the upper bound always computes exactly.
EXACT_POWERS = 12
#: Relative rounding allowed for the 2-norm of a computed power, in units of ``n·u``: the Gram
#: product (``γ_n``) and LAPACK's symmetric eigensolve (backward stable, a small multiple of
#: ``n·u`` in practice; not a proven constant). Cheap bounds carry their own ``4n·u``.
NORM_ROUNDING = 4.0


def power_allowances(A: np.ndarray) -> Iterator[float]:
    """Yield ``e_k·ν_k ≥ ‖X_k − A^k‖₂`` for ``k = 1, 2, …``, where ``X_k = fl(A·X_{k−1})``
    (``X_1 = A``) are the powers :func:`~depthlens.linalg.transients.iter_power_norms` forms.

    Forward error of a conventional matrix product, in any summation order, with or without
    FMA: ``|fl(AX) − AX| ≤ ε|A||X|`` entrywise, ``ε = γ_n = nu/(1 − nu)`` for real ``A`` and
    ``√2·γ_{2n}`` for complex ``A``. By induction ``|X_k − A^k| ≤ ((1+ε)^{k−1} − 1)|A|^k ≤ e_k|A|^k``
    with ``e_k = (k−1)ε/(1 − (k−1)ε)``, and the 2-norm is monotone on nonnegative matrices, so
    ``‖X_k − A^k‖₂ ≤ e_k‖|A|^k‖₂``: for non-normal ``A`` (cancellation in ``A^k``) this can be
    far above any multiple of ``‖X_k‖``. For nonnegative ``|A|^k`` the 1- and ∞-norms are the
    largest entries of ``1ᵀ|A|^k`` and ``|A|^k 1``, iterated as vectors (``O(n²)`` per power),
    so ``‖|A|^k‖₂ ≤ ν_k = 2√(max(1ᵀ|A|^k)·max(|A|^k 1))`` with both vectors computed in floating
    point: with nonnegative factors every rounding is relative, the computed vectors are at
    least ``((1−γ_n)/(1+2u))^k`` times the exact ones (``2u`` for the moduli of complex
    entries), which the factor 2 covers while ``k(n+2)u ≤ 1/2`` (beyond that, and on overflow,
    ``inf`` is yielded). Once ``|A|^k 1`` is exactly zero, ``A^k = 0`` (barring underflow) and
    so are ``X_k`` and every later allowance: zeros are yielded from then on.
    """
    n = A.shape[0]
    eps = (math.sqrt(2.0) * 2 * n * _EPS / (1.0 - 2 * n * _EPS) if np.iscomplexobj(A)
           else n * _EPS / (1.0 - n * _EPS))
    mag = np.abs(A)
    rows, cols = mag.sum(axis=1), mag.sum(axis=0)  # |A|^k 1 and 1ᵀ|A|^k for k = 1
    k = 1
    while True:
        if not rows.any():
            while True:
                yield 0.0
        nu = 2.0 * math.sqrt(float(rows.max()) * float(cols.max()))
        finite = math.isfinite(nu) and k * (n + 2) * _EPS <= 0.5  # nu is NaN after inf·0
        yield (k - 1) * eps / (1.0 - (k - 1) * eps) * nu if finite else math.inf
        with np.errstate(over="ignore", invalid="ignore"):
            rows, cols = mag @ rows, cols @ mag
        k += 1


def _norm_sequences(
    A: np.ndarray, deflated: np.ndarray | None, pi_sum: float, share: float, cap: int
) -> _BoundFunction:
    """``a_k ≥ ‖A^k‖`` (and ``b_k ≥ ‖M'^k‖`` when ``deflated`` is given, else ``b = a``): the
    norm of the computed power (exact for ``k ≤ EXACT_POWERS`` and wherever a cheap bound
    exceeds the largest exact norm, else the cheap bound) inflated by ``NORM_ROUNDING·n·u``
    plus :func:`power_allowances`, for ``k = 1 … k0``, stopping when ``b`` vanishes (tail
    ``"nilpotent"``) or, once some ``b_m < 1``, when the geometric tail contributes at most
    ``share`` of ``max_r g(r)`` on a check grid. Tail ``"none"`` when that has not happened
    within ``cap`` powers or an allowance is infinite (no finite bound; the norms are kept for
    the transient peak).
    """
    # Exact norms for the first EXACT_POWERS powers (where the bound's mass lies) and for any
    # power whose cheap bound exceeds every exact norm so far; rigorous cheap upper bounds
    # elsewhere. Upper bounds keep the bound rigorous, only slightly less tight.
    top = [0.0]
    chose = [True]

    def need_exact(_: int, bound: float) -> bool:  # asked for powers beyond EXACT_POWERS only
        chose[0] = bound > top[0]
        return chose[0]

    rel = 1.0 + NORM_ROUNDING * A.shape[0] * _EPS
    a_it, da_it = iter_power_norms(A, need_exact, EXACT_POWERS), power_allowances(A)
    if deflated is not None:
        b_it, db_it = iter_power_norms(deflated, need_exact, EXACT_POWERS), power_allowances(deflated)
    a, da, b, exact = [1.0], [0.0], [1.0], [True]  # computed norms, their allowances, bounds on ‖M'^k‖
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
        chose[0] = True  # stays True for k ≤ EXACT_POWERS (exact without asking need_exact)
        a.append(next(a_it))
        da.append((rel - 1.0) * a[-1] + next(da_it))
        exact.append(a[-1] == 0.0 or chose[0])
        top[0] = max(top[0], a[-1])
        b.append(next(b_it) * rel + next(db_it) if deflated is not None else a[-1] + da[-1])
        k = len(a) - 1
        if not math.isfinite(da[-1] + b[-1]):  # the rounding of the powers cannot be bounded
            break
        if b[-1] == 0.0:
            return _BoundFunction(np.asarray(a), np.asarray(da), np.asarray(b), "nilpotent", 0, pi_sum,
                                  np.asarray(exact))
        with np.errstate(under="ignore"):
            pw = pw / r
            h = h + (a[-1] + da[-1]) * pw
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
            return _BoundFunction(np.asarray(a), np.asarray(da), np.asarray(b), "geometric", best_m, pi_sum,
                                  np.asarray(exact))
    return _BoundFunction(np.asarray(a), np.asarray(da), np.asarray(b), "none", 0, pi_sum, np.asarray(exact))


def _series(r: np.ndarray, coef: np.ndarray, first: int) -> np.ndarray:
    """``Σ_j coef_j r^{−(first+j)−1}`` by Horner in ``1/r`` (vector ``r > 1``)."""
    with np.errstate(under="ignore"):
        return horner(np.ascontiguousarray(coef, dtype=np.float64), 1.0 / r) * np.exp(-(first + 1) * np.log(r))


class _BoundFunction:
    """``g(r) = (r−1)·H(r) + Π·r^{−k0−1}`` with ``H`` decreasing in ``r`` (see ``power_upper_bound``);
    ``a = norms + allowance`` bounds ``‖M^k‖``, ``b`` bounds ``‖M'^k‖``."""

    def __init__(self, norms: np.ndarray, allowance: np.ndarray, b: np.ndarray, tail: str, m: int, pi_sum: float,
                 exact: np.ndarray) -> None:
        self.norms, self.allowance, self.exact = norms, allowance, exact
        self.a, self.b, self.tail, self.m, self.pi = norms + allowance, b, tail, m, pi_sum
        self.k0 = norms.size - 1

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
    ``a_k ≤ a_s a_m^q``: a geometric tail. Each ``a_k`` is the norm of the computed power
    plus the rounding allowance of :func:`power_allowances` (``γ·‖|M|^k‖₂``, which for a
    non-normal ``M`` can far exceed any multiple of ``‖M^k‖``) and a relative
    ``NORM_ROUNDING·n·u`` for the norm itself. With semisimple unit-circle eigenvalues,
    ``M^k = Σ λ^k P_λ + M'^k`` (``k ≥ 1``, ``M' = M(I − P_Γ)``) so ``a_k ≤ Π + ‖M'^k‖`` with
    ``Π = Σ‖P_λ‖`` beyond ``k0`` and the tail of ``M'`` is geometric. Writing
    ``g(r) = (r−1)H(r) + Π r^{−k0−1}`` with ``H`` decreasing, ``sup_r g`` is bounded by
    ``(r_{i+1}−1)H(r_i) + Π r_i^{−k0−1}`` on intervals of a grid in ``log(r−1)`` over
    ``[1e-10, 1e8]`` that is bisected until every interval bound is within ``rtol_r`` of the
    largest grid value (or 20,000 intervals); the ends use ``(r_0−1)H(1) + Π`` and
    ``r_last·H(r_last)``. The result is inflated by a relative ``4(k0+1)·n·u`` for the
    rounding of the series (positive terms summed by Horner, powers of ``r`` by ``exp``/``log``:
    a few ``(k0+1)·u`` relative).

    Guarantee: ``K(M) ≤ value`` holds in exact arithmetic for ``a_k`` as stated; the rounding of
    the products is bounded rigorously (standard forward-error bounds, any summation order and
    FMA); the norms of the computed powers are trusted to ``NORM_ROUNDING·n·u`` relative (LAPACK's
    eigensolver, not proven) and the series evaluation to the ``4(k0+1)·n·u`` above. With
    unit-circle eigenvalues the projectors ``P_λ`` and ``M'`` are themselves computed (from a
    dense SVD) and taken as exact. Not interval-verified.

    Cost: ``k0`` products and partial eigensolves, ``O(k0·n³)``, plus ``O(k0)`` vector work
    per point of the final grid in ``r`` (each evaluated once, :func:`_sup_bound`).

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
    status, _, circle = spectrum_status(A, tf)
    return power_upper_from_status(A, status, circle, share, cap if cap is not None else 20 * tf.n + 100, rtol_r)


def power_upper_from_status(
    A: np.ndarray, status: str, circle: UnitCircle | None, share: float, cap: int, rtol_r: float
) -> PowerBound:
    """:func:`power_upper_bound` of ``A`` (checked) given its :func:`spectrum_status`, so that a
    caller that has classified the spectrum already does not do it twice."""
    n = A.shape[0]
    if status in ("outside", "defective"):
        return PowerBound(math.inf, math.nan, 0, "none", 0)
    if status == "circle":
        assert circle is not None
        fn = _norm_sequences(A, circle.deflated, float(circle.proj_norms.sum()), share, cap)
    else:
        fn = _norm_sequences(A, None, 0.0, share, cap)
    if fn.tail == "none":
        return PowerBound(math.inf, math.nan, fn.k0, "none", 0, fn.norms, fn.exact, fn.allowance)
    label = "unit-circle" if status == "circle" else fn.tail
    best, r_best = _sup_bound(fn, rtol_r)
    value = float(best * (1.0 + 4.0 * (fn.k0 + 1) * n * _EPS))
    return PowerBound(value, r_best, fn.k0, label, fn.m, fn.norms, fn.exact, fn.allowance)


def _sup_bound(fn: _BoundFunction, rtol_r: float) -> tuple[float, float]:
    """Upper bound on ``sup_{r>1} g(r)`` and the grid point where ``g`` was largest, by the
    bisected grid of :func:`power_upper_bound`.

    ``H`` and the circle term are evaluated once per grid point (at the new points only as the
    grid is bisected; both are evaluated point by point, so a point's value does not depend on
    when it is computed) and shared by the point values ``g(r_i) = (r_i−1)H(r_i) + Π r_i^{−k0−1}``
    and the interval bounds ``(r_{i+1}−1)H(r_i) + Π r_i^{−k0−1}`` of ``g`` on ``[r_i, r_{i+1}]``
    (``H`` decreasing): ``O(final grid)`` series evaluations instead of ``O(passes × grid)``.
    """
    edges = 1.0 + np.logspace(-10, 8, 361)
    H, C = fn.H(edges), fn.circle(edges)
    while True:
        U = (edges[1:] - 1.0) * H[:-1] + C[:-1]
        g = (edges - 1.0) * H + C
        split = U > g.max() * (1.0 + rtol_r)
        if not split.any() or edges.size > 20_000:
            break
        lo, hi = edges[:-1][split] - 1.0, edges[1:][split] - 1.0
        new = 1.0 + np.sqrt(lo * hi)
        order = np.argsort(np.concatenate([edges, new]), kind="stable")
        edges = np.concatenate([edges, new])[order]
        H, C = np.concatenate([H, fn.H(new)])[order], np.concatenate([C, fn.circle(new)])[order]
    best = max(float(U.max()), fn.ends(float(edges[0]), float(edges[-1])))
    return best, float(edges[int(np.argmax(g))])
