"""Henrici departure, numerical range, symmetry and spectrum fractions (METHODS A3, B2)."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ortho_group

from depthlens.errors import InputError
from depthlens.linalg.causal import deflate
from depthlens.linalg.normality import (
    complex_fraction,
    expansion_fraction,
    henrici,
    henrici_rel,
    numerical_abscissa,
    numerical_radius,
    rotation_angle_mean,
    schur_departure,
    symmetry_index,
)

from ._make import causal_softmax


def _henrici_by_eigs(M: np.ndarray) -> float:
    return float(np.sqrt(max(np.linalg.norm(M) ** 2 - np.sum(np.abs(np.linalg.eigvals(M)) ** 2), 0.0)))


def _radius_brute(M: np.ndarray, m: int = 20000) -> float:
    herm, skew = (M + M.conj().T) / 2, (M - M.conj().T) / 2j
    return max(np.linalg.eigvalsh(np.cos(t) * herm - np.sin(t) * skew)[-1] for t in np.linspace(0, 2 * np.pi, m))


# --- Henrici ------------------------------------------------------------------------------


def test_triangular_henrici_equals_general_formula(rng: np.random.Generator) -> None:
    A = causal_softmax(10, rng, sink=1.0)
    B = deflate(A)
    for M in (A, B, np.triu(rng.standard_normal((7, 7)))):
        assert henrici(M) == pytest.approx(_henrici_by_eigs(M), rel=1e-10)
    np.testing.assert_allclose(henrici(B), np.linalg.norm(np.tril(B, -1)), rtol=1e-15)


def test_general_henrici_is_unitarily_invariant(rng: np.random.Generator) -> None:
    T = np.tril(rng.standard_normal((8, 8)))
    Q = ortho_group.rvs(8, random_state=1)
    M = Q @ T @ Q.T  # not triangular: goes through the Schur path
    assert henrici(M) == pytest.approx(np.linalg.norm(np.tril(T, -1)), rel=1e-12)
    C = rng.standard_normal((6, 6)) + 1j * rng.standard_normal((6, 6))
    assert henrici(C) == pytest.approx(_henrici_by_eigs(C), rel=1e-8)


def test_henrici_normal_matrices_are_zero(rng: np.random.Generator) -> None:
    X = rng.standard_normal((9, 9))
    S = X @ X.T  # symmetric PSD
    assert henrici(S) <= 1e-13 * np.linalg.norm(S)
    R = ortho_group.rvs(9, random_state=2)  # orthogonal: normal with complex eigenvalues
    assert henrici(R) <= 1e-13
    assert henrici(np.zeros((3, 3))) == 0 and henrici_rel(np.zeros((3, 3))) == 0


@pytest.mark.parametrize("n", [2, 7, 40])
def test_schur_departure_of_a_real_schur_form_equals_the_complex_one(rng: np.random.Generator, n: int) -> None:
    """From LAPACK's real Schur form (2×2 blocks for the pairs), no complex arithmetic: equal to
    ‖N‖_F of the complex Schur form of the same matrix (the rsf2csf triangle), to rounding."""
    from depthlens.linalg import guarded

    for _ in range(5):
        M = rng.standard_normal((n, n))
        t, _ = guarded.schur_values(M)
        triangle = scipy.linalg.rsf2csf(*scipy.linalg.schur(M, output="real"))[0]
        assert schur_departure(t) == pytest.approx(np.linalg.norm(np.triu(triangle, 1)), rel=1e-12, abs=1e-13)
        assert schur_departure(t) == pytest.approx(float(henrici(M)), rel=1e-10)
        assert schur_departure(triangle) == pytest.approx(np.linalg.norm(np.triu(triangle, 1)), rel=1e-15)


def test_schur_departure_of_an_unstandardised_block() -> None:
    """A 2×2 block [[p, b], [c, q]] with p ≠ q (not LAPACK's standard form) still gives
    √((p − q)² + (b + c)²), the closed form, equal to the general formula."""
    t = np.array([[1.0, 2.0], [-3.0, 4.0]])  # (p − q)² + 4bc = 9 − 24 < 0: a conjugate pair
    assert schur_departure(t) == pytest.approx(np.hypot(1.0 - 4.0, 2.0 - 3.0), rel=1e-15)
    assert schur_departure(t) == pytest.approx(_henrici_by_eigs(t), rel=1e-12)


def test_henrici_batched_mixed(rng: np.random.Generator) -> None:
    stack = np.array([np.tril(rng.standard_normal((5, 5))), rng.standard_normal((5, 5)), np.triu(rng.standard_normal((5, 5)))])
    out = henrici(stack)
    assert out.shape == (3,)
    np.testing.assert_allclose(out, [_henrici_by_eigs(m) for m in stack], rtol=1e-8)
    rel = henrici_rel(stack)
    np.testing.assert_allclose(rel, out / np.linalg.norm(stack, axis=(1, 2)), rtol=1e-14)
    assert np.all((rel >= 0) & (rel <= 1))


# --- numerical abscissa and radius ------------------------------------------------------------


def test_numerical_abscissa_closed_forms() -> None:
    a, b = 0.3, -2.0
    assert numerical_abscissa(np.array([[a, b], [0, a]])) == pytest.approx(a + abs(b) / 2, rel=1e-14)
    assert numerical_abscissa(np.diag([1.0 + 2j, -3.0, 0.5j])) == pytest.approx(1.0, rel=1e-14)
    np.testing.assert_allclose(numerical_abscissa(np.array([np.eye(2), -np.eye(2)])), [1.0, -1.0])


def test_numerical_radius_closed_forms() -> None:
    assert numerical_radius(np.array([[0.0, 3.0], [0.0, 0.0]])) == pytest.approx(1.5, rel=1e-12)
    assert numerical_radius(np.diag([1.0, -4.0, 2j])) == pytest.approx(4.0, rel=1e-12)


@pytest.mark.parametrize("kind", ["real", "complex", "deflated", "attention"])
def test_numerical_radius_against_brute_force(kind: str, rng: np.random.Generator) -> None:
    n = 7
    M = {
        "real": rng.standard_normal((n, n)),
        "complex": rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)),
        "deflated": deflate(causal_softmax(n, rng, sink=1.0, prev=1.0)),
        "attention": causal_softmax(n, rng, sink=1.0),  # non-negative: θ = 0 shortcut
    }[kind]
    w, brute = float(numerical_radius(M)), _radius_brute(M)
    assert brute <= w + 1e-12  # the brute grid can only undershoot the true maximum
    assert w - brute <= 1e-6 * np.linalg.norm(M, 2)
    assert np.abs(np.linalg.eigvals(M)).max() <= w + 1e-12 <= np.linalg.norm(M, 2) + 2e-12
    assert w >= np.linalg.norm(M, 2) / 2 - 1e-12


def test_numerical_radius_of_a_signature_similar_matrix_is_attained_at_theta_zero(rng: np.random.Generator) -> None:
    """A dense real M = DND (N > 0, D a signature with both signs): M has entries of both signs,
    and its numerical radius is its numerical abscissa, as the brute-force maximum over θ says."""
    n = 7
    D = np.diag(np.where(np.arange(n) % 3 == 0, -1.0, 1.0))
    M = D @ (rng.random((n, n)) + 0.1) @ D
    assert (M < 0).any() and not np.allclose(M, M.T)
    w, brute = float(numerical_radius(M)), _radius_brute(M)
    assert w == float(numerical_abscissa(M))
    assert brute <= w + 1e-12 and w - brute <= 1e-6 * np.linalg.norm(M, 2)


def test_numerical_radius_batched(rng: np.random.Generator) -> None:
    stack = rng.standard_normal((2, 3, 4, 4))
    out = numerical_radius(stack)
    assert out.shape == (2, 3)
    assert out[1, 2] == numerical_radius(stack[1, 2])
    with pytest.raises(InputError, match="n_grid"):
        numerical_radius(stack, n_grid=1)


# --- symmetry and spectrum fractions --------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 8))
def test_symmetry_index_closed_form(seed: int, n: int) -> None:
    M = np.random.default_rng(seed).standard_normal((n, n))
    want = 0.5 * (1 + np.sum(M * M.T) / np.sum(M * M))
    assert symmetry_index(M) == pytest.approx(want, rel=1e-12)


def test_symmetry_index_extremes(rng: np.random.Generator) -> None:
    X = rng.standard_normal((5, 5))
    np.testing.assert_allclose(symmetry_index(np.array([X + X.T, X - X.T])), [1.0, 0.0], atol=1e-15)
    assert symmetry_index(np.zeros((2, 2))) == 1.0


def test_rotation_block_is_fully_complex() -> None:
    theta = 0.7
    R = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    lam = np.linalg.eigvals(R)
    assert complex_fraction(lam) == 1.0
    assert rotation_angle_mean(lam) == pytest.approx(theta, rel=1e-14)
    assert complex_fraction(np.linalg.eigvals(np.diag([1.0, -2.0, 3.0]))) == 0.0


def test_complex_fraction_threshold_and_batch() -> None:
    lam = np.array([[10.0 + 1e-9j, 1.0 + 1e-6j, 2.0, 3j], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(complex_fraction(lam), [0.5, 0.0])
    np.testing.assert_array_equal(complex_fraction(lam, rel=1e-12), [0.75, 0.0])


def test_expansion_fraction() -> None:
    np.testing.assert_array_equal(expansion_fraction([0.5, 1.0005, 1.01, -2.0, 1.5j]), 0.6)
    np.testing.assert_array_equal(expansion_fraction([[1.0, 3.0], [0.1, 0.2]], tol=0.0), [0.5, 0.0])
    assert rotation_angle_mean([-1.0, 1.0, 1j, 0.0]) == pytest.approx((np.pi + np.pi / 2) / 4, rel=1e-15)


@pytest.mark.parametrize("bad", [[], [np.nan], "ab"])
def test_spectrum_functions_reject_bad_values(bad: object) -> None:
    with pytest.raises(InputError):
        complex_fraction(bad)  # type: ignore[arg-type]


def test_rotation_angle_mean_counts_numerical_zeros_as_zero() -> None:
    """An eigenvalue at rounding level (here −1e-9 beside modulus 2) has no meaningful
    argument: it counts with angle 0 as an exact zero does, not with its computed π."""
    from depthlens.linalg.normality import rotation_angle_mean

    mu = np.array([1j, -1e-9, 2.0])
    assert rotation_angle_mean(mu) == pytest.approx(np.pi / 6, rel=1e-15)
    assert rotation_angle_mean(mu, rel=0.0) == pytest.approx((np.pi / 2 + np.pi) / 3, rel=1e-15)
    assert rotation_angle_mean(np.zeros(3)) == 0.0
