"""Exact sub-layer Jacobians of SmolLM2-135M (docs/methods.md#b1) against the naive autograd ways, same run.

(a) In-context attention Jacobian of one layer at seq_len 128, last position: the closed-form
    engine (float64) against ``torch.func.jacrev`` through the Hugging Face attention module
    over the whole sequence (float32, the naive way), with the maximum difference relative to
    the update ``U = J - I``.
(b) Isolated operators (one-token block) of one layer for a batch of tokens: closed form
    (float64) against ``torch.func.vmap(torch.func.jacrev(...))`` over the adapter's one-token
    sub-layer (float32), per sub-layer and together; also the summed (mean-operator) path.
(c) All 60 mean operators over 64 chunks of 128 tokens, both modes (``mean_operators``).
(d) A FLOP-count projection of ``mean_operators`` for Llama-3.1-8B on one GPU.

``python benchmarks/bench_jacobian.py`` (first run converts SmolLM2 once, ~30 s). Threads follow
``torch.get_num_threads()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from depthlens.data import chunks
from depthlens.jacobian._layers import layer_ops
from depthlens.jacobian.engines import input_state, mean_operators, sublayer_jacobian_sum, sublayer_jacobians
from depthlens.models import load_model

LAYER = 5
SEQ_LEN = 128
N_CHUNKS = 64
N_ISOLATED = 16  # tokens in (b)


def timed(fn: Callable, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def rel_update_diff(J: torch.Tensor, Jref: torch.Tensor) -> float:
    eye = torch.eye(J.shape[-1], dtype=torch.float64)
    return float((J.double() - Jref.double()).abs().max() / (Jref.double() - eye).abs().max())


def naive_in_context(ad, h: torch.Tensor, layer: int) -> torch.Tensor:
    """jacrev of ``(h + Attn(norm(h)))[t]`` w.r.t. the whole sequence through the HF modules, float32."""
    blk = ad.layers[layer]
    attn = ad.attn_module(layer)
    T = h.shape[1]
    cos_sin = ad._position_embeddings(layer, T, h)
    mask = torch.full((T, T), torch.finfo(h.dtype).min, dtype=h.dtype).triu(1)[None, None]

    def f(x: torch.Tensor) -> torch.Tensor:
        out = attn(blk.input_layernorm(x), position_embeddings=cos_sin, attention_mask=mask)[0]
        return (x + out)[0, -1]

    return f, torch.func.jacrev(f)(h)[:, 0, -1]


def naive_isolated(ad, x: torch.Tensor, layer: int, kind: str) -> torch.Tensor:
    """vmap(jacrev) of the adapter's one-token sub-layer over tokens ``x (N, d)``, model dtype."""
    f = ad.sublayer(layer, kind)
    return torch.func.vmap(torch.func.jacrev(lambda v: f(v.view(1, 1, -1))[0, 0]))(x)


