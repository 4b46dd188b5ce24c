"""Statistics of a checkpoint census (the census claims C1–C3), read from the ``census`` and
``census_heads`` tables (:mod:`depthlens.report.census_tables`).

They test the primary series (the census's ``--model``; in a census without a ``replicate``
column, its first series) pooled with its ``--replicates`` (the same configuration trained with
other seeds: C1 takes their layers as further units, C3 sums each checkpoint's coupling
counts over them; C2 reads the primary's last checkpoint). A ``--compare`` series is another
configuration, which the report compares but the claims do not pool.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..onsets import head_onsets, layer_lag_test
from ...runs.tables import RunTables
from ...stats import spearman, trend_interval
from .core import Estimate, Statistic, TooLittleData, numeric, option_count, registrar, require_columns

STATISTICS: dict[str, Statistic] = {}
register = registrar(STATISTICS)


def pooled(t: RunTables, name: str) -> pd.DataFrame:
    """Rows of census table ``name`` of the primary series and its replicates (``replicate``
    ≥ 0; without that column, the first series), in training order within each."""
    df = t.table(name)
    require_columns(df, f"{name}.parquet", "series", "order")
    if "replicate" in df.columns:
        return df[numeric(df["replicate"]) >= 0].sort_values(["replicate", "order"], kind="stable")
    census = t.table("census")
    first = census["series"].iloc[0] if census is not None and len(census) else df["series"].iloc[0]
    return df[df["series"] == first].sort_values("order").assign(replicate=0)


def _primary(t: RunTables, name: str) -> pd.DataFrame:
    """Rows of census table ``name`` of the primary series alone, in training order."""
    df = pooled(t, name)
    return df[numeric(df["replicate"]) == 0]


def _onsets(t: RunTables) -> pd.DataFrame:
    heads = pooled(t, "census_heads")
    require_columns(heads, "census_heads.parquet", "prev_token_score", "induction_score", "sink_mass", "delta_TR1")
    return t.derived("census_onsets", lambda: head_onsets(heads))


def _lag_test(t: RunTables) -> tuple[int, float, float]:
    """:func:`~depthlens.report.onsets.layer_lag_test` of the run's onsets, computed once per
    run (the statistic and its sample count read it)."""
    return t.derived("census_lag_test", lambda: layer_lag_test(_onsets(t)))


def _paired(t: RunTables) -> int | None:
    """Layers (of every replicate) with heads that have both onsets (the units of the C1 test)."""
    if t.table("census_heads") is None:
        return None
    return _lag_test(t)[0]


def _heads_per_layer(t: RunTables) -> int | None:
    """Heads with a finite lag per paired layer (median over the layers of every replicate)."""
    if t.table("census_heads") is None:
        return None
    onsets = _onsets(t)
    finite = onsets[np.isfinite(numeric(onsets["lag"]))]
    if finite.empty:
        return 0
    return int(round(float(np.median(finite.groupby(["replicate", "layer"]).size()))))


def _checkpoints(t: RunTables) -> int | None:
    census = t.table("census")
    if census is None or "status" not in census.columns:
        return None
    return int((_primary(t, "census")["status"] != "failed").sum())


def _coupling(t: RunTables) -> tuple[np.ndarray, np.ndarray]:
    """``(significant, tested)`` coupling boundaries per checkpoint in training order, summed
    over the primary series and its replicates (NaN where a checkpoint of any of them failed
    or has no coupling)."""
    census = pooled(t, "census")
    require_columns(census, "census.parquet", "status", "coupling_significant", "coupling_tested")
    sums = []
    for column in ("coupling_significant", "coupling_tested"):
        value = np.where(census["status"] != "failed", numeric(census[column]), np.nan)
        grid = pd.DataFrame({"order": census["order"].to_numpy(), "replicate": census["replicate"].to_numpy(),
                             "value": value}).pivot(index="order", columns="replicate", values="value")
        sums.append(grid.sum(axis=1, min_count=grid.shape[1]).to_numpy(dtype=float))
    return sums[0], sums[1]


def _boundaries(t: RunTables) -> int | None:
    """The fewest coupling boundaries any checkpoint tested (summed over replicates)."""
    census = t.table("census")
    if census is None or "coupling_tested" not in census.columns:
        return None
    tested = _coupling(t)[1]
    tested = tested[np.isfinite(tested)]
    return int(tested.min()) if tested.size else None


def _lags(t: RunTables) -> tuple[float, float]:
    """``(median lag, one-sided p)`` over layers (:func:`~depthlens.report.onsets.layer_lag_test`)."""
    n, median, p = _lag_test(t)
    if n == 0:
        raise TooLittleData("no layer has heads with both a formation and a consolidation onset")
    return median, p


@register("census_onset_lag_p", ["census_heads"],
          "One-sided p-value over layers that consolidation follows formation: per head of the final "
          "checkpoint's role groups (previous-token, induction, sink) both onsets are the least-squares step of a "
          "continuous series (the role score; the excess reserve with the role's sign), the lag is placed in its "
          "null distribution under a common onset (same rule, randomised probability integral transform), and a "
          "sign-flip test runs over the layers' mean transforms.",
          samples={"paired_layers": _paired, "checkpoints": _checkpoints, "heads_per_layer": _heads_per_layer})
def _lag_p(t: RunTables) -> float:
    return _lags(t)[1]


@register("census_onset_lag_median", ["census_heads"],
          "Median over layers of their heads' mean consolidation lag minus its expected value under a common "
          "onset, in checkpoints (positive: consolidation after formation).", samples={"paired_layers": _paired})
def _lag_median(t: RunTables) -> float:
    return _lags(t)[0]


def _done(t: RunTables) -> pd.DataFrame:
    census = _primary(t, "census")
    require_columns(census, "census.parquet", "status", "funnel_step0_over", "erank_full_depth", "coupling_significant")
    return census[census["status"] != "failed"]


def _last_census(column: str) -> Callable[[RunTables], int | None]:
    """A count from ``column`` of the census table: its last finished checkpoint's value."""
    def count(t: RunTables) -> int | None:
        census = t.table("census")
        if census is None or column not in census.columns:
            return None
        values = numeric(_done(t)[column])
        values = values[np.isfinite(values)]
        return int(values[-1]) if values.size else None

    return count


