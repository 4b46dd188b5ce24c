"""Compiled kernels for the smallest singular value of a shifted lower-triangular matrix.

The one numerical job here: for a lower-triangular ``L`` (float64 or complex128) and complex
shifts ``z_k``, find ``σ_min(z_k I − L)`` with its singular vectors by inverse iteration on
``(zI − L)ᴴ (zI − L)``: two triangular solves per step, ``O(n²)`` work per step, no matrix is
formed. Two engines run the same algorithm step for step:

* ``numba``: compiled loops (``@njit(cache=True)``), one core; the loop over points is
  compiled too, so Python overhead is paid once per batch.
* ``numpy``: ``scipy.linalg.solve_triangular`` in a Python loop; slow, kept as a readable
  reference and as a fallback where numba is unavailable. Tested against ``numba``.

One step, with ``S = zI − L`` and a unit vector ``v``::

    x = S⁻ᴴ v,  u = x / ‖x‖,  y = S⁻¹ u,  σ = 1 / ‖y‖,  v ← y / ‖y‖

so ``S v = σ u`` holds up to the rounding of one triangular solve, and ``σ ≥ σ_min(S)``
always (``σ = 1/‖S⁻¹u‖`` with ``‖u‖ = 1``). The iteration stops when the relative change of
``σ`` is at most ``tol``; both residuals ``‖S v − σ u‖`` and ``‖Sᴴ u − σ v‖`` are then formed
explicitly (two triangular mat-vecs) when asked for. The linear rate is ``(σ_min/σ_2)²``; a point that has
not met ``tol`` after ``maxiter`` steps is returned with ``converged = False`` and callers fall
back to a dense SVD (see :mod:`depthlens.linalg.sigma`). Stopping on a change below
``tol`` within ``maxiter`` steps bounds the remaining error by about ``tol / (1 − rate)``.

Start vectors: a fixed pseudo-random unit vector ``v0`` (passed in); with ``warm=True`` each
point after the first starts from the previous point's right singular vector plus ``1e-2·v0``
(the admixture keeps a component along every singular direction, so a start that happens to
be a non-dominant singular vector of the new point cannot stall the iteration); after a point
that did not converge the next one starts from ``v0``. A shift equal to a diagonal entry of
``L`` (an eigenvalue) is not iterated and is reported as not converged.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from numba import njit

ENGINES = ("numba", "numpy")
_WARM_MIX = 1e-2
_FM = {"reassoc", "contract", "nsz"}


@njit(cache=True, fastmath=_FM)
def _solve(Lr, Li, cplx, zr, zi, br, bi, xr, xi):  # pragma: no cover - compiled
    """Solve ``(zI − L) x = b`` for lower-triangular ``L = Lr + i·Li`` (dot-product rows)."""
    n = Lr.shape[0]
    for i in range(n):
        sr = br[i]
        si = bi[i]
        if cplx:
            for j in range(i):
                sr += Lr[i, j] * xr[j] - Li[i, j] * xi[j]
                si += Lr[i, j] * xi[j] + Li[i, j] * xr[j]
            q = complex(sr, si) / complex(zr - Lr[i, i], zi - Li[i, i])
        else:
            for j in range(i):
                sr += Lr[i, j] * xr[j]
                si += Lr[i, j] * xi[j]
            q = complex(sr, si) / complex(zr - Lr[i, i], zi)
        xr[i] = q.real
        xi[i] = q.imag


@njit(cache=True, fastmath=_FM)
def _solve_h(Lr, Li, cplx, zr, zi, br, bi, xr, xi):  # pragma: no cover - compiled
    """Solve ``(zI − L)ᴴ x = b``: back substitution, one axpy per row of ``L``."""
    n = Lr.shape[0]
    for i in range(n):
        xr[i] = br[i]
        xi[i] = bi[i]
    for j in range(n - 1, -1, -1):
        lii = Li[j, j] if cplx else 0.0
        q = complex(xr[j], xi[j]) / complex(zr - Lr[j, j], lii - zi)
        a = q.real
        b = q.imag
        xr[j] = a
        xi[j] = b
        if cplx:
            for i in range(j):
                xr[i] += Lr[j, i] * a + Li[j, i] * b
                xi[i] += Lr[j, i] * b - Li[j, i] * a
        else:
            for i in range(j):
                xr[i] += Lr[j, i] * a
                xi[i] += Lr[j, i] * b


@njit(cache=True, fastmath=_FM)
def _residuals(Lr, Li, cplx, zr, zi, sig, ur, ui, vr, vi, wr, wi):  # pragma: no cover - compiled
    """Return ``(‖(zI−L)v − σu‖, ‖(zI−L)ᴴu − σv‖)`` by explicit triangular mat-vecs."""
    n = Lr.shape[0]
    r1 = 0.0
    for i in range(n):
        sr = zr * vr[i] - zi * vi[i] - sig * ur[i]
        si = zr * vi[i] + zi * vr[i] - sig * ui[i]
        if cplx:
            for j in range(i + 1):
                sr -= Lr[i, j] * vr[j] - Li[i, j] * vi[j]
                si -= Lr[i, j] * vi[j] + Li[i, j] * vr[j]
        else:
            for j in range(i + 1):
                sr -= Lr[i, j] * vr[j]
                si -= Lr[i, j] * vi[j]
        r1 += sr * sr + si * si
    for i in range(n):
        wr[i] = zr * ur[i] + zi * ui[i] - sig * vr[i]
        wi[i] = zr * ui[i] - zi * ur[i] - sig * vi[i]
    for j in range(n):
        a = ur[j]
        b = ui[j]
        if cplx:
            for i in range(j + 1):
                wr[i] -= Lr[j, i] * a + Li[j, i] * b
                wi[i] -= Lr[j, i] * b - Li[j, i] * a
        else:
            for i in range(j + 1):
                wr[i] -= Lr[j, i] * a
                wi[i] -= Lr[j, i] * b
    r2 = 0.0
    for i in range(n):
        r2 += wr[i] * wr[i] + wi[i] * wi[i]
    return np.sqrt(r1), np.sqrt(r2)


@njit(cache=True)
def _normalize(xr, xi):  # pragma: no cover - compiled
    """Scale ``x`` to unit 2-norm in place and return the old norm."""
    s = 0.0
    for i in range(xr.shape[0]):
        s += xr[i] * xr[i] + xi[i] * xi[i]
    nrm = np.sqrt(s)
    for i in range(xr.shape[0]):
        xr[i] /= nrm
        xi[i] /= nrm
    return nrm


@njit(cache=True)
def sigma_min_batch(Lr, Li, zs, v0, tol, maxiter, warm, keep, resid):  # pragma: no cover - compiled
    """Inverse iteration at every shift in ``zs``; see the module docstring.

    ``L = Lr + i·Li`` is lower triangular; pass ``Li`` with shape ``(0, 0)`` for a real ``L``.
    Returns ``(sigma, U, V, iters, res_right, res_left, converged)``; ``U``/``V`` hold the
    singular vectors row by row when ``keep`` is true and are ``(1, n)`` scratch otherwise;
    the residuals are computed only when ``resid`` is true (zeros otherwise).
    """
    n = Lr.shape[0]
    cplx = Li.shape[0] == n
    npts = zs.shape[0]
    sig = np.empty(npts)
    iters = np.zeros(npts, dtype=np.int64)
    res1 = np.empty(npts)
    res2 = np.empty(npts)
    conv = np.zeros(npts, dtype=np.bool_)
    rows = npts if keep else 1
    U = np.empty((rows, n), dtype=np.complex128)
    V = np.empty((rows, n), dtype=np.complex128)
    vr = np.empty(n)
    vi = np.empty(n)
    xr = np.empty(n)
    xi = np.empty(n)
    yr = np.empty(n)
    yi = np.empty(n)
    wr = np.empty(n)
    wi = np.empty(n)
    for k in range(npts):
        zr = zs[k].real
        zi = zs[k].imag
        mix = _WARM_MIX if (warm and k > 0 and conv[k - 1]) else 0.0
        for i in range(n):
            if mix > 0.0:
                vr[i] += mix * v0[i].real
                vi[i] += mix * v0[i].imag
            else:
                vr[i] = v0[i].real
                vi[i] = v0[i].imag
        _normalize(vr, vi)
        s_old = np.inf
        s = np.inf
        it = 0
        ok = False
        singular = False
        for i in range(n):
            if Lr[i, i] == zr and (Li[i, i] if cplx else 0.0) == zi:
                singular = True  # z is an eigenvalue: leave it to the dense fallback
        while it < maxiter and not singular:
            it += 1
            _solve_h(Lr, Li, cplx, zr, zi, vr, vi, xr, xi)
            _normalize(xr, xi)
            _solve(Lr, Li, cplx, zr, zi, xr, xi, yr, yi)
            s = 1.0 / _normalize(yr, yi)
            for i in range(n):
                vr[i] = yr[i]
                vi[i] = yi[i]
            if abs(s - s_old) <= tol * s:
                ok = True
                break
            s_old = s
        # (xr, xi) is the left vector u, (vr, vi) the right vector v, (zI − L) v ≈ s u.
        r1, r2 = _residuals(Lr, Li, cplx, zr, zi, s, xr, xi, vr, vi, wr, wi) if resid else (0.0, 0.0)
        sig[k] = s
        iters[k] = it
        res1[k] = r1
        res2[k] = r2
        conv[k] = ok and np.isfinite(s) and np.isfinite(r1) and np.isfinite(r2)
        if keep:
            for i in range(n):
                U[k, i] = complex(xr[i], xi[i])
                V[k, i] = complex(vr[i], vi[i])
    return sig, U, V, iters, res1, res2, conv


def sigma_min_batch_numpy(
    Lr: np.ndarray,
    Li: np.ndarray,
    zs: np.ndarray,
    v0: np.ndarray,
    tol: float,
    maxiter: int,
    warm: bool,
    keep: bool,
    resid: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same algorithm as :func:`sigma_min_batch` with ``scipy.linalg.solve_triangular``."""
    n = Lr.shape[0]
    L = Lr + 1j * Li if Li.shape[0] == n else Lr
    npts = zs.shape[0]
    sig = np.empty(npts)
    iters = np.zeros(npts, dtype=np.int64)
    res1 = np.empty(npts)
    res2 = np.empty(npts)
    conv = np.zeros(npts, dtype=bool)
    rows = npts if keep else 1
    U = np.empty((rows, n), dtype=np.complex128)
    V = np.empty((rows, n), dtype=np.complex128)
    v = v0.astype(np.complex128)
    eye = np.eye(n)
    for k in range(npts):
        S = complex(zs[k]) * eye - L
        v = v + _WARM_MIX * v0 if (warm and k > 0 and conv[k - 1]) else v0.astype(np.complex128)
        v = v / np.linalg.norm(v)
        s_old = np.inf
        s = np.inf
        it = 0
        ok = False
        u = v
        singular = bool(np.any(np.diag(S) == 0))
        while it < maxiter and not singular:
            it += 1
            x = scipy.linalg.solve_triangular(S, v, lower=True, trans="C", check_finite=False)
            u = x / np.linalg.norm(x)
            y = scipy.linalg.solve_triangular(S, u, lower=True, check_finite=False)
            ny = np.linalg.norm(y)
            s = 1.0 / ny
            v = y / ny
            if abs(s - s_old) <= tol * s:
                ok = True
                break
            s_old = s
        sig[k] = s
        iters[k] = it
        res1[k] = np.linalg.norm(S @ v - s * u) if resid else 0.0
        res2[k] = np.linalg.norm(S.conj().T @ u - s * v) if resid else 0.0
        conv[k] = ok and bool(np.isfinite(s) and np.isfinite(res1[k]) and np.isfinite(res2[k]))
        if keep:
            U[k] = u
            V[k] = v
    return sig, U, V, iters, res1, res2, conv
