"""Adapters against the models' own forward passes, on tiny random models of every family.

Integration tier: models are built in code (``build_random``), no download. Every family is
also checked through two llama-family variants with sliding windows (Mistral: every layer;
Qwen2: the layers ``layer_types`` marks).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

from depthlens.errors import InputError, ModelError
from depthlens.models import BLOCK_MAP_FAMILIES, FAMILIES, Adapter, adapter_for, build_random, family_of, random_config
from depthlens.models.families import parse_overrides

VARIANTS = (*BLOCK_MAP_FAMILIES, "mistral", "qwen2")
B, T = 2, 16


def _build(name: str) -> nn.Module:
    if name in FAMILIES:
        return build_random(name, seed=1)
    common = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1, bos_token_id=0,
    )
    if name == "mistral":
        cfg = transformers.MistralConfig(**common, sliding_window=4)
    else:
        cfg = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread (and do not fight other work for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Case:
    """A model, its adapter, inputs and the model's own outputs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model = _build(name)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():  # non-trivial norm weights and biases, so every norm is exercised
            for p in self.model.parameters():
                if p.ndim == 1:
                    p.add_(0.2 * torch.randn(p.shape, generator=gen))
        self.ad = adapter_for(self.model)
        self.ids = torch.randint(0, 256, (B, T), generator=gen)
        self.other_ids = torch.randint(0, 256, (B, T), generator=gen)
        with torch.no_grad():
            self.out = self.model(self.ids, output_attentions=True, output_hidden_states=True)
        self.states = self.ad.residual_states(self.ids)


@pytest.fixture(scope="module", params=VARIANTS)
def case(request: pytest.FixtureRequest) -> Case:
    return Case(request.param)


_CASES: dict[str, Case] = {}


def _case(name: str) -> Case:
    if name not in _CASES:
        _CASES[name] = Case(name)
    return _CASES[name]


def _hook_snapshot(model: nn.Module) -> dict[str, tuple]:
    return {
        name: (tuple(m._forward_hooks), tuple(m._forward_pre_hooks), tuple(m._forward_hooks_with_kwargs))
        for name, m in model.named_modules()
    }


# ---------------------------------------------------------------------------- attributes


def test_attributes(case: Case) -> None:
    ad, cfg = case.ad, case.ad.config
    assert isinstance(ad, Adapter)
    assert ad.n_layers == cfg.num_hidden_layers
    assert ad.n_heads == 4 and ad.d_model == 64 and ad.head_dim == 16
    assert ad.n_kv_heads == (4 if case.name in ("gpt2", "gpt_neox") else 2)
    assert ad.max_seq_len == 256
    assert ad.bos_token_id == 0
    assert len(ad.sliding_windows) == ad.n_layers
    assert ad.parallel_residual == (case.name == "gpt_neox")
    expected_windows = {
        "gemma3": [4, None, 4],
        "olmo3": [4, 4, None],
        "mistral": [4, 4, 4],
        "qwen2": [None, 4, 4],
    }.get(case.name, [None] * ad.n_layers)
    assert ad.sliding_windows == expected_windows
    assert torch.equal(ad.prepend_bos(case.ids)[:, 1:], case.ids)
    assert (ad.prepend_bos(case.ids)[:, 0] == 0).all()


# ---------------------------------------------------------------------------- attention


def test_attention_rows_causal_and_stochastic(case: Case) -> None:
    n = 0
    for layer, A in case.ad.attention_probs(case.ids):
        assert A.shape == (B, 4, T, T) and A.dtype == torch.float64
        assert (A >= 0).all()
        assert torch.equal(torch.triu(A, diagonal=1), torch.zeros_like(A))
        assert torch.allclose(A.sum(-1), torch.ones(B, 4, T, dtype=torch.float64), rtol=0, atol=1e-12)
        n += 1
    assert n == case.ad.n_layers


def test_attention_matches_eager_output_attentions(case: Case) -> None:
    for layer, A in case.ad.attention_probs(case.ids):
        ref = case.out.attentions[layer].double()
        assert torch.allclose(A, ref, rtol=0, atol=1e-5), (layer, (A - ref).abs().max())


