"""The ``ablate`` stage: ablation criticality of every attention head (METHODS A7), computed
by :mod:`depthlens.interventions.ablation`.

The last ``heldout_chunks`` chunks of the run are held out; the others are the mean chunks.
The held-out chunks are processed in batches of ``batch_size``; one resumable unit is one
(batch, layer): every head of the layer under every method, on the batch's chunks (key
``batch00000_layer00012``, table ``rows`` of per-chunk ΔCE sums). For each batch with a
pending unit the clean residual stream is computed once (inputs of the pending layers kept)
and, with ``resample``, the head outputs of the paired mean chunks; the head means (with
``mean``) are computed once per stage run over the mean chunks. A resumed run recomputes
these deterministically and skips finished units; the table is aggregated from the unit
tables in a fixed order, so it is the same whether the run was resumed or not.

Memory: one batch's clean layer inputs (``batch_size·T·d`` per pending layer, model dtype),
with ``resample`` as many head outputs again, and one chunk's logits (``T·V``) at a time.

Table ``ablation``: one row per (layer, head, method) (:data:`depthlens.schema.SCHEMA`).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..config import RunConfig
from ..context import StageContext
from ..errors import RunError
from .ablation import (
    aggregate,
    clean_pass,
    head_means,
    head_outputs,
    layer_rows,
    resample_sources,
    split_chunks,
)

STAGE = "ablate"


def check(config: RunConfig) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads):
    ``heldout_chunks`` above ``chunks − 1`` means every chunk but the first, which gives the
    means (:func:`~depthlens.interventions.ablation.split_chunks`).

    Raises
    ------
    InputError
        When ``--chunks`` is below 2 (no mean chunk beside a held-out one).
    """
    split_chunks(config.chunks, config.options(STAGE).heldout_chunks)


def unit_key(batch: int, layer: int) -> str:
    """The unit of held-out batch ``batch`` and layer ``layer``: ``batch00000_layer00012``."""
    return f"batch{batch:05d}_layer{layer:05d}"


def run(context: StageContext) -> None:
    """Compute every pending unit, then write the ``ablation`` table from all finished units."""
    opts, run_dir, adapter = context.options, context.run_dir, context.loaded.adapter
    ids, batch_size = context.token_ids, context.config.batch_size
    methods = tuple(opts.ablation_methods)
    mean_idx, held_idx = split_chunks(ids.shape[0], opts.heldout_chunks)
    pairs = resample_sources(len(mean_idx), len(held_idx))
    L, H = adapter.n_layers, adapter.n_heads
    starts = list(range(0, len(held_idx), batch_size))
    pending = {b: [l for l in range(L) if not run_dir.has_unit(STAGE, unit_key(b, l))] for b in range(len(starts))}
    n_pending = sum(len(v) for v in pending.values())
    bar = tqdm(total=len(starts) * L * H, initial=(len(starts) * L - n_pending) * H, desc=STAGE, unit="head",
               disable=context.execution.quiet)
    with torch.inference_mode():
        means = head_means(adapter, ids[mean_idx], batch_size) if n_pending and "mean" in methods else None
        for b, start in enumerate(starts):
            layers = pending[b]
            if not layers:
                continue
            batch = held_idx[start : start + batch_size]
            clean = clean_pass(adapter, ids[batch], batch, keep=layers)
            sources = (head_outputs(adapter, ids[mean_idx[pairs[start : start + batch_size]]], layers)
                       if "resample" in methods else None)
            for layer in layers:
                key, before = unit_key(b, layer), bar.n
                with run_dir.failures.unit(STAGE, key):
                    rows = layer_rows(adapter, clean, layer, methods, means, sources, bar.update)
                    run_dir.write_unit(STAGE, key, {"rows": rows})
                bar.update(before + H - bar.n)  # the heads a failed unit did not reach
            del clean, sources
    bar.close()
    keys = [unit_key(b, l) for b in range(len(starts)) for l in range(L)]
    done = [k for k in keys if run_dir.has_unit(STAGE, k)]
    if not done:
        raise RunError(f"every unit of the {STAGE} stage failed; see its log.")
    rows = run_dir.read_units(STAGE, done, "rows")
    context.write_table("ablation", aggregate(rows, methods, opts.ablation_boot, opts.seed))


__all__ = ["STAGE", "check", "run", "unit_key"]
