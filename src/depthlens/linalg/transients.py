"""Power norms ``‖M^k‖₂``, the transient peak ``max_{k≥1} ‖M^k‖``, and the Kreiss–Spijker check.

Every norm here is the largest singular value of an explicitly formed power, computed in
float64 as ``√λ_max`` of the (rescaled) Gram matrix (:func:`spectral_norm`: a power iteration
closed by a Kato–Temple certificate where one singular value dominates, else a partial
eigensolve): exact up to rounding, about ``n·u`` relative, and never a lower estimate from an
unfinished iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from scipy.linalg.blas import dsyrk as _syrk, get_blas_funcs

from ..errors import InputError
from ._checks import as_square
from . import guarded

__all__ = ["SpijkerCheck", "TransientResult", "peak_of_sequence", "peak_transient", "power_norms", "power_norms_at",
           "spijker_check"]

_EPS = np.finfo(np.float64).eps


#: Most power-iteration steps :func:`spectral_norm` takes before it falls back to the eigensolve.
CERTIFIED_STEPS = 24


def spectral_norm(X: np.ndarray) -> float:
    """``‖X‖₂`` as ``s·√λ₁`` with ``λ₁ = λ_max(G)``, ``G = YᴴY``, ``Y = X/s``, ``s = max|X_ij|``
    (no overflow, no underflow).

    First a certified power iteration on ``G`` (products with ``Y`` and ``Yᴴ``, ``O(n²)`` a
    step, ``G`` never formed). With a unit iterate ``x``, ``θ = ‖Yx‖²`` and ``r = Gx − θx``:
    ``θ ≤ λ₁`` (Rayleigh), and since ``G ⪰ 0`` has trace ``‖Y‖_F²``, ``λ₂ ≤ ‖Y‖_F² − λ₁ ≤
    ‖Y‖_F² − θ =: α``; then every eigenvalue but ``λ₁`` lies at or below ``α``, so
    ``(λ₁ − θ)(θ − α) ≤ ‖r‖²`` (Kato–Temple: ``xᴴ(G − α)(G − λ₁)x ≥ 0``), i.e.
    ``λ₁ ≤ θ + ‖r‖²/(θ − α)`` whenever ``θ > α``. The iteration stops once that correction is
    at most ``2u·θ`` and returns the upper end ``s·√(θ + ‖r‖²/(θ − α))``, within about ``u``
    of ``s·√θ``. This needs a dominant singular value (``σ₁² > ‖X‖_F²/2``), which powers of
    attention matrices have (every one of SmolLM2's, about 5 steps each). Otherwise, or after
    :data:`CERTIFIED_STEPS` steps, the Gram matrix is formed by BLAS ``syrk`` (its lower
    triangle, half the flops of a general product) and its largest eigenvalue computed by a
    partial symmetric eigensolve, ``O(n³)``.

    Either way the value is the largest singular value to about ``n·u`` relative (the rounding
    of the products; the largest singular value is well conditioned in the Gram matrix) and
    never a lower estimate from an unfinished iteration. Both agree with LAPACK's SVD within
    ``4n·u`` relative on deflated attention powers (``tests/linalg/test_transients.py``); on
    SmolLM2's 3,240 powers ``B¹ … B¹²`` of one chunk every norm was certified, within 6.5e-16
    of the eigensolve.
    """
    s = float(np.max(np.abs(X)))
    if s == 0.0:
        return 0.0
    Y = X / s
    lam = _certified_top_eigenvalue(Y)
    if lam is None:
        lam = _gram_top_eigenvalue(Y)
    return s * math.sqrt(max(lam, 0.0))


def _gram_top_eigenvalue(Y: np.ndarray) -> float:
    """``λ_max(YᴴY)`` by the Gram matrix (``syrk`` for real ``Y``) and a partial eigensolve."""
    n = Y.shape[0]
    gram = _syrk(1.0, Y, trans=1, lower=1) if Y.dtype == np.float64 else Y.conj().T @ Y
    return float(guarded.eigvalsh(gram, subset_by_index=(n - 1, n - 1))[-1])


def _certified_top_eigenvalue(Y: np.ndarray) -> float | None:
    """``λ_max(YᴴY)`` from the power iteration of :func:`spectral_norm` (its upper end), or None
    when the Kato–Temple certificate does not close within :data:`CERTIFIED_STEPS` steps."""
    # the trace of G, rounded up: every term is non-negative, so the sum is within n²·u of it
    trace = float(np.vdot(Y, Y).real) * (1.0 + 2.0 * Y.size * _EPS)
    Yh = Y.conj().T
    # a positive start (never orthogonal to the top right singular vector of a non-negative Y);
    # the certificate holds whatever the start
    x = np.abs(Y).sum(axis=0) + 1.0
    x /= math.sqrt(float(np.vdot(x, x).real))
    for _ in range(CERTIFIED_STEPS):
        z = Y @ x
        w = Yh @ z
        theta = float(np.vdot(z, z).real)
        gap = 2.0 * theta - trace  # θ − α
        residual = w - theta * x
        r2 = float(np.vdot(residual, residual).real)
        if gap > 0.0 and r2 <= 2.0 * _EPS * theta * gap:
            return theta + r2 / gap
        norm = math.sqrt(float(np.vdot(w, w).real))
        if norm == 0.0 or not math.isfinite(norm):
            return None
        x = w / norm
    return None


def _left_product(A: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``X ↦ A·X``; through BLAS ``trmm`` when ``A`` is triangular (half the flops of a
    general product, e.g. deflated causal attention), else ``@``. Both are conventional
    products (each entry a sum of the same ``n`` terms, exact zeros of ``A`` skipped by
    ``trmm``), so the forward-error bound ``γ_n|A||X|`` holds for either."""
    lower, upper = not np.triu(A, 1).any(), not np.tril(A, -1).any()
    if not (lower or upper) or A.dtype not in (np.float64, np.complex128):
        return lambda X: A @ X
    trmm = get_blas_funcs("trmm", (A,))
    Af = np.asfortranarray(A)
    return lambda X: trmm(1.0, Af, X, lower=int(lower))


def cheap_norm_bound(X: np.ndarray) -> float:
    """Rigorous upper bound on ``‖X‖₂`` in ``O(n²)``: ``min(‖X‖_F, √(‖X‖₁‖X‖_∞))``, inflated
    by ``4n·u`` for the rounding of the sums. Tight when ``X`` is close to rank one."""
    mag = np.abs(X)
    one = float(mag.sum(axis=0).max())
    inf = float(mag.sum(axis=1).max())
    fro = float(np.linalg.norm(X))
    return min(fro, math.sqrt(one * inf)) * (1.0 + 4.0 * X.shape[0] * _EPS)


def iter_power_norms(
    A: np.ndarray, exact_if: Callable[[int, float], bool] | None = None, exact_first: int = 0
) -> Iterator[float]:
    """Yield ``‖A^k‖₂`` (or a rigorous upper bound on it) for ``k = 1, 2, …``; zeros forever
    once a power is 0 (``A`` validated).

    With ``exact_if=None`` every value is exact (a dense eigensolve per power). Otherwise
    powers ``k ≤ exact_first`` are exact (no cheap bound is formed for them) and for later
    ones :func:`cheap_norm_bound` is computed first and the exact norm only when
    ``exact_if(k, bound)`` is true, so callers that need exact values only near a peak pay
    ``O(n²)`` instead of ``O(n³)`` for the other powers (the product itself stays ``O(n³)``).

    Raises
    ------
    InputError
        When a power overflows float64 (``ρ(A) > 1`` and ``k`` too large).
    """
    X = A.copy()
    times_a = _left_product(A)
    k = 1
    while True:
        if not np.all(np.isfinite(X)):
            raise InputError(f"M^{k} overflows float64; ask for fewer powers (spectral radius > 1).")
        if exact_if is None or k <= exact_first:
            a = spectral_norm(X)
        else:
            a = cheap_norm_bound(X)
            if a > 0.0 and exact_if(k, a):
                a = spectral_norm(X)
        yield a
        if a == 0.0:
            while True:
                yield 0.0
        X = times_a(X)
        k += 1


def power_norms(M: object, kmax: int) -> np.ndarray:
    """``‖M^k‖₂`` for ``k = 0, 1, …, kmax`` (``‖M⁰‖ = 1``).

    Exact up to rounding: each power is formed by repeated multiplication in float64 and its
    largest singular value computed densely (relative error about ``k·n·u`` from the products
    plus ``n·u`` from the eigensolve). A nilpotent ``M`` gives exact zeros from the first
    vanishing power on.

    Cost: ``kmax`` matrix products and ``kmax`` partial eigensolves, ``O(kmax·n³)``.

    Parameters
    ----------
    M : array_like, shape (n, n)
    kmax : int
        Largest power, ``≥ 0``.

    Returns
    -------
    ndarray, float64, shape (kmax + 1,)

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, ``kmax < 0``, or a power overflows.

    Examples
    --------
    >>> import numpy as np
    >>> power_norms(np.array([[0.0, 0.0], [1.0, 0.0]]), 3).tolist()
    [1.0, 1.0, 0.0, 0.0]
    """
    A = as_square(M)
    if int(kmax) < 0:
        raise InputError(f"kmax={kmax} is negative; pass kmax >= 0.")
    out = np.empty(int(kmax) + 1)
    out[0] = 1.0
    it = iter_power_norms(A)
    for k in range(1, int(kmax) + 1):
        out[k] = next(it)
    return out


def power_norms_at(M: object, powers: object) -> np.ndarray:
    """``‖M^k‖₂`` for each ``k`` of ``powers`` (strictly increasing integers ``≥ 0``), exact.

    The same values as :func:`power_norms` at those ``k`` (each power formed by repeated
    multiplication in float64, its norm from a dense eigensolve), with the eigensolve skipped
    for the powers in between: a sparse sampling of a long transient (``k`` = 1, 2, …, 16, 32,
    …, 256) costs the ``max(powers)`` products, ``O(max(powers)·n³)``, plus one ``O(n³)``
    eigensolve per sampled power and an ``O(n²)`` bound for every other one.

    Parameters
    ----------
    M : array_like, shape (n, n)
    powers : array_like of int, 1-D
        Strictly increasing, ``≥ 0`` (``‖M⁰‖ = 1``).

    Returns
    -------
    ndarray, float64, shape (len(powers),)

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix, ``powers`` is not a strictly increasing 1-D
        sequence of integers ``≥ 0``, or a power overflows.

    Examples
    --------
    >>> import numpy as np
    >>> power_norms_at(np.array([[0.5, 0.0], [1.0, 0.5]]), [0, 1, 4]).round(6).tolist()
    [1.0, 1.207107, 0.507694]
    """
    A = as_square(M)
    ks = np.asarray(powers)
    if (ks.ndim != 1 or ks.size == 0 or ks.dtype.kind not in "iu" or ks[0] < 0
            or (ks.size > 1 and np.any(np.diff(ks) <= 0))):
        raise InputError(f"powers={powers!r} is not a strictly increasing 1-D sequence of integers >= 0.")
    wanted = {int(k) for k in ks}
    out = np.empty(ks.size)
    it = iter_power_norms(A, exact_if=lambda k, _bound: k in wanted)
    i = 0
    if ks[0] == 0:
        out[0], i = 1.0, 1
    for k in range(1, int(ks[-1]) + 1):
        a = next(it)
        if k in wanted:
            out[i] = a
            i += 1
    return out


@dataclass(frozen=True)
class TransientResult:
    """The transient peak ``G(M) = max_{k≥1} ‖M^k‖₂`` and how far it is certified.

    Attributes
    ----------
    peak : float
        ``max_{k≥1} ‖M^k‖`` over the powers computed; ``inf`` when ``ρ(M) > 1``.
    argmax : int
        The smallest ``k ≥ 1`` attaining ``peak`` (``-1`` when ``peak`` is infinite).
    norms : ndarray
        ``‖M^k‖`` for ``k = 0 … kmax`` where ``exact``, elsewhere the rigorous upper bound
        of :func:`cheap_norm_bound`, which was already below the running peak (so that power
        cannot be the peak and needs no eigensolve).
    exact : ndarray of bool
        Which entries of ``norms`` are exact norms.
    kmax : int
        Last power computed.
    certified : bool
        True when ``peak`` is the supremum over all ``k ≥ 1`` (see ``certificate``).
    certificate : str
        ``"nilpotent"`` (``M^k = 0`` from ``k = kmax`` on), ``"contraction"`` (``‖M^m‖ < 1`` for
        ``m = kmax``, so every later power is below one of ``M^1 … M^m``), ``"rho>1"`` (the
        powers grow without bound), or ``"none"`` (stopped at the cap or at the requested
        ``kmax`` without a certificate).
    spectral_radius : float
        ``max |λ(M)|``.
    """

    peak: float
    argmax: int
    norms: np.ndarray
    exact: np.ndarray
    kmax: int
    certified: bool
    certificate: str
    spectral_radius: float


def contracts(norm: float, n: int) -> bool:
    """Whether a power norm (exact or an upper bound) is below 1 by more than the ``2n·u``
    rounding margin: the geometric-decay certificate that ends a transient-peak scan."""
    return norm < 1.0 - 2.0 * n * _EPS


def peak_of_sequence(norms: np.ndarray, exact: np.ndarray) -> tuple[float, int]:
    """``max_{k≥1}`` and its first argmax over the exact entries of a power-norm sequence.

    Valid as the transient peak when every inexact entry is an upper bound that was at most
    the largest exact norm before it (as :func:`iter_power_norms` callers arrange) and the
    sequence ends with a certificate (a power of norm < 1, or a zero power).
    """
    values = np.where(np.asarray(exact)[1:], np.asarray(norms)[1:], -1.0)
    k = 1 + int(np.argmax(values))
    return float(norms[k]), k


def peak_transient(M: object, kmax: int | None = None) -> TransientResult:
    """Transient peak ``max_{k≥1} ‖M^k‖₂`` and its argmax, certified where possible.

    Stopping rule (``kmax=None``): compute ``a_k = ‖M^k‖`` until the first ``m`` with
    ``a_m < 1`` (less a ``2n·u`` rounding margin) or ``a_m = 0``. Then every ``j > m`` is
    ``j = s + q·m`` with ``1 ≤ s ≤ m``, ``q ≥ 1``, and submultiplicativity gives
    ``a_j ≤ a_s·a_m^q < a_s``: no later power exceeds ``max(a_1 … a_m)``, which is therefore
    the supremum (a geometric-decay certificate). A nilpotent ``M`` stops at the first zero
    power (``k ≤ n``). If ``ρ(M) > 1`` the supremum is infinite; if ``ρ(M) = 1`` (within
    ``√u``) no certificate exists and the scan stops at the cap ``20·n + 100`` uncertified.
    With an explicit ``kmax`` exactly the powers ``1 … kmax`` are scanned (certified only if a
    certificate appears within them).

    The contraction test uses a rigorous upper bound on ``a_m`` where the exact norm was not
    needed (see :attr:`TransientResult.exact`), which only ever delays the certificate.

    Cost: ``m`` products, ``O(m·n³)``, plus an ``O(n³)`` eigensolve only for powers whose
    cheap bound exceeds the running peak, and one eigenvalue computation.

    Parameters
    ----------
    M : array_like, shape (n, n)
    kmax : int, optional
        Scan exactly ``1 … kmax`` instead of using the stopping rule.

    Returns
    -------
    TransientResult

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or ``kmax < 1``.

    Examples
    --------
    >>> import numpy as np
    >>> peak_transient(np.array([[0.5, 0.0], [4.0, 0.5]])).argmax
    1
    """
    A = as_square(M)
    n = A.shape[0]
    if kmax is not None and int(kmax) < 1:
        raise InputError(f"kmax={kmax} is out of range; pass kmax >= 1 or None.")
    rho = float(np.max(np.abs(guarded.eigvals(A))))
    if kmax is None and rho > 1.0 + math.sqrt(_EPS):
        return TransientResult(math.inf, -1, np.array([1.0]), np.array([True]), 0, True, "rho>1", rho)
    cap = int(kmax) if kmax is not None else 20 * n + 100
    norms = [1.0]
    exact = [True]
    certificate = "none"
    best = [-1.0]  # largest exact norm so far
    chose = [True]  # whether the last value was computed exactly

    def need_exact(_: int, bound: float) -> bool:
        chose[0] = bound > best[0]
        return chose[0]

    for a in iter_power_norms(A, need_exact):
        was_exact = a == 0.0 or chose[0]
        exact.append(was_exact)
        if was_exact:
            best[0] = max(best[0], a)
        norms.append(a)
        if certificate == "none" and a == 0.0:
            certificate = "nilpotent"
        elif certificate == "none" and contracts(a, n):
            certificate = "contraction"
        if len(norms) - 1 >= cap or (kmax is None and certificate != "none"):
            break
    arr = np.asarray(norms)
    is_exact = np.asarray(exact)
    peak, k_peak = peak_of_sequence(arr, is_exact)
    return TransientResult(
        peak=peak,
        argmax=k_peak,
        norms=arr,
        exact=is_exact,
        kmax=int(arr.size - 1),
        certified=certificate != "none",
        certificate=certificate,
        spectral_radius=rho,
    )


@dataclass(frozen=True)
class SpijkerCheck:
    """Result of checking the Kreiss matrix theorem ``K ≤ sup_{k≥0} ‖M^k‖ ≤ e·n·K``.

    Attributes
    ----------
    kreiss : float
        The Kreiss constant that was checked.
    sup_power : float
        ``sup_{k≥0} ‖M^k‖ = max(1, peak)`` (the ``k = 0`` term ``‖I‖ = 1`` is part of the
        theorem).
    lower_holds, upper_holds : bool
        ``K ≤ sup_power·(1 + rtol)`` and ``sup_power ≤ e·n·K·(1 + rtol)``.
    certified : bool
        Whether ``sup_power`` is the certified supremum (see :func:`peak_transient`).
    """

    kreiss: float
    sup_power: float
    lower_holds: bool
    upper_holds: bool
    certified: bool

    @property
    def holds(self) -> bool:
        """Both inequalities hold."""
        return self.lower_holds and self.upper_holds


def spijker_check(K: float, M: object, *, rtol: float = 1e-8) -> SpijkerCheck:
    """Check ``K ≤ sup_k ‖M^k‖ ≤ e·n·K`` (Kreiss matrix theorem with Spijker's constant).

    Parameters
    ----------
    K : float
        A Kreiss constant of ``M`` (for example ``kreiss(M).value``).
    M : array_like, shape (n, n)
    rtol : float
        Relative slack for rounding.

    Returns
    -------
    SpijkerCheck

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or ``K`` is not a positive number.
    """
    A = as_square(M)
    if not (isinstance(K, (int, float, np.floating)) and K > 0):
        raise InputError(f"K={K!r} is not a positive number; pass the Kreiss constant as a float.")
    tr = peak_transient(A)
    sup = max(1.0, tr.peak)
    n = A.shape[0]
    return SpijkerCheck(
        kreiss=float(K),
        sup_power=sup,
        lower_holds=bool(K <= sup * (1.0 + rtol)),
        upper_holds=bool(sup <= math.e * n * K * (1.0 + rtol)),
        certified=tr.certified,
    )
