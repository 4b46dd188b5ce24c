"""Guarded decompositions: each driver of each fallback chain against numpy's float64 result,
forced non-convergence (LAPACK calls monkeypatched to fail) taken and recorded, and every
driver failing turned into DecompositionError."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from depthlens.errors import DecompositionError
from depthlens.linalg import guarded

RNG = np.random.default_rng(7)
A = RNG.standard_normal((9, 9))
AC = A + 1j * RNG.standard_normal((9, 9))
H = A @ A.T
TOL = 1e-11  # every driver is backward stable: agreement to a modest multiple of n·ε‖A‖


def _fail(*args, **kwargs):
    raise np.linalg.LinAlgError("did not converge (forced)")


def _fail_first(n: int, real):
    """``real`` with its first ``n`` calls failing to converge."""
    calls = [0]

    def fake(*args, **kwargs):
        calls[0] += 1
        if calls[0] <= n:
            raise np.linalg.LinAlgError("did not converge (forced)")
        return real(*args, **kwargs)

    return fake


@pytest.fixture
def counts():
    """Counts added during the test."""
    before = guarded.driver_counts()
    box: dict[str, int] = {}
    yield lambda: guarded.count_difference(guarded.driver_counts(), before) | box


def _sv(a):
    return np.linalg.svd(a, compute_uv=False)


def _assert_same_spectrum(got, want, atol=1e-10):
    """Equal multisets of eigenvalues (matched by distance: a sort would pair conjugates
    whose real parts differ by rounding in either order)."""
    got, want = np.asarray(got), list(np.asarray(want))
    assert len(got) == len(want)
    for lam in got:
        k = int(np.argmin(np.abs(np.asarray(want) - lam)))
        assert abs(want.pop(k) - lam) <= atol, (lam, want)


def test_default_drivers_match_numpy_and_are_counted(counts):
    np.testing.assert_array_equal(guarded.svdvals(A), _sv(A))
    np.testing.assert_array_equal(guarded.eigvals(A), np.linalg.eigvals(A))
    np.testing.assert_array_equal(guarded.eigvalsh(H), np.linalg.eigvalsh(H))
    assert guarded.norm2(A) == _sv(A)[0]
    stack = np.stack([A, 2 * A, 3 * A])
    np.testing.assert_array_equal(guarded.norm2(stack), _sv(stack)[:, 0])
    assert counts() == {"eigh:heevd": 1, "eigvals:geev": 1, "svd:gesdd": 5}
    assert guarded.fallback_count(counts()) == 0


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("mat", [A, AC, A[:, :6], A[:6]], ids=["real", "complex", "tall", "wide"])
def test_svd_fallback_chain(monkeypatch, counts, mat, full):
    """gesdd forced to fail: gesvd; gesvd failing too: QR-preconditioned, then transposed."""
    ref = _sv(mat)
    scipy_svd = scipy.linalg.svd
    monkeypatch.setattr(np.linalg, "svd", _fail)
    for blocked, driver in enumerate(["gesvd", "qr+gesvd", "gesvd^H"]):

        monkeypatch.setattr(scipy.linalg, "svd", _fail_first(blocked, scipy_svd))
        before = guarded.driver_counts()
        u, s, vh = guarded.svd(mat, full_matrices=full)
        got = guarded.count_difference(guarded.driver_counts(), before)
        assert got == {f"svd:{driver}": 1}
        np.testing.assert_allclose(s, ref, rtol=0, atol=TOL * ref[0])
        k = len(s)
        np.testing.assert_allclose((u[:, :k] * s) @ vh[:k], mat, atol=TOL * ref[0])
        np.testing.assert_allclose(u.conj().T @ u, np.eye(u.shape[1]), atol=TOL)
        np.testing.assert_allclose(guarded.svdvals(mat), ref, atol=TOL * ref[0])
    assert counts() == {"svd:gesvd": 4, "svd:qr+gesvd": 1, "svd:gesvd^H": 1}  # each pass also ran svdvals once
    assert guarded.fallback_count(counts()) == 6


def test_batched_svd_falls_back_per_matrix(monkeypatch, counts):
    stack = np.stack([A, AC.real, 2 * A])
    ref = _sv(stack)
    real = np.linalg.svd

    def fail_batches(a, *args, **kwargs):
        if a.ndim > 2:
            raise np.linalg.LinAlgError("forced")
        return real(a, *args, **kwargs)

    monkeypatch.setattr(np.linalg, "svd", fail_batches)
    np.testing.assert_allclose(guarded.svdvals(stack), ref, atol=TOL * ref.max())
    assert counts() == {"svd:gesdd": 3}


def test_eigvals_fallbacks(monkeypatch, counts):
    ref = np.linalg.eigvals(A)
    numpy_eigvals = np.linalg.eigvals
    monkeypatch.setattr(np.linalg, "eigvals", _fail)
    _assert_same_spectrum(guarded.eigvals(A), ref)
    assert counts() == {"eigvals:gees": 1}
    monkeypatch.setattr(scipy.linalg, "schur", _fail)
    _assert_same_spectrum(guarded.eigvals(A), ref)
    assert counts()["eigvals:ggev"] == 1
    monkeypatch.setattr(scipy.linalg, "eigvals", _fail)
    monkeypatch.setattr(np.linalg, "eigvals", _fail_first(1, numpy_eigvals))
    _assert_same_spectrum(guarded.eigvals(A), ref)
    assert counts()["eigvals:geev+shift"] == 1


def test_eigvalsh_fallbacks(monkeypatch, counts):
    ref = np.linalg.eigvalsh(H)
    monkeypatch.setattr(np.linalg, "eigvalsh", _fail)
    np.testing.assert_allclose(guarded.eigvalsh(H), ref, atol=TOL * ref[-1])
    np.testing.assert_allclose(guarded.eigvalsh(H, subset_by_index=(8, 8)), ref[-1:], rtol=TOL)
    real = scipy.linalg.eigvalsh

    def only_ev(a, *args, driver=None, **kwargs):
        if driver != "ev":
            raise np.linalg.LinAlgError("forced")
        return real(a, *args, driver=driver, **kwargs)

    monkeypatch.setattr(scipy.linalg, "eigvalsh", only_ev)
    np.testing.assert_allclose(guarded.eigvalsh(H), ref, atol=TOL * ref[-1])
    np.testing.assert_allclose(guarded.eigvalsh(H, subset_by_index=(0, 2)), ref[:3], atol=TOL * ref[-1])
    assert counts() == {"eigh:heevr": 1, "eigh_subset:heevr": 1, "eigh:heev": 1, "eigh_subset:heev": 1}
    assert guarded.fallback_count(counts()) == 3


@pytest.mark.parametrize("output", ["complex", "real"])
def test_schur_fallbacks_keep_the_factorisation(monkeypatch, counts, output):
    real = scipy.linalg.schur
    monkeypatch.setattr(scipy.linalg, "schur", _fail_first(1, real))
    t, q = guarded.schur(A, output=output)
    np.testing.assert_allclose(q @ t @ q.conj().T, A, atol=TOL * np.abs(A).max() * 9)
    _assert_same_spectrum(np.linalg.eigvals(t), np.linalg.eigvals(A))
    want = "gees-real+rsf2csf" if output == "complex" else "gees+shift"
    assert counts() == {f"schur:{want}": 1}
    # A complex matrix goes straight from gees to the shifted retry; T is shifted back.
    monkeypatch.setattr(scipy.linalg, "schur", _fail_first(1, real))
    t, q = guarded.schur(AC, output="complex")
    np.testing.assert_allclose(q @ t @ q.conj().T, AC, atol=1e-12 * np.abs(AC).max() * 9)
    assert np.allclose(np.tril(t, -1), 0)


@pytest.mark.parametrize("a", [A, AC], ids=["real", "complex"])
def test_schur_values_is_a_schur_form_with_its_eigenvalues(monkeypatch, counts, a):
    """No Schur vectors, but a Schur form: (quasi-)triangular, of a's Frobenius norm (a unitary
    similarity), with eigenvalues w in its diagonal order equal to numpy's; the shifted
    fallback gives the same."""
    t, w = guarded.schur_values(a)
    assert np.all(np.tril(t, -1 if a.dtype.kind == "c" else -2) == 0)
    assert np.linalg.norm(t) == pytest.approx(np.linalg.norm(a), rel=1e-13)
    _assert_same_spectrum(w, np.linalg.eigvals(a))
    _assert_same_spectrum(np.linalg.eigvals(t), w)
    if a.dtype.kind != "c":  # a pair's block [[p, b], [c, p]]: w holds p + i√(−bc) first
        k = int(np.flatnonzero(np.diagonal(t, -1))[0])
        assert w[k] == pytest.approx(t[k, k] + 1j * np.sqrt(-t[k, k + 1] * t[k + 1, k]), rel=1e-12)
    assert counts() == {"schur:gees": 1}
    monkeypatch.setattr(guarded, "_gees_without_vectors", _fail_first(1, guarded._gees_without_vectors))
    t2, w2 = guarded.schur_values(a)
    _assert_same_spectrum(w2, w)
    assert np.linalg.norm(t2) == pytest.approx(np.linalg.norm(a), rel=1e-12)
    assert counts() == {"schur:gees": 1, "schur:gees+shift": 1}


def test_solve_falls_back_to_least_squares(counts):
    b = RNG.standard_normal(9)
    np.testing.assert_allclose(guarded.solve(A, b), np.linalg.solve(A, b), rtol=1e-12)
    singular = np.diag([1.0, 2.0, 0.0])
    x = guarded.solve(singular, np.array([1.0, 2.0, 0.0]))
    np.testing.assert_allclose(x, [1.0, 1.0, 0.0], atol=1e-14)
    assert counts() == {"solve:gesv": 1, "solve:gelsd": 1}
    assert guarded.fallback_count(counts()) == 1


def test_every_driver_failing_raises_one_line(monkeypatch):
    monkeypatch.setattr(np.linalg, "svd", _fail)
    monkeypatch.setattr(scipy.linalg, "svd", _fail)
    with pytest.raises(DecompositionError, match="svd did not converge with any driver") as info:
        guarded.svdvals(A)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, np.linalg.LinAlgError)


@pytest.mark.parametrize("fn", [guarded.svdvals, guarded.eigvals, guarded.eigvalsh, guarded.schur, guarded.schur_values])
def test_non_finite_input_is_refused(fn):
    bad = A.copy()
    bad[3, 4] = np.nan
    with pytest.raises(DecompositionError, match="NaN or infinite"):
        fn(bad)


def test_merge_counts_adds_worker_counts():
    before = guarded.driver_counts()
    guarded.merge_counts({"svd:gesvd": 2, "schur:gees": 0})
    assert guarded.count_difference(guarded.driver_counts(), before) == {"svd:gesvd": 2}
