"""Pattern features against brute-force Python loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from depthlens.attention.patterns import prev_weight, row_entropy, sink_mass
from depthlens.errors import InputError


def _causal_softmax(rng: np.random.Generator, shape: tuple[int, ...], n: int) -> np.ndarray:
    logits = rng.normal(size=(*shape, n, n)) * 2.0
    logits[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _loops(A: np.ndarray) -> tuple[float, float, float]:
    n = A.shape[0]
    sink = sum(A[i, 0] for i in range(1, n)) / (n - 1)
    prev = sum(A[i, i - 1] for i in range(1, n)) / (n - 1)
    ent = sum(-sum(p * math.log(p) for p in A[i] if p > 0) for i in range(n)) / n
    return sink, prev, ent


def test_features_match_loops(rng: np.random.Generator) -> None:
    A = _causal_softmax(rng, (3, 2), 9)
    A[0, 0, 4] = 0.0
    A[0, 0, 4, 2] = 1.0  # a row with exact zeros exercises 0 log 0
    got = np.stack([sink_mass(A), prev_weight(A), row_entropy(A)], axis=-1)
    assert got.shape == (3, 2, 3)
    for idx in np.ndindex(3, 2):
        np.testing.assert_allclose(got[idx], _loops(A[idx]), rtol=1e-13, atol=1e-15)


def test_closed_forms() -> None:
    n = 6
    P = np.zeros((n, n))
    P[:, 0] = 1.0
    prev = np.eye(n, k=-1)
    prev[0, 0] = 1.0
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    assert sink_mass(P) == 1.0 and prev_weight(P) == pytest.approx(1 / (n - 1))
    assert prev_weight(prev) == 1.0 and row_entropy(prev) == 0.0
    assert row_entropy(uniform) == pytest.approx(sum(math.log(i) for i in range(1, n + 1)) / n, rel=1e-14)


def test_rejects_non_square() -> None:
    with pytest.raises(InputError, match="expected"):
        sink_mass(np.ones((3, 4)))
