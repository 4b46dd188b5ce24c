"""The ``topology`` stage over models (METHODS B5): activation-correlation graphs at every
sub-layer boundary, signed Leiden CPM communities, boundary nodes, and their coupling to the
Jacobian amplification of the mean operators (from the ``jacobian`` stage), with BH-FDR.

Boundary ``b`` (0 … 2L−1) is the input of operator ``b``: ``b = 2l`` the pre-attention
residual of layer ``l`` (input of ``attn``), ``b = 2l + 1`` its pre-MLP residual (input of
``mlp``). The resolution γ is chosen once per checkpoint from a resolution profile of a
reference boundary (the middle one) and reused at every boundary, so communities are
comparable across depth; the profile, γ, seed and iterations are recorded.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..errors import InputError, RunError
from ..residual import massive_mask
from ..runs import RunDirectory
from . import (
    RunningMoments,
    amplification,
    boundary_nodes,
    choose_plateau,
    coupling_table,
    participation,
    resolution_profile,
    signed_leiden,
    topk_graph,
)

STAGE = "topology"
AMPLIFICATION = ("column", "row", "diagonal")


@dataclass(frozen=True)
class TopologyOptions:
    """Parameters of the topology stage.

    Parameters
    ----------
    topk : int
        Strongest |r| neighbours kept per node before symmetrising.
    skip_positions : int
        Leading positions of every chunk left out of the correlations.
    exclude_massive : bool
        Drop massive-activation dimensions (METHODS A7 rule) from the graph.
    boundary_quantile : float
        Participation quantile above which a node is a boundary node.
    amplification : {"column", "row", "diagonal"}
        Jacobian amplification per unit.
    n_perm : int
        Label permutations per boundary.
    q_level : float
        FDR level of the headline count.
    mode : str
        Which mean operators (Jacobian mode) give the amplification.
    seed : int
        Seed of Leiden and of the permutations.
    """

    topk: int = 20
    skip_positions: int = 4
    exclude_massive: bool = False
    boundary_quantile: float = 0.75
    amplification: str = "column"
    n_perm: int = 1000
    q_level: float = 0.05
    mode: str = "isolated"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.amplification not in AMPLIFICATION:
            raise InputError(f"--amplification {self.amplification!r} is unknown; use one of {', '.join(AMPLIFICATION)}.")
        for flag, value in (("--topk", self.topk), ("--n-perm", self.n_perm)):
            if value < 1:
                raise InputError(f"{flag} {value} must be at least 1.")
        if self.skip_positions < 0:
            raise InputError(f"skip_positions {self.skip_positions} must be at least 0 (TopologyOptions).")
        if not 0.0 < self.boundary_quantile < 1.0:
            raise InputError(f"boundary_quantile {self.boundary_quantile} must lie in (0, 1) (TopologyOptions).")


#: Fewest observations (token positions over all chunks, after ``skip_positions``) the
#: correlations need: with 2 every |r| is 1, every node has the same participation and no
#: node is a boundary node (tried on every random family; 3 is enough).
MIN_OBSERVATIONS = 3


def check_sizes(chunks: int, seq_len: int, opts: TopologyOptions) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads): each chunk
    needs a position after the first ``skip_positions``, and all chunks together
    :data:`MIN_OBSERVATIONS` positions for the correlations.

    Raises
    ------
    InputError
        Naming ``--seq-len`` or ``--chunks`` and the smallest value that works.
    """
    skip = opts.skip_positions
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


