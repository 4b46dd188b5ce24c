"""``depthlens train`` on 2 cores: training throughput against a plain PyTorch loop, and the
``induction`` preset's wall time to induction formation.

1. Throughput on the preset's model (2-layer llama, width 128, 32 × 160 tokens a step, python-
   docs with three sequences in four a repeated random block): ``depthlens.training.train``
   against a plain loop measured in the same run, on the same initial weights and the same
   batches (drawn before the plain loop's clock starts): ``model(ids).logits``, the shifted
   cross-entropy and ``torch.optim.AdamW`` at its defaults, nothing else (no learning-rate
   schedule, no clipping, no progress bar, no batch drawing inside its clock). The
   two alternate over ``ROUNDS`` rounds of ``STEPS`` steps; tokens per second count the steps
   after the first ``SKIP`` (warm-up), ours from the ``elapsed`` column of its ``training``
   table (wall seconds between steps, so its checkpoint writes are not counted), the plain
   loop's from its own clock. Target: ours no slower (ratio ≥ 1 within the machine's noise).
2. The preset end to end (``depthlens train --preset induction``, checkpoints included), then
   every checkpoint through the repeated-random-token probe (docs/methods.md#a5: [BOS, r, r], 128
   sequences, |r| = 64, the attention stage's :func:`~depthlens.attention.roles.probe_scores`):
   the first checkpoint with an induction head (score ≥ 0.3) and the training seconds up to it.
   Target: the whole preset run ≤ 10 min on 2 cores, step 0 without routing heads, the final
   checkpoint with previous-token (≥ 0.3) and induction heads.

Wall times move with the other processes' load on a shared machine; the load average is
printed with each measurement.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from transformers.utils import logging as hf_logging

from depthlens import data
from depthlens.attention.roles import probe_scores
from depthlens.models import load_model, series_checkpoints
from depthlens.runs import RunMode
from depthlens.training import resolve, train
from depthlens.training.batches import TokenStream
from depthlens.training.build import build_model

STEPS, SKIP, ROUNDS, TARGET_MIN, ROUTING = 80, 10, 3, 10.0, 0.3


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def ours(options, folder: Path) -> float:
    """Tokens per second of ``depthlens.training`` over steps SKIP … STEPS."""
    train(options, folder, RunMode.OVERWRITE, quiet=True)
    table = pd.read_parquet(folder / "tables" / "training.parquet").set_index("step")
    return float((table.loc[STEPS, "tokens"] - table.loc[SKIP, "tokens"])
                 / (table.loc[STEPS, "elapsed"] - table.loc[SKIP, "elapsed"]))


def plain(options) -> float:
    """Tokens per second of a plain loop on the same initial model and batches."""
    model, tokenizer = build_model(options)
    stream = TokenStream.build(options, tokenizer)
    batches = [stream.batch(options, step) for step in range(1, STEPS + 1)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr)
    for step, ids in enumerate(batches, start=1):
        if step == SKIP + 1:
            start = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (STEPS - SKIP) * options.batch_size * options.seq_len / (time.perf_counter() - start)


def probe(series: Path, name: str) -> tuple[float, float]:
    """The largest previous-token and induction scores over the heads of checkpoint ``name``."""
    loaded = load_model(series, revision=name)
    ids = data.repeated_random_tokens(loaded.tokenizer, 128, 64, seed=0)
    prev, ind = [], []
    for _, probs in loaded.adapter.attention_probs(ids):
        scores = probe_scores(probs.numpy(), 64)
        prev.append(scores["prev_token_score"].mean(axis=0).max())
        ind.append(scores["induction_score"].mean(axis=0).max())
    return float(max(prev)), float(max(ind))


def main() -> None:
    hf_logging.disable_progress_bar()  # loading each checkpoint would print one
    preset = resolve("induction")
    options = resolve("induction", steps=STEPS, checkpoints=1)
    print(f"{torch.get_num_threads()} torch threads; preset model: {preset.family}, {preset.n_layers} layers, width "
          f"{preset.d_model}, {preset.n_heads} heads, batch {preset.batch_size} x {preset.seq_len} tokens; "
          f"load average {_load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rates: dict[str, list[float]] = {"depthlens": [], "plain": []}
        for r in range(ROUNDS):
            rates["depthlens"].append(ours(options, Path(tmp) / "throughput"))
            rates["plain"].append(plain(options))
            print(f"  round {r + 1}: depthlens {rates['depthlens'][-1]:,.0f} tok/s, plain loop "
                  f"{rates['plain'][-1]:,.0f} tok/s; load average {_load()}", flush=True)
        mine, theirs = np.median(rates["depthlens"]), np.median(rates["plain"])
        print(f"throughput (median of {ROUNDS} rounds, steps {SKIP}..{STEPS}): depthlens.training {mine:,.0f} tok/s, "
              f"plain PyTorch loop {theirs:,.0f} tok/s -> ratio {mine / theirs:.3f} "
              f"({'no slower' if mine >= 0.97 * theirs else 'SLOWER'}; within 3% counts as noise)", flush=True)

        series = Path(tmp) / "induction"
        start = time.perf_counter()
        train(preset, series, quiet=True)
        wall = time.perf_counter() - start
        verdict = "met" if wall / 60 <= TARGET_MIN else "NOT met"
        print(f"preset induction: {wall:.0f} s = {wall / 60:.1f} min for {preset.steps} steps and "
              f"{len(series_checkpoints(series))} checkpoints (target <= {TARGET_MIN:.0f} min: {verdict}); "
              f"load average {_load()}", flush=True)
        elapsed = {c["revision"]: c["elapsed"] for c in json.loads((series / "manifest.json").read_text())["checkpoints"]}
        formed = None
        for name, step in series_checkpoints(series):
            prev, ind = probe(series, name)
            print(f"  {name:>10}: max previous-token score {prev:.3f}, max induction score {ind:.3f}, "
                  f"{elapsed[name]:.0f} s of training", flush=True)
            if formed is None and ind >= ROUTING:
                formed = (name, elapsed[name])
        if formed is None:
            print("no checkpoint has an induction head (score >= 0.3): NOT met", flush=True)
        else:
            print(f"induction formation: first at {formed[0]}, {formed[1]:.0f} s = {formed[1] / 60:.1f} min of "
                  f"training", flush=True)


if __name__ == "__main__":
    main()