def test_attention_probs_streams_requested_layers() -> None:
    c = _case("llama")
    it = c.ad.attention_probs(c.ids, layers=[1, 0])
    assert iter(it) is it  # a generator: nothing is materialised up front
    got = [(layer, A) for layer, A in it]
    assert [layer for layer, _ in got] == [1, 0]
    assert torch.allclose(got[0][1], c.out.attentions[1].double(), atol=1e-5)
    (layer, A1), = list(c.ad.attention_probs(c.ids, layers=1))
    assert layer == 1 and torch.equal(A1, got[0][1])
    with pytest.raises(InputError, match="layer"):
        list(c.ad.attention_probs(c.ids, layers=[5]))


def test_kept_captures_form_the_same_matrices_again() -> None:
    """qk_captures keeps what attention_probs forms its matrices from: probs_from_captures gives
    them again, bit for bit, for any captured layers, and refuses a layer it has no queries of."""
    c = _case("llama")
    captured = c.ad.qk_captures(c.ids)
    direct = dict(c.ad.attention_probs(c.ids))
    for _ in range(2):
        assert all(torch.equal(A, direct[layer]) for layer, A in c.ad.probs_from_captures(captured))
    (layer, A1), = list(c.ad.probs_from_captures(c.ad.qk_captures(c.ids, [1]), 1))
    assert layer == 1 and torch.equal(A1, direct[1])
    with pytest.raises(InputError, match="layer 1's queries"):
        list(c.ad.probs_from_captures(c.ad.qk_captures(c.ids, [0]), [1]))


def test_a_consumer_stopped_between_layers_keeps_its_grad_mode() -> None:
    """A run interrupted while the generator waits at a layer (then held by a traceback) once
    left torch's grad mode off for the rest of the process: the training that followed failed."""
    c = _case("llama")
    it = c.ad.attention_probs(c.ids, layers=[0, 1])
    next(it)
    assert torch.is_grad_enabled()
    del it


@pytest.mark.parametrize("name", ["gemma3", "olmo3", "mistral", "qwen2"])
def test_sliding_windows_respected(name: str) -> None:
    c = _case(name)
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    for layer, A in c.ad.attention_probs(c.ids):
        w = c.ad.sliding_windows[layer]
        inside = (j <= i) if w is None else (j <= i) & (i - j < w)
        assert (A[..., ~inside] == 0).all()
        assert (A[..., inside] > 0).all()
        if w is not None:
            assert (~inside & (j <= i)).any()  # the window really cuts something at this length


def test_float64_recomputation_keeps_what_float32_underflows() -> None:
    model = build_random("llama", seed=3)
    ad = adapter_for(model)
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    x = ad.attention_inputs(ids, [0])[0]
    with torch.no_grad():
        q, k, _ = ad.qkv(0, x)
        scores = (q.double() @ k.repeat_interleave(2, dim=1).double().transpose(-1, -2)) * ad.attn_module(0).scaling
    causal = torch.tril(torch.ones(24, 24, dtype=torch.bool))
    spread = (scores.masked_fill(~causal, float("-inf")).amax(-1) - scores.masked_fill(~causal, float("inf")).amin(-1))
    factor = 400.0 / float(spread.max())  # widest row now spans 400 nats: below float64's ~745, above float32's ~104
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(factor)
        ref32 = model(ids, output_attentions=True).attentions[0]
    (_, A), = list(ad.attention_probs(ids, layers=[0]))
    underflow = (ref32 == 0) & causal & (A > 0)
    assert underflow.any(), "float32 softmax should underflow to exact zeros here"
    assert (A[..., causal] > 0).all()  # float64 keeps every causal weight positive
    assert torch.allclose(A.sum(-1), torch.ones_like(A.sum(-1)), atol=1e-12)


# ---------------------------------------------------------------------------- residual stream


def test_residual_states_match_hidden_states(case: Case) -> None:
    ad, R, hs = case.ad, case.states, case.out.hidden_states
    L = ad.n_layers
    assert R.shape == (2 * L + 1, B, T, 64)
    for layer in range(L):
        assert torch.allclose(R[2 * layer], hs[layer], rtol=0, atol=1e-6)
    # transformers reports the final-normed output as hidden_states[L]
    with torch.no_grad():
        assert torch.allclose(ad.final_norm(R[2 * L]), hs[L], rtol=0, atol=1e-6)
        assert torch.allclose(ad.embed(case.ids), hs[0], rtol=0, atol=1e-6)


