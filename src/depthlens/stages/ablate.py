"""The ``ablate`` stage: ablation criticality of every attention head (docs/methods.md#a7), computed
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

Prompts (a prompts file, each prompt a chunk of its own length): the head means are over
every real position of the mean prompts (padding excluded), the cross-entropies over the
held-out prompts' predictions at their analysed positions (position ``t`` predicting ``t + 1``
inside the prompt); ``resample`` takes the paired mean prompt's head outputs at the same
positions, so it needs every held-out prompt's pair to be at least as long
(:func:`check_chunks` refuses the file otherwise).

Table ``ablation``: one row per (layer, head, method) (:data:`depthlens.schema.SCHEMA`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from ..data import Chunks
from ..errors import InputError
from ..interventions.ablation import (
    aggregate,
    clean_pass,
    head_means,
    head_outputs,
    layer_rows,
    resample_sources,
    split_chunks,
)
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

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


def check_chunks(config: RunConfig, chunks: Chunks) -> None:
    """Refuse the prompts of a prompts file the stage cannot measure (checked once they are
    tokenized, before anything is written): fewer than 2 prompts, a held-out prompt without an
    analysed position that predicts a next token, and with ``resample`` a held-out prompt
    longer than the mean prompt paired with it.

    Raises
    ------
    InputError
        One line naming the prompt and what to do.
    """
    opts = config.options(STAGE)
    if len(chunks) < 2:
        raise InputError(f"the ablate stage needs 2 prompts or more (mean prompts beside held-out ones) and "
                         f"{chunks.source} gives {len(chunks)}; add prompts or drop the ablate stage.")
    mean_idx, held_idx = split_chunks(len(chunks), opts.heldout_chunks)
    counted = chunks.predicted().sum(axis=1)
    empty = next((int(c) for c in held_idx if counted[c] == 0), None)
    if empty is not None:
        raise InputError(f"the ablate stage measures the loss at analysed positions that predict a next token, and "
                         f"held-out {chunks.name(empty)} has none (its last token predicts nothing); add a position "
                         "before its last token.")
    if "resample" in opts.ablation_methods:
        pairs = mean_idx[resample_sources(len(mean_idx), len(held_idx))]
        for held, source in zip(held_idx, pairs):
            if chunks.lengths[source] < chunks.lengths[held]:
                raise InputError(f"resample ablation replaces a head's outputs on held-out {chunks.name(int(held))} "
                                 f"({chunks.lengths[held]} tokens) by those on {chunks.name(int(source))} "
                                 f"({chunks.lengths[source]} tokens), which is shorter; order the prompts so that "
                                 "each is paired with one as long, or drop resample from --ablation-methods.")


def unit_key(batch: int, layer: int) -> str:
    """The unit of held-out batch ``batch`` and layer ``layer``: ``batch00000_layer00012``."""
    return f"batch{batch:05d}_layer{layer:05d}"


def run(context: StageContext) -> None:
    """Compute every pending unit, then write the ``ablation`` table from all finished units."""
    opts, run_dir, adapter = context.options, context.run_dir, context.loaded.adapter
    chunks, batch_size = context.chunks, context.config.batch_size
    ids, ragged = chunks.ids, chunks.ragged
    methods = tuple(opts.ablation_methods)
    mean_idx, held_idx = split_chunks(len(chunks), opts.heldout_chunks)
    pairs = resample_sources(len(mean_idx), len(held_idx))
    L, H = adapter.n_layers, adapter.n_heads
    starts = list(range(0, len(held_idx), batch_size))
    pending = {b: [l for l in range(L) if not run_dir.has_unit(STAGE, unit_key(b, l))] for b in range(len(starts))}
    n_pending = sum(len(v) for v in pending.values())
    bar = tqdm(total=len(starts) * L * H, initial=(len(starts) * L - n_pending) * H, desc=STAGE, unit="head",
               disable=context.execution.quiet)
    with torch.inference_mode():
        if n_pending and "mean" in methods:
            means = (head_means(adapter, ids[mean_idx], batch_size) if not ragged else
                     head_means(adapter, chunks.take(mean_idx).ids, batch_size, chunks.lengths[mean_idx]))
        else:
            means = None
        for b, start in enumerate(starts):
            layers = pending[b]
            if not layers:
                continue
            batch = held_idx[start : start + batch_size]
            if not ragged:
                clean = clean_pass(adapter, ids[batch], batch, keep=layers)
            else:  # each prompt's counted predictions; the batch cut to its longest prompt
                held = chunks.take(batch)
                clean = clean_pass(adapter, held.ids, batch, keep=layers, counted=held.predicted())
            sources = (head_outputs(adapter, ids[mean_idx[pairs[start : start + batch_size]]], layers)
                       if "resample" in methods else None)
            if sources is not None and ragged:  # the paired prompts are as long (check_chunks): same positions
                sources = {layer: out[:, : clean.ids.shape[1]] for layer, out in sources.items()}
            for layer in layers:
                key, before = unit_key(b, layer), bar.n
                with run_dir.failures.unit(STAGE, key):
                    rows = layer_rows(adapter, clean, layer, methods, means, sources, bar.update)
                    run_dir.write_unit(STAGE, key, {"rows": rows})
                bar.update(before + H - bar.n)  # the heads a failed unit did not reach
            del clean, sources
    bar.close()
    keys = [unit_key(b, l) for b in range(len(starts)) for l in range(L)]
    done = run_dir.finished(STAGE, keys, required=True)
    rows = run_dir.read_units(STAGE, done, "rows")
    context.write_table("ablation", aggregate(rows, methods, opts.ablation_boot, opts.seed))


__all__ = ["STAGE", "check", "check_chunks", "run", "unit_key"]
