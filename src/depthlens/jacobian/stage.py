"""The ``jacobian`` stage over models (METHODS B1–B4, B6): mean sub-layer operators per
checkpoint and mode, the layer operators they compose to, their spectral metrics and
eigenvalues, and the cumulative funnel with the Schur split in every Schur order asked for.

Checkpoints: the loaded model (``trained``), its step-0 null (``init``: same architecture and
config, fresh initial weights under the run seed) and any extra hub revisions. Units:
``ops_<checkpoint>_<mode>`` (mean operators and the layer operators, keys ``(layer, "attn" |
"mlp" | "layer")``, saved to ``arrays/`` in the dtype of ``save_arrays``, or not at all, plus
their metrics and eigenvalues; with float32 or none a unit-private float64 copy serves the
funnel and the topology stage until the run ends), ``funnel_<checkpoint>`` (cumulative
eranks of the sub-layer operators for every Schur order, α, direction and truncation, on the
``isolated`` operators, or the first mode run) and ``funnel_<checkpoint>_<mode>`` for every
other mode run, at α = 0 and 1 in the first Schur order only (the funnel claims' sensitivity
to the Jacobian mode).

With ``--funnel-boot`` above 0 the funnel mode's unit also bootstraps the claims' funnel over
chunks (:mod:`depthlens.jacobian.bootstrap`): its mean operators are then summed chunk by chunk
(:func:`engines.chunk_operator_sums`, the same numbers to rounding), from the last sub-layer
down, and every replicate's backward product runs as they pass (table ``boot`` of the unit);
``boot_init_<k>`` units do the same for the extra step-0 nulls of ``--init-seeds`` (run seed
+ k), without any other analysis. The ``funnel_boot`` table gathers them.

Prompts (a prompts file, each prompt a chunk of its own length): ``--positions last`` takes each
prompt's last analysed position, ``all`` every analysed position of it; the mean operators
average over those tokens (a prompt is read up to its last one, so padding never enters), and
the bootstrap resamples prompts with their own numbers of tokens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..config import RunConfig
from ..context import StageContext
from ..data import Chunks, as_chunks
from ..errors import require_at_least
from ..models.adapter import SUBLAYERS
from ..parallel import executor
from ..runs import RunDirectory, atomic
from . import engines
from .bootstrap import bootstrap_weights, funnel_bootstrap, mean_of_chunks
from .cumulative import DIRECTIONS, schur_funnel
from .metrics import metrics_and_eigenvalues
from .options import JacobianOptions, init_seed_of

STAGE = "jacobian"
#: The ``sublayer`` key of the layer operators (:func:`with_layer_operators`).
LAYER = "layer"
#: Suffix of the unit-private float64 copy of a unit's mean operators (``units/jacobian/
#: ops_<checkpoint>_<mode>.operators.safetensors``), kept while the run needs them when
#: ``save_arrays`` is not float64, and deleted at the end of a run without failures.
PRIVATE = ".operators.safetensors"
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


def chunk_positions(chunks: torch.Tensor | Chunks, positions: str) -> list[list[int]] | None:
    """Each chunk's positions for the engines: None for chunks of equal length with every
    position analysed (``positions`` then applies as it is), else per chunk its last analysed
    position (``last``) or all of them (``all``)."""
    chunks = as_chunks(chunks)
    if not chunks.ragged:
        return None
    own = [chunks.positions(c).tolist() for c in range(len(chunks))]
    return [pos[-1:] for pos in own] if positions == "last" else own


def checkpoints(loaded, opts: JacobianOptions, load: Callable) -> list[tuple[str, Callable]]:
    """``(name, loader)`` for every checkpoint: the model, its init null, its revisions.

    Loaders are called lazily so a resumed run does not reload finished checkpoints.
    """
    from ..models import init_like

    out: list[tuple[str, Callable]] = [("trained", lambda: loaded)]
    if opts.null == "init":
        out.append(("init", lambda: init_like(loaded, seed=opts.init_seed)))
    for rev in opts.revisions:
        out.append((rev, lambda rev=rev: load(rev)))
    return out


def operator_list(ops: dict[tuple[int, str], np.ndarray]) -> list[np.ndarray]:
    """The sub-layer operators in depth order: (0, attn), (0, mlp), (1, attn), ...; layer
    operators (``(l, "layer")``) are left out."""
    return [ops[k] for k in sorted((k for k in ops if k[1] in SUBLAYERS), key=lambda k: (k[0], SUBLAYERS.index(k[1])))]


def with_layer_operators(ops: dict[tuple[int, str], np.ndarray], parallel_residual: bool) -> dict[tuple[int, str], np.ndarray]:
    """``ops`` with the layer operator ``(l, "layer")`` after each layer's two sub-layers:
    ``J̄_mlp @ J̄_attn`` (the product of the two mean operators, the two steps the funnel
    multiplies), or ``J̄_attn + J̄_mlp − I`` on parallel-residual models, the layer's own
    Jacobian there (:mod:`depthlens.jacobian.engines`); float64, exact to rounding."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for layer in sorted({k[0] for k in ops}):
        attn, mlp = ops[(layer, "attn")], ops[(layer, "mlp")]
        out[(layer, "attn")], out[(layer, "mlp")] = attn, mlp
        out[(layer, LAYER)] = layer_operator(attn, mlp, parallel_residual)
    return out


