"""σ_min(zI − M): triangular fast path, Schur path, engines, vectors and gradient."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from depthlens.errors import InputError
from depthlens.linalg import sigma_min, triangular_form

from ._make import causal_softmax

POINTS = np.array([0.3 + 0.1j, -0.5j, 1.0, np.exp(0.7j), -1.0, 1.5, 2.0 - 1.0j, -3.0 + 0.5j])


def deflate(A: np.ndarray) -> np.ndarray:
    B = A.copy()
    B[:, 0] -= 1.0
    return B


def dense(M: np.ndarray, z: np.ndarray) -> np.ndarray:
    eye = np.eye(M.shape[0])
    return np.array([scipy.linalg.svdvals(w * eye - M)[-1] for w in z])


@pytest.mark.parametrize("n", [8, 64, 256])
@pytest.mark.parametrize("deflated", [False, True])
def test_triangular_matches_svdvals(n: int, deflated: bool, rng: np.random.Generator) -> None:
    A = causal_softmax(n, rng, sink=1.0, prev=1.0)
    M = deflate(A) if deflated else A
    z = POINTS[np.abs(POINTS - 1.0) > 1e-12] if not deflated else POINTS  # z = 1 is an eigenvalue of A
    r = sigma_min(M, z)
    assert r.method == "triangular-lower"
    np.testing.assert_allclose(r.sigma, dense(M, z), rtol=1e-10)
    assert r.converged[:4].all()  # far points with σ_min ≈ σ_2 may take the dense fallback


def test_eigenvalue_point_gives_zero_not_nan(rng: np.random.Generator) -> None:
    A = causal_softmax(16, rng)
    r = sigma_min(A, 1.0)
    assert np.isfinite(r.sigma) and r.sigma < 1e-12


@pytest.mark.parametrize("kind", ["upper", "general-real", "general-complex"])
def test_other_forms_match_svdvals(kind: str, rng: np.random.Generator) -> None:
    n = 24
    X = rng.standard_normal((n, n)) / np.sqrt(n)
    M = {"upper": np.triu(X), "general-real": X, "general-complex": X + 1j * rng.standard_normal((n, n)) / np.sqrt(n)}[kind]
    r = sigma_min(M, POINTS)
    assert r.method == ("triangular-upper" if kind == "upper" else "schur")
    np.testing.assert_allclose(r.sigma, dense(M, POINTS), rtol=1e-10)


@pytest.mark.parametrize("kind", ["lower", "upper", "general"])
def test_vectors_and_gradient(kind: str, rng: np.random.Generator) -> None:
    n = 20
    X = rng.standard_normal((n, n)) / np.sqrt(n)
    M = {"lower": deflate(causal_softmax(n, rng, sink=2.0)), "upper": np.triu(X), "general": X}[kind]
    z = np.array([1.3 + 0.2j, -0.4 + 1.1j])
    r = sigma_min(M, z, vectors=True)
    assert r.u is not None and r.v is not None and r.gradient is not None
    for k, w in enumerate(z):
        S = w * np.eye(n) - M
        r1 = np.linalg.norm(S @ r.v[k] - r.sigma[k] * r.u[k])
        r2 = np.linalg.norm(S.conj().T @ r.u[k] - r.sigma[k] * r.v[k])
        assert max(r1, r2) < 1e-6 and abs(np.hypot(r1, r2) - r.residual[k]) < 1e-12
        h = 1e-6
        for d in (h, 1j * h):
            fd = (sigma_min(M, w + d).sigma - sigma_min(M, w - d).sigma) / (2 * h)
            assert abs(fd - np.real(np.conj(d / h) * r.gradient[k])) < 1e-6


@pytest.mark.parametrize("M_kind", ["real", "complex"])
def test_engines_agree(M_kind: str, rng: np.random.Generator) -> None:
    n = 32
    M = deflate(causal_softmax(n, rng, prev=2.0))
    if M_kind == "complex":
        M = rng.standard_normal((n, n)) / np.sqrt(n) + 1j * rng.standard_normal((n, n)) / np.sqrt(n)
    a = sigma_min(M, POINTS, vectors=True, engine="numba")
    b = sigma_min(M, POINTS, vectors=True, engine="numpy")
    np.testing.assert_allclose(a.sigma, b.sigma, rtol=1e-12)
    # Same algorithm step for step; the stopping test (relative change ≤ tol) can flip by one
    # step between the engines where a change lands within rounding of tol (fastmath
    # reassociation in the compiled solves, Rayleigh–Ritz steps).
    assert np.all(np.abs(a.iterations - b.iterations) <= 1)
    assert a.gradient is not None and b.gradient is not None
    np.testing.assert_allclose(a.gradient, b.gradient, rtol=0, atol=1e-6)  # vectors converge to ~√tol


def test_nonconvergence_falls_back_to_svd(rng: np.random.Generator) -> None:
    M = np.diag([0.5, -0.5]) + 0.0
    r = sigma_min(M, 0.0, maxiter=1)
    assert r.n_fallback == 1 and abs(float(r.sigma) - 0.5) < 1e-15


def test_values_only_fallback_is_one_batched_svd(rng: np.random.Generator) -> None:
    """Without vectors or residuals the non-converged points get plain singular values."""
    A = causal_softmax(12, rng)
    z = np.array([0.3 + 0.2j, -0.7, 1.4j, 0.05])
    ev = triangular_form(A).evaluate(z, maxiter=1, tol=1e-15, residuals=False)
    assert (~ev.converged).any()
    ref = [np.linalg.svd(w * np.eye(12) - A, compute_uv=False)[-1] for w in z]
    np.testing.assert_allclose(ev.sigma[~ev.converged], np.asarray(ref)[~ev.converged], rtol=1e-13)


def test_shapes_and_scalar(rng: np.random.Generator) -> None:
    A = causal_softmax(6, rng)
    r = sigma_min(A, np.full((2, 3), 0.2 + 0.3j), vectors=True)
    assert r.sigma.shape == (2, 3) and r.u is not None and r.u.shape == (2, 3, 6)
    assert sigma_min(A, 2.0).sigma.shape == ()
    assert triangular_form(A).kind == "lower"


@pytest.mark.parametrize(
    "M, z, kw",
    [
        (np.ones((2, 3)), 1.0, {}),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), 1.0, {}),
        (np.eye(2), np.nan, {}),
        (np.eye(2), 1.0, {"engine": "torch"}),
        (np.eye(2), 1.0, {"tol": 0.0}),
        (np.eye(2), 1.0, {"maxiter": 0}),
    ],
)
def test_bad_input(M: np.ndarray, z: object, kw: dict) -> None:
    with pytest.raises(InputError):
        sigma_min(M, z, **kw)


def _normal_with_pair(n: int, z: complex, r: float, rng: np.random.Generator, gap: float) -> np.ndarray:
    """A normal matrix whose two eigenvalues nearest ``z`` are at distance ``r`` and ``r(1+gap)``."""
    ang = rng.uniform(0, 2 * np.pi, 2)
    lam = np.concatenate([z + r * np.exp(1j * ang[:1]), z + r * (1 + gap) * np.exp(1j * ang[1:]), z + rng.uniform(2 * r, 4 * r, n - 2) * np.exp(2j * np.pi * rng.uniform(size=n - 2))])
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    return Q @ np.diag(lam) @ Q.conj().T


@pytest.mark.parametrize("gap", [0.0, 1e-9, 1e-6, 1e-3])
@pytest.mark.parametrize("engine", ["numba", "numpy"])
def test_near_degenerate_sigma_min_matches_svdvals(gap: float, engine: str, rng: np.random.Generator) -> None:
    # Two eigenvalues of a normal matrix (nearly) equidistant from z: σ_min and σ_2 equal or
    # nearly equal. At z itself (relative gap 0 … 1e-3) σ_min must match svdvals to 1e-10.
    # At the shifted points the pair splits by ~1e-9…1e-6 relative and the points are visited
    # with warm starts: the value is never below σ_min, and above it by at most 1e-10 relative
    # or (when σ_2 − σ_min is below what a relative-change stop can resolve) by σ_2 − σ_min.
    z = np.array([0.3 - 0.2j, 0.3 - 0.2j + 1e-7, 0.3 - 0.2j + 1e-7j, 0.3 - 0.2j + 1e-4j])
    M = _normal_with_pair(30, complex(z[0]), 0.25, rng, gap)
    r = sigma_min(M, z, engine=engine)
    sv = np.array([scipy.linalg.svdvals(w * np.eye(30) - M)[-2:][::-1] for w in z])  # (σ_min, σ_2)
    assert abs(r.sigma[0] - sv[0, 0]) <= 1e-10 * sv[0, 0]
    assert np.all(r.sigma >= sv[:, 0] * (1 - 1e-13))
    assert np.all(r.sigma - sv[:, 0] <= np.maximum(1e-10 * sv[:, 0], 1.01 * (sv[:, 1] - sv[:, 0])))


def test_near_degenerate_triangular_grid_matches_svdvals(rng: np.random.Generator) -> None:
    # A lower-triangular matrix with two eigenvalues equidistant from every point of a line:
    # the grid walk (warm starts) crosses the set where σ_min and σ_2 swap.
    n = 40
    L = np.tril(rng.standard_normal((n, n)) * 0.02, -1) + np.diag(rng.uniform(-0.2, 0.2, n) + 2.0)
    L[0, 0], L[1, 1] = 0.5, -0.5  # z on the imaginary axis is equidistant from ±0.5
    z = np.linspace(-0.05, 0.05, 11)[None, :] + 1j * np.linspace(-0.4, 0.4, 9)[:, None]
    r = sigma_min(L, z)
    np.testing.assert_allclose(r.sigma, dense(L, z.ravel()).reshape(z.shape), rtol=1e-10)


@pytest.mark.parametrize("n", [7, 64])
def test_real_problems_run_in_real_arithmetic(n: int, rng: np.random.Generator) -> None:
    """A real lower-triangular L at real points gets a real start vector and real iterates: the
    vectors have zero imaginary parts, σ matches the dense SVD and the complex-arithmetic run of
    the same kernel (a complex start vector) to rounding, and so do the residuals."""
    from depthlens.linalg._kernels import sigma_min_batch
    from depthlens.linalg.sigma import _start_vector

    B = deflate(causal_softmax(n, rng, sink=1.0, prev=1.0))
    z = np.array([1.001, 1.4, 2.0, -1.3, 7.5, 40.0], dtype=np.complex128)
    ev = triangular_form(B).evaluate(z, vectors=True)
    assert ev.converged.all() and not ev.UL.imag.any() and not ev.VL.imag.any() and not ev.c.imag.any()
    np.testing.assert_allclose(ev.sigma, dense(B, z), rtol=1e-12)
    assert np.all(ev.res_right <= 1e-13 * (np.abs(z) + np.linalg.norm(B, 2)))
    cplx = sigma_min_batch(B, np.empty((0, 0)), z, _start_vector(n), 1e-14, 200, True, False, True)
    np.testing.assert_allclose(ev.sigma, cplx[0], rtol=1e-12)
    assert np.all(ev.res_left <= 10.0 * cplx[5] + 1e-13)  # the left residual as in complex arithmetic
    mixed = triangular_form(B).evaluate(np.append(z, 1.4 + 0.1j))  # one complex point: complex start for all
    np.testing.assert_allclose(mixed.sigma[:-1], ev.sigma, rtol=1e-12)
