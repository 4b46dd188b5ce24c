"""The study's statistics: named functions of a run's outputs that claims test.

Statistic functions take a :class:`~depthlens.runs.tables.RunTables` and return a float
(``inf`` allowed), NaN for "too little data", or ``None`` for "inputs missing". They only read
tables and summaries; nothing is recomputed. Each is registered in :data:`STATISTICS` with the
outputs it needs and the counters of the samples it rests on (:data:`SAMPLE_UNITS`); the
verdict engine (:mod:`depthlens.report.claims`) turns their values into verdicts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..stats import (head_rank_tests, induction_ratio_replicates, median_interval, percentile_interval,
                     proportion_interval, sign_test, spearman, spearman_interval, trend_interval)
from ..runs.tables import RunTables

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
}


# ---------------------------------------------------------------------------------------
# statistics registry
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
    """Raised inside a statistic when its inputs are missing (verdict ``not tested``)."""


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
    """

    name: str
    func: Callable[[RunTables], float | None]
    needs: tuple[str, ...]
    description: str
    samples: dict[str, SampleCounter] = field(default_factory=dict)


STATISTICS: dict[str, Statistic] = {}


def register(name: str, needs: Sequence[str], description: str, samples: dict[str, SampleCounter] | None = None):
    """Decorator adding a statistic function to :data:`STATISTICS` under ``name``, with the
    counters of its sample units (``samples``, keys from :data:`SAMPLE_UNITS`)."""
    unknown = sorted(set(samples or {}) - set(SAMPLE_UNITS))
    if unknown:
        raise ValueError(f"statistic {name!r}: unknown sample unit {unknown[0]!r}")

    def wrap(func: Callable[[RunTables], float | None]) -> Callable[[RunTables], float | None]:
        if name in STATISTICS:
            raise ValueError(f"statistic {name!r} is registered twice")
        STATISTICS[name] = Statistic(name, func, tuple(needs), " ".join(description.split()), dict(samples or {}))
        return func

    return wrap


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


def _columns(df: pd.DataFrame, name: str, *cols: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise NotTested(f"{name} lacks column {missing[0]!r}")


def _numeric(s: pd.Series) -> np.ndarray:
    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=float)


def _median(values: np.ndarray, what: str) -> float:
    values = values[~np.isnan(values)]
    if values.size == 0:
        raise TooLittleData(f"no finite values of {what}")
    return float(np.median(values))


def _select(df: pd.DataFrame, table: str, **equal: Any) -> pd.DataFrame:
    _columns(df, table, *equal)
    for col, value in equal.items():
        df = df[df[col] == value]
        if df.empty:
            raise NotTested(f"{table} has no rows with {col} = {value}")
    return df


# -- sample counters (minimum samples, see the module docstring) ----------------------
def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    return None if math.isnan(float(value)) else int(value)


def _config_count(t: RunTables, key: str) -> int | None:
    """Option ``key`` of the run's configuration: a run option at the top of the manifest's
    ``config``, a stage option in its stage's section (option names are unique)."""
    config = t.manifest.get("config") or {}
    value = config.get(key)
    if value is None:
        value = next((section[key] for section in config.values() if isinstance(section, dict) and key in section),
                     None)
    return _int(value)


def _run_chunks(t: RunTables) -> int | None:
    """Chunks the run analysed: the token array's first axis in the manifest, else config.chunks."""
    shape = (t.manifest.get("data") or {}).get("shape")
    if isinstance(shape, list) and shape and _int(shape[0]) is not None:
        return _int(shape[0])
    return _config_count(t, "chunks")


def _distinct_depth_chunks(source: str) -> SampleCounter:
    """Chunks of the mean-head depth products with ``source`` rows at the final depth."""
    def count(t: RunTables) -> int | None:
        df = t.trained("depth")
        if df is None or not {"operator", "source", "depth", "chunk"} <= set(df.columns):
            return None
        df = df[(df["operator"] == "mean") & (df["source"] == source)]
        return int(df.loc[df["depth"] == df["depth"].max(), "chunk"].nunique()) if len(df) else 0

    return count


def _role_heads(role: str, finite: str | None = None) -> SampleCounter:
    """Heads of ``role`` (with a finite ``finite`` column when given) in heads.parquet, else
    the role counts of attention.json."""
    def count(t: RunTables) -> int | None:
        heads = t.trained("heads")
        if heads is not None and "role" in heads.columns:
            sel = heads[heads["role"] == role]
            if finite is None:
                return len(sel)
            if finite in sel.columns:
                return int(np.isfinite(_numeric(sel[finite])).sum())
            return None
        roles = (t.json("attention") or {}).get("roles")
        return _int(roles.get(role, 0)) if finite is None and isinstance(roles, dict) else None

    return count


def _null_chunks_of(role: str) -> SampleCounter:
    """Chunks with null samples behind each head's Δ_TR and sign test: the least
    ``n_null_chunks`` over the heads of ``role``; else the chunks with a finite per-chunk
    ``delta_TR1``; else min(chunks, null_chunks) of the manifest."""
    def count(t: RunTables) -> int | None:
        heads = t.trained("heads")
        if heads is not None and {"role", "n_null_chunks"} <= set(heads.columns):
            n = _numeric(heads.loc[heads["role"] == role, "n_null_chunks"])
            n = n[~np.isnan(n)]
            if n.size:
                return int(n.min())
        chunks = t.trained("head_chunks")
        if chunks is not None and {"chunk", "delta_TR1"} <= set(chunks.columns):
            return int(chunks.loc[np.isfinite(_numeric(chunks["delta_TR1"])), "chunk"].nunique())
        known = [n for n in (_run_chunks(t), _config_count(t, "null_chunks")) if n is not None]
        return min(known) if known else None

    return count


def _simple_matrices(t: RunTables) -> int | None:
    df = t.trained("head_chunks")
    if df is None or "perron_simple" not in df.columns:
        return None
    return int((_numeric(df["perron_simple"]) == 1.0).sum())


def _clamp_chunks(t: RunTables) -> int | None:
    chain = (t.json("interventions") or {}).get("clamp_chain")
    n = _int(chain.get("n_chunks")) if isinstance(chain, dict) else None
    return n if n is not None else _run_chunks(t)


def _contest_layers(t: RunTables) -> int | None:
    """Layers the contest's heads come from (its cross-validation groups and bootstrap clusters)."""
    df = t.table("contest_features")
    return None if df is None or "layer" not in df.columns else int(df["layer"].nunique())


def _boundaries(*checkpoints: str) -> SampleCounter:
    """Sub-layer boundaries with a coupling test, the least over ``checkpoints``."""
    def count(t: RunTables) -> int | None:
        df = t.table("coupling")
        if df is None or "checkpoint" not in df.columns:
            return None
        return min(int((df["checkpoint"] == c).sum()) for c in checkpoints)

    return count


def _permutations(t: RunTables) -> int | None:
    topo = t.json("topology") or {}
    n = _int(topo.get("n_perm", (topo.get("options") or {}).get("n_perm")))
    return n if n is not None else _config_count(t, "n_perm")


