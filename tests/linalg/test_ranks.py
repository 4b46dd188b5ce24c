"""Effective ranks and singular-subspace alignment (METHODS B2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ortho_group

from depthlens.errors import InputError
from depthlens.linalg.ranks import erank, erank_sigma, participation_ratio, self_alignment, stable_rank

RANKS = [erank, erank_sigma, participation_ratio, stable_rank]


@pytest.mark.parametrize("fn", RANKS)
@pytest.mark.parametrize("d", [1, 5, 64])
def test_identity_has_full_rank(fn, d: int) -> None:  # type: ignore[no-untyped-def]
    assert fn(np.eye(d)) == pytest.approx(d, rel=1e-13)
    if d > 1:  # any scaled orthogonal matrix has all singular values equal
        assert fn(3.0 * ortho_group.rvs(d, random_state=d)) == pytest.approx(d, rel=1e-10)


@pytest.mark.parametrize("fn", RANKS)
def test_rank_one_and_singular_value_input(fn, rng: np.random.Generator) -> None:  # type: ignore[no-untyped-def]
    u, v = rng.standard_normal(6), rng.standard_normal(6)
    assert fn(np.outer(u, v)) == pytest.approx(1.0, rel=1e-10)
    M = rng.standard_normal((6, 6))
    sv = np.linalg.svd(M, compute_uv=False)
    assert fn(M) == pytest.approx(fn(sv[::-1]), rel=1e-13)


def test_closed_forms() -> None:
    sv = np.array([2.0, 1.0, 0.0])
    p2 = np.array([0.8, 0.2])
    assert erank(sv) == pytest.approx(np.exp(-np.sum(p2 * np.log(p2))), rel=1e-14)
    p1 = np.array([2 / 3, 1 / 3])
    assert erank_sigma(sv) == pytest.approx(np.exp(-np.sum(p1 * np.log(p1))), rel=1e-14)
    assert participation_ratio(sv) == pytest.approx(25 / 17, rel=1e-14)
    assert stable_rank(sv) == pytest.approx(5 / 4, rel=1e-14)
    assert participation_ratio([1e200, 1e200]) == pytest.approx(2.0, rel=1e-14)  # no overflow


def test_batched(rng: np.random.Generator) -> None:
    stack = rng.standard_normal((2, 3, 5, 5))
    for fn in RANKS:
        out = fn(stack)
        assert out.shape == (2, 3)
        assert out[1, 0] == pytest.approx(fn(stack[1, 0]), rel=1e-14)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 9), scale=st.floats(1e-100, 1e100))
def test_rank_bounds_and_scale_invariance(seed: int, n: int, scale: float) -> None:
    M = np.random.default_rng(seed).standard_normal((n, n))
    for fn in RANKS:
        r = fn(M)
        assert 1 - 1e-12 <= r <= n + 1e-12
        assert fn(scale * M) == pytest.approx(r, rel=1e-10)


def test_rank_errors() -> None:
    with pytest.raises(InputError, match=r"batch index \(1,\) is zero"):
        erank(np.array([np.eye(2), np.zeros((2, 2))]))
    with pytest.raises(InputError, match="every singular value is zero"):
        stable_rank([0.0, 0.0])
    with pytest.raises(InputError, match="non-negative"):
        participation_ratio([1.0, -1.0])
    with pytest.raises(InputError, match="non-negative"):
        erank([])


def test_self_alignment_symmetric_psd(rng: np.random.Generator) -> None:
    X = rng.standard_normal((8, 8))
    S = X @ X.T + 0.1 * np.eye(8)
    for k in (1, 3, 8):
        assert self_alignment(S, k) == pytest.approx(1.0, rel=1e-12)


def test_self_alignment_closed_forms(rng: np.random.Generator) -> None:
    M = np.array([[0.0, 2.0], [1.0, 0.0]])  # top mode: input e_2, output e_1
    assert self_alignment(M, 1) == pytest.approx(0.0, abs=1e-15)
    assert self_alignment(M, 2) == pytest.approx(1.0, rel=1e-14)
    X = rng.standard_normal((6, 6)) + 1j * rng.standard_normal((6, 6))
    U, _, Vh = np.linalg.svd(X)
    want = np.linalg.norm(U[:, :3].conj().T @ Vh[:3].conj().T) ** 2 / 3
    assert self_alignment(X, 3) == pytest.approx(want, rel=1e-12)
    assert self_alignment(np.array([M, np.eye(2)]), 1).shape == (2,)


@pytest.mark.parametrize("k", [0, 3, 1.5])
def test_self_alignment_rejects_bad_k(k: object) -> None:
    with pytest.raises(InputError, match="k is"):
        self_alignment(np.eye(2), k)  # type: ignore[arg-type]
