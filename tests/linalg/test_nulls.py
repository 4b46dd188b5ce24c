"""Matched shuffle nulls (METHODS A4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.errors import InputError
from depthlens.linalg.nulls import NULL_MODES, shuffle_null

from ._make import causal_softmax


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), mode=st.sampled_from(NULL_MODES))
def test_preserves_rows_and_support(seed: int, n: int, mode: str) -> None:
    rng = np.random.default_rng(seed)
    A = causal_softmax(n, rng, sink=1.0, scale=2.0)
    S = shuffle_null(A, mode, 4, rng=rng)
    assert S.shape == (4, n, n) and S.dtype == np.float64
    np.testing.assert_array_equal(np.triu(S, 1), 0)
    np.testing.assert_array_equal(np.sort(S, axis=-1), np.broadcast_to(np.sort(A, axis=-1), S.shape))
    np.testing.assert_allclose(S.sum(axis=-1), 1.0, atol=1e-14)


def test_fixed_positions(rng: np.random.Generator) -> None:
    n = 10
    A = causal_softmax(n, rng, sink=1.0)
    diag = np.diagonal(A)
    sink = shuffle_null(A, "sink", 8, rng=rng)
    np.testing.assert_array_equal(sink[..., 0], np.broadcast_to(A[:, 0], (8, n)))
    spec = shuffle_null(A, "spec", 8, rng=rng)
    np.testing.assert_array_equal(spec[..., 0], np.broadcast_to(A[:, 0], (8, n)))
    np.testing.assert_array_equal(np.diagonal(spec, axis1=-2, axis2=-1), np.broadcast_to(diag, (8, n)))
    # spec keeps the spectrum of A and of B exactly (triangular, same diagonal).
    assert not np.array_equal(spec[0], A)


def test_modes_move_what_they_may(rng: np.random.Generator) -> None:
    A = causal_softmax(12, rng, scale=3.0)
    full = shuffle_null(A, "full", 64, rng=rng)
    sink = shuffle_null(A, "sink", 64, rng=rng)
    assert np.any(full[..., 0] != A[:, 0])
    assert np.any(np.diagonal(sink, axis1=-2, axis2=-1) != np.diagonal(A))


def test_full_mode_is_uniform_over_permutations() -> None:
    # Row 3 (0-based 2) has 3 positions: each value should land in each position 1/3 of the time.
    A = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    S = shuffle_null(A, "full", 6000, rng=np.random.default_rng(7))
    for j in range(3):
        freq = np.mean(S[:, 2, :] == A[2, j], axis=0)
        np.testing.assert_allclose(freq, 1 / 3, atol=0.03)


def test_batched_input(rng: np.random.Generator) -> None:
    A = np.array([[causal_softmax(6, rng) for _ in range(3)] for _ in range(2)])
    S = shuffle_null(A, "spec", 5, rng=rng)
    assert S.shape == (5, 2, 3, 6, 6)
    np.testing.assert_array_equal(np.sort(S[4, 1, 2], axis=-1), np.sort(A[1, 2], axis=-1))


def test_seeded_determinism(rng: np.random.Generator) -> None:
    A = causal_softmax(16, rng)
    a = shuffle_null(A, "spec", 3, rng=np.random.default_rng(1))
    b = shuffle_null(A, "spec", 3, rng=np.random.default_rng(1))
    c = shuffle_null(A, "spec", 3, rng=np.random.default_rng(2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_errors(rng: np.random.Generator) -> None:
    A = causal_softmax(4, rng)
    with pytest.raises(InputError, match="mode"):
        shuffle_null(A, "rows", rng=rng)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="n_samples"):
        shuffle_null(A, "spec", 0, rng=rng)
    with pytest.raises(InputError, match="Generator"):
        shuffle_null(A, "spec", 2, rng=0)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="row-stochastic"):
        shuffle_null(A.T, "spec", 2, rng=rng)