def boundary_moments(adapter, token_ids: torch.Tensor, opts: TopologyOptions, batch_size: int,
                     quiet: bool, label: str = "") -> tuple[list[RunningMoments], np.ndarray]:
    """Streaming correlations of residual coordinates at every operator input boundary, and
    a (boundaries, d) mask of dimensions holding a massive activation in some chunk.
    ``label`` names the model in the progress bar (e.g. ``step-0 null``)."""
    n_bound = 2 * adapter.n_layers
    moments = [RunningMoments(adapter.d_model) for _ in range(n_bound)]
    massive = np.zeros((n_bound, adapter.d_model), dtype=bool)
    if token_ids.shape[1] <= opts.skip_positions:
        raise InputError(f"--seq-len {token_ids.shape[1]} leaves no positions after skipping the first {opts.skip_positions}; "
                         f"pass --seq-len {opts.skip_positions + 1} or more.")
    bar = tqdm(total=token_ids.shape[0], desc=f"topology correlations {label}".strip(), unit="chunk", disable=quiet)
    for start in range(0, token_ids.shape[0], batch_size):
        states = adapter.residual_states(token_ids[start : start + batch_size]).to(torch.float64).numpy()
        for b in range(n_bound):
            h = states[b, :, opts.skip_positions :, :]
            moments[b].update(h.reshape(-1, h.shape[-1]))
            for chunk in states[b]:
                massive[b] |= massive_mask(chunk).any(axis=0)
        bar.update(states.shape[1])
    bar.close()
    return moments, massive


def boundary_rows(R: np.ndarray, J: np.ndarray, keep: np.ndarray, gamma: float, opts: TopologyOptions,
                  boundary: int) -> tuple[dict, pd.DataFrame]:
    """Communities, participation, boundary flags and amplification at one boundary."""
    nodes = np.flatnonzero(keep)
    edges = topk_graph(R[np.ix_(nodes, nodes)], k=min(opts.topk, len(nodes) - 1))
    membership, record = signed_leiden(edges, len(nodes), gamma, seed=opts.seed)
    pc = participation(edges, len(nodes), membership)
    is_boundary = boundary_nodes(pc, opts.boundary_quantile)
    amp = amplification(J, opts.amplification)[nodes]
    units = pd.DataFrame({"boundary": boundary, "unit": nodes, "community": membership,
                          "participation": pc, "is_boundary": is_boundary, "amplification": amp})
    summary = {"boundary": boundary, "gamma": gamma, "n_communities": record.n_communities,
               "sizes": json.dumps(list(record.sizes)), "quality": record.quality, "seed": record.seed,
               "iterations": record.iterations, "n_nodes": len(nodes), "n_edges": len(edges.weight)}
    return summary, units


def _saved_arrays(run_dir: RunDirectory, mode: str) -> Callable[[str, Callable], dict]:
    """The float64 mean operators the jacobian stage saved (:func:`depthlens.jacobian.stage.saved_operators`)."""
    from ..jacobian.stage import saved_operators

    def read(name: str, get: Callable) -> dict:
        found = saved_operators(run_dir, name, mode)
        if found is None:
            raise RunError(f"the float64 {mode} operators of checkpoint {name} are missing from {run_dir.root}; "
                           f"run the jacobian stage with mode {mode} first.")
        return found

    return read


