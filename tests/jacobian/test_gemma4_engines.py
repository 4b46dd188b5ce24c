"""The Jacobian engines on a tiny random Gemma 4 (three sub-layers a layer, a layer scalar,
values through a scale-free norm and from the key projection, shared keys and values, per-layer
inputs), against autograd through the Hugging Face modules in float64:

- ``isolated``: the one-token decoder layer itself (shared layers given the keys and values
  their source layer computes from the token's own pre-attention state there);
- ``in_context``: the model's own forward pass with one position of the layer's input
  replaced, every other position held fixed;
- ``isolated_observed`` (and the token-wise sub-layers of ``in_context``): the MLP and the
  per-layer-input update written out from the layer's modules at the observed states.

Integration tier: models are built in code, no download.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd.functional import jacobian

from depthlens.errors import InputError
from depthlens.jacobian.sublayer import input_state, kv_state, sublayer_jacobian_sum, sublayer_jacobians
from depthlens.models import adapter_for, build_random
from depthlens.models.float64 import Float64Mode, double_copy

from ..models.test_gemma4 import _perturbed

B, T = 2, 9
TOKENS = [(0, T - 1), (1, 3)]
ATOL = 1e-10


@pytest.fixture(scope="module", params=[None, "attention_bias=true"], ids=["default", "biases"])
def setup(request):
    """The perturbed tiny model (norm weights, scalars and, with ``attention_bias``, the
    projections' biases all away from their initial values), its float64 states and per-layer inputs."""
    model = double_copy(_perturbed(build_random("gemma4", request.param, seed=1))).eval()
    ad = adapter_for(model)
    ids = torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(3))
    with Float64Mode(), torch.no_grad():
        states, inputs = ad.residual_states(ids), ad.per_layer_inputs(ids)
    return model, ad, ids, states, inputs


def _engine(ad, states, inputs, layer, kind, mode, b, t):
    """The engine's operator of ``kind`` at token ``(b, t)``."""
    kv = kv_state(ad, layer, kind, mode)
    return sublayer_jacobians(ad, states[input_state(ad, layer, kind, mode)][b : b + 1], layer, kind, mode, t,
                              kv=None if kv is None else states[kv][b : b + 1],
                              layer_input=inputs[b : b + 1, :, layer] if kind == "ple" else None)[0]


def _boundary_jacobians(f, x, handles):
    """d(pre_mlp, pre_ple, output)/dx of ``f(x) -> (g, r, out)``, each (d, d), in float64; the
    hooks of ``handles`` are removed after."""
    try:
        with Float64Mode():
            J = jacobian(lambda y: torch.cat(f(y)), x)
    finally:
        for h in handles:
            h.remove()
    return J.split(x.shape[0])


def _check_cumulative(ad, states, inputs, layer, mode, b, t, oracle) -> None:
    """The engine's products (:func:`_cumulative`) against the oracle's boundary Jacobians."""
    for got, want, what in zip(_cumulative(ad, states, inputs, layer, mode, b, t), oracle,
                               ("attn", "mlp attn", "ple mlp attn")):
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL, msg=f"layer {layer} {mode} {what} at {(b, t)}")


def _captured(layer_module, store):
    """Hooks keeping the pre-MLP and pre-per-layer-input states of a decoder layer's pass."""
    return [layer_module.pre_feedforward_layernorm.register_forward_pre_hook(lambda m, a: store.__setitem__("g", a[0])),
            layer_module.per_layer_input_gate.register_forward_pre_hook(lambda m, a: store.__setitem__("r", a[0]))]


def _cumulative(ad, states, inputs, layer, mode, b, t):
    """The engine's products ``J_attn``, ``J_mlp J_attn``, ``J_ple J_mlp J_attn`` (scalar included)."""
    Ja, Jm, Jp = (_engine(ad, states, inputs, layer, k, mode, b, t) for k in ("attn", "mlp", "ple"))
    return Ja, Jm @ Ja, Jp @ Jm @ Ja


def test_per_layer_inputs_are_what_each_layer_receives(setup) -> None:
    model, ad, ids, _, inputs = setup
    seen = {}
    handles = [layer.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[1].clone()))
               for i, layer in enumerate(model.model.layers)]
    try:
        with Float64Mode(), torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    assert inputs.shape == (B, T, 6, 8) and ad.per_layer_width == 8
    for i in range(6):
        torch.testing.assert_close(inputs[:, :, i], seen[i], rtol=0, atol=0)