def test_sublayer_maps_connect_residual_states(case: Case) -> None:
    ad, R = case.ad, case.states
    with torch.no_grad():
        for layer in range(ad.n_layers):
            h, g, nxt = R[2 * layer], R[2 * layer + 1], R[2 * layer + 2]
            assert torch.allclose(ad.sublayer(layer, "attn")(h), g, atol=1e-5)
            assert torch.allclose(ad.block(layer)(h), nxt, atol=1e-5)
            if ad.parallel_residual:
                mlp = ad.branch(layer, "mlp")(h)  # the MLP branch reads the pre-attention state
                assert torch.allclose(g + mlp, nxt, atol=1e-5)
            else:
                assert torch.allclose(ad.sublayer(layer, "mlp")(g), nxt, atol=1e-5)


def test_composed_pass_reproduces_logits(case: Case) -> None:
    ad = case.ad
    with torch.no_grad():
        h = ad.embed(case.ids)
        for layer in range(ad.n_layers):
            if ad.parallel_residual:
                h = ad.block(layer)(h)
            else:
                h = ad.sublayer(layer, "mlp")(ad.sublayer(layer, "attn")(h))
        logits = ad.unembed(h)
    assert torch.allclose(logits, case.out.logits, rtol=0, atol=1e-5)
    assert torch.allclose(ad.composed_logits(case.ids), case.out.logits, rtol=0, atol=1e-5)


def test_one_token_input_is_position_zero(case: Case) -> None:
    ad = case.ad
    ids = case.ids[:, :1]
    assert torch.allclose(ad.composed_logits(ids), case.out.logits[:, :1], atol=1e-5)
    (_, A), = list(ad.attention_probs(ids, layers=[0]))
    assert torch.equal(A, torch.ones(B, 4, 1, 1, dtype=torch.float64))


def test_parallel_residual_mlp_sublayer_raises() -> None:
    ad = _case("gpt_neox").ad
    with pytest.raises(ModelError, match=r"block\(0\)"):
        ad.sublayer(0, "mlp")
    with pytest.raises(InputError, match="sublayer"):
        ad.sublayer(0, "ffn")


def test_sublayer_is_differentiable_with_torch_func() -> None:
    ad = _case("gemma3").ad
    h = _case("gemma3").states[2][:1, :5]  # layer 1 input, one chunk of 5 positions
    f = ad.sublayer(1, "attn")

    def last(x_t: torch.Tensor) -> torch.Tensor:  # in-context Jacobian at the last position
        return f(torch.cat([h[:, :-1], x_t[None, None]], dim=1))[0, -1]

    J = torch.func.jacrev(last)(h[0, -1])
    assert J.shape == (64, 64)
    e = torch.zeros(64)
    e[3] = 1e-2
    fd = (last(h[0, -1] + e) - last(h[0, -1] - e)) / 2e-2
    assert torch.allclose(J[:, 3], fd, atol=2e-3)


# ---------------------------------------------------------------------------- attention arithmetic and weights


def test_attention_arithmetic_interface(case: Case) -> None:
    ad = case.ad
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for layer in range(ad.n_layers):
        assert ad.attention_scale(layer) == float(ad.attn_module(layer).scaling)
        assert ad.attention_softcap(layer) is None
        w = ad.sliding_windows[layer]
        assert torch.equal(ad.allowed_positions(layer, T), (j <= i) if w is None else (j <= i) & (i - j < w))
    assert ad.logit_softcap() == (30.0 if case.name == "gemma3" else None)
    assert ad.has_rope == (case.name != "gpt2")
    if not ad.has_rope:
        with pytest.raises(ModelError, match="rotary"):
            ad.rope_cos_sin(0, T, torch.empty(0))
        return
    gen = torch.Generator().manual_seed(0)
    q0, k0 = torch.randn(ad.head_dim, generator=gen), torch.randn(ad.head_dim, generator=gen)
    q = q0.expand(1, ad.n_heads, T, ad.head_dim)
    k = k0.expand(1, ad.n_kv_heads, T, ad.head_dim)
    for layer in range(ad.n_layers):
        qr, kr = ad.apply_rope(q, k, *ad.rope_cos_sin(layer, T, q))
        assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # a rotation
        assert torch.allclose(qr[:, :, 0], q[:, :, 0]) and not torch.allclose(qr[:, :, 1], q[:, :, 1])
        S = qr[0, 0] @ kr[0, 0].T  # the same vectors at every position: scores depend on i - j only
        assert torch.allclose(S[1:, 1:], S[:-1, :-1], atol=1e-5)


