"""The massive-activation clamp chain (METHODS A7) as pure functions: residual states, tables
and seeds in; tables, clamp values and the verdict out. No model and no torch:
:mod:`depthlens.interventions.clamp_stage` runs them over a model.

1. :func:`massive_entries`: every massive entry (``|h| ≥ 100`` and ``≥ 1000×`` the median
   ``|h|`` of its boundary in its chunk, :func:`depthlens.residual.massive_mask`) of every
   boundary of a batch of chunks, one row each (table ``massive``).
2. :func:`choose_dims`: the clamped dimensions (massive at position 0 of some layer input in
   at least half of the chunks) and each one's emergence layer (the first layer whose input
   holds it so). Massive entries at other positions, or only at pre-MLP / final boundaries,
   are reported in ``massive`` but not clamped.
3. :func:`control_dims`: the control's random ordinary dimensions (never massive anywhere).
4. :func:`layer_inputs_summary`, :func:`dose_values`, :func:`mean_values`: what each arm sets
   the clamped entries to, per layer input (clean values per chunk, not a compounding rule).
5. :func:`reserve_task`: the worker task, TR1 and the spec-null mean of one matrix.
6. :func:`aggregate_heads`, :func:`clamp_summary`: the tables ``clamp_heads`` and ``clamp``.
7. :func:`chain_verdict`: the three conditions of the chain from the ``clamp_heads`` table.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as _st

from ..errors import DecompositionError
from ..residual import boundary_names, massive_mask
from ..schema import IDENTITY, SCHEMA
from ..stats import bh_qvalues, sign_test

__all__ = [
    "CONTROL_FRACTION", "CONTROL_TAG", "MONOTONE_TOL", "NULL_TAG", "SIGNIFICANCE", "TR_ALPHAS",
    "ClampPlan", "MASSIVE_COLUMNS", "HEAD_COLUMNS", "CLAMP_COLUMNS",
    "massive_entries", "choose_dims", "ordinary_dims", "control_dims", "layer_inputs_summary",
    "dose_values", "mean_values", "arm_alphas", "has_reserve", "reserve_task", "aggregate_heads",
    "clamp_summary", "chain_verdict", "json_safe",
]

#: Key of the control's random dimensions in the seed sequence ``[seed, CONTROL_TAG, s]``.
CONTROL_TAG = 71
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
CLAMP_COLUMNS = [c for c in SCHEMA["clamp"].columns if c not in IDENTITY]


# ----------------------------------------------------------------------------- detection
def massive_entries(states: np.ndarray, first_chunk: int) -> pd.DataFrame:
    """Every massive entry of every boundary of a batch of chunks (METHODS A7).

    Parameters
    ----------
    states : ndarray, shape (2L + 1, B, T, d)
        Residual states (``Adapter.residual_states``) of ``B`` chunks.
    first_chunk : int
        Global index of the batch's first chunk.

    Returns
    -------
    DataFrame with :data:`MASSIVE_COLUMNS`, ordered by (chunk, depth, position, dim); the
    median is over the ``T·d`` entries of the boundary in the chunk.
    """
    arr = np.asarray(states, dtype=np.float64)
    names = boundary_names(arr.shape[0] // 2)
    rows: list[pd.DataFrame] = []
    for b in range(arr.shape[1]):
        for s, (layer, kind) in enumerate(names):
            h = arr[s, b]
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


def control_dims(ordinary: np.ndarray, n: int, seed: int, s: int) -> tuple[int, ...]:
    """``n`` distinct random dimensions of ``ordinary`` for control seed ``s``, drawn with
    ``SeedSequence([seed, CONTROL_TAG, s])``, in draw order (the i-th is clamped from the i-th
    massive dim's emergence layer)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, CONTROL_TAG, s]))
    return tuple(int(d) for d in rng.choice(np.asarray(ordinary), size=n, replace=False))


# ----------------------------------------------------------------------------- clamp values
def layer_inputs_summary(states: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Position-0 values and ordinary-position sums of the layer inputs of a batch.

    Parameters
    ----------
    states : ndarray, shape (2L + 1, B, T, d)
        Clean residual states; the layer inputs are states ``0, 2, …, 2L`` (``2L``: the
        final-norm input, clamped as "layer L").

    Returns
    -------
    first : ndarray (L + 1, B, d)
        ``h[0]`` of every layer input, float64.
    sums : ndarray (L + 1, d)
        Sums over the batch and positions ``1 .. T−1`` (float64).
    count : int
        Entries per sum, ``B·(T−1)``.
    """
    inputs = np.asarray(states[0::2], dtype=np.float64)
    return inputs[:, :, 0, :].copy(), inputs[:, :, 1:, :].sum(axis=(1, 2)), inputs.shape[1] * (inputs.shape[2] - 1)


def dose_values(first: np.ndarray, dim: int, alpha: float, from_layer: int) -> dict[int, np.ndarray]:
    """``{layer: α·h_clean[layer][:, 0, dim]}`` shaped ``(B, 1, 1)`` for every clamped layer
    ``from_layer .. L`` of ``first`` (``(L + 1, B, d)``, :func:`layer_inputs_summary`)."""
    return {layer: (alpha * first[layer, :, dim]).reshape(-1, 1, 1) for layer in range(from_layer, first.shape[0])}


def mean_values(means: np.ndarray, dim: int, from_layer: int) -> dict[int, float]:
    """``{layer: mean over ordinary positions}`` for every clamped layer of ``means`` ``(L + 1, d)``."""
    return {layer: float(means[layer, dim]) for layer in range(from_layer, means.shape[0])}


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
def _arm(heads: pd.DataFrame, column: str, target: str, seed: int, arm: str, alpha: float | None) -> pd.Series:
    """``column`` of one arm's heads, indexed by (layer, head)."""
    sel = (heads["target"] == target) & (heads["seed"] == seed) & (heads["arm"] == arm)
    sel &= heads["alpha"].isna() if alpha is None else np.isclose(heads["alpha"].astype(float), alpha, rtol=0, atol=1e-12)
    rows = heads[sel].set_index(["layer", "head"])
    return pd.to_numeric(rows[column], errors="coerce").sort_index()


def _rank_rho(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman ρ of two short vectors (mid-ranks); NaN when either is constant."""
    rx, ry = _st.rankdata(x), _st.rankdata(y)
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _float(x: float) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else float(x)


def _monotone(heads: pd.DataFrame) -> dict:
    dose = heads[(heads["target"] == "massive") & (heads["arm"] == "dose")]
    alphas = sorted(float(a) for a in dose["alpha"].dropna().unique())
    table = dose.pivot_table(index=["layer", "head"], columns="alpha", values="sink_mass", aggfunc="first")
    table = table.reindex(columns=alphas)
    curve = [_head_mean(table[a]) for a in alphas]
    steps = np.diff(curve) if len(curve) > 1 else np.array([])
    nondecreasing = len(curve) > 1 and bool(np.all(np.isfinite(curve)) and np.all(steps >= -MONOTONE_TOL))
    values = table.to_numpy(dtype=np.float64)
    rhos = np.array([_rank_rho(np.asarray(alphas), row) for row in values if np.all(np.isfinite(row))])
    rhos = rhos[np.isfinite(rhos) & (rhos != 0.0)]
    frac = float(np.mean(rhos > 0)) if rhos.size else math.nan
    p = sign_test(rhos)
    held = bool(nondecreasing and rhos.size > 0 and p < SIGNIFICANCE and frac > 0.5)
    return {"held": held, "alphas": alphas, "sink_mass": [_float(c) for c in curve], "nondecreasing": nondecreasing,
            "n_heads": int(rhos.size), "frac_positive": _float(frac), "p": _float(p)}


def _predicts(heads: pd.DataFrame) -> dict:
    ref_sink = _arm(heads, "sink_mass", "massive", -1, "dose", 1.0)
    ref_tr = _arm(heads, "delta_TR1", "massive", -1, "dose", 1.0)
    arms: dict[str, dict] = {}
    for name, arm, alpha in (("zero", "dose", 0.0), ("mean", "mean", None)):
        drop = ref_sink - _arm(heads, "sink_mass", "massive", -1, arm, alpha)
        rise = _arm(heads, "delta_TR1", "massive", -1, arm, alpha) - ref_tr
        both = pd.concat([drop.rename("drop"), rise.rename("rise")], axis=1).dropna()
        rho, p = math.nan, math.nan
        if len(both) >= 3:
            rho = _rank_rho(both["drop"].to_numpy(), both["rise"].to_numpy())
            if math.isfinite(rho):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    result = _st.spearmanr(both["drop"].to_numpy(), both["rise"].to_numpy())
                rho, p = float(result.statistic), float(result.pvalue)
        arms[name] = {"rho": rho, "p": p, "n_heads": int(len(both))}
    q = bh_qvalues(np.array([arms[n]["p"] for n in arms]))
    for name, value in zip(arms, q):
        arms[name]["q"] = value
    zero = arms["zero"]
    held = bool(math.isfinite(zero["rho"]) and zero["rho"] > 0 and math.isfinite(zero["q"]) and zero["q"] <= SIGNIFICANCE)
    return {"held": held, "arms": {n: {k: (_float(v) if k != "n_heads" else v) for k, v in a.items()}
                                   for n, a in arms.items()}}


def _moves(heads: pd.DataFrame, target: str, seed: int) -> tuple[float, float]:
    """Mean over heads of |Δ sink mass| and |Δ delta_TR1| of the zero arm against α = 1."""
    out = []
    for column in ("sink_mass", "delta_TR1"):
        ref = _arm(heads, column, "massive", -1, "dose", 1.0)
        delta = (_arm(heads, column, target, seed, "dose", 0.0) - ref).abs().dropna()
        out.append(float(delta.mean()) if len(delta) else math.nan)
    return out[0], out[1]


def _control_inert(heads: pd.DataFrame, control_reason: str | None) -> dict:
    seeds = sorted(int(s) for s in heads.loc[heads["target"] == "control", "seed"].unique())
    m_sink, m_tr = _moves(heads, "massive", -1)
    out: dict = {"fraction": CONTROL_FRACTION, "massive": {"sink_mass": _float(m_sink), "delta_TR1": _float(m_tr)}}
    if not seeds:
        out.update(held=None, seeds=[], reason=control_reason or "no control was run (control_seeds = 0)")
        return out
    rows = []
    for s in seeds:
        c_sink, c_tr = _moves(heads, "control", s)
        ok = all(math.isfinite(c) and math.isfinite(m) and c <= CONTROL_FRACTION * m
                 for c, m in ((c_sink, m_sink), (c_tr, m_tr)))
        rows.append({"seed": s, "sink_mass": _float(c_sink), "delta_TR1": _float(c_tr),
                     "sink_mass_ratio": _float(c_sink / m_sink) if m_sink else None,
                     "delta_TR1_ratio": _float(c_tr / m_tr) if m_tr else None, "held": bool(ok)})
    out.update(held=all(r["held"] for r in rows), seeds=rows)
    return out


def chain_verdict(heads: pd.DataFrame, control_reason: str | None = None) -> dict:
    """The clamp chain's verdict from a ``clamp_heads`` table (METHODS A7).

    - ``monotone``: the head-mean sink mass of the massive dose arm is non-decreasing in α
      (tolerance :data:`MONOTONE_TOL`), and a sign test over heads of the per-head Spearman
      ρ(α, sink mass) (zero and undefined ρ dropped) has p < :data:`SIGNIFICANCE` with most
      ρ > 0.
    - ``predicts``: per head, drop = sink(α=1) − sink(arm) and rise = Δ_TR(arm) − Δ_TR(α=1);
      Spearman ρ across heads for the arms ``zero`` (α = 0) and ``mean``, BH over the two;
      held when the zero arm has ρ > 0 and q ≤ :data:`SIGNIFICANCE`.
    - ``control_inert``: for every control seed, the head means of |Δ sink| and |Δ Δ_TR| of its
      zero arm (against α = 1) are each at most :data:`CONTROL_FRACTION` × the massive zero
      arm's. Without control rows ``held`` is None (not tested; ``control_reason`` says why).

    Returns
    -------
    dict
        ``supported`` (True only when the three held), ``reason`` (None when supported, else
        one line naming the conditions that failed or were not tested) and ``conditions``.
    """
    conditions = {"monotone": _monotone(heads), "predicts": _predicts(heads),
                  "control_inert": _control_inert(heads, control_reason)}
    supported = all(c["held"] is True for c in conditions.values())
    reason = None
    if not supported:
        parts = [f"{name} did not hold" for name, c in conditions.items() if c["held"] is False]
        if conditions["control_inert"]["held"] is None:
            parts.append(f"control_inert not tested ({conditions['control_inert']['reason']})")
        reason = "; ".join(parts)
    return {"supported": supported, "reason": reason, "conditions": conditions}


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
