"""Workers and aggregation of the attention stage (METHODS A1–A6): arrays and seeds in,
rows and tables out. :mod:`depthlens.attention.stage` runs them over a model in phases:

1. ``probe``: the ``[BOS, r, r]`` probe gives previous-token, duplicate and induction scores
   per head, and, for routing heads, the induction-engagement ratio of the excess reserve.
2. ``heads``: natural-text chunks in batches; for every matrix all A3 features, on the first
   ``null_chunks`` chunks ``null_samples`` matched nulls, on the first ``extras_chunks``
   chunks the ε-pseudospectral radii and numerical range.
3. ``certify``: the certified ``K(B)`` bracket of each head's median chunk (or of every
   matrix with ``certify="all"``).
4. ``depth``: depth products of ``mean``, ``rollout`` and the routing / sink chains, on the
   model and on layer-wise shuffled nulls (first ``null_chunks`` chunks).

The worker functions take arrays and seeds only, so results do not depend on ``jobs``.
"""

from __future__ import annotations

import math
from dataclasses import asdict

import numpy as np
import pandas as pd

from ..errors import DecompositionError
from ..linalg.nulls import shuffle_null
from ..stats import bh_qvalues, log_median, sign_test
from . import features
from .depth import depth_table, layer_operators
from .options import AttentionOptions

STAGE = "attention"
#: Per-chunk quantities aggregated per head by the median of logs (scale quantities).
SCALE = ("norm_B", "kreiss_B", "kreiss_B_upper", "peak_B", "num_radius_B")
#: Per-chunk 0/1 flags aggregated per head by the minimum (1 only if every chunk has it).
FLAGS = ("peak_certified",)


# ----------------------------------------------------------------------------- workers
def null_rng(seed: int, *keys: int) -> np.random.Generator:
    """The random stream of one unit of null work, keyed by the run seed and the unit's indices."""
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def head_chunk_row(
    A: np.ndarray, layer: int, head: int, chunk: int, opts: AttentionOptions, nulls: bool, extras: bool, certify: bool
) -> dict:
    """Every per-matrix quantity of one (layer, head, chunk) attention matrix ``A`` (n, n):
    the A3 features, the matched-null excess on null chunks, and optionally the certified
    Kreiss bracket. The null stream is seeded by ``(seed, layer, head, chunk)``. ``failure``
    is None, or the reason why no driver of :mod:`depthlens.linalg.guarded` converged (the
    quantities of that row are then missing)."""
    keys = {"layer": layer, "head": head, "chunk": chunk, "extras": extras}
    try:
        row = {**keys, **features.matrix_features(A, extras=extras)}
        if nulls:
            tr = features.null_reserves(A, opts.null_mode, opts.null_samples, null_rng(opts.seed, 1, layer, head, chunk))
            sd = float(tr.std(ddof=1)) if tr.size > 1 else math.nan
            row.update(null_TR1_mean=float(tr.mean()), null_TR1_sd=sd)
            row["delta_TR1"] = row["TR1"] - row["null_TR1_mean"]
            row["z_TR1"] = row["delta_TR1"] / sd if sd > 0 else math.nan
        if certify:
            row.update(features.certified_reserve(A, opts.rtol, opts.certify_evals))
    except DecompositionError as exc:
        return failed_row(keys, exc)
    return {**row, "failure": None}


def failed_row(keys: dict, exc: DecompositionError) -> dict:
    """The row of a matrix that no decomposition driver could handle: its keys and the
    reason in ``failure``; every quantity is missing (NaN once tabulated)."""
    return {**keys, "failure": str(exc)}


def excess_reserve(A: np.ndarray, opts: AttentionOptions, rng: np.random.Generator) -> float:
    """``Δ_TR = TR1(B) − mean_s TR1(B̃_s)`` of one matrix against its matched null."""
    tr = math.log(features.kreiss_b(features.deflate(A), upper=False).value)
    return tr - float(features.null_reserves(A, opts.null_mode, opts.null_samples, rng).mean())


