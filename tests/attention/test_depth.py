"""Depth tables against dense products and dense eigenvalues."""

from __future__ import annotations

import numpy as np
import pytest

from depthlens.attention.depth import depth_table, layer_operators


def _causal_softmax(rng: np.random.Generator, shape: tuple[int, ...], n: int) -> np.ndarray:
    logits = rng.normal(size=(*shape, n, n)) * 2.0
    logits = np.where(np.tril(np.ones((n, n), bool)), logits, -np.inf)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_layer_operators(rng: np.random.Generator) -> None:
    probs = _causal_softmax(rng, (2, 3), 5)
    ops = layer_operators(probs, {"routing": 2})
    np.testing.assert_allclose(ops["mean"], probs.mean(axis=1))
    np.testing.assert_allclose(ops["rollout"], 0.5 * (probs.mean(axis=1) + np.eye(5)))
    np.testing.assert_array_equal(ops["chain_routing"], probs[:, 2])


def test_depth_table_against_dense(rng: np.random.Generator) -> None:
    L, n = 4, 6
    stack = _causal_softmax(rng, (L, 3), n)  # 3 items
    table = depth_table(stack)
    assert len(table) == L * 3
    P = np.zeros((n, n))
    P[:, 0] = 1
    for item in range(3):
        prod = np.eye(n)
        for b in range(L):
            prod = stack[b, item] @ prod
            row = table[(table["item"] == item) & (table["depth"] == b + 1)].iloc[0]
            D = prod - P
            assert row["norm_D"] == pytest.approx(np.linalg.norm(D, 2), rel=1e-10)
            assert row["e1"] == pytest.approx(np.abs(np.linalg.eigvals(D)).max(), rel=1e-8, abs=1e-14)
            e2 = np.prod([stack[l, item].diagonal()[1:].max() for l in range(b + 1)])
            assert row["e2"] == pytest.approx(e2, rel=1e-13)
            assert row["gap_e1"] == pytest.approx(np.log10(row["norm_D"] / row["e1"]), rel=1e-12)


def test_previous_token_chain_has_infinite_gap() -> None:
    """An exact previous-token chain: B nilpotent (E = 0) yet ‖D‖ = √(n − L) > 0."""
    n, L = 8, 3
    A = np.eye(n, k=-1)
    A[0, 0] = 1.0
    table = depth_table(np.stack([A] * L))
    assert table["norm_D"].tolist() == pytest.approx([np.sqrt(n - b) for b in range(1, L + 1)], rel=1e-12)
    assert (table["e1"] == 0).all() and np.isinf(table["gap_e1"]).all()
