"""Exact sub-layer Jacobians (METHODS B1) against ``torch.func.jacrev`` of the real sub-layer maps and
central finite differences, on tiny random models of every family and (marked ``real``) SmolLM2.

The references run the adapter's own sub-layer functions on a float64 copy of the model. Hugging
Face RMSNorms and the eager softmax upcast to float32 even in a float64 model, which would cap
the reference at float32 accuracy; :class:`Float64Mode` keeps float64 tensors float64 there. The
rotary buffers stay float32, as the model computes its RoPE angles (the engines use the same).
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

from depthlens.errors import InputError
from depthlens.jacobian.engines import (
    MeanAccumulator,
    input_state,
    mean_operators,
    sublayer_jacobian_sum,
    sublayer_jacobians,
)
from depthlens.models import BLOCK_MAP_FAMILIES, adapter_for, load_model
from depthlens.models.float64 import Float64Mode, double_copy
from depthlens.models.hooks import replace_first_arg

B, T = 2, 6


def _map(ad64, layer: int, kind: str):
    """The sub-layer map with skip: the adapter's ``sublayer``, or ``I + branch`` for the parallel MLP."""
    if kind == "mlp" and ad64.parallel_residual:
        br = ad64.branch(layer, "mlp")
        return lambda x: x + br(x)
    return ad64.sublayer(layer, kind)


def _token_fn(ad64, h: torch.Tensor, layer: int, kind: str, mode: str, t: int):
    """``x -> output at t`` with ``x`` the residual at ``t``: one-token sequence (isolated
    attention, the MLP at its observed state) or the chunk ``h (1, T, d)`` with position ``t``
    replaced (in-context attention)."""
    assert (kind, mode) != ("mlp", "isolated")  # block-internal: see test_isolated_composes_to_the_hf_decoder_layer
    f = _map(ad64, layer, kind)
    if mode != "in_context" or kind == "mlp":
        return lambda x: f(x.view(1, 1, -1))[0, 0]

    def g(x):
        return f(torch.cat([h[:, :t], x.view(1, 1, -1), h[:, t + 1 :]], dim=1))[0, t]

    return g


def reference_jacrev(ad64, r: torch.Tensor, layer: int, kind: str, mode: str, positions: list[int]) -> torch.Tensor:
    out = []
    with Float64Mode():
        for b in range(r.shape[0]):
            h = r[b : b + 1].double()
            for t in positions:
                out.append(torch.func.jacrev(_token_fn(ad64, h, layer, kind, mode, t))(h[0, t]))
    return torch.stack(out)


def reference_fd(ad64, r, layer, kind, mode, b: int, t: int, step: float = 1e-6, columns=None) -> torch.Tensor:
    """Central differences, all perturbed inputs in one batched call; ``columns`` (default all)
    picks the input coordinates differentiated. Returns (d, len(columns))."""
    f = _map(ad64, layer, kind)
    h = r[b : b + 1].double()
    d = h.shape[-1]
    cols = list(range(d)) if columns is None else list(columns)
    E = torch.zeros(len(cols), d, dtype=torch.float64)
    E[torch.arange(len(cols)), cols] = step
    X = h[0, t] + torch.cat([E, -E])  # (2c, d)
    with Float64Mode(), torch.no_grad():
        if mode != "in_context" or kind == "mlp":
            Y = f(X[:, None, :])[:, 0]
        else:
            seqs = h.expand(len(X), -1, -1).clone()
            seqs[:, t] = X
            Y = f(seqs)[:, t]
    return ((Y[: len(cols)] - Y[len(cols) :]) / (2 * step)).T


def rel_update_error(J: torch.Tensor, Jref: torch.Tensor) -> float:
    """max |J - Jref| over max |Jref - I| (relative to the update U, stricter than to J)."""
    eye = torch.eye(J.shape[-1], dtype=torch.float64)
    return float((J.double() - Jref).abs().max() / (Jref - eye).abs().max())


