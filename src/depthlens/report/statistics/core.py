"""The statistics' common ground: the registry's records, the errors a statistic raises, the
sample units, and the helpers every family of statistics reads tables with.

A statistic takes a :class:`~depthlens.runs.tables.RunTables` and returns a float (``inf``
allowed), NaN for "too little data", or ``None`` for "inputs missing"; it only reads tables and
summaries, nothing is recomputed. Each family module (:mod:`.attention`, :mod:`.interventions`,
:mod:`.residual`, :mod:`.census`) keeps its statistics in a registry of its own, made with
:func:`registrar`; the package gathers them into :data:`STATISTICS`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ...runs.tables import RunTables
from ...stats import median_interval, spearman, spearman_interval

#: Sample units a claim may set a minimum for (``min_UNIT``), with the words the report uses.
SAMPLE_UNITS = {
    "chunks": "chunks",
    "null_chunks": "chunks with null samples",
    "matrices": "attention matrices with a simple Perron root",
    "routing_heads": "routing heads",
    "sink_heads": "sink heads",
    "boundaries": "sub-layer boundaries",
    "permutations": "label permutations",
    "layers": "layers (the contest's folds and bootstrap clusters)",
    "checkpoints": "checkpoints",
    "null_samples": "matched null samples per matrix",
    "early_layers": "layers in the first third with trained and step-0 operators",
    "operators": "sub-layer operators",
    "paired_layers": "layers with heads that have both onsets",
    "probe_seqs": "probe sequences (each with its length-matched control)",
    "init_seeds": "step-0 initialisations (--init-seeds) with bootstrapped funnel ends",
    "control_seeds": "control clamps of random dimensions (--control-seeds)",
    "clamped_layers": "layers from the first clamped one to the last",
    "contest_perm": "label permutations of the contest (--contest-perm)",
    "width": "residual width d",
    "replicates": "bootstrap replicates of the funnel (--funnel-boot)",
    "heads_per_layer": "query heads a layer",
}


def option_count(key: str) -> Callable[[RunTables], int | None]:
    """A counter of the run option ``key`` (:func:`config_count`)."""
    return lambda t: config_count(t, key)


@dataclass(frozen=True)
class Estimate:
    """A statistic's value with an interval the verdict reads.

    ``kind`` is ``"confidence"`` (a 95 % interval: the verdict is decisive only when the whole
    interval stays out of the opposite region, so a verdict is a measurement at the run's
    sample size) or ``"range"`` (the least and greatest value over a declared set of protocol
    choices, e.g. every Schur order: decisive only when every choice agrees).
    """

    value: float
    lo: float
    hi: float
    kind: str = "confidence"


class NotTested(Exception):
    """Raised inside a statistic when its inputs are missing (verdict ``not tested``).

    Parameters
    ----------
    message : str
        What is missing.
    needs : str, optional
        The command or flag that would give the inputs (``--null init``), shown as
        ``not tested (needs --null init)``.
    """

    def __init__(self, message: str, needs: str | None = None) -> None:
        super().__init__(message)
        self.needs = needs


#: What writes a missing output, as the flag or command a user would run.
STAGE_NEEDS = {"census": "depthlens census, or --revisions", "lens": "depthlens lens"}


def note_of(name: str, tables: RunTables) -> str | None:
    """The :attr:`Statistic.note` of statistic ``name`` on ``tables`` (None without one, or
    when it cannot be made: a note never takes a verdict down)."""
    note = STATISTICS[name].note
    if note is None:
        return None
    try:
        return note(tables)
    except Exception:  # noqa: BLE001 - NotTested, TooLittleData or an odd table: no note
        return None


def needs_of(name: str, tables: RunTables) -> str | None:
    """What would test statistic ``name`` on a run where it is not tested: the command or flag
    producing its first missing output (``depthlens census, or --revisions``; ``the jacobian
    stage`` for a stage the run skipped), or the ``needs`` of the :class:`NotTested` it raises;
    None when it is tested or nothing more specific is known."""
    from ...schema import producer

    stat = STATISTICS[name]
    for need in stat.needs:
        if not tables.has(need):
            stage = producer(need)
            return STAGE_NEEDS.get(stage or "", f"the {stage} stage" if stage else None)
    try:
        stat.func(tables)
    except NotTested as exc:
        return exc.needs
    except Exception:  # noqa: BLE001 - tested, or failing for another reason: nothing to add
        return None
    return None


class TooLittleData(Exception):
    """Raised inside a statistic when its inputs are present but too few (``inconclusive``)."""


SampleCounter = Callable[[RunTables], "int | None"]


@dataclass(frozen=True)
class Statistic:
    """A named statistic: ``func(tables) -> float | None`` and the outputs it reads.

    ``needs`` names run outputs (``NAME`` for ``tables/NAME.parquet``, ``NAME.json``,
    ``arrays/NAME``); when one is absent the claim is ``not tested`` without calling ``func``.
    ``samples`` maps the sample units of :data:`SAMPLE_UNITS` that the statistic rests on to
    a function counting them in a run (``None`` when the run does not record the count).
    ``note``, when given, says in a sentence what the value rests on where that matters for
    reading it (None when there is nothing to say); it is shown beside the verdict.
    """

    name: str
    func: Callable[[RunTables], float | None]
    needs: tuple[str, ...]
    description: str
    samples: dict[str, SampleCounter] = field(default_factory=dict)
    note: Callable[[RunTables], str | None] | None = None


#: Every statistic of the study by name: the family registries, gathered by the package
#: (:func:`gather`), and any registered from outside it.
STATISTICS: dict[str, Statistic] = {}

Register = Callable[..., Callable[[Callable[[RunTables], Any]], Callable[[RunTables], Any]]]


def registrar(registry: dict[str, Statistic]) -> Register:
    """``register(name, needs, description, samples=None, note=None)``: a decorator that puts a
    statistic function in ``registry`` under ``name``, with the counters of its sample units
    (``samples``, keys from :data:`SAMPLE_UNITS`) and its :attr:`Statistic.note`. A name
    registered twice is an error."""

    def register(name: str, needs: Sequence[str], description: str,
                 samples: Mapping[str, SampleCounter] | None = None,
                 note: Callable[[RunTables], str | None] | None = None):
        unknown = sorted(set(samples or {}) - set(SAMPLE_UNITS))
        if unknown:
            raise ValueError(f"statistic {name!r}: unknown sample unit {unknown[0]!r}")

        def wrap(func: Callable[[RunTables], Any]) -> Callable[[RunTables], Any]:
            if name in registry:
                raise ValueError(f"statistic {name!r} is registered twice")
            registry[name] = Statistic(name, func, tuple(needs), " ".join(description.split()), dict(samples or {}),
                                       note)
            return func

        return wrap

    return register


def gather(*registries: Mapping[str, Statistic]) -> None:
    """Add the family registries to :data:`STATISTICS`, in order; a name two of them (or one
    of them and :data:`STATISTICS`) hold is an error."""
    for registry in registries:
        taken = sorted(set(registry) & set(STATISTICS))
        if taken:
            raise ValueError(f"statistic {taken[0]!r} is registered twice")
        STATISTICS.update(registry)


def compute_statistic(name: str, tables: RunTables) -> tuple[float | None, str]:
    """Value of statistic ``name`` on ``tables`` and a one-line note.

    Returns ``(None, why)`` when the inputs are missing (or the statistic failed on an
    unexpected table, also issued as a ``RuntimeWarning``) and ``(nan, why)`` when they are
    too few; otherwise ``(value, "")``.
    """
    estimate, note = compute_estimate(name, tables)
    return (None if estimate is None else estimate.value), note


def compute_estimate(name: str, tables: RunTables) -> tuple[Estimate | None, str]:
    """:func:`compute_statistic` with the statistic's interval: an :class:`Estimate` (``lo``
    = −inf and ``hi`` = +inf for a statistic that gives none, or when the value is NaN), or
    ``None`` when the inputs are missing, and the note."""
    stat = STATISTICS[name]
    for need in stat.needs:
        if not tables.has(need):
            return None, tables.why_missing(need)
    try:
        value = stat.func(tables)
    except NotTested as exc:
        return None, str(exc)
    except TooLittleData as exc:
        return Estimate(math.nan, -math.inf, math.inf), str(exc)
    except Exception as exc:  # an odd table must not take the report down: say so instead
        warnings.warn(f"statistic {name} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return None, f"{name} could not be computed ({type(exc).__name__}: {exc})"
    if value is None:
        return None, f"the inputs of {name} are missing"
    if not isinstance(value, Estimate):
        value = Estimate(float(value), -math.inf, math.inf, "none")
    value = Estimate(float(value.value), float(value.lo), float(value.hi), value.kind)
    return value, ("too little data" if math.isnan(value.value) else "")


def rerun(output: str) -> str:
    """What would give a run the ``output`` (``NAME.parquet``, ``NAME.json``, ``NAME``) in
    today's form, where the run holds an older one: its stage made again by this depthlens.

    Examples
    --------
    >>> rerun("heads.parquet")
    'the attention stage made again by this depthlens (--overwrite)'
    """
    from ...schema import producer

    stage = producer(output.removesuffix(".parquet"))
    return f"the {stage} stage made again by this depthlens (--overwrite)" if stage else "a run by this depthlens"


def require_columns(df: pd.DataFrame, name: str, *cols: str) -> None:
    """Raise :class:`NotTested` (saying what would give them) when ``df``, the table ``name``,
    lacks any of the columns ``cols``."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise NotTested(f"{name} lacks column {missing[0]!r}", needs=rerun(name))


