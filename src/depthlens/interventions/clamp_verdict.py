"""The verdict of the massive-activation clamp chain (METHODS A7) on the tables of
:mod:`depthlens.interventions.clamp`: the dose curves' monotonicity (a sign test), whether the
sink-mass drop predicts the Δ_TR rise (a within-layer permutation Spearman), the control's
inertness, whether each condition could be tested, and which massive dimensions carry the
chain (:data:`DIM_RULE`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import stats as _st

from ..stats import sign_test

__all__ = ["CONTROL_FRACTION", "DIM_RULE", "MONOTONE_TOL", "N_PERM", "PERM_TAG", "SIGNIFICANCE", "chain_verdict",
           "json_safe", "permutation_spearman"]

#: Key of the permutation stream ``[seed, PERM_TAG]`` of the ``predicts`` tests (the same
#: permutations for every arm tested on the same heads).
PERM_TAG = 73
#: Within-layer permutations of the ``predicts`` tests.
N_PERM = 999
#: Non-decreasing tolerance of the head-mean sink-mass curve over the doses.
MONOTONE_TOL = 1e-12
#: Level of the monotonicity sign test and of the BH q-value of the prediction.
SIGNIFICANCE = 0.05
#: The control is inert when its mean |Δ| is at most this fraction of the massive clamp's.
CONTROL_FRACTION = 0.1
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
