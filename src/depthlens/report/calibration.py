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
with :data:`RUN_DRAWS` draws per world. A calibration is a deterministic function of the
claim's decision fields, the sample sizes, the draws and the code that decides (the modules of
:data:`DECIDING`, fingerprinted by :func:`code_fingerprint`), so it is computed once and
stored under that key: in the packaged ``calibrations.json`` (the embedded model's presets,
written by ``python -m depthlens.report.calibration``, checked by the suite against a fresh
computation) and in the user cache (``<cache>/calibration/KEY.json``,
:func:`~depthlens.cache.cache_root`), then memoised per process. A stored entry of other code
has another key and is never read.

The planted worlds are stated in each scenario's ``null`` and ``effect`` text and reported
with every calibration. They are simulations of the statistic's inputs, not of a model, so
they test the decision rule (its interval, its multiplicity correction, its minimum) at the
run's sample size; they cannot test whether a model's tables are what the scenario assumes.
Where the rule is a stage's own code, the scenario runs it: the clamp chain's simulates the
per-head tables and judges them with the stage's
:func:`~depthlens.interventions.clamp.chain_verdict`. The contest's code takes seconds a target,
too slow for :data:`RUN_DRAWS` draws a world, so its scenarios draw the contest rows from a
sampling model measured on that code over per-head simulations of the same worlds
(:func:`contest_world`, :func:`real_contest`); the suite checks the model against the code.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtr

from ..cache import cache_root
from ..contest import cv
from ..interventions import clamp as cl
from ..runs.atomic import write_json
from ..stats import aggregate_induction, percentile_interval
from .claims import Claim, judge
from .statistics import SCHUR_ORDERS, STATISTICS
from ..runs.tables import RunTables

__all__ = ["ACCEPT", "DECIDING", "RUN_DRAWS", "SCENARIOS", "SHIPPED", "MemoryTables", "Scenario", "calibrate",
           "calibration_at", "calibration_key", "calibration_points", "calibration_table", "code_fingerprint",
           "refresh_shipped"]

#: Largest acceptable P(supported | null) and P(falsified | effect).
ACCEPT = 0.05
#: Draws per world when a run's report calibrates its claims.
RUN_DRAWS = 100
#: The modules (paths under the package) whose code decides a calibration's numbers.
DECIDING = ("report/calibration.py", "report/statistics.py", "report/census_statistics.py", "report/claims.py",
            "runs/tables.py", "stats.py", "report/onsets.py", "contest/cv.py", "interventions/clamp.py")
#: The packaged calibrations: ``{"code": fingerprint, "entries": {key: {"claim", "sizes", "draws", "result"}}}``.
SHIPPED = Path(__file__).with_name("calibrations.json")


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
    """:func:`calibrate` at the run's own sample sizes (:func:`run_sizes`): from the packaged
    or the user's stored calibrations when they hold its key (:func:`calibration_key`), else
    computed and stored in the user cache; memoised per process."""
    if claim.statistic not in SCENARIOS:
        return None
    return dict(_memo(claim, tuple(sorted(run_sizes(claim, tables).items())), draws))


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 (hex) of the code that decides a calibration: the modules of :data:`DECIDING`."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for name in DECIDING:
        digest.update(name.encode() + b"\0" + (root / name).read_bytes())
    return digest.hexdigest()