_NULL_HEADS = {"routing": _null_chunks_of("routing"), "sink": _null_chunks_of("sink")}
_JACOBIAN_CHUNKS = {"chunks": _run_chunks}  # mean Jacobians average over every chunk of the run


# -- Part A ------------------------------------------------------------------------------
@register("kreiss_A_pinned_fraction", ["head_chunks"],
          "Fraction of attention matrices with a simple Perron root whose K(A) reaches √n "
          "(column kreiss_A_ok of head_chunks).", samples={"matrices": _simple_matrices})
def _kreiss_pinned(t: RunTables) -> float:
    df = t.trained("head_chunks")
    _columns(df, "head_chunks", "perron_simple", "kreiss_A_ok")
    simple = df[_numeric(df["perron_simple"]) == 1.0]
    if simple.empty:
        raise TooLittleData("no matrix with a simple Perron root")
    return float(np.mean(_numeric(simple["kreiss_A_ok"]) == 1.0))


def _final_gaps(t: RunTables, which: str = "gap_e1") -> pd.DataFrame:
    """Final-depth rows of the mean-head depth products (both sources)."""
    df = _select(t.trained("depth"), "depth.parquet", operator="mean")
    _columns(df, "depth.parquet", "source", "chunk", "sample", "depth", which)
    return df[df["depth"] == df["depth"].max()]