def layer_operator(attn: np.ndarray, mlp: np.ndarray, parallel_residual: bool) -> np.ndarray:
    """One layer's operator from its two mean sub-layer operators (see :func:`with_layer_operators`)."""
    return attn + mlp - np.eye(attn.shape[0]) if parallel_residual else mlp @ attn


def label(name: str) -> str:
    """How progress bars name a checkpoint: ``trained model``, ``step-0 null`` or ``revision R``."""
    return {"trained": "trained model", "init": "step-0 null"}.get(name, f"revision {name}")


def _paths(run_dir: RunDirectory, name: str, mode: str) -> tuple[Path, Path]:
    """The saved array of checkpoint ``name`` and ``mode``, and its unit-private float64 copy."""
    return (run_dir.root / "arrays" / f"jacobians_{name}_{mode}.safetensors",
            run_dir.root / "units" / STAGE / f"ops_{name}_{mode}{PRIVATE}")


def bootstrapped(opts: JacobianOptions, mode: str) -> bool:
    """Whether ``mode``'s mean operators are summed chunk by chunk with the funnel bootstrap:
    the funnel's mode, with ``--funnel-boot`` above 0."""
    return mode == opts.funnel_mode and opts.funnel_boot > 0


def boot_rank(opts: JacobianOptions, d: int) -> int | None:
    """The truncation of the bootstrapped funnel: the funnel's (``--funnel-rank``, capped at d;
    None for the exact products when it is 0 or at least d), so it matches the curve the
    claims read."""
    return opts.funnel_rank if 0 < opts.funnel_rank < d else None


def sublayer_keys_backward(n_layers: int) -> list[tuple[int, str]]:
    """The sub-layers from the last one down: the order of the backward product."""
    return [(layer, kind) for layer in reversed(range(n_layers)) for kind in reversed(SUBLAYERS)]


def _boot(sums, weights: np.ndarray, n_layers: int, d: int, opts: JacobianOptions, device: str | None,
          threads: int, out: dict | None = None) -> pd.DataFrame:
    """The bootstrapped funnel ends of per-chunk sums in backward order, with the truncation used."""
    rank = boot_rank(opts, d)
    table = funnel_bootstrap(sums, weights, 2 * n_layers, rank, "backward", out=out, device=device, threads=threads)
    table.insert(0, "truncation", d if rank is None else rank)
    return table