@pytest.mark.parametrize("layer", range(6))
def test_isolated_block_is_the_one_token_decoder_layer(setup, layer) -> None:
    model, ad, _, states, inputs = setup
    block, source = model.model.layers[layer], ad.kv_source(layer)
    kind = model.config.layer_types[layer]
    for b, t in TOKENS:
        x, p = states[3 * layer][b, t], inputs[b, t, layer]
        shared = {}
        with Float64Mode(), torch.no_grad():
            pe = model.model.rotary_emb(x[None, None], torch.zeros(1, 1, dtype=torch.long), kind)
            if source != layer:  # the source layer's keys and values of the token's own state there
                model.model.layers[source](states[3 * source][b, t][None, None].clone(), inputs[b, t, source][None, None],
                                           shared_kv_states=shared, position_embeddings=pe, attention_mask=None)
                assert kind in shared
        store = {}

        def f(y):
            out = block(y[None, None], p[None, None], shared_kv_states=dict(shared), position_embeddings=pe,
                        attention_mask=None)
            return store["g"][0, 0], store["r"][0, 0], out[0, 0]

        oracle = _boundary_jacobians(f, x.clone(), _captured(block, store))
        _check_cumulative(ad, states, inputs, layer, "isolated", b, t, oracle)
        if source != layer:  # the one-token update does not depend on the token's state here
            assert torch.equal(_engine(ad, states, inputs, layer, "attn", "isolated", b, t), torch.eye(64, dtype=torch.float64))


@pytest.mark.parametrize("layer", range(6))
def test_in_context_operators_are_the_models_own_pass(setup, layer) -> None:
    """The diagonal block d(boundary)_t / d(pre-attention)_t of the model's forward pass with
    row t of the layer's input replaced: the in-context attention, then the token-wise MLP and
    per-layer-input operators at the observed states (shared layers vary through the query only)."""
    model, ad, ids, states, inputs = setup
    block = model.model.layers[layer]
    for b, t in TOKENS:
        store = {}

        def replace(module, args, kwargs):
            h = args[0].clone()
            h[0, t] = store["x"]
            return (h, *args[1:]), kwargs

        def f(y):
            store["x"] = y
            model(ids[b : b + 1])
            return store["g"][0, t], store["r"][0, t], store["out"][0, t]

        handles = [*_captured(block, store), block.register_forward_pre_hook(replace, with_kwargs=True),
                   block.register_forward_hook(lambda m, a, out: store.__setitem__("out", out))]
        oracle = _boundary_jacobians(f, states[3 * layer][b, t].clone(), handles)
        _check_cumulative(ad, states, inputs, layer, "in_context", b, t, oracle)


@pytest.mark.parametrize("layer", [0, 5])
def test_observed_mlp_and_per_layer_input_operators(setup, layer) -> None:
    model, ad, _, states, inputs = setup
    block = model.model.layers[layer]
    for b, t in TOKENS:
        g, r, p = states[3 * layer + 1][b, t], states[3 * layer + 2][b, t], inputs[b, t, layer]
        with Float64Mode():
            mlp = jacobian(lambda y: y + block.post_feedforward_layernorm(block.mlp(block.pre_feedforward_layernorm(y))), g)
            ple = jacobian(lambda y: block.layer_scalar * (y + block.post_per_layer_input_norm(
                block.per_layer_projection(block.act_fn(block.per_layer_input_gate(y)) * p))), r)
        for mode in ("isolated_observed", "in_context"):
            torch.testing.assert_close(_engine(ad, states, inputs, layer, "mlp", mode, b, t), mlp, rtol=0, atol=ATOL)
            torch.testing.assert_close(_engine(ad, states, inputs, layer, "ple", mode, b, t), ple, rtol=0, atol=ATOL)


