"""The ``jacobian`` stage over models (docs/methods.md §B1–§B4, §B6): mean sub-layer operators per
checkpoint and mode, the layer operators they compose to, their spectral metrics and
eigenvalues, and the cumulative funnel with the Schur split in every Schur order asked for.

Checkpoints: the loaded model (``trained``), its step-0 null (``init``: same architecture and
config, fresh initial weights under the run seed) and any extra hub revisions. Units:
``ops_<checkpoint>_<mode>`` (mean operators and the layer operators, keys ``(layer, "attn" |
"mlp" | "layer")``, saved to ``arrays/`` in the dtype of ``save_arrays``, or not at all, plus
their metrics and eigenvalues; with float32 or none a unit-private float64 copy serves the
funnel and the topology stage until the run ends), ``funnel_<checkpoint>`` (cumulative
eranks of the sub-layer operators, on the ``isolated`` operators, or the first mode run) and
``funnel_<checkpoint>_<mode>`` for every other mode run (the funnel claims' sensitivity to the
Jacobian mode); which curves each unit computes is :func:`funnel_plan`'s plan
(``--funnel-curves``).

With ``--funnel-boot`` above 0 the funnel mode's unit also bootstraps the claims' funnel over
chunks (:mod:`depthlens.jacobian.bootstrap`): its mean operators are then summed chunk by chunk
(:func:`engines.chunk_operator_sums`, the same numbers to rounding), from the last sub-layer
down, and every replicate's backward product runs as they pass (table ``boot`` of the unit);
``boot_init_<k>`` units do the same for the extra step-0 nulls of ``--init-seeds`` (run seed
+ k), without any other analysis. The ``funnel_boot`` table gathers them. Over fewer chunks than
:data:`~depthlens.jacobian.bootstrap.MIN_CHUNKS` (a single one) there is nothing to resample
(:func:`~depthlens.jacobian.bootstrap.skip_reason` says why, from the run's chunk count): each
unit's ``boot`` table holds replicate 0 alone, the point estimate, and the extra nulls, which
would give replicate 0 alone too, are not run.

The operator units of one checkpoint share its forward passes (``Adapter.shared_passes``,
opened on the checkpoint's model once loaded): the second Jacobian mode reads a copy of the
residual states the first computed while they fit the budget (with one mode nothing is kept).
Inside a run the trained model's block is the run's (:func:`depthlens.workflow.run`), so the
stages before this one have already computed its states.

Prompts (a prompts file, each prompt a chunk of its own length): ``--positions last`` takes each
prompt's last analysed position, ``all`` every analysed position of it; the mean operators
average over those tokens (a prompt is read up to its last one, so padding never enters), and
the bootstrap resamples prompts with their own numbers of tokens.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from ..data import as_chunks
from ..errors import require_at_least
from ..executors.local import executor
from ..jacobian import engines, store
from ..jacobian.bootstrap import bootstrap_weights, skip_reason
from ..jacobian.cumulative import DIRECTIONS, schur_funnel
from ..jacobian.metrics import metrics_and_eigenvalues
from ..jacobian.options import JacobianOptions, init_seed_of
from ..jacobian.store import STAGE
from ..models.hooks import SHARED_BYTES
from ..runs import RunDirectory
from ..schema import TRAINED
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

#: Smallest chunk the stage handles (BOS and one token; every position has a Jacobian).
MIN_SEQ_LEN = 2


def check(config: RunConfig) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads). Any
    ``--funnel-rank`` works (it is capped at the model width).

    Raises
    ------
    InputError
        ``seq_len`` below :data:`MIN_SEQ_LEN`, naming ``--seq-len``.
    """
    require_at_least("--seq-len", config.seq_len, MIN_SEQ_LEN, STAGE)


def finish(run_dir: RunDirectory) -> None:
    """Delete the unit-private float64 operator copies (end of a run without failures)."""
    store.delete_private_copies(run_dir)


def run(context: StageContext) -> None:
    """Run the stage (skipping finished units) and write ``operators``, ``eigenvalues``,
    ``cumulative`` and (with ``--funnel-boot``) ``funnel_boot`` tables. The decompositions and
    funnel curves run on the run's executor (``--executor``, ``--jobs``); the Jacobians
    themselves in this process (torch), and so do the funnel curves when the model is on a GPU
    (``--device``, :func:`schur_funnel`'s ``device``), and the bootstrap's replicates (on
    ``--jobs`` threads on the CPU, while the executor waits). A unit
    that raises is recorded in ``run_dir.failures`` and the others go on; the tables hold the
    finished units (a funnel needs its checkpoint's operators)."""
    with executor(context.execution, context.run_dir.root) as pool:
        tables = _run(context.run_dir, context.loaded, context.chunks, context.options, context.config.batch_size,
                      context.execution.quiet, context.load_revision, pool,
                      threads=context.execution.threads)
    for name, table in tables.items():
        table.insert(0, "revision", context.revision_column(table["checkpoint"]))
        context.write_table(name, table)