def same_batches_states(ad, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Residual states ``(2L + 1, N, T, d)`` from forward passes over ``batch_size`` chunks at a
    time, the batches :func:`mean_operators` uses, so both sides share their float32 rounding."""
    return torch.cat([ad.residual_states(ids[s : s + batch_size]) for s in range(0, ids.shape[0], batch_size)], dim=1)


@pytest.fixture(scope="module", params=BLOCK_MAP_FAMILIES)
def family_case(request):
    loaded = load_model(f"random:{request.param}")
    ad = loaded.adapter
    ad64 = adapter_for(double_copy(loaded.model))
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 256, (B, T), generator=gen)
    return ad, ad64, ad.residual_states(ids)


CASES = [("attn", "isolated"), ("attn", "in_context"), ("mlp", "isolated_observed")]


@pytest.mark.parametrize("kind,mode", CASES)
def test_matches_jacrev_every_family(family_case, kind, mode):
    ad, ad64, hs = family_case
    for layer in range(ad.n_layers):
        r = hs[input_state(ad, layer, kind, mode)]
        pos = [0, 2, T - 1]
        J = sublayer_jacobians(ad, r, layer, kind, jacobian_mode=mode, positions=pos)
        assert J.shape == (B * len(pos), ad.d_model, ad.d_model) and J.dtype == torch.float64
        Jref = reference_jacrev(ad64, r, layer, kind, mode, pos)
        assert rel_update_error(J, Jref) < 1e-9, (ad.family, layer, kind, mode)


@pytest.mark.parametrize("kind,mode", CASES)
def test_matches_finite_differences_every_family(family_case, kind, mode):
    ad, ad64, hs = family_case
    layer = ad.n_layers - 1
    r = hs[input_state(ad, layer, kind, mode)]
    J = sublayer_jacobians(ad, r, layer, kind, jacobian_mode=mode, positions=[T - 2])
    Jfd = reference_fd(ad64, r, layer, kind, mode, b=1, t=T - 2)
    assert rel_update_error(J[1], Jfd) < 1e-6


def hf_layer_one_token_jacobian(ad64, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Jacobian of the Hugging Face decoder layer module itself on the one-token sequence ``x``
    (d,), by jacrev in float64: the layer is called with the arguments the model gives it in a
    one-token forward pass (position 0), its input replaced by ``x``."""
    captured = {}

    def grab(module, args, kwargs):
        captured["args"], captured["kwargs"] = args, kwargs

    module = ad64.layers[layer]
    handle = module.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with Float64Mode(), torch.no_grad():
            ad64.model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=False)
    finally:
        handle.remove()

    def run(v):
        args, kwargs = replace_first_arg(captured["args"], captured["kwargs"], v.view(1, 1, -1))
        out = module(*args, **kwargs)
        return (out[0] if isinstance(out, tuple) else out)[0, 0]

    with Float64Mode():
        return torch.func.jacrev(run)(x.double())


def test_isolated_composes_to_the_hf_decoder_layer(family_case):
    """The paper's isolated protocol: ``J_mlp J_attn`` (parallel residual: ``J_attn + J_mlp − I``)
    is the Jacobian of the real decoder layer run on the observed pre-attention residual as a
    one-token sequence."""
    ad, ad64, hs = family_case
    eye = torch.eye(ad.d_model, dtype=torch.float64)
    for layer in range(ad.n_layers):
        r = hs[2 * layer]
        assert input_state(ad, layer, "attn", "isolated") == input_state(ad, layer, "mlp", "isolated") == 2 * layer
        Ja = sublayer_jacobians(ad, r, layer, "attn", jacobian_mode="isolated", positions=[1, T - 1])
        Jm = sublayer_jacobians(ad, r, layer, "mlp", jacobian_mode="isolated", positions=[1, T - 1])
        block = Ja + Jm - eye if ad.parallel_residual else Jm @ Ja
        for n, (b, t) in enumerate([(0, 1), (0, T - 1), (1, 1), (1, T - 1)]):
            ref = hf_layer_one_token_jacobian(ad64, layer, r[b, t])
            assert rel_update_error(block[n], ref) < 1e-10, (ad.family, layer, b, t)


def test_isolated_modes_share_attention_and_differ_in_the_mlp(family_case):
    """Attention is the one-token operator in both isolated modes; the MLP differs (it reads the
    block-internal state in ``isolated``) except on parallel-residual models."""
    ad, _, hs = family_case
    for layer in range(ad.n_layers):
        a = sublayer_jacobians(ad, hs[2 * layer], layer, "attn", jacobian_mode="isolated", positions="all")
        b = sublayer_jacobians(ad, hs[2 * layer], layer, "attn", jacobian_mode="isolated_observed", positions="all")
        assert torch.equal(a, b)
        m = sublayer_jacobians(ad, hs[input_state(ad, layer, "mlp", "isolated")], layer, "mlp", positions="all")
        o = sublayer_jacobians(ad, hs[input_state(ad, layer, "mlp", "isolated_observed")], layer, "mlp",
                               jacobian_mode="isolated_observed", positions="all")
        if ad.parallel_residual:
            assert torch.equal(m, o)
        else:
            assert rel_update_error(m, o) > 1e-6


