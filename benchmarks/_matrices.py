"""Realistic causal attention matrices for the benchmarks (shared by the bench scripts).

Kinds follow ``notes/kreiss.md``: ``sink`` (mass on the first token), ``sink+prev``,
``prev`` (previous-token head) and ``plain`` (random logits). Each is a float64 masked
softmax of Gaussian logits with the given biases (``random_causal_attention``), deflated.
"""

from __future__ import annotations

import numpy as np

from depthlens.linalg.causal import deflate, random_causal_attention

KINDS: dict[str, dict[str, float]] = {
    "sink": {"sink": 4.0, "prev": 0.0, "scale": 1.5},
    "sink+prev": {"sink": 3.0, "prev": 3.0, "scale": 1.5},
    "prev": {"sink": 0.0, "prev": 4.0, "scale": 1.5},
    "plain": {"sink": 0.0, "prev": 0.0, "scale": 2.0},
}


def heads(n: int, per_kind: int, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """``per_kind`` deflated heads of every kind, as ``(kind, B)`` pairs."""
    rng = np.random.default_rng(seed)
    return [(kind, deflate(random_causal_attention(n, rng, **kw))) for kind, kw in KINDS.items() for _ in range(per_kind)]
