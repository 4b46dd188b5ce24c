"""Workers and aggregation of the attention stage (§A1–A6): arrays and seeds in,
rows and tables out. :mod:`depthlens.stages.attention` runs them over a model in phases:

1. ``probe``: the ``[BOS, r, r]`` probe gives previous-token, duplicate and induction scores
   per head.
2. ``heads``: natural-text chunks in batches; for every matrix all A3 features, on the first
   ``null_chunks`` chunks ``null_samples`` matched nulls, on the first ``extras_chunks``
   chunks the ε-pseudospectral radii, numerical range and power-norm upper bound on ``K(B)``.
3. ``certify``: the certified ``K(B)`` bracket of each head's median chunk (or of every
   matrix with ``certify="all"``).
4. ``induction``: for routing heads, the excess reserve of the probe with induction engaged,
   of its first copy and of the length-matched control ``[BOS, r, r′]``, and their ratios.
5. ``depth``: depth products of ``mean``, ``rollout`` and the routing / sink chains, on the
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
from ..stats import INDUCTION, head_rank_tests, log_median
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
    A: np.ndarray, layer: int, head: int, chunk: int, opts: AttentionOptions, nulls: bool, extras: bool, certify: bool,
    rows: np.ndarray | None = None,
) -> dict:
    """Every per-matrix quantity of one (layer, head, chunk) attention matrix ``A`` (n, n):
    the A3 features, the matched-null excess on null chunks, and optionally the certified
    Kreiss bracket. The null stream is seeded by ``(seed, 1, layer, head, chunk)``; besides
    the excess against all ``S`` samples, ``delta_TR1_half`` is the excess against the first
    ``⌈S/2⌉`` of them, which are exactly the samples a run with ``⌈S/2⌉`` nulls draws
    (:func:`~depthlens.linalg.nulls.shuffle_null` draws samples in order), and
    ``null_rank_TR1`` / ``null_rank_TR1_half`` are TR1's ranks among all ``null_n`` = S samples
    and among that first half (:func:`null_rank`). ``failure``
    is None, or the reason why no driver of :mod:`depthlens.linalg.guarded` converged (the
    quantities of that row are then missing). ``rows`` are a prompt's analysed rows
    (:func:`~depthlens.attention.features.matrix_features`); ``A`` is then already trimmed to
    the prompt's length."""
    keys = {"layer": layer, "head": head, "chunk": chunk, "extras": extras}
    try:
        bracket = (opts.rtol, opts.certify_evals) if certify else None
        row = {**keys, **features.matrix_features(A, extras=extras, certify=bracket, rows=rows)}
        if nulls:
            tr = features.null_reserves(A, opts.null_mode, opts.null_samples, null_rng(opts.seed, 1, layer, head, chunk))
            sd = float(tr.std(ddof=1)) if tr.size > 1 else math.nan
            row.update(null_TR1_mean=float(tr.mean()), null_TR1_sd=sd)
            row["delta_TR1"] = row["TR1"] - row["null_TR1_mean"]
            row["z_TR1"] = row["delta_TR1"] / sd if sd > 0 else math.nan
            half = tr[: math.ceil(tr.size / 2)]
            row["delta_TR1_half"] = row["TR1"] - float(half.mean())
            row.update(null_n=int(tr.size), null_rank_TR1=null_rank(row["TR1"], tr),
                       null_rank_TR1_half=null_rank(row["TR1"], half))
    except DecompositionError as exc:
        return failed_row(keys, exc)
    return {**row, "failure": None}


def null_rank(value: float, nulls: np.ndarray) -> float:
    """Rank of ``value`` among its null samples: how many lie below it, ties counting one half
    (uniform on ``{0, …, S}`` when the value is exchangeable with the ``S`` samples; what
    :func:`~depthlens.stats.pooled_rank_test` pools over chunks). Exact comparisons."""
    return float(np.sum(nulls < value) + 0.5 * np.sum(nulls == value))


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