def test_observed_mlp_is_the_same_in_isolated_observed_and_in_context(family_case):
    ad, _, hs = family_case
    r = hs[input_state(ad, 0, "mlp", "in_context")]
    a = sublayer_jacobians(ad, r, 0, "mlp", jacobian_mode="isolated_observed", positions="all")
    b = sublayer_jacobians(ad, r, 0, "mlp", jacobian_mode="in_context", positions="all")
    assert torch.equal(a, b)


def test_sum_matches_stack(family_case):
    ad, _, hs = family_case
    for kind, mode in [*CASES, ("mlp", "isolated")]:
        r = hs[input_state(ad, 0, kind, mode)]
        J = sublayer_jacobians(ad, r, 0, kind, jacobian_mode=mode, positions="all")
        total, n = sublayer_jacobian_sum(ad, r, 0, kind, jacobian_mode=mode, positions="all")
        assert n == B * T
        assert torch.allclose(total, J.sum(0), rtol=0, atol=1e-12 * float(J.abs().max()) * n)


def test_first_position_in_context_equals_isolated(family_case):
    """At t = 0 the only key is the token's own: in-context attention is the one-token map."""
    ad, _, hs = family_case
    r = hs[input_state(ad, 0, "attn")]
    a = sublayer_jacobians(ad, r, 0, "attn", jacobian_mode="isolated", positions=0)
    b = sublayer_jacobians(ad, r, 0, "attn", jacobian_mode="in_context", positions=0)
    assert torch.allclose(a, b, rtol=0, atol=1e-13)


def test_parallel_residual_operators_sum_to_block():
    """GPT-NeoX parallel residual: attn + mlp - I is the block Jacobian (both at the pre-attention state)."""
    loaded = load_model("random:gpt_neox")
    ad = loaded.adapter
    assert ad.parallel_residual
    ad64 = adapter_for(double_copy(loaded.model))
    hs = ad.residual_states(torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(3)))
    assert input_state(ad, 1, "mlp") == 2
    r = hs[2]
    Ja = sublayer_jacobians(ad, r, 1, "attn", jacobian_mode="in_context")
    Jm = sublayer_jacobians(ad, r, 1, "mlp", jacobian_mode="in_context")
    blk = ad64.block(1)
    h = r.double()

    def g(x):
        return blk(torch.cat([h[:, :-1], x.view(1, 1, -1)], dim=1))[0, -1]

    with Float64Mode():
        Jb = torch.func.jacrev(g)(h[0, -1])
    assert rel_update_error(Ja[0] + Jm[0] - torch.eye(ad.d_model, dtype=torch.float64), Jb) < 1e-9


def test_isolated_attention_update_rank_is_bounded_by_kv_width():
    loaded = load_model("random:llama:num_key_value_heads=1")
    ad = loaded.adapter
    kv_width = ad.n_kv_heads * ad.head_dim
    assert kv_width < ad.d_model
    hs = ad.residual_states(torch.randint(0, 256, (3, T), generator=torch.Generator().manual_seed(1)))
    J = sublayer_jacobians(ad, hs[0], 0, "attn", positions="all")
    U = J - torch.eye(ad.d_model, dtype=torch.float64)
    s = torch.linalg.svdvals(U)
    ranks = (s > 1e-10 * s[:, :1]).sum(-1)
    assert int(ranks.max()) <= kv_width
    assert int(ranks.min()) >= kv_width - 1  # generic weights: the bound is attained (up to the norm's null vector)


