"""The Kreiss value search's one-dimensional refinement on the positive real axis, compiled.

:func:`brent_axis` is SciPy's bounded Brent (``scipy.optimize.minimize_scalar(method=
"bounded")``, its golden-section and parabolic steps and its stopping rule, step for step) on
``−f(t)``, ``f(t) = (r − 1)/σ_min(rI − L)`` at ``r = 1 + e^t``, with each ``σ_min`` from the
numba kernel :func:`~depthlens.linalg._kernels.sigma_min_batch` started from the previous
point's right singular vector plus ``10⁻²·v0``: exactly the points and values of
:meth:`~depthlens.linalg.kreiss_search.Objective.refine_axis` on the Python path, whose
interpreter overhead (SciPy's loop, one ``evaluate`` call per point) cost about as much as the
kernel itself on 128-token heads. The Python path stays the reference (and the ``numpy``
engine's path), and it takes over wherever a point does not converge, since its dense fallback
is not compiled.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._kernels import _WARM_MIX, sigma_min_batch
from .sigma import DEFAULT_MAXITER, DEFAULT_TOL, TriangularForm, _start_vector

__all__ = ["MAXFUN", "XATOL", "brent_axis", "refine"]

#: The refinement's tolerance in ``t`` (SciPy's ``xatol``) and its evaluation cap (SciPy's
#: default ``maxiter`` of the bounded method), on both paths.
XATOL, MAXFUN = 1e-10, 500


def refine(tf: TriangularForm, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`brent_axis` on ``tf``'s ``L`` from the fixed start vector of
    :meth:`~depthlens.linalg.sigma.TriangularForm.evaluate`: the points ``z = 1 + e^t``
    evaluated (complex128) and their ratios, or None when a point did not converge."""
    Lr, Li = tf.parts()
    ok, r, f, count = brent_axis(Lr, Li, _start_vector(tf.n, real=Li.size == 0), float(lo), float(hi), XATOL,
                                 DEFAULT_TOL, DEFAULT_MAXITER, MAXFUN)
    return (r[:count].astype(np.complex128), f[:count]) if ok else None


@njit(cache=True)
def _ratio_at(Lr, Li, t, start, v0, tol, maxiter, out_v):  # pragma: no cover - compiled
    """``(r, f, converged)`` at ``r = 1 + e^t`` from ``start + _WARM_MIX·v0`` (``v0`` alone
    without a start); the right singular vector goes to ``out_v``."""
    r = 1.0 + math.exp(t)
    zs = np.empty(1, dtype=np.complex128)
    zs[0] = complex(r, 0.0)
    w = start + _WARM_MIX * v0 if start.shape[0] else v0
    sig, _, V, _, _, _, conv = sigma_min_batch(Lr, Li, zs, w, tol, maxiter, True, True, False)
    out_v[:] = V[0]
    s = sig[0]
    f = (r - 1.0) / s if s > 0.0 else np.inf
    return r, f, conv[0]


@njit(cache=True)
def brent_axis(Lr, Li, v0, lo, hi, xatol, tol, maxiter, maxfun):  # pragma: no cover - compiled
    """Maximise ``f(1 + e^t)`` over ``t ∈ [lo, hi]`` by SciPy's bounded Brent (``xatol``,
    ``maxfun`` evaluations at most), each ``σ_min`` by inverse iteration (``tol``, ``maxiter``).

    Returns ``(ok, r, f, count)``: the points ``r[:count]`` in evaluation order and their ratios
    ``f``; ``ok`` is False, and the arrays hold the points so far, once a point does not
    converge.
    """
    rs = np.empty(maxfun)
    fs = np.empty(maxfun)
    v = np.empty(v0.shape[0], dtype=np.complex128)
    start = np.empty(0, dtype=np.complex128)
    sqrt_eps = math.sqrt(2.2e-16)
    golden_mean = 0.5 * (3.0 - math.sqrt(5.0))
    a, b = lo, hi
    fulc = a + golden_mean * (b - a)
    nfc, xf = fulc, fulc
    rat = e = 0.0
    x = xf
    rs[0], f, ok = _ratio_at(Lr, Li, x, start, v0, tol, maxiter, v)
    fs[0] = f
    if not ok:
        return False, rs, fs, 1
    start = v.copy()
    fx = -f
    num = 1
    ffulc = fnfc = fx
    xm = 0.5 * (a + b)
    tol1 = sqrt_eps * abs(xf) + xatol / 3.0
    tol2 = 2.0 * tol1
    while abs(xf - xm) > (tol2 - 0.5 * (b - a)):
        golden = True
        if abs(e) > tol1:  # a parabolic fit
            golden = False
            r = (xf - nfc) * (fx - ffulc)
            q = (xf - fulc) * (fx - fnfc)
            p = (xf - fulc) * q - (xf - nfc) * r
            q = 2.0 * (q - r)
            if q > 0.0:
                p = -p
            q = abs(q)
            r = e
            e = rat
            if abs(p) < abs(0.5 * q * r) and p > q * (a - xf) and p < q * (b - xf):
                rat = (p + 0.0) / q
                x = xf + rat
                if (x - a) < tol2 or (b - x) < tol2:
                    rat = tol1 * (np.sign(xm - xf) + (1.0 if xm - xf == 0 else 0.0))
            else:
                golden = True
        if golden:
            e = (a - xf) if xf >= xm else (b - xf)
            rat = golden_mean * e
        x = xf + (np.sign(rat) + (1.0 if rat == 0 else 0.0)) * max(abs(rat), tol1)
        rs[num], f, ok = _ratio_at(Lr, Li, x, start, v0, tol, maxiter, v)
        fs[num] = f
        num += 1
        if not ok:
            return False, rs, fs, num
        start[:] = v
        fu = -f
        if fu <= fx:
            if x >= xf:
                a = xf
            else:
                b = xf
            fulc, ffulc = nfc, fnfc
            nfc, fnfc = xf, fx
            xf, fx = x, fu
        else:
            if x < xf:
                a = x
            else:
                b = x
            if fu <= fnfc or nfc == xf:
                fulc, ffulc = nfc, fnfc
                nfc, fnfc = x, fu
            elif fu <= ffulc or fulc == xf or fulc == nfc:
                fulc, ffulc = x, fu
        xm = 0.5 * (a + b)
        tol1 = sqrt_eps * abs(xf) + xatol / 3.0
        tol2 = 2.0 * tol1
        if num >= maxfun:
            break
    return True, rs, fs, num