def funnel_plan(opts: JacobianOptions, checkpoint: str, mode: str, d: int) -> dict[str, Any] | None:
    """The curves of one funnel unit, as keywords of :func:`~depthlens.jacobian.cumulative.schur_funnel`
    (``alphas``, ``directions``, ``ranks``, ``schur_orders``, ``split``, ``further``), or None
    when it has none.

    The truncations are the exact products (when ``d`` is at most ``funnel_exact_width``, or
    ``funnel_rank`` is 0) and, when ``funnel_rank`` is below ``d``, rank ``funnel_rank``; the
    claims' protocol curve is the backward one at the last of them.

    - ``--funnel-curves every``: the funnel mode gets every α of ``funnel_alphas`` in the first
      Schur order and α = 0 in the others, each in both directions at every truncation; the
      other modes α = 0 and 1 in the first order, likewise.
    - ``read`` (the default), what the claims, their variants and the figures read: the
      funnel mode of the ``trained`` checkpoint gets α = 1 in both directions at every
      truncation (B2 and its variants), the Schur split (α < 1) of the first order on the
      protocol curve (B4, the Schur-split figure) and the forward curve of the least
      truncation (B4's forward exact variant, the cumulative-erank figure), and the further
      Schur orders α = 0 on the protocol curve only (B4 reads them there); the funnel mode of
      every other checkpoint (the step-0 null, ``--revisions``) α = 1 alone, both directions,
      every truncation (B3, C2 and their variants); the other modes the protocol curve alone,
      at α = 0 and 1 for ``trained`` (B2's and B4's in-context variants) and α = 1 otherwise.
      Of these only the curves a figure draws are measured at every depth (``full_curves``):
      the funnel mode's forward curves of the least truncation (the cumulative-erank and the
      checkpoint-comparison figures) and the trained backward α = 1 curve of the least
      truncation (the transport figure); the claims read the others' two ends, which are
      measured alone (bit for bit the same values).
    """
    if opts.funnel_rank == 0 or opts.funnel_rank >= d:
        ranks: tuple[int | None, ...] = (None,)
    else:
        ranks = (None, opts.funnel_rank) if d <= opts.funnel_exact_width else (opts.funnel_rank,)
    protocol = {"directions": ("backward",), "ranks": ranks[-1:]}
    main, trained = mode == opts.funnel_mode, checkpoint == TRAINED
    if opts.funnel_curves == "every" or (main and trained):
        alphas = opts.funnel_alphas if main else tuple(a for a in opts.funnel_alphas if a in (0.0, 1.0))
        read = opts.funnel_curves == "read"
        plan = {"alphas": alphas, "directions": DIRECTIONS, "ranks": ranks,
                "schur_orders": opts.schur_orders if main else opts.schur_orders[:1],
                "split": [("backward", ranks[-1]), ("forward", ranks[0])] if read else None,
                "further": [("backward", ranks[-1])] if read else None}
    else:
        kept = (0.0, 1.0) if trained else (1.0,)
        plan = {"alphas": tuple(a for a in opts.funnel_alphas if a in kept), "schur_orders": opts.schur_orders[:1],
                "split": None, "further": None, **({"directions": DIRECTIONS, "ranks": ranks} if main else protocol)}
    if opts.funnel_curves == "read":
        drawn = [(a, "forward", ranks[0]) for a in plan["alphas"]] if main else []
        plan["full_curves"] = drawn + ([(1.0, "backward", ranks[0])] if main and trained else [])
    else:
        plan["full_curves"] = None
    return plan if plan["alphas"] else None


