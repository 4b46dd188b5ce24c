"""The lens stage: Jacobian-lens transport matrices of the model, fitted natively in float64.

For each of the first ``--lens-chunks`` chunks (one resumable unit each), the transport
``(1/|V|) Σ_{t∈V} Σ_{t′∈V, t′≥t} ∂h_final,t′/∂h_ℓ,t`` of every source layer of
``--lens-layers`` (:mod:`depthlens.lens.fit`; a layer-streamed model block by block) is added
to running float64 sums, kept in ``arrays/lens_fit.pt`` in the reference fit-checkpoint form
(``jacobian_sum``, ``n_done``, and ``chunks``, those summed): a resumed stage goes on from it
and ends with the same sums, added in the same order. At the end:

- ``arrays/lens.pt``: the mean, in the reference artifact format with TransformerLens's
  provenance keys (:func:`depthlens.lens.write_transport`, ``--lens-dtype``), which
  TransformerLens's ``JacobianLens.load`` reads and its readout accepts;
- ``transport``: one row per source layer, the operator metrics of the float64 mean
  (:func:`depthlens.lens.transport_table`).

The stage is not part of ``depthlens run`` (each chunk costs d backward passes through the
model in float64): run it as ``depthlens lens``. Prompts of a prompts file are fitted at their
own lengths.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..data import Chunks
from ..errors import InputError
from ..executors.local import executor
from ..lens.analysis import transport_table
from ..lens.artifact import fit_metadata, write_transport
from ..lens.fit import TransportSums, source_layers, valid_positions
from ..runs.atomic import atomic_path
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig
    from ..models.adapter import Adapter

STAGE = "lens"
#: The exported artifact and the fit checkpoint, in ``arrays/``.
ARTIFACT, FIT = "lens.pt", "lens_fit.pt"


def unit_key(chunk: int) -> str:
    """The unit of chunk ``chunk``: ``chunk00003``."""
    return f"chunk{chunk:05d}"


def _shortest(config: RunConfig) -> int:
    opts = config.options(STAGE)
    return opts.lens_skip_first + opts.lens_skip_last + 1


def check(config: RunConfig) -> None:
    """Refuse chunks with no source position left.

    Raises
    ------
    InputError
        One line naming ``--seq-len`` and the skip flags.
    """
    if not config.prompts and config.seq_len < _shortest(config):
        opts = config.options(STAGE)
        raise InputError(f"--seq-len {config.seq_len} leaves the lens stage no source position once "
                         f"--lens-skip-first {opts.lens_skip_first} and --lens-skip-last {opts.lens_skip_last} are "
                         f"skipped; pass --seq-len {_shortest(config)} or more, or skip fewer.")


def check_model(config: RunConfig, adapter: Adapter) -> None:
    """Refuse ``--lens-layers`` outside the model's source layers, and a streamed model whose
    blocks read more than the residual stream (one line each)."""
    source_layers(adapter.n_layers, config.options(STAGE).lens_layers or None)
    if adapter.streamer is not None:
        TransportSums.for_adapter(adapter)


def check_chunks(config: RunConfig, chunks: Chunks) -> None:
    """Refuse a prompt of a prompts file too short for the skipped positions (one line)."""
    n = min(config.options(STAGE).lens_chunks, len(chunks))
    for c in range(n):
        if chunks.lengths[c] < _shortest(config):
            raise InputError(f"{chunks.name(c)} has {chunks.lengths[c]} tokens; the lens stage needs "
                             f"{_shortest(config)} (--lens-skip-first and --lens-skip-last); lengthen it or skip fewer.")


def _read_fit(path: Path) -> tuple[dict[int, torch.Tensor], int, list[int]]:
    """The fit checkpoint's sums, count and chunks (nothing yet: empty)."""
    if not path.is_file():
        return {}, 0, []
    state = torch.load(path, map_location="cpu", weights_only=True)
    return dict(state["jacobian_sum"]), int(state["n_done"]), list(state["chunks"])


def _write_fit(path: Path, sums: TransportSums, done: list[int]) -> None:
    payload = {"jacobian_sum": {k: torch.from_numpy(v) for k, v in sums.sums.items()}, "n_done": sums.n_done,
               "chunks": list(done), "source_layers": list(sums.layers), "target_layer": sums.adapter.n_layers - 1,
               "skip_first": sums.skip_first, "skip_last": sums.skip_last}
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def _metadata(context: StageContext, count: int) -> dict:
    """The artifact's provenance (:func:`depthlens.lens.fit_metadata`) of this run's fit."""
    from .. import __version__

    opts, chunks = context.options, context.chunks
    provenance = context.loaded.provenance
    return {**fit_metadata(model_name=context.loaded.name, model_revision=provenance.get("commit"),
                           corpus=context.config.text, n_prompts=count, n_layers=context.loaded.adapter.n_layers,
                           max_seq_len=int(chunks.lengths.max()), skip_first=opts.lens_skip_first,
                           skip_last=opts.lens_skip_last, version=__version__),
            "revision": context.ident()["revision"], "text": context.config.text, "seed": context.config.seed}


def run(context: StageContext) -> None:
    """Fit every pending chunk into the sums, then write the artifact and the ``transport`` table."""
    opts, run_dir, chunks = context.options, context.run_dir, context.chunks
    n = min(opts.lens_chunks, len(chunks))
    fit_path = run_dir.root / "arrays" / FIT
    stored, count, done = _read_fit(fit_path)
    totals = {k: v.cpu().numpy() for k, v in stored.items()}
    sums: TransportSums | None = None
    bar = tqdm(total=n, initial=len(done), desc=STAGE, unit="chunk", disable=context.execution.quiet)
    for c in range(n):
        key = unit_key(c)
        if c not in done:
            if sums is None:  # the float64 copy of the model, made once there is work
                sums = TransportSums.for_adapter(context.loaded.adapter, opts.lens_layers or None,
                                                 skip_first=opts.lens_skip_first, skip_last=opts.lens_skip_last)
                sums.sums, sums.n_done = totals, count
            sums.add(chunks.ids[c, : int(chunks.lengths[c])])
            totals, count = sums.sums, sums.n_done
            done.append(c)
            _write_fit(fit_path, sums, done)  # the sums first: they, not the units, say what was added
            bar.update()
        if not run_dir.has_unit(STAGE, key):
            V = valid_positions(int(chunks.lengths[c]), opts.lens_skip_first, opts.lens_skip_last)
            run_dir.write_unit(STAGE, key, {"rows": pd.DataFrame([{"chunk": c, "positions": len(V)}])})
    bar.close()
    run_dir.finished(STAGE, [unit_key(c) for c in range(n)], required=True)
    mean = {layer: totals[layer] / count for layer in sorted(totals)}
    write_transport(run_dir.root / "arrays" / ARTIFACT, mean, n_prompts=count, dtype=getattr(torch, opts.lens_dtype),
                    metadata=_metadata(context, count))
    with executor(context.execution, run_dir.root) as pool:
        metrics, _ = transport_table(mean, pool=pool, progress=not context.execution.quiet)
    metrics.insert(1, "n_prompts", count)
    context.write_table("transport", metrics)


__all__ = ["ARTIFACT", "FIT", "STAGE", "check", "check_chunks", "check_model", "run", "unit_key"]