def calibration_key(claim: Claim, sizes: Mapping[str, int], draws: int) -> str:
    """The key of a calibration (seed 0, intervals on): sha256 of the claim's decision fields
    (statistic, test, threshold, inconclusive band, minimums), the sizes, the draws and
    :func:`code_fingerprint`. The claim's wording is no part of it."""
    payload = {"statistic": claim.statistic, "test": claim.test, "threshold": claim.threshold,
               "band": claim.inconclusive_band, "min": claim.min_sample, "sizes": sorted(sizes.items()),
               "draws": draws, "code": code_fingerprint()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@lru_cache(maxsize=1)
def _shipped_entries() -> dict[str, Any]:
    try:
        return dict(json.loads(SHIPPED.read_text()).get("entries", {}))
    except (OSError, ValueError, AttributeError):
        return {}


def _user_file(key: str) -> Path:
    return cache_root() / "calibration" / f"{key}.json"


@lru_cache(maxsize=512)
def _memo(claim: Claim, sizes: tuple[tuple[str, int], ...], draws: int) -> dict[str, Any]:
    key = calibration_key(claim, dict(sizes), draws)
    shipped = _shipped_entries().get(key)
    if shipped is not None:
        return shipped["result"]
    path = _user_file(key)
    try:
        return json.loads(path.read_text())["result"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not stored (or unreadable): computed below
    result = calibrate(claim, dict(sizes), draws)
    assert result is not None
    try:
        write_json(path, {"claim": claim.id, "sizes": dict(sizes), "draws": draws, "result": result})
    except OSError:
        pass  # a read-only or full cache costs the next run this computation, nothing else
    return result


def refresh_shipped(runs: Sequence[str | Path] = (), claims: Sequence[Claim] | None = None) -> int:
    """Rewrite :data:`SHIPPED` for the current code: every entry it holds recomputed, plus
    every claim of ``claims`` (default: the packaged claims) at each run's sample sizes (run
    directories, e.g. ``depthlens run --preset quick`` on the embedded model). Returns the
    number of entries written."""
    from .claims import load_claims

    claims = list(claims) if claims is not None else load_claims()
    by_id = {c.id: c for c in claims}
    wanted: dict[str, tuple[Claim, dict[str, int], int]] = {}
    for old in _shipped_entries().values():
        if old.get("claim") in by_id:
            claim, sizes = by_id[old["claim"]], {k: int(v) for k, v in old["sizes"].items()}
            wanted[calibration_key(claim, sizes, old["draws"])] = (claim, sizes, int(old["draws"]))
    for run in runs:
        tables = RunTables(Path(run))
        for claim in claims:
            if claim.statistic in SCENARIOS:
                sizes = run_sizes(claim, tables)
                wanted[calibration_key(claim, sizes, RUN_DRAWS)] = (claim, sizes, RUN_DRAWS)
    entries = {key: {"claim": claim.id, "sizes": sizes, "draws": draws, "result": calibrate(claim, sizes, draws)}
               for key, (claim, sizes, draws) in sorted(wanted.items())}
    write_json(SHIPPED, {"code": code_fingerprint(), "entries": entries})
    _shipped_entries.cache_clear()
    return len(entries)


def calibration_points(claim: Claim) -> list[tuple[str, dict[str, int]]]:
    """Where ``claim`` is calibrated, as ``(at, sizes)`` (sizes not named keep the scenario's
    defaults): ``default``, then every corner of the box between its declared minimums and the
    defaults, each unit with a minimum at its minimum or at its default: ``minimum`` where all
    are at their minimums, ``mixed`` otherwise (a minimum must hold whatever the other units'
    sizes, e.g. few null chunks with many heads). A unit whose minimum equals its default is no
    axis of the box, so no point repeats another. Empty for a claim without a scenario.

    Examples
    --------
    >>> from depthlens.report.claims import load_claims
    >>> a5 = next(c for c in load_claims() if c.id == "A5-routing-positive")
    >>> [at for at, _ in calibration_points(a5)]
    ['default', 'mixed', 'mixed', 'minimum']
    """
    found = SCENARIOS.get(claim.statistic)
    if found is None:
        return []
    # a unit whose minimum is its default adds no corner (it would repeat another point)
    minimum = sorted((unit, n) for unit, n in claim.min_sample if unit in found.default and n != found.default[unit])
    points: list[tuple[str, dict[str, int]]] = [("default", {})]
    for corner in itertools.product((False, True), repeat=len(minimum)):
        if any(corner):
            points.append(("minimum" if all(corner) else "mixed",
                           {unit: n for (unit, n), low in zip(minimum, corner) if low}))
    return points


def calibration_table(claims: Sequence[Claim], draws: int = 1000, seed: int = 0, *, intervals: bool = True
                      ) -> pd.DataFrame:
    """Every claim's calibration at each of its :func:`calibration_points`: one row per
    (claim, sizes) with ``claim``, ``at`` (``default``, ``mixed`` or ``minimum``), ``sizes``
    (text), the four rates, ``accepted``; claims without a scenario get one row with ``at`` =
    ``no scenario``."""
    rows = []
    for claim in claims:
        if claim.statistic not in SCENARIOS:
            rows.append({"claim": claim.id, "at": "no scenario"})
            continue
        for at, sizes in calibration_points(claim):
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


@scenario("eig_gap_e1_contrast", {"null_chunks": 10, "null_samples": 8},
          null="model and null gaps both N(2, 1) per chunk (the model errs no more than its nulls)",
          effect="model gap N(9, 1) (the seed's 7–11 orders), null gaps N(0.5, 1)")
def _sim_contrast(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    model, null = (9.0, 0.5) if effect else (2.0, 2.0)
    return MemoryTables({"depth": _depth(rng, n["null_chunks"], n["null_samples"], model, null)})


@scenario("eig_gap_e1_null_chunks", {"null_chunks": 10, "null_samples": 8},
          null="null gaps N(4, 1) (the error is present in the matched nulls too)",
          effect="null gaps N(0.3, 1) (absent in the nulls, as the seed says)")
def _sim_null_gap(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    return MemoryTables({"depth": _depth(rng, n["null_chunks"], n["null_samples"], 9.0, 0.3 if effect else 4.0)})


@scenario("induction_ratio_control_median", {"routing_heads": 24, "probe_seqs": 16},
          null="per routing head a control excess reserve |N(0.15, 0.12)| nats and a ratio exp N(0, 0.4) of the "
               "probe's to it; each sequence adds N(0, 0.025²) nats to both (SmolLM2's spread between sequences)",
          effect="the same with ratios exp N(log 2, 0.4): the seed's doubling")
def _sim_induction(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    heads, seqs = _heads(9, n["routing_heads"], "routing"), n["probe_seqs"]
    control = np.abs(0.15 + 0.12 * rng.standard_normal(len(heads)))
    ratio = np.exp((math.log(2.0) if effect else 0.0) + 0.4 * rng.standard_normal(len(heads)))
    noise = 0.025 * rng.standard_normal((3, len(heads), seqs))
    rows = pd.DataFrame({"layer": np.repeat(heads["layer"], seqs), "head": np.repeat(heads["head"], seqs),
                         "seq": np.tile(np.arange(seqs), len(heads)),
                         "delta_TR1_first_copy": (control[:, None] + noise[0]).ravel(),
                         "delta_TR1_second_copy": ((control * ratio)[:, None] + noise[1]).ravel(),
                         "delta_TR1_control": (control[:, None] + noise[2]).ravel()})
    return MemoryTables({"heads": heads.merge(aggregate_induction(rows), on=["layer", "head"]),
                         "induction_seqs": rows})


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
             {f"{_role}_heads": _size, "null_chunks": 10, "null_samples": 8},
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


# ----------------------------------------------------------------------------- A7: the clamp chain
#: The clamp scenario's massive dims (the seed's three; labels only).
CLAMP_DIMS = (101, 202, 303)
#: Per-chunk jitter of a clamped arm at α = 0: sink mass, and Δ_TR (nats) at 2 null samples
#: per matrix (it scales with 1/√samples); a dose α scales it by 1 − α, α = 1 being the model.
_CLAMP_JITTER = (0.03, 0.006)


def _clamp_arm(rng: np.random.Generator, clean: tuple[np.ndarray, np.ndarray], change: tuple[np.ndarray, np.ndarray],
               alpha: float, null_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """One arm's per-head sink mass and Δ_TR, each the median over chunks (as
    :func:`~depthlens.interventions.clamp.aggregate_heads`); Δ_TR is NaN at doses the stage
    measures no reserve for.

    ``clean`` holds the unclamped model's per-chunk values (heads × chunks), ``change`` the
    arm's per-head fall in sink mass and rise in Δ_TR at α = 0; the dose α applies ``1 − α`` of
    them and of the chunk jitter (:data:`_CLAMP_JITTER`); the sink mass stays in [0, 1].
    """
    scale = 1.0 - alpha
    sink_sd, reserve_sd = _CLAMP_JITTER
    sink = clean[0] - scale * (change[0][:, None] - sink_sd * rng.standard_normal(clean[0].shape))
    tr = np.full(len(change[1]), np.nan)
    if any(alpha == a for a in cl.TR_ALPHAS):
        noise = reserve_sd * math.sqrt(2.0 / null_samples) * rng.standard_normal(clean[1].shape)
        tr = np.median(clean[1] + scale * (change[1][:, None] + noise), axis=1)
    return np.median(np.clip(sink, 0.0, 1.0), axis=1), tr


@scenario("clamp_chain_n_dims", {"chunks": 6, "control_seeds": 3, "null_samples": 2, "clamped_layers": 18},
          null="the three massive dims carry no chain: clamping them (all, each alone, each left out) moves each "
               "head's sink mass by N(0, 0.25) at α = 0 (either sign, 1 − α of it at dose α), every control seed "
               "moves it as far (SmolLM2's three control seeds moved it 0.5 to 0.8 times as far as its clamp), "
               "and the Δ_TR rise is N(0, 0.05), unrelated to the fall",
          effect="each of the seed's three massive dims carries the chain: the clamp of all three lowers a head's "
                 "sink mass s by s·U(0.2, 0.8) at α = 0 (1 − α of it at dose α), each dim alone by a third of that "
                 "and left out by two thirds, the Δ_TR rise 0.2 × the fall plus N(0, 0.03) (rank correlation about "
                 "0.6, SmolLM2's 0.58), the control moves neither; every arm jitters per chunk by sd 0.03 in sink "
                 "mass and 0.006 nats in Δ_TR (at 2 null samples) at α = 0; the model's sink mass per head "
                 "N(0.53, 0.18) and Δ_TR N(0.035, 0.037), per chunk ± 0.1 and 0.03 (SmolLM2's clamped heads)")
def _sim_clamp(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    """The clamp stage's per-head tables of a model with 9 heads in each of the last
    ``clamped_layers`` of 30 layers (SmolLM2's massive dims emerge at layer 12), medians over
    ``chunks``, judged by the stage's own :func:`~depthlens.interventions.clamp.chain_verdict`
    (the default seed 0 for its permutations); returns ``interventions.json`` as the stage
    writes it."""
    heads, chunks, samples = 9 * n["clamped_layers"], n["chunks"], n["null_samples"]
    base = np.clip(0.53 + 0.18 * rng.standard_normal(heads), 0.02, 0.98)
    clean = (np.clip(base[:, None] + 0.1 * rng.standard_normal((heads, chunks)), 0.0, 1.0),
             0.035 + 0.037 * rng.standard_normal((heads, 1)) + 0.03 * rng.standard_normal((heads, chunks)))
    full = base * rng.uniform(0.2, 0.8, heads)

    def change(share: float) -> tuple[np.ndarray, np.ndarray]:
        if not effect:
            return 0.25 * rng.standard_normal(heads), 0.05 * rng.standard_normal(heads)
        return share * full, 0.2 * share * full + 0.03 * share * rng.standard_normal(heads)

    massive = change(1.0)
    arms = [("massive", -1, a, massive) for a in (0.0, 0.25, 0.5, 0.75, 1.0)]
    quiet = (np.zeros(heads), np.zeros(heads))
    arms += [("control", s, 0.0, change(1.0) if not effect else quiet) for s in range(n["control_seeds"])]
    dims = [(t, d, change(share)) for d in CLAMP_DIMS for t, share in (("alone", 1 / 3), ("left_out", 2 / 3))]
    layer = np.arange(heads) // 9 + 30 - n["clamped_layers"]
    head = np.arange(heads) % 9

    def table(keys: dict[str, list], values: list[tuple[np.ndarray, np.ndarray]], columns: list[str]) -> pd.DataFrame:
        rows = len(values)
        return pd.DataFrame({"layer": np.tile(layer, rows), "head": np.tile(head, rows),
                             **{k: np.repeat(v, heads) for k, v in keys.items()},
                             "sink_mass": np.concatenate([v[0] for v in values]), "TR1": np.nan,
                             "delta_TR1": np.concatenate([v[1] for v in values]), "failure": None})[columns]

    head_rows = table({"target": [t for t, *_ in arms], "seed": [s for _, s, *_ in arms], "arm": ["dose"] * len(arms),
                       "alpha": [a for *_, a, _ in arms]},
                      [_clamp_arm(rng, clean, c, a, samples) for *_, a, c in arms], cl.HEAD_COLUMNS)
    dim_rows = table({"target": [t for t, *_ in dims], "dim": [d for _, d, _ in dims]},
                     [_clamp_arm(rng, clean, c, 0.0, samples) for *_, c in dims], cl.DIM_COLUMNS)
    verdict = cl.chain_verdict(head_rows, dim_rows, CLAMP_DIMS, seed=0)
    return MemoryTables({}, {"interventions": cl.json_safe({"clamp_chain": {**verdict, "n_chunks": chunks}})})


# ----------------------------------------------------------------------------- A7: the contest
#: Heads per layer of the contest worlds (SmolLM2's 9).
CONTEST_HEADS = 9
#: The contest's metric per target (as :data:`depthlens.stages.contest.METRIC`).
CONTEST_METRIC = {"persistence": "spearman", "routing": "auroc", "criticality": "spearman"}
#: Population Spearman of criticality with the one family that predicts it (the null world of
#: A7-criticality-unpredicted).
CRITICALITY_RHO = 0.4


def contest_world(rng: np.random.Generator, layers: int, resolvent: float, criticality: float
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-head contest features and targets of a planted world: ``layers`` × :data:`CONTEST_HEADS`
    heads.

    Every feature is N(0, 1) per head plus N(0, 0.25) shared by the heads of a layer; each
    family F has the signal ``u_F`` (its four features against the fixed weights (1, −½, ½, 0),
    normalised), and ``o = (u_P + u_E + u_S)/√3``. Every resolvent feature also carries
    ``(u_E + u_S)/(2√2)`` (R overlaps other families, as resolvent quantities overlap spectra
    and norms), so R alone predicts part of what E and S predict. Persistence is
    ``o + resolvent·u_R`` (``u_R`` of R's own part, before the overlap) plus head noise N(0, 1)
    and layer noise N(0, 0.25); routing is 1 for the heads ranking in the top 24/270 (SmolLM2's
    routing share) of a second such draw; criticality is ``criticality·u_P`` plus the same
    noises (``criticality`` = :func:`criticality_weight` gives Spearman 0.4). With
    ``resolvent`` = 0, R adds nothing given P, E and S (the null of
    A7-contest-resolvent-required); with 1, R carries as much of persistence and routing as the
    other three families together.

    Returns
    -------
    features : DataFrame
        ``layer``, ``head`` and the 16 columns of :data:`depthlens.contest.cv.FEATURE_FAMILIES`.
    targets : DataFrame
        ``persistence``, ``routing`` (0/1), ``criticality``, one row per head.
    """
    n = layers * CONTEST_HEADS
    layer = np.repeat(np.arange(layers), CONTEST_HEADS)
    columns = [c for cols in cv.FEATURE_FAMILIES.values() for c in cols]
    X = rng.standard_normal((n, len(columns))) + 0.5 * rng.standard_normal((layers, len(columns)))[layer]
    weights = np.array([1.0, -0.5, 0.5, 0.0]) / math.sqrt(1.5)
    u = {f: X[:, 4 * i: 4 * i + 4] @ weights for i, f in enumerate(cv.FEATURE_FAMILIES)}
    other = (u["P"] + u["E"] + u["S"]) / math.sqrt(3.0)
    X[:, 12:] += 0.5 * ((u["E"] + u["S"]) / math.sqrt(2.0))[:, None]

    def noisy(signal: np.ndarray) -> np.ndarray:
        return signal + rng.standard_normal(n) + 0.5 * rng.standard_normal(layers)[layer]

    persistence = noisy(other + resolvent * u["R"])
    routing = np.zeros(n)
    routing[np.argsort(-noisy(other + resolvent * u["R"]))[: max(2, round(24 / 270 * n))]] = 1.0
    features = pd.DataFrame(X, columns=columns)
    features.insert(0, "head", np.arange(n) % CONTEST_HEADS)
    features.insert(0, "layer", layer)
    return features, pd.DataFrame({"persistence": persistence, "routing": routing,
                                   "criticality": noisy(criticality * u["P"])})


def criticality_weight(rho: float = CRITICALITY_RHO) -> float:
    """The weight of ``u_P`` in :func:`contest_world`'s criticality for a population Spearman
    ``rho`` between them: Pearson ``r = 2 sin(πρ/6)`` (bivariate normal), and ``u_P`` and the
    noise have the same variance, so the weight is ``r / √(1 − r²)``."""
    r = 2.0 * math.sin(math.pi * rho / 6.0)
    return r / math.sqrt(1.0 - r * r)


def real_contest(features: pd.DataFrame, targets: pd.DataFrame, names: Sequence[str], *, n_boot: int, n_perm: int,
                 seed: int = 0) -> pd.DataFrame:
    """The ``contest`` table the stage's own code makes of a :func:`contest_world`: for each
    target of ``names`` :func:`depthlens.contest.cv.contest_target` (5 folds, the stage's seed
    tags), then BH over every row (:func:`~depthlens.contest.cv.with_qvalues`)."""
    X, families, _ = cv.clean_features(features)
    parts = []
    for name in names:
        rows = cv.contest_target(X, families, targets[name].to_numpy(), features["layer"].to_numpy(),
                                 CONTEST_METRIC[name], folds=5, n_boot=n_boot, n_perm=n_perm, seed=seed,
                                 tag=(7, tuple(CONTEST_METRIC).index(name)))
        rows.insert(0, "target", name)
        parts.append(rows)
    return cv.with_qvalues(pd.concat(parts, ignore_index=True))


def contest_planted(statistic: str, effect: bool) -> tuple[float, float]:
    """The ``(resolvent, criticality)`` weights of :func:`contest_world` in the planted world of
    a contest statistic's scenario: R required for persistence and routing (1) or adding nothing
    (0), criticality predicted by P at Spearman 0.4 or by nothing; the other target's weight is
    the seed's world (R required, nothing predicts criticality)."""
    if statistic == "contest_R_required":
        return (1.0 if effect else 0.0), 0.0
    if statistic == "contest_criticality_best_family":
        return 1.0, (0.0 if effect else criticality_weight())
    raise ValueError(f"no planted contest world for {statistic!r}")


#: The sampling model of the contest rows the claims read: per kind of row, the means and
#: standard deviations of (value, lower end, upper end) of the row over draws of
#: :func:`contest_world` and the correlations (value–lower, value–upper, lower–upper), at 12 and
#: at 30 layers. The value is the score of a single family or the ``delta`` of ``all-R``, the ends
#: its layer-bootstrap interval's. Kinds: ``quiet`` (a family that does not predict criticality),
#: ``predictive`` (P at population Spearman 0.4), ``persistence``/``routing`` with R ``required``
#: (resolvent 1) or ``null`` (R adds nothing). Measured with the stage's code (:func:`real_contest`,
#: 200 bootstrap resamples and 200 permutations; the default preset's 1000 give the same intervals
#: up to resampling noise) on 30 draws per world and size; ``tests/report/test_calibration.py``
#: checks them against fresh draws.
_CONTEST_ROWS: dict[str, dict[int, tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]]] = {
    "quiet": {12: ((-0.123, -0.469, 0.198), (0.166, 0.096, 0.089), (0.76, 0.72, 0.57)),
              30: ((-0.072, -0.337, 0.133), (0.099, 0.06, 0.052), (0.67, 0.7, 0.62))},
    "predictive": {12: ((0.288, -0.075, 0.479), (0.107, 0.17, 0.079), (0.87, 0.7, 0.59)),
                   30: ((0.356, 0.146, 0.457), (0.063, 0.092, 0.049), (0.91, 0.84, 0.83))},
    "persistence_required": {12: ((0.271, 0.072, 0.543), (0.09, 0.066, 0.107), (0.74, 0.76, 0.43)),
                             30: ((0.267, 0.172, 0.419), (0.058, 0.045, 0.073), (0.9, 0.92, 0.85))},
    "persistence_null": {12: ((-0.018, -0.139, 0.081), (0.026, 0.04, 0.043), (0.37, 0.17, -0.08)),
                         30: ((-0.007, -0.054, 0.028), (0.008, 0.015, 0.013), (0.79, 0.44, 0.29))},
    "routing_required": {12: ((0.112, -0.085, 0.297), (0.102, 0.058, 0.111), (0.47, 0.89, 0.32)),
                         30: ((0.137, 0.019, 0.288), (0.06, 0.039, 0.09), (0.85, 0.91, 0.79))},
    "routing_null": {12: ((-0.025, -0.157, 0.117), (0.051, 0.046, 0.057), (0.47, 0.48, 0.24)),
                     30: ((-0.012, -0.089, 0.053), (0.02, 0.022, 0.026), (0.58, 0.64, 0.48))},
}


def contest_row_model(kind: str, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means (3), standard deviations (3) and correlation matrix (3 × 3) of a kind of contest
    row (:data:`_CONTEST_ROWS`) at ``layers`` layers: means linear and standard deviations
    log-linear in log L through the two measured sizes (and beyond them), the correlation
    matrix the measured one of the nearer size in between (a mixture of the two: still a
    correlation matrix), the nearer one's beyond."""
    small, large = _CONTEST_ROWS[kind][12], _CONTEST_ROWS[kind][30]
    t = math.log(max(layers, 1) / 12.0) / math.log(30.0 / 12.0)
    mean = np.asarray(small[0]) + t * (np.asarray(large[0]) - np.asarray(small[0]))
    sd = np.asarray(small[1]) * (np.asarray(large[1]) / np.asarray(small[1])) ** t

    def corr(r: tuple[float, ...]) -> np.ndarray:
        return np.array([[1.0, r[0], r[1]], [r[0], 1.0, r[2]], [r[1], r[2], 1.0]])

    w = min(max(t, 0.0), 1.0)
    return mean, sd, (1.0 - w) * corr(small[2]) + w * corr(large[2])


def _contest_rows(rng: np.random.Generator, kinds: Sequence[str], null: str, layers: int, n_perm: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(value, lower end, upper end) of one row of each kind (n × 3) and its permutation
    p-value: ``(1 + B)/(1 + n_perm)`` with B ~ Binomial(n_perm, 1 − Φ((value − m₀)/s₀)), the
    value's mean and standard deviation m₀, s₀ under the kind ``null`` (a row with nothing to
    find gets a uniform p)."""
    out = np.empty((len(kinds), 3))
    for i, kind in enumerate(kinds):
        mean, sd, corr = contest_row_model(kind, layers)
        out[i] = mean + sd * (np.linalg.cholesky(corr) @ rng.standard_normal(3))
    m0, s0 = (v[0] for v in contest_row_model(null, layers)[:2])
    p = (1.0 + rng.binomial(n_perm, ndtr(-(out[:, 0] - m0) / s0))) / (1.0 + n_perm)
    return out, p


def _contest_layers_table(layers: int) -> pd.DataFrame:
    """The ``contest_features`` keys of ``layers`` layers (what the layer counter reads)."""
    return pd.DataFrame({"layer": np.repeat(np.arange(layers), CONTEST_HEADS),
                         "head": np.tile(np.arange(CONTEST_HEADS), layers)})


_CONTEST_SIZES = {"layers": 30, "contest_perm": 1000}
_CONTEST_DESIGN = ("rows drawn from a sampling model of the stage's contest code, measured on per-head features "
                   "of this world (report.calibration.contest_world) and checked against that code in the suite "
                   "(it takes seconds a target, too slow for 100 draws a world; bench_calibration.py also "
                   "calibrates with it)")


@scenario("contest_R_required", _CONTEST_SIZES,
          null="R adds nothing given P, E and S (its features overlap E and S but carry nothing of their own "
               "about persistence or routing); " + _CONTEST_DESIGN,
          effect="R carries as much of persistence and of routing identity as P, E and S together; "
                 + _CONTEST_DESIGN)
def _sim_r_required(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    """The ``contest`` table's 27 rows (3 targets × 9 feature sets), BH over all of them as the
    stage does: the ``all-R`` rows of persistence and routing from the sampling model (R
    ``required`` or ``null``), every other row a p-value only (the permutation floor
    1/(1 + n_perm) for a set that predicts its target in the planted world, uniform for the
    criticality rows, which nothing predicts), its other columns NaN (the statistic does not read
    them)."""
    layers, n_perm = n["layers"], n["contest_perm"]
    world = "required" if effect else "null"
    sets = list(cv.feature_sets(cv.FEATURE_FAMILIES))
    rows = []
    for target in CONTEST_METRIC:
        for name in sets:
            row = {"target": target, "features": name, "metric": CONTEST_METRIC[target], "score": math.nan,
                   "score_lo": math.nan, "score_hi": math.nan, "r2": math.nan, "delta": math.nan,
                   "delta_lo": math.nan, "delta_hi": math.nan, "required": False, "n_heads": layers * CONTEST_HEADS,
                   "n_folds": min(5, layers)}
            if target == "criticality":
                row["p"] = (1.0 + rng.integers(0, n_perm + 1)) / (1.0 + n_perm)
            elif name == "all-R":
                (value, lo, hi), p = (v[0] for v in _contest_rows(rng, [f"{target}_{world}"], f"{target}_null",
                                                                   layers, n_perm))
                row.update(delta=value, delta_lo=lo, delta_hi=hi, required=bool(lo > 0), p=p)
            else:
                row["p"] = 1.0 / (1.0 + n_perm)
            rows.append(row)
    return MemoryTables({"contest": cv.with_qvalues(pd.DataFrame(rows)),
                         "contest_features": _contest_layers_table(layers)})


@scenario("contest_criticality_best_family", _CONTEST_SIZES,
          null="P predicts criticality at population Spearman 0.4 (E, S and R predict nothing); " + _CONTEST_DESIGN,
          effect="no family predicts criticality (every score's population value 0); " + _CONTEST_DESIGN)
def _sim_criticality(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    """The four single-family ``criticality`` rows of the ``contest`` table (the statistic's rows;
    BH over them) from the sampling model: every family ``quiet``, or P ``predictive``."""
    layers = n["layers"]
    kinds = ["quiet" if effect or family != "P" else "predictive" for family in cv.FEATURE_FAMILIES]
    values, p = _contest_rows(rng, kinds, "quiet", layers, n["contest_perm"])
    table = pd.DataFrame({"target": "criticality", "features": list(cv.FEATURE_FAMILIES), "metric": "spearman",
                          "score": values[:, 0], "score_lo": values[:, 1], "score_hi": values[:, 2], "r2": math.nan,
                          "p": p, "delta": math.nan, "delta_lo": math.nan, "delta_hi": math.nan, "required": False,
                          "n_heads": layers * CONTEST_HEADS, "n_folds": min(5, layers)})
    return MemoryTables({"contest": cv.with_qvalues(table), "contest_features": _contest_layers_table(layers)})


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
                                            "schur_order": "lapack", "alpha": 1.0, "direction": "backward",
                                            "truncation": cap, "depth": steps - k, "steps": k, "erank": erank}))
    return MemoryTables({"cumulative": pd.concat(curves, ignore_index=True),
                         "funnel_boot": pd.concat(boots, ignore_index=True)})


@scenario("funnel_ratio_trained", _FUNNEL_SIZES,
          null="no funnel: the full-depth erank half the one-step erank (ratio 0.5), chunk spread as measured",
          effect="the seed's funnel, 436 after one step to 7 at full depth (ratio 0.016)")
def _sim_funnel_ratio(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    return _funnel_tables(rng, n, {("trained", 0): (436.0, 7.0 if effect else 218.0)})


@scenario("funnel_init_over_trained", {**_FUNNEL_SIZES, "init_seeds": 3},
          null="step-0 keeps the trained full-depth erank (ratio 1; 20 at full depth for both), each "
               "initialisation off by N(0, 0.1) in log",
          effect="step-0 keeps 10 times the trained full-depth erank (7 trained, 70 at step 0)")
def _sim_funnel_learned(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    trained = 7.0 if effect else 20.0
    ends = {("trained", 0): (436.0, trained)}
    for seed in range(n["init_seeds"]):
        ends[("init", seed)] = (436.0, 10.0 * 7.0 * math.exp(_FUNNEL_SEED_SD * rng.standard_normal()) if effect
                                else trained * math.exp(_FUNNEL_SEED_SD * rng.standard_normal()))
    return _funnel_tables(rng, n, ends)


#: Log-scale spread of the α = 0 full-depth erank between Schur orders (a factor e^{±1}; the
#: expected range over four orders is about 2 nats, a factor 8; SmolLM2's orders spread it from 1.0
#: to 61, twice that in log, where the claim is inconclusive, order-dependent, as the range intends).
_SCHUR_ORDER_SD = 1.0


@scenario("funnel_removed_by_schur_every_order", {"chunks": 32, "operators": 60},
          null="the Schur split removes a fraction U(0.1, 0.3) of the log-erank fall (436 after one step to 7 at "
               "full depth at α = 1)",
          effect="the split removes 70% of it (the seed's 'largely dissolves')")
def _sim_schur(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    """The trained backward rank-truncated (512) ``cumulative`` curves at α = 1 and at α = 0 in
    each Schur order, log-linear from the erank after one step to the full-depth erank over
    ``operators`` sub-layers. Every curve's ends move with the chunks (:data:`_FUNNEL_CHUNK_SD`
    over √chunks, drawn per curve); each order's α = 0 full-depth erank also by
    N(0, :data:`_SCHUR_ORDER_SD`) in log, floored at 1; the one-step erank at α = 0 by N(0, 0.05)
    in log per order."""
    steps, chunks = n["operators"], n["chunks"]
    one_sd, full_sd = (sd / math.sqrt(chunks) for sd in _FUNNEL_CHUNK_SD)
    fall = math.log(436.0 / 7.0)
    removed = 0.7 if effect else rng.uniform(0.1, 0.3)
    k = np.arange(1, steps + 1)

    def curve(alpha: float, order: str, first: float, last: float) -> pd.DataFrame:
        return pd.DataFrame({"checkpoint": "trained", "jacobian_mode": "isolated", "schur_order": order,
                             "alpha": alpha, "direction": "backward", "truncation": 512, "depth": steps - k,
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


@scenario("census_funnel_learned", {"checkpoints": 8, **_FUNNEL_SIZES},
          null="every checkpoint keeps the step-0 full-depth erank (20; ratio 1), chunk spread as measured",
          effect="the full-depth erank falls log-linearly over training to a tenth of step 0's (70 to 7) at the last "
                 "checkpoint")
def _sim_census_funnel(rng: np.random.Generator, n: Mapping[str, int], effect: bool) -> RunTables:
    T = n["checkpoints"]
    weights = rng.multinomial(n["chunks"], np.full(n["chunks"], 1.0 / n["chunks"]), size=n["replicates"])
    full = 70.0 * 0.1 ** (np.arange(T) / max(1, T - 1)) if effect else np.full(T, 20.0)
    ends = np.stack([_funnel_replicates(rng, (436.0, f), weights)[:, 1] for f in full])  # (T, 1 + R) full depth
    # as the census table: the step-0 checkpoint is the reference, replicate k paired with replicate k
    intervals = [percentile_interval(ends[0, 1:] / e[1:]) for e in ends]
    return MemoryTables({"census": pd.DataFrame({
        "series": "s", "order": np.arange(T), "status": "done", "erank_full_depth": ends[:, 0],
        "funnel_step0_over": ends[0, 0] / ends[:, 0], "funnel_step0_over_lo": [lo for lo, _ in intervals],
        "funnel_step0_over_hi": [hi for _, hi in intervals], "coupling_significant": np.nan})})


if __name__ == "__main__":  # python -m depthlens.report.calibration [RUN ...]: refresh the packaged calibrations
    print(f"{refresh_shipped(sys.argv[1:])} calibrations written to {SHIPPED}")