def _run(run_dir, loaded, token_ids, opts, batch_size, quiet, load_revision, pool, threads: int = 1
         ) -> dict[str, pd.DataFrame]:
    metrics, eigen, funnels, boots = [], [], [], []
    funnel_mode = opts.funnel_mode
    # on a GPU run (--device cuda) the funnel's products and SVDs run there too
    funnel_device = None if loaded.adapter.device.type == "cpu" else str(loaded.adapter.device)
    # the bootstrap's replicates run in this process while the pool is idle: --jobs threads on the CPU
    threads = threads if funnel_device is None else 1
    # the same resampled chunks for every checkpoint (ratios between checkpoints are paired)
    weights = bootstrap_weights(len(token_ids), opts.funnel_boot, opts.seed)
    for name, get in store.checkpoints(loaded, opts, load_revision):
        model = None
        ops_by_mode = {}
        # the modes of this checkpoint share its forward passes (nothing is kept for a single mode)
        with contextlib.ExitStack() as shared:
            for mode in opts.modes:
                def operators_unit() -> dict[str, pd.DataFrame]:
                    nonlocal model
                    if model is None:
                        model = get()
                        shared.enter_context(model.adapter.shared_passes(SHARED_BYTES if len(opts.modes) > 1 else 0))
                    ops, boot = store.compute(run_dir, name, mode, model.adapter, token_ids, opts,
                                              batch_size=batch_size, quiet=quiet, weights=weights,
                                              device=funnel_device, threads=threads)
                    op_table, eigen_rows = metrics_and_eigenvalues(ops, progress=not quiet, pool=pool,
                                                                   label=f"{store.label(name)} ({mode})",
                                                                   self_alignment=opts.operator_metrics == "every")
                    ops_by_mode[mode] = ops if mode == funnel_mode else None  # only the funnel reads them again
                    return {"metrics": op_table, "eigen": eigen_rows, **({"boot": boot} if boot is not None else {})}

                done = run_dir.unit(STAGE, f"ops_{name}_{mode}", operators_unit, isolated=True)
                if done is None:
                    continue
                ops_by_mode.setdefault(mode, None)  # finished; its operators are fetched only if the funnel needs them
                for table, sink in (("metrics", metrics), ("eigen", eigen)):
                    t = done[table]
                    t.insert(0, "checkpoint", name)
                    t.insert(1, "jacobian_mode", mode)
                    sink.append(t)
                if store.bootstrapped(opts, mode):
                    boots.append(_boot_rows(done["boot"], name, mode, opts.seed if name == "init" else None))
        for mode in [funnel_mode, *(m for m in opts.modes if m != funnel_mode)]:
            if mode not in ops_by_mode:
                continue  # its operators failed (recorded above); the funnel needs them
            plan = funnel_plan(opts, name, mode, loaded.adapter.d_model)
            if plan is None:
                continue

            def funnel_unit() -> dict[str, pd.DataFrame]:
                found = ops_by_mode[mode]
                if found is None:
                    found = store.operators(run_dir, name, mode, lambda: model or get(), token_ids, opts,
                                            batch_size=batch_size, quiet=quiet)
                return {"funnel": schur_funnel(store.operator_list(found), **plan, progress=not quiet, pool=pool,
                                               label=f"{store.label(name)} ({mode})", device=funnel_device)}

            key = f"funnel_{name}" if mode == funnel_mode else f"funnel_{name}_{mode}"
            done = run_dir.unit(STAGE, key, funnel_unit, isolated=True)
            if done is not None:
                t = done["funnel"]
                t.insert(0, "checkpoint", name)
                t.insert(1, "jacobian_mode", mode)
                funnels.append(t)
    boots += _extra_nulls(run_dir, loaded, token_ids, opts, weights, batch_size, quiet, funnel_device, threads)
    return {name: pd.concat(parts, ignore_index=True)
            for name, parts in (("operators", metrics), ("eigenvalues", eigen), ("cumulative", funnels),
                                ("funnel_boot", boots)) if parts}


def _boot_rows(t: pd.DataFrame, name: str, mode: str, init_seed: int | None) -> pd.DataFrame:
    """The ``boot`` table ``t`` of a finished unit as ``funnel_boot`` rows (checkpoint, mode and
    run seed of a step-0 null)."""
    t.insert(0, "checkpoint", name)
    t.insert(1, "jacobian_mode", mode)
    t.insert(2, "init_seed", np.nan if init_seed is None else float(init_seed))
    return t


def _extra_nulls(run_dir, loaded, token_ids, opts: JacobianOptions, weights: np.ndarray, batch_size: int, quiet: bool,
                 device: str | None, threads: int) -> list[pd.DataFrame]:
    """The bootstrapped funnel ends of the step-0 nulls of run seeds seed + 1, ..., seed +
    init_seeds − 1 (units ``boot_init_<k>``, the funnel's mode only, no other analysis), as
    ``funnel_boot`` rows of checkpoint ``init``; none where the bootstrap is skipped
    (:func:`~depthlens.jacobian.bootstrap.skip_reason`: they would hold replicate 0 alone, which
    nothing reads)."""
    from ..models import init_like

    if opts.null != "init" or opts.funnel_boot == 0 or skip_reason(len(token_ids)) is not None:
        return []
    mode, out = opts.funnel_mode, []
    for k in range(1, opts.init_seeds):
        def null_unit(k: int = k) -> dict[str, pd.DataFrame]:
            adapter = init_like(loaded, seed=init_seed_of(opts.seed + k)).adapter
            sums = engines.chunk_operator_sums(adapter, as_chunks(token_ids).ids,
                                               store.sublayer_keys_backward(adapter.n_layers, adapter.sublayers), mode,
                                               opts.positions, batch_size, progress=not quiet,
                                               label=f"step-0 null of seed {opts.seed + k}",
                                               chunk_positions=store.chunk_positions(token_ids, opts.positions))
            steps = len(adapter.sublayers) * adapter.n_layers
            return {"boot": store.boot_table(sums, weights, steps, adapter.d_model, opts, device, threads)}

        done = run_dir.unit(STAGE, f"boot_init_{k}", null_unit, isolated=True)  # each null's model goes on return
        if done is not None:
            out.append(_boot_rows(done["boot"], "init", mode, opts.seed + k))
    return out
