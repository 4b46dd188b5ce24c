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

A claim is accepted at a sample size when the one-sided Clopper–Pearson 95 % upper bound of
each error rate is at most :data:`ACCEPT` (0.05), and its power is stated beside it; :func:`~depthlens.report.claims.evaluate` turns a decisive verdict at a
sample size where its claim is not accepted into "inconclusive: underpowered".
:func:`calibration_at` calibrates a claim at the run's own sample sizes, every one counted by
the statistic's sample counters (:func:`run_sizes`), with :data:`RUN_DRAWS` draws per world; a
run that lacks a size gets no calibration: with none of the unit (no routing heads) a decisive
verdict reads inconclusive, naming it; with no record of the count the report says so. A calibration is a deterministic function of the
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
:func:`~depthlens.interventions.clamp_verdict.chain_verdict`. The contest's code takes seconds a target,
too slow for :data:`RUN_DRAWS` draws a world, so its scenarios draw the contest rows from a
sampling model measured on that code over per-head simulations of the same worlds
(:func:`~depthlens.report.worlds_attention.contest_world`,
:func:`~depthlens.report.worlds_attention.real_contest`); the suite checks the model against the code.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cache import cache_root
from ..errors import InputError
from ..runs.atomic import write_json
from ..runs.directory import not_a_run
from ..stats import proportion_interval
from .claims import Claim, judge
from . import worlds_attention, worlds_residual
from .statistics import STATISTICS
from .worlds import MemoryTables, Scenario
from ..runs.tables import RunTables

__all__ = ["ACCEPT", "DECIDING", "RUN_DRAWS", "SCENARIOS", "SHIPPED", "STRENGTHS", "MemoryTables", "Scenario", "calibrate",
           "calibration_at", "calibration_key", "calibration_points", "calibration_table", "code_fingerprint",
           "error_upper", "refresh_shipped", "run_sizes", "uncounted"]

#: Largest acceptable P(supported | null) and P(falsified | effect).
ACCEPT = 0.05
#: Draws per world when a run's report calibrates its claims: with 200, up to 4 errors (2 %)
#: keep the Clopper–Pearson upper bound below :data:`ACCEPT`.
RUN_DRAWS = 200
#: The modules (paths under the package) whose code decides a calibration's numbers.
DECIDING = ("report/calibration.py", "report/worlds.py", "report/worlds_attention.py", "report/worlds_residual.py",
            "report/statistics/__init__.py", "report/statistics/core.py", "report/statistics/attention.py",
            "report/statistics/interventions.py", "report/statistics/residual.py", "report/statistics/coupling.py",
            "report/statistics/census.py",
            "report/claims.py", "runs/tables.py", "stats.py",
            "report/onsets.py", "contest/cv.py", "interventions/clamp.py", "interventions/clamp_verdict.py",
            "report/measured_nulls.py", "report/measured_nulls.json")
#: The packaged calibrations: ``{"code": fingerprint, "entries": {key: {"claim", "sizes", "draws", "result"}}}``.
SHIPPED = Path(__file__).with_name("calibrations.json")


#: Every statistic's planted worlds (:mod:`~depthlens.report.worlds_attention`,
#: :mod:`~depthlens.report.worlds_residual`).
SCENARIOS: dict[str, Scenario] = {**worlds_attention.SCENARIOS, **worlds_residual.SCENARIOS}


# ----------------------------------------------------------------------------- calibration
def calibrate(claim: Claim, sizes: Mapping[str, int] | None = None, draws: int = 1000, seed: int = 0, *,
              intervals: bool = True) -> dict[str, Any] | None:
    """Error rates of ``claim`` at ``sizes`` (the scenario's defaults for any size not given).

    Each of the ``draws`` draws per world uses its own stream ``SeedSequence([seed, world,
    draw])``, so the result is the same on every machine (``intervals=False``: the verdicts of
    the value alone, the point rule). Returns None when the claim's
    statistic has no scenario; else a dict with ``sizes``, ``draws``, ``p_supported_null``,
    ``p_falsified_null``, ``p_supported_effect`` (the power), ``p_falsified_effect``, the
    one-sided 95 % upper bounds ``p_supported_null_upper`` and ``p_falsified_effect_upper``
    (:func:`error_upper`), ``accepted`` (both bounds ≤ :data:`ACCEPT`), ``null`` and
    ``effect`` (what was planted).
    """
    found = SCENARIOS.get(claim.statistic)
    if found is None:
        return None
    full = {**found.default, **{k: int(v) for k, v in (sizes or {}).items() if k in found.default}}
    rates: dict[str, float] = {}
    for world, planted in ((0, 0.0), (1, 1.0)):
        verdicts = [judge(claim, found.simulate(np.random.default_rng(np.random.SeedSequence([seed, world, i])),
                                                full, planted), intervals=intervals).verdict for i in range(draws)]
        name = "effect" if planted else "null"
        rates[f"p_supported_{name}"] = verdicts.count("supported") / draws
        rates[f"p_falsified_{name}"] = verdicts.count("falsified") / draws
    upper = {f"{rate}_upper": error_upper(round(rates[rate] * draws), draws)
             for rate in ("p_supported_null", "p_falsified_effect")}
    return {"sizes": full, "draws": draws, **rates, **upper,
            "accepted": all(u <= ACCEPT for u in upper.values()), "null": found.null, "effect": found.effect}


