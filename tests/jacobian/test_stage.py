"""The jacobian stage's layer operators and depth order, on hand-built operator dicts."""

from __future__ import annotations

import numpy as np

from depthlens.jacobian.store import operator_list, with_layer_operators


def _ops(rng: np.random.Generator, n_layers: int, d: int) -> dict[tuple[int, str], np.ndarray]:
    return {(layer, kind): np.eye(d) + rng.standard_normal((d, d)) / 4 for layer in range(n_layers) for kind in ("mlp", "attn")}


def test_layer_operator_is_the_product_of_the_two_sub_layers(rng: np.random.Generator) -> None:
    ops = _ops(rng, 3, 5)
    out = with_layer_operators(ops, parallel_residual=False)
    assert list(out) == [(layer, kind) for layer in range(3) for kind in ("attn", "mlp", "layer")]
    for layer in range(3):
        want = np.einsum("ij,jk->ik", ops[(layer, "mlp")], ops[(layer, "attn")])
        np.testing.assert_allclose(out[(layer, "layer")], want, rtol=1e-14, atol=1e-14)
        assert out[(layer, "attn")] is ops[(layer, "attn")] and out[(layer, "mlp")] is ops[(layer, "mlp")]


def test_parallel_residual_layer_operator_is_the_sum(rng: np.random.Generator) -> None:
    """h' = h + A(h) + F(h): the layer's Jacobian is attn + mlp − I, not their product."""
    ops = _ops(rng, 2, 4)
    out = with_layer_operators(ops, parallel_residual=True)
    for layer in range(2):
        U = (ops[(layer, "attn")] - np.eye(4)) + (ops[(layer, "mlp")] - np.eye(4))
        np.testing.assert_allclose(out[(layer, "layer")], np.eye(4) + U, rtol=0, atol=1e-15)


def test_operator_list_keeps_sub_layers_in_depth_order(rng: np.random.Generator) -> None:
    ops = with_layer_operators(_ops(rng, 3, 4), parallel_residual=False)
    got = operator_list(ops)
    assert len(got) == 6
    for i, (layer, kind) in enumerate((layer, kind) for layer in range(3) for kind in ("attn", "mlp")):
        assert got[i] is ops[(layer, kind)]