def run(run_dir: RunDirectory, checkpoints: list[tuple[str, Callable]], token_ids: torch.Tensor,
        opts: TopologyOptions, *, batch_size: int, quiet: bool,
        operators: Callable[[str, Callable], dict] | None = None) -> None:
    """Run the stage for each ``(checkpoint, loader)`` and write ``communities``, ``units``,
    ``coupling`` and ``topology_profile`` tables. Needs the jacobian stage's mean operators:
    ``operators(name, loader)`` gives them as ``{(layer, sublayer): J}`` in float64
    (:func:`depthlens.jacobian.stage.operators`; default: read the saved arrays), and is
    called only when a boundary unit of that checkpoint is still to do.
    Each checkpoint is one isolated unit of failure (``checkpoint_<name>`` in
    ``run_dir.failures``); the tables hold the checkpoints that finished."""
    from ..jacobian.stage import label

    communities, units, coupling, profiles = [], [], [], []
    operators = operators or _saved_arrays(run_dir, opts.mode)
    op_table = run_dir.read_table("operators")
    for name, get in checkpoints:
        get = functools.cache(get)  # the operators may need the model too (recomputed)
        with run_dir.failures.unit(STAGE, f"checkpoint_{name}"):
            ops = op_table[(op_table["checkpoint"] == name) & (op_table["mode"] == opts.mode)]
            if ops.empty:
                raise RunError(f"the jacobian stage has no {opts.mode} operators of checkpoint {name}; "
                               f"run it with --jacobian-mode {opts.mode} or both first.")
            keys = [f"{STAGE}_{name}_{b:03d}" for b in range(len(ops))]
            profile_key = f"profile_{name}"
            if not all(run_dir.has_unit(STAGE, k) for k in [profile_key, *keys]):
                J = operators(name, get)
                loaded = get()
                moments, massive = boundary_moments(loaded.adapter, token_ids, opts, batch_size, quiet, label(name))
                keep_all = ~massive if opts.exclude_massive else np.ones_like(massive)
                ref = len(moments) // 2
                if not run_dir.has_unit(STAGE, profile_key):
                    nodes = np.flatnonzero(keep_all[ref])
                    R = moments[ref].correlation()[np.ix_(nodes, nodes)]
                    prof = resolution_profile(topk_graph(R, k=min(opts.topk, len(nodes) - 1)), len(nodes), seed=opts.seed)
                    plateau = choose_plateau(prof)
                    table = prof.table.assign(reference_boundary=ref, chosen=lambda t: t.index == plateau.row)
                    run_dir.write_unit(STAGE, profile_key, {"profile": table})
                prof_table = run_dir.read_units(STAGE, [profile_key], "profile")
                gamma = float(prof_table.loc[prof_table["chosen"], "gamma"].iloc[0])
                bar = tqdm(total=len(keys), desc=f"topology {label(name)}", unit="boundary", disable=quiet)
                for b, key in enumerate(keys):
                    if not run_dir.has_unit(STAGE, key):
                        layer, kind = divmod(b, 2)
                        summary, unit_rows = boundary_rows(moments[b].correlation(), J[(layer, "mlp" if kind else "attn")],
                                                           keep_all[b], gamma, opts, b)
                        run_dir.write_unit(STAGE, key, {"communities": pd.DataFrame([summary]), "units": unit_rows})
                    bar.update()
                bar.close()
            prof_table = run_dir.read_units(STAGE, [profile_key], "profile")
            comm = run_dir.read_units(STAGE, keys, "communities")
            unit_table = run_dir.read_units(STAGE, keys, "units")
            inputs = {int(b): (g["amplification"].to_numpy(), g["is_boundary"].to_numpy())
                      for b, g in unit_table.groupby("boundary")}
            table, _ = coupling_table(inputs, n_perm=opts.n_perm, seed=opts.seed)
            table = table.rename(columns={"layer": "boundary"})
            table.insert(1, "layer", table["boundary"] // 2)
            table.insert(2, "sublayer", np.where(table["boundary"] % 2, "mlp", "attn"))
            table = table.merge(ops[["layer", "sublayer", "henrici_update_rel", "symmetry"]], on=["layer", "sublayer"], how="left")
            table["significant"] = table["q"] <= opts.q_level
            for part, sink in ((comm, communities), (unit_table, units), (table, coupling), (prof_table, profiles)):
                part.insert(0, "checkpoint", name)
                sink.append(part)
    if not coupling:
        raise RunError("the topology stage failed at every checkpoint; see its log.")
    for name, parts in (("communities", communities), ("units", units), ("coupling", coupling),
                        ("topology_profile", profiles)):
        run_dir.write_table(name, pd.concat(parts, ignore_index=True))
    headline = {t["checkpoint"].iloc[0]: int(t["significant"].sum()) for t in coupling}
    run_dir.write_json("topology", {"significant_layers": headline, "q_level": opts.q_level,
                                    "n_boundaries": {t["checkpoint"].iloc[0]: len(t) for t in coupling}})
