"""The training loop of ``depthlens train``: AdamW on next-token cross-entropy, log-spaced
checkpoints, held-out loss at each, and resume from the last checkpoint.

A resumed series ends with weights bit-identical to an uninterrupted one in the same process
setting (torch version, threads): the batch of step s is a function of (seed, s), the
learning rate a function of s, the model has no dropout, and each checkpoint holds the exact
float32 weights and AdamW's state (:mod:`depthlens.training.checkpoints`).
"""

from __future__ import annotations

import math
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import __version__
from ..models.hashing import config_sha256
from ..models.local import STEP_FOLDER, series_checkpoints
from ..models.pretrained import versions
from ..runs import RunMode
from ..runs.atomic import write_parquet
from ..schema import conform_table
from .batches import TokenStream
from .build import build_model
from .checkpoints import (TABLE, check_out, read_checkpoint, read_state, remove_series, remove_temporaries,
                          write_checkpoint, write_manifest)
from .options import TrainOptions
from .schedule import checkpoint_steps, learning_rate

__all__ = ["make_optimizer", "next_token_loss", "train"]

_COLUMNS = ["step", "tokens", "loss", "lr", "heldout_loss", "elapsed"]


def make_optimizer(model: torch.nn.Module, options: TrainOptions) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95, eps 1e-8) with ``weight_decay`` on the parameters of two or more
    dimensions (weight matrices, embeddings) and none on the others (norm weights, biases)."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": options.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=options.lr, betas=(0.9, 0.95), eps=1e-8)


def next_token_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of every token but the first of each row given the ones before it
    (float32 logits; no key/value cache is built)."""
    logits = model(input_ids=ids, use_cache=False).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@torch.no_grad()
def _heldout_loss(model: torch.nn.Module, ids: torch.Tensor, batch_size: int) -> float:
    """Mean next-token cross-entropy over the held-out sequences (per-batch float32 means,
    summed in float64), in eval mode; the model is left in training mode."""
    model.eval()
    total = 0.0
    for start in range(0, ids.shape[0], batch_size):
        chunk = ids[start: start + batch_size]
        total += float(next_token_loss(model, chunk)) * chunk[:, 1:].numel()
    model.train()
    return total / ids[:, 1:].numel()


def _table(rows: list[dict[str, float]], model: str, text: str) -> pd.DataFrame:
    """The ``training`` table of ``rows`` (identity columns first)."""
    table = pd.DataFrame(rows, columns=_COLUMNS).astype({"step": "int64", "tokens": "int64"})
    table.insert(0, "text", text)
    table.insert(0, "revision", "")
    table.insert(0, "model", model)
    return conform_table("training", table)


def _manifest(options: TrainOptions, preset: str | None, model: torch.nn.Module, tokenizer: Any,
              stream: TokenStream, heldout: torch.Tensor) -> dict[str, Any]:
    """What the series' manifest says besides its checkpoints and status."""
    return {
        "options": options.to_dict(), "options_hash": options.hash(), "preset": preset,
        "planned": checkpoint_steps(options.steps, options.checkpoints),
        "model": {"family": options.family,
                  "parameters": sum(p.numel() for p in model.parameters()), "config_sha256": config_sha256(model.config)},
        "tokenizer": {"spec": options.tokenizer or "byte", "vocab_size": len(tokenizer), "start_token_id": stream.start},
        "data": {"text": options.text, "text_sha256": stream.text_sha256, "train_tokens": int(stream.train.size),
                 "heldout_tokens": int(stream.heldout.size), "heldout_seqs": int(heldout.shape[0])},
        "versions": {"depthlens": __version__, "numpy": np.__version__, **versions()},
        "python": platform.python_version(), "torch_threads": torch.get_num_threads(),
    }


