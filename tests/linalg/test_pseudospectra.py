"""Pseudospectra on grids, the pseudospectral radius and abscissa."""

from __future__ import annotations

import numpy as np
import pytest

from depthlens.errors import InputError
from depthlens.linalg import pseudospectral_abscissa, pseudospectral_radius, pseudospectrum
from depthlens.linalg.reference import pseudospectral_radius_bruteforce, sigma_min_dense

from ._make import causal_softmax


def test_grid_matches_dense(rng: np.random.Generator) -> None:
    A = causal_softmax(32, rng, sink=1.0)
    x, y = np.linspace(-1.5, 1.5, 7), np.linspace(-1.5, 1.5, 5)
    r = pseudospectrum(A, x, y)
    Z = x[None, :] + 1j * y[:, None]
    np.testing.assert_allclose(r.sigma, sigma_min_dense(A, Z), rtol=1e-10, atol=1e-14)
    assert r.sigma.shape == (5, 7) and r.method == "triangular-lower"
    G = rng.standard_normal((10, 10))
    g = pseudospectrum(G, x, y, engine="numpy")
    np.testing.assert_allclose(g.sigma, sigma_min_dense(G, Z), rtol=1e-10)
    assert g.method == "schur"


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 1e-1])
def test_normal_matrix_closed_form(eps: float, rng: np.random.Generator) -> None:
    lam = np.array([0.7, -0.3 + 0.5j, 0.2 - 0.6j, 0.1])
    Q, _ = np.linalg.qr(rng.standard_normal((4, 4)) + 1j * rng.standard_normal((4, 4)))
    N = Q @ np.diag(lam) @ Q.conj().T
    assert pseudospectral_radius(N, eps).value == pytest.approx(0.7 + eps, abs=1e-12)
    assert pseudospectral_abscissa(N, eps).value == pytest.approx(0.7 + eps, abs=1e-12)


@pytest.mark.parametrize("eps", [1e-2, 1e-1])
def test_radius_against_bruteforce(eps: float, rng: np.random.Generator) -> None:
    J = np.diag(np.full(5, 0.4)) + np.diag(np.ones(4), -1)
    B = causal_softmax(6, rng, sink=1.0)
    B[:, 0] -= 1.0
    for M in (J, B):
        fast = pseudospectral_radius(M, eps)
        slow = pseudospectral_radius_bruteforce(M, eps, n_r=120, n_theta=72)
        assert fast.value >= slow - 1e-9
        assert fast.value == pytest.approx(slow, rel=2e-3)
        assert abs(sigma_min_dense(M, fast.z) - eps) < 1e-9 * max(1.0, eps)


def test_bad_input() -> None:
    with pytest.raises(InputError):
        pseudospectrum(np.eye(2), [], [0.0])
    with pytest.raises(InputError):
        pseudospectral_radius(np.eye(2), -1.0)
    with pytest.raises(InputError):
        pseudospectral_abscissa(np.ones((2, 3)), 0.1)
