"""The massive-activation clamp chain (METHODS A7) as pure functions: residual states, tables
and seeds in; tables, clamp values and the verdict out. No model and no torch:
:mod:`depthlens.stages.clamp` runs them over a model.

1. :func:`massive_entries`: every massive entry (``|h| ≥ 100`` and ``≥ 1000×`` the median
   ``|h|`` of its boundary in its chunk, :func:`depthlens.residual.massive_mask`) of every
   boundary of a batch of chunks, one row each (table ``massive``).
2. :func:`choose_dims`: the clamped dimensions (massive at position 0 of some layer input in
   at least half of the chunks) and each one's emergence layer (the first layer whose input
   holds it so). Massive entries at other positions, or only at pre-MLP / final boundaries,
   are reported in ``massive`` but not clamped.
3. :func:`clamp_targets`: what each family of arms clamps: the massive dims together, each
   one alone and each one left out (with two or more), and the control's random ordinary
   dimensions (:func:`control_dims`, never massive anywhere).
4. :func:`layer_inputs_summary`, :func:`dose_values`, :func:`mean_values`,
   :func:`control_values`: what each arm sets the clamped entries to, per layer input (clean
   values per chunk, not a compounding rule).
5. :func:`reserve_task`: the worker task, TR1 and the spec-null mean of one matrix.
6. :func:`aggregate_heads`, :func:`clamp_summary`: the tables ``clamp_heads``, ``clamp_dims``
   and ``clamp``.
7. :func:`chain_verdict`: the chain's conditions, whether each could be tested, and which
   dimensions carry it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import stats as _st

from ..errors import DecompositionError
from ..residual import boundary_names, massive_mask
from ..schema import IDENTITY, SCHEMA
from ..stats import sign_test

__all__ = [
    "CONTROL_FRACTION", "CONTROL_TAG", "MONOTONE_TOL", "NULL_TAG", "PERM_TAG", "N_PERM", "SIGNIFICANCE",
    "TR_ALPHAS", "ClampPlan", "Target", "MASSIVE_COLUMNS", "HEAD_COLUMNS", "DIM_COLUMNS", "CLAMP_COLUMNS",
    "massive_entries", "choose_dims", "ordinary_dims", "control_dims", "clamp_targets", "layer_inputs_summary",
    "dose_values", "mean_values", "control_values", "arm_alphas", "has_reserve", "reserve_task",
    "aggregate_heads", "clamp_summary", "permutation_spearman", "chain_verdict", "json_safe",
]

#: Key of the control's random dimensions in the seed sequence ``[seed, CONTROL_TAG, s]``.
CONTROL_TAG = 71
#: Key of the permutation stream ``[seed, PERM_TAG]`` of the ``predicts`` tests (the same
#: permutations for every arm tested on the same heads).
PERM_TAG = 73
#: Within-layer permutations of the ``predicts`` tests.
N_PERM = 999
#: Key of the spec-null streams ``[seed, NULL_TAG, layer, head, chunk]``: the same stream for
#: every arm (common random numbers, so arms differ by the clamp, not by the shuffles).
NULL_TAG = 72
#: Non-decreasing tolerance of the head-mean sink-mass curve over the doses.
MONOTONE_TOL = 1e-12
#: Level of the monotonicity sign test and of the BH q-value of the prediction.
SIGNIFICANCE = 0.05
#: The control is inert when its mean |Δ| is at most this fraction of the massive clamp's.
CONTROL_FRACTION = 0.1
#: The doses whose heads get TR1 and Δ_TR (with the ``mean`` arm): the zero arm and the reference.
TR_ALPHAS: tuple[float, ...] = (0.0, 1.0)

#: The columns of the stage's tables (:mod:`depthlens.schema`, without the identity columns).
MASSIVE_COLUMNS = [c for c in SCHEMA["massive"].columns if c not in IDENTITY]
HEAD_COLUMNS = [c for c in SCHEMA["clamp_heads"].columns if c not in IDENTITY]
DIM_COLUMNS = [c for c in SCHEMA["clamp_dims"].columns if c not in IDENTITY]
CLAMP_COLUMNS = [c for c in SCHEMA["clamp"].columns if c not in IDENTITY]


# ----------------------------------------------------------------------------- detection
def massive_entries(states: np.ndarray, first_chunk: int, lengths: np.ndarray | None = None) -> pd.DataFrame:
    """Every massive entry of every boundary of a batch of chunks (METHODS A7).

    Parameters
    ----------
    states : ndarray, shape (2L + 1, B, T, d)
        Residual states (``Adapter.residual_states``) of ``B`` chunks.
    first_chunk : int
        Global index of the batch's first chunk.
    lengths : ndarray of int, shape (B,), optional
        Each chunk's length (prompts right-padded to T): only its first ``lengths[b]``
        positions are read. Default: all T.

    Returns
    -------
    DataFrame with :data:`MASSIVE_COLUMNS`, ordered by (chunk, depth, position, dim); the
    median is over the ``T·d`` entries of the boundary in the chunk.
    """
    arr = np.asarray(states, dtype=np.float64)
    names = boundary_names(arr.shape[0] // 2)
    rows: list[pd.DataFrame] = []
    for b in range(arr.shape[1]):
        n = arr.shape[2] if lengths is None else int(lengths[b])
        for s, (layer, kind) in enumerate(names):
            h = arr[s, b, :n]
            pos, dim = np.nonzero(massive_mask(h))
            if pos.size == 0:
                continue
            med = float(np.median(np.abs(h)))
            value = h[pos, dim]
            rows.append(pd.DataFrame({"chunk": first_chunk + b, "layer": layer, "boundary": kind, "position": pos,
                                      "dim": dim, "value": value, "median_abs": med,
                                      "ratio": np.abs(value) / med if med > 0 else np.inf}))
    if not rows:
        return empty_massive()
    return pd.concat(rows, ignore_index=True)[MASSIVE_COLUMNS]


def empty_massive() -> pd.DataFrame:
    """The ``massive`` table without rows, with its column types."""
    return pd.DataFrame({"chunk": pd.Series(dtype="int64"), "layer": pd.Series(dtype="int64"),
                         "boundary": pd.Series(dtype="object"), "position": pd.Series(dtype="int64"),
                         "dim": pd.Series(dtype="int64"), "value": pd.Series(dtype="float64"),
                         "median_abs": pd.Series(dtype="float64"), "ratio": pd.Series(dtype="float64")})


@dataclass(frozen=True)
class ClampPlan:
    """What the clamp acts on.

    Attributes
    ----------
    dims : tuple of int
        Clamped residual dimensions, ascending.
    emergence : tuple of int
        Each dim's emergence layer (clamped from there on, at position 0).
    from_layer : int
        The smallest emergence layer: heads of layers below it are unchanged exactly.
    n_chunks : int
        Chunks the detection counted.
    """

    dims: tuple[int, ...]
    emergence: tuple[int, ...]
    from_layer: int
    n_chunks: int


def choose_dims(massive: pd.DataFrame, n_chunks: int) -> ClampPlan | None:
    """The clamped dimensions of a ``massive`` table over ``n_chunks`` chunks.

    A dimension is clamped when, at some layer input (``pre_attn`` boundary), it is massive at
    position 0 in at least half of the chunks (``2·count ≥ n_chunks``); its emergence layer is
    the first such layer. None when no dimension qualifies.
    """
    sel = massive[(massive["boundary"] == "pre_attn") & (massive["position"] == 0)]
    if sel.empty or n_chunks <= 0:
        return None
    counts = sel.groupby(["dim", "layer"])["chunk"].nunique()
    counts = counts[2 * counts >= n_chunks]
    if counts.empty:
        return None
    first = counts.reset_index().groupby("dim")["layer"].min().sort_index()
    dims = tuple(int(d) for d in first.index)
    emergence = tuple(int(layer) for layer in first.to_numpy())
    return ClampPlan(dims, emergence, min(emergence), int(n_chunks))


def ordinary_dims(massive: pd.DataFrame, d_model: int) -> np.ndarray:
    """Residual dimensions never massive anywhere in the ``massive`` table (any chunk,
    boundary and position), ascending."""
    return np.setdiff1d(np.arange(d_model), massive["dim"].to_numpy(dtype=np.int64))


def control_dims(ordinary: np.ndarray, n: int, seed: int, s: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """``n`` distinct random dimensions of ``ordinary`` for control seed ``s`` and the sign of
    each one's shift, drawn with ``SeedSequence([seed, CONTROL_TAG, s])``: the dims first, in
    draw order (the i-th matches the i-th massive dim), then ``n`` signs ±1."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, CONTROL_TAG, s]))
    dims = tuple(int(d) for d in rng.choice(np.asarray(ordinary), size=n, replace=False))
    return dims, tuple(float(x) for x in rng.choice([-1.0, 1.0], size=n))


