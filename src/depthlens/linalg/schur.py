"""Complex Schur split: scale the non-normal part of an operator and keep its spectrum (§B4).

With ``M = Q (Λ + N) Q*`` (Q unitary, Λ diagonal, N strictly upper triangular),
``J(α) = Q (Λ + αN) Q* = (1 − α) M₀ + α M`` where ``M₀ = Q Λ Q*`` is the normal part:
every α keeps the eigenvalues and the Schur basis, α = 0 gives a normal matrix, α = 1 gives
``M`` back bit-exactly (the linear form is used for that reason).

Orders
    The split depends on the order of the eigenvalues along the diagonal of the Schur form
    (for ``T = [[λ₁, ν], [0, λ₂]]`` the normal part is ``diag(λ₁, λ₂)``, but after swapping
    the two eigenvalues it is not). :data:`SCHUR_ORDERS` names the orders depthlens offers:

    - ``lapack``: LAPACK's own order, exactly as ``scipy.linalg.schur(M, output="complex")``
      returns it (``zgees`` on M as a complex matrix); it depends on the algorithm's path, so
      it is not covariant, but it is what a plain SciPy script computes (the default protocol
      of the claims);
    - ``canonical``: descending modulus (moduli equal to 10 significant digits relative to
      the spectral radius count as ties), then descending imaginary part, then descending
      real part. With it, ``J(α)`` is a function of ``M`` alone and transforms covariantly,
      ``J(α)[U M U*] = U J(α)[M] U*`` for unitary U;
    - ``outside_first``: the ``lapack`` form with the eigenvalues ``|λ| > 1`` moved to the
      leading block, each group keeping LAPACK's relative order (``trsen``; what
      ``scipy.linalg.schur(M, output="complex", sort="ouc")`` returns, but for the
      eigenvalues on the unit circle within rounding, below);
    - ``inside_first``: the same with ``|λ| ≤ 1`` leading (``sort="iuc"``).

    An eigenvalue within rounding of the unit circle, ``||λ| − 1| ≤ STRUCTURAL_TOL ·
    max(1, max|λ|)`` (:data:`STRUCTURAL_TOL`), counts as on it and so in the ``|λ| ≤ 1``
    group: the structurally-1 eigenvalues of a sub-layer Jacobian (``I + U`` with ``U`` of
    rank below d) are computed at ``|λ| − 1`` of a few 1e-15 of either sign, and a sign
    that follows the rounding (BLAS thread count, CPU kernel) would move them between
    groups and change ``Q`` and ``J(0)`` by O(1).

Reordering
    Below :data:`BLOCKED_FROM` (256) the orders other than ``lapack`` are reached with
    LAPACK's unblocked ``trsen`` and ``trexc``, bit for bit as SciPy would. From it on (every
    model of d = 576 such as SmolLM2 included) they are reached with the blocked moves of
    :mod:`depthlens.linalg.reorder`: the same diagonal, normal parts within about 1e-14 of the
    unblocked ones where eigenvalues are distinct, 1.1–1.2× faster at n = 256, 1.5× (the
    ``outside_first`` selection) and 1.9× (the ``canonical`` sort) at n = 576, 3–5× at
    n = 1024–2048 (``benchmarks/bench_reorder.py``, one BLAS thread).

Real input
    ``canonical``: if every eigenvalue of a real ``M`` is real, its real Schur form is
    already triangular with an orthogonal Q, and every ``J(α)`` is real (returned as
    float64). If ``M`` has a complex-conjugate pair, ``M₀`` is in general complex — a real
    matrix and its normal part share a real form only when each complex eigenvector
    ``x + iy`` has ``|x| = |y|`` and ``x ⟂ y`` — so ``J(α)`` is returned as complex128 for
    α < 1. The other orders decompose M as a complex matrix, as SciPy does: their ``q`` and
    ``t`` are always complex128.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.lapack
from numpy.typing import ArrayLike

from ..errors import InputError
from ._checks import as_square
from . import guarded, reorder
from .orders import SCHUR_ORDERS, SchurOrder

__all__ = ["BLOCKED_FROM", "SCHUR_ORDERS", "STRUCTURAL_TOL", "SchurForm", "SchurOrder", "check_schur_order",
           "iter_schur_forms", "schur_form", "schur_forms", "schur_split"]

#: Order from which reorderings are blocked (:mod:`depthlens.linalg.reorder`: eigenvalues move
#: in windows and the rest of the form is updated by matrix products) instead of LAPACK's
#: unblocked ``trsen`` / ``trexc``: where the blocked moves stop being slower
#: (``benchmarks/bench_reorder.py``: 1.1× faster at n = 256, 1.5–1.9× at 576, about 4× at 2048).
#: Below it every form is bit for bit what LAPACK's routines give.
BLOCKED_FROM = 256

STRUCTURAL_TOL = 1e-8
"""Relative distance, in units of ``max(1, max|λ|)``, within which a computed eigenvalue of a
float64 operator is taken to sit exactly on a structural value (the eigenvalue 1 of a
rank-deficient update, the unit circle). Such eigenvalues are computed within about
``n ε ‖M‖`` (1e-15 to 1e-12 for the mean Jacobians), far below; eigenvalues that carry
larger errors (means of float32 operators, about 1e-7) stay above it."""


def check_schur_order(order: str) -> SchurOrder:
    """``order`` if it is one of :data:`SCHUR_ORDERS`; else :class:`InputError`."""
    if order not in SCHUR_ORDERS:
        raise InputError(f"Schur order {order!r} is not one of {', '.join(SCHUR_ORDERS)}.")
    return order  # type: ignore[return-value]


@dataclass(frozen=True)
class SchurForm:
    """``matrix = q @ t @ q.conj().T`` with ``q`` unitary and ``t`` upper triangular.

    The diagonal of ``t`` is in the eigenvalue order ``order`` (module notes). ``q`` and ``t``
    are float64 for the ``canonical`` form of a real ``matrix`` with real eigenvalues,
    complex128 otherwise.
    """

    matrix: np.ndarray
    q: np.ndarray
    t: np.ndarray
    order: SchurOrder = "canonical"

    @property
    def eigenvalues(self) -> np.ndarray:
        """Λ: the diagonal of ``t`` (the eigenvalues, in Schur order)."""
        return np.diagonal(self.t).copy()

    @property
    def nonnormal(self) -> np.ndarray:
        """N: the strictly upper triangular part of ``t``; ``‖N‖_F`` is the Henrici departure."""
        return np.triu(self.t, k=1)

    @property
    def normal_part(self) -> np.ndarray:
        """``M₀ = Q Λ Q*``: normal, with the spectrum of ``matrix``."""
        return (self.q * self.eigenvalues) @ self.q.conj().T


def canonical_rank(lam: np.ndarray, scale: float) -> np.ndarray:
    """Each eigenvalue's position in the ``canonical`` order (module notes; moduli rounded to 10
    digits of ``scale``, ties kept in their current order)."""
    order = np.lexsort((-lam.real, -lam.imag, -np.round(np.abs(lam) / scale, 10)))
    rank = np.empty(len(lam), dtype=np.int64)
    rank[order] = np.arange(len(lam))
    return rank


def _first_in_order(lam: np.ndarray, scale: float) -> int:
    return int(np.argmin(canonical_rank(lam, scale)))


def _canonical_order(t: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Selection sort of the Schur diagonal with LAPACK ``trexc`` (unitary swaps, O(n³) worst),
    in place on the Fortran-ordered ``t`` and ``q`` the caller owns (a copy per move of both
    n×n arrays used to dominate the cost); from :data:`BLOCKED_FROM` on, the same order by
    blocked moves (:func:`depthlens.linalg.reorder.sort_diagonal`, keys taken once from the
    diagonal before the moves)."""
    trexc = scipy.linalg.lapack.ztrexc if t.dtype.kind == "c" else scipy.linalg.lapack.dtrexc
    scale = float(np.abs(np.diagonal(t)).max())
    if scale == 0:
        return t, q
    if len(t) >= BLOCKED_FROM:
        reorder.sort_diagonal(t, q, canonical_rank(np.diagonal(t), scale))
        return t, q
    for p in range(len(t) - 1):
        j = p + _first_in_order(np.diagonal(t)[p:], scale)
        if j != p:
            t, q, info = trexc(t, q, j + 1, p + 1, overwrite_a=1, overwrite_q=1)
            if info != 0:  # pragma: no cover - trexc only refuses swaps of 2×2 blocks, absent here
                raise InputError(f"reordering the Schur form failed (LAPACK trexc info={info}); perturb M slightly.")
    return t, q


