"""Ablation criticality (docs/methods.md#a7) on SmolLM2: 32 chunks × 128 tokens of python-docs, mean
ablation of all 270 heads (30 layers × 9), batch size 4 (the run default).

1. The stage's core (:func:`depthlens.interventions.ablation.criticality`: head means over the
   mean chunks, one clean block-path pass per batch of held-out chunks, then per layer only
   ``block(l) … block(L−1)`` and the unembedding, every head of the layer in one pass over
   copies of the batch) on all heads with 16 held-out chunks.
   Target: < 6 min on 2 cores.
2. The naive method measured in the same run: a full forward pass of the model with the
   ablation hook per head, on one head in every 6th layer, interleaved head by head with the
   core's path run for that head alone (so a change of machine load hits both alike);
   extrapolated to 270 heads, with both ratios (same heads; extrapolated totals) and the two
   methods' ΔCE compared.
3. The core at the default ``heldout_chunks = 4``.

Wall and process-CPU seconds and the load average are printed: on a shared machine the wall
times move with the other processes' load.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from depthlens import data
from depthlens.config import RunConfig
from depthlens.interventions import ablation as ab
from depthlens.models import load_model

N_CHUNKS, SEQ_LEN, HELDOUT, TARGET_MIN = 32, 128, 16, 6.0
SAMPLE_LAYERS, SAMPLE_HEAD = range(0, 30, 6), 0


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return wall - start[0], cpu - start[1]


def naive_nll(adapter, held: torch.Tensor, batch_size: int) -> np.ndarray:
    """Per-token CE (float32 log-softmax, as the core) from full forward passes of the model."""
    out = []
    for start in range(0, held.shape[0], batch_size):
        ids = held[start : start + batch_size]
        logits = adapter.logits(ids)[:, :-1]
        out += [F.cross_entropy(logits[b], ids[b, 1:], reduction="none").double().numpy() for b in range(ids.shape[0])]
    return np.stack(out)


def core(adapter, ids: torch.Tensor, heldout: int, batch_size: int, boot: int) -> tuple[float, object]:
    """Wall seconds of the stage's core on all heads, and its table."""
    done = [0]
    total = adapter.n_layers * adapter.n_heads * -(-heldout // batch_size)
    start = _clock()

    def progress(n: int) -> None:
        done[0] += n
        if done[0] % (9 * 10) == 0:
            print(f"    {done[0]}/{total} head-batches, {_since(start)[0]:.0f} s, load {_load()}", flush=True)

    table, _ = ab.criticality(adapter, ids, ("mean",), heldout, batch_size, n_boot=boot, seed=0, progress=progress)
    wall, cpu = _since(start)
    print(f"    wall {wall:.0f} s, process CPU {cpu:.0f} s, load average {_load()}", flush=True)
    return wall, table


def paired(adapter, ids: torch.Tensor, batch_size: int) -> dict:
    """Naive and core per-head times on the sampled heads, interleaved, and their ΔCE."""
    held_idx = np.arange(N_CHUNKS - HELDOUT, N_CHUNKS)
    held = ids[held_idx]
    with torch.inference_mode():
        means = ab.head_means(adapter, ids[: N_CHUNKS - HELDOUT], batch_size)
        start = _clock()
        clean_naive = naive_nll(adapter, held, batch_size)
        t_clean = _since(start)
        cleans = [ab.clean_pass(adapter, held[s : s + batch_size], held_idx[s : s + batch_size], keep=SAMPLE_LAYERS)
                  for s in range(0, HELDOUT, batch_size)]
        out = {"naive": [], "core": [], "delta_naive": [], "delta_core": [], "clean": t_clean}
        for layer in SAMPLE_LAYERS:
            value = means[layer][SAMPLE_HEAD]
            start = _clock()
            with adapter.ablate_head(layer, SAMPLE_HEAD, "mean", value):
                ablated = naive_nll(adapter, held, batch_size)
            out["naive"].append(_since(start))
            start = _clock()
            delta = sum(float((ab.ablated_nll(adapter, c, layer, [SAMPLE_HEAD], "mean", value[None])[0] - c.nll).sum())
                        for c in cleans)
            out["core"].append(_since(start))
            out["delta_naive"].append(float((ablated - clean_naive).sum()) / clean_naive.size)
            out["delta_core"].append(delta / clean_naive.size)
    return out


def main() -> None:
    cfg = RunConfig()
    loaded = load_model("smollm2-135m")
    adapter = loaded.adapter
    ids = data.chunks(data.load_text("python-docs"), loaded.tokenizer, N_CHUNKS, SEQ_LEN, seed=0)
    n_heads = adapter.n_layers * adapter.n_heads
    bs, boot = cfg.batch_size, cfg.options("ablate").ablation_boot
    print(f"SmolLM2: {adapter.n_layers} layers x {adapter.n_heads} heads = {n_heads} heads; {N_CHUNKS} chunks x "
          f"{SEQ_LEN} tokens, {HELDOUT} held out, batch size {bs}, {torch.get_num_threads()} torch threads; "
          f"load average {_load()}", flush=True)

    seconds, table = core(adapter, ids, HELDOUT, bs, boot)
    verdict = "met" if seconds / 60 < TARGET_MIN else "NOT met"
    print(f"core, {HELDOUT} held-out chunks: {seconds:.0f} s = {seconds / 60:.1f} min for {n_heads} heads "
          f"({seconds / n_heads:.2f} s per head; target < {TARGET_MIN:.0f} min: {verdict})", flush=True)

    p = paired(adapter, ids, bs)
    naive_wall = np.mean([w for w, _ in p["naive"]])
    naive_cpu = np.mean([c for _, c in p["naive"]])
    core_wall = np.mean([w for w, _ in p["core"]])
    core_cpu = np.mean([c for _, c in p["core"]])
    naive_total = p["clean"][0] + n_heads * naive_wall
    print(f"naive (full forward pass per head), {len(p['naive'])} heads (head {SAMPLE_HEAD} of layers "
          f"{list(SAMPLE_LAYERS)}), interleaved with the core's path on the same heads; load average {_load()}:", flush=True)
    print(f"  per head: naive {naive_wall:.2f} s wall / {naive_cpu:.2f} s CPU, core {core_wall:.2f} s wall / "
          f"{core_cpu:.2f} s CPU -> same-heads ratio {naive_wall / core_wall:.2f}x wall, {naive_cpu / core_cpu:.2f}x CPU "
          f"(these layers are below the average depth, so the core's average head is cheaper)", flush=True)
    print(f"  naive extrapolated to {n_heads} heads: {naive_total:.0f} s = {naive_total / 60:.1f} min; "
          f"naive / core (measured all-heads run above) = {naive_total / seconds:.2f}x", flush=True)
    diffs = np.abs(np.subtract(p["delta_core"], p["delta_naive"]))
    got = table[table["head"] == SAMPLE_HEAD].set_index("layer")["criticality"]
    table_diff = max(abs(got[l] - d) for l, d in zip(SAMPLE_LAYERS, p["delta_naive"]))
    print(f"  ΔCE core vs naive on those heads: max |difference| {diffs.max():.2e} (stage table: {table_diff:.2e}) "
          f"nats/token, ΔCE {min(p['delta_naive']):.4f} .. {max(p['delta_naive']):.4f}; all heads: mean criticality "
          f"{table['criticality'].mean():.4f}, top head {tuple(int(v) for v in table.loc[table['criticality'].idxmax(), ['layer', 'head']])}"
          f" {table['criticality'].max():.3f} nats/token", flush=True)

    seconds4, _ = core(adapter, ids, 4, bs, boot)
    naive4 = naive_total * 4 / HELDOUT
    print(f"core, default heldout_chunks=4: {seconds4:.0f} s = {seconds4 / 60:.1f} min for {n_heads} heads "
          f"(naive scaled by tokens: {naive4:.0f} s, {naive4 / seconds4:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