def _gap(source: str, which: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        final = _final_gaps(t, which)
        final = final[final["source"] == source]
        if final.empty:
            raise NotTested(f"depth.parquet has no {source} rows")
        return _median(_numeric(final[which]), f"{which} ({source}) at the final depth")

    return stat


for _source in ("model", "null"):
    for _which in ("gap_e1", "gap_e2"):
        register(f"eig_{_which}_{_source}_final", ["depth"],
                 f"Median over chunks{' and null samples' if _source == 'null' else ''} of {_which} = "
                 f"log10(‖D‖/{_which[-2:].upper()}) of the mean-head operator at the final depth, "
                 f"source = {_source} (descriptive: the absolute gap).",
                 samples={"null_chunks" if _source == "null" else "chunks": _distinct_depth_chunks(_source)},
                 )(_gap(_source, _which))


def gap_contrasts(depth: pd.DataFrame, which: str = "gap_e1") -> np.ndarray:
    """Per chunk with null samples: the model's final-depth gap minus the mean of its matched
    nulls' gaps (mean-head operator), in orders of magnitude. ``+inf`` when the model's
    prediction error is exactly zero (E = 0) and the nulls' are not."""
    model = depth[depth["source"] == "model"].groupby("chunk")[which].first()
    null = depth[depth["source"] == "null"].groupby("chunk")[which].mean()
    both = model.index.intersection(null.index)
    return (model.loc[both] - null.loc[both]).to_numpy(dtype=float)


def median_estimate(values: np.ndarray, what: str) -> Estimate:
    """The median of the finite-or-infinite ``values`` (NaN dropped) with its distribution-free
    95 % interval (:func:`~depthlens.stats.median_interval`; unbounded below 6 values)."""
    values = np.asarray(values, dtype=np.float64)
    return Estimate(_median(values, what), *median_interval(values))


def _contrast(which: str) -> Callable[[RunTables], Estimate]:
    def stat(t: RunTables) -> Estimate:
        final = _final_gaps(t, which)
        if not (final["source"] == "null").any():
            raise NotTested("depth.parquet has no null samples to contrast with (--null-chunks 0?)")
        return median_estimate(gap_contrasts(final, which), f"{which} contrasts")

    return stat


for _which in ("gap_e1", "gap_e2"):
    register(f"eig_{_which}_contrast", ["depth"],
             f"Median over chunks with nulls of the paired contrast {_which}(model) − mean over the chunk's "
             f"null samples of {_which}(null) at the final depth (mean-head operator): how many more "
             "orders of magnitude the model's eigenvalue prediction errs than its matched nulls'.",
             samples={"null_chunks": _distinct_depth_chunks("null")})(_contrast(_which))


@register("eig_gap_e1_null_chunks", ["depth"],
          "Median over chunks with nulls of the chunk's mean null gap_e1 at the final depth (mean-head operator), "
          "with its distribution-free 95% interval over chunks: whether the eigenvalue-prediction error is absent "
          "in the matched nulls (near 0).", samples={"null_chunks": _distinct_depth_chunks("null")})
def _null_gap(t: RunTables) -> Estimate:
    final = _final_gaps(t)
    null = final[final["source"] == "null"]
    if null.empty:
        raise NotTested("depth.parquet has no null samples (--null-chunks 0?)")
    return median_estimate(null.groupby("chunk")["gap_e1"].mean().to_numpy(dtype=float), "null gaps")


@register("eig_gap_contrast_sign_p", ["depth"],
          "Two-sided exact sign-test p-value of the paired gap_e1 contrasts (model minus matched "
          "nulls, per chunk) against zero.", samples={"null_chunks": _distinct_depth_chunks("null")})
def _contrast_p(t: RunTables) -> float:
    contrasts = gap_contrasts(_final_gaps(t))
    if not np.isfinite(contrasts).any() and not np.isinf(contrasts).any():
        raise TooLittleData("no chunk with both model and null gaps")
    return sign_test(contrasts)


def _routing_median(column: str) -> Callable[[RunTables], Estimate]:
    def stat(t: RunTables) -> Estimate:
        df = t.trained("heads")
        _columns(df, "heads.parquet", "role", column)
        routing = df[df["role"] == "routing"]
        if routing.empty:
            raise TooLittleData("no routing heads")
        return median_estimate(_numeric(routing[column]), f"{column} over routing heads")

    return stat


def _induction_ratio(column: str, base: str) -> Callable[[RunTables], Estimate]:
    """The median over routing heads of ``column`` (heads.parquet) with its 95 % percentile
    interval over bootstrap replicates that redraw the probe sequences and the heads
    (:func:`~depthlens.stats.induction_ratio_replicates` of induction_seqs.parquet);
    a run without that table gets the distribution-free interval over heads alone."""
    median = _routing_median(column)

    def stat(t: RunTables) -> Estimate:
        estimate = median(t)
        seqs = t.trained("induction_seqs")
        if seqs is None:
            return estimate
        _columns(seqs, "induction_seqs.parquet", "layer", "head", "seq", "delta_TR1_second_copy", base)
        if seqs.empty:
            return estimate
        return Estimate(estimate.value, *percentile_interval(induction_ratio_replicates(seqs, base)))

    return stat


def _probe_seqs(t: RunTables) -> int | None:
    """Probe sequences behind the induction ratios: the distinct ``seq`` of induction_seqs."""
    seqs = t.trained("induction_seqs")
    return None if seqs is None or "seq" not in seqs.columns else int(seqs["seq"].nunique())


register("induction_ratio_median", ["heads"],
         "Median over routing heads of induction_ratio: Δ_TR of the whole [BOS, r, r] probe over Δ_TR "
         "of its first-copy block (confounded by length: descriptive), with its 95% interval over probe "
         "sequences and heads redrawn.",
         samples={"routing_heads": _role_heads("routing", "induction_ratio"), "probe_seqs": _probe_seqs})(
    _induction_ratio("induction_ratio", "delta_TR1_first_copy"))
register("induction_ratio_control_median", ["heads"],
         "Median over routing heads of induction_ratio_control: Δ_TR of the [BOS, r, r] probe over Δ_TR of "
         "the length-matched control [BOS, r, r′] (a fresh random r′: no repeat, no induction), with its 95% "
         "interval over bootstrap replicates that redraw the probe sequences (the same for every head) and "
         "the heads.",
         samples={"routing_heads": _role_heads("routing", "induction_ratio_control"), "probe_seqs": _probe_seqs})(
    _induction_ratio("induction_ratio_control", "delta_TR1_control"))


def _summary_value(key: str, what: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        summary = t.json("attention")
        if key not in summary:
            raise NotTested(f"attention.json lacks {key!r}")
        value = summary[key]
        if value is None:
            raise TooLittleData(f"no {what}")
        return float(value)

    return stat


register("induction_excluded_control", ["attention.json"],
         "Routing heads left out of induction_ratio_control because their control excess Δ_TR is not above "
         "1e-8 nats (zero up to rounding) "
         "(attention.json: induction_excluded_control).")(_summary_value("induction_excluded_control", "count"))
register("induction_excluded_first", ["attention.json"],
         "Routing heads left out of induction_ratio because their first-copy excess Δ_TR is not above 1e-8 nats "
         "(attention.json: induction_excluded_first).")(_summary_value("induction_excluded_first", "count"))
register("routing_positive_significant_fraction", ["attention.json"],
         "Fraction of routing heads with Δ_TR > 0 and BH q ≤ q_level "
         "(attention.json: routing_positive_significant).",
         samples={"routing_heads": _role_heads("routing"), "null_chunks": _NULL_HEADS["routing"]})(
    _summary_value("routing_positive_significant", "routing heads"))
register("sink_negative_fraction", ["attention.json"],
         "Fraction of sink heads with Δ_TR < 0, sign alone (attention.json: sink_negative; descriptive).",
         samples={"sink_heads": _role_heads("sink"), "null_chunks": _NULL_HEADS["sink"]})(
    _summary_value("sink_negative", "sink heads"))
register("sink_negative_significant_fraction", ["attention.json"],
         "Fraction of sink heads with Δ_TR < 0 and BH q ≤ q_level (attention.json: sink_negative_significant).",
         samples={"sink_heads": _role_heads("sink"), "null_chunks": _NULL_HEADS["sink"]})(
    _summary_value("sink_negative_significant", "sink heads"))


def role_rank_tests(t: RunTables, role: str, rank: str = "null_rank_TR1", first_chunks: int | None = None
                    ) -> pd.DataFrame:
    """The pooled rank test of every ``role`` head against its matched nulls
    (:func:`~depthlens.stats.head_rank_tests` over the chunks with nulls, optionally the first
    ``first_chunks`` of them), with BH q-values within the role family (the heads the claim is
    about, so unrelated heads cannot move them): columns ``layer``, ``head``, ``median``
    (of ``delta_TR1``), ``n``, ``p``, ``q``, ``direction`` (+1 when TR1 ranks above its nulls on
    average, −1 below, 0 level)."""
    chunks, heads = t.trained("head_chunks"), t.trained("heads")
    samples = "null_n" if rank == "null_rank_TR1" else "null_n_half"
    _columns(chunks, "head_chunks.parquet", "layer", "head", "chunk", "delta_TR1", rank, "null_n")
    _columns(heads, "heads.parquet", "layer", "head", "role")
    keys = heads.loc[heads["role"] == role, ["layer", "head"]]
    if keys.empty:
        raise TooLittleData(f"no {role} heads")
    chunks = chunks.merge(keys, on=["layer", "head"])
    chunks = chunks[np.isfinite(_numeric(chunks[rank]))]
    if first_chunks is not None:
        kept = np.sort(chunks["chunk"].unique())[:first_chunks]
        chunks = chunks[chunks["chunk"].isin(kept)]
    if chunks.empty:
        raise NotTested(f"head_chunks.parquet has no {rank} of {role} heads (--null-chunks 0?)")
    chunks = chunks.assign(null_n_half=np.ceil(_numeric(chunks["null_n"]) / 2))
    tests = head_rank_tests(chunks, "delta_TR1", rank, samples)
    centre = chunks.assign(excess=_numeric(chunks[rank]) - _numeric(chunks[samples]) / 2).groupby(
        ["layer", "head"], sort=True)["excess"].sum()
    tests["direction"] = np.sign(centre.to_numpy())
    return tests  # head_rank_tests' q-values: BH over exactly these heads


def _signed_significant(role: str, sign: int, rank: str = "null_rank_TR1", halves: bool = False
                        ) -> Callable[[RunTables], Estimate]:
    """Fraction of ``role`` heads that rank on the side ``sign`` of their matched nulls with BH
    q ≤ q_level within the role (:func:`role_rank_tests`), with its Clopper–Pearson interval
    over heads; ``halves`` uses the first half of the chunks with nulls only."""
    def stat(t: RunTables) -> Estimate:
        first = None
        if halves:
            chunks = t.trained("head_chunks")
            _columns(chunks, "head_chunks.parquet", "chunk", rank)
            first = int(chunks.loc[np.isfinite(_numeric(chunks[rank])), "chunk"].nunique()) // 2
            if first < 1:
                raise TooLittleData("fewer than 2 chunks with nulls to halve")
        tests = role_rank_tests(t, role, rank, first)
        q_level = float((t.json("attention") or {}).get("q_level", 0.05))
        k, n = int(((tests["direction"] == sign) & (tests["q"] <= q_level)).sum()), len(tests)
        return Estimate(k / n, *proportion_interval(k, n))

    return stat


def _null_samples(t: RunTables) -> int | None:
    """Matched null samples per observed matrix (the least ``null_n`` of head_chunks, else the
    run's ``null_samples`` option)."""
    chunks = t.trained("head_chunks")
    if chunks is not None and "null_n" in chunks.columns:
        n = _numeric(chunks["null_n"])
        n = n[np.isfinite(n)]
        if n.size:
            return int(n.min())
    return _config_count(t, "null_samples")


for _role, _sign, _word in (("routing", 1, "above"), ("sink", -1, "below")):
    _units = {f"{_role}_heads": _role_heads(_role), "null_chunks": _NULL_HEADS[_role], "null_samples": _null_samples}
    register(f"{_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction", ["head_chunks", "heads"],
             f"Fraction of {_role} heads whose TR1 ranks {_word} its matched nulls, significant by the pooled rank "
             f"test over the chunks with nulls (sum of the per-chunk ranks against its exact null distribution) "
             f"with BH q ≤ q_level within the {_role} heads; Clopper–Pearson 95% interval over heads.",
             samples=_units)(_signed_significant(_role, _sign))
    register(f"{_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction_half_nulls", ["head_chunks", "heads"],
             f"As {_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction with each rank among the first "
             "⌈S/2⌉ null samples (null_rank_TR1_half).",
             samples=_units)(_signed_significant(_role, _sign, "null_rank_TR1_half"))
    register(f"{_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction_half_chunks", ["head_chunks", "heads"],
             f"As {_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction on the first half of the chunks "
             "with nulls.", samples=_units)(_signed_significant(_role, _sign, halves=True))


@register("routing_reserve_tracks_prev_token", ["heads"],
          "Spearman rank correlation between Δ_TR (delta_TR1) and prev_token_score over routing heads.",
          samples={"routing_heads": _role_heads("routing", "delta_TR1")})
def _tracks_prev(t: RunTables) -> Estimate:
    return spearman_estimate(*_routing_pairs(t), "routing heads with varying Δ_TR and previous-token scores")


@register("routing_reserve_tracks_prev_token_p", ["heads"],
          "Two-sided p-value of that Spearman correlation (descriptive).",
          samples={"routing_heads": _role_heads("routing", "delta_TR1")})
def _tracks_prev_p(t: RunTables) -> float:
    return _finite_spearman(*_routing_pairs(t), "routing heads with varying Δ_TR and previous-token scores")[1]


def _routing_pairs(t: RunTables) -> tuple[np.ndarray, np.ndarray]:
    df = t.trained("heads")
    _columns(df, "heads.parquet", "role", "delta_TR1", "prev_token_score")
    routing = df[df["role"] == "routing"]
    return _numeric(routing["delta_TR1"]), _numeric(routing["prev_token_score"])


def spearman_estimate(x: np.ndarray, y: np.ndarray, what: str) -> Estimate:
    """Spearman ρ over the finite pairs with its 95 % interval
    (:func:`~depthlens.stats.spearman_interval`)."""
    ok = np.isfinite(x) & np.isfinite(y)
    rho = _finite_spearman(x, y, what)[0]
    return Estimate(rho, *spearman_interval(rho, int(ok.sum())))


def _finite_spearman(x: np.ndarray, y: np.ndarray, what: str) -> tuple[float, float]:
    """Spearman ρ and its p-value over the pairs where both are finite; too little data below
    3 pairs or when either side is constant."""
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        raise TooLittleData(f"fewer than 3 {what}")
    return spearman(x[ok], y[ok])


def _chain(t: RunTables) -> dict:
    """``interventions.json['clamp_chain']`` of a run in which the chain was tested."""
    chain = t.json("interventions").get("clamp_chain")
    if not isinstance(chain, dict):
        raise NotTested("interventions.json lacks 'clamp_chain'")
    if chain.get("tested") is False:
        raise NotTested(str(chain.get("reason") or "the clamp chain was not tested"))
    return chain


@register("clamp_chain_n_dims", ["interventions.json"],
          "Number of massive-activation dimensions whose clamp supports the chain (sink mass "
          "falls monotonically in α, predicts the rise in reserve, control inert): "
          "len(interventions.json['clamp_chain']['dims']), 0 when the chain is not supported.",
          samples={"chunks": _clamp_chunks})
def _clamp_chain(t: RunTables) -> float:
    chain = _chain(t)
    if chain.get("supported") is False:
        return 0.0
    dims = chain.get("dims")
    if not isinstance(dims, list):
        raise NotTested("interventions.json lacks 'clamp_chain.dims'")
    return float(len(dims))


def _chain_condition(name: str, what: str) -> None:
    @register(f"clamp_chain_{name}", ["interventions.json"],
              f"1 when the clamp chain's condition '{name}' held ({what}), 0 when it did not: "
              f"interventions.json['clamp_chain']['conditions']['{name}']['held'].")
    def _condition(t: RunTables) -> float:
        held = ((_chain(t).get("conditions") or {}).get(name) or {}).get("held")
        if held is None:
            raise NotTested(f"the clamp chain's condition {name!r} was not evaluated")
        return float(bool(held))


for _name, _what in (("monotone", "sink mass falls monotonically with the dose"),
                     ("predicts", "the drop in sink mass predicts the rise in reserve across heads"),
                     ("control_inert", "the random-dimension control moves neither")):
    _chain_condition(_name, _what)


def _contest_rows(t: RunTables, target: str) -> pd.DataFrame:
    df = t.table("contest")
    _columns(df, "contest.parquet", "target", "features", "score", "q", "required")
    return _select(df, "contest.parquet", target=target)


@register("contest_R_required", ["contest"],
          "Number of the targets depth persistence and routing identity for which the resolvent family R is "
          "required: the contest row `all-R` has `required` True (dropping R lowers the cross-validated score "
          "with the layer-bootstrap interval excluding 0 and the drop significant, BH q ≤ 0.05).", samples={"layers": _contest_layers})
def _contest_r_required(t: RunTables) -> float:
    count = 0
    for target in ("persistence", "routing"):
        rows = _contest_rows(t, target)
        drop = rows[rows["features"] == "all-R"]
        if drop.empty:
            raise NotTested(f"contest.parquet has no all-R row for {target}")
        count += bool(drop["required"].iloc[0])
    return float(count)


@register("contest_criticality_predicted", ["contest"],
          "Number of single-family feature sets (P, E, S, R) that predict ablation criticality: contest rows of "
          "target `criticality` with a positive Spearman score and BH q ≤ 0.05.", samples={"layers": _contest_layers})
def _contest_criticality(t: RunTables) -> float:
    rows = _contest_rows(t, "criticality")
    single = rows[rows["features"].isin(["P", "E", "S", "R"])]
    if single.empty:
        raise NotTested("contest.parquet has no single-family rows for criticality")
    return float(((_numeric(single["score"]) > 0) & (_numeric(single["q"]) <= 0.05)).sum())


@register("contest_criticality_best_family", ["contest"],
          "The best single-family (P, E, S, R) cross-validated Spearman score for ablation criticality, with the "
          "interval [largest lower, largest upper] of the families' layer-bootstrap intervals: no family predicts "
          "criticality only when even the largest upper end is below the pre-registered margin.",
          samples={"layers": _contest_layers})
def _criticality_best(t: RunTables) -> Estimate:
    rows = _contest_rows(t, "criticality")
    _columns(rows, "contest.parquet", "score_lo", "score_hi")
    single = rows[rows["features"].isin(["P", "E", "S", "R"])]
    if single.empty:
        raise NotTested("contest.parquet has no single-family rows for criticality")
    score, lo, hi = (_numeric(single[c]) for c in ("score", "score_lo", "score_hi"))
    if not np.isfinite(score).any():
        raise TooLittleData("no single family has a finite criticality score")
    return Estimate(float(np.nanmax(score)), float(np.nanmax(lo)), float(np.nanmax(hi)))


# -- Part B ------------------------------------------------------------------------------
def _early_operators(t: RunTables, sublayers: tuple[str, ...], checkpoint: str = "trained",
                     jacobian_mode: str = "isolated") -> pd.DataFrame:
    """Operators rows of ``sublayers`` in the first third of layers (layer < ceil(L/3))."""
    df = _select(t.table("operators"), "operators.parquet", checkpoint=checkpoint, jacobian_mode=jacobian_mode)
    _columns(df, "operators.parquet", "layer", "sublayer")
    n_layers = int(df["layer"].max()) + 1
    df = df[(df["layer"] < math.ceil(n_layers / 3)) & df["sublayer"].isin(sublayers)]
    if df.empty:
        raise NotTested(f"operators.parquet has no {'/'.join(sublayers)} rows of {checkpoint} ({jacobian_mode})")
    return df


def _complex_early(column: str, sublayers: tuple[str, ...], jacobian_mode: str = "isolated"
                   ) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        df = _early_operators(t, sublayers, jacobian_mode=jacobian_mode)
        _columns(df, "operators.parquet", column)
        return _median(_numeric(df[column]), f"{column} of early {'/'.join(sublayers)} operators")

    return stat


register("complex_frac_early_median", ["operators"],
         "Median complex_frac of the trained isolated attention and MLP mean Jacobians over the first third of "
         "layers (descriptive: the isolated attention update has rank ≤ n_kv·head_dim, so most of its "
         "eigenvalues are structurally 1 and real, which caps this median near 2/3).",
         samples=_JACOBIAN_CHUNKS)(_complex_early("complex_frac", ("attn", "mlp")))
for _sub, _what in (("layer", "the full-layer operators J_mlp·J_attn"), ("mlp", "the MLP sub-layer operators")):
    for _mode in ("isolated", "isolated_observed", "in_context"):
        register(f"complex_frac_nontrivial_early_{_sub}" + ("" if _mode == "isolated" else f"_{_mode}"),
                 ["operators"],
                 f"Median over the first third of layers of complex_frac_nontrivial (the complex fraction among "
                 f"eigenvalues that are not structurally 1) of {_what}, trained, {_mode}.",
                 samples=_JACOBIAN_CHUNKS)(_complex_early("complex_frac_nontrivial", (_sub,), _mode))


@register("attn_nontrivial_fraction_early", ["eigenvalues"],
          "Median over the first third of layers of the fraction of the trained isolated attention operator's "
          "eigenvalues with |λ − 1| > 1e-8·max(1, max|λ|): the structural cap on its complex fraction "
          "(rank(U) ≤ n_kv·head_dim).", samples=_JACOBIAN_CHUNKS)
def _attn_cap(t: RunTables) -> float:
    df = _select(t.table("eigenvalues"), "eigenvalues.parquet", checkpoint="trained", jacobian_mode="isolated",
                 sublayer="attn")
    _columns(df, "eigenvalues.parquet", "layer", "re", "im")
    n_layers = int(df["layer"].max()) + 1
    fractions = []
    for _, group in df[df["layer"] < math.ceil(n_layers / 3)].groupby("layer"):
        lam = _numeric(group["re"]) + 1j * _numeric(group["im"])
        tol = 1e-8 * max(1.0, float(np.max(np.abs(lam))))
        fractions.append(float(np.mean(np.abs(lam - 1.0) > tol)))
    return _median(np.array(fractions), "non-trivial eigenvalue fractions")


def weighted_rotation(lam: np.ndarray) -> float:
    """Magnitude-weighted rotation of an update's eigenvalues μ = λ − 1:
    ``Σ|Im μ| / Σ|μ|`` (the mean |sin arg μ| weighted by |μ|; 0 for a symmetric update, and
    negligible rotations weigh nothing, unlike a count of complex pairs). 0 when every μ is 0."""
    mu = np.asarray(lam, dtype=np.complex128) - 1.0
    total = float(np.abs(mu).sum())
    return float(np.abs(mu.imag).sum() / total) if total > 0 else 0.0


def _layer_rotations(t: RunTables, checkpoint: str) -> pd.Series:
    """Weighted rotation (:func:`weighted_rotation`) of each early layer's full-layer operator
    (isolated mode) at ``checkpoint``, by layer."""
    return t.derived(f"layer_rotations:{checkpoint}", lambda: _compute_layer_rotations(t, checkpoint))


def _compute_layer_rotations(t: RunTables, checkpoint: str) -> pd.Series:
    df = _select(t.table("eigenvalues"), "eigenvalues.parquet", jacobian_mode="isolated", sublayer="layer")
    _columns(df, "eigenvalues.parquet", "checkpoint", "layer", "re", "im")
    n_layers = int(df["layer"].max()) + 1
    df = df[(df["checkpoint"] == checkpoint) & (df["layer"] < math.ceil(n_layers / 3))]
    if df.empty:
        raise NotTested(f"eigenvalues.parquet has no full-layer operators of {checkpoint} "
                        "(the step-0 null: --null init)")
    return df.groupby("layer").apply(lambda g: weighted_rotation(_numeric(g["re"]) + 1j * _numeric(g["im"])))


def _rotation_pairs(t: RunTables) -> pd.DataFrame:
    both = pd.concat({c: _layer_rotations(t, c) for c in ("trained", "init")}, axis=1).dropna()
    if both.empty:
        raise TooLittleData("no early layer has both trained and step-0 operators")
    return both


@register("rotation_gain_early", ["eigenvalues"],
          "Median over the first third of layers of the weighted rotation Σ|Im μ|/Σ|μ| (μ = λ − 1) of the trained "
          "full-layer operator minus that of the same layer at step 0 (isolated mean Jacobians), with its "
          "distribution-free 95% interval over layers: how much training pulls early layers towards rotation.",
          samples={"early_layers": lambda t: _count(lambda: len(_rotation_pairs(t))), **_JACOBIAN_CHUNKS})
def _rotation_gain(t: RunTables) -> Estimate:
    both = _rotation_pairs(t)
    return median_estimate((both["trained"] - both["init"]).to_numpy(), "rotation gains")


for _checkpoint in ("trained", "init"):
    register(f"rotation_early_{_checkpoint}", ["eigenvalues"],
             f"Median over the first third of layers of the weighted rotation of the {_checkpoint} full-layer "
             "operator (descriptive).")(
        lambda t, c=_checkpoint: _median(_layer_rotations(t, c).to_numpy(dtype=float), f"{c} rotations"))


@register("complex_frac_random_baseline", ["eigenvalues"],
          "The complex fraction a real Gaussian matrix of the operators' width d already has, 1 − √(2/(πd)) "
          "(Edelman–Kostlan–Shub: about √(2d/π) real eigenvalues), printed beside the complex fractions.")
def _random_baseline(t: RunTables) -> float:
    df = _select(t.table("eigenvalues"), "eigenvalues.parquet", checkpoint="trained", sublayer="layer")
    _columns(df, "eigenvalues.parquet", "jacobian_mode", "layer")
    d = int(df.groupby(["jacobian_mode", "layer"]).size().max())
    return 1.0 - math.sqrt(2.0 / (math.pi * d))


def _count(count: Callable[[], int]) -> int | None:
    """A sample count, None when its inputs are missing."""
    try:
        return count()
    except (NotTested, TooLittleData):
        return None


#: The rank cap of the claims' funnel protocol (B2, the paper's figure: rank 512).
CLAIM_RANK = 512


def _funnel_curve(t: RunTables, checkpoint: str, alpha: float, direction: str, truncated: bool,
                  schur_order: str = "lapack", jacobian_mode: str | None = None) -> pd.DataFrame:
    """One cumulative erank curve, by number of factors, of ``jacobian_mode`` (default the
    funnel's: ``isolated`` when present): ``truncated`` picks the rank-capped curve
    (truncation < d; for d ≤ :data:`CLAIM_RANK` the exact one, which that cap leaves as it
    is), else the exact one; at α < 1 the Schur order ``schur_order`` (α = 1
    does not depend on it)."""
    df = _select(t.table("cumulative"), "cumulative.parquet", checkpoint=checkpoint, direction=direction)
    _columns(df, "cumulative.parquet", "jacobian_mode", "alpha", "truncation", "steps", "erank")
    modes = list(pd.unique(df["jacobian_mode"]))
    mode = jacobian_mode or ("isolated" if "isolated" in modes else modes[0])
    if mode not in modes:
        raise NotTested(f"cumulative.parquet has no {mode} curves (run --jacobian-mode both or all)")
    df = df[df["jacobian_mode"] == mode]
    df = df[np.isclose(_numeric(df["alpha"]), alpha)]
    if alpha < 1 and "schur_order" in df.columns:
        df = df[df["schur_order"] == schur_order]
    if df.empty:
        raise NotTested(f"cumulative.parquet has no {direction} curve for {checkpoint} at α = {alpha:g}"
                        + (f" in Schur order {schur_order}" if alpha < 1 else ""))
    exact = df["truncation"].max()
    capped = df[df["truncation"] < exact]
    if truncated and capped.empty and exact <= CLAIM_RANK:
        capped = df[df["truncation"] == exact]  # the protocol's cap is at or above d: the exact product
    df = capped if truncated else df[df["truncation"] == exact]
    if df.empty:
        raise NotTested(f"cumulative.parquet has no {'rank-truncated' if truncated else 'exact'} curve "
                        f"(--funnel-rank 0 computes exact products only)")
    return df.sort_values("steps")


def funnel_ends(t: RunTables, checkpoint: str, alpha: float = 1.0, direction: str = "backward",
                 truncated: bool = True, schur_order: str = "lapack", jacobian_mode: str | None = None
                 ) -> tuple[float, float]:
    """``(erank after one step, erank at full depth)`` of a curve (:func:`_funnel_curve`)."""
    curve = _funnel_curve(t, checkpoint, alpha, direction, truncated, schur_order, jacobian_mode)
    if len(curve) < 2:
        raise TooLittleData(f"the {checkpoint} cumulative curve has fewer than two depths")
    first, last = float(curve["erank"].iloc[0]), float(curve["erank"].iloc[-1])
    if not first > 0:
        raise TooLittleData(f"the {checkpoint} one-step erank is not positive")
    return first, last


def funnel_replicates(t: RunTables, checkpoint: str) -> pd.DataFrame:
    """The bootstrap replicates (``replicate`` ≥ 1 of ``funnel_boot``) of ``checkpoint`` under
    the claims' protocol: the Jacobian mode and truncation of its backward, rank-truncated α = 1
    curve (:func:`_funnel_curve`), finite ends only; columns ``init_seed``, ``replicate``,
    ``erank_one_step``, ``erank_full_depth``. Empty when the run has none (``--funnel-boot 0``)."""
    curve = _funnel_curve(t, checkpoint, 1.0, "backward", True)
    cols = ["init_seed", "replicate", "erank_one_step", "erank_full_depth"]
    boot = t.table("funnel_boot")
    if boot is None or boot.empty:
        return pd.DataFrame(columns=cols)
    _columns(boot, "funnel_boot.parquet", "checkpoint", "jacobian_mode", "truncation", *cols)
    keep = ((boot["checkpoint"] == checkpoint) & (boot["jacobian_mode"] == curve["jacobian_mode"].iloc[0])
            & (_numeric(boot["truncation"]) == float(curve["truncation"].iloc[0])) & (_numeric(boot["replicate"]) >= 1)
            & np.isfinite(_numeric(boot["erank_one_step"])) & np.isfinite(_numeric(boot["erank_full_depth"])))
    return boot.loc[keep, cols].reset_index(drop=True)


def own_null(replicates: pd.DataFrame) -> pd.DataFrame:
    """The replicates of the run's own step-0 null (the ``init`` checkpoint of the other
    tables): the least ``init_seed``, the run seed (the extra nulls have seed + k)."""
    seeds = _numeric(replicates["init_seed"])
    return replicates[seeds == np.nanmin(seeds)] if np.isfinite(seeds).any() else replicates


def funnel_pair_ratios(numerator: pd.DataFrame, denominator: pd.DataFrame) -> np.ndarray:
    """Full-depth erank of ``numerator`` over ``denominator`` replicate by replicate: every row
    of ``numerator`` (e.g. one per step-0 seed and replicate) with the ``denominator`` row of
    its replicate (the same resampled chunks, :mod:`depthlens.jacobian.bootstrap`)."""
    pairs = numerator.merge(denominator[["replicate", "erank_full_depth"]], on="replicate", suffixes=("", "_over"))
    return _numeric(pairs["erank_full_depth"]) / _numeric(pairs["erank_full_depth_over"])


def _init_seeds(t: RunTables) -> int | None:
    """Step-0 initialisations with bootstrap replicates (``init`` rows of ``funnel_boot``)."""
    boot = t.table("funnel_boot")
    if boot is None or not {"checkpoint", "init_seed", "replicate"} <= set(boot.columns):
        return None
    init = boot[(boot["checkpoint"] == "init") & (_numeric(boot["replicate"]) >= 1)]
    return int(init["init_seed"].nunique())


#: The funnel's protocols: the claims' own (the paper's figure: backward, rank 512, the
#: funnel's Jacobian mode) first.
_PROTOCOLS = {"": ("backward", True, None), "_forward": ("forward", True, None), "_exact": ("backward", False, None),
              "_forward_exact": ("forward", False, None), "_in_context": ("backward", True, "in_context")}
_PROTOCOL_TEXT = {"": "backward, rank-truncated (512)", "_forward": "forward, rank-truncated",
                  "_exact": "backward, exact", "_forward_exact": "forward, exact",
                  "_in_context": "backward, rank-truncated, in-context operators"}
for _suffix, (_direction, _truncated, _mode) in _PROTOCOLS.items():
    # the claims' own protocol carries the bootstrap's 95% percentile interval (funnel_boot);
    # the variants stay point estimates
    def _ratio(checkpoint: str, direction: str = _direction, truncated: bool = _truncated,
               mode: str | None = _mode, boot: bool = not _suffix) -> Callable:
        def stat(t: RunTables) -> float | Estimate:
            first, last = funnel_ends(t, checkpoint, 1.0, direction, truncated, jacobian_mode=mode)
            if not boot:
                return last / first
            reps = funnel_replicates(t, checkpoint)
            reps = own_null(reps) if checkpoint == "init" else reps
            ratios = _numeric(reps["erank_full_depth"]) / _numeric(reps["erank_one_step"])
            return Estimate(last / first, *percentile_interval(ratios))

        return stat

    def _init_over_trained(direction: str = _direction, truncated: bool = _truncated,
                           mode: str | None = _mode, boot: bool = not _suffix) -> Callable:
        def stat(t: RunTables) -> float | Estimate:
            value = funnel_ends(t, "init", 1.0, direction, truncated, jacobian_mode=mode)[1] / funnel_ends(
                t, "trained", 1.0, direction, truncated, jacobian_mode=mode)[1]
            if not boot:
                return value
            ratios = funnel_pair_ratios(funnel_replicates(t, "init"), funnel_replicates(t, "trained"))
            return Estimate(value, *percentile_interval(ratios))

        return stat

    _text = _PROTOCOL_TEXT[_suffix]
    _boot = (", with the 95% percentile interval of the same ratio over the bootstrap replicates of funnel_boot "
             "(chunks redrawn with replacement; unbounded with fewer than 40)") if not _suffix else ""
    register(f"funnel_ratio_trained{_suffix}", ["cumulative"],
             f"erank of the trained cumulative Jacobian ({_text}, α = 1) at full depth over its value after one "
             f"step{_boot}.", samples=_JACOBIAN_CHUNKS)(_ratio("trained"))
    register(f"funnel_ratio_init{_suffix}", ["cumulative"],
             f"The same ratio on the step-0 (init) checkpoint ({_text}; descriptive)"
             + (", with its 95% percentile interval over the bootstrap replicates of the run seed's null"
                if not _suffix else "") + ".",
             samples=_JACOBIAN_CHUNKS)(_ratio("init"))
    register(f"funnel_init_over_trained{_suffix}", ["cumulative"],
             f"Full-depth erank of the step-0 (init) cumulative Jacobian over the trained one's ({_text}, α = 1): "
             "how much more rank the architecture alone keeps" + (
                 "; the value is the run seed's null, the 95% percentile interval is over every pair of a step-0 "
                 "null (--init-seeds) and a bootstrap replicate, each null's replicate over the trained replicate "
                 "of the same resampled chunks, so it covers the chunk sample and the initialisation (unbounded "
                 "with fewer than 40 pairs)" if not _suffix else "") + ".",
             samples={**_JACOBIAN_CHUNKS, **({"init_seeds": _init_seeds} if not _suffix else {})})(_init_over_trained())


#: The Schur orders of the split (METHODS B4), LAPACK's own first.
SCHUR_ORDERS = ("lapack", "canonical", "outside_first", "inside_first")


def _schur_removed(schur_order: str, direction: str = "backward", truncated: bool = True,
                   jacobian_mode: str | None = None) -> Callable:
    def stat(t: RunTables) -> float:
        first1, last1 = funnel_ends(t, "trained", 1.0, direction, truncated, jacobian_mode=jacobian_mode)
        first0, last0 = funnel_ends(t, "trained", 0.0, direction, truncated, schur_order, jacobian_mode)
        fall1, fall0 = -math.log(last1 / first1), -math.log(last0 / first0)
        if not fall1 > 0:
            raise TooLittleData("no funnel at α = 1 to remove")
        return 1.0 - fall0 / fall1

    return stat


for _order in SCHUR_ORDERS:
    register("funnel_removed_by_schur" + ("" if _order == "lapack" else f"_{_order}"), ["cumulative"],
             "Fraction of the trained funnel (in log erank; backward, rank-truncated) removed by the Schur split "
             f"α = 0 in Schur order {_order}: 1 − log(r₀)/log(r₁), r_α = erank(full depth)/erank(one step).",
             samples=_JACOBIAN_CHUNKS)(_schur_removed(_order))
@register("funnel_removed_by_schur_every_order", ["cumulative"],
          "funnel_removed_by_schur in LAPACK's order with its range over every Schur order the run computed (the "
          "α = 0 operator depends on the order): decisive only when every order agrees.", samples=_JACOBIAN_CHUNKS)
def _schur_every_order(t: RunTables) -> Estimate:
    values = {}
    for order in SCHUR_ORDERS:
        try:
            values[order] = _schur_removed(order)(t)
        except NotTested:
            continue
    if "lapack" not in values:
        raise NotTested("cumulative.parquet has no α = 0 curve in LAPACK's Schur order")
    finite = [v for v in values.values() if not math.isnan(v)]
    if len(values) < len(SCHUR_ORDERS):
        missing = ", ".join(o for o in SCHUR_ORDERS if o not in values)
        raise TooLittleData(f"the Schur split was not computed in every order (missing: {missing}; "
                            "--schur-orders)")
    return Estimate(values["lapack"], min(finite), max(finite), "range")


register("funnel_removed_by_schur_in_context", ["cumulative"],
         "As funnel_removed_by_schur on the in-context operators (LAPACK order).",
         samples=_JACOBIAN_CHUNKS)(_schur_removed("lapack", jacobian_mode="in_context"))
register("funnel_removed_by_schur_forward_exact", ["cumulative"],
         "As funnel_removed_by_schur on the forward exact products (the protocol before the paper's).",
         samples=_JACOBIAN_CHUNKS)(_schur_removed("lapack", "forward", False))


def _significant(t: RunTables, checkpoint: str) -> pd.Series:
    df = _select(t.table("coupling"), "coupling.parquet", checkpoint=checkpoint)
    _columns(df, "coupling.parquet", "significant")
    return df["significant"].astype(bool)


def checkpoint_order(t: RunTables) -> list[str]:
    """The run's checkpoints in training order: ``init`` (step 0), the extra revisions as the
    run listed them (a run option; in the jacobian section of runs made before), then
    ``trained`` (the final weights)."""
    config = t.manifest.get("config") or {}
    revisions = config.get("revisions") or (config.get("jacobian") or {}).get("revisions") or []
    return ["init", *[str(r) for r in revisions], "trained"]


def _tested(t: RunTables, checkpoint: str) -> pd.DataFrame:
    return _select(t.table("coupling"), "coupling.parquet", checkpoint=checkpoint)


@register("coupling_monotone_rise", ["coupling"],
          "Spearman rank correlation between training order (init, the revisions, trained) and the number of "
          "FDR-significant coupling boundaries per checkpoint, with its resampling spread (parametric bootstrap of "
          "each checkpoint's count among its tested boundaries, 95% interval); needs at least 3 checkpoints.",
          samples={"boundaries": _boundaries("trained", "init"), "permutations": _permutations})
def _monotone_rise(t: RunTables) -> Estimate:
    df = t.table("coupling")
    _columns(df, "coupling.parquet", "checkpoint", "significant")
    present = [c for c in checkpoint_order(t) if c in set(df["checkpoint"])]
    if len(present) < 3:
        raise TooLittleData(f"only {len(present)} checkpoint(s) ({', '.join(present)}); a monotone rise needs "
                            "at least 3 (pass --revisions)")
    counts = np.array([_significant(t, c).sum() for c in present])
    totals = np.array([len(_tested(t, c)) for c in present])
    return Estimate(*trend_interval(counts, totals))


register("coupling_significant_rise", ["coupling"],
         "FDR-significant coupling boundaries of the trained checkpoint minus those of init (effect size of the "
         "rise).", samples={"boundaries": _boundaries("trained", "init"), "permutations": _permutations})(
    lambda t: float(_significant(t, "trained").sum() - _significant(t, "init").sum()))


@register("coupling_significant_fraction_init", ["coupling"],
          "Fraction of sub-layer boundaries with FDR-significant coupling at init, with its Clopper–Pearson 95% "
          "interval (absence is supported only when the interval's upper end is small).",
          samples={"boundaries": _boundaries("init"), "permutations": _permutations})
def _fraction_init(t: RunTables) -> Estimate:
    sig = _significant(t, "init")
    return Estimate(float(sig.mean()), *proportion_interval(int(sig.sum()), len(sig)))


def _coupling_vs(column: str, sign: float) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        df = _select(t.table("coupling"), "coupling.parquet", checkpoint="trained")
        _columns(df, "coupling.parquet", "effect", column)
        return _finite_spearman(_numeric(df[column]) * sign, _numeric(df["effect"]),
                                "boundaries with varying effect and operator type")[0]

    return stat


register("coupling_sign_vs_symmetry", ["coupling"],
         "Spearman rank correlation over the trained boundaries between the coupling effect and symmetry_update, "
         "the symmetric share of the sub-layer's update U = J − I (descriptive: a trend, where the seed states a "
         "sign).", samples={"boundaries": _boundaries("trained")})(_coupling_vs("symmetry_update", 1.0))
register("coupling_sign_vs_normality", ["coupling"],
         "As coupling_sign_vs_symmetry with −henrici_update_rel (departure from normality) as the operator type.",
         samples={"boundaries": _boundaries("trained")})(_coupling_vs("henrici_update_rel", -1.0))


def _sign_agreement(column: str, sign: float) -> Callable[[RunTables], Estimate]:
    """Fraction of the trained FDR-significant boundaries whose coupling sign is the one the
    operator type predicts: positive (amplified) where ``sign · column`` is above its median
    over all trained boundaries (near-symmetric), negative (damped) below; Clopper–Pearson
    interval over those boundaries."""
    def stat(t: RunTables) -> Estimate:
        df = _select(t.table("coupling"), "coupling.parquet", checkpoint="trained")
        _columns(df, "coupling.parquet", "effect", "significant", column)
        kind = sign * _numeric(df[column])
        symmetric = kind > np.nanmedian(kind)
        sig = df["significant"].astype(bool).to_numpy() & np.isfinite(kind) & (_numeric(df["effect"]) != 0)
        if not sig.any():
            raise TooLittleData("no trained boundary has significant coupling")
        agree = np.where(symmetric, _numeric(df["effect"]) > 0, _numeric(df["effect"]) < 0)[sig]
        k, n = int(agree.sum()), int(agree.size)
        return Estimate(k / n, *proportion_interval(k, n))

    return stat


def _significant_boundaries(t: RunTables) -> int | None:
    df = t.table("coupling")
    if df is None or not {"checkpoint", "significant"} <= set(df.columns):
        return None
    return int(df.loc[df["checkpoint"] == "trained", "significant"].astype(bool).sum())


register("coupling_sign_follows_type", ["coupling"],
         "Fraction of the trained FDR-significant coupling boundaries whose sign the operator type predicts: "
         "boundary units amplified (effect > 0) where symmetry_update is above its median over the trained "
         "boundaries (near-symmetric), damped (effect < 0) below it (non-normal); Clopper–Pearson 95% interval.",
         samples={"boundaries": _boundaries("trained")})(_sign_agreement("symmetry_update", 1.0))
register("coupling_sign_follows_normality", ["coupling"],
         "As coupling_sign_follows_type with −henrici_update_rel (departure from normality of U) as the operator "
         "type.", samples={"boundaries": _boundaries("trained")})(_sign_agreement("henrici_update_rel", -1.0))


def _depth_trend(checkpoint: str) -> Callable[[RunTables], Estimate]:
    def stat(t: RunTables) -> Estimate:
        df = _select(t.table("operators"), "operators.parquet", checkpoint=checkpoint, jacobian_mode="isolated")
        _columns(df, "operators.parquet", "layer", "sublayer", "symmetry_update")
        df = df[df["sublayer"].isin(("attn", "mlp"))]
        return spearman_estimate(_numeric(df["layer"]), _numeric(df["symmetry_update"]),
                                 "operators with varying symmetry")

    return stat


def _trained_operators(t: RunTables) -> int | None:
    """Trained isolated attention and MLP operators (the pairs of the depth trend)."""
    df = t.table("operators")
    if df is None or not {"checkpoint", "jacobian_mode", "sublayer"} <= set(df.columns):
        return None
    return int(((df["checkpoint"] == "trained") & (df["jacobian_mode"] == "isolated")
                & df["sublayer"].isin(("attn", "mlp"))).sum())


register("symmetry_depth_trend_trained", ["operators"],
         "Spearman rank correlation between layer and symmetry_update (the symmetric share of U = J − I) of the "
         "trained isolated attention and MLP mean Jacobians (positive: late layers are nearer symmetric), with its "
         "95% interval (Fisher's z).",
         samples={**_JACOBIAN_CHUNKS, "operators": _trained_operators})(_depth_trend("trained"))
register("symmetry_depth_trend_init", ["operators"],
         "The same trend at step 0 (descriptive).", samples=_JACOBIAN_CHUNKS)(_depth_trend("init"))


@register("symmetry_init_minus_trained_early", ["operators"],
          "Median symmetry_update of the step-0 isolated attention and MLP operators minus that of the trained ones in "
          "the first third of layers (positive: training pulls early layers away from symmetry, towards "
          "rotation).", samples=_JACOBIAN_CHUNKS)
def _symmetry_gap(t: RunTables) -> float:
    values = [_median(_numeric(_early_operators(t, ("attn", "mlp"), c)["symmetry_update"]), f"{c} symmetry")
              for c in ("init", "trained")]
    return values[0] - values[1]


from . import census_statistics  # noqa: E402,F401  (registers the census statistics)