@pytest.mark.parametrize("mode", ["isolated", "isolated_observed", "in_context"])
def test_sums_equal_the_summed_operators(setup, mode) -> None:
    """The factored sums (the layer scalar applied to the whole sum) against the dense stacks."""
    _, ad, _, states, inputs = setup
    for layer in (1, 4, 5):
        for kind in ad.sublayers:
            kv = kv_state(ad, layer, kind, mode)
            args = dict(kv=None if kv is None else states[kv], layer_input=inputs[:, :, layer] if kind == "ple" else None)
            r = states[input_state(ad, layer, kind, mode)]
            total, n = sublayer_jacobian_sum(ad, r, layer, kind, mode, "all", **args)
            dense = sublayer_jacobians(ad, r, layer, kind, mode, "all", **args)
            assert n == B * T
            torch.testing.assert_close(total, dense.sum(0), rtol=1e-12, atol=1e-10)


def test_missing_or_misshaped_extra_inputs_are_refused_in_one_line(setup) -> None:
    _, ad, _, states, inputs = setup
    with pytest.raises(InputError, match=r"layer_input .* per_layer_inputs\(ids\)\[:, :, 2\]") as err:
        sublayer_jacobians(ad, states[8], 2, "ple", "isolated_observed")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match=r"kv .* layer 2.* residual_states\(ids\)\[6\]"):
        sublayer_jacobians(ad, states[12], 4, "attn", "in_context")
    with pytest.raises(InputError, match="kv .*shape"):
        sublayer_jacobians(ad, states[12], 4, "mlp", "isolated", kv=states[6][:, :3])
    with pytest.raises(InputError, match="layer_input .*shape"):
        sublayer_jacobians(ad, states[8], 2, "ple", "isolated_observed", layer_input=inputs[:, :, 2, :4])
    llama = adapter_for(build_random("llama"))
    with pytest.raises(InputError, match=r"llama layers have no 'ple' sub-layer"):
        sublayer_jacobians(llama, torch.zeros(1, 4, llama.d_model), 0, "ple")
    assert kv_state(ad, 4, "attn", "isolated") is None and kv_state(ad, 4, "attn", "in_context") == 6
    assert kv_state(ad, 5, "ple", "isolated") == 9 and kv_state(ad, 5, "ple", "in_context") is None
    assert [input_state(ad, 2, k, "in_context") for k in ad.sublayers] == [6, 7, 8]
    assert [input_state(ad, 2, k, "isolated") for k in ad.sublayers] == [6, 6, 6]


def test_the_jacobian_and_topology_stages_on_gemma4(tmp_path) -> None:
    """Every mode's saved mean operators (the funnel's mode through the per-chunk sums of the
    bootstrap, the others through the batched sums) against the mean of the engine's dense
    operators at each chunk's last token; layer operators are the three sub-layers' product.
    The topology stage couples boundary ``b`` (three a layer) with operator ``b``."""
    from safetensors.numpy import load_file

    import depthlens
    from depthlens.topology import amplification
    from depthlens.workflow import prepare

    run = depthlens.analyse("random:gemma4", out=tmp_path / "run", preset="quick", stages=["topology"], chunks=3,
                            seq_len=12, jacobian_mode="all", funnel_boot=2, save_arrays="float64", skip_positions=1)
    assert {name: r["status"] for name, r in run.manifest["stages"].items()} == {"jacobian": "done", "topology": "done"}
    ops = run.table("operators")
    assert list(ops.loc[(ops["jacobian_mode"] == "in_context") & (ops["layer"] == 4), "sublayer"]) == [
        "attn", "mlp", "ple", "layer"]
    assert len(run.table("funnel_boot")) == 3
    prepared = prepare(run.config)
    ad, ids = prepared.loaded.adapter, prepared.token_ids
    with Float64Mode(), torch.no_grad():
        states, inputs = ad.residual_states(ids), ad.per_layer_inputs(ids)
    for mode in ("isolated", "isolated_observed", "in_context"):
        saved = load_file(str(tmp_path / "run" / "arrays" / f"jacobians_trained_{mode}.safetensors"))
        for layer in range(6):
            mean = {}
            for kind in ad.sublayers:
                kv = kv_state(ad, layer, kind, mode)
                mean[kind] = sublayer_jacobians(
                    ad, states[input_state(ad, layer, kind, mode)], layer, kind, mode, "last",
                    kv=None if kv is None else states[kv],
                    layer_input=inputs[:, :, layer] if kind == "ple" else None).mean(0).numpy()
                np.testing.assert_allclose(saved[f"{layer}.{kind}"], mean[kind], rtol=0, atol=1e-12)
            np.testing.assert_allclose(saved[f"{layer}.layer"], mean["ple"] @ mean["mlp"] @ mean["attn"], rtol=0,
                                       atol=1e-12)
    topo = run.config.options("topology")
    saved = load_file(str(tmp_path / "run" / "arrays" / f"jacobians_trained_{topo.jacobian_mode}.safetensors"))
    coupling, nodes = run.table("coupling"), run.table("nodes")
    assert list(zip(coupling["layer"], coupling["sublayer"])) == [(layer, kind) for layer in range(6)
                                                                   for kind in ("attn", "mlp", "ple")]
    for b, group in nodes.groupby("boundary_index"):
        J = saved[f"{b // 3}.{('attn', 'mlp', 'ple')[b % 3]}"]
        np.testing.assert_allclose(group["amplification"], amplification(J, topo.amplification)[group["dim"]],
                                   rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["isolated", "in_context"])
