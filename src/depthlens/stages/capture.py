"""The capture stage: every head's attention pattern features and the residual stream at
every sub-layer boundary, per chunk.

One unit of work is one batch of chunks (fixed boundaries, so a resumed run recomputes
exactly the same batches). Tables:

- ``attention_patterns``: one row per (layer, head, chunk): ``sink_mass``, ``prev_weight``,
  ``row_entropy`` (docs/methods.md#a3).
- ``attention_summary``: one row per (layer, head): the median over chunks of each.
- ``residual_summary``: one row per (chunk, boundary): see :func:`depthlens.residual.summarise_boundaries`.

Prompts (a prompts file): each chunk's attention is trimmed to its prompt's length and the
pattern features average over its analysed rows; its residual summary is over its analysed
positions (``max_pos`` a position of the prompt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..attention.patterns import prev_weight, row_entropy, sink_mass
from ..data import Chunks, as_chunks
from ..errors import require_at_least
from ..residual import summarise_boundaries
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

STAGE = "capture"
PATTERN_FEATURES = {"sink_mass": sink_mass, "prev_weight": prev_weight, "row_entropy": row_entropy}
#: Smallest chunk the stage handles: the pattern features need (n, n) attention with n >= 2.
MIN_SEQ_LEN = 2


def check(config: RunConfig) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads).

    Raises
    ------
    InputError
        ``seq_len`` below :data:`MIN_SEQ_LEN`, naming ``--seq-len``.
    """
    require_at_least("--seq-len", config.seq_len, MIN_SEQ_LEN, STAGE)


def run(context: StageContext) -> None:
    """Capture every batch of chunks as one resumable unit, then write the stage's tables."""
    run_dir, ids, batch_size = context.run_dir, context.chunks, context.config.batch_size
    starts = list(range(0, len(ids), batch_size))
    keys = [f"batch{start // batch_size:05d}" for start in starts]
    todo = run_dir.pending(STAGE, zip(keys, starts))
    bar = tqdm(total=len(keys), initial=len(keys) - len(todo), desc=STAGE, unit="batch",
               disable=context.execution.quiet)
    with torch.inference_mode():
        for key, start in todo:
            with run_dir.failures.unit(STAGE, key):
                run_dir.write_unit(STAGE, key, capture_batch(context.loaded.adapter, ids.take(slice(start, start + batch_size)),
                                                             start))
            bar.update()
    bar.close()
    keys = run_dir.finished(STAGE, keys)
    patterns = run_dir.read_units(STAGE, keys, "attention_patterns")
    context.write_table("attention_patterns", patterns)
    context.write_table("attention_summary", summarise_heads(patterns))
    context.write_table("residual_summary", run_dir.read_units(STAGE, keys, "residual_summary"))


def capture_batch(adapter, input_ids: torch.Tensor | Chunks, first_chunk: int) -> dict[str, pd.DataFrame]:
    """Pattern features and residual summaries for one batch of chunks.

    Parameters
    ----------
    adapter : Adapter
        The model's adapter (``depthlens.models``).
    input_ids : LongTensor, shape (B, T), or Chunks
        Token ids of ``B`` chunks; :class:`~depthlens.data.Chunks` of their own lengths are
        trimmed, and averaged over their analysed positions only.
    first_chunk : int
        Global index of the first chunk of the batch.

    Returns
    -------
    dict with tables ``attention_patterns`` and ``residual_summary``.
    """
    batch = as_chunks(input_ids)
    if batch.ragged:
        return _capture_ragged(adapter, batch, first_chunk)
    input_ids = batch.ids
    chunk_ids = np.arange(first_chunk, first_chunk + input_ids.shape[0])
    states, captured = _one_pass(adapter, input_ids)
    pattern_tables = []
    for layer, probs in adapter.probs_from_captures(captured):
        A = probs.detach().cpu().numpy()  # (B, H, T, T) float64
        n_heads = A.shape[1]
        table = pd.DataFrame(
            {
                "layer": layer,
                "head": np.tile(np.arange(n_heads), len(chunk_ids)),
                "chunk": np.repeat(chunk_ids, n_heads),
            }
        )
        for name, feature in PATTERN_FEATURES.items():
            table[name] = feature(A).reshape(-1)
        pattern_tables.append(table)
    residual_tables = []
    for i, chunk in enumerate(chunk_ids):
        table = summarise_boundaries(states[:, i], boundaries=adapter.boundaries)
        table.insert(0, "chunk", int(chunk))
        residual_tables.append(table)
    return {
        "attention_patterns": pd.concat(pattern_tables, ignore_index=True),
        "residual_summary": pd.concat(residual_tables, ignore_index=True),
    }


def _capture_ragged(adapter, batch: Chunks, first_chunk: int) -> dict[str, pd.DataFrame]:
    """:func:`capture_batch` of chunks of their own lengths: per chunk, the attention trimmed to
    its length and the pattern features over its analysed rows; the residual summary over its
    analysed positions."""
    lengths = [int(n) for n in batch.lengths]
    states, captured = _one_pass(adapter, batch.ids)
    pattern_tables = []
    for layer, probs in adapter.probs_from_captures(captured):
        A = probs.detach().cpu().numpy()  # (B, H, T, T) float64
        n_heads = A.shape[1]
        for i, n in enumerate(lengths):
            table = pd.DataFrame({"layer": layer, "head": np.arange(n_heads), "chunk": first_chunk + i})
            rows = batch.rows(i)
            for name, feature in PATTERN_FEATURES.items():
                table[name] = feature(A[i, :, :n, :n], rows)
            pattern_tables.append(table)
    residual_tables = []
    for i in range(len(lengths)):
        positions = batch.positions(i)
        table = summarise_boundaries(states[:, i][:, positions], positions, adapter.boundaries)
        table.insert(0, "chunk", first_chunk + i)
        residual_tables.append(table)
    return {
        "attention_patterns": pd.concat(pattern_tables, ignore_index=True),
        "residual_summary": pd.concat(residual_tables, ignore_index=True),
    }


def _one_pass(adapter, ids: torch.Tensor) -> tuple[np.ndarray, dict]:
    """The batch's float64 residual states and every layer's query/key captures, from one forward pass."""
    states, captured = adapter.states_and_captures(ids)
    return states.detach().to(torch.float64).cpu().numpy(), captured


def summarise_heads(patterns: pd.DataFrame) -> pd.DataFrame:
    """Median over chunks of each pattern feature, one row per (layer, head)."""
    keys = ["layer", "head"]
    out = patterns.groupby(keys, sort=True, dropna=False)[list(PATTERN_FEATURES)].median().reset_index()
    out["n_chunks"] = patterns.groupby(keys, sort=True, dropna=False).size().to_numpy()
    return out