def induction_row(
    A: np.ndarray, control: np.ndarray, layer: int, head: int, seq: int, length: int, opts: AttentionOptions
) -> dict:
    """Excess reserves of one head on one probe sequence, each matrix against its own matched
    null: the whole ``[BOS, r, r]`` probe matrix ``A`` (induction engaged, n = 2m + 1), its
    leading ``[BOS, r]`` block (before induction can engage, n = m + 1; itself causal
    row-stochastic) and the length-matched control matrix ``control`` of ``[BOS, r, r′]``
    (n = 2m + 1, no repeat). The nulls of ``A`` and of its block are drawn in turn from the
    stream ``(seed, 3, layer, head, seq)``, those of the control from ``(seed, 4, layer, head, seq)``."""
    rng = null_rng(opts.seed, 3, layer, head, seq)
    keys = {"layer": layer, "head": head, "seq": seq}
    try:
        return {**keys, "delta_TR1_second_copy": excess_reserve(A, opts, rng),
                "delta_TR1_first_copy": excess_reserve(A[: length + 1, : length + 1], opts, rng),
                "delta_TR1_control": excess_reserve(control, opts, null_rng(opts.seed, 4, layer, head, seq)),
                "failure": None}
    except DecompositionError as exc:
        return {**keys, **dict.fromkeys(INDUCTION, math.nan), "failure": str(exc)}


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
def _is_scale(col: str) -> bool:
    """Whether per-chunk column ``col`` is a scale quantity, aggregated by the median of logs."""
    return col in SCALE or col.startswith("psr_B") or col.startswith("henrici_") and not col.endswith("_rel")


def aggregate_chunks(col: str, values: np.ndarray) -> tuple[float, bool]:
    """The per-head aggregate of column ``col`` over the head's chunks ``values`` (NaNs dropped):
    the minimum for 0/1 flags, the median of logs for scale quantities, else the median (NaN
    when no value is left). The flag is True when a scale quantity had a value ≤ 0 and fell
    back to the plain median."""
    v = values[~np.isnan(values)]
    if v.size == 0:
        return math.nan, False
    if col in FLAGS:
        return float(v.min()), False
    if _is_scale(col):
        return (log_median(v), False) if np.all(v > 0) else (float(np.median(v)), True)
    return float(np.median(v)), False