def _compute(run_dir: RunDirectory, name: str, mode: str, adapter, token_ids: torch.Tensor | Chunks, opts: JacobianOptions,
             *, batch_size: int, quiet: bool, label_suffix: str = "", copy: bool = True,
             weights: np.ndarray | None = None, device: str | None = None, threads: int = 1
             ) -> tuple[dict[tuple[int, str], np.ndarray], pd.DataFrame | None]:
    """Compute the mean operators and the layer operators of checkpoint ``name`` and ``mode``
    straight into their float64 file (``arrays/`` when ``save_arrays`` is float64, else the
    unit-private copy), one operator in memory at a time, then (with ``copy``) write the
    float32 ``arrays/`` copy when ``save_arrays`` asks for it; returns read-only memory maps
    of the float64 file, in layer order, and the funnel bootstrap (:func:`bootstrapped`
    modes with ``weights``, else None). The numbers are those of
    :func:`engines.mean_operators` (in a bootstrapped mode: the mean of
    :func:`engines.chunk_operator_sums`, whatever ``weights``) and :func:`with_layer_operators`
    held in memory, bit for bit."""
    d, keys = adapter.d_model, [(layer, kind) for layer in range(adapter.n_layers) for kind in (*SUBLAYERS, LAYER)]
    shapes = {f"{l}.{k}": (d, d) for l, k in keys}
    own = chunk_positions(token_ids, opts.positions)
    token_ids = as_chunks(token_ids).ids
    meta = {"checkpoint": name, "jacobian_mode": mode, "positions": opts.positions, "n_chunks": str(token_ids.shape[0])}
    public, private = _paths(run_dir, name, mode)
    path = public if opts.save_arrays == "float64" else private
    if path == public:
        writer = run_dir.array_writer(public.stem, shapes, np.float64, **meta)
    else:
        writer = atomic.safetensors_writer(private, shapes, np.float64,
                                           {"config_hash": str(run_dir.manifest["config_hash"]), **meta})
    boot = None
    with writer as store:
        ops = {(l, k): store[f"{l}.{k}"] for l, k in keys}
        sub = {k: v for k, v in ops.items() if k[1] != LAYER}
        if bootstrapped(opts, mode):
            sums = engines.chunk_operator_sums(adapter, token_ids, sublayer_keys_backward(adapter.n_layers), mode,
                                               opts.positions, batch_size, progress=not quiet,
                                               label=label(name) + label_suffix, chunk_positions=own)
            if weights is None:  # the operators alone
                for key, S, counts in sums:
                    sub[key][...] = mean_of_chunks(S, counts)
            else:
                boot = _boot(sums, weights, adapter.n_layers, d, opts, device, threads, out=sub)
        else:
            engines.mean_operators(adapter, token_ids, jacobian_mode=mode, positions=opts.positions,
                                   batch_size=batch_size, progress=not quiet, label=label(name) + label_suffix, out=sub,
                                   chunk_positions=own)
        for layer in range(adapter.n_layers):
            ops[(layer, LAYER)][...] = layer_operator(ops[(layer, "attn")], ops[(layer, "mlp")], adapter.parallel_residual)
    found = _mapped(path)
    if copy and opts.save_arrays == "float32":
        with run_dir.array_writer(public.stem, shapes, np.float32, **meta) as rounded:
            for (l, k), J in found.items():
                rounded[f"{l}.{k}"][...] = J
    return found, boot


def saved_operators(run_dir: RunDirectory, name: str, mode: str) -> dict[tuple[int, str], np.ndarray] | None:
    """The float64 mean operators of checkpoint ``name`` and ``mode`` that the run holds, as
    read-only memory maps in layer order (``attn``, ``mlp``, ``layer``): the float64
    ``arrays/`` file, else the unit-private copy; None when there is neither (the array is
    float32 or absent and the copy was deleted at the end of an earlier session)."""
    for path in _paths(run_dir, name, mode):
        if path.is_file():
            found = _mapped(path)
            if found and all(a.dtype == np.float64 for a in found.values()):
                return found
    return None