def numeric(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=float)


def finite_median(values: np.ndarray, what: str) -> float:
    values = values[~np.isnan(values)]
    if values.size == 0:
        raise TooLittleData(f"no finite values of {what}")
    return float(np.median(values))


def select_rows(df: pd.DataFrame, table: str, *, needs: str | None = None, **equal: Any) -> pd.DataFrame:
    """The rows of ``df`` with every column of ``equal`` at its value.

    Raises
    ------
    NotTested
        A column is missing or no row is left, with what would give the rows: ``needs`` when
        given, else :func:`rows_needs`.
    """
    require_columns(df, table, *equal)
    for col, value in equal.items():
        df = df[df[col] == value]
        if df.empty:
            raise NotTested(f"{table} has no rows with {col} = {value}", needs=needs or rows_needs(table, col, value))
    return df


def rows_needs(table: str, column: str, value: Any) -> str:
    """What would give the table ``table`` rows with ``column`` = ``value``: the step-0 null
    (``--null init``), a revision (``--revisions``), every Jacobian mode, else the table's stage
    made again (:func:`rerun`).

    Examples
    --------
    >>> rows_needs("operators.parquet", "checkpoint", "init"), rows_needs("coupling.parquet", "checkpoint", "step1")
    ('--null init', '--revisions with step1')
    """
    if column == "checkpoint" and value != "trained":
        return "--null init" if value == "init" else f"--revisions with {value}"
    if column == "jacobian_mode":
        return "--jacobian-mode all"
    return rerun(table)


