"""Slow brute-force references for tests and benchmarks (dense SVD at every point).

Nothing here is meant for production use: each ``σ_min`` costs a full dense SVD, ``O(n³)``,
and the searches use fixed fine grids. They share no code with the fast paths on purpose.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize

from ._checks import as_square
from . import guarded
from .sigma import check_points

__all__ = ["kreiss_bruteforce", "pseudospectral_radius_bruteforce", "sigma_min_dense", "whole_grid_sup"]


def sigma_min_dense(M: object, z: object) -> np.ndarray:
    """``σ_min(zI − M)`` by LAPACK's dense SVD at every point (slow reference, ``O(n³)`` each).

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix or ``z`` holds a non-finite value.
    """
    A = as_square(M)
    zz = check_points(z)
    eye = np.eye(A.shape[0])
    out = np.array([guarded.svdvals(complex(w) * eye - A)[-1] for w in zz.reshape(-1)])
    return out.reshape(zz.shape)


def kreiss_bruteforce(M: object, *, n_t: int = 60, n_theta: int = 60, polish: bool = True) -> tuple[float, complex]:
    """Kreiss constant by dense SVD on a fine ``(log(|z|−1), arg z)`` grid, then Nelder–Mead.

    Slow reference (``n_t·n_theta`` dense SVDs plus the polish): the grid covers
    ``1e-4 ≤ |z|−1 ≤ 2‖M‖_F + 1`` and all angles; Nelder–Mead starts from the three best grid
    points. Returns ``(value, argmax)``; a lower bound like any search.

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix.
    """
    A = as_square(M)
    eye = np.eye(A.shape[0])
    N = float(np.linalg.norm(A))

    def f(x: np.ndarray) -> float:
        z = (1.0 + math.exp(x[0])) * complex(math.cos(x[1]), math.sin(x[1]))
        s = guarded.svdvals(z * eye - A)[-1]
        return math.exp(x[0]) / s if s > 0 else math.inf

    ts = np.linspace(math.log(1e-4), math.log(2 * N + 1), n_t)
    ths = np.linspace(-math.pi, math.pi, n_theta, endpoint=False)
    F = np.array([[f(np.array([t, th])) for th in ths] for t in ts])
    best = float(F.max())
    arg = np.unravel_index(np.argmax(F), F.shape)
    z_best = (1 + math.exp(ts[arg[0]])) * complex(math.cos(ths[arg[1]]), math.sin(ths[arg[1]]))
    if polish:
        for flat in np.argsort(-F.ravel())[:3]:
            i, j = np.unravel_index(flat, F.shape)
            res = scipy.optimize.minimize(
                lambda x: -f(x), np.array([ts[i], ths[j]]), method="Nelder-Mead",
                options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 2000},
            )
            if -res.fun > best:
                best = float(-res.fun)
                z_best = (1 + math.exp(res.x[0])) * complex(math.cos(res.x[1]), math.sin(res.x[1]))
    return best, z_best


def pseudospectral_radius_bruteforce(M: object, eps: float, *, n_r: int = 400, n_theta: int = 360) -> float:
    """``ρ_ε(M) = max{|z| : σ_min(zI−M) ≤ ε}`` by dense SVD on a polar grid, then bisection.

    Slow reference: on each of ``n_theta`` rays the outermost grid radius (of ``n_r`` in
    ``[0, ‖M‖_F + ε]``) with ``σ_min ≤ ε`` is refined by bisection against the next grid radius.

    Raises
    ------
    InputError
        If ``M`` is not a finite square matrix.
    """
    A = as_square(M)
    eye = np.eye(A.shape[0])
    R = float(np.linalg.norm(A)) + eps
    rs = np.linspace(0.0, R, n_r)

    def s(z: complex) -> float:
        return float(guarded.svdvals(z * eye - A)[-1])

    best = 0.0
    for th in np.linspace(-math.pi, math.pi, n_theta, endpoint=False):
        d = complex(math.cos(th), math.sin(th))
        inside = [k for k in range(n_r) if s(rs[k] * d) <= eps]
        if not inside:
            continue
        k = inside[-1]
        lo, hi = rs[k], rs[min(k + 1, n_r - 1)]
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if s(mid * d) <= eps else (lo, mid)
        best = max(best, lo)
    return best


def whole_grid_sup(fn: object, rtol_r: float) -> tuple[float, float]:
    """The bisected-grid supremum of a power-bound function ``fn`` (a
    :class:`~depthlens.linalg.kreiss_bound._BoundFunction`) evaluated the plain way: its series
    on the whole grid, for the point values and the interval bounds separately, every pass
    (the method the bound used before it reused its series values). Returns the supremum
    bound and the grid point of the largest value."""
    edges = 1.0 + np.logspace(-10, 8, 361)
    while True:
        U = (edges[1:] - 1.0) * fn.H(edges[:-1]) + fn.circle(edges[:-1])  # type: ignore[attr-defined]
        g = (edges - 1.0) * fn.H(edges) + fn.circle(edges)  # type: ignore[attr-defined]
        split = U > g.max() * (1.0 + rtol_r)
        if not split.any() or edges.size > 20_000:
            break
        lo, hi = edges[:-1][split] - 1.0, edges[1:][split] - 1.0
        edges = np.sort(np.concatenate([edges, 1.0 + np.sqrt(lo * hi)]))
    best = max(float(U.max()), fn.ends(float(edges[0]), float(edges[-1])))  # type: ignore[attr-defined]
    return best, float(edges[int(np.argmax(g))])