def test_layer_weights_reproduce_the_model(case: Case) -> None:
    """The family-free weights evaluate to the adapter's own maps: queries and keys at position 0
    (no rotation), one-token attention (its value-output path) and the MLP branch."""
    ad = case.ad
    H, KV, hd = ad.n_heads, ad.n_kv_heads, ad.head_dim

    def affine(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return x @ W.T if b is None else x @ W.T + b

    def normed(norm, x: torch.Tensor, heads: int, per_head: bool) -> torch.Tensor:
        if norm is None:
            return x
        return norm(x.reshape(T, heads, hd)).reshape(T, -1) if per_head else norm(x)

    for layer in range(ad.n_layers):
        w = ad.layer_weights(layer)
        assert w.Wq.dtype == torch.float64 and w.Wq.shape == (H * hd, ad.d_model)
        h = case.states[2 * layer][0].double()  # T residuals, each fed as a one-token sequence
        n = h if w.attn_in is None else w.attn_in(h)
        q = normed(w.q_norm, affine(n, w.Wq, w.bq), H, w.qk_per_head)
        k = normed(w.k_norm, affine(n, w.Wk, w.bk), KV, w.qk_per_head)
        v = affine(n, w.Wv, w.bv)
        with torch.no_grad():
            qm, km, vm = ad.qkv(layer, n.float()[:, None])
            attn = ad.branch(layer, "attn")(h.float()[:, None])[:, 0]
        for ours, theirs in ((q, qm), (k, km), (v, vm)):
            assert torch.allclose(ours.float(), theirs[:, :, 0].reshape(T, -1), rtol=1e-4, atol=1e-4)
        o = v.reshape(T, KV, hd).repeat_interleave(H // KV, dim=1).reshape(T, -1)
        a = affine(o, w.Wo, w.bo)
        a = a if w.attn_post is None else w.attn_post(a)
        assert torch.allclose(a.float(), attn, rtol=1e-4, atol=1e-4)
        g = case.states[2 * layer if ad.parallel_residual else 2 * layer + 1][0].double()
        m = g if w.mlp_in is None else w.mlp_in(g)
        u = affine(m, w.Wg, w.bg)
        z = w.act(u) if w.Wu is None else w.act(u) * affine(m, w.Wu, w.bu)
        out = affine(z, w.Wd, w.bd)
        out = out if w.mlp_post is None else w.mlp_post(out)
        with torch.no_grad():
            mlp = ad.branch(layer, "mlp")(g.float()[None])[0]
        assert torch.allclose(out.float(), mlp, rtol=1e-4, atol=1e-4)
    with pytest.raises(InputError, match="layer"):
        ad.layer_weights(ad.n_layers)


# ---------------------------------------------------------------------------- ablation


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _manual(case: Case, layer: int, fn) -> torch.Tensor:
    handle = case.ad.out_proj(layer).register_forward_pre_hook(lambda m, args: (fn(args[0].clone()),))
    try:
        return _logits(case.model, case.ids)
    finally:
        handle.remove()


def test_zero_ablation_of_all_heads_equals_zeroed_projection_input(case: Case) -> None:
    layer = 0
    with case.ad.ablate_head(layer, list(range(4)), method="zero"):
        got = _logits(case.model, case.ids)
    want = _manual(case, layer, torch.zeros_like)
    assert torch.allclose(got, want, rtol=0, atol=1e-6)
    assert not torch.allclose(got, case.out.logits, atol=1e-4)


def test_mean_ablation_matches_manual(case: Case) -> None:
    ad, layer, head = case.ad, 1, 2
    outs = ad.head_outputs(case.ids, layer)
    assert outs.shape == (B, T, 4, 16)
    mean = outs[:, :, head].mean(dim=(0, 1))
    with ad.ablate_head(layer, head, method="mean", value=mean):
        got = _logits(case.model, case.ids)

    def manual(x: torch.Tensor) -> torch.Tensor:
        x[..., head * 16 : (head + 1) * 16] = mean
        return x

    assert torch.allclose(got, _manual(case, layer, manual), rtol=0, atol=1e-6)
    assert not torch.allclose(got, case.out.logits, atol=1e-6)
    # several heads at once, one mean vector each
    means = outs[:, :, [0, 3]].mean(dim=(0, 1))
    with ad.ablate_head(layer, [0, 3], method="mean", value=means):
        got2 = _logits(case.model, case.ids)

    def manual2(x: torch.Tensor) -> torch.Tensor:
        x[..., 0:16] = means[0]
        x[..., 48:64] = means[1]
        return x

    assert torch.allclose(got2, _manual(case, layer, manual2), rtol=0, atol=1e-6)


def test_resample_ablation_matches_manual() -> None:
    c = _case("llama")
    other = c.ad.head_outputs(c.other_ids, 0)[:, :, 1]
    with c.ad.ablate_head(0, 1, method="resample", value=other):
        got = _logits(c.model, c.ids)

    def manual(x: torch.Tensor) -> torch.Tensor:
        x[..., 16:32] = other
        return x

    assert torch.allclose(got, _manual(c, 0, manual), rtol=0, atol=1e-6)


def test_ablation_acts_on_sublayer_maps_too() -> None:
    c = _case("llama")
    h = c.states[0]
    with torch.no_grad():
        with c.ad.ablate_head(0, [0, 1, 2, 3]):
            g = c.ad.sublayer(0, "attn")(h)
        # o_proj has no bias here: all heads zeroed means the attention adds nothing
        assert torch.equal(g, h)


def test_ablation_argument_errors() -> None:
    ad = _case("llama").ad
    with pytest.raises(InputError, match="method"):
        with ad.ablate_head(0, 0, method="shuffle"):
            pass
    with pytest.raises(InputError, match="head"):
        with ad.ablate_head(0, 9):
            pass
    with pytest.raises(InputError, match="shape"):
        with ad.ablate_head(0, 0, method="mean", value=torch.zeros(5)):
            pass
    with pytest.raises(InputError, match="needs a value"):
        with ad.ablate_head(0, 0, method="mean"):
            pass


# ---------------------------------------------------------------------------- clamps


def test_clamp_with_original_values_changes_nothing(case: Case) -> None:
    ad, R, L = case.ad, case.states, case.ad.n_layers
    dims, positions, start = [3, 17], [0, 5], 1
    values = {layer: R[2 * layer][:, positions][:, :, dims] for layer in range(start, L + 1)}
    with ad.clamp(dims, values, positions, from_layer=start):
        got = _logits(case.model, case.ids)
    assert torch.equal(got, _logits(case.model, case.ids))
    with ad.clamp(dims, lambda layer, x: x * 1.0, positions, from_layer=0):
        assert torch.equal(_logits(case.model, case.ids), got)


def test_clamp_changes_logits_from_its_position_on(case: Case) -> None:
    ad, L, p = case.ad, case.ad.n_layers, 5
    with ad.clamp([0, 1], 50.0, [p], from_layer=1):
        got = _logits(case.model, case.ids)
        R = ad.residual_states(case.ids)
    ref = case.out.logits
    assert torch.allclose(got[:, :p], ref[:, :p], rtol=0, atol=1e-6)
    changed = (got - ref).abs().amax(dim=(0, 2)) > 1e-4
    # a clamp at p reaches later positions through attention, at most w - 1 further per windowed layer
    windows = ad.sliding_windows[1:]
    reach = T if None in windows else sum(w - 1 for w in windows)
    assert changed[p : p + reach + 1].all()
    assert not changed[p + reach + 1 :].any()
    for layer in range(1, L + 1):  # every clamped state holds the value, the earlier ones do not
        assert (R[2 * layer][:, p, :2] == 50.0).all()
    assert not (R[0][:, p, :2] == 50.0).any()


def _pass(ad: Adapter, ids: torch.Tensor, layers: range) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    with torch.no_grad():
        logits, probs = ad.logits_and_attention_probs(ids, layers)
        return logits, dict(probs)


def test_a_pass_started_at_a_layer_is_the_whole_pass(case: Case) -> None:
    """start_at with a layer's input from an earlier pass gives the whole pass's logits and
    attention probabilities bit for bit, with and without a clamp acting from that layer, and
    does not run the layers below it."""
    ad, L = case.ad, case.ad.n_layers
    start, layers = L - 1, range(L - 1, L)
    h = ad.layer_output(case.ids, start - 1)
    assert torch.equal(h, ad.residual_states(case.ids)[len(ad.boundaries) * start])
    ran: list[int] = []
    handles = [ad.attn_module(i).register_forward_pre_hook(lambda m, a, i=i: ran.append(i)) for i in range(L)]
    try:
        for clamp in (lambda: ad.clamp([0, 1], 50.0, [5], from_layer=start), lambda: ad.clamp(2, 0.0, 0, from_layer=L)):
            with clamp():
                whole = _pass(ad, case.ids, layers)
                ran.clear()
                with ad.start_at(start, h):
                    started = _pass(ad, case.ids, layers)
            assert ran == list(range(start, L))
            assert torch.equal(started[0], whole[0])
            assert all(torch.equal(started[1][layer], whole[1][layer]) for layer in layers)
    finally:
        for handle in handles:
            handle.remove()
    assert not any("forward" in vars(layer) for layer in ad.layers)  # the layers' own forward is back
    assert torch.equal(_pass(ad, case.ids, layers)[0], case.out.logits)


def test_start_at_refuses_what_it_cannot_start() -> None:
    ad = _case("llama").ad
    h = ad.layer_output(_case("llama").ids, 0)
    with pytest.raises(InputError, match="layer"):
        with ad.start_at(7, h):
            pass
    # a hook that replaces a skipped layer's output: the started layer is not given h
    handle = ad.layers[0].register_forward_hook(lambda m, a, out: out.clone())
    try:
        with pytest.raises(ModelError, match="not given the residual"):
            with ad.start_at(1, h):
                _pass(ad, _case("llama").ids, range(1, 2))
    finally:
        handle.remove()
    # a forward of the layer's own (as accelerate's hooks set) is put back after the block
    own = ad.layers[0].forward
    ad.layers[0].forward = own
    try:
        with ad.start_at(1, h):
            assert vars(ad.layers[0])["forward"] is not own
        assert vars(ad.layers[0])["forward"] is own
    finally:
        del ad.layers[0].forward
    gemma4 = adapter_for(build_random("gemma4", seed=0))
    with pytest.raises(ModelError, match="cannot start at layer 1"):
        with gemma4.start_at(1, h):
            pass


def test_clamp_argument_errors() -> None:
    ad = _case("llama").ad
    with pytest.raises(InputError, match="miss layers"):
        with ad.clamp(0, {1: 0.0}, 0, from_layer=0):
            pass
    with pytest.raises(InputError, match="dim"):
        with ad.clamp(999, 0.0, 0, from_layer=0):
            pass
    with pytest.raises(InputError, match="layer"):
        with ad.clamp(0, 0.0, 0, from_layer=7):
            pass


# ---------------------------------------------------------------------------- hook hygiene


def test_hooks_removed_after_exceptions(case: Case) -> None:
    ad, model = case.ad, case.model
    before = _hook_snapshot(model)
    with pytest.raises(RuntimeError, match="boom"):
        with ad.ablate_head(0, [0, 1], method="zero"):
            with ad.clamp(0, 0.0, 0, from_layer=0):
                assert _hook_snapshot(model) != before
                raise RuntimeError("boom")
    assert _hook_snapshot(model) == before
    # an error raised by the hook itself, in the middle of a forward pass
    bad = torch.zeros(B, T + 3, 16)
    with pytest.raises(InputError, match="resample"):
        with ad.ablate_head(0, 0, method="resample", value=bad):
            model(case.ids)
    assert _hook_snapshot(model) == before
    # the capture passes leave nothing behind either
    ad.head_outputs(case.ids, 0)
    list(ad.attention_probs(case.ids, layers=[0]))
    ad.residual_states(case.ids)
    assert _hook_snapshot(model) == before


# ---------------------------------------------------------------------------- families


def test_family_of_maps_model_types() -> None:
    assert family_of(transformers.LlamaConfig()) == "llama"
    assert family_of(transformers.MistralConfig()) == "llama"
    assert family_of(transformers.Qwen2Config()) == "llama"
    assert family_of(transformers.Gemma3TextConfig()) == "gemma3"
    assert family_of(transformers.GPT2Config()) == "gpt2"
    assert family_of(transformers.GPTNeoXConfig()) == "gpt_neox"
    assert family_of(transformers.Olmo2Config()) == "olmo2"
    assert family_of(transformers.Olmo3Config()) == "olmo3"


def test_family_of_errors() -> None:
    with pytest.raises(ModelError, match="not supported; supported families: llama") as err:
        family_of(transformers.FalconConfig())
    assert "\n" not in str(err.value)
    for cfg in (transformers.BertConfig(), transformers.T5Config(), transformers.RobertaConfig()):
        with pytest.raises(ModelError, match="causal LM"):
            family_of(cfg)
    with pytest.raises(ModelError, match="bidirectional"):
        family_of(transformers.Gemma3TextConfig(use_bidirectional_attention=True))


def test_adapter_for_refuses_what_it_cannot_handle() -> None:
    class Foreign(nn.Module):
        config = transformers.FalconConfig()

    with pytest.raises(ModelError, match="falcon"):
        adapter_for(Foreign())
    base = transformers.LlamaModel(random_config("llama"))  # no LM head
    with pytest.raises(ModelError, match="layout"):
        adapter_for(base)


def test_random_config_overrides() -> None:
    cfg = random_config("llama", "hidden_size=128, num_hidden_layers=4,rms_norm_eps=1e-5,attention_bias=true")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.rms_norm_eps, cfg.attention_bias) == (128, 4, 1e-5, True)
    assert cfg._attn_implementation == "eager"
    assert random_config("gpt2", {"hidden_size": 32, "num_hidden_layers": 3}).n_embd == 32
    g = random_config("gemma3", "num_hidden_layers=5")
    assert g.layer_types == ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"]
    assert parse_overrides("a=1,b=2.5,c=False,d=none,e=silu") == {"a": 1, "b": 2.5, "c": False, "d": None, "e": "silu"}
    with pytest.raises(ModelError, match="hiden_size"):
        random_config("llama", "hiden_size=128")
    with pytest.raises(ModelError, match="key=value"):
        random_config("llama", "hidden_size")
    with pytest.raises(ModelError, match="unknown family"):
        random_config("bert")


def test_build_random_is_deterministic_and_leaves_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b, c = build_random("gpt2", seed=5), build_random("gpt2", seed=5), build_random("gpt2", seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert not a.training and next(a.parameters()).dtype == torch.float32


def test_input_validation() -> None:
    ad = _case("llama").ad
    with pytest.raises(InputError, match="at most 256"):
        ad.residual_states(torch.zeros(1, 300, dtype=torch.long))
    with pytest.raises(InputError, match="outside"):
        ad.residual_states(torch.full((1, 4), 256))
    with pytest.raises(InputError, match="integer"):
        ad.residual_states(torch.zeros(1, 4))
    assert ad.residual_states(torch.zeros(4, dtype=torch.long)).shape == (5, 1, 4, 64)


def test_multimodal_gemma3_text_path() -> None:
    text = {k: v for k, v in random_config("gemma3").to_dict().items() if k not in ("model_type", "transformers_version")}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        image_token_index=255, boi_token_index=254, eoi_token_index=253,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ad = adapter_for(model)
    assert ad.family == "gemma3" and ad.sliding_windows == [4, None, 4]
    ids = torch.randint(0, 250, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    for layer, A in ad.attention_probs(ids):
        assert torch.allclose(A, out.attentions[layer].double(), atol=1e-5)
    assert torch.allclose(ad.composed_logits(ids), out.logits, atol=1e-5)


@pytest.mark.real
def test_smollm2_adapter_against_the_model(smollm2) -> None:
    model, ad = smollm2.model, smollm2.adapter
    assert (ad.family, ad.n_layers, ad.n_heads, ad.n_kv_heads, ad.head_dim, ad.d_model) == ("llama", 30, 9, 3, 64, 576)
    assert ad.bos_token_id == 1
    ids = ad.prepend_bos(torch.randint(2, 49152, (1, 47), generator=torch.Generator().manual_seed(0)))
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
    for layer, A in ad.attention_probs(ids, layers=[0, 14, 29]):
        assert torch.allclose(A, out.attentions[layer].double(), rtol=0, atol=1e-5)
        assert torch.allclose(A.sum(-1), torch.ones_like(A.sum(-1)), rtol=0, atol=1e-12)
    R = ad.residual_states(ids)
    for layer in (0, 15, 29):
        assert torch.allclose(R[2 * layer], out.hidden_states[layer], rtol=0, atol=1e-4)
    assert torch.allclose(ad.composed_logits(ids), out.logits, rtol=0, atol=1e-4)
