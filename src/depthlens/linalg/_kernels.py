"""Compiled kernels: the smallest singular value of a shifted lower-triangular matrix, Horner
evaluation of a long real series at many points (:func:`horner`), and the sign proposal of
:func:`~depthlens.linalg.kreiss_search.signature_nonnegative` (:func:`signature_proposal`).

The main numerical job here: for a lower-triangular ``L`` (float64 or complex128) and complex
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
always (``σ = 1/‖S⁻¹u‖`` with ``‖u‖ = 1``).

Rayleigh–Ritz on two successive iterates (from the second step of each point on): the
previous and the current ``y`` (with ``S y = x`` known for both, no extra solve) span a
2-D subspace; its Ritz pair for ``σ_min`` (a 2×2 Hermitian eigenproblem on the Gram matrix of
``S·basis``) replaces the plain update when the previous ``y`` is not within ``1e-6`` of
the current direction. Then ``v`` is the unit Ritz vector, ``u = S v/‖S v‖`` and
``σ = ‖S v‖ ≥ σ_min(S)`` (a Rayleigh quotient), so the one-sided bound and ``S v = σ u``
still hold; the subspace contains the plain iterate, so a step is never worse than the
plain one; on the n = 256 benchmark grid it cut the total steps by 40% (median 12 → 8, no
dense fallbacks left).
It costs ``O(n)`` per step against ``O(n²)`` for the solves. Pairs split by less than what
a relative-change stop can resolve (``σ_2/σ_min − 1`` of order ``tol`` per step) are not
separated by it: there the value lies between ``σ_min`` and ``σ_2``. The iteration stops when the relative change of
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
``L`` (an eigenvalue) is not iterated and is reported as not converged, and so is a point
whose iterate overflows (``σ_min`` below about ``1e-300·‖u‖``, next to a strongly non-normal
cluster of eigenvalues: a previous-token head's ``B`` near 0).

Real problems: where ``L``, the shift and the start vector are all real, every iterate is real
(the singular vectors of a real matrix can be taken real), and the numba kernel runs that
point in real arithmetic: half the flops of the complex loops, about 20% less time per step
at n = 128 (the two independent sums of the complex loops overlap, so those take less than
twice as long); the vectors come back as complex128 with zero imaginary parts.
:meth:`~depthlens.linalg.sigma.TriangularForm.evaluate` passes a real ``v0`` when ``L`` and
every shift are real.

Floating point: the triangular solves run with ``fastmath`` flags ``reassoc``, ``contract`` and
``nsz`` only (sums may be reordered and fused into FMAs; no approximate division, no
assumptions about NaN or infinities), which changes only the rounding of the iterates. The
certified Kreiss bounds (:mod:`depthlens.linalg.kreiss_search`) use ``σ``, ``u`` and ``v``
only through the explicitly computed residuals, so they hold for whatever iterates come out;
the residual kernel itself runs without ``fastmath``, so the standard mat-vec error bound
``γ_{n+2}(|z| + ‖|L|‖)`` that their margins cover applies to it literally.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from numba import njit

__all__ = ["ENGINES", "horner", "sigma_min_batch", "sigma_min_batch_numpy", "signature_proposal"]

ENGINES = ("numba", "numpy")
_WARM_MIX = 1e-2
_FM = {"reassoc", "contract", "nsz"}


@njit(cache=True, fastmath=_FM)
def _solve(Lr, Li, cplx, im, zr, zi, br, bi, xr, xi):  # pragma: no cover - compiled
    """Solve ``(zI − L) x = b`` for lower-triangular ``L = Lr + i·Li`` (dot-product rows);
    with ``im`` False (real ``L``, ``z`` and ``b``) in real arithmetic, ``xi`` set to zero."""
    n = Lr.shape[0]
    if not im:
        for i in range(n):
            sr = br[i]
            for j in range(i):
                sr += Lr[i, j] * xr[j]
            xr[i] = sr / (zr - Lr[i, i])
            xi[i] = 0.0
        return
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
def _solve_h(Lr, Li, cplx, im, zr, zi, br, bi, xr, xi):  # pragma: no cover - compiled
    """Solve ``(zI − L)ᴴ x = b``: back substitution, one axpy per row of ``L`` (real
    arithmetic with ``im`` False, as :func:`_solve`)."""
    n = Lr.shape[0]
    for i in range(n):
        xr[i] = br[i]
        xi[i] = bi[i] if im else 0.0
    if not im:
        for j in range(n - 1, -1, -1):
            a = xr[j] / (zr - Lr[j, j])
            xr[j] = a
            for i in range(j):
                xr[i] += Lr[j, i] * a
        return
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


@njit(cache=True)
def _residuals(Lr, Li, cplx, im, zr, zi, sig, ur, ui, vr, vi, wr, wi):  # pragma: no cover - compiled
    """Return ``(‖(zI−L)v − σu‖, ‖(zI−L)ᴴu − σv‖)`` by explicit triangular mat-vecs, in strict
    IEEE order (no ``fastmath``): the certified bounds rest on these residuals. With ``im``
    False (real ``L``, ``z``, ``u``, ``v``) the imaginary parts, all exactly zero, are skipped."""
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
            if im:
                for j in range(i + 1):
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
            if im:
                for i in range(j + 1):
                    wi[i] -= Lr[j, i] * b
    r2 = 0.0
    for i in range(n):
        r2 += wr[i] * wr[i] + wi[i] * wi[i]
    return np.sqrt(r1), np.sqrt(r2)


@njit(cache=True)
def _normalize(xr, xi):  # pragma: no cover - compiled
    """Scale ``x`` to unit 2-norm in place and return the old norm; a norm that is 0 or not
    finite (an overflowed iterate) is returned with ``x`` left as it is, for the caller to stop."""
    s = 0.0
    for i in range(xr.shape[0]):
        s += xr[i] * xr[i] + xi[i] * xi[i]
    nrm = np.sqrt(s)
    if not (nrm > 0.0 and nrm < np.inf):
        return nrm
    for i in range(xr.shape[0]):
        xr[i] /= nrm
        xi[i] /= nrm
    return nrm


@njit(cache=True)
def _finite_norm(nrm):  # pragma: no cover - compiled
    """Whether a norm returned by :func:`_normalize` is positive and finite (its vector was scaled)."""
    return nrm > 0.0 and nrm < np.inf


_RR_GUARD = 1e-6


@njit(cache=True)
def _rr2(yr, yi, xr, xi, ypr, ypi, xpr, xpi, vr, vi, ur, ui):  # pragma: no cover - compiled
    """Rayleigh–Ritz for ``σ_min`` on ``span{y_prev, y}`` given ``S y = x``, ``S y_prev = x_prev``.

    Writes the Ritz pair to ``v`` (unit) and ``u`` (unit, ``S v = σ u``) and returns ``σ``, or
    returns ``-1`` (nothing written) when ``y_prev`` is within ``_RR_GUARD`` of ``span{y}``.
    """
    n = yr.shape[0]
    ny = 0.0
    nyp = 0.0
    for i in range(n):
        ny += yr[i] * yr[i] + yi[i] * yi[i]
        nyp += ypr[i] * ypr[i] + ypi[i] * ypi[i]
    ny = np.sqrt(ny)
    nyp = np.sqrt(nyp)
    ar = 0.0
    ai = 0.0
    for i in range(n):  # alpha = ŷᴴ y_prev
        ar += (yr[i] * ypr[i] + yi[i] * ypi[i]) / ny
        ai += (yr[i] * ypi[i] - yi[i] * ypr[i]) / ny
    nw = 0.0
    for i in range(n):  # w = y_prev − alpha ŷ (kept in y_prev), x_w = x_prev − alpha x / ‖y‖
        ypr[i] -= (ar * yr[i] - ai * yi[i]) / ny
        ypi[i] -= (ar * yi[i] + ai * yr[i]) / ny
        xpr[i] -= (ar * xr[i] - ai * xi[i]) / ny
        xpi[i] -= (ar * xi[i] + ai * xr[i]) / ny
        nw += ypr[i] * ypr[i] + ypi[i] * ypi[i]
    nw = np.sqrt(nw)
    if not nw > _RR_GUARD * nyp:
        return -1.0
    a = 0.0
    d = 0.0
    br = 0.0
    bi = 0.0
    for i in range(n):  # Gram matrix of [x/‖y‖, x_w/‖w‖]
        p_r = xr[i] / ny
        p_i = xi[i] / ny
        q_r = xpr[i] / nw
        q_i = xpi[i] / nw
        a += p_r * p_r + p_i * p_i
        d += q_r * q_r + q_i * q_i
        br += p_r * q_r + p_i * q_i
        bi += p_r * q_i - p_i * q_r
    b2 = br * br + bi * bi
    h = 0.5 * (a - d)
    lmax = 0.5 * (a + d) + np.sqrt(h * h + b2)
    mu = (a * d - b2) / lmax if lmax > 0.0 else 0.0
    # eigenvector: [b, μ − a] or [μ − d, conj b], whichever is larger
    c0r, c0i, c1r, c1i = br, bi, mu - a, 0.0
    if (mu - d) * (mu - d) + b2 > c0r * c0r + c0i * c0i + c1r * c1r:
        c0r, c0i, c1r, c1i = mu - d, 0.0, br, -bi
    nc = np.sqrt(c0r * c0r + c0i * c0i + c1r * c1r + c1i * c1i)
    if not nc > 0.0:
        c0r, c0i, c1r, c1i, nc = (1.0, 0.0, 0.0, 0.0, 1.0) if a <= d else (0.0, 0.0, 1.0, 0.0, 1.0)
    c0r /= nc
    c0i /= nc
    c1r /= nc
    c1i /= nc
    for i in range(n):
        p_r = yr[i] / ny
        p_i = yi[i] / ny
        q_r = ypr[i] / nw
        q_i = ypi[i] / nw
        vr[i] = c0r * p_r - c0i * p_i + c1r * q_r - c1i * q_i
        vi[i] = c0r * p_i + c0i * p_r + c1r * q_i + c1i * q_r
        p_r = xr[i] / ny
        p_i = xi[i] / ny
        q_r = xpr[i] / nw
        q_i = xpi[i] / nw
        ur[i] = c0r * p_r - c0i * p_i + c1r * q_r - c1i * q_i
        ui[i] = c0r * p_i + c0i * p_r + c1r * q_i + c1i * q_r
    _normalize(vr, vi)
    return _normalize(ur, ui)


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
    ypr = np.empty(n)
    ypi = np.empty(n)
    xpr = np.empty(n)
    xpi = np.empty(n)
    tr = np.empty(n)
    ti = np.empty(n)
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
        # real L, real shift and real start: every iterate stays real (real arithmetic)
        im = cplx or zi != 0.0
        for i in range(n):
            if vi[i] != 0.0:
                im = True
        s_old = np.inf
        s = np.inf
        it = 0
        ok = False
        singular = False
        for i in range(n):
            if Lr[i, i] == zr and (Li[i, i] if cplx else 0.0) == zi:
                singular = True  # z is an eigenvalue: leave it to the dense fallback
        have_prev = False
        while it < maxiter and not singular:
            it += 1
            _solve_h(Lr, Li, cplx, im, zr, zi, vr, vi, xr, xi)
            if not _finite_norm(_normalize(xr, xi)):
                break  # the solve overflowed (σ_min far below rounding): the dense fallback takes it
            _solve(Lr, Li, cplx, im, zr, zi, xr, xi, yr, yi)
            s = -1.0
            if have_prev:
                s = _rr2(yr, yi, xr, xi, ypr, ypi, xpr, xpi, vr, vi, tr, ti)
            for i in range(n):
                ypr[i] = yr[i]
                ypi[i] = yi[i]
                xpr[i] = xr[i]
                xpi[i] = xi[i]
            have_prev = True
            if s > 0.0:
                for i in range(n):
                    xr[i] = tr[i]
                    xi[i] = ti[i]
            else:
                ny = _normalize(yr, yi)
                if not _finite_norm(ny):
                    break  # as above: not converged
                s = 1.0 / ny
                for i in range(n):
                    vr[i] = yr[i]
                    vi[i] = yi[i]
            if abs(s - s_old) <= tol * s:
                ok = True
                break
            s_old = s
        # (xr, xi) is the left vector u, (vr, vi) the right vector v, (zI − L) v ≈ s u.
        r1, r2 = _residuals(Lr, Li, cplx, im, zr, zi, s, xr, xi, vr, vi, wr, wi) if resid else (0.0, 0.0)
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
        prev: tuple[np.ndarray, np.ndarray] | None = None
        while it < maxiter and not singular:
            it += 1
            x = scipy.linalg.solve_triangular(S, v, lower=True, trans="C", check_finite=False)
            u = x / np.linalg.norm(x)
            y = scipy.linalg.solve_triangular(S, u, lower=True, check_finite=False)
            ny = np.linalg.norm(y)
            rr = _rr2_numpy(y, u, prev[0], prev[1]) if prev is not None else None
            prev = (y, u)
            if rr is not None:
                s, v, u = rr
            else:
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


def _rr2_numpy(
    y: np.ndarray, x: np.ndarray, yp: np.ndarray, xp: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray] | None:
    """:func:`_rr2` in numpy: Ritz pair ``(σ, v, u)`` on ``span{y_prev, y}``, or None."""
    ny = np.linalg.norm(y)
    yh = y / ny
    alpha = np.vdot(yh, yp)
    w = yp - alpha * yh
    xw = xp - alpha * x / ny
    nw = np.linalg.norm(w)
    if not nw > _RR_GUARD * np.linalg.norm(yp):
        return None
    P, Q = x / ny, xw / nw
    a, d, b = float(np.vdot(P, P).real), float(np.vdot(Q, Q).real), complex(np.vdot(P, Q))
    b2 = abs(b) ** 2
    h = 0.5 * (a - d)
    lmax = 0.5 * (a + d) + np.sqrt(h * h + b2)
    mu = (a * d - b2) / lmax if lmax > 0.0 else 0.0
    c = np.array([b, mu - a], dtype=complex)
    if (mu - d) ** 2 + b2 > abs(c[0]) ** 2 + abs(c[1]) ** 2:
        c = np.array([mu - d, np.conj(b)], dtype=complex)
    nc = np.linalg.norm(c)
    if not nc > 0.0:
        c, nc = (np.array([1.0, 0.0], dtype=complex) if a <= d else np.array([0.0, 1.0], dtype=complex)), 1.0
    c = c / nc
    v = c[0] * yh + c[1] * (w / nw)
    t = c[0] * P + c[1] * Q
    v = v / np.linalg.norm(v)
    s = float(np.linalg.norm(t))
    return s, v, t / s


@njit(cache=True)
def horner(coef: np.ndarray, x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """``Σ_j coef[j]·x^j`` at every point of ``x`` by Horner's rule (compiled; ``np.polyval``
    loops over the coefficients in Python, which dominated long power-norm series)."""
    out = np.zeros(x.shape[0])
    for i in range(x.shape[0]):
        acc = 0.0
        xi = x[i]
        for j in range(coef.shape[0] - 1, -1, -1):
            acc = acc * xi + coef[j]
        out[i] = acc
    return out


@njit(cache=True)
def signature_proposal(M: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Signs ``d_j = ±1`` from a breadth-first 2-colouring of the graph of nonzero entries of a
    real square ``M``: ``d_j = d_i·sign(M_ij)`` (``sign(M_ji)`` where ``M_ij = 0``) along the
    edge that first reaches ``j``, each connected component rooted at its first index with
    ``d = 1``. ``O(n²)``. A proposal only: whether ``DMD ≥ 0`` holds is for the caller to check
    on every entry (a valid ``D``, where one exists, is this one up to a sign per component)."""
    n = M.shape[0]
    d = np.zeros(n)
    queue = np.empty(n, dtype=np.int64)
    for root in range(n):
        if d[root] != 0.0:
            continue
        d[root] = 1.0
        queue[0] = root
        head = 0
        tail = 1
        while head < tail:
            i = queue[head]
            head += 1
            for j in range(n):
                if d[j] == 0.0:
                    m = M[i, j] if M[i, j] != 0.0 else M[j, i]
                    if m != 0.0:
                        d[j] = d[i] if m > 0.0 else -d[i]
                        queue[tail] = j
                        tail += 1
    return d