def _mapped(path: Path) -> dict[tuple[int, str], np.ndarray]:
    """Read-only memory maps of an operator file, keyed ``(layer, kind)`` in layer order."""
    found = {(int(k.split(".")[0]), k.split(".")[1]): v for k, v in atomic.map_safetensors(path).items()}
    order = (*SUBLAYERS, LAYER)
    return {k: found[k] for k in sorted(found, key=lambda k: (k[0], order.index(k[1])))}


def operators(run_dir: RunDirectory, name: str, mode: str, get: Callable, token_ids: torch.Tensor | Chunks,
              opts: JacobianOptions, *, batch_size: int, quiet: bool) -> dict[tuple[int, str], np.ndarray]:
    """The float64 mean operators (with the layer operators) of a finished ``ops_<name>_<mode>``
    unit: as saved (:func:`saved_operators`), or computed again from the checkpoint (``get()``)
    the same way, which gives the same numbers. Never a reduced-precision copy."""
    found = saved_operators(run_dir, name, mode)
    if found is None:  # into the unit-private copy (deleted again when the run ends)
        found, _ = _compute(run_dir, name, mode, get().adapter, token_ids, replace(opts, save_arrays="none"),
                            batch_size=batch_size, quiet=quiet, label_suffix=", recomputed", copy=False)
    return found


def finish(run_dir: RunDirectory) -> None:
    """Delete the unit-private float64 operator copies (end of a run without failures); a
    later session that needs them computes them again (:func:`operators`)."""
    folder = run_dir.root / "units" / STAGE
    for path in sorted(folder.glob(f"*{PRIVATE}")) if folder.is_dir() else ():
        path.unlink(missing_ok=True)


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
                      threads=max(1, min(context.execution.jobs, os.cpu_count() or 1)))
    for name, table in tables.items():
        table.insert(0, "revision", table["checkpoint"].map(context.revision_of))
        context.write_table(name, table)


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
    for name, get in checkpoints(loaded, opts, load_revision):
        model = None
        ops_by_mode = {}
        for mode in opts.modes:
            key = f"ops_{name}_{mode}"
            if not run_dir.has_unit(STAGE, key):
                with run_dir.failures.unit(STAGE, key):
                    model = model or get()
                    ops, boot = _compute(run_dir, name, mode, model.adapter, token_ids, opts, batch_size=batch_size,
                                         quiet=quiet, weights=weights, device=funnel_device, threads=threads)
                    op_table, eigen_rows = metrics_and_eigenvalues(ops, progress=not quiet, pool=pool,
                                                                   label=f"{label(name)} ({mode})")
                    run_dir.write_unit(STAGE, key, {"metrics": op_table, "eigen": eigen_rows,
                                                    **({"boot": boot} if boot is not None else {})})
                    ops_by_mode[mode] = ops if mode == funnel_mode else None  # only the funnel reads them again
            if not run_dir.has_unit(STAGE, key):
                continue
            ops_by_mode.setdefault(mode, None)  # finished; its operators are fetched only if the funnel needs them
            for table, sink in (("metrics", metrics), ("eigen", eigen)):
                t = run_dir.read_units(STAGE, [key], table)
                t.insert(0, "checkpoint", name)
                t.insert(1, "jacobian_mode", mode)
                sink.append(t)
            if bootstrapped(opts, mode):
                boots.append(_boot_rows(run_dir, key, name, mode, opts.seed if name == "init" else None))
        for mode in [funnel_mode, *(m for m in opts.modes if m != funnel_mode)]:
            if mode not in ops_by_mode:
                continue  # its operators failed (recorded above); the funnel needs them
            # the funnel mode gets every α and Schur order; the others α = 0 and 1 in the first order
            # only (the sensitivity of the funnel claims to the Jacobian mode)
            key = f"funnel_{name}" if mode == funnel_mode else f"funnel_{name}_{mode}"
            if not run_dir.has_unit(STAGE, key):
                with run_dir.failures.unit(STAGE, key):
                    found = ops_by_mode[mode]
                    if found is None:
                        found = operators(run_dir, name, mode, lambda: model or get(), token_ids, opts,
                                          batch_size=batch_size, quiet=quiet)
                    ops = operator_list(found)
                    d = ops[0].shape[0]
                    ranks = (None,) if opts.funnel_rank == 0 or opts.funnel_rank >= d else (None, opts.funnel_rank)
                    alphas = opts.funnel_alphas if mode == funnel_mode else tuple(
                        a for a in opts.funnel_alphas if a in (0.0, 1.0))
                    orders = opts.schur_orders if mode == funnel_mode else opts.schur_orders[:1]
                    table = schur_funnel(ops, alphas=alphas, directions=DIRECTIONS, ranks=ranks, schur_orders=orders,
                                         progress=not quiet, pool=pool, label=f"{label(name)} ({mode})",
                                         device=funnel_device)
                    run_dir.write_unit(STAGE, key, {"funnel": table})
            if run_dir.has_unit(STAGE, key):
                t = run_dir.read_units(STAGE, [key], "funnel")
                t.insert(0, "checkpoint", name)
                t.insert(1, "jacobian_mode", mode)
                funnels.append(t)
    boots += _extra_nulls(run_dir, loaded, token_ids, opts, weights, batch_size, quiet, funnel_device, threads)
    return {name: pd.concat(parts, ignore_index=True)
            for name, parts in (("operators", metrics), ("eigenvalues", eigen), ("cumulative", funnels),
                                ("funnel_boot", boots)) if parts}