def as_count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return None if math.isnan(float(value)) else int(value)


def config_count(t: RunTables, key: str) -> int | None:
    """Option ``key`` of the run's configuration: a run option at the top of the manifest's
    ``config``, a stage option in its stage's section (option names are unique)."""
    config = t.manifest.get("config") or {}
    value = config.get(key)
    if value is None:
        value = next((section[key] for section in config.values() if isinstance(section, dict) and key in section),
                     None)
    return as_count(value)


def run_chunks(t: RunTables) -> int | None:
    """Chunks the run analysed: the token array's first axis in the manifest, else config.chunks."""
    shape = (t.manifest.get("data") or {}).get("shape")
    if isinstance(shape, list) and shape and as_count(shape[0]) is not None:
        return as_count(shape[0])
    return config_count(t, "chunks")


def median_estimate(values: np.ndarray, what: str) -> Estimate:
    """The median of the finite-or-infinite ``values`` (NaN dropped) with its distribution-free
    95 % interval (:func:`~depthlens.stats.median_interval`; unbounded below 6 values)."""
    values = np.asarray(values, dtype=np.float64)
    return Estimate(finite_median(values, what), *median_interval(values))


def spearman_estimate(x: np.ndarray, y: np.ndarray, what: str) -> Estimate:
    """Spearman ρ over the finite pairs with its 95 % interval
    (:func:`~depthlens.stats.spearman_interval`)."""
    ok = np.isfinite(x) & np.isfinite(y)
    rho = finite_spearman(x, y, what)[0]
    return Estimate(rho, *spearman_interval(rho, int(ok.sum())))


def finite_spearman(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, float]:
    """Spearman ρ and its p-value over the pairs where both are finite; too little data below
    3 pairs or when either side is constant."""
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        raise TooLittleData(f"fewer than 3 {what}")
    return spearman(x[ok], y[ok])