def aggregate_heads(chunks: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head): :func:`aggregate_chunks` of every per-chunk quantity,
    ``plain_median`` (the comma-separated scale quantities, in column order, that fell back to
    the plain median; empty when none), null excess statistics with the pooled rank test of
    the head against its nulls over chunks (:func:`~depthlens.stats.head_rank_tests`) and BH
    q-values over all heads."""
    keys = ["layer", "head"]
    groups = chunks.groupby(keys, sort=True)
    value_cols = [c for c in chunks.columns if c not in (*keys, "chunk", "extras") and chunks[c].dtype.kind == "f"]
    cells = {col: groups[col].apply(lambda g, c=col: aggregate_chunks(c, g.to_numpy(dtype=np.float64)))
             for col in value_cols}
    out = pd.DataFrame({col: cell.map(lambda t: t[0]) for col, cell in cells.items()}).reset_index()
    out["plain_median"] = [",".join(col for col in value_cols if cells[col].iloc[i][1]) for i in range(len(out))]
    out["n_chunks"] = groups.size().to_numpy()
    out["n_extras_chunks"] = groups["extras"].sum().to_numpy().astype(int)
    out["kreiss_A_flagged"] = groups["kreiss_A_ok"].apply(lambda g: int((g < 1).sum())).to_numpy()
    if "failure" in chunks:
        out["n_failed_chunks"] = groups["failure"].apply(lambda g: int(g.notna().sum())).to_numpy()
    if "delta_TR1" in chunks:
        tests = head_rank_tests(chunks)  # the same (layer, head) order as the groups
        out["null_p"], out["n_null_chunks"] = tests["p"].to_numpy(), tests["n"].to_numpy()
        out["null_q"] = tests["q"].to_numpy()
    return out


def median_chunks(chunks: pd.DataFrame) -> pd.DataFrame:
    """For every head, the chunk whose ``TR1`` is the lower median over chunks."""
    ordered = chunks.sort_values(["layer", "head", "TR1", "chunk"])
    counts = ordered.groupby(["layer", "head"]).cumcount()
    sizes = ordered.groupby(["layer", "head"])["chunk"].transform("size")
    return ordered[counts == (sizes - 1) // 2][["layer", "head", "chunk"]].reset_index(drop=True)


#: Relative slack above a bracket's upper end for a search value ``kreiss_B``: a lower bound on
#: ``K(B)`` up to the rounding of one ``σ_min`` (about 1e-12 relative at n = 128).
SEARCH_ROUNDING = 1e-9


def bracket_check(heads: pd.DataFrame, chunks: pd.DataFrame, rtol: float) -> np.ndarray:
    """Per row of ``heads``: whether the search value ``kreiss_B`` of the head's certified chunk
    (``certified_chunk``, read from ``chunks``) lies in that chunk's bracket
    ``[kreiss_B_lo, kreiss_B_hi]`` up to the stated tolerances: 1.0 when
    ``lo·(1 − rtol) ≤ kreiss_B ≤ hi·(1 + SEARCH_ROUNDING)``, 0.0 when not, NaN without a bracket.

    The search value is the number every claim uses; it is a lower bound on ``K(B)`` up to
    rounding (hence the small slack above ``hi``) and should equal ``K(B)`` to the bracket's
    relative width ``rtol`` (a search that missed the maximiser by more fails below ``lo``).
    """
    if "certified_chunk" not in heads:
        return np.full(len(heads), np.nan)
    keys = ["layer", "head", "certified_chunk"]
    values = chunks[["layer", "head", "chunk", "kreiss_B"]].rename(columns={"chunk": "certified_chunk"})
    values["certified_chunk"] = values["certified_chunk"].astype(np.float64)
    found = heads[keys].astype({"certified_chunk": np.float64}).merge(values, on=keys, how="left")
    v = found["kreiss_B"].to_numpy(dtype=np.float64)
    lo = heads["kreiss_B_lo"].to_numpy(dtype=np.float64)
    hi = heads["kreiss_B_hi"].to_numpy(dtype=np.float64)
    inside = (v >= lo * (1.0 - rtol)) & (v <= hi * (1.0 + SEARCH_ROUNDING))
    return np.where(np.isnan(v) | np.isnan(lo) | np.isnan(hi), np.nan, inside.astype(np.float64))


def numerical_health(heads: pd.DataFrame) -> dict[str, int]:
    """The ``numerical_health`` block of the summary: ``brackets`` (heads with a Kreiss bracket),
    ``bracket_violations`` (of them, those whose certified chunk's search value lies outside
    it, ``kreiss_B_in_bracket`` = 0), ``uncertified`` (brackets with ``kreiss_B_certified`` = 0:
    the evaluation budget ran out, or ``K = ∞`` rests on a numerical rank decision) and
    ``kreiss_A_flagged`` (matrices whose ``K(A) = √n`` check failed, summed over heads)."""
    check = heads["kreiss_B_in_bracket"]
    return {
        "brackets": int(check.notna().sum()),
        "bracket_violations": int((check == 0).sum()),
        "uncertified": int((heads["kreiss_B_certified"] == 0).sum()),
        "kreiss_A_flagged": int(heads["kreiss_A_flagged"].sum()),
    }


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
    """The JSON summary: signed organisation, K(A) check counts, eig_gap model vs null and
    the induction-engagement ratios.

    ``routing_positive_significant`` / ``sink_negative_significant``: the fraction of routing
    (sink) heads with ``delta_TR1`` > 0 (< 0) and ``null_q`` ≤ ``q_level`` (None without such
    heads). ``induction_routing_heads``: the routing heads considered for the ratios;
    ``induction_excluded_first`` / ``induction_excluded_control``: those of them without
    ``induction_ratio`` (``induction_ratio_control``) because ``delta_TR1_first_copy``
    (``delta_TR1_control``) is not positive (≤ :data:`~depthlens.stats.EXCESS_ZERO`, or
    missing when every probe sequence failed); ``induction_ratio_median`` /
    ``induction_ratio_control_median``: the median over routing heads of the defined ratios
    (None when none is)."""
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
        "induction_routing_heads": int(len(routing)),
        "induction_excluded_first": int(routing["induction_ratio"].isna().sum()),
        "induction_excluded_control": int(routing["induction_ratio_control"].isna().sum()),
        "induction_ratio_median": _median_or_none(routing["induction_ratio"]),
        "induction_ratio_control_median": _median_or_none(routing["induction_ratio_control"]),
    }


def _median_or_none(values: pd.Series) -> float | None:
    """The median of the non-missing ``values``, None when there is none."""
    v = values.dropna()
    return float(np.median(v)) if len(v) else None


def options_record(opts: AttentionOptions) -> dict:
    """The options as a JSON-serialisable dict."""
    return asdict(opts)