def _boot_rows(run_dir: RunDirectory, key: str, name: str, mode: str, init_seed: int | None) -> pd.DataFrame:
    """The ``boot`` table of a finished unit as ``funnel_boot`` rows (checkpoint, mode and run seed of a step-0 null)."""
    t = run_dir.read_units(STAGE, [key], "boot")
    t.insert(0, "checkpoint", name)
    t.insert(1, "jacobian_mode", mode)
    t.insert(2, "init_seed", np.nan if init_seed is None else float(init_seed))
    return t


def _extra_nulls(run_dir, loaded, token_ids, opts: JacobianOptions, weights: np.ndarray, batch_size: int, quiet: bool,
                 device: str | None, threads: int) -> list[pd.DataFrame]:
    """The bootstrapped funnel ends of the step-0 nulls of run seeds seed + 1, ..., seed +
    init_seeds − 1 (units ``boot_init_<k>``, the funnel's mode only, no other analysis), as
    ``funnel_boot`` rows of checkpoint ``init``."""
    from ..models import init_like

    if opts.null != "init" or opts.funnel_boot == 0:
        return []
    mode, out = opts.funnel_mode, []
    for k in range(1, opts.init_seeds):
        key = f"boot_init_{k}"
        if not run_dir.has_unit(STAGE, key):
            with run_dir.failures.unit(STAGE, key):
                adapter = init_like(loaded, seed=init_seed_of(opts.seed + k)).adapter
                sums = engines.chunk_operator_sums(adapter, as_chunks(token_ids).ids,
                                                   sublayer_keys_backward(adapter.n_layers), mode, opts.positions,
                                                   batch_size, progress=not quiet,
                                                   label=f"step-0 null of seed {opts.seed + k}",
                                                   chunk_positions=chunk_positions(token_ids, opts.positions))
                table = _boot(sums, weights, adapter.n_layers, adapter.d_model, opts, device, threads)
                del adapter, sums  # the model goes before the next null is drawn
                run_dir.write_unit(STAGE, key, {"boot": table})
        if run_dir.has_unit(STAGE, key):
            out.append(_boot_rows(run_dir, key, "init", mode, opts.seed + k))
    return out
