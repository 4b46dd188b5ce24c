"""Kreiss constant ``K(M) = sup_{|z|>1} (|z|−1)/σ_min(zI−M)`` with a lower value, a cheap
rigorous upper bound, and (on request) a certified bracket.

Three numbers, three guarantees:

* ``value``: the largest ``(|z|−1)/σ_min(zI−M)`` at a point actually evaluated (a coarse grid
  in ``(log(|z|−1), arg z)``, then L-BFGS-B from the best grid points with the analytic
  gradient from the singular vectors; on the positive real axis alone, a grid in
  ``log(r−1)`` and bounded Brent, where the axis reduction below proves the supremum lies
  there). A lower bound on ``K`` up to the rounding of one ``σ_min`` (about ``1e-13``
  relative; not certified: no residual is formed).
* ``upper``: ``sup_{r>1} (r−1) Σ_k ‖M^k‖ r^{−(k+1)}`` (the Neumann series of the resolvent and
  the triangle inequality), with norms of computed powers for ``k ≤ k0`` plus a rigorous
  allowance ``γ·‖|M|^k‖`` for the rounding of the products, and a geometric tail from
  submultiplicativity; the sup over ``r`` is bounded on a grid using monotonicity (see
  :func:`power_upper_bound` for exactly what is trusted).
* ``lo``/``hi`` (``certify=True``): branch and bound over ``|z| > 1`` with a second-order lower
  bound on ``σ_min`` per cell (see :class:`~depthlens.linalg.kreiss_search.BranchBound`) until
  ``hi/lo − 1 ≤ rtol``; ``lo`` is the best certified ratio at an evaluated point (its ``σ_min``
  bounded above through an explicit residual, see
  :meth:`~depthlens.linalg.kreiss_search.BranchBound.certified_ratio`), never less than 1.
  For a real triangular ``M`` with ``ρ(M) ≤ 1`` that a signature ``D = diag(±1)`` makes
  entrywise nonnegative (``DMD ≥ 0``; every deflated causal row-stochastic matrix), the
  supremum lies on the positive real axis (:func:`~depthlens.linalg.kreiss_search.axis_reduction`,
  a proof, with the condition checked exactly), and the branch and bound covers ``(1, R)`` only.

What "rigorous" covers here: the bounds hold in exact arithmetic for the matrix whose
triangular form is used; floating point is covered by explicit margins (``16·n·u·(|z|+‖M‖)``
on every residual and singular value, which the residual kernel's strict-IEEE mat-vec error
``γ_{n+2}(|z| + ‖|L|‖)`` stays below; the Schur backward error where ``M`` was not
triangular; on the power bound, the forward error ``γ·‖|M|^k‖`` of every computed power and a
relative ``4·n·u`` on its norm). LAPACK's results (Cholesky success, eigensolves) are trusted
to their documented backward stability. Nothing is interval-verified.

Matrices with ``ρ(M) ≥ 1``: an eigenvalue outside the closed unit disk makes ``K = ∞``
(``(|z|−1)/σ_min → ∞`` as ``z`` approaches it); so does a defective (non-trivial Jordan
block) eigenvalue on the unit circle. Only the first verdict for a triangular ``M`` (exact
eigenvalues on the diagonal) is certified; a defective verdict (a numerical rank decision)
and an outside eigenvalue of a computed Schur form are not (``certified`` False, the reason in
``uncertified_reason``, bracket ``[1, ∞]``). A semisimple eigenvalue ``λ`` on the circle with
spectral projector ``P_λ`` contributes the limit ``‖P_λ‖``, approached as ``z → λ`` radially
and not attained: for a causal row-stochastic ``A`` (simple Perron root 1, ``P = 1e₁ᵀ``) this
gives ``K(A) = √n``, and ``K(I) = 1``. "On the circle" means ``||λ| − 1| ≤ δ`` with ``δ = 8u``
for triangular input (exact eigenvalues) and ``δ = 10³·(Schur backward error)`` otherwise.

This module holds the entry :func:`kreiss` and its records; the power-norm upper bound and
the spectrum classification live in :mod:`depthlens.linalg.kreiss_bound`, the value search
and the branch and bound in :mod:`depthlens.linalg.kreiss_search`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ._checks import as_square
from .kreiss_bound import NORM_ROUNDING, PowerBound, power_upper_bound, power_upper_from_status, spectrum_status
from .kreiss_search import BranchBound, axis_reduction, search
from .sigma import TriangularForm, check_engine, sigma_min, triangular_form
from .transients import spectral_norm

__all__ = ["BranchBoundRecord", "CertificationBudgetWarning", "KreissResult", "PowerBound", "kreiss", "power_upper_bound"]

_EPS = np.finfo(np.float64).eps


class CertificationBudgetWarning(RuntimeWarning):
    """``kreiss(..., certify=True)`` stopped at its evaluation budget (``max_evals``) before the
    bracket met ``rtol``: the returned ``[lo, hi]`` is valid but wider, ``certified`` is False and
    ``branch_bound.stopped`` is ``"max_evals"``. Callers that record this themselves (the
    attention stage flags ``kreiss_B_certified = 0``) may filter it."""


# ----------------------------------------------------------------------------- records
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
    domain : str
        ``"exterior"`` (annular sectors of ``1 < |z| < R``) or ``"real axis"`` (segments of
        ``(1, R)`` only, where :func:`~depthlens.linalg.kreiss_search.axis_reduction` proves the
        supremum lies on the positive real axis).
    """

    cells: int
    evaluations: int
    anchors: int
    cholesky: int
    deflated: int
    far_radius: float
    stopped: str
    domain: str = "exterior"


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
        Bracket (``certify=True``): ``lo ≤ K ≤ hi`` up to the margins of the module docstring,
        whether or not ``certified``.
    certified : bool
        ``hi/lo − 1 ≤ rtol`` was reached, or ``K = ∞`` is certain (an eigenvalue of a
        triangular ``M`` outside the disk). False when certification was not asked.
    method : str
        How ``value`` was obtained.
    power_bound : PowerBound or None
    branch_bound : BranchBoundRecord or None
    uncertified_reason : str or None
        With ``certify=True`` and ``certified`` False: why (the evaluation budget, or a verdict
        ``K = ∞`` that rests on a numerical decision). None otherwise.
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
    uncertified_reason: str | None = None


