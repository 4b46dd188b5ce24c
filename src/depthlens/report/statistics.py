"""The study's statistics: named functions of a run's outputs that claims test.

Statistic functions take a :class:`~depthlens.report.tables.RunTables` and return a float
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

from .tables import RunTables

#: Sample units a claim may set a minimum for (``min_UNIT``), with the words the report uses.
SAMPLE_UNITS = {
    "chunks": "chunks",
    "null_chunks": "chunks with null samples",
    "matrices": "attention matrices with a simple Perron root",
    "routing_heads": "routing heads",
    "sink_heads": "sink heads",
    "boundaries": "sub-layer boundaries",
    "permutations": "label permutations",
}


# ---------------------------------------------------------------------------------------
# statistics registry
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
    stat = STATISTICS[name]
    for need in stat.needs:
        if not tables.has(need):
            return None, tables.why_missing(need)
    try:
        value = stat.func(tables)
    except NotTested as exc:
        return None, str(exc)
    except TooLittleData as exc:
        return math.nan, str(exc)
    except Exception as exc:  # an odd table must not take the report down: say so instead
        warnings.warn(f"statistic {name} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return None, f"{name} could not be computed ({type(exc).__name__}: {exc})"
    if value is None:
        return None, f"the inputs of {name} are missing"
    value = float(value)
    return value, ("too little data" if math.isnan(value) else "")


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
        df = t.table("depth")
        if df is None or not {"operator", "source", "depth", "chunk"} <= set(df.columns):
            return None
        df = df[(df["operator"] == "mean") & (df["source"] == source)]
        return int(df.loc[df["depth"] == df["depth"].max(), "chunk"].nunique()) if len(df) else 0

    return count


def _role_heads(role: str, finite: str | None = None) -> SampleCounter:
    """Heads of ``role`` (with a finite ``finite`` column when given) in heads.parquet, else
    the role counts of attention.json."""
    def count(t: RunTables) -> int | None:
        heads = t.table("heads")
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
        heads = t.table("heads")
        if heads is not None and {"role", "n_null_chunks"} <= set(heads.columns):
            n = _numeric(heads.loc[heads["role"] == role, "n_null_chunks"])
            n = n[~np.isnan(n)]
            if n.size:
                return int(n.min())
        chunks = t.table("head_chunks")
        if chunks is not None and {"chunk", "delta_TR1"} <= set(chunks.columns):
            return int(chunks.loc[np.isfinite(_numeric(chunks["delta_TR1"])), "chunk"].nunique())
        known = [n for n in (_run_chunks(t), _config_count(t, "null_chunks")) if n is not None]
        return min(known) if known else None

    return count


def _simple_matrices(t: RunTables) -> int | None:
    df = t.table("head_chunks")
    if df is None or "perron_simple" not in df.columns:
        return None
    return int((_numeric(df["perron_simple"]) == 1.0).sum())


def _clamp_chunks(t: RunTables) -> int | None:
    chain = (t.json("interventions") or {}).get("clamp_chain")
    n = _int(chain.get("n_chunks")) if isinstance(chain, dict) else None
    return n if n is not None else _run_chunks(t)


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
    df = t.table("head_chunks")
    _columns(df, "head_chunks", "perron_simple", "kreiss_A_ok")
    simple = df[_numeric(df["perron_simple"]) == 1.0]
    if simple.empty:
        raise TooLittleData("no matrix with a simple Perron root")
    return float(np.mean(_numeric(simple["kreiss_A_ok"]) == 1.0))


def _gap(source: str, which: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        df = _select(t.table("depth"), "depth.parquet", operator="mean", source=source)
        _columns(df, "depth.parquet", "depth", which)
        final = df[df["depth"] == df["depth"].max()]
        return _median(_numeric(final[which]), f"{which} ({source}) at depth {int(df['depth'].max())}")

    return stat


for _source in ("model", "null"):
    for _which in ("gap_e1", "gap_e2"):
        register(f"eig_{_which}_{_source}_final", ["depth"],
                 f"Median over chunks{' and null samples' if _source == 'null' else ''} of {_which} = "
                 f"log10(‖D‖/{_which[-2:].upper()}) of the mean-head operator at the final depth, "
                 f"source = {_source}.",
                 samples={"null_chunks" if _source == "null" else "chunks": _distinct_depth_chunks(_source)},
                 )(_gap(_source, _which))


@register("induction_ratio_median", ["heads"],
          "Median over routing heads of induction_ratio (Δ_TR on second-copy over first-copy "
          "probe positions).", samples={"routing_heads": _role_heads("routing", "induction_ratio")})
def _induction_ratio(t: RunTables) -> float:
    df = t.table("heads")
    _columns(df, "heads.parquet", "role", "induction_ratio")
    routing = df[df["role"] == "routing"]
    if routing.empty:
        raise TooLittleData("no routing heads")
    return _median(_numeric(routing["induction_ratio"]), "induction_ratio over routing heads")


def _summary_fraction(key: str, role: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        summary = t.json("attention")
        if key not in summary:
            raise NotTested(f"attention.json lacks {key!r}")
        value = summary[key]
        if value is None:
            raise TooLittleData(f"no {role} heads")
        return float(value)

    return stat


register("routing_positive_significant_fraction", ["attention.json"],
         "Fraction of routing heads with Δ_TR > 0 and BH q ≤ q_level "
         "(attention.json: routing_positive_significant).",
         samples={"routing_heads": _role_heads("routing"), "null_chunks": _NULL_HEADS["routing"]})(
    _summary_fraction("routing_positive_significant", "routing"))
register("sink_negative_fraction", ["attention.json"],
         "Fraction of sink heads with Δ_TR < 0 (attention.json: sink_negative).",
         samples={"sink_heads": _role_heads("sink"), "null_chunks": _NULL_HEADS["sink"]})(
    _summary_fraction("sink_negative", "sink"))


@register("clamp_chain_n_dims", ["interventions.json"],
          "Number of massive-activation dimensions whose clamp supports the chain (sink mass "
          "falls monotonically in α, predicts the rise in reserve, control inert): "
          "len(interventions.json['clamp_chain']['dims']), 0 when the chain is not supported.",
          samples={"chunks": _clamp_chunks})
def _clamp_chain(t: RunTables) -> float:
    chain = t.json("interventions").get("clamp_chain")
    if not isinstance(chain, dict):
        raise NotTested("interventions.json lacks 'clamp_chain'")
    if chain.get("supported") is False:
        return 0.0
    dims = chain.get("dims")
    if not isinstance(dims, list):
        raise NotTested("interventions.json lacks 'clamp_chain.dims'")
    return float(len(dims))


# -- Part B ------------------------------------------------------------------------------
@register("complex_frac_early_median", ["operators"],
          "Median complex_frac of the trained isolated mean Jacobians (both sub-layers) over "
          "the first third of layers (layer < ceil(L/3)).", samples=_JACOBIAN_CHUNKS)
def _complex_early(t: RunTables) -> float:
    df = _select(t.table("operators"), "operators.parquet", checkpoint="trained", jacobian_mode="isolated")
    _columns(df, "operators.parquet", "layer", "complex_frac")
    n_layers = int(df["layer"].max()) + 1
    early = df[df["layer"] < math.ceil(n_layers / 3)]
    return _median(_numeric(early["complex_frac"]), "complex_frac in early layers")


def _funnel_curve(t: RunTables, checkpoint: str, alpha: float) -> pd.DataFrame:
    df = _select(t.table("cumulative"), "cumulative.parquet", checkpoint=checkpoint, direction="forward")
    _columns(df, "cumulative.parquet", "jacobian_mode", "alpha", "truncation", "depth", "erank")
    modes = list(pd.unique(df["jacobian_mode"]))
    df = df[df["jacobian_mode"] == ("isolated" if "isolated" in modes else modes[0])]
    df = df[np.isclose(_numeric(df["alpha"]), alpha)]
    if df.empty:
        raise NotTested(f"cumulative.parquet has no forward curve for {checkpoint} at α = {alpha:g}")
    df = df[df["truncation"] == df["truncation"].max()]  # exact (truncation = d) where present
    return df.sort_values("depth")


def _funnel_ratio(t: RunTables, checkpoint: str, alpha: float = 1.0) -> float:
    curve = _funnel_curve(t, checkpoint, alpha)
    first, last = float(curve["erank"].iloc[0]), float(curve["erank"].iloc[-1])
    if len(curve) < 2 or not first > 0:
        raise TooLittleData(f"the {checkpoint} cumulative curve has fewer than two depths")
    return last / first


register("funnel_ratio_trained", ["cumulative"],
         "erank of the trained forward cumulative Jacobian (α = 1, least truncation) at full "
         "depth over its value after one step.", samples=_JACOBIAN_CHUNKS)(lambda t: _funnel_ratio(t, "trained"))
register("funnel_ratio_init", ["cumulative"],
         "The same ratio on the step-0 (init) checkpoint.", samples=_JACOBIAN_CHUNKS)(lambda t: _funnel_ratio(t, "init"))


@register("funnel_removed_by_schur", ["cumulative"],
          "Fraction of the trained funnel (in log erank) removed by the Schur split α = 0: "
          "1 − log(r₀)/log(r₁), r_α = erank(full depth)/erank(one step) at α.", samples=_JACOBIAN_CHUNKS)
def _funnel_schur(t: RunTables) -> float:
    fall1 = -math.log(_funnel_ratio(t, "trained", 1.0))
    fall0 = -math.log(_funnel_ratio(t, "trained", 0.0))
    if not fall1 > 0:
        raise TooLittleData("no funnel at α = 1 to remove")
    return 1.0 - fall0 / fall1


def _significant(t: RunTables, checkpoint: str) -> pd.Series:
    df = _select(t.table("coupling"), "coupling.parquet", checkpoint=checkpoint)
    _columns(df, "coupling.parquet", "significant")
    return df["significant"].astype(bool)


register("coupling_significant_rise", ["coupling"],
         "FDR-significant coupling boundaries of the trained checkpoint minus those of init.",
         samples={"boundaries": _boundaries("trained", "init"), "permutations": _permutations})(
    lambda t: float(_significant(t, "trained").sum() - _significant(t, "init").sum()))
register("coupling_significant_fraction_init", ["coupling"],
         "Fraction of sub-layer boundaries with FDR-significant coupling at init.",
         samples={"boundaries": _boundaries("init"), "permutations": _permutations})(
    lambda t: float(_significant(t, "init").mean()))


# ---------------------------------------------------------------------------------------
# claims files