def flops_projection(d=4096, H=32, KV=8, hd=128, F=14336, L=32, T=128, n_chunks=1000, batch=64, params=8.0e9):
    """FLOPs of ``mean_operators`` (last position, both modes) and of the per-token dense path."""
    tokens = n_chunks
    batches = -(-n_chunks // batch)
    Hhd, KVhd = H * hd, KV * hd
    fwd = 2 * params * T * n_chunks  # one forward pass per chunk for the residual states
    # per layer and batch: W applied once to the summed token factors
    mlp_tok = 12 * F * d  # forming diag(...)W and the pre-norm correction
    mlp_w = 2 * d * F * d
    ic_keys = 2 * T * d * 2 * KVhd * batch  # keys and values of the chunks
    ic_tok = 2 * d * (Hhd + 2 * KVhd) + 4 * H * T * hd * hd + 2 * Hhd * hd * d + 8 * Hhd * d
    ic_w = 2 * d * Hhd * d
    iso_tok = 6 * d * d  # W (g * v)^T, its rank-one term and the norm's: no d x d x d product (Factor._applied)
    iso_w = d * d
    per_layer_mlp = tokens * mlp_tok + batches * mlp_w
    per_layer_ic = batches * ic_keys + tokens * ic_tok + batches * ic_w
    per_layer_iso = tokens * iso_tok + batches * iso_w
    summed = {
        "isolated": fwd + L * (per_layer_iso + per_layer_mlp),
        "in_context": fwd + L * (per_layer_ic + per_layer_mlp),
    }
    dense_per_token = L * (2 * d * F * d + 2 * d * Hhd * d)  # materialising every J (mlp + in-context attn)
    return summed, dense_per_token * tokens + fwd, fwd


def main() -> None:
    print(f"torch threads = {torch.get_num_threads()}")
    t_load, loaded = timed(lambda: load_model("smollm2-135m"))
    ad = loaded.adapter
    print(f"loaded {loaded.name} in {t_load:.1f} s: d = {ad.d_model}, {ad.n_layers} layers, "
          f"H = {ad.n_heads}, KV = {ad.n_kv_heads}, hd = {ad.head_dim}")
    ids = chunks("python-docs", loaded.tokenizer, N_CHUNKS, SEQ_LEN)
    states = ad.residual_states(ids[:N_ISOLATED])

    # (a) in-context attention, one layer, last position of one chunk
    h = states[input_state(ad, LAYER, "attn")][:1]
    t_cold, _ = timed(lambda: sublayer_jacobians(ad, h, LAYER, "attn", jacobian_mode="in_context"))
    t_fast, J = timed(lambda: sublayer_jacobians(ad, h, LAYER, "attn", jacobian_mode="in_context"), repeat=10)
    f, _ = naive_in_context(ad, h, LAYER)
    with torch.no_grad():
        check = float((f(h) - states[input_state(ad, LAYER, "attn") + 1][0, -1]).abs().max())
    t_naive, (_, Jn) = timed(lambda: naive_in_context(ad, h, LAYER))
    print(f"(a) in-context attn, layer {LAYER}, T = {SEQ_LEN}, last position: engine {t_fast * 1e3:.1f} ms "
          f"(first call incl. float64 weight copy {t_cold * 1e3:.0f} ms); naive float32 jacrev through the HF "
          f"module {t_naive:.2f} s -> ratio {t_naive / t_fast:.0f}x; max |diff| / max |U| = {rel_update_diff(J[0], Jn):.1e} "
          f"(naive map reproduces the model's state to {check:.1e})")

    # (b) isolated operators of one layer for N_ISOLATED tokens (last positions)
    res = {kind: states[input_state(ad, LAYER, kind)] for kind in ("attn", "mlp")}
    totals = {"fast": 0.0, "naive": 0.0, "sum": 0.0}
    for kind in ("attn", "mlp"):
        r = res[kind]
        sublayer_jacobians(ad, r[:1], LAYER, kind)  # warm the weight cache
        t_fast, J = timed(lambda: sublayer_jacobians(ad, r, LAYER, kind), repeat=3)
        t_sum, _ = timed(lambda: sublayer_jacobian_sum(ad, r, LAYER, kind), repeat=3)
        x = r[:, -1]
        t_naive, Jn = timed(lambda: naive_isolated(ad, x, LAYER, kind), repeat=2)
        totals["fast"] += t_fast
        totals["naive"] += t_naive
        totals["sum"] += t_sum
        print(f"(b) isolated {kind:4s}, {len(x)} tokens: closed form {t_fast * 1e3:7.1f} ms, vmap(jacrev) float32 "
              f"{t_naive * 1e3:7.1f} ms -> ratio {t_naive / t_fast:5.1f}x; summed path {t_sum * 1e3:6.1f} ms -> ratio "
              f"{t_naive / t_sum:5.1f}x; max |diff| / max |U| = {rel_update_diff(J, Jn):.1e}")
    print(f"(b) isolated block (attn + mlp): closed form {totals['fast'] * 1e3:.1f} ms vs {totals['naive'] * 1e3:.1f} ms "
          f"-> ratio {totals['naive'] / totals['fast']:.1f}x; summed path (what the stage computes) ratio "
          f"{totals['naive'] / totals['sum']:.1f}x")
    d, F = ad.d_model, layer_ops(ad, LAYER, torch.float64).Wg.shape[0]
    print(f"(b) a dense per-token MLP Jacobian is FLOP-bound: the closed form W_d (diag(a) W_g + diag(b) W_u) needs "
          f"2dFd = {2 * d * F * d / 1e9:.2f} GFLOP (float64), jacrev d VJPs of 6dF = {6 * d * F * d / 1e9:.2f} GFLOP (float32); "
          "the summed path applies W_d once per layer and batch instead")
    del states

    # (c) all 60 mean operators over 64 chunks, both modes
    total = 0.0
    for mode in ("isolated", "in_context"):
        t, means = timed(lambda: mean_operators(ad, ids, jacobian_mode=mode, positions="last", batch_size=16))
        total += t
        U = means[(LAYER, "attn")] - torch.eye(ad.d_model).double().numpy()
        print(f"(c) mean_operators {mode:10s}: {len(means)} operators over {N_CHUNKS} chunks x {SEQ_LEN} tokens in {t:.1f} s "
              f"(|U_attn layer {LAYER}|_F = {float((U ** 2).sum() ** 0.5):.3f})")
    print(f"(c) both modes: {total:.1f} s (target < 300 s)")

    # (d) projection for Llama-3.1-8B
    gpu = 30e12  # assumed sustained float64 FLOP/s on one H100 SXM (67 TFLOP/s FP64 tensor-core peak, ~45 %)
    gpu_bf16 = 400e12  # assumed sustained bf16 FLOP/s for the forward passes
    summed, dense, fwd = flops_projection()
    print("(d) Llama-3.1-8B (d 4096, 64 operators, 1000 chunks x 128 tokens, last position, batches of 64 chunks), "
          f"assuming {gpu / 1e12:.0f} TFLOP/s float64 and {gpu_bf16 / 1e12:.0f} TFLOP/s bf16 for forward passes:")
    for mode, fl in summed.items():
        jac = fl - fwd
        print(f"    mean_operators {mode:10s}: {fl / 1e15:.2f} PFLOP ({fwd / 1e15:.2f} forward + {jac / 1e15:.3f} Jacobian) "
              f"-> ~{fwd / gpu_bf16 + jac / gpu:.0f} s")
    print(f"    materialising every per-token J (in-context attn + mlp): {dense / 1e15:.1f} PFLOP -> ~{(dense - fwd) / gpu / 60:.0f} min "
          "of float64 (the summed path avoids this)")


if __name__ == "__main__":
    main()
