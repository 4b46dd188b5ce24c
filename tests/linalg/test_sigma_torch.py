"""The torch σ_min engine (batched triangular solves) on the CPU: the dense SVD reference,
the compiled CPU path, the fallback and the pseudospectrum wiring. The same code runs on a
GPU in ``benchmarks/device_check.py``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from depthlens.errors import InputError
from depthlens.linalg import pseudospectrum, sigma_min
from depthlens.linalg.reference import sigma_min_dense
from depthlens.linalg.sigma_torch import sigma_min_torch

from ._make import causal_softmax

POINTS = np.array([0.3 + 0.1j, -0.5j, 1.0, np.exp(0.7j), -1.0, 1.5, 2.0 - 1.0j, -3.0 + 0.5j])


def deflate(A: np.ndarray) -> np.ndarray:
    B = A.copy()
    B[:, 0] -= 1.0
    return B


@pytest.mark.parametrize("n", [8, 64, 256])
def test_deflated_attention_matches_dense_svd(n: int, rng: np.random.Generator) -> None:
    B = deflate(causal_softmax(n, rng, sink=1.0, prev=1.0))
    r = sigma_min_torch(B, POINTS, device="cpu")
    assert r.method == "triangular-lower" and r.engine == "torch" and r.sigma.dtype == np.float64
    np.testing.assert_allclose(r.sigma, sigma_min_dense(B, POINTS), rtol=1e-10)
    assert r.converged[:4].all()


@pytest.mark.parametrize("kind", ["upper", "general-real", "general-complex"])
def test_other_forms_match_dense_svd(kind: str, rng: np.random.Generator) -> None:
    n = 24
    X = rng.standard_normal((n, n)) / np.sqrt(n)
    M = {"upper": np.triu(X), "general-real": X, "general-complex": X + 1j * rng.standard_normal((n, n)) / np.sqrt(n)}[kind]
    r = sigma_min_torch(M, POINTS)
    assert r.method == ("triangular-upper" if kind == "upper" else "schur")
    np.testing.assert_allclose(r.sigma, sigma_min_dense(M, POINTS), rtol=1e-10)
    np.testing.assert_allclose(r.sigma, sigma_min(M, POINTS).sigma, rtol=1e-10)


def test_grid_agrees_with_the_cpu_engine(rng: np.random.Generator) -> None:
    """A pseudospectrum grid of a head: the torch engine against the compiled default (both
    stop at a relative change of 1e-14, so they agree far below the 1e-10 test tolerance),
    and each value is an upper estimate of the dense σ_min up to rounding."""
    B = deflate(causal_softmax(48, rng, sink=2.0, prev=1.0))
    x = np.linspace(-1.2, 1.2, 13)
    a = pseudospectrum(B, x, x, engine="torch", device="cpu")
    b = pseudospectrum(B, x, x)
    assert a.sigma.shape == (13, 13) and a.method == b.method
    np.testing.assert_allclose(a.sigma, b.sigma, rtol=1e-10)
    z = x[None, :] + 1j * x[:, None]
    dense = sigma_min_dense(B, z)
    # both are backward stable: each σ_min is exact to about n·ε·‖zI − B‖ in absolute terms, which
    # dominates a relative 1e-12 near an eigenvalue (σ_min ≈ 1e-7 at one grid point here)
    rounding = B.shape[0] * np.finfo(float).eps * (np.abs(z) + np.linalg.norm(B, 2))
    assert np.all(a.sigma >= dense * (1 - 1e-12) - rounding)


def test_eigenvalue_points_and_fallback(rng: np.random.Generator) -> None:
    """A point equal to an eigenvalue gives 0 through the dense fallback, never NaN; points
    that do not converge within ``maxiter`` get the dense value and are flagged."""
    A = causal_softmax(16, rng)
    r = sigma_min_torch(A, [1.0, 0.3 + 0.2j])
    assert np.all(np.isfinite(r.sigma)) and r.sigma[0] < 1e-12 and not r.converged[0] and r.converged[1]
    s = sigma_min_torch(A, POINTS[:4], maxiter=1, tol=1e-15)
    assert s.n_fallback == 4
    np.testing.assert_allclose(s.sigma, sigma_min_dense(A, POINTS[:4]), rtol=1e-13)


@pytest.mark.parametrize("gap", [0.0, 1e-6, 1e-3])
def test_near_degenerate_pair(gap: float, rng: np.random.Generator) -> None:
    """σ_min and σ_2 (nearly) equal at z: the value is never below σ_min and above it by at
    most 1e-10 relative (as the CPU engine, ``tests/linalg/test_sigma.py``)."""
    n, z = 30, 0.3 - 0.2j
    ang = rng.uniform(0, 2 * np.pi, 2)
    lam = np.concatenate([z + 0.25 * np.exp(1j * ang[:1]), z + 0.25 * (1 + gap) * np.exp(1j * ang[1:]),
                          z + rng.uniform(0.5, 1.0, n - 2) * np.exp(2j * np.pi * rng.uniform(size=n - 2))])
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    M = Q @ np.diag(lam) @ Q.conj().T
    r = sigma_min_torch(M, z)
    ref = scipy.linalg.svdvals(z * np.eye(n) - M)[-1]
    assert ref * (1 - 1e-13) <= float(r.sigma) <= ref * (1 + 1e-10)


def test_shapes_residuals_and_batches(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any shape of points; points split over several batches give the same values."""
    import depthlens.linalg.sigma_torch as st

    A = deflate(causal_softmax(6, rng))
    z = np.linspace(-1, 1, 6).reshape(2, 3) + 0.4j
    r = sigma_min_torch(A, z)
    assert r.sigma.shape == r.residual.shape == r.iterations.shape == (2, 3) and r.u is None
    assert np.all(r.residual < 1e-6)  # the vectors converge to about √tol (as sigma_min's)
    assert sigma_min_torch(A, 2.0).sigma.shape == ()
    monkeypatch.setattr(st, "_BATCH_ENTRIES", 2 * 36)  # two points per batch
    np.testing.assert_array_equal(sigma_min_torch(A, z).sigma, r.sigma)


@pytest.mark.parametrize(
    "call",
    [
        lambda: sigma_min_torch(np.ones((2, 3)), 1.0),
        lambda: sigma_min_torch(np.eye(2), np.nan),
        lambda: sigma_min_torch(np.eye(2), 1.0, tol=0.0),
        lambda: sigma_min_torch(np.eye(2), 1.0, maxiter=0),
        lambda: sigma_min_torch(np.eye(2), 1.0, device="no-such-device"),
        lambda: pseudospectrum(np.eye(2), [0.0], [0.0], device="cuda"),
    ],
)
def test_bad_input(call) -> None:
    with pytest.raises(InputError):
        call()