@register("census_funnel_learned", ["census"],
          "B3 at the end of the series: full-depth erank of the step-0 checkpoint (else the first checkpoint's "
          "step-0 null) over that of the last checkpoint, under the B2 protocol (backward, rank-truncated, α = 1), "
          "with that checkpoint's 95% percentile interval over the bootstrap replicates (funnel_step0_over_lo, _hi; "
          "unbounded where the census table has none).",
          samples={"checkpoints": _checkpoints, "chunks": option_count("chunks"),
                   "replicates": option_count("funnel_boot"), "operators": _last_census("funnel_operators"),
                   "width": _last_census("width")})
def _funnel_learned(t: RunTables) -> Estimate:
    done = _done(t)
    values = numeric(done["funnel_step0_over"])
    finite = np.flatnonzero(np.isfinite(values))
    if finite.size == 0:
        raise TooLittleData("no checkpoint has a full-depth erank (run the jacobian stage)")
    last = finite[-1]
    if not {"funnel_step0_over_lo", "funnel_step0_over_hi"} <= set(done.columns):
        return Estimate(float(values[last]), -np.inf, np.inf)
    lo, hi = numeric(done["funnel_step0_over_lo"])[last], numeric(done["funnel_step0_over_hi"])[last]
    return Estimate(float(values[last]), -np.inf if np.isnan(lo) else float(lo), np.inf if np.isnan(hi) else float(hi))


def _trend(column: str, what: str) -> Callable[[RunTables], float]:
    """Spearman correlation between training order and ``column`` over the checkpoints that
    have it (0 when it never changes); needs 3 of them."""
    def stat(t: RunTables) -> float:
        values = numeric(_done(t)[column])
        values = values[np.isfinite(values)]
        if values.size < 3:
            raise TooLittleData(f"{values.size} checkpoint(s) with {what}; a trend needs 3")
        if np.ptp(values) == 0:
            return 0.0
        return spearman(np.arange(values.size, dtype=float), values)[0]

    return stat


register("census_funnel_trend", ["census"],
         "Spearman rank correlation between training order and the full-depth erank over the checkpoints "
         "(negative: the funnel deepens with training).", samples={"checkpoints": _checkpoints})(
    _trend("erank_full_depth", "a funnel (run the jacobian stage)"))
@register("census_coupling_trend", ["census"],
          "B5 as a trend: Spearman rank correlation between training order and the number of FDR-significant "
          "coupling boundaries per checkpoint (summed over --replicates; 0 when the count never changes), with its "
          "resampling spread "
          "(parametric bootstrap of each count among the checkpoint's tested boundaries, 95% interval).",
          samples={"checkpoints": _checkpoints, "boundaries": _boundaries})
def _coupling_trend(t: RunTables) -> Estimate:
    counts, tested = _coupling(t)
    ok = np.isfinite(counts) & np.isfinite(tested)
    if ok.sum() < 3:
        raise TooLittleData(f"{int(ok.sum())} checkpoint(s) with coupling counts (run the topology stage); a trend "
                            "needs 3")
    return Estimate(*trend_interval(counts[ok], tested[ok].astype(int)))