# ----------------------------------------------------------------------------- public entry
def _contraction(tf: TriangularForm, norm: float, certify: bool, engine: str) -> KreissResult:
    """``K = 1`` exactly for ``‖M‖ < 1``: ``(|z|−1)‖(zI−M)⁻¹‖ ≤ (|z|−1)/(|z|−‖M‖) ≤ 1`` for every
    ``|z| > 1``, and the ratio tends to 1 as ``|z| → ∞`` (a supremum approached, not attained)."""
    far = 1e6 * (1.0 + norm)
    value = float((far - 1.0) / sigma_min(tf, far, engine=engine).sigma)
    pb = PowerBound(1.0, math.inf, 1, "contraction", 1, np.array([1.0, norm]), np.array([True, True]),
                    np.array([0.0, NORM_ROUNDING * tf.n * _EPS * norm]))
    return KreissResult(value=min(value, 1.0), upper=1.0, argmax=complex(far), n_evals=1, circle_limit=0.0,
                        lo=1.0 if certify else None, hi=1.0 if certify else None, certified=certify,
                        method="closed form: ||M|| < 1 gives K = 1 (limit at infinity)", power_bound=pb,
                        branch_bound=None)


def _infinite(tf: TriangularForm, status: str, lam: complex, certify: bool) -> KreissResult:
    """The verdict ``K = ∞`` for an eigenvalue outside the disk or a defective unit-circle one;
    certified only for an eigenvalue of a triangular ``M`` (exact on its diagonal) outside it."""
    if status == "outside":
        why = "eigenvalue outside the unit disk"
        sure = tf.kind != "schur"
        doubt = (f"the eigenvalue {lam:.6g} is one of the computed Schur form, exact only for M perturbed by "
                 f"up to {tf.backward_error:.2g} in norm")
    else:
        why = "defective eigenvalue on the unit circle"
        sure = False
        doubt = (f"the eigenvalue {lam:.6g} was judged defective by a numerical rank test (singular values of "
                 "λI − M below 1e3·n·u·max(1, ‖M‖) counted as zero), not proven")
    certified = certify and sure
    lo = (math.inf if sure else 1.0) if certify else None
    return KreissResult(math.inf, math.inf, lam, 0, math.inf, lo, math.inf if certify else None, certified,
                        f"infinite: {why}" + ("" if sure else " (numerical decision, not certified)"), None, None,
                        doubt if certify and not sure else None)


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
    Where :func:`~depthlens.linalg.kreiss_search.axis_reduction` holds (below; every deflated
    causal stochastic matrix) ``K`` is the supremum over the positive real axis, and the search
    runs there only: ``grid[0]`` points in ``log(r−1)``, then bounded Brent between the grid
    neighbours of the ``starts`` best grid maxima (about 30 evaluations in real arithmetic
    instead of 250 complex ones; ``method`` says which search ran). On 348 deflated heads at
    n = 128 (80 synthetic, 268 of SmolLM2-135M's 270 on one text chunk; the other two have
    ``‖B‖ < 1``) and 48 synthetic ones at n = 64 and 256 it gave the value of the
    two-dimensional search to ``1.3e-15`` relative.
    ``upper`` comes from :func:`power_upper_bound`. With ``certify=True`` a branch and bound
    over annular sectors of ``1 < |z| < R`` returns ``lo ≤ K ≤ hi`` with ``hi/lo − 1 ≤ rtol``
    (``certified``), where ``R`` is chosen so that the far-field bound
    ``(|z|−1)/σ_min ≤ (|z|−1)/(|z|−w)`` is below ``lo(1+rtol)``, ``w`` the smaller of a bound on
    ``‖M‖`` and one on the numerical radius (cost is high when ``K`` is within a few ``rtol``
    of 1 and ``w > 1``: the far field then needs fine cells); each cell is bounded first by the
    numerical range (:meth:`~depthlens.linalg.kreiss_search.BranchBound._sector`, no
    evaluation), else with the second-order bound of
    :meth:`~depthlens.linalg.kreiss_search.BranchBound._direct`, Cholesky-certified anchors
    supplying the lower bound on ``σ₂``, and cells next to unit-circle eigenvalues use the
    deflated resolvent. Where :func:`~depthlens.linalg.kreiss_search.axis_reduction` holds
    (real triangular ``M``, ``ρ(M) ≤ 1``, ``DMD ≥ 0`` for a signature ``D``: deflated causal
    stochastic matrices) ``K(M) = sup_{r>1} (r−1)/σ_min(rI−M)`` exactly, and the cells are
    segments of ``(1, R)`` (``branch_bound.domain == "real axis"``).

    Rigour: all bounds hold in exact arithmetic for the triangular form used; rounding is
    covered by explicit margins (``16·n·u·(|z|+‖M‖)`` on residuals and singular values, the
    measured Schur backward error; on the power bound ``γ·‖|M|^k‖`` for each computed power,
    ``4n·u`` on its norm and ``4(k0+1)·n·u`` on the series). ``lo`` is certified at evaluated
    points through explicit residuals (``lo ≥ 1`` always, the limit at infinity); ``hi`` is the
    smaller of the branch-and-bound bound and ``upper``. Not interval-verified.

    Special cases: ``‖M‖ < 1`` gives ``K = 1`` exactly (``(|z|−1)/(|z|−‖M‖) ≤ 1``, with the
    supremum approached as ``|z| → ∞``): bracket ``[1, 1]``, no search. ``K = ∞`` (``value =
    upper = inf``, ``argmax`` the eigenvalue) when an eigenvalue lies outside the closed unit
    disk or a unit-circle eigenvalue is defective; with ``certify=True`` the bracket is
    ``[∞, ∞]`` and ``certified`` True only for an eigenvalue of a triangular ``M`` outside the
    disk; otherwise (a numerical rank decision, or an eigenvalue of a computed Schur form,
    exact only for a perturbed ``M``) ``certified`` is False, ``uncertified_reason`` says why and
    the bracket is ``[1, ∞]``. Semisimple unit-circle eigenvalues give ``circle_limit = max ‖P_λ‖``, a
    supremum approached as ``z → λ`` radially: for a causal row-stochastic ``A`` with a simple
    Perron root, ``value`` approaches ``√n`` from below (to about ``1e-9``), ``upper ≥ √n`` and
    the bracket contains ``√n`` (its lower end certified at ``z = λ(1 + h)``, within about
    ``1e-5`` relative of the limit); ``K(I) = 1``.

    Cost: value, about 250–300 ``σ_min`` evaluations (``O(n²)`` each; about 30 on the real axis)
    for ``O(n³)`` once for a non-triangular ``M``; upper, ``O(k0·n³)``; certify, a few thousand evaluations plus tens
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
        Search grid ``(n_log_radius, n_angle)`` (angles doubled for complex ``M``; only
        ``n_log_radius`` is used on the real axis).
    starts : int
        Local refinements (L-BFGS-B, or bounded Brent on the real axis).
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
    status, lam, circle = spectrum_status(A, tf)
    if status in ("outside", "defective"):
        return _infinite(tf, status, lam, certify)
    # ‖M‖ ≥ every column norm, and the computed ones are within a few u of exact: a column norm
    # above 1 rules out ‖M‖ ≤ 1 − 8nu, and the dense norm is skipped
    if status == "inside" and float(np.linalg.norm(A, axis=0).max()) <= 1.0:
        norm = spectral_norm(A)
        if norm <= 1.0 - 8.0 * tf.n * _EPS:
            return _contraction(tf, norm, certify, engine)
    axis = axis_reduction(A, tf)
    obj = search(tf, engine, grid, starts, circle, axis=axis)
    limit = float(circle.proj_norms.max()) if circle is not None else 0.0
    pb = power_upper_from_status(A, status, circle, 1e-3, 20 * tf.n + 100, 1e-4) if upper else None
    lo = hi = None
    bb = None
    certified = False
    reason = None
    if certify:
        run = BranchBound(tf, obj, circle, engine, axis=axis)
        lo, hi, R, stopped = run.run(rtol, max_evals, 64)
        if pb is not None:
            hi = min(hi, float(pb.value))
        certified = hi <= lo * (1.0 + rtol)
        bb = BranchBoundRecord(run.n_cells, run.n_evals, run.za.size + run.zb.size, run.n_cholesky, run.n_deflated, R, stopped,
                               "real axis" if axis else "exterior")
        if not certified:
            reason = (f"evaluation budget max_evals={max_evals} exhausted with " if stopped == "max_evals" else ""
                      ) + f"hi/lo − 1 = {hi / lo - 1:.2g} > rtol = {rtol:g}"
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
        method=("real-axis grid+Brent" if axis else "grid+L-BFGS-B") + ("+branch-and-bound" if certify else ""),
        power_bound=pb,
        branch_bound=bb,
        uncertified_reason=reason,
    )
