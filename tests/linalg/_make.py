"""Random test operators for the linalg tests."""

from __future__ import annotations

import numpy as np


def causal_softmax(n: int, rng: np.random.Generator, *, sink: float = 0.0, prev: float = 0.0, scale: float = 1.0) -> np.ndarray:
    """A float64 (n, n) causal attention matrix: masked softmax of random logits.

    Logits are ``scale`` times standard normals; ``sink`` is added to the logits of column 1
    (the first token) and ``prev`` to the sub-diagonal (previous token). The result is lower
    triangular, non-negative and row-stochastic, with every diagonal entry below 1 for n ≥ 2.
    """
    logits = scale * rng.standard_normal((n, n))
    logits[:, 0] += sink
    idx = np.arange(1, n)
    logits[idx, idx - 1] += prev
    logits = np.where(np.tril(np.ones((n, n), dtype=bool)), logits, -np.inf)
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)
