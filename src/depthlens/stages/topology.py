"""The ``topology`` stage over models (docs/methods.md#b5): activation-correlation graphs at every
sub-layer boundary, signed Leiden CPM communities, boundary nodes, and their coupling to the
Jacobian amplification of the mean operators (from the ``jacobian`` stage), with BH-FDR.

Boundary ``b`` (0 … SL−1, with S sub-layers a layer) is the input of operator ``b``:
``b = Sl`` the pre-attention residual of layer ``l`` (input of ``attn``), ``b = Sl + 1`` its
pre-MLP residual (input of ``mlp``) and, where layers have a per-layer-input update (Gemma 4,
S = 3), ``b = Sl + 2`` the residual before it (input of ``ple``). The resolution γ is chosen
once per checkpoint from a resolution profile of a reference boundary (the middle one) and
reused at every boundary, so communities are comparable across depth; the profile, γ, seed
and iterations are recorded.

Prompts (a prompts file, each prompt a chunk of its own length): the observations are each
prompt's analysed positions at or after ``skip_positions``; the massive dimensions are those
massive at some real position of some prompt (as every position of a text chunk counts).
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ..data import Chunks, as_chunks
from ..errors import InputError, RunError
from ..executors.local import READ_AHEAD_BYTES, InlineExecutor, executor, read_ahead, submitted
from ..models.adapter import SUBLAYERS
from ..residual import massive_mask
from ..runs import RunDirectory
from ..topology import (
    RunningMoments,
    amplification,
    boundary_nodes,
    choose_plateau,
    coupling_table,
    participation_coefficient,
    resolution_profile,
    signed_leiden,
    topk_graph,
)
from ..topology.options import TopologyOptions
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

STAGE = "topology"
#: Boundaries handed to the workers ahead of the one being written (bounds the arrays in flight).
PENDING = 8


#: Fewest observations (token positions over all chunks, after ``skip_positions``) the
#: correlations need: with 2 every |r| is 1, every node has the same participation and no
#: node is a boundary node (tried on every random family; 3 is enough).
MIN_OBSERVATIONS = 3


def check(config: RunConfig) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads): each chunk
    needs a position after the first ``skip_positions``, and all chunks together
    :data:`MIN_OBSERVATIONS` positions for the correlations.

    Raises
    ------
    InputError
        Naming ``--seq-len`` or ``--chunks`` and the smallest value that works.
    """
    if config.prompts:
        return  # the prompts' own lengths and positions: check_chunks, once they are tokenized
    skip, chunks, seq_len = config.options(STAGE).skip_positions, config.chunks, config.seq_len
    if seq_len <= skip:
        raise InputError(f"--seq-len {seq_len} leaves no positions for the topology stage, which skips the first "
                         f"{skip} of each chunk; pass --seq-len {skip + 1} or more.")
    per_chunk = seq_len - skip
    if chunks * per_chunk < MIN_OBSERVATIONS:
        need_chunks = -(-MIN_OBSERVATIONS // per_chunk)
        need_len = skip + -(-MIN_OBSERVATIONS // chunks)
        raise InputError(f"--chunks {chunks} with --seq-len {seq_len} give the topology stage {chunks * per_chunk} "
                         f"position(s) after skipping the first {skip} of each chunk, and its correlations need "
                         f"{MIN_OBSERVATIONS}; pass --chunks {need_chunks} or --seq-len {need_len} or more.")


def check_chunks(config: RunConfig, chunks: Chunks) -> None:
    """Refuse the prompts of a prompts file whose analysed positions at or after
    ``skip_positions`` are fewer than :data:`MIN_OBSERVATIONS` in all (before anything is written).

    Raises
    ------
    InputError
        Naming ``--skip-positions`` and the prompts file.
    """
    skip = config.options(STAGE).skip_positions
    n = int(chunks.analysed[:, skip:].sum())
    if n < MIN_OBSERVATIONS:
        raise InputError(f"the prompts of {chunks.source} give the topology stage {n} analysed position(s) at or after "
                         f"position {skip} (--skip-positions {skip}), and its correlations need {MIN_OBSERVATIONS}; add "
                         "prompts or positions, or lower --skip-positions.")


def boundary_moments(adapter, token_ids: torch.Tensor | Chunks, opts: TopologyOptions, batch_size: int,
                     quiet: bool, label: str = "", scratch: Path | None = None, threads: int = 1
                     ) -> tuple[list[RunningMoments], np.ndarray]:
    """Streaming correlations of residual coordinates at every operator input boundary, and
    a (boundaries, d) mask of dimensions holding a massive activation in some chunk.
    ``label`` names the model in the progress bar (e.g. ``step-0 null``). With ``scratch`` (a
    new ``.npy`` path) the co-moments live in that memory-mapped file, not in memory (64
    boundaries of d = 4096 hold 8.6 GB); the numbers are the same bit for bit.

    Observations: each chunk's analysed positions at or after ``skip_positions`` (every
    position of a text chunk); massive dimensions: those massive at some real position of some
    chunk. The boundaries of a batch are updated on ``threads`` threads, each calling a
    one-thread BLAS (each boundary's moments see the batches in order, so the numbers depend on
    neither), and where a batch's states take at most
    :data:`~depthlens.executors.local.READ_AHEAD_BYTES` the next batch's forward pass runs
    meanwhile (:func:`~depthlens.executors.local.read_ahead`).
    """
    n_bound, d = len(adapter.sublayers) * adapter.n_layers, adapter.d_model
    chunks = as_chunks(token_ids)
    if not chunks.ragged and chunks.ids.shape[1] <= opts.skip_positions:
        raise InputError(f"--seq-len {chunks.ids.shape[1]} leaves no positions after skipping the first "
                         f"{opts.skip_positions}; pass --seq-len {opts.skip_positions + 1} or more.")
    backing = None if scratch is None else np.lib.format.open_memmap(scratch, mode="w+", dtype=np.float64,
                                                                     shape=(n_bound, d, d))
    moments = [RunningMoments(d, out=None if backing is None else backing[b].T) for b in range(n_bound)]
    massive = np.zeros((n_bound, d), dtype=bool)
    batches = [chunks.take(slice(start, start + batch_size)) for start in range(0, len(chunks), batch_size)]
    states = (adapter.residual_states(batch.ids).to(torch.float64).cpu().numpy() for batch in batches)
    if (n_bound + 1) * min(batch_size, len(chunks)) * chunks.ids.shape[1] * d * 8 <= READ_AHEAD_BYTES:
        states = read_ahead(states)
    bar = tqdm(total=len(chunks), desc=f"topology correlations {label}".strip(), unit="chunk", disable=quiet)
    with ThreadPoolExecutor(max(1, threads)) as pool, threadpool_limits(1, user_api="blas"):
        for batch, h in zip(batches, states):
            observed = [p[p >= opts.skip_positions] for p in (batch.positions(i) for i in range(len(batch)))]
            lengths = [int(n) for n in batch.lengths]
            list(pool.map(functools.partial(_add_boundary, moments, massive, h, observed, lengths), range(n_bound)))
            bar.update(len(batch))
    bar.close()
    return moments, massive


def _add_boundary(moments: list[RunningMoments], massive: np.ndarray, h: np.ndarray, observed: list[np.ndarray],
                  lengths: list[int], b: int) -> None:
    """Add boundary ``b`` of a batch's states ``h`` (states, chunks, positions, d): its chunks'
    ``observed`` positions to ``moments[b]``, their massive dimensions (over each chunk's
    ``lengths`` real positions) to ``massive[b]``."""
    moments[b].update(np.concatenate([h[b, i, pos] for i, pos in enumerate(observed)]))
    for i, n in enumerate(lengths):
        massive[b] |= massive_mask(h[b, i, :n]).any(axis=0)


def boundary_rows(R: np.ndarray, J: np.ndarray, keep: np.ndarray, gamma: float, opts: TopologyOptions,
                  boundary: int) -> tuple[dict, pd.DataFrame]:
    """Communities, participation coefficients, boundary-node flags and amplification at one boundary."""
    nodes = np.flatnonzero(keep)
    edges = topk_graph(R[np.ix_(nodes, nodes)], k=min(opts.topk, len(nodes) - 1))
    membership, record = signed_leiden(edges, len(nodes), gamma, seed=opts.seed)
    pc = participation_coefficient(edges, len(nodes), membership)
    is_boundary = boundary_nodes(pc, opts.boundary_quantile)
    amp = amplification(J, opts.amplification)[nodes]
    node_rows = pd.DataFrame({"boundary_index": boundary, "dim": nodes, "community": membership,
                              "participation_coefficient": pc, "is_boundary_node": is_boundary, "amplification": amp})
    summary = {"boundary_index": boundary, "gamma": gamma, "n_communities": record.n_communities,
               "sizes": json.dumps(list(record.sizes)), "quality": record.quality, "seed": record.seed,
               "iterations": record.iterations, "n_nodes": len(nodes), "n_edges": len(edges.weight)}
    return summary, node_rows


def _saved_arrays(run_dir: RunDirectory, mode: str) -> Callable[[str, Callable], dict]:
    """The float64 mean operators the jacobian stage saved (:func:`depthlens.jacobian.store.saved_operators`)."""
    from ..jacobian.store import saved_operators

    def read(name: str, get: Callable) -> dict:
        found = saved_operators(run_dir, name, mode)
        if found is None:
            raise RunError(f"the float64 {mode} operators of checkpoint {name} are missing from {run_dir.root}; "
                           f"run the jacobian stage with mode {mode} first.")
        return found

    return read


def run(context: StageContext) -> None:
    """Run the stage on every checkpoint of the jacobian stage (:func:`analyse_checkpoints`)
    and write its tables and ``topology.json``. The mean operators are the jacobian stage's,
    in float64 whatever ``--save-arrays`` (recomputed when only a reduced copy was saved)."""
    from ..jacobian import store as jacobian_store

    opts, jopts = context.options, context.config.options("jacobian")
    batch_size, quiet = context.config.batch_size, context.execution.quiet

    def operators(name: str, get: Callable) -> dict:
        return jacobian_store.operators(context.run_dir, name, opts.jacobian_mode, get, context.chunks, jopts,
                                        batch_size=batch_size, quiet=quiet)

    ckpts = jacobian_store.checkpoints(context.loaded, jopts, context.load_revision)
    with executor(context.execution, context.run_dir.root) as pool:
        tables = analyse_checkpoints(context.run_dir, ckpts, context.chunks, opts, batch_size=batch_size, quiet=quiet,
                                     operators=operators, pool=pool,
                                     threads=context.execution.threads)
    for name, table in tables.items():
        table.insert(0, "revision", context.revision_column(table["checkpoint"]))
        context.write_table(name, table)
    coupling = tables["coupling"].groupby("checkpoint", sort=False)
    context.run_dir.write_json("topology", {
        "significant_layers": {name: int(t["significant"].sum()) for name, t in coupling},
        "q_level": opts.q_level, "n_boundaries": {name: len(t) for name, t in coupling}})


def analyse_checkpoints(run_dir: RunDirectory, checkpoints: list[tuple[str, Callable]], token_ids: torch.Tensor | Chunks,
                        opts: TopologyOptions, *, batch_size: int, quiet: bool,
                        operators: Callable[[str, Callable], dict] | None = None, pool: Executor | None = None,
                        threads: int = 1) -> dict[str, pd.DataFrame]:
    """Run the stage for each ``(checkpoint, loader)`` and return the ``communities``,
    ``nodes``, ``coupling`` and ``topology_profile`` tables. Needs the jacobian stage's mean operators:
    ``operators(name, loader)`` gives them as ``{(layer, sublayer): J}`` in float64
    (:func:`depthlens.jacobian.store.operators`; default: read the saved arrays), and is
    called only when a boundary unit of that checkpoint is still to do. The boundaries' Leiden
    runs go to ``pool`` (:func:`depthlens.executors.local.executor`; default inline); the results do
    not depend on it, nor on ``threads``, those of the correlations (:func:`boundary_moments`).
    Each checkpoint is one isolated unit of failure (``checkpoint_<name>`` in
    ``run_dir.failures``); the tables hold the checkpoints that finished."""
    from ..jacobian.store import label

    communities, node_tables, coupling, profiles = [], [], [], []
    operators = operators or _saved_arrays(run_dir, opts.jacobian_mode)
    pool = pool if pool is not None else InlineExecutor()
    op_table = run_dir.read_table("operators")
    for name, get in checkpoints:
        get = functools.cache(get)  # the operators may need the model too (recomputed)
        with run_dir.failures.unit(STAGE, f"checkpoint_{name}"), contextlib.ExitStack() as stack:
            ops = op_table[(op_table["checkpoint"] == name) & (op_table["jacobian_mode"] == opts.jacobian_mode)
                           & (op_table["sublayer"] != "layer")]  # the sub-layer operators only
            if ops.empty:
                raise RunError(f"the jacobian stage has no {opts.jacobian_mode} operators of checkpoint {name}; "
                               f"run it with --jacobian-mode {opts.jacobian_mode} or both first.")
            subs = [kind for kind in SUBLAYERS if kind in set(ops["sublayer"])]  # a layer's, in order
            keys = [f"{STAGE}_{name}_{b:03d}" for b in range(len(ops))]
            profile_key = f"profile_{name}"
            if not all(run_dir.has_unit(STAGE, k) for k in [profile_key, *keys]):
                J = operators(name, get)
                loaded = get()
                scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="depthlens-moments-"))
                moments, massive = boundary_moments(loaded.adapter, token_ids, opts, batch_size, quiet, label(name),
                                                    Path(scratch) / "moments.npy", threads=threads)
                keep_all = ~massive if opts.exclude_massive else np.ones_like(massive)
                ref = len(moments) // 2

                def profile_unit() -> dict[str, pd.DataFrame]:
                    nodes = np.flatnonzero(keep_all[ref])
                    R = moments[ref].correlation()[np.ix_(nodes, nodes)]
                    prof = resolution_profile(topk_graph(R, k=min(opts.topk, len(nodes) - 1)), len(nodes),
                                              seed=opts.seed, pool=pool)
                    plateau = choose_plateau(prof)
                    chosen = prof.table.index == plateau.row
                    return {"profile": prof.table.assign(reference_boundary_index=ref, chosen=chosen)}

                prof_table = run_dir.unit(STAGE, profile_key, profile_unit)["profile"]
                gamma = float(prof_table.loc[prof_table["chosen"], "gamma"].iloc[0])
                todo = [b for b, key in enumerate(keys) if not run_dir.has_unit(STAGE, key)]
                tasks = ((moments[b].correlation(), J[(b // len(subs), subs[b % len(subs)])], keep_all[b], gamma,
                          opts, b) for b in todo)
                bar = tqdm(total=len(keys), initial=len(keys) - len(todo), desc=f"topology {label(name)}",
                           unit="boundary", disable=quiet)
                for b, future in zip(todo, submitted(pool, boundary_rows, tasks, max_pending=PENDING)):
                    summary, node_rows = future.result()
                    run_dir.write_unit(STAGE, keys[b], {"communities": pd.DataFrame([summary]), "nodes": node_rows})
                    bar.update()
                bar.close()
            prof_table = run_dir.read_units(STAGE, [profile_key], "profile")
            comm = run_dir.read_units(STAGE, keys, "communities")
            node_table = run_dir.read_units(STAGE, keys, "nodes")
            inputs = {int(b): (g["amplification"].to_numpy(), g["is_boundary_node"].to_numpy())
                      for b, g in node_table.groupby("boundary_index")}
            table, _ = coupling_table(inputs, n_perm=opts.n_perm, seed=opts.seed)
            table = table.rename(columns={"layer": "boundary_index"})
            table.insert(1, "layer", table["boundary_index"] // len(subs))
            table.insert(2, "sublayer", np.asarray(subs)[table["boundary_index"] % len(subs)])
            table = table.merge(ops[["layer", "sublayer", "henrici_update_rel", "symmetry", "symmetry_update"]],
                                on=["layer", "sublayer"], how="left")
            table["significant"] = table["q"] <= opts.q_level
            for part, sink in ((comm, communities), (node_table, node_tables), (table, coupling), (prof_table, profiles)):
                part.insert(0, "checkpoint", name)
                sink.append(part)
    if not coupling:
        raise RunError("the topology stage failed at every checkpoint; see its log.")
    return {name: pd.concat(parts, ignore_index=True) for name, parts in (
        ("communities", communities), ("nodes", node_tables), ("coupling", coupling), ("topology_profile", profiles))}
