"""Calibration of the claims: their error rates under planted nulls and planted effects.

A verdict is a measurement, and its error rates at the run's sample size are part of it. For
each claim statistic this module holds a :class:`Scenario`: a simulator of exactly the tables
the statistic reads, under a **planted null** (the world in which the claim is false: no
effect, or, for a claim of absence, the effect present) and under a **planted effect** (the
world the seed describes, at the size it reports). :func:`calibrate` draws both worlds many
times (seeded), runs the claim's own statistic and verdict code on every draw
(:func:`~depthlens.report.claims.judge`) and reports

- ``p_supported_null``: P(supported | null), the false-support rate;
- ``p_falsified_effect``: P(falsified | effect), the false-refutation rate;
- ``p_supported_effect``: P(supported | effect), the power.

A claim is accepted at a sample size when both error rates are at most
:data:`ACCEPT` (0.05); :func:`~depthlens.report.claims.evaluate` turns a decisive verdict at a
sample size where its claim is not accepted into "inconclusive: underpowered".
:func:`calibration_at` calibrates a claim at the run's own sample sizes (counted by the
statistic's sample counters, the scenario's defaults for a count the run does not record),
with :data:`RUN_DRAWS` draws per world, memoised per process.

The planted worlds are stated in each scenario's ``null`` and ``effect`` text and reported
with every calibration. They are simulations of the statistic's inputs, not of a model, so
they test the decision rule (its interval, its multiplicity correction, its minimum) at the
run's sample size; they cannot test whether a model's tables are what the scenario assumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .claims import Claim, judge
from .statistics import STATISTICS
from .tables import RunTables

__all__ = ["ACCEPT", "RUN_DRAWS", "SCENARIOS", "MemoryTables", "Scenario", "calibrate", "calibration_at",
           "calibration_table"]

#: Largest acceptable P(supported | null) and P(falsified | effect).
ACCEPT = 0.05
#: Draws per world when a run's report calibrates its claims.
RUN_DRAWS = 100


class MemoryTables(RunTables):
    """A :class:`RunTables` over tables and summaries held in memory (a simulated run).

    Parameters
    ----------
    tables : mapping of str to DataFrame
        ``NAME`` → the rows of ``tables/NAME.parquet``.
    summaries : mapping of str to dict, optional
        ``NAME`` → the contents of ``NAME.json`` (``manifest`` among them).
    """

    def __init__(self, tables: Mapping[str, pd.DataFrame], summaries: Mapping[str, dict] | None = None) -> None:
        super().__init__(Path("/nonexistent/depthlens-memory-run"))
        for name, df in tables.items():
            self._cache[f"table:{name}"] = df
        for name, obj in (summaries or {}).items():
            self._cache[f"json:{name}"] = obj
        self._cache.setdefault("json:manifest", {})


Simulator = Callable[[np.random.Generator, Mapping[str, int], bool], RunTables]


@dataclass(frozen=True)
class Scenario:
    """The planted worlds of one statistic.

    ``simulate(rng, sizes, effect)`` returns the tables the statistic reads, drawn with the
    sample sizes ``sizes`` (units of :data:`~depthlens.report.statistics.SAMPLE_UNITS`, plus the
    scenario's own design sizes) in the null world (``effect`` False) or the effect world.
    ``default`` holds the sizes of a run of the default preset on the embedded SmolLM2 (30
    layers of 9 heads); ``null`` and ``effect`` say what is planted.
    """

    statistic: str
    simulate: Simulator
    default: dict[str, int]
    null: str
    effect: str


SCENARIOS: dict[str, Scenario] = {}


def scenario(statistic: str, default: dict[str, int], null: str, effect: str) -> Callable[[Simulator], Simulator]:
    """Decorator registering a simulator as the :class:`Scenario` of ``statistic``."""
    if statistic not in STATISTICS:
        raise ValueError(f"scenario for unknown statistic {statistic!r}")

    def wrap(func: Simulator) -> Simulator:
        SCENARIOS[statistic] = Scenario(statistic, func, dict(default), " ".join(null.split()),
                                        " ".join(effect.split()))
        return func

    return wrap


# ----------------------------------------------------------------------------- calibration
def calibrate(claim: Claim, sizes: Mapping[str, int] | None = None, draws: int = 1000, seed: int = 0, *,
              intervals: bool = True) -> dict[str, Any] | None:
    """Error rates of ``claim`` at ``sizes`` (the scenario's defaults for any size not given).

    Each of the ``draws`` draws per world uses its own stream ``SeedSequence([seed, world,
    draw])``, so the result is the same on every machine (``intervals=False``: the verdicts of
    the value alone, the point rule). Returns None when the claim's
    statistic has no scenario; else a dict with ``sizes``, ``draws``, ``p_supported_null``,
    ``p_falsified_null``, ``p_supported_effect``, ``p_falsified_effect``, ``accepted``
    (both error rates ≤ :data:`ACCEPT`), ``null`` and ``effect`` (what was planted).
    """
    found = SCENARIOS.get(claim.statistic)
    if found is None:
        return None
    full = {**found.default, **{k: int(v) for k, v in (sizes or {}).items() if k in found.default}}
    rates: dict[str, float] = {}
    for world, planted in ((0, False), (1, True)):
        verdicts = [judge(claim, found.simulate(np.random.default_rng(np.random.SeedSequence([seed, world, i])),
                                                full, planted), intervals=intervals).verdict for i in range(draws)]
        name = "effect" if planted else "null"
        rates[f"p_supported_{name}"] = verdicts.count("supported") / draws
        rates[f"p_falsified_{name}"] = verdicts.count("falsified") / draws
    return {"sizes": full, "draws": draws, **rates,
            "accepted": rates["p_supported_null"] <= ACCEPT and rates["p_falsified_effect"] <= ACCEPT,
            "null": found.null, "effect": found.effect}


def run_sizes(claim: Claim, tables: RunTables) -> dict[str, int]:
    """The run's count of each size the claim's scenario takes, where the statistic counts it
    and the run records it."""
    found = SCENARIOS.get(claim.statistic)
    counters = STATISTICS[claim.statistic].samples
    out = {}
    for unit in (found.default if found else {}):
        if unit in counters:
            try:
                n = counters[unit](tables)
            except Exception:  # noqa: BLE001 - an odd table: the scenario's default stands
                n = None
            if n is not None and n > 0:
                out[unit] = int(n)
    return out


def calibration_at(claim: Claim, tables: RunTables, draws: int = RUN_DRAWS) -> dict[str, Any] | None:
    """:func:`calibrate` at the run's own sample sizes (:func:`run_sizes`), memoised."""
    if claim.statistic not in SCENARIOS:
        return None
    return dict(_memo(claim, tuple(sorted(run_sizes(claim, tables).items())), draws))


@lru_cache(maxsize=512)
def _memo(claim: Claim, sizes: tuple[tuple[str, int], ...], draws: int) -> dict[str, Any]:
    return calibrate(claim, dict(sizes), draws)  # type: ignore[return-value]


def calibration_table(claims: Sequence[Claim], draws: int = 1000, seed: int = 0, *, intervals: bool = True
                      ) -> pd.DataFrame:
    """Every claim's calibration at the default sizes and at its declared minimum sizes (the
    ``min_UNIT`` fields replacing the defaults they name): one row per (claim, sizes) with
    ``claim``, ``at`` (``default`` or ``minimum``), ``sizes`` (text), the four rates,
    ``accepted``; claims without a scenario get one row with ``at`` = ``no scenario``."""
    rows = []
    for claim in claims:
        found = SCENARIOS.get(claim.statistic)
        if found is None:
            rows.append({"claim": claim.id, "at": "no scenario"})
            continue
        minimum = {unit: n for unit, n in claim.min_sample if unit in found.default}
        for at, sizes in (("default", {}), ("minimum", minimum)):
            if at == "minimum" and not minimum:
                continue
            result = calibrate(claim, sizes, draws, seed, intervals=intervals)
            assert result is not None
            rows.append({"claim": claim.id, "at": at,
                         "sizes": ", ".join(f"{k}={v}" for k, v in result["sizes"].items()),
                         **{k: result[k] for k in ("p_supported_null", "p_falsified_null", "p_supported_effect",
                                                   "p_falsified_effect", "accepted")}})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- helpers
def _ranks(rng: np.random.Generator, shift: np.ndarray, samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per entry of ``shift`` (any shape): an observation ``N(shift, 1)`` and its ``samples``
    null draws ``N(0, 1)``; returns the rank of the observation among its nulls, among the
    first ``⌈samples/2⌉`` of them, and the observation minus the nulls' mean."""
    nulls = rng.standard_normal((*shift.shape, samples))
    obs = shift + rng.standard_normal(shift.shape)
    below = nulls < obs[..., None]
    return (below.sum(axis=-1).astype(float), below[..., : math.ceil(samples / 2)].sum(axis=-1).astype(float),
            obs - nulls.mean(axis=-1))


def _correlated(rng: np.random.Generator, n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs of standard normals with correlation ``rho``."""
    x = rng.standard_normal(n)
    return x, rho * x + math.sqrt(1.0 - rho * rho) * rng.standard_normal(n)


def _heads(layer_size: int, n: int, role: str) -> pd.DataFrame:
    idx = np.arange(n)
    return pd.DataFrame({"layer": idx // layer_size, "head": idx % layer_size, "role": role})


# ----------------------------------------------------------------------------- Part A
def _depth(rng: np.random.Generator, chunks: int, samples: int, model: float, null: float) -> pd.DataFrame:
    """Final-depth rows of the mean-head depth products: per chunk the model's gap
    ``N(model, 1)`` and ``samples`` null gaps ``N(null, 1)`` (orders of magnitude)."""
    rows = []
    for c in range(chunks):
        rows.append({"chunk": c, "source": "model", "sample": -1, "gap_e1": model + rng.standard_normal()})
        rows += [{"chunk": c, "source": "null", "sample": s, "gap_e1": null + g}
                 for s, g in enumerate(rng.standard_normal(samples))]
    return pd.DataFrame(rows).assign(operator="mean", depth=30, gap_e2=lambda d: d["gap_e1"])


@scenario("eig_gap_e1_contrast", {"null_chunks": 8, "null_samples": 8},
          null="model and null gaps both N(2, 1) per chunk (the model errs no more than its nulls)",
          effect="model gap N(9, 1) (the seed's 7–11 orders), null gaps N(0.5, 1)")
def _sim_contrast(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    model, null = (9.0, 0.5) if effect else (2.0, 2.0)
    return MemoryTables({"depth": _depth(rng, n["null_chunks"], n["null_samples"], model, null)})


@scenario("eig_gap_e1_null_chunks", {"null_chunks": 8, "null_samples": 8},
          null="null gaps N(4, 1) (the error is present in the matched nulls too)",
          effect="null gaps N(0.3, 1) (absent in the nulls, as the seed says)")
def _sim_null_gap(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    return MemoryTables({"depth": _depth(rng, n["null_chunks"], n["null_samples"], 9.0, 0.3 if effect else 4.0)})


@scenario("induction_ratio_control_median", {"routing_heads": 24},
          null="per routing head log ratio N(0, 0.4): no change when induction engages",
          effect="per routing head log ratio N(log 2, 0.4): the seed's doubling")
def _sim_induction(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    heads = _heads(9, n["routing_heads"], "routing")
    heads["induction_ratio_control"] = np.exp((math.log(2.0) if effect else 0.0)
                                              + 0.4 * rng.standard_normal(len(heads)))
    return MemoryTables({"heads": heads})


def _role_ranks(role: str, sign: float) -> Simulator:
    """head_chunks and heads of ``role`` heads only (the claim's BH family): per head and chunk
    the rank of TR1 among ``null_samples`` nulls, TR1 ~ N(shift, 1) and nulls N(0, 1)."""
    def simulate(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
        heads = _heads(9, n[f"{role}_heads"], role)
        chunks = n["null_chunks"]
        shift = np.full((len(heads), chunks), sign * (1.0 if effect else 0.0))
        rank, half, excess = _ranks(rng, shift, n["null_samples"])
        table = pd.DataFrame({"layer": np.repeat(heads["layer"], chunks), "head": np.repeat(heads["head"], chunks),
                              "chunk": np.tile(np.arange(chunks), len(heads)), "delta_TR1": excess.ravel(),
                              "null_rank_TR1": rank.ravel(), "null_n": float(n["null_samples"]),
                              "null_rank_TR1_half": half.ravel()})
        return MemoryTables({"head_chunks": table, "heads": heads.assign(n_null_chunks=chunks)},
                            {"attention": {"q_level": 0.05}})

    return simulate


for _role, _sign, _size in (("routing", 1.0, 24), ("sink", -1.0, 120)):
    scenario(f"{_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction",
             {f"{_role}_heads": _size, "null_chunks": 8, "null_samples": 8},
             null=f"every {_role} head's TR1 exchangeable with its nulls (N(0, 1) each)",
             effect=f"every {_role} head's TR1 one null standard deviation {'above' if _sign > 0 else 'below'} its "
                    "nulls' mean in every chunk")(_role_ranks(_role, _sign))


@scenario("routing_reserve_tracks_prev_token", {"routing_heads": 24},
          null="Δ_TR and the previous-token score independent over routing heads",
          effect="Gaussian-copula correlation 0.6 between them")
def _sim_tracks(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    heads = _heads(9, n["routing_heads"], "routing")
    x, y = _correlated(rng, len(heads), 0.6 if effect else 0.0)
    return MemoryTables({"heads": heads.assign(delta_TR1=x, prev_token_score=0.5 + 0.1 * y)})


# ----------------------------------------------------------------------------- Part B
@scenario("rotation_gain_early", {"early_layers": 10, "width": 16},
          null="trained and step-0 layers drawn alike: updates 70% symmetric",
          effect="step-0 updates 70% symmetric, trained early updates 70% skew (rotation-heavy)")
def _sim_rotation(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    d, layers = n["width"], 3 * n["early_layers"]
    g = rng.standard_normal((2, layers, d, d))
    share = np.array([0.7, 0.3 if effect else 0.7])[:, None, None, None]  # init, trained
    sym, skew = (g + g.swapaxes(-1, -2)) / 2, (g - g.swapaxes(-1, -2)) / 2
    lam = np.linalg.eigvals(np.eye(d) + (share * sym + (1 - share) * skew) / math.sqrt(d))
    return MemoryTables({"eigenvalues": pd.DataFrame({
        "checkpoint": np.repeat(["init", "trained"], layers * d), "layer": np.tile(np.repeat(np.arange(layers), d), 2),
        "re": lam.real.ravel(), "im": lam.imag.ravel(), "jacobian_mode": "isolated", "sublayer": "layer"})})


@scenario("symmetry_depth_trend_trained", {"operators": 60},
          null="symmetry_update independent of depth (uniform on [0.3, 0.7])",
          effect="symmetry_update rising with depth: 0.3 + 0.4·layer/L plus N(0, 0.1)")
def _sim_symmetry(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    ops = n["operators"]
    layer = np.arange(ops) // 2
    depth = layer / max(1, layer.max())
    values = 0.3 + 0.4 * depth + 0.1 * rng.standard_normal(ops) if effect else rng.uniform(0.3, 0.7, ops)
    return MemoryTables({"operators": pd.DataFrame({
        "checkpoint": "trained", "jacobian_mode": "isolated", "layer": layer,
        "sublayer": np.where(np.arange(ops) % 2, "mlp", "attn"), "symmetry_update": values})})


def _coupling(rng: np.random.Generator, rates: Mapping[str, float], boundaries: int) -> pd.DataFrame:
    parts = []
    for checkpoint, rate in rates.items():
        parts.append(pd.DataFrame({"checkpoint": checkpoint, "boundary": np.arange(boundaries),
                                   "significant": rng.random(boundaries) < rate}))
    return pd.concat(parts, ignore_index=True)


@scenario("coupling_monotone_rise", {"boundaries": 60},
          null="each boundary significant with probability 0.1 at init, mid-training and trained alike",
          effect="probabilities 0, 14/32 and 24/32 (the seed's 0 → 14 → 24 of OLMo's 32 layers)")
def _sim_rise(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    rates = dict(zip(("init", "mid", "trained"), (0.0, 14 / 32, 24 / 32) if effect else (0.1, 0.1, 0.1)))
    return MemoryTables({"coupling": _coupling(rng, rates, n["boundaries"])},
                        {"manifest": {"config": {"revisions": ["mid"]}}})


@scenario("coupling_significant_fraction_init", {"boundaries": 60},
          null="coupling present at init: each boundary significant with probability 0.3",
          effect="coupling absent at init: significant with probability 0.01 (false discoveries)")
def _sim_init(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    return MemoryTables({"coupling": _coupling(rng, {"init": 0.01 if effect else 0.3}, n["boundaries"])})


@scenario("coupling_sign_follows_type", {"boundaries": 60},
          null="each boundary significant with probability 0.75, its sign independent of symmetry_update",
          effect="significant with probability 0.75, sign positive above the median symmetry_update and "
                 "negative below with probability 0.9")
def _sim_sign(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    b = n["boundaries"]
    symmetry = rng.uniform(0.2, 0.8, b)
    predicted = np.where(symmetry > np.median(symmetry), 1.0, -1.0)
    sign = np.where(rng.random(b) < 0.9, predicted, -predicted) if effect else rng.choice([-1.0, 1.0], b)
    return MemoryTables({"coupling": pd.DataFrame({
        "checkpoint": "trained", "boundary": np.arange(b), "symmetry_update": symmetry,
        "effect": sign * rng.uniform(0.05, 0.5, b), "significant": rng.random(b) < 0.75})})


# ----------------------------------------------------------------------------- Part C
@scenario("census_onset_lag_p", {"paired_layers": 6, "heads_per_layer": 4, "checkpoints": 10},
          null="per head one latent onset for both series (true lag 0); the reserve noise (sd 0.15) half shared "
               "by the heads of a layer (heads are not independent), score noise 0.05",
          effect="consolidation two checkpoints after formation in every head, same noise")
def _sim_onsets(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    T, layers, per = n["checkpoints"], n["paired_layers"], n["heads_per_layer"]
    first = max(1, T // 5)
    onset = rng.integers(first, max(first + 1, T - 3), size=(layers, per))[..., None]
    k = np.arange(T)
    shared = rng.standard_normal((layers, 1, T))
    noise = math.sqrt(0.5) * (shared + rng.standard_normal((layers, per, T)))
    score = 0.1 + 0.6 * (k >= onset) + 0.05 * rng.standard_normal((layers, per, T))
    reserve = 0.4 * (k >= onset + (2 if effect else 0)) + 0.15 * noise
    grid = np.meshgrid(np.arange(layers), np.arange(per), k, indexing="ij")
    return MemoryTables({"census_heads": pd.DataFrame({
        "series": "s", "order": grid[2].ravel(), "step": 2.0 ** grid[2].ravel(), "layer": grid[0].ravel(),
        "head": grid[1].ravel(), "prev_token_score": score.ravel(), "induction_score": 0.02, "sink_mass": 0.1,
        "delta_TR1": reserve.ravel()})})


@scenario("census_coupling_trend", {"checkpoints": 8, "boundaries": 24},
          null="each boundary significant with probability 0.1 at every checkpoint",
          effect="probability rising linearly from 0 to 0.75 over the checkpoints (the seed's 0 → 24 of 32)")
def _sim_census_trend(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    T, b = n["checkpoints"], n["boundaries"]
    rates = np.linspace(0.0, 0.75, T) if effect else np.full(T, 0.1)
    return MemoryTables({"census": pd.DataFrame({
        "series": "s", "order": np.arange(T), "status": "done", "funnel_step0_over": np.nan,
        "erank_full_depth": np.nan, "coupling_significant": rng.binomial(b, rates).astype(float),
        "coupling_tested": float(b)})})
