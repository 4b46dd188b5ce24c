"""The planted worlds of Parts B and C (METHODS B1–B6 and the census): rotations, symmetry,
the coupling's rise, sign and step-0 fraction, the funnel's ratios and Schur split, and the
census's onset lags, coupling trend and funnel. Gathered by :mod:`depthlens.report.calibration`."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..runs.tables import RunTables
from ..stats import percentile_interval
from .statistics import SCHUR_ORDERS
from .worlds import MemoryTables, Scenario, mix, registrar

__all__ = ["SCENARIOS"]

#: The scenarios of Parts B and C, by statistic.
SCENARIOS: dict[str, Scenario] = {}
scenario = registrar(SCENARIOS)


# ----------------------------------------------------------------------------- Part B
def _log_mix(null: float | np.ndarray, effect: float | np.ndarray, strength: float) -> float | np.ndarray:
    """A positive planted quantity at effect ``strength``, along the line through ``null`` and
    ``effect`` in log (exact at 0 and 1)."""
    if strength == 0:
        return null
    if strength == 1:
        return effect
    return np.exp(mix(np.log(null), np.log(effect), strength))
#: Width of the simulated operators of B1's worlds: a fixed parameter of the simulation, not a
#: sample size (the statistic is a median of per-layer weighted rotations, which the shape of
#: an eigenvalue cloud sets; a width of 576 would cost seconds a draw).
ROTATION_WIDTH = 16


@scenario("rotation_gain_early", {"early_layers": 10},
          null=f"trained and step-0 layers drawn alike: updates 70% symmetric (width {ROTATION_WIDTH})",
          effect="step-0 updates 70% symmetric, trained early updates 70% skew (rotation-heavy)")
def _sim_rotation(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    d, layers = ROTATION_WIDTH, 3 * n["early_layers"]
    g = rng.standard_normal((2, layers, d, d))
    share = np.array([0.7, mix(0.7, 0.3, strength, low=0.0, high=1.0)])[:, None, None, None]  # init, trained
    sym, skew = (g + g.swapaxes(-1, -2)) / 2, (g - g.swapaxes(-1, -2)) / 2
    lam = np.linalg.eigvals(np.eye(d) + (share * sym + (1 - share) * skew) / math.sqrt(d))
    return MemoryTables({"eigenvalues": pd.DataFrame({
        "checkpoint": np.repeat(["init", "trained"], layers * d), "layer": np.tile(np.repeat(np.arange(layers), d), 2),
        "re": lam.real.ravel(), "im": lam.imag.ravel(), "jacobian_mode": "isolated", "sublayer": "layer"})})


@scenario("symmetry_depth_trend_trained", {"operators": 60},
          null="symmetry_update independent of depth (uniform on [0.3, 0.7])",
          effect="symmetry_update rising with depth: 0.3 + 0.4·layer/L plus N(0, 0.1)")
def _sim_symmetry(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    ops = n["operators"]
    layer = np.arange(ops) // 2
    depth = layer / max(1, layer.max())
    if strength == 0:
        values = rng.uniform(0.3, 0.7, ops)
    elif strength == 1:
        values = 0.3 + 0.4 * depth + 0.1 * rng.standard_normal(ops)
    else:  # the centre along the line, the spread moving from the null's uniform to the effect's normal
        w = min(max(strength, 0.0), 1.0)
        values = (mix(0.5, 0.3 + 0.4 * depth, strength) + (1.0 - w) * (rng.uniform(0.3, 0.7, ops) - 0.5)
                  + w * 0.1 * rng.standard_normal(ops))
    return MemoryTables({"operators": pd.DataFrame({
        "checkpoint": "trained", "jacobian_mode": "isolated", "layer": layer,
        "sublayer": np.where(np.arange(ops) % 2, "mlp", "attn"), "symmetry_update": values})})


def _coupling(rng: np.random.Generator, rates: Mapping[str, float], boundaries: int) -> pd.DataFrame:
    parts = []
    for checkpoint, rate in rates.items():
        parts.append(pd.DataFrame({"checkpoint": checkpoint, "boundary_index": np.arange(boundaries),
                                   "significant": rng.random(boundaries) < rate}))
    return pd.concat(parts, ignore_index=True)


@scenario("coupling_monotone_rise", {"boundaries": 60},
          null="each boundary significant with probability 0.1 at init, mid-training and trained alike",
          effect="probabilities 0, 14/32 and 24/32 (the seed's 0 → 14 → 24 of OLMo's 32 layers)")
def _sim_rise(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    rates = dict(zip(("init", "mid", "trained"), mix(np.full(3, 0.1), np.array([0.0, 14 / 32, 24 / 32]), strength, low=0.0, high=1.0)))
    return MemoryTables({"coupling": _coupling(rng, rates, n["boundaries"])},
                        {"manifest": {"config": {"revisions": ["mid"]}}})


@scenario("coupling_significant_fraction_init", {"boundaries": 60},
          null="coupling present at init: each boundary significant with probability 0.3",
          effect="coupling absent at init: significant with probability 0.01 (false discoveries)")
def _sim_init(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    return MemoryTables({"coupling": _coupling(rng, {"init": mix(0.3, 0.01, strength, low=0.0)}, n["boundaries"])})


@scenario("coupling_sign_follows_type", {"boundaries": 60},
          null="each boundary significant with probability 0.75, its sign independent of symmetry_update",
          effect="significant with probability 0.75, sign positive above the median symmetry_update and "
                 "negative below with probability 0.9")
def _sim_sign(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    b = n["boundaries"]
    symmetry = rng.uniform(0.2, 0.8, b)
    predicted = np.where(symmetry > np.median(symmetry), 1.0, -1.0)
    if strength == 0:
        sign = rng.choice([-1.0, 1.0], b)
    else:
        sign = np.where(rng.random(b) < mix(0.5, 0.9, strength, high=1.0), predicted, -predicted)
    return MemoryTables({"coupling": pd.DataFrame({
        "checkpoint": "trained", "boundary_index": np.arange(b), "symmetry_update": symmetry,
        "effect": sign * rng.uniform(0.05, 0.5, b), "significant": rng.random(b) < 0.75})})


#: Log-scale spread one chunk gives the funnel's ends (erank after one step, at full depth): the
#: mean over C chunks moves by σ/√C. From the bootstrap of SmolLM2's funnel over 8 chunks (the
#: replicates' full-depth erank spread by about 20%, the one-step erank by about 2%).
_FUNNEL_CHUNK_SD = (0.05, 0.6)
#: Log-scale spread of the full-depth erank between step-0 initialisations (--init-seeds).
_FUNNEL_SEED_SD = 0.1
#: The funnel scenarios' sizes: SmolLM2 under the default preset (60 sub-layers of width 576,
#: truncation 512, 32 chunks, --funnel-boot 50, --init-seeds 3).
_FUNNEL_SIZES = {"chunks": 32, "operators": 60, "width": 576, "replicates": 50}


def _funnel_replicates(rng: np.random.Generator, ends: tuple[float, float], weights: np.ndarray) -> np.ndarray:
    """One checkpoint's funnel ends ``(1 + R, 2)`` (erank after one step, at full depth): row 0
    every chunk once, row k the k-th replicate of ``weights`` ``(R, C)``. Each chunk shifts the
    log ends by its own ``N(0, σ²)`` (:data:`_FUNNEL_CHUNK_SD`); an estimate is ``ends`` times
    the exponential of the weighted mean shift of the chunks it averages."""
    chunks = weights.shape[1]
    shifts = rng.standard_normal((chunks, 2)) * np.asarray(_FUNNEL_CHUNK_SD)
    draws = np.vstack([np.ones((1, chunks)), weights])
    return np.exp(np.log(np.asarray(ends, dtype=float)) + draws @ shifts / chunks)


def _funnel_tables(rng: np.random.Generator, n: Mapping[str, int], ends: Mapping[tuple[str, int], tuple[float, float]]
                   ) -> MemoryTables:
    """``cumulative`` (each checkpoint's backward α = 1 curves, rank-truncated and exact, from its
    row-0 ends, log-linear in between) and ``funnel_boot`` for the checkpoints and step-0 seed
    offsets of ``ends`` (``("trained", 0)``, ``("init", k)``), all resampling the same chunks."""
    steps, width = n["operators"], n["width"]
    truncation = min(512, width)
    weights = rng.multinomial(n["chunks"], np.full(n["chunks"], 1.0 / n["chunks"]), size=n["replicates"])
    curves, boots = [], []
    for (checkpoint, seed), truth in ends.items():
        values = _funnel_replicates(rng, truth, weights)
        boots.append(pd.DataFrame({"checkpoint": checkpoint, "jacobian_mode": "isolated",
                                   "init_seed": float(seed) if checkpoint == "init" else np.nan,
                                   "truncation": truncation, "replicate": np.arange(len(values)),
                                   "erank_one_step": values[:, 0], "erank_full_depth": values[:, 1], "failure": None}))
        if seed == 0:
            k = np.arange(1, steps + 1)
            erank = values[0, 0] * (values[0, 1] / values[0, 0]) ** ((k - 1) / (steps - 1))
            for cap in (truncation, width):
                curves.append(pd.DataFrame({"checkpoint": checkpoint, "jacobian_mode": "isolated",
                                            "schur_order": "lapack", "schur_alpha": 1.0, "direction": "backward",
                                            "truncation": cap, "depth": steps - k, "steps": k, "erank": erank}))
    return MemoryTables({"cumulative": pd.concat(curves, ignore_index=True),
                         "funnel_boot": pd.concat(boots, ignore_index=True)})


@scenario("funnel_ratio_trained", _FUNNEL_SIZES,
          null="no funnel: the full-depth erank half the one-step erank (ratio 0.5), chunk spread as measured",
          effect="the seed's funnel, 436 after one step to 7 at full depth (ratio 0.016)")
def _sim_funnel_ratio(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    return _funnel_tables(rng, n, {("trained", 0): (436.0, _log_mix(218.0, 7.0, strength))})


@scenario("funnel_init_over_trained", {**_FUNNEL_SIZES, "init_seeds": 3},
          null="step-0 keeps the trained full-depth erank (ratio 1; 20 at full depth for both), each "
               "initialisation off by N(0, 0.1) in log",
          effect="step-0 keeps 10 times the trained full-depth erank (7 trained, 70 at step 0)")
def _sim_funnel_learned(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    trained, init = _log_mix(20.0, 7.0, strength), _log_mix(20.0, 70.0, strength)
    ends = {("trained", 0): (436.0, trained)}
    for seed in range(n["init_seeds"]):
        ends[("init", seed)] = (436.0, init * math.exp(_FUNNEL_SEED_SD * rng.standard_normal()))
    return _funnel_tables(rng, n, ends)


#: Log-scale spread of the α = 0 full-depth erank between Schur orders (a factor e^{±1}; the
#: expected range over four orders is about 2 nats, a factor 8; SmolLM2's orders spread it from 1.0
#: to 61, twice that in log, where the claim is inconclusive, order-dependent, as the range intends).
_SCHUR_ORDER_SD = 1.0


@scenario("funnel_removed_by_schur_every_order", {"chunks": 32, "operators": 60},
          null="the Schur split removes a fraction U(0.1, 0.3) of the log-erank fall (436 after one step to 7 at "
               "full depth at α = 1)",
          effect="the split removes 70% of it (the seed's 'largely dissolves')")
def _sim_schur(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    """The trained backward rank-truncated (512) ``cumulative`` curves at α = 1 and at α = 0 in
    each Schur order, log-linear from the erank after one step to the full-depth erank over
    ``operators`` sub-layers. Every curve's ends move with the chunks (:data:`_FUNNEL_CHUNK_SD`
    over √chunks, drawn per curve); each order's α = 0 full-depth erank also by
    N(0, :data:`_SCHUR_ORDER_SD`) in log, floored at 1; the one-step erank at α = 0 by N(0, 0.05)
    in log per order."""
    steps, chunks = n["operators"], n["chunks"]
    one_sd, full_sd = (sd / math.sqrt(chunks) for sd in _FUNNEL_CHUNK_SD)
    fall = math.log(436.0 / 7.0)
    removed = mix(rng.uniform(0.1, 0.3) if strength != 1 else 0.0, 0.7, strength, high=1.0)
    k = np.arange(1, steps + 1)

    def curve(alpha: float, order: str, first: float, last: float) -> pd.DataFrame:
        return pd.DataFrame({"checkpoint": "trained", "jacobian_mode": "isolated", "schur_order": order,
                             "schur_alpha": alpha, "direction": "backward", "truncation": 512, "depth": steps - k,
                             "steps": k, "erank": first * (last / first) ** ((k - 1) / (steps - 1))})

    parts = [curve(1.0, SCHUR_ORDERS[0], 436.0 * math.exp(one_sd * rng.standard_normal()),
                   7.0 * math.exp(full_sd * rng.standard_normal()))]
    for order in SCHUR_ORDERS:
        first = 436.0 * math.exp(math.hypot(one_sd, 0.05) * rng.standard_normal())
        log_last = (math.log(436.0) - (1.0 - removed) * fall
                    + math.hypot(full_sd, _SCHUR_ORDER_SD) * rng.standard_normal())
        parts.append(curve(0.0, order, first, max(1.0, math.exp(log_last))))
    # text columns as objects: the statistic's filters on them run about twice as fast as on Arrow strings
    text = dict.fromkeys(("checkpoint", "jacobian_mode", "schur_order", "direction"), object)
    return MemoryTables({"cumulative": pd.concat(parts, ignore_index=True).astype(text)})


# ----------------------------------------------------------------------------- Part C
@scenario("census_onset_lag_p", {"paired_layers": 6, "heads_per_layer": 4, "checkpoints": 10},
          null="per head one latent onset for both series (true lag 0); the reserve noise (sd 0.15) half shared "
               "by the heads of a layer (heads are not independent), score noise 0.05",
          effect="consolidation two checkpoints after formation in every head, same noise")
def _sim_onsets(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    T, layers, per = n["checkpoints"], n["paired_layers"], n["heads_per_layer"]
    first = max(1, T // 5)
    onset = rng.integers(first, max(first + 1, T - 3), size=(layers, per))[..., None]
    k = np.arange(T)
    shared = rng.standard_normal((layers, 1, T))
    noise = math.sqrt(0.5) * (shared + rng.standard_normal((layers, per, T)))
    score = 0.1 + 0.6 * (k >= onset) + 0.05 * rng.standard_normal((layers, per, T))
    reserve = 0.4 * (k >= onset + 2.0 * strength) + 0.15 * noise
    grid = np.meshgrid(np.arange(layers), np.arange(per), k, indexing="ij")
    return MemoryTables({"census_heads": pd.DataFrame({
        "series": "s", "order": grid[2].ravel(), "step": 2.0 ** grid[2].ravel(), "layer": grid[0].ravel(),
        "head": grid[1].ravel(), "prev_token_score": score.ravel(), "induction_score": 0.02, "sink_mass": 0.1,
        "delta_TR1": reserve.ravel()})})


@scenario("census_coupling_trend", {"checkpoints": 8, "boundaries": 24},
          null="each boundary significant with probability 0.1 at every checkpoint",
          effect="probability rising linearly from 0 to 0.75 over the checkpoints (the seed's 0 → 24 of 32)")
def _sim_census_trend(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    T, b = n["checkpoints"], n["boundaries"]
    rates = mix(np.full(T, 0.1), np.linspace(0.0, 0.75, T), strength, low=0.0, high=1.0)
    return MemoryTables({"census": pd.DataFrame({
        "series": "s", "order": np.arange(T), "status": "done", "funnel_step0_over": np.nan,
        "erank_full_depth": np.nan, "coupling_significant": rng.binomial(b, rates).astype(float),
        "coupling_tested": float(b)})})


@scenario("census_funnel_learned", {"checkpoints": 8, **_FUNNEL_SIZES},
          null="every checkpoint keeps the step-0 full-depth erank (20; ratio 1), chunk spread as measured",
          effect="the full-depth erank falls log-linearly over training to a tenth of step 0's (70 to 7) at the last "
                 "checkpoint")
def _sim_census_funnel(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    T = n["checkpoints"]
    weights = rng.multinomial(n["chunks"], np.full(n["chunks"], 1.0 / n["chunks"]), size=n["replicates"])
    full = _log_mix(np.full(T, 20.0), 70.0 * 0.1 ** (np.arange(T) / max(1, T - 1)), strength)
    ends = np.stack([_funnel_replicates(rng, (436.0, f), weights)[:, 1] for f in full])  # (T, 1 + R) full depth
    # as the census table: the step-0 checkpoint is the reference, replicate k paired with replicate k
    intervals = [percentile_interval(ends[0, 1:] / e[1:]) for e in ends]
    return MemoryTables({"census": pd.DataFrame({
        "series": "s", "order": np.arange(T), "status": "done", "erank_full_depth": ends[:, 0],
        "funnel_step0_over": ends[0, 0] / ends[:, 0], "funnel_step0_over_lo": [lo for lo, _ in intervals],
        "funnel_step0_over_hi": [hi for _, hi in intervals], "coupling_significant": np.nan})})