#: The effect strengths of an operating characteristic: the null world (0), the effect world
#: (1, the seed's effect) and twice it, with the threshold somewhere in between.
STRENGTHS = (0.0, 0.25, 0.375, 0.5, 0.625, 0.75, 1.0, 1.5, 2.0)


def operating_characteristic(claim: Claim, strengths: Sequence[float] = STRENGTHS, draws: int = 400, seed: int = 0,
                             sizes: Mapping[str, int] | None = None) -> pd.DataFrame | None:
    """P(supported) and P(falsified) of ``claim`` over a grid of planted effect strengths.

    At each ``strength`` (:class:`~depthlens.report.worlds.Scenario`: 0 the null world, 1 the
    effect world) ``draws`` worlds are drawn at ``sizes`` (the scenario's defaults where not
    given), each with the stream ``SeedSequence([seed, 2, k, draw])`` (``k`` the strength's
    index), and judged as a run would be. Returns None when the claim has no scenario.

    Returns
    -------
    DataFrame
        One row per strength: ``strength``; ``value`` (the median of the statistic's value over
        the draws that have one, the typical value a run at these sizes sees) with ``value_lo``
        and ``value_hi`` (its 5th and 95th percentiles); ``p_supported``, ``p_falsified``,
        ``p_inconclusive``, each a fraction of ``draws``, with the two-sided 95 % Clopper–Pearson
        interval of the first two (``*_lo``, ``*_hi``); ``p_supported_marginal`` and
        ``p_falsified_marginal`` (the part of each decisive verdict that is
        :func:`~depthlens.report.claims.marginal`: on the wrong side of the threshold, a marginal
        verdict's error rate); ``draws``.
    """
    found = SCENARIOS.get(claim.statistic)
    if found is None:
        return None
    full = {**found.default, **{k: int(v) for k, v in (sizes or {}).items() if k in found.default}}
    rows = []
    for k, strength in enumerate(strengths):
        judged = [judge(claim, found.simulate(np.random.default_rng(np.random.SeedSequence([seed, 2, k, i])), full,
                                              float(strength))) for i in range(draws)]
        values = np.array([j.estimate.value for j in judged if j.estimate is not None], dtype=float)
        values = values[np.isfinite(values)]
        verdicts = [j.verdict for j in judged]
        row: dict[str, float] = {"strength": float(strength)}
        row["value"], row["value_lo"], row["value_hi"] = (
            (float(np.median(values)), *np.percentile(values, [5, 95]).tolist()) if len(values) else (np.nan,) * 3)
        for name in ("supported", "falsified"):
            count = verdicts.count(name)
            row[f"p_{name}"] = count / draws
            row[f"p_{name}_lo"], row[f"p_{name}_hi"] = proportion_interval(count, draws)
            row[f"p_{name}_marginal"] = sum(j.marginal and j.verdict == name for j in judged) / draws
        row["p_inconclusive"] = verdicts.count("inconclusive") / draws
        row["draws"] = draws
        rows.append(row)
    return pd.DataFrame(rows)


def error_upper(errors: int, draws: int) -> float:
    """The one-sided Clopper–Pearson 95 % upper bound of an error rate seen ``errors`` times in
    ``draws`` draws: a claim is accepted when this bound, not the raw fraction, is at most
    :data:`ACCEPT`.

    Examples
    --------
    >>> round(error_upper(0, 100), 4), round(error_upper(8, 400), 4)
    (0.0295, 0.0358)
    """
    return proportion_interval(errors, draws, level=0.90)[1]