def certify_row(A: np.ndarray, layer: int, head: int, chunk: int, opts: AttentionOptions) -> dict:
    """Certified bracket of ``K(B)`` for one (layer, head, chunk) matrix ``A``."""
    keys = {"layer": layer, "head": head, "chunk": chunk}
    try:
        return {**keys, **features.certified_reserve(A, opts.rtol, opts.certify_evals), "failure": None}
    except DecompositionError as exc:
        return failed_row(keys, exc)


def induction_row(A: np.ndarray, layer: int, head: int, seq: int, length: int, opts: AttentionOptions) -> dict:
    """Excess reserve of a probe matrix with induction engaged (the whole ``[BOS, r, r]``
    matrix) and before it can engage (the leading ``[BOS, r]`` block, itself causal
    row-stochastic), each against its own matched null."""
    rng = null_rng(opts.seed, 3, layer, head, seq)
    keys = {"layer": layer, "head": head, "seq": seq}
    try:
        return {**keys, "delta_second": excess_reserve(A, opts, rng),
                "delta_first": excess_reserve(A[: length + 1, : length + 1], opts, rng)}
    except DecompositionError as exc:
        return {**keys, "delta_second": math.nan, "delta_first": math.nan, "failure": str(exc)}


def depth_chunk_rows(
    probs: np.ndarray, chains: dict[str, list[int]], chunk: int, opts: AttentionOptions, nulls: bool
) -> pd.DataFrame:
    """Depth tables of one chunk from every layer's attention matrices ``probs (L, H, n, n)``:
    the ``mean``, ``rollout`` and ``chain_<name>`` operators (head ``chains[name][layer]``),
    and with ``nulls`` the same operators of ``null_samples`` layer-wise shuffled nulls, the
    stream of layer ``l`` seeded by ``(seed, 2, l, chunk)``."""
    per_kind: dict[str, list[np.ndarray]] = {}
    for layer, A in enumerate(probs):
        choice = {name: heads[layer] for name, heads in chains.items()}
        ops = layer_operators(A, choice)
        if nulls:
            shuffled = shuffle_null(A, opts.null_mode, opts.null_samples, rng=null_rng(opts.seed, 2, layer, chunk))
            null_ops = layer_operators(shuffled, choice)
        for kind, op in ops.items():
            per_kind.setdefault(kind, []).append(np.concatenate([op[None], null_ops[kind]]) if nulls else op[None])
    return _depth_rows({k: np.stack(v) for k, v in per_kind.items()}, chunk)


def _depth_rows(stacks: dict[str, np.ndarray], chunk: int) -> pd.DataFrame:
    """Depth tables of one chunk: ``stacks[kind]`` has shape (L, 1 + S, n, n), sample 0 the model."""
    tables = []
    for kind, stack in stacks.items():
        table = depth_table(stack)
        table.insert(0, "operator", kind)
        table.insert(1, "chunk", chunk)
        table.insert(2, "sample", table.pop("item") - 1)
        tables.append(table)
    out = pd.concat(tables, ignore_index=True)
    out.insert(2, "source", np.where(out["sample"] < 0, "model", "null"))
    return out