@dataclass(frozen=True)
class Target:
    """What one family of arms clamps, at position 0.

    Attributes
    ----------
    name : str
        ``massive`` (the massive dims together), ``alone`` (massive dim ``dim`` only),
        ``left_out`` (every massive dim but ``dim``) or ``control`` (random ordinary dims).
    seed : int
        Control seed index; −1 for the others.
    dim : int
        The massive dim clamped alone or left out; −1 for ``massive`` and ``control``.
    dims : tuple of int
        Clamped residual dims.
    emergence : tuple of int
        Each clamped dim's first clamped layer (a massive dim's emergence layer; a control dim
        takes the one of the massive dim it matches).
    matched : tuple of int
        Control only: the massive dim whose change each control dim's shift matches in size.
    signs : tuple of float
        Control only: the sign of each control dim's shift.
    """

    name: str
    seed: int
    dim: int
    dims: tuple[int, ...]
    emergence: tuple[int, ...]
    matched: tuple[int, ...] = ()
    signs: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        """``{name}_{seed}`` (massive, control) or ``{name}_{dim}`` (alone, left_out)."""
        return f"{self.name}_{self.dim if self.dim >= 0 else self.seed}"


def clamp_targets(plan: ClampPlan, ordinary: np.ndarray, control_seeds: int,
                  seed: int) -> tuple[list[Target], str | None]:
    """The targets of a plan: ``massive`` (first), each massive dim ``alone`` and ``left_out``
    (with one massive dim, those are exactly the massive clamp and the unclamped model), and
    ``control_seeds`` controls (the i-th control dim matched to the i-th massive dim).

    Returns
    -------
    targets : list of Target
    control_reason : str or None
        Why no control was run, naming the option (None when one was).
    """
    emergence = dict(zip(plan.dims, plan.emergence))
    targets = [Target("massive", -1, -1, plan.dims, plan.emergence)]
    for d in plan.dims:
        rest = tuple(x for x in plan.dims if x != d)
        targets += [Target("alone", -1, d, (d,), (emergence[d],)),
                    Target("left_out", -1, d, rest, tuple(emergence[x] for x in rest))]
    if control_seeds == 0:
        return targets, "no control ran (--control-seeds 0); rerun with --control-seeds 1 or more"
    if len(ordinary) < len(plan.dims):
        return targets, (f"only {len(ordinary)} ordinary dims for a control of {len(plan.dims)} massive dims "
                         "(a property of the model: no option adds ordinary dims)")
    for s in range(control_seeds):
        dims, signs = control_dims(ordinary, len(plan.dims), seed, s)
        targets.append(Target("control", s, -1, dims, plan.emergence, plan.dims, signs))
    return targets, None