def _outside_unit_circle(lam: np.ndarray) -> np.ndarray:
    """``|λ| > 1`` beyond rounding: moduli within :data:`STRUCTURAL_TOL` of 1 count as on the circle."""
    modulus = np.abs(lam)
    return modulus > 1.0 + STRUCTURAL_TOL * max(1.0, float(modulus.max(initial=0.0)))


def _leading(t: np.ndarray, q: np.ndarray, select: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The complex Schur form ``(t, q)`` reordered so that the ``select``-ed eigenvalues lead,
    each group in its previous relative order (LAPACK ``ztrsen`` without condition numbers,
    as ``gees`` applies its ``sort``); from :data:`BLOCKED_FROM` on, by blocked moves
    (:func:`depthlens.linalg.reorder.select_leading`) on copies."""
    if len(t) >= BLOCKED_FROM:
        t, q = np.array(t, order="F"), np.array(q, order="F")
        reorder.select_leading(t, q, select)
        return t, q
    t, q, _, _, _, _, info = scipy.linalg.lapack.ztrsen(select.astype(np.int32), t, q, job="N")
    if info != 0:  # pragma: no cover - ztrsen fails only on invalid arguments
        raise InputError(f"reordering the Schur form failed (LAPACK ztrsen info={info}).")
    return t, q


def schur_form(M: ArrayLike, order: SchurOrder = "canonical") -> SchurForm:
    """Triangular Schur form of one square matrix with its eigenvalues in ``order``.

    Parameters
    ----------
    M : array_like, shape (n, n)
        A finite real or complex square matrix.
    order : {"canonical", "lapack", "outside_first", "inside_first"}
        Order of the eigenvalues along the diagonal (module notes).

    Returns
    -------
    SchurForm
        Backward stable (LAPACK ``gees``, ``trexc``, ``trsen``, and the blocked moves of
        :mod:`depthlens.linalg.reorder` from :data:`BLOCKED_FROM` on): ``q t q*`` equals
        ``M`` to about ``n ε ‖M‖``. ``lapack`` is bit-for-bit ``scipy.linalg.schur(M,
        output="complex")`` when its first driver converges (the fallbacks of
        :func:`depthlens.linalg.guarded.schur` give another valid form).

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or ``order`` is unknown.

    Notes
    -----
    Cost O(n³). ``canonical``: one real Schur decomposition for real input (plus a
    conversion to complex form, O(n³), when it has 2×2 blocks), one complex Schur
    decomposition otherwise, then at most n − 1 reordering moves of O(n²) each. The other
    orders: one complex Schur decomposition (about 3× a real one), plus one ``trsen``
    (O(n³) at most) for ``outside_first`` and ``inside_first``. :func:`schur_forms` gives
    several orders for the price of one complex decomposition.
    """
    return schur_forms(M, (check_schur_order(order),))[0]


def schur_forms(M: ArrayLike, orders: Sequence[SchurOrder]) -> list[SchurForm]:
    """:func:`schur_form` of one matrix in each of several orders, one complex Schur
    decomposition serving ``lapack``, ``outside_first`` and ``inside_first`` together.

    Parameters
    ----------
    M : array_like, shape (n, n)
        A finite real or complex square matrix.
    orders : sequence of {"canonical", "lapack", "outside_first", "inside_first"}
        The orders wanted (module notes).

    Returns
    -------
    list of SchurForm
        One per order, in the order given, each bit for bit ``schur_form(M, order)``: the
        ``outside_first`` and ``inside_first`` forms reorder the ``lapack`` form (LAPACK
        ``trsen``), exactly as :func:`schur_form` does after its own decomposition.

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or an order is unknown.

    Notes
    -----
    Cost: one complex Schur decomposition when any order but ``canonical`` is asked for, one
    ``trsen`` per ``outside_first`` and ``inside_first``, and the ``canonical`` form's own
    decomposition and reordering (see :func:`schur_form`).
    """
    return list(iter_schur_forms(M, orders))


def iter_schur_forms(M: ArrayLike, orders: Sequence[SchurOrder]) -> Iterator[SchurForm]:
    """The forms of :func:`schur_forms`, bit for bit, one at a time: between two forms only the
    complex decomposition they share is kept, so a caller that drops each form once used (the
    funnel's normal parts) holds that decomposition and one form at a time, not all four forms.

    The orders are checked (and ``M``) before the first form is computed; an order given
    twice is computed twice.
    """
    wanted = [check_schur_order(o) for o in orders]
    arr = as_square(M, "M")
    return _forms(arr, wanted)


def _forms(arr: np.ndarray, wanted: list[SchurOrder]) -> Iterator[SchurForm]:
    base: tuple[np.ndarray, np.ndarray] | None = None
    for order in wanted:
        if order == "canonical":
            yield _canonical_form(arr)
            continue
        if base is None:
            base = guarded.schur(arr, output="complex")
        t, q = base
        if order != "lapack":
            outside = _outside_unit_circle(np.diagonal(t))
            t, q = _leading(t, q, outside if order == "outside_first" else ~outside)
        form = SchurForm(matrix=arr, q=q, t=np.triu(t), order=order)
        del t, q
        yield form
        del form


def _canonical_form(arr: np.ndarray) -> SchurForm:
    """The ``canonical`` Schur form of a checked square array (see :func:`schur_form`)."""
    if arr.dtype.kind == "c":
        t, q = guarded.schur(arr, output="complex")
    else:
        t, q = guarded.schur(arr, output="real")
        if np.any(np.diagonal(t, offset=-1) != 0):
            t, q = scipy.linalg.rsf2csf(t, q)
    t, q = _canonical_order(np.asfortranarray(np.triu(t)), np.asfortranarray(q))
    return SchurForm(matrix=arr, q=np.ascontiguousarray(q), t=np.triu(t), order="canonical")


def schur_split(M: ArrayLike | SchurForm, alpha: float | Sequence[float], order: SchurOrder = "canonical") -> np.ndarray:
    """``J(α) = Q (Λ + αN) Q*`` for one α or several, from one Schur decomposition.

    Parameters
    ----------
    M : array_like, shape (n, n), or SchurForm
        The operator, or its :func:`schur_form` (reused, not recomputed, in its own order).
    alpha : float or sequence of float
        Scale(s) of the non-normal part; §B4 uses 0, 0.25, 0.5, 0.75, 1. Any finite
        real value is accepted.
    order : {"canonical", "lapack", "outside_first", "inside_first"}
        Eigenvalue order of the Schur form of an array ``M`` (module notes).

    Returns
    -------
    numpy.ndarray, shape (n, n) for a scalar alpha, (len(alpha), n, n) for a sequence
        float64 when the Schur form is real (``canonical``, ``M`` real with only real
        eigenvalues); complex128 otherwise (see the module notes; then α = 1 gives ``M``
        with zero imaginary part). Computed as ``(1 − α) M₀ + α M``: α = 1 reproduces ``M``
        and α = 0 the normal part exactly; other α are accurate to about ``n ε ‖M‖``.

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, alpha is empty or not finite, or ``order``
        is unknown.

    Notes
    -----
    Cost O(n³) for the decomposition (skipped for a SchurForm) plus O(n²) per α.
    """
    form = M if isinstance(M, SchurForm) else schur_form(M, order)
    alphas = np.asarray(alpha, dtype=np.float64)
    if alphas.ndim > 1 or alphas.size == 0 or not np.all(np.isfinite(alphas)):
        raise InputError(f"alpha is {alpha!r}; pass a finite number or a non-empty sequence of finite numbers.")
    a = alphas.reshape(-1, 1, 1)
    out = (1.0 - a) * form.normal_part + a * form.matrix
    return out[0] if alphas.ndim == 0 else out