# ----------------------------------------------------------------------------- aggregation
def aggregate_heads(chunks: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head): medians over chunks (median of logs for scale quantities,
    the minimum for 0/1 flags),
    null excess statistics with a sign test over chunks and BH q-values over all heads."""
    keys = ["layer", "head"]
    groups = chunks.groupby(keys, sort=True)
    value_cols = [c for c in chunks.columns if c not in (*keys, "chunk", "extras") and chunks[c].dtype.kind == "f"]

    def agg(col: str, g: pd.Series) -> float:
        v = g.dropna().to_numpy()
        if v.size == 0:
            return math.nan
        if col in FLAGS:
            return float(v.min())
        if col in SCALE or col.startswith("psr_B") or col.startswith("henrici_") and not col.endswith("_rel"):
            return log_median(v) if np.all(v > 0) else float(np.median(v))
        return float(np.median(v))

    out = pd.DataFrame({col: groups[col].apply(lambda g, c=col: agg(c, g)) for col in value_cols}).reset_index()
    out["n_chunks"] = groups.size().to_numpy()
    out["n_extras_chunks"] = groups["extras"].sum().to_numpy().astype(int)
    out["kreiss_A_flagged"] = groups["kreiss_A_ok"].apply(lambda g: int((g < 1).sum())).to_numpy()
    if "failure" in chunks:
        out["n_failed_chunks"] = groups["failure"].apply(lambda g: int(g.notna().sum())).to_numpy()
    if "delta_TR1" in chunks:
        out["null_p"] = groups["delta_TR1"].apply(lambda g: sign_test(g.dropna().to_numpy())).to_numpy()
        out["n_null_chunks"] = groups["delta_TR1"].count().to_numpy()
        out["null_q"] = bh_qvalues(out["null_p"].to_numpy())
    return out


def median_chunks(chunks: pd.DataFrame) -> pd.DataFrame:
    """For every head, the chunk whose ``TR1`` is the lower median over chunks."""
    ordered = chunks.sort_values(["layer", "head", "TR1", "chunk"])
    counts = ordered.groupby(["layer", "head"]).cumcount()
    sizes = ordered.groupby(["layer", "head"])["chunk"].transform("size")
    return ordered[counts == (sizes - 1) // 2][["layer", "head", "chunk"]].reset_index(drop=True)


def chain_heads(heads: pd.DataFrame) -> dict[str, list[int]]:
    """Per layer, the most routing-like head (max of previous-token and induction score) and
    the head with the largest natural-text sink mass."""
    heads = heads.sort_values(["layer", "head"])
    routing_score = heads[["prev_token_score", "induction_score"]].max(axis=1)
    out: dict[str, list[int]] = {"routing": [], "sink": []}
    for layer, idx in heads.groupby("layer").groups.items():
        out["routing"].append(int(heads.loc[routing_score.loc[idx].idxmax(), "head"]))
        out["sink"].append(int(heads.loc[heads.loc[idx, "sink_mass"].idxmax(), "head"]))
    return out


def summarise(heads: pd.DataFrame, depth: pd.DataFrame, q_level: float = 0.05) -> dict:
    """The JSON summary: signed organisation, K(A) check counts and eig_gap model vs null."""
    routing = heads[heads["role"] == "routing"]
    sink = heads[heads["role"] == "sink"]
    sig = heads["null_q"] <= q_level

    def frac(mask: pd.Series, base: pd.DataFrame) -> float | None:
        return float(mask.loc[base.index].mean()) if len(base) else None

    final = depth[depth["depth"] == depth["depth"].max()]
    gaps = {}
    for (op, source), g in final.groupby(["operator", "source"]):
        gaps.setdefault(op, {})[source] = {
            "median_gap_e1": float(np.median(g["gap_e1"])),
            "median_gap_e2": float(np.median(g["gap_e2"])),
        }
    return {
        "n_heads": int(len(heads)),
        "roles": {k: int(v) for k, v in heads["role"].value_counts().items()},
        "routing_positive_significant": frac(sig & (heads["delta_TR1"] > 0), routing),
        "sink_negative": frac(heads["delta_TR1"] < 0, sink),
        "sink_negative_significant": frac(sig & (heads["delta_TR1"] < 0), sink),
        "q_level": q_level,
        "kreiss_A_flagged_matrices": int(heads["kreiss_A_flagged"].sum()),
        "eig_gap_final_depth": gaps,
        "induction_ratio_median": (float(np.nanmedian(routing["induction_ratio"]))
                                   if len(routing) and routing["induction_ratio"].notna().any() else None),
    }


def options_record(opts: AttentionOptions) -> dict:
    """The options as a JSON-serialisable dict."""
    return asdict(opts)