# ----------------------------------------------------------------------------- clamp values
def layer_inputs_summary(states: np.ndarray, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Position-0 values and ordinary-position sums of the layer inputs of a batch.

    Parameters
    ----------
    states : ndarray, shape (2L + 1, B, T, d)
        Clean residual states; the layer inputs are states ``0, 2, …, 2L`` (``2L``: the
        final-norm input, clamped as "layer L").
    lengths : ndarray of int, shape (B,), optional
        Each chunk's length (prompts right-padded to T): its ordinary positions are
        ``1 .. lengths[b] − 1``. Default: all T.

    Returns
    -------
    first : ndarray (L + 1, B, d)
        ``h[0]`` of every layer input, float64.
    sums : ndarray (L + 1, d)
        Sums over the batch and positions ``1 .. T−1`` (float64).
    count : int
        Entries per sum, ``B·(T−1)`` (``Σ (lengths − 1)``).
    """
    inputs = np.asarray(states[0::2], dtype=np.float64)
    if lengths is not None:
        inside = np.arange(1, inputs.shape[2])[None, :] < np.asarray(lengths)[:, None]  # (B, T − 1)
        return inputs[:, :, 0, :].copy(), inputs[:, :, 1:, :][:, inside].sum(axis=1), int(inside.sum())
    return inputs[:, :, 0, :].copy(), inputs[:, :, 1:, :].sum(axis=(1, 2)), inputs.shape[1] * (inputs.shape[2] - 1)


def dose_values(first: np.ndarray, dim: int, alpha: float, from_layer: int) -> dict[int, np.ndarray]:
    """``{layer: α·h_clean[layer][:, 0, dim]}`` shaped ``(B, 1, 1)`` for every clamped layer
    ``from_layer .. L`` of ``first`` (``(L + 1, B, d)``, :func:`layer_inputs_summary`)."""
    return {layer: (alpha * first[layer, :, dim]).reshape(-1, 1, 1) for layer in range(from_layer, first.shape[0])}


def mean_values(means: np.ndarray, dim: int, from_layer: int) -> dict[int, float]:
    """``{layer: mean over ordinary positions}`` for every clamped layer of ``means`` ``(L + 1, d)``."""
    return {layer: float(means[layer, dim]) for layer in range(from_layer, means.shape[0])}


def control_values(first: np.ndarray, massive: Mapping[int, np.ndarray | float], massive_dim: int,
                   control_dim: int, sign: float) -> dict[int, np.ndarray]:
    """A control dim's clamp values, matched to a massive dim's clamp ``massive``
    (``{layer: value}`` of :func:`dose_values` or :func:`mean_values`).

    At every layer of ``massive`` and every chunk of ``first`` (``(L + 1, B, d)``) the control
    entry is set to its clean value plus ``sign · |massive value − clean massive entry|``: it
    moves by exactly as much as the massive entry does. With the i-th control dim matched to
    the i-th massive dim, the control's change of the position-0 residual has the Euclidean
    norm of the massive clamp's, layer by layer and chunk by chunk (exact up to the rounding
    of the float64 sum and of the model's dtype).

    Returns
    -------
    dict
        ``{layer: ndarray (B, 1, 1)}``.
    """
    out = {}
    for layer, value in massive.items():
        shift = np.abs(np.ravel(np.asarray(value, dtype=np.float64)) - first[layer, :, massive_dim])
        out[layer] = (first[layer, :, control_dim] + sign * shift).reshape(-1, 1, 1)
    return out


def arm_alphas(alphas: Iterable[float]) -> tuple[float, ...]:
    """The doses run: ``alphas`` with the zero arm 0 and the reference 1 added, ascending."""
    return tuple(sorted({float(a) for a in alphas} | {0.0, 1.0}))


def has_reserve(arm: str, alpha: float) -> bool:
    """Whether an arm's heads get TR1 and Δ_TR: the ``mean`` arm and the doses of :data:`TR_ALPHAS`."""
    return arm == "mean" or any(alpha == a for a in TR_ALPHAS)


# ----------------------------------------------------------------------------- worker
def reserve_task(A: np.ndarray, layer: int, head: int, chunk: int, n_samples: int, seed: int) -> dict:
    """``TR1 = log K(B)`` of one attention matrix and the mean TR1 of ``n_samples`` matched
    spec nulls (stream ``[seed, NULL_TAG, layer, head, chunk]``); ``failure`` is the reason
    when no decomposition driver converged (then the numbers are NaN)."""
    from ..attention.features import kreiss_b, null_reserves
    from ..linalg.causal import deflate

    keys = {"layer": layer, "head": head, "chunk": chunk}
    try:
        tr = math.log(kreiss_b(deflate(A), upper=False).value)
        rng = np.random.default_rng(np.random.SeedSequence([seed, NULL_TAG, layer, head, chunk]))
        null = float(null_reserves(A, "spec", n_samples, rng).mean())
    except DecompositionError as exc:
        return {**keys, "TR1": math.nan, "null_TR1": math.nan, "failure": str(exc)}
    return {**keys, "TR1": tr, "null_TR1": null, "failure": None}


# ----------------------------------------------------------------------------- tables
def aggregate_heads(sinks: pd.DataFrame, reserves: pd.DataFrame | None) -> pd.DataFrame:
    """One arm's rows of ``clamp_heads`` (without target/seed/arm/alpha): per (layer, head) the
    median over chunks of ``sink_mass`` and, with ``reserves`` (per-chunk rows of
    :func:`reserve_task`), of ``TR1`` and ``delta_TR1 = TR1 − null mean``. A head with a failed
    chunk gets NaN reserves and that chunk's reason in ``failure``."""
    keys = ["layer", "head"]
    out = sinks.groupby(keys, sort=True)["sink_mass"].median().reset_index()
    out["TR1"] = math.nan
    out["delta_TR1"] = math.nan
    out["failure"] = None
    if reserves is not None and len(reserves):
        r = reserves.assign(delta_TR1=reserves["TR1"] - reserves["null_TR1"])
        med = r.groupby(keys, sort=True)[["TR1", "delta_TR1"]].median()
        failed = r[r["failure"].notna()].groupby(keys, sort=True)["failure"].first()
        med.loc[med.index.isin(failed.index), ["TR1", "delta_TR1"]] = math.nan
        idx = pd.MultiIndex.from_frame(out[keys])
        out["TR1"] = med["TR1"].reindex(idx).to_numpy()
        out["delta_TR1"] = med["delta_TR1"].reindex(idx).to_numpy()
        out["failure"] = pd.Series([None if pd.isna(f) else str(f) for f in failed.reindex(idx)], dtype=object)
    return out


def _head_mean(values: pd.Series) -> float:
    finite = pd.to_numeric(values, errors="coerce").dropna()
    return float(finite.mean()) if len(finite) else math.nan


def clamp_summary(heads: pd.DataFrame, ce: pd.DataFrame, dims: Mapping[tuple[str, int], Sequence[int]],
                  from_layer: int, n_chunks: int) -> pd.DataFrame:
    """The ``clamp`` table: one row per (target, seed, arm, alpha) of ``heads`` (clamp_heads
    rows) with the head means, and ``ce`` (rows ``target, seed, arm, alpha, ce_sum, n_tokens``)
    turned into ``ce`` and ``delta_ce`` against the massive reference (dose α = 1)."""
    keys = ["target", "seed", "arm", "alpha"]
    ref = ce[(ce["target"] == "massive") & (ce["arm"] == "dose") & (ce["alpha"] == 1.0)]
    ce_ref = float(ref["ce_sum"].iloc[0] / ref["n_tokens"].iloc[0]) if len(ref) else math.nan
    rows = []
    for key, group in ce.groupby(keys, sort=False, dropna=False):
        target, seed, arm, alpha = key
        h = heads[(heads["target"] == target) & (heads["seed"] == seed) & (heads["arm"] == arm)
                  & ((heads["alpha"] == alpha) | (heads["alpha"].isna() & (alpha != alpha)))]
        value = float(group["ce_sum"].sum() / group["n_tokens"].sum())
        rows.append({"target": target, "seed": int(seed), "arm": arm, "alpha": float(alpha),
                     "dims": ",".join(str(d) for d in dims[(target, int(seed))]), "from_layer": int(from_layer),
                     "ce": value, "delta_ce": value - ce_ref, "sink_mass": _head_mean(h["sink_mass"]),
                     "TR1": _head_mean(h["TR1"]), "delta_TR1": _head_mean(h["delta_TR1"]),
                     "n_heads": int(len(h)), "n_chunks": int(n_chunks)})
    return pd.DataFrame(rows, columns=CLAMP_COLUMNS)


# ----------------------------------------------------------------------------- verdict
#: The pre-declared rule that lists a massive dim in ``clamp_chain.dims`` (with the chain supported).
DIM_RULE = ("a massive dim carries the chain when clamping it alone (α = 0 against α = 1) passes both monotone "
            "and predicts, or when the zero arm of all massive dims passes both and clamping every other massive dim "
            "(it left out) fails monotone or predicts")


class _Rows:
    """The rows of one clamp table placed on a shared (layer, head) index, for selections
    without pandas alignment: a selection is an array over that index, NaN where a head has no
    matching row (what aligning the selected Series on the index would give).

    Parameters
    ----------
    table : DataFrame
        ``clamp_heads`` or ``clamp_dims`` rows.
    index : MultiIndex
        Sorted (layer, head) pairs holding every head of ``table``.
    """

    def __init__(self, table: pd.DataFrame, index: pd.MultiIndex) -> None:
        self.table = table
        self.layers = index.get_level_values("layer").to_numpy()
        self.size = len(index)
        self.pos = index.get_indexer(pd.MultiIndex.from_frame(table[["layer", "head"]]))
        self._keys = {c: table[c].to_numpy() for c in ("target", "seed", "arm", "dim") if c in table.columns}
        if "alpha" in table.columns:
            self._keys["alpha"] = table["alpha"].to_numpy(dtype=np.float64)
        self._numbers = {c: pd.to_numeric(table[c], errors="coerce").to_numpy(dtype=np.float64)
                         for c in ("sink_mass", "delta_TR1")}

    def mask(self, **keys: object) -> np.ndarray:
        """Rows matching ``keys`` (``alpha`` within 1e-12)."""
        sel = np.ones(len(self.table), dtype=bool)
        for key, value in keys.items():
            if key == "alpha":
                sel &= np.isclose(self._keys["alpha"], value, rtol=0, atol=1e-12)
            else:
                sel &= self._keys[key] == value
        return sel

    def values(self, column: str, mask: np.ndarray) -> np.ndarray:
        """``column`` (``sink_mass`` or ``delta_TR1``) of the rows ``mask`` as numbers on the
        index (NaN for heads without a row)."""
        out = np.full(self.size, np.nan)
        out[self.pos[mask]] = self._numbers[column][mask]
        return out


def _heads_index(*tables: pd.DataFrame) -> pd.MultiIndex:
    """The sorted (layer, head) pairs of every row of ``tables``."""
    keys = pd.concat([t[["layer", "head"]] for t in tables], ignore_index=True).drop_duplicates()
    return pd.MultiIndex.from_frame(keys.sort_values(["layer", "head"]))


def _rank_rhos(x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Spearman ρ (mid-ranks) of ``x`` (k,) with every row of ``rows`` (m, k); NaN for a row
    when either side is constant.

    The sign and the zeros are exact: the mid-ranks are multiples of 1/2 and their means
    (k + 1)/2, so the centred ranks and the numerator Σ (r_x − mean)(r_y − mean) are exact in
    float64; only the normalisation rounds.
    """
    if rows.size == 0:
        return np.full(rows.shape[0], np.nan)
    rx = _st.rankdata(x)
    ry = _st.rankdata(rows, axis=1)
    cx, cy = rx - rx.mean(), ry - ry.mean(axis=1, keepdims=True)
    den = math.sqrt(float(cx @ cx)) * np.sqrt(np.einsum("ij,ij->i", cy, cy))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, (cy @ cx) / den, np.nan)


def _float(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _mean(values: np.ndarray) -> float:
    """Mean of the non-NaN entries (NaN when none): :func:`_head_mean` of an array."""
    known = values[~np.isnan(values)]
    return float(known.mean()) if known.size else math.nan


def _monotone(alphas: Sequence[float], curves: np.ndarray) -> dict:
    """``monotone`` on the sink masses ``curves`` (rows: heads, NaN where a head lacks a dose;
    columns: the doses ``alphas``, ascending): the head-mean curve is non-decreasing (tolerance
    :data:`MONOTONE_TOL`) and a sign test over heads of the per-head Spearman ρ(α, sink mass)
    (zero and undefined ρ dropped) has p < :data:`SIGNIFICANCE` with most ρ > 0. Not tested
    (``held`` None) when the heads with a finite curve are too few for the sign test ever to
    reach its level."""
    alphas = [float(a) for a in alphas]
    curve = [_mean(curves[:, j]) for j in range(curves.shape[1])]
    values = curves[np.all(np.isfinite(curves), axis=1)]
    rhos = _rank_rhos(np.asarray(alphas), values)
    rhos = rhos[np.isfinite(rhos) & (rhos != 0.0)]
    steps = np.diff(curve)
    nondecreasing = len(curve) > 1 and bool(np.all(np.isfinite(curve)) and np.all(steps >= -MONOTONE_TOL))
    frac = float(np.mean(rhos > 0)) if rhos.size else math.nan
    p = sign_test(rhos)
    out = {"alphas": alphas, "sink_mass": [_float(c) for c in curve], "nondecreasing": nondecreasing,
           "n_heads": int(rhos.size), "frac_positive": _float(frac), "p": _float(p)}
    if 2.0 ** (1 - len(values)) >= SIGNIFICANCE:  # the sign test's least p: every head of one sign
        return {"held": None, **out, "reason": f"only {len(values)} heads of the clamped layers have a finite sink "
                                               f"mass at every dose, so the sign test cannot reach p < {SIGNIFICANCE} "
                                               "(a property of the model: no option adds heads)"}
    return {"held": bool(nondecreasing and rhos.size > 0 and p < SIGNIFICANCE and frac > 0.5), **out}


def permutation_spearman(x: pd.Series, y: pd.Series, seed: int, n_perm: int = N_PERM) -> dict:
    """Spearman ρ of ``x`` and ``y`` across heads and its one-sided permutation p-value, with
    ``x`` permuted among the heads of each layer (heads of a layer share their input, so they
    are not exchangeable across layers).

    Parameters
    ----------
    x, y : Series indexed by (layer, head)
        Heads with a NaN in either are dropped.
    seed : int
        The run's seed; the permutations come from ``SeedSequence([seed, PERM_TAG])``.
    n_perm : int
        Random within-layer permutations.

    Returns
    -------
    dict
        ``rho`` (mid-ranks), ``p = (1 + #{ρ* ≥ ρ}) / (n_perm + 1)`` (a valid Monte Carlo p-value
        at any ``n_perm``; a ρ* within 1e-12 of ρ counts as ≥), ``n_perm``, ``n_heads``,
        ``n_layers``; ``rho`` and ``p`` are None when ``x`` or ``y`` is constant. ``testable``
        is False when the within-layer permutations number fewer than 1/:data:`SIGNIFICANCE`
        (p could never reach the level).
    """
    both = pd.concat([x.rename("x"), y.rename("y")], axis=1).dropna()
    return _permutation_spearman(both["x"].to_numpy(), both["y"].to_numpy(),
                                 both.index.get_level_values("layer").to_numpy(), seed, n_perm)


def _permutation_spearman(x: np.ndarray, y: np.ndarray, layers: np.ndarray, seed: int, n_perm: int) -> dict:
    """:func:`permutation_spearman` of NaN-free arrays, one entry per head in (layer, head) order."""
    sizes = np.unique(layers, return_counts=True)[1]
    log_distinct = sum(math.lgamma(int(c) + 1) for c in sizes)
    out: dict = {"rho": None, "p": None, "n_perm": int(n_perm), "n_heads": int(x.size), "n_layers": int(sizes.size),
                 "testable": bool(log_distinct >= math.log(1.0 / SIGNIFICANCE) - 1e-9)}
    rx, ry = _st.rankdata(x), _st.rankdata(y)
    if not out["testable"] or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return out
    zx, zy = rx - rx.mean(), ry - ry.mean()
    zx, zy = zx / np.linalg.norm(zx), zy / np.linalg.norm(zy)
    rho = float(zx @ zy)
    null = zx[_layer_permutations(tuple(layers.tolist()), seed, n_perm)] @ zy
    out.update(rho=rho, p=float((1 + np.count_nonzero(null >= rho - 1e-12)) / (n_perm + 1)))
    return out


@lru_cache(maxsize=4)
def _layer_permutations(layers: tuple[int, ...], seed: int, n_perm: int) -> np.ndarray:
    """``n_perm`` random permutations of heads (one entry of ``layers`` per head, in order) that
    move a head only within its layer, from ``SeedSequence([seed, PERM_TAG])``: row k maps
    position i to the head whose value it takes. Read-only and memoised: every arm tested on
    the same heads gets the same permutations, drawn once."""
    arr = np.asarray(layers)
    rng = np.random.default_rng(np.random.SeedSequence([seed, PERM_TAG]))
    perms = np.empty((n_perm, arr.size), dtype=np.int64)
    for layer in np.unique(arr):
        g = np.flatnonzero(arr == layer)
        perms[:, g] = g[rng.permuted(np.tile(np.arange(len(g)), (n_perm, 1)), axis=1)]
    perms.flags.writeable = False
    return perms


def _predicts(drop: np.ndarray, rise: np.ndarray, layers: np.ndarray, seed: int) -> dict:
    """``predicts``: per head (in (layer, head) order, its layer in ``layers``), drop =
    sink(α = 1) − sink(arm) and rise = Δ_TR(arm) − Δ_TR(α = 1); :func:`permutation_spearman`
    of drop and rise over the heads with both; held when ρ > 0 and p ≤ :data:`SIGNIFICANCE`.
    Not tested when the heads with both are too few for the permutation test."""
    both = ~(np.isnan(drop) | np.isnan(rise))
    test = _permutation_spearman(drop[both], rise[both], layers[both], seed, N_PERM)
    testable = test.pop("testable")
    if not testable:
        return {"held": None, **test, "reason": f"only {test['n_heads']} heads in {test['n_layers']} layers have a "
                                                "finite sink drop and reserve rise, so the within-layer permutation "
                                                f"test cannot reach p ≤ {SIGNIFICANCE} (heads whose reserve failed "
                                                "are dropped: see clamp_heads.failure; no option adds heads)"}
    rho, p = test["rho"], test["p"]
    return {"held": bool(rho is not None and rho > 0 and p <= SIGNIFICANCE), **test}


def _zero_arm(rows: _Rows, mask: np.ndarray, ref: tuple[np.ndarray, np.ndarray], seed: int) -> dict:
    """``monotone`` and ``predicts`` of one zero arm (the rows ``mask`` of ``rows``) against the
    unclamped model (``ref``: the massive α = 1 sink masses and Δ_TR on the same index), and
    its head means."""
    ref_sink, ref_tr = ref
    sink, tr = rows.values("sink_mass", mask), rows.values("delta_TR1", mask)
    return {"monotone": _monotone((0.0, 1.0), np.column_stack([sink, ref_sink])),
            "predicts": _predicts(ref_sink - sink, tr - ref_tr, rows.layers, seed),
            "sink_mass": _float(_mean(sink)), "delta_TR1": _float(_mean(tr))}


def _moves(rows: _Rows, ref: tuple[np.ndarray, np.ndarray], target: str, seed: int) -> tuple[float, float]:
    """Mean over heads of |Δ sink mass| and |Δ delta_TR1| of the zero arm against α = 1 (``ref``)."""
    mask = rows.mask(target=target, seed=seed, arm="dose", alpha=0.0)
    out = []
    for column, base in zip(("sink_mass", "delta_TR1"), ref):
        delta = np.abs(rows.values(column, mask) - base)
        out.append(_mean(delta))
    return out[0], out[1]


def _control_inert(rows: _Rows, ref: tuple[np.ndarray, np.ndarray], control_reason: str | None) -> dict:
    """``control_inert``: for every control seed, the head means of |Δ sink| and |Δ Δ_TR| of its
    zero arm (against α = 1, ``ref``) are each at most :data:`CONTROL_FRACTION` × the massive
    zero arm's. Not tested without control rows or without finite massive moves."""
    table = rows.table
    seeds = sorted(int(s) for s in table.loc[table["target"] == "control", "seed"].unique())
    m_sink, m_tr = _moves(rows, ref, "massive", -1)
    out: dict = {"fraction": CONTROL_FRACTION, "massive": {"sink_mass": _float(m_sink), "delta_TR1": _float(m_tr)}}
    if not seeds:
        return {"held": None, **out, "seeds": [], "reason": control_reason or "no control rows"}
    if not (math.isfinite(m_sink) and math.isfinite(m_tr)):
        return {"held": None, **out, "seeds": [],
                "reason": "the massive zero arm has no finite reserve change to compare (see clamp_heads.failure)"}
    records = []
    for s in seeds:
        c_sink, c_tr = _moves(rows, ref, "control", s)
        ok = all(math.isfinite(c) and c <= CONTROL_FRACTION * m for c, m in ((c_sink, m_sink), (c_tr, m_tr)))
        records.append({"seed": s, "sink_mass": _float(c_sink), "delta_TR1": _float(c_tr),
                        "sink_mass_ratio": _float(c_sink / m_sink) if m_sink else None,
                        "delta_TR1_ratio": _float(c_tr / m_tr) if m_tr else None, "held": bool(ok)})
    return {"held": all(r["held"] for r in records), **out, "seeds": records}


def _per_dim(dim_rows: _Rows, ref: tuple[np.ndarray, np.ndarray], dim: int, seed: int, holds: bool,
             delta_ce: Mapping[tuple[str, int], float]) -> dict:
    """A massive dim's ``alone`` and ``left_out`` zero arms (clamp_dims ``dim_rows``) and whether
    it carries the chain (:data:`DIM_RULE`); a test not tested counts as neither passing nor
    failing, and leaving a dim out can break the chain only where the massive zero arm passes
    both tests (``holds``)."""
    arms = {}
    for name in ("alone", "left_out"):
        arms[name] = {**_zero_arm(dim_rows, dim_rows.mask(target=name, dim=dim), ref, seed),
                      "delta_ce": _float(delta_ce.get((name, dim)))}
    alone = all(arms["alone"][c]["held"] is True for c in ("monotone", "predicts"))
    breaks = holds and any(arms["left_out"][c]["held"] is False for c in ("monotone", "predicts"))
    return {"dim": int(dim), **arms, "alone_carries": alone, "left_out_breaks": breaks, "carries": alone or breaks}


def chain_verdict(heads: pd.DataFrame, dim_heads: pd.DataFrame, dims: Sequence[int], seed: int,
                  control_reason: str | None = None,
                  delta_ce: Mapping[tuple[str, int], float] | None = None) -> dict:
    """The clamp chain's verdict (METHODS A7).

    Conditions, on the massive clamp (``clamp_heads`` rows ``heads``):

    - ``monotone`` (:func:`_monotone`) over the massive dose arm's doses;
    - ``predicts`` (:func:`_predicts`) of the zero arm α = 0: within-layer permutation test of
      Spearman ρ between the per-head sink drop and reserve rise;
    - ``control_inert`` (:func:`_control_inert`): ``control_reason`` says why it has no rows.

    The chain is ``tested`` only when all three could be tested; otherwise ``reason`` names
    each untested condition and what to change (then any that failed), and ``supported`` is
    None. Tested, it is ``supported`` when all three held (``reason`` names those that
    failed). Each massive dim's ``alone`` and ``left_out`` zero arms (``clamp_dims`` rows
    ``dim_heads``) get ``monotone`` (α ∈ {0, 1}) and ``predicts``, and ``dims`` lists those
    that carry the chain by :data:`DIM_RULE` (empty unless supported).

    Exactness: the sign test is the exact binomial; the permutation p-values are Monte Carlo
    (valid at any ``N_PERM``, reproducible from ``seed``, resolution 1/(``N_PERM`` + 1)).

    Parameters
    ----------
    heads, dim_heads : DataFrame
        The ``clamp_heads`` and ``clamp_dims`` rows (without identity columns).
    dims : sequence of int
        The massive dims clamped together.
    seed : int
        The run's seed (permutations).
    control_reason : str, optional
        Why no control ran.
    delta_ce : mapping, optional
        ``{(target, dim): ce − ce of the unclamped model}`` of the per-dim arms.

    Returns
    -------
    dict
        ``tested``, ``reason`` (one line; None when supported), ``supported``, ``dims``,
        ``all_dims``, ``conditions``, ``dim_rule`` and ``per_dim`` (one record per massive dim).
    """
    index = _heads_index(heads, dim_heads)
    rows, dim_rows = _Rows(heads, index), _Rows(dim_heads, index)
    reference = rows.mask(target="massive", arm="dose", alpha=1.0)
    ref = (rows.values("sink_mass", reference), rows.values("delta_TR1", reference))
    dose = rows.mask(target="massive", arm="dose")
    alpha = heads["alpha"].to_numpy(dtype=np.float64)
    doses = sorted(set(alpha[dose & ~np.isnan(alpha)].tolist()))
    curves = [rows.values("sink_mass", dose & (alpha == a)) for a in doses]
    measured = [j for j, c in enumerate(curves) if not np.isnan(c).all()]  # a dose without any value is left out
    zero = _zero_arm(rows, dose & (alpha == 0.0), ref, seed)
    sinks = np.column_stack([curves[j] for j in measured]) if measured else np.empty((0, 0))
    conditions = {"monotone": _monotone([doses[j] for j in measured], sinks),
                  "predicts": zero["predicts"], "control_inert": _control_inert(rows, ref, control_reason)}
    holds = all(zero[c]["held"] is True for c in ("monotone", "predicts"))
    per_dim = [_per_dim(dim_rows, ref, d, seed, holds, delta_ce or {}) for d in dims]
    untested = [f"{name} not tested: {c['reason']}" for name, c in conditions.items() if c["held"] is None]
    failed = [f"{name} did not hold" for name, c in conditions.items() if c["held"] is False]
    supported = None if untested else not failed
    carried = [r["dim"] for r in per_dim if r["carries"]] if supported else []
    return {"tested": not untested, "reason": "; ".join(untested + failed) or None, "supported": supported,
            "dims": carried, "all_dims": [int(d) for d in dims], "conditions": conditions, "dim_rule": DIM_RULE,
            "per_dim": per_dim}


def json_safe(obj: object) -> object:
    """``obj`` with non-finite floats as None and numpy scalars as Python numbers (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