@pytest.mark.parametrize("family", ["llama", "gemma3", "gpt_neox", "olmo2"])
@pytest.mark.parametrize("mode", ["isolated", "isolated_observed", "in_context"])
def test_mean_operators_equal_mean_of_explicit_stack(family, mode):
    ad = load_model(f"random:{family}").adapter
    ids = torch.randint(0, 256, (5, T), generator=torch.Generator().manual_seed(11))
    means = mean_operators(ad, ids, jacobian_mode=mode, positions="last", batch_size=2)
    assert list(means) == [(layer, kind) for layer in range(ad.n_layers) for kind in ("attn", "mlp")]
    # The reference states come from the same float32 forward passes (batches of 2, as the
    # engine runs them): a float32 forward at batch 5 need not be bit-identical to batch 2
    # (MKL picks its GEMM kernel by shape and CPU: it differs on AMD EPYC, and on Intel under
    # MKL_ENABLE_INSTRUCTIONS=AVX2), which would measure the model's float32 rounding, not the
    # float64 sum under test.
    hs = same_batches_states(ad, ids, 2)
    for (layer, kind), M in means.items():
        stack = sublayer_jacobians(ad, hs[input_state(ad, layer, kind, mode)], layer, kind, jacobian_mode=mode)
        assert stack.shape[0] == 5
        expected = stack.mean(0).numpy()
        assert M.dtype == np.float64
        np.testing.assert_allclose(M, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


def test_mean_operators_all_positions_and_accumulator_resume():
    ad = load_model("random:llama").adapter
    ids = torch.randint(0, 256, (3, T), generator=torch.Generator().manual_seed(5))
    acc = MeanAccumulator()
    mean_operators(ad, ids[:2], jacobian_mode="in_context", positions="all", layers=[1], accumulator=acc)
    means = mean_operators(ad, ids[2:], jacobian_mode="in_context", positions="all", layers=[1], accumulator=acc)
    assert list(means) == [(1, "attn"), (1, "mlp")]
    assert acc.count(1, "attn") == 3 * T
    # The reference states from the same two float32 forward passes (chunks 0-1, then 2) the
    # accumulator saw; one pass over all three need not round the same (see above).
    hs = torch.cat([ad.residual_states(ids[:2]), ad.residual_states(ids[2:])], dim=1)
    stack = sublayer_jacobians(ad, hs[2], 1, "attn", jacobian_mode="in_context", positions="all")
    np.testing.assert_allclose(means[(1, "attn")], stack.mean(0).numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["isolated", "in_context"])
def test_mean_operators_into_memory_maps_equal_the_accumulator(tmp_path, mode):
    """Summed batch by batch into the memory maps of a safetensors file and divided in place:
    the accumulator's numbers bit for bit, and the file reads back the same."""
    from depthlens.runs import atomic

    ad = load_model("random:llama").adapter
    ids = torch.randint(0, 256, (5, T), generator=torch.Generator().manual_seed(3))
    reference = mean_operators(ad, ids, jacobian_mode=mode, positions="all", batch_size=2)
    d = ad.d_model
    store = atomic.create_safetensors(tmp_path / "ops.safetensors", {f"{l}.{k}": (d, d) for l, k in reference},
                                      np.float64)
    out = mean_operators(ad, ids, jacobian_mode=mode, positions="all", batch_size=2,
                         out={(l, k): store[f"{l}.{k}"] for l, k in reference})
    atomic.flush(store)
    back = atomic.map_safetensors(tmp_path / "ops.safetensors")
    for (l, k), M in reference.items():
        assert np.array_equal(out[(l, k)], M) and np.array_equal(back[f"{l}.{k}"], M)
    with pytest.raises(InputError, match="not both"):
        mean_operators(ad, ids, out=out, accumulator=MeanAccumulator())


def test_mean_accumulator_add_merge_and_errors():
    rng = np.random.default_rng(0)
    X = torch.from_numpy(rng.standard_normal((7, 4, 4)))
    a, b = MeanAccumulator(), MeanAccumulator()
    a.add(0, "attn", X[:3])
    b.add(0, "attn", X[3:])
    b.add(2, "mlp", X[0])
    a.merge(b)
    assert a.count(0, "attn") == 7 and a.count(2, "mlp") == 1 and a.keys() == [(0, "attn"), (2, "mlp")]
    np.testing.assert_allclose(a.mean()[(0, "attn")], X.mean(0).numpy(), rtol=0, atol=1e-15)
    with pytest.raises(InputError):
        a.add(0, "attn", torch.zeros(3, 5, 5))
    with pytest.raises(InputError):
        a.add(0, "ffn", X)


def test_float32_engine_close_to_float64(family_case):
    ad, _, hs = family_case
    r = hs[0]
    a = sublayer_jacobians(ad, r, 0, "attn", jacobian_mode="in_context", dtype=torch.float32)
    b = sublayer_jacobians(ad, r, 0, "attn", jacobian_mode="in_context")
    assert a.dtype == torch.float32
    assert rel_update_error(a, b) < 1e-4


def test_bad_arguments():
    ad = load_model("random:llama").adapter
    r = torch.zeros(1, 4, ad.d_model)
    for kwargs in (
        {"kind": "ffn"},
        {"jacobian_mode": "nearby"},
        {"positions": "first"},
        {"positions": 9},
        {"positions": []},
        {"dtype": torch.float16},
    ):
        args = {"kind": "attn", **kwargs}
        kind = args.pop("kind")
        with pytest.raises(InputError):
            sublayer_jacobians(ad, r, 0, kind, **args)
    with pytest.raises(InputError):
        sublayer_jacobians(ad, torch.zeros(1, 4, 3), 0, "attn")
    with pytest.raises(InputError):
        sublayer_jacobians(ad, torch.full((1, 4, ad.d_model), float("nan")), 0, "attn")
    with pytest.raises(InputError):
        sublayer_jacobians(ad, r, 5, "attn")
    with pytest.raises(InputError):
        mean_operators(ad, torch.zeros(2, 4, dtype=torch.long), batch_size=0)


# ---------------------------------------------------------------------------------------
# real tier: SmolLM2-135M
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_case():
    from depthlens.models.loading import DEFAULT_MODEL, embedded_models

    info = next(m for m in embedded_models() if m["name"] == DEFAULT_MODEL)
    if not info["installed"]:
        pytest.skip(f"{DEFAULT_MODEL} is not installed ({info['install']})")
    loaded = load_model(DEFAULT_MODEL)
    ad = loaded.adapter
    ad64 = adapter_for(double_copy(loaded.model))
    ids = torch.randint(2, 1000, (1, 24), generator=torch.Generator().manual_seed(0))
    ids[0, 0] = ad.bos_token_id
    return ad, ad64, ad.residual_states(ids)


@pytest.mark.real
@pytest.mark.parametrize("layer", [3, 20])
@pytest.mark.parametrize("kind,mode", CASES)
def test_smollm2_matches_jacrev_and_finite_differences(smollm2_case, layer, kind, mode):
    ad, ad64, hs = smollm2_case
    r = hs[input_state(ad, layer, kind, mode)]
    J = sublayer_jacobians(ad, r, layer, kind, jacobian_mode=mode, positions=[-1])
    Jref = reference_jacrev(ad64, r, layer, kind, mode, [r.shape[1] - 1])
    assert rel_update_error(J, Jref) < 1e-9
    if layer == 3:  # finite differences on 24 random input coordinates (a full set takes ~30 s)
        cols = torch.randperm(ad.d_model, generator=torch.Generator().manual_seed(2))[:24].tolist()
        Jfd = reference_fd(ad64, r, layer, kind, mode, b=0, t=r.shape[1] - 1, columns=cols)
        eye = torch.eye(ad.d_model, dtype=torch.float64)
        err = (J[0][:, cols] - Jfd).abs().max() / (Jref[0] - eye).abs().max()
        assert float(err) < 1e-6


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_mlp_factor_takes_the_norm_vector_products_from_the_pre_activations(kind):
    """``(g * V_n) @ B^T`` from the forward pass's ``n @ B^T`` equals the product formed from
    the norm Jacobian's vectors; a norm with a bias leaves them to the factor."""
    from depthlens.models.weights import Norm

    gen = torch.Generator().manual_seed(0)
    m, K, N = 16, 24, 5
    gain = torch.rand(m, generator=gen, dtype=torch.float64) + 0.5
    norm = Norm(kind, gain, None, 1e-6)
    x = torch.randn(N, m, generator=gen, dtype=torch.float64)
    Bs = tuple(torch.randn(K, m, generator=gen, dtype=torch.float64) for _ in range(2))
    n = norm(x)
    got = norm.jacobian_products(tuple(n @ B.T for B in Bs), Bs)
    R = norm.jacobian(x)
    assert got is not None and len(got) == 2
    for product, B in zip(got, Bs):
        expected = (R.vecs * R.gain) @ B.T
        assert product.shape == expected.shape == (N, 1 if kind == "rms" else 2, K)
        torch.testing.assert_close(product, expected, rtol=1e-13, atol=1e-13)
    biased = Norm(kind, gain, torch.randn(m, generator=gen, dtype=torch.float64), 1e-6)
    assert biased.jacobian_products(tuple(biased(x) @ B.T for B in Bs), Bs) is None
