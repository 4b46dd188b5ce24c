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
from .measured_nulls import measured_values
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
_MEASURED = "real random-init models at SmolLM2's shape (report/measured_nulls.json)"


@scenario("rotation_gain_early", {"early_layers": 10},
          null="trained and step-0 early layers alike: each layer's weighted rotation resampled from those of the "
               f"full-layer operators (width 576) of {_MEASURED}",
          effect="the trained early layers' weighted rotation moved 70% of the way from there to 1 (rotation-heavy "
                 "updates)")
def _sim_rotation(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    """Each of ``3·early_layers`` layers' operator planted as the one eigenvalue pair
    ``1 + e^{±iθ}``, whose weighted rotation is ``sin θ`` (the statistic reads nothing else of
    an operator): step 0's and the trained one's resampled from the measured rotations, the
    trained one then moved ``mix(0, 0.7, strength)`` of the way to 1."""
    pool = measured_values("rotation_gain_early", "early-layer weighted rotation")
    layers = 3 * n["early_layers"]
    rotation = rng.choice(pool, size=(2, layers))  # init, trained
    rotation[1] += mix(0.0, 0.7, strength, low=0.0, high=1.0) * (1.0 - rotation[1])
    theta = np.arcsin(np.clip(rotation, 0.0, 1.0))
    lam = 1.0 + np.exp(1j * np.stack([theta, -theta], axis=-1))
    return MemoryTables({"eigenvalues": pd.DataFrame({
        "checkpoint": np.repeat(["init", "trained"], 2 * layers), "layer": np.tile(np.repeat(np.arange(layers), 2), 2),
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
#: The funnel scenarios' sizes: SmolLM2 under the default preset (60 sub-layers of width 576,
#: truncation 512, 32 chunks, --funnel-boot 50, --init-seeds 3).
_FUNNEL_SIZES = {"chunks": 32, "operators": 60, "width": 576, "replicates": 50}


def _funnel_replicates(rng: np.random.Generator, ends: tuple[float, float], weights: np.ndarray,
                       sd: tuple[float, float] = _FUNNEL_CHUNK_SD) -> np.ndarray:
    """One checkpoint's funnel ends ``(1 + R, 2)`` (erank after one step, at full depth): row 0
    every chunk once, row k the k-th replicate of ``weights`` ``(R, C)``. Each chunk shifts the
    log ends by its own ``N(0, σ²)`` (``sd``, by default :data:`_FUNNEL_CHUNK_SD`); an estimate is
    ``ends`` times the exponential of the weighted mean shift of the chunks it averages."""
    chunks = weights.shape[1]
    shifts = rng.standard_normal((chunks, 2)) * np.asarray(sd)
    draws = np.vstack([np.ones((1, chunks)), weights])
    return np.exp(np.log(np.asarray(ends, dtype=float)) + draws @ shifts / chunks)


def _funnel_tables(rng: np.random.Generator, n: Mapping[str, int], ends: Mapping[tuple[str, int], tuple[float, float]],
                   sd: Mapping[tuple[str, int], tuple[float, float]] | None = None) -> MemoryTables:
    """``cumulative`` (each checkpoint's backward α = 1 curves, rank-truncated and exact, from its
    row-0 ends, log-linear in between) and ``funnel_boot`` for the checkpoints and step-0 seed
    offsets of ``ends`` (``("trained", 0)``, ``("init", k)``), all resampling the same chunks,
    each with the chunk spread ``sd`` gives it (:data:`_FUNNEL_CHUNK_SD` where it gives none)."""
    steps, width = n["operators"], n["width"]
    truncation = min(512, width)
    weights = rng.multinomial(n["chunks"], np.full(n["chunks"], 1.0 / n["chunks"]), size=n["replicates"])
    curves, boots = [], []
    for (checkpoint, seed), truth in ends.items():
        values = _funnel_replicates(rng, truth, weights, (sd or {}).get((checkpoint, seed), _FUNNEL_CHUNK_SD))
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


def _measured_funnel(rng: np.random.Generator, statistic: str, chunks: int
                     ) -> tuple[float, float, float, tuple[float, float]]:
    """One random init's funnel resampled from :data:`_MEASURED`: the erank after one step, at full
    depth, the log spread of the full-depth erank between the initialisations of one run, and the
    per-chunk log spreads of both ends (their bootstrap spreads times √chunks)."""
    full = measured_values(statistic, "erank at full depth")
    spread = tuple(float(rng.choice(measured_values(statistic, f"log spread of the {end} erank over chunk resamples")))
                   * math.sqrt(chunks) for end in ("one-step", "full-depth"))
    between = float(rng.choice(measured_values(statistic, "log spread of the full-depth erank between checkpoints")))
    return (float(rng.choice(measured_values(statistic, "erank after one step"))), float(rng.choice(full)), between,
            spread)  # type: ignore[return-value]


def _chunk_sd(null: tuple[float, float], strength: float) -> tuple[float, float]:
    """The per-chunk log spread of the ends at ``strength``: a random init's measured ``null`` at
    0, the trained model's (:data:`_FUNNEL_CHUNK_SD`) at 1."""
    return tuple(float(mix(a, b, strength, low=0.0)) for a, b in zip(null, _FUNNEL_CHUNK_SD))  # type: ignore[return-value]


@scenario("funnel_ratio_trained", _FUNNEL_SIZES,
          null=f"the trained model funnels no more than a random init: its ends and chunk spread resampled from "
               f"{_MEASURED} (ratio about 0.1)",
          effect="the seed's funnel, ratio 7/436 = 0.016, with the trained chunk spread measured on SmolLM2")
def _sim_funnel_ratio(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    one, full, _, spread = _measured_funnel(rng, "funnel_ratio_trained", n["chunks"])
    ends = (one, one * _log_mix(full / one, 7.0 / 436.0, strength))
    return _funnel_tables(rng, n, {("trained", 0): ends}, {("trained", 0): _chunk_sd(spread, strength)})


@scenario("funnel_init_over_trained", {**_FUNNEL_SIZES, "init_seeds": 3},
          null=f"the trained model keeps a random init's full-depth erank: every checkpoint's ends resampled from "
               f"{_MEASURED}, the initialisations apart by their measured spread",
          effect="step-0 keeps 10 times the trained full-depth erank, with the trained chunk spread measured on "
                 "SmolLM2")
def _sim_funnel_learned(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    one, full, between, spread = _measured_funnel(rng, "funnel_init_over_trained", n["chunks"])
    ends = {("trained", 0): (one, full * _log_mix(1.0, 0.1, strength))}
    sd = {("trained", 0): _chunk_sd(spread, strength)}
    for seed in range(n["init_seeds"]):
        ends[("init", seed)] = (one, full * math.exp(between * rng.standard_normal()))
        sd[("init", seed)] = _chunk_sd(spread, 0.0)
    return _funnel_tables(rng, n, ends, sd)


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
