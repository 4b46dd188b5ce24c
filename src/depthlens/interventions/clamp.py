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
7. :func:`~depthlens.interventions.clamp_verdict.chain_verdict` (its own module): the chain's
   conditions, whether each could be tested, and which dimensions carry it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import DecompositionError
from ..residual import BOUNDARIES, boundary_names, massive_mask
from ..schema import IDENTITY, SCHEMA

__all__ = [
    "CONTROL_TAG", "NULL_TAG", "TR_ALPHAS", "ClampPlan", "Target", "MASSIVE_COLUMNS", "HEAD_COLUMNS", "DIM_COLUMNS", "CLAMP_COLUMNS",
    "massive_entries", "choose_dims", "ordinary_dims", "control_dims", "clamp_targets", "layer_inputs_summary",
    "dose_values", "mean_values", "control_values", "arm_alphas", "has_reserve", "reserve_task",
    "aggregate_heads", "clamp_summary",
]

#: Key of the control's random dimensions in the seed sequence ``[seed, CONTROL_TAG, s]``.
CONTROL_TAG = 71
#: Key of the spec-null streams ``[seed, NULL_TAG, layer, head, chunk]``: the same stream for
#: every arm (common random numbers, so arms differ by the clamp, not by the shuffles).
NULL_TAG = 72
#: The doses whose heads get TR1 and Δ_TR (with the ``mean`` arm): the zero arm and the reference.
TR_ALPHAS: tuple[float, ...] = (0.0, 1.0)

#: The columns of the stage's tables (:mod:`depthlens.schema`, without the identity columns).
MASSIVE_COLUMNS = [c for c in SCHEMA["massive"].columns if c not in IDENTITY]
HEAD_COLUMNS = [c for c in SCHEMA["clamp_heads"].columns if c not in IDENTITY]
DIM_COLUMNS = [c for c in SCHEMA["clamp_dims"].columns if c not in IDENTITY]
CLAMP_COLUMNS = [c for c in SCHEMA["clamp"].columns if c not in IDENTITY]


# ----------------------------------------------------------------------------- detection
def massive_entries(states: np.ndarray, first_chunk: int, lengths: np.ndarray | None = None,
                    boundaries: tuple[str, ...] = BOUNDARIES) -> pd.DataFrame:
    """Every massive entry of every boundary of a batch of chunks (METHODS A7).

    Parameters
    ----------
    states : ndarray, shape (S·L + 1, B, T, d)
        Residual states (``Adapter.residual_states``) of ``B`` chunks, ``S`` boundaries a layer.
    first_chunk : int
        Global index of the batch's first chunk.
    lengths : ndarray of int, shape (B,), optional
        Each chunk's length (prompts right-padded to T): only its first ``lengths[b]``
        positions are read. Default: all T.
    boundaries : tuple of str
        The names of a layer's ``S`` boundaries (``Adapter.boundaries``; default ``pre_attn``, ``pre_mlp``).

    Returns
    -------
    DataFrame with :data:`MASSIVE_COLUMNS`, ordered by (chunk, depth, position, dim); the
    median is over the ``T·d`` entries of the boundary in the chunk.
    """
    arr = np.asarray(states, dtype=np.float64)
    names = boundary_names(arr.shape[0] // len(boundaries), boundaries)
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
def layer_inputs_summary(states: np.ndarray, lengths: np.ndarray | None = None,
                         per_layer: int = len(BOUNDARIES)) -> tuple[np.ndarray, np.ndarray, int]:
    """Position-0 values and ordinary-position sums of the layer inputs of a batch.

    Parameters
    ----------
    states : ndarray, shape (S·L + 1, B, T, d)
        Clean residual states, ``S = per_layer`` boundaries a layer; the layer inputs are
        states ``0, S, …, S·L`` (``S·L``: the final-norm input, clamped as "layer L").
    lengths : ndarray of int, shape (B,), optional
        Each chunk's length (prompts right-padded to T): its ordinary positions are
        ``1 .. lengths[b] − 1``. Default: all T.
    per_layer : int
        Boundaries a layer (``len(Adapter.boundaries)``; default 2).

    Returns
    -------
    first : ndarray (L + 1, B, d)
        ``h[0]`` of every layer input, float64.
    sums : ndarray (L + 1, d)
        Sums over the batch and positions ``1 .. T−1`` (float64).
    count : int
        Entries per sum, ``B·(T−1)`` (``Σ (lengths − 1)``).
    """
    inputs = np.asarray(states[0::per_layer], dtype=np.float64)
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
