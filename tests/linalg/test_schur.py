"""Complex Schur split (METHODS B4)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.errors import InputError
from depthlens.linalg.normality import henrici
from depthlens.linalg.schur import SCHUR_ORDERS, iter_schur_forms, schur_form, schur_forms, schur_split


def _same_spectrum(X: np.ndarray, Y: np.ndarray, atol: float) -> None:
    a, b = np.linalg.eigvals(X), np.linalg.eigvals(Y)
    # Match each eigenvalue of X to its nearest in Y (robust to ordering and conjugate pairs).
    dist = np.abs(a[:, None] - b[None, :])
    assert np.all(dist.min(axis=1) <= atol) and np.all(dist.min(axis=0) <= atol)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 10), complex_input=st.booleans())
def test_endpoints(seed: int, n: int, complex_input: bool) -> None:
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if complex_input else 0)
    one, zero = schur_split(M, [1.0, 0.0])
    np.testing.assert_array_equal(one, M)
    np.testing.assert_allclose(zero @ zero.conj().T, zero.conj().T @ zero, atol=1e-11 * max(1, np.linalg.norm(M) ** 2))
    _same_spectrum(zero, M, atol=1e-8 * max(1, np.linalg.norm(M)))


def test_matches_direct_reconstruction(rng: np.random.Generator) -> None:
    # A Schur form built by hand, diagonal already in canonical order (descending modulus):
    # the split is unique up to diagonal phases, so it must equal Q(Λ + αN)Q* exactly.
    n = 7
    lam = np.array([3.0, -2.5 + 1j, 2.0j, 1.5, 1.0 - 0.5j, -0.7, 0.2j])
    N = np.triu(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)), 1)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    M = Q @ (np.diag(lam) + N) @ Q.conj().T
    np.testing.assert_allclose(np.diagonal(schur_form(M).t), lam, atol=1e-12)
    for a in (0.0, 0.25, 0.5, 0.75):
        np.testing.assert_allclose(schur_split(M, a), Q @ (np.diag(lam) + a * N) @ Q.conj().T, atol=1e-12)


@pytest.mark.parametrize("complex_input", [False, True])
def test_split_is_unitarily_covariant(complex_input: bool, rng: np.random.Generator) -> None:
    # LAPACK's own eigenvalue order differs between M and U M U*; the canonical order does not.
    n = 8
    M = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if complex_input else 0)
    U = scipy.linalg.qr(rng.standard_normal((n, n)))[0]
    Pm = np.eye(n)[rng.permutation(n)]
    for V in (U, Pm):
        np.testing.assert_allclose(schur_split(V @ M @ V.T, 0.3), V @ schur_split(M, 0.3) @ V.T, atol=1e-11)


def test_canonical_order(rng: np.random.Generator) -> None:
    lam = np.diagonal(schur_form(rng.standard_normal((10, 10))).t)
    mod = np.abs(lam)
    assert np.all(np.diff(mod) <= 1e-12 * mod[0])
    pairs = np.flatnonzero(np.abs(np.diff(mod)) <= 1e-12 * mod[0])
    assert np.all(lam[pairs].imag >= lam[pairs + 1].imag)


def test_scales_henrici_and_keeps_spectrum(rng: np.random.Generator) -> None:
    M = rng.standard_normal((8, 8))
    alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
    out = schur_split(M, alphas)
    assert out.shape == (5, 8, 8)
    h = henrici(M)
    for a, J in zip(alphas, out):
        assert henrici(J) == pytest.approx(a * h, abs=1e-11)
        _same_spectrum(J, M, atol=1e-9)
        np.testing.assert_array_equal(J, schur_split(M, a))


def test_real_output_iff_real_spectrum(rng: np.random.Generator) -> None:
    S = rng.standard_normal((6, 6))
    M = S @ np.triu(rng.standard_normal((6, 6))) @ np.linalg.inv(S)  # real eigenvalues
    J = schur_split(M, 0.5)
    assert J.dtype == np.float64
    _same_spectrum(J, M, atol=1e-8)
    R = np.array([[0.0, -2.0, 0.3], [1.0, 0.0, 0.1], [0.0, 0.0, 0.5]])  # a complex pair
    Jc = schur_split(R, 0.0)
    assert Jc.dtype == np.complex128
    assert np.abs(Jc.imag).max() > 0.1  # genuinely complex, not rounding


def test_schur_form_record(rng: np.random.Generator) -> None:
    M = rng.standard_normal((5, 5))
    form = schur_form(M)
    np.testing.assert_allclose(form.q @ form.t @ form.q.conj().T, M, atol=1e-13)
    np.testing.assert_allclose(form.q.conj().T @ form.q, np.eye(5), atol=1e-14)
    np.testing.assert_array_equal(np.tril(form.t, -1), 0)
    assert np.linalg.norm(form.nonnormal) == pytest.approx(henrici(M), rel=1e-14)
    np.testing.assert_array_equal(schur_split(form, 0.3), schur_split(M, 0.3))


@pytest.mark.parametrize("alpha", [[], [np.nan], [[0.5]]])
def test_bad_alpha(alpha: object) -> None:
    with pytest.raises(InputError, match="alpha"):
        schur_split(np.eye(2), alpha)  # type: ignore[arg-type]


@pytest.mark.parametrize("complex_input", [False, True])
def test_lapack_and_partitioned_orders_are_scipys(complex_input: bool, rng: np.random.Generator) -> None:
    """``lapack`` is scipy.linalg.schur(M, output="complex") as it comes; ``outside_first`` and
    ``inside_first`` are its ``sort="ouc"`` and ``sort="iuc"`` forms, bit for bit."""
    n = 12
    M = np.eye(n) + rng.standard_normal((n, n)) / 3 + (1j * rng.standard_normal((n, n)) / 3 if complex_input else 0)
    for order, sort in (("lapack", None), ("outside_first", "ouc"), ("inside_first", "iuc")):
        ref = scipy.linalg.schur(M, output="complex", sort=sort)
        form = schur_form(M, order)
        assert form.order == order and form.t.dtype == form.q.dtype == np.complex128
        np.testing.assert_array_equal(form.t, ref[0])
        np.testing.assert_array_equal(form.q, ref[1])
        if sort is not None:
            outside = np.abs(form.eigenvalues) > 1
            k = int(ref[2])  # how many eigenvalues satisfy the sort
            assert np.all(outside[:k] == (order == "outside_first")) and np.all(outside[k:] == (order != "outside_first"))


@pytest.mark.parametrize("order", SCHUR_ORDERS)
def test_every_order_is_a_schur_form_with_the_spectrum(order: str, rng: np.random.Generator) -> None:
    M = rng.standard_normal((9, 9))
    form = schur_form(M, order)
    np.testing.assert_allclose(form.q @ form.t @ form.q.conj().T, M, atol=1e-13)
    np.testing.assert_allclose(form.q.conj().T @ form.q, np.eye(9), atol=1e-14)
    np.testing.assert_array_equal(np.tril(form.t, -1), 0)
    _same_spectrum(np.diag(form.eigenvalues), M, atol=1e-12)
    for a in (0.0, 0.5):
        J = schur_split(M, a, order)
        _same_spectrum(J, M, atol=1e-9)
        assert henrici(J) == pytest.approx(a * henrici(M), abs=1e-11)
    np.testing.assert_array_equal(schur_split(M, 1.0, order), M)
    np.testing.assert_array_equal(schur_split(form, 0.3), schur_split(M, 0.3, order))


def test_orders_change_the_normal_part() -> None:
    """The split is order-dependent: ``T = [[2, 1], [0, 0.5]]`` is its own ``lapack``,
    ``canonical`` and ``outside_first`` form (normal part diag(2, 0.5)); ``inside_first`` puts
    0.5 first and the normal part becomes non-diagonal."""
    T = np.array([[2.0, 1.0], [0.0, 0.5]])
    for order in ("lapack", "canonical", "outside_first"):
        np.testing.assert_allclose(schur_split(T, 0.0, order), np.diag([2.0, 0.5]), atol=1e-15)
    inside = schur_split(T, 0.0, "inside_first")
    assert abs(inside[0, 1]) > 0.1
    _same_spectrum(inside, T, atol=1e-14)


def test_bad_order() -> None:
    with pytest.raises(InputError, match="Schur order"):
        schur_form(np.eye(2), "sorted")  # type: ignore[arg-type]


@pytest.mark.parametrize("order", ["outside_first", "inside_first"])
def test_structural_unit_eigenvalues_stay_inside_whatever_the_rounding(order: str, rng: np.random.Generator) -> None:
    """``I + U`` with U of rank 6 < 24 has the eigenvalue 1 eighteen times, computed at
    ``|λ| − 1`` of ±1e-15; how many come out above 1 changes with the rounding of M (here
    ulp-level changes of U, as a BLAS thread count makes). They all count as on the circle,
    so the partition does not depend on the rounding: each form is SciPy's with the sort
    ``|λ| > 1 + 1e-8·max(1, max|λ|)`` (or its negation), bit for bit."""
    n, r = 24, 6
    U = rng.standard_normal((n, r)) @ rng.standard_normal((r, n)) / 3
    variants = [np.eye(n) + U * (1 + k * 2.0**-52) for k in range(8)]
    raw = {int(np.sum(np.abs(np.linalg.eigvals(M)) > 1)) for M in variants}
    assert len(raw) > 1, "the perturbations never moved a computed |λ| across 1; the test checks nothing"
    clear = int(np.sum(np.abs(np.linalg.eigvals(np.eye(n) + U)) > 1 + 1e-6))
    assert 0 < clear <= r
    for M in variants:
        radius = float(np.abs(np.linalg.eigvals(M)).max())
        outside = lambda lam: abs(lam) > 1 + 1e-8 * max(1.0, radius)  # noqa: E731
        t, q, k = scipy.linalg.schur(M, output="complex", sort=outside if order == "outside_first" else lambda lam: not outside(lam))
        assert k == (clear if order == "outside_first" else n - clear)
        form = schur_form(M, order)
        np.testing.assert_array_equal(form.t, np.triu(t))
        np.testing.assert_array_equal(form.q, q)


def test_iter_schur_forms_is_schur_forms_one_at_a_time(rng: np.random.Generator) -> None:
    """Bit for bit the list's forms, in the order asked (repeats included); bad input is
    refused at the call, before any decomposition."""
    M = rng.standard_normal((9, 9))
    orders = ("outside_first", "canonical", "lapack", "inside_first", "lapack")
    for got, want in zip(iter_schur_forms(M, orders), schur_forms(M, orders), strict=True):
        assert got.order == want.order
        np.testing.assert_array_equal(got.t, want.t)
        np.testing.assert_array_equal(got.q, want.q)
    with pytest.raises(InputError, match="Schur order"):
        iter_schur_forms(M, ("lapack", "sorted"))
    with pytest.raises(InputError):
        iter_schur_forms(np.ones((2, 3)), ("lapack",))