def test_prompts_of_their_own_lengths(setup, mode) -> None:
    """Chunks read at their own positions (a prompts file): the batched means and the per-chunk
    sums, which gather each token's per-layer input and key source beside its residual, against
    the engine on each chunk alone."""
    from depthlens.jacobian import chunk_operator_sums, mean_operators

    _, ad, ids, states, inputs = setup
    own = [[2, 5], [T - 1]]
    with Float64Mode():  # the states of the setup's float64 pass
        means = mean_operators(ad, ids, mode, chunk_positions=own, batch_size=2)
        sums = {key: (S, n) for key, S, n in chunk_operator_sums(ad, ids, [(5, "ple"), (4, "attn"), (4, "mlp")], mode,
                                                                   chunk_positions=own)}
    for layer, kind in [(4, "attn"), (4, "mlp"), (5, "ple")]:
        per_chunk = [_engine_sum(ad, states, inputs, layer, kind, mode, b, pos) for b, pos in enumerate(own)]
        torch.testing.assert_close(torch.as_tensor(means[(layer, kind)]), sum(per_chunk) / 3, rtol=0, atol=1e-12)
        S, n = sums[(layer, kind)]
        assert list(n) == [2, 1]
        for b in range(2):
            torch.testing.assert_close(torch.as_tensor(S[b]), per_chunk[b], rtol=0, atol=1e-12)


def _engine_sum(ad, states, inputs, layer, kind, mode, b, positions):
    """The dense operators of ``kind`` summed over ``positions`` of chunk ``b`` alone."""
    kv = kv_state(ad, layer, kind, mode)
    return sublayer_jacobians(ad, states[input_state(ad, layer, kind, mode)][b : b + 1], layer, kind, mode, positions,
                              kv=None if kv is None else states[kv][b : b + 1],
                              layer_input=inputs[b : b + 1, :, layer] if kind == "ple" else None).sum(0)


def test_without_per_layer_inputs_the_mlp_carries_the_layer_scalar() -> None:
    """A Gemma 4 without per-layer inputs (as the 31B): two sub-layers a layer, the MLP's operator
    times the layer scalar, the one-token block's Jacobian their product."""
    model = double_copy(_perturbed(build_random("gemma4", "hidden_size_per_layer_input=0", seed=2))).eval()
    ad = adapter_for(model)
    assert ad.sublayers == ("attn", "mlp") and ad.boundaries == ("pre_attn", "pre_mlp") and ad.per_layer_width == 0
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(4))
    with Float64Mode(), torch.no_grad():
        states = ad.residual_states(ids)
    assert ad.per_layer_inputs(ids) is None and states.shape[0] == 2 * 6 + 1
    for layer in (0, 3):
        x, block = states[2 * layer][0, -1], model.model.layers[layer]
        pe = model.model.rotary_emb(x[None, None], torch.zeros(1, 1, dtype=torch.long), model.config.layer_types[layer])
        with Float64Mode():
            oracle = jacobian(lambda y: block(y[None, None], None, shared_kv_states={}, position_embeddings=pe,
                                              attention_mask=None)[0, 0], x.clone())
        Ja, Jm = (sublayer_jacobians(ad, states[2 * layer], layer, kind, "isolated", -1)[0] for kind in ("attn", "mlp"))
        torch.testing.assert_close(Jm @ Ja, oracle, rtol=0, atol=ATOL)
        assert float(block.layer_scalar) != 1.0
