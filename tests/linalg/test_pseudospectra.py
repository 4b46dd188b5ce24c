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


def _deflated_heads(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for sink, prev in ((1.0, 0.0), (1.0, 1.0), (0.0, 2.0), (0.0, 0.0)):
        B = causal_softmax(n, rng, sink=sink, prev=prev)
        B[:, 0] -= 1.0
        out.append(B)
    return out


@pytest.mark.parametrize("eps", [1e-2, 1e-1])
def test_radius_deflated_heads_against_bruteforce(eps: float, rng: np.random.Generator) -> None:
    for B in _deflated_heads(12, rng):
        fast = pseudospectral_radius(B, eps)
        slow = pseudospectral_radius_bruteforce(B, eps, n_r=300, n_theta=40)  # radial step < ε
        assert fast.method == "positive-real-axis-march+brent"  # DBD ≥ 0 with D = diag(−1, 1, …, 1)
        assert fast.value >= slow - 1e-9
        assert fast.value == pytest.approx(slow, rel=1e-3)
        assert abs(sigma_min_dense(B, fast.z) - eps) < 1e-9 * max(1.0, eps)


def test_radius_on_the_axis_equals_the_search_over_every_line(rng: np.random.Generator) -> None:
    """Where the positive real axis attains ρ_ε (a real M with DMD ≥ 0: deflated heads, and a
    dense M = DND with entries of both signs), the one-line march gives the radius that the
    search over every line gives with the axis path disabled (M⁺ = M with a zero-weight complex
    part), to Brent's tolerance, in far fewer evaluations; a real M without such a D (the
    Jordan-like J) keeps the lines."""
    D = np.diag(np.where(np.arange(10) % 3 == 0, -1.0, 1.0))
    dense = D @ (rng.random((10, 10)) * np.tri(10, k=2)) @ D
    for M in (*_deflated_heads(24, rng), dense):
        for eps in (1e-3, 1e-1):
            axis, lines = pseudospectral_radius(M, eps), pseudospectral_radius(M.astype(np.complex128), eps)
            assert axis.method == "positive-real-axis-march+brent" and lines.method != axis.method
            assert axis.value == pytest.approx(lines.value, rel=1e-12, abs=1e-13)
            assert axis.z.imag == 0.0 and axis.n_evals < lines.n_evals / 4
    J = np.diag(np.full(5, 0.4)) + np.diag(np.ones(4), -1) - np.diag(np.ones(3), -2)
    assert pseudospectral_radius(J, 0.1).method == "lines-march-pruned+brent+local-angle"


def test_isolated_outer_eigenvalue_is_not_stepped_over(rng: np.random.Generator) -> None:
    # A strongly non-normal block with eigenvalues near 0.2 and one isolated eigenvalue 0.96:
    # for small ε its component of Λ_ε is a tiny disk that a Newton step from outside would
    # jump over; the march must stop at the eigenvalue's ε-disk.
    n = 40
    L = np.tril(rng.uniform(0.0, 0.3, (n, n)), -1) + np.diag(rng.uniform(0.15, 0.22, n))
    L[n // 2, n // 2] = 0.96
    L[n // 2 :, n // 2] = np.where(np.arange(n // 2, n) == n // 2, 0.96, 0.0)
    for eps in (1e-4, 1e-3):
        r = pseudospectral_radius(L, eps)
        a = pseudospectral_abscissa(L, eps)
        assert r.value >= 0.96 + eps - 1e-12 and a.value >= 0.96 + eps - 1e-12
        assert abs(sigma_min_dense(L, r.z) - eps) < 1e-9 * max(1.0, eps)


def test_radius_result_is_on_the_level_set_and_cheap(rng: np.random.Generator) -> None:
    n = 64
    for B in _deflated_heads(n, rng):
        for eps in (1e-3, 1e-2, 1e-1):
            r = pseudospectral_radius(B, eps)
            lam_max = float(np.abs(np.diag(B)).max())
            assert r.value >= lam_max + eps - 1e-12
            assert abs(sigma_min_dense(B, r.z) - eps) < 1e-9 * max(1.0, eps)
            assert r.n_evals < 3000


def test_grid_next_to_a_strongly_non_normal_cluster(rng: np.random.Generator) -> None:
    """Near the eigenvalue cluster of a previous-token-like head σ_min(zI − B) is far below
    rounding and inverse iteration overflows: such points go to the dense fallback (the numba
    kernel once divided by a zero norm there), whatever the order of the points."""
    from depthlens.linalg.causal import deflate

    B = deflate(causal_softmax(128, np.random.default_rng(0), prev=5.0))
    x = np.array([0.0, 0.025, 0.05])  # 0 is an eigenvalue of B; σ_min ≈ 4e-17 at 0.025 (dense)
    for axis in (x, x[::-1]):
        numba = pseudospectrum(B, axis, [0.0], engine="numba")
        with np.errstate(all="ignore"):  # the numpy reference engine overflows there too, with warnings
            numpy = pseudospectrum(B, axis, [0.0], engine="numpy")
        np.testing.assert_allclose(numba.sigma, numpy.sigma, rtol=1e-10, atol=0)
        assert np.all(np.isfinite(numba.sigma)) and numba.n_fallback == numpy.n_fallback == 2
        assert np.all(numba.sigma < 1e-15)  # zero to rounding (dense SVD; 1e-141 where the iteration converged)
