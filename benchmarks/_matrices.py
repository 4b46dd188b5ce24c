"""Realistic causal attention matrices for the benchmarks (shared by the bench scripts).

Kinds follow ``notes/kreiss.md``: ``sink`` (mass on the first token), ``sink+prev``,
``prev`` (previous-token head) and ``plain`` (random logits). Each is a float64 masked
softmax of Gaussian logits with the given biases; ``deflated`` returns ``B = A − 1e₁ᵀ``.
"""

from __future__ import annotations

import numpy as np

KINDS: dict[str, dict[str, float]] = {
    "sink": {"sink": 4.0, "prev": 0.0, "scale": 1.5},
    "sink+prev": {"sink": 3.0, "prev": 3.0, "scale": 1.5},
    "prev": {"sink": 0.0, "prev": 4.0, "scale": 1.5},
    "plain": {"sink": 0.0, "prev": 0.0, "scale": 2.0},
}


def causal_attention(n: int, rng: np.random.Generator, *, sink: float = 0.0, prev: float = 0.0, scale: float = 1.0) -> np.ndarray:
    """Lower-triangular row-stochastic ``(n, n)`` float64 matrix: masked softmax of logits."""
    logits = scale * rng.standard_normal((n, n))
    logits[:, 0] += sink
    idx = np.arange(1, n)
    logits[idx, idx - 1] += prev
    logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    return w / w.sum(axis=1, keepdims=True)


def deflated(A: np.ndarray) -> np.ndarray:
    """Perron deflation ``B = A − P`` with ``P = 1e₁ᵀ``."""
    B = A.copy()
    B[:, 0] -= 1.0
    return B


def heads(n: int, per_kind: int, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """``per_kind`` deflated heads of every kind, as ``(kind, B)`` pairs."""
    rng = np.random.default_rng(seed)
    return [(kind, deflated(causal_attention(n, rng, **kw))) for kind, kw in KINDS.items() for _ in range(per_kind)]