def run_sizes(claim: Claim, tables: RunTables) -> dict[str, int | None]:
    """The run's count of every size the claim's scenario takes, by the statistic's own
    counters (:attr:`~depthlens.report.statistics.Statistic.samples`); None for a size the run
    does not record (never the scenario's default). Empty for a claim without a scenario."""
    found = SCENARIOS.get(claim.statistic)
    counters = STATISTICS[claim.statistic].samples
    out: dict[str, int | None] = {}
    for unit in (found.default if found else {}):
        try:
            n = counters[unit](tables) if unit in counters else None
        except Exception:  # noqa: BLE001 - an odd table: the count is unknown
            n = None
        out[unit] = None if n is None else int(n)
    return out


def calibration_at(claim: Claim, tables: RunTables, draws: int = RUN_DRAWS,
                   sizes: dict[str, int | None] | None = None) -> dict[str, Any] | None:
    """:func:`calibrate` at the run's own sample sizes (:func:`run_sizes`): from the packaged
    or the user's stored calibrations when they hold its key (:func:`calibration_key`), else
    computed and stored in the user cache; memoised per process. None for a claim without a
    scenario, and for a run that lacks a size (a count of 0, or none recorded:
    :func:`uncounted` says which), where no calibration is at the run's sample. ``sizes`` are
    :func:`run_sizes` when the caller has them."""
    if claim.statistic not in SCENARIOS:
        return None
    sizes = run_sizes(claim, tables) if sizes is None else sizes
    if any(not n for n in sizes.values()):
        return None
    return dict(_memo(claim, tuple(sorted(sizes.items())), draws))


def uncounted(sizes: dict[str, int | None]) -> dict[str, int | None]:
    """The sizes of :func:`run_sizes` that the run lacks: a count of 0 (e.g. no routing heads)
    or None (not recorded), by unit."""
    return {unit: n for unit, n in sizes.items() if not n}


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
    """Rewrite :data:`SHIPPED` for the current code: every entry it holds at a full count of
    its scenario's sizes recomputed, plus every claim of ``claims`` (default: the packaged
    claims) at each run's sample sizes (run directories, e.g. ``depthlens run --preset quick``
    on the embedded model) where the run has every size, and each claim no entry covers at its
    scenario's defaults. Returns the number of entries written.

    Raises
    ------
    InputError
        A path of ``runs`` that is not a run directory (before anything is computed or written).
    """
    from .claims import load_claims

    for run in runs:
        why = not_a_run(run) if Path(run).is_dir() else "there is no folder there"
        if why is not None:
            raise InputError(f"{run} is not a run directory ({why}); pass folders written by depthlens run, "
                             "e.g. depthlens run --preset quick --out RUN.")
    claims = list(claims) if claims is not None else load_claims()
    by_id = {c.id: c for c in claims}
    wanted: dict[str, tuple[Claim, dict[str, int], int]] = {}
    for old in _shipped_entries().values():
        if old.get("claim") in by_id:
            claim, sizes = by_id[old["claim"]], {k: int(v) for k, v in old["sizes"].items()}
            found = SCENARIOS.get(claim.statistic)
            if found is not None and set(sizes) == set(found.default):  # a run's full count, as run_sizes gives
                wanted[calibration_key(claim, sizes, old["draws"])] = (claim, sizes, int(old["draws"]))
    for run in runs:
        tables = RunTables(Path(run))
        for claim in claims:
            sizes = run_sizes(claim, tables)
            if sizes and all(sizes.values()):
                counted = {unit: int(n) for unit, n in sizes.items() if n}
                wanted[calibration_key(claim, counted, RUN_DRAWS)] = (claim, counted, RUN_DRAWS)
    covered = {claim.id for claim, _, _ in wanted.values()}
    for claim in claims:  # a claim no run sizes (the census claims): at its scenario's defaults
        if claim.statistic in SCENARIOS and claim.id not in covered:
            sizes = dict(SCENARIOS[claim.statistic].default)
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


if __name__ == "__main__":  # python -m depthlens.report.calibration [RUN ...]: refresh the packaged calibrations
    try:
        print(f"{refresh_shipped(sys.argv[1:])} calibrations written to {SHIPPED}")
    except InputError as exc:
        sys.exit(f"usage: python -m depthlens.report.calibration [RUN ...]: {exc}")