def train(options: TrainOptions, out: str | Path, run_mode: RunMode = RunMode.NEW, *, quiet: bool = False,
          preset: str | None = None) -> Path:
    """Train the series of ``options`` into the folder ``out`` and return its path.

    Writes ``step-0`` and the log-spaced checkpoints (:func:`checkpoint_steps`), each with
    its held-out loss, and the ``training`` table and the manifest after each
    (:mod:`depthlens.training.checkpoints`). With ``RunMode.RESUME`` a series continues
    from its last checkpoint (a finished one is left as it is); with ``RunMode.OVERWRITE``
    it is replaced. A tqdm bar shows the loss and tokens per second unless ``quiet``.

    Raises
    ------
    DepthlensError
        Bad input, before anything is written: an ``out`` the run mode cannot use, an
        unknown family, an unreadable tokenizer or text, a text too short.
    StorageError
        The folder cannot be written.
    """
    root = Path(out)
    check_out(root, run_mode, options.to_dict(), options.hash())  # before any model loads
    names = [name for name, _ in series_checkpoints(root)] if run_mode is RunMode.RESUME else []
    records: list[dict[str, Any]] = []
    rows: list[dict[str, float]] = []
    if names:
        model, tokenizer, optimizer_state = read_checkpoint(root / names[-1])
        optimizer = make_optimizer(model, options)
        optimizer.load_state_dict(optimizer_state)
        for name in names:  # each checkpoint holds its record and the table's rows since the one before
            state = read_state(root / name)
            records.append(state["record"])
            rows += state["rows"]
    else:
        model, tokenizer = build_model(options)
        optimizer = make_optimizer(model, options)
    stream = TokenStream.build(options, tokenizer)
    heldout = stream.heldout_batch(options)
    if run_mode is RunMode.OVERWRITE and root.is_dir():
        remove_series(root)
    root.mkdir(parents=True, exist_ok=True)
    remove_temporaries(root)
    manifest = _manifest(options, preset, model, tokenizer, stream, heldout)
    plan = set(manifest["planned"])

    def publish() -> None:
        """The table and the manifest, from the checkpoints written so far."""
        if rows:
            write_parquet(root / TABLE, _table(rows, str(out), options.text))
        status = "done" if records and records[-1]["step"] == options.steps else "training"
        write_manifest(root, {**manifest, "checkpoints": records, "status": status})

    done = records[-1]["step"] if records else 0
    offset = records[-1]["elapsed"] if records else 0.0
    clock = time.perf_counter()

    def checkpoint(step: int, segment: list[dict[str, float]]) -> None:
        elapsed = offset + time.perf_counter() - clock
        loss = _heldout_loss(model, heldout, options.batch_size)
        segment[-1].update(heldout_loss=loss, elapsed=elapsed)
        record = {"revision": STEP_FOLDER.format(step=step), "step": step, "tokens": segment[-1]["tokens"],
                  "heldout_loss": loss, "elapsed": elapsed}
        write_checkpoint(root, step, model, tokenizer, optimizer, {"record": record, "rows": segment})
        records.append(record)
        rows.extend(segment)
        publish()

    publish()  # a new series is one from the start; a kill may have come between a checkpoint and this
    if not records:
        checkpoint(0, [{"step": 0, "tokens": 0, "loss": math.nan, "lr": math.nan, "heldout_loss": math.nan,
                        "elapsed": 0.0}])
    tokens_per_step = options.batch_size * options.seq_len
    segment: list[dict[str, float]] = []
    with tqdm(total=options.steps, initial=done, desc="train", unit="step", disable=quiet) as bar:
        for step in range(done + 1, options.steps + 1):
            lr = learning_rate(step, options.lr, options.warmup, options.steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss = next_token_loss(model, stream.batch(options, step))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if options.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), options.grad_clip)
            optimizer.step()
            value = float(loss.detach())
            segment.append({"step": step, "tokens": step * tokens_per_step, "loss": value, "lr": lr,
                            "heldout_loss": math.nan, "elapsed": offset + time.perf_counter() - clock})
            bar.update()
            if step % 10 == 0 or step in plan:
                rate = (step - done) * tokens_per_step / (time.perf_counter() - clock)
                bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
            if step in plan:
                checkpoint(step, segment)
                segment = []
                if not quiet:
                    last = records[-1]
                    bar.write(f"{last['revision']}: loss {value:.3f}, held-out loss {last['heldout_loss']:.3f}")
    return root
