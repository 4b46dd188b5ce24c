"""Depth products of per-layer attention operators and their eigenvalue predictions
(§A6), as tables.

Per layer one operator per kind: ``mean`` (head mean, the default), ``rollout`` (½(Ā + I))
and ``chain_<role>`` (one chosen head per layer, e.g. the most routing-like head). The
surviving deviation ``D_{1→b} = B_b ⋯ B_1`` is compared with the eigenvalue predictions
``E1`` (exact spectral radius of D, from the diagonals) and ``E2 = Π ρ(B_l)``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..linalg.causal import depth_product, eig_gap, eig_predictions, mean_operator, rollout_operator


def layer_operators(probs: np.ndarray, chain_heads: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The operators of one layer from its per-head attention matrices.

    Parameters
    ----------
    probs : ndarray, shape (..., H, n, n)
        Attention matrices of every head of one layer (float64).
    chain_heads : mapping
        ``{name: head}``: the head that each ``chain_<name>`` operator uses at this layer.

    Returns
    -------
    dict of ndarray, each (..., n, n)
        ``mean``, ``rollout`` and ``chain_<name>`` for every name.
    """
    mean = mean_operator(probs)
    ops = {"mean": mean, "rollout": rollout_operator(mean)}
    for name, head in chain_heads.items():
        ops[f"chain_{name}"] = np.asarray(probs[..., head, :, :], dtype=np.float64)
    return ops


def depth_table(stack: np.ndarray) -> pd.DataFrame:
    """Deviation norms and eigenvalue predictions at every depth of a product.

    Parameters
    ----------
    stack : ndarray, shape (L, ..., n, n)
        Per-layer causal stochastic operators, layer 1 first; leading batch axes after L
        (e.g. null samples, chunks) are flattened in C order into the ``item`` column.

    Returns
    -------
    DataFrame
        One row per (item, depth b = 1..L): ``norm_D`` = ‖B_b ⋯ B_1‖ (exact to float64
        matmul rounding), ``e1``, ``e2`` (predictions for the same partial product),
        ``gap_e1``, ``gap_e2`` = log10(‖D‖ / E) (``+inf`` where a prediction underflows to 0).
    """
    arr = np.asarray(stack, dtype=np.float64)
    n_layers = arr.shape[0]
    batch = arr.shape[1:-2]
    profile = depth_product(arr).profile.reshape(n_layers, -1)
    preds = eig_predictions(arr, profile=True)
    e1, e2 = preds.e1.reshape(n_layers, -1), preds.e2.reshape(n_layers, -1)
    n_items = int(np.prod(batch)) if batch else 1
    return pd.DataFrame(
        {
            "item": np.tile(np.arange(n_items), n_layers),
            "depth": np.repeat(np.arange(1, n_layers + 1), n_items),
            "norm_D": profile.reshape(-1),
            "e1": e1.reshape(-1),
            "e2": e2.reshape(-1),
            "gap_e1": eig_gap(profile, e1).reshape(-1),
            "gap_e2": eig_gap(profile, e2).reshape(-1),
        }
    )
