"""Gemma 4 layer Jacobians (three sub-layers, layer scalar, shared keys and values, per-layer
inputs): the closed-form engines against autograd through the Hugging Face modules, same run.

A random Gemma 4 of width 512 (8 query heads; sliding layers of head width 64 with 2
key/value heads, full layers of 128 with 1; per-layer inputs of width 64; 6 layers, the last
two reading shared keys and values), float64, one chunk of 64 tokens.

(a) In context, last position, every layer: the product of the engine's three operators
    (``attn`` in context, ``mlp`` and ``ple`` at the observed states) against
    ``torch.autograd.functional.jacobian`` of the model's own forward pass with that position of
    the layer's input replaced (the naive way: d backward passes through the whole model).
(b) Isolated (the one-token block), 8 tokens of one layer of each kind (sliding, full,
    shared): the engine against ``jacobian`` of the Hugging Face decoder layer run on each token
    as a one-token sequence.
Each line prints both times, their ratio and the largest difference relative to the update
``J - I``.

``python benchmarks/bench_gemma4.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.autograd.functional import jacobian

from depthlens.jacobian.engines import engine_states, read_states, state_reads, sublayer_jacobians
from depthlens.models import adapter_for, build_random
from depthlens.models.float64 import Float64Mode, double_copy

SHAPE = ("hidden_size=512,num_attention_heads=8,num_key_value_heads=2,head_dim=64,global_head_dim=128,"
         "num_global_key_value_heads=1,intermediate_size=2048,hidden_size_per_layer_input=64,sliding_window=32,"
         "vocab_size=1024,vocab_size_per_layer_input=1024,max_position_embeddings=256")
T, N_ISOLATED = 64, 8


def timed(fn: Callable):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def layer_operator(ad, states, layer: int, mode: str, t: int | list[int]) -> torch.Tensor:
    """``J_ple J_mlp J_attn`` (the layer scalar inside ``J_ple``) of the engine at positions ``t``."""
    out = None
    for kind in ad.sublayers:
        residuals, extra = read_states(states, state_reads(ad, layer, kind, mode))
        J = sublayer_jacobians(ad, residuals, layer, kind, mode, t, **extra)
        out = J if out is None else J @ out
    return out


def rel(J: torch.Tensor, ref: torch.Tensor) -> float:
    eye = torch.eye(J.shape[-1], dtype=torch.float64)
    return float((J - ref).abs().max() / (ref - eye).abs().max())


def naive_in_context(model, ids: torch.Tensor, layer: int, x: torch.Tensor) -> torch.Tensor:
    """d(output of ``layer`` at the last position)/d(its input there), the rest of the chunk fixed."""
    block, store = model.model.layers[layer], {}

    def replace(module, args, kwargs):
        h = args[0].clone()
        h[0, -1] = store["x"]
        return (h, *args[1:]), kwargs

    handles = [block.register_forward_pre_hook(replace, with_kwargs=True),
               block.register_forward_hook(lambda m, a, out: store.__setitem__("out", out))]

    def f(y: torch.Tensor) -> torch.Tensor:
        store["x"] = y
        model(ids)
        return store["out"][0, -1]

    try:
        return jacobian(f, x)
    finally:
        for h in handles:
            h.remove()


def naive_isolated(model, ad, states, inputs, layer: int, t: int) -> torch.Tensor:
    """d(decoder layer on the one-token sequence x)/dx, a shared layer given its source's keys and values."""
    block, source, kind = model.model.layers[layer], ad.kv_source(layer), model.config.layer_types[layer]
    S = len(ad.sublayers)
    x, p = states[S * layer][0, t], inputs[0, t, layer]
    pe = model.model.rotary_emb(x[None, None], torch.zeros(1, 1, dtype=torch.long), kind)
    shared: dict = {}
    if source != layer:
        with torch.no_grad():
            model.model.layers[source](states[S * source][0, t][None, None], inputs[0, t, source][None, None],
                                       shared_kv_states=shared, position_embeddings=pe, attention_mask=None)
    return jacobian(lambda y: block(y[None, None], p[None, None], shared_kv_states=dict(shared),
                                    position_embeddings=pe, attention_mask=None)[0, 0], x.clone())


def main() -> None:
    torch.manual_seed(0)
    model = double_copy(build_random("gemma4", SHAPE, seed=0)).eval()
    ad = adapter_for(model)
    ids = torch.randint(0, ad.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    with Float64Mode(), torch.no_grad():
        states = engine_states(ad, ids)
        inputs = ad.per_layer_inputs(ids)
    print(f"gemma4 d={ad.d_model}, {ad.n_layers} layers (kv sources {[ad.kv_source(i) for i in range(ad.n_layers)]}), "
          f"T={T}, threads={torch.get_num_threads()}")
    print("(a) in context, last position: engine (three operators) vs autograd through the model's forward pass")
    total_e = total_n = 0.0
    for layer in range(ad.n_layers):
        te, J = timed(lambda: layer_operator(ad, states, layer, "in_context", -1)[0])
        with Float64Mode():
            tn, ref = timed(lambda: naive_in_context(model, ids, layer, states[len(ad.sublayers) * layer][0, -1].clone()))
        total_e, total_n = total_e + te, total_n + tn
        print(f"  layer {layer}: engine {te * 1e3:7.1f} ms  autograd {tn:6.2f} s  ratio {tn / te:6.0f}x  "
              f"rel diff {rel(J, ref):.1e}")
    print(f"  all layers: engine {total_e:.2f} s, autograd {total_n:.1f} s, ratio {total_n / total_e:.0f}x")
    print(f"(b) isolated one-token block, {N_ISOLATED} tokens: engine vs autograd through the decoder layer")
    for layer, what in ((0, "sliding"), (1, "full"), (ad.n_layers - 1, "shared")):
        tokens = list(range(T - N_ISOLATED, T))
        te, J = timed(lambda: layer_operator(ad, states, layer, "isolated", tokens))
        with Float64Mode():
            tn, ref = timed(lambda: torch.stack([naive_isolated(model, ad, states, inputs, layer, t) for t in tokens]))
        print(f"  layer {layer} ({what}): engine {te * 1e3:7.1f} ms  autograd {tn:6.2f} s  ratio {tn / te:6.0f}x  "
              f"rel diff {rel(J, ref):.1e}")


if __name__ == "__main__":
    main()
