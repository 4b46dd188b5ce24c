"""Blocked Schur reordering against LAPACK's unblocked ``trsen`` / ``trexc`` (float64 references)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from depthlens.errors import InputError
from depthlens.linalg import schur
from depthlens.linalg.reorder import select_leading, sort_diagonal

#: Small windows, so that a 48 × 48 form needs many windows and chunks.
SMALL = {"window": 8, "nb": 3}


def _form(rng: np.random.Generator, n: int, real: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A matrix near the identity (eigenvalues interleaved around the unit circle) and its LAPACK Schur form."""
    if real:  # real eigenvalues only (on both sides of 1): a real triangular form
        R = np.triu(rng.standard_normal((n, n)) / np.sqrt(n), 1) + np.diag(rng.permutation(np.linspace(0.3, 1.7, n)))
        Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        M = Q @ R @ Q.T
        t, q = scipy.linalg.schur(M, output="real")
        assert np.all(np.diagonal(t, -1) == 0)
        return M, np.asfortranarray(np.triu(t)), np.asfortranarray(q)
    M = np.eye(n) + 0.6 * rng.standard_normal((n, n)) / np.sqrt(n)
    t, q = scipy.linalg.schur(M, output="complex")
    return M, np.asfortranarray(t), np.asfortranarray(q)


def _normal(t: np.ndarray, q: np.ndarray) -> np.ndarray:
    return (q * np.diagonal(t)) @ q.conj().T


def _check_form(M: np.ndarray, t: np.ndarray, q: np.ndarray) -> None:
    n = len(M)
    assert np.all(np.tril(t, -1) == 0)
    np.testing.assert_allclose(q.conj().T @ q, np.eye(n), atol=1e-13)
    assert np.linalg.norm(q @ t @ q.conj().T - M) <= 1e-13 * n * np.linalg.norm(M)


@pytest.mark.parametrize("how", ["outside", "random", "all", "none", "last", "first"])
def test_select_leading_is_trsen(how: str, rng: np.random.Generator) -> None:
    n = 48
    M, t, q = _form(rng, n)
    lam = np.diagonal(t)
    select = {"outside": np.abs(lam) > 1, "random": rng.random(n) < 0.4, "all": np.ones(n, bool),
              "none": np.zeros(n, bool), "last": np.arange(n) == n - 1, "first": np.arange(n) == 0}[how]
    ref_t, ref_q, *_ = scipy.linalg.lapack.ztrsen(select.astype(np.int32), t, q, job="N")
    tb, qb = t.copy(order="F"), q.copy(order="F")
    select_leading(tb, qb, select, **SMALL)
    _check_form(M, tb, qb)
    # trsen swaps diagonal entries exactly: the same diagonal, a stable partition of the old one
    np.testing.assert_array_equal(np.diagonal(tb), np.diagonal(ref_t))
    np.testing.assert_array_equal(np.diagonal(tb), np.concatenate([lam[select], lam[~select]]))
    np.testing.assert_allclose(_normal(tb, qb), _normal(ref_t, ref_q), atol=1e-12)


def test_select_leading_on_a_range_leaves_the_rest(rng: np.random.Generator) -> None:
    n, lo, hi = 40, 9, 31
    M, t, q = _form(rng, n)
    lam = np.diagonal(t).copy()
    select = rng.random(hi - lo) < 0.5
    tb, qb = t.copy(order="F"), q.copy(order="F")
    select_leading(tb, qb, select, lo, hi, **SMALL)
    _check_form(M, tb, qb)
    inner = lam[lo:hi]
    expected = np.concatenate([lam[:lo], inner[select], inner[~select], lam[hi:]])
    np.testing.assert_array_equal(np.diagonal(tb), expected)
    np.testing.assert_array_equal(qb[:, :lo], q[:, :lo])  # columns outside the range never move
    np.testing.assert_array_equal(qb[:, hi:], q[:, hi:])


@pytest.mark.parametrize("real", [False, True])
def test_sort_diagonal_is_the_trexc_selection_sort(real: bool, rng: np.random.Generator) -> None:
    n = 48
    M, t, q = _form(rng, n, real=real)
    ref_t, ref_q = schur._canonical_order(t.copy(order="F"), q.copy(order="F"))  # n < BLOCKED_FROM: trexc
    lam = np.diagonal(t)
    order = np.lexsort((-lam.real, -lam.imag, -np.round(np.abs(lam) / np.abs(lam).max(), 10)))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    tb, qb = t.copy(order="F"), q.copy(order="F")
    sort_diagonal(tb, qb, rank, **SMALL)
    assert tb.dtype == t.dtype
    _check_form(M, tb, qb)
    np.testing.assert_array_equal(np.diagonal(tb), np.diagonal(ref_t))
    np.testing.assert_allclose(_normal(tb, qb), _normal(ref_t, ref_q), atol=1e-11)


def test_sort_keeps_ties_and_equal_eigenvalues_in_place(rng: np.random.Generator) -> None:
    """A structurally-1 eigenvalue of multiplicity 20 (I + a rank-12 update): equal keys never swap."""
    n = 32
    U = rng.standard_normal((n, 12)) @ rng.standard_normal((12, n)) / n
    M = np.eye(n) + U
    t, q = scipy.linalg.schur(M, output="complex")
    t, q = np.asfortranarray(t), np.asfortranarray(q)
    rank = np.where(np.abs(np.diagonal(t) - 1) < 1e-8, 5, rng.integers(0, 10, n))  # ties within and across groups
    tb, qb = t.copy(order="F"), q.copy(order="F")
    sort_diagonal(tb, qb, rank, **SMALL)
    _check_form(M, tb, qb)
    stable = np.argsort(rank, kind="stable")
    np.testing.assert_array_equal(np.diagonal(tb), np.diagonal(t)[stable])


@pytest.mark.parametrize("order", schur.SCHUR_ORDERS)
def test_schur_forms_switch_to_blocked_moves_from_the_threshold(order: str, rng: np.random.Generator,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    M = np.eye(40) + 0.6 * rng.standard_normal((40, 40)) / np.sqrt(40)
    unblocked = schur.schur_form(M, order)
    monkeypatch.setattr(schur, "BLOCKED_FROM", 16)
    blocked = schur.schur_form(M, order)
    _check_form(M, blocked.t, blocked.q)
    np.testing.assert_array_equal(blocked.eigenvalues, unblocked.eigenvalues)
    np.testing.assert_allclose(blocked.normal_part, unblocked.normal_part, atol=1e-11)


def test_bad_window() -> None:
    t = np.eye(4, dtype=complex, order="F")
    with pytest.raises(InputError, match="nb"):
        select_leading(t, t.copy(order="F"), np.ones(4, bool), window=4, nb=4)
