"""The census tables: one row per (checkpoint, head) and one per checkpoint, read from the
tables of ordinary runs (nothing here recomputes an analysis).

A census point is one checkpoint's outputs: a run directory of its own (``depthlens census``
runs every checkpoint as an ordinary run) or one checkpoint of a run with ``--revisions``
(its ``checkpoint`` rows). The funnel is read under the claims' protocol (backward,
rank-truncated, α = 1, the funnel's Jacobian mode: :func:`depthlens.report.statistics.funnel_ends`),
with the 95% percentile interval of B3 over the bootstrap replicates of ``funnel_boot`` (the
runs of a census share their chunks and seed, so replicate k resamples the same chunks on
every checkpoint), and the coupling counts are the FDR-significant boundaries of the topology
stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .statistics import (NotTested, TooLittleData, checkpoint_order, funnel_ends, funnel_operators,
                         funnel_pair_ratios, funnel_replicates, funnel_width)
from ..runs.tables import RunTables
from ..stats import percentile_interval
from ..revisions import step_of

__all__ = ["HEAD_COLUMNS", "Point", "census_tables", "run_points"]

#: Columns of ``heads`` the census keeps per (checkpoint, head).
HEAD_COLUMNS = ("role", "prev_token_score", "induction_score", "sink_mass", "TR1", "delta_TR1", "null_q")
#: FDR level of a significant Δ_TR (the attention stage's BH q-values).
Q_LEVEL = 0.05


@dataclass
class Point:
    """One checkpoint of a census.

    Parameters
    ----------
    series : str
        The series it belongs to (its ``--model``).
    checkpoint : str
        Its label (``step-100``, a hub revision, or ``init``/``trained`` inside a run).
    model, revision : str
        What was loaded (the identity columns of its rows).
    step : float
        Its training step (NaN when unknown).
    status : str
        ``done``, ``failed`` (could not be loaded or analysed) or ``incomplete`` (some
        stages failed; what finished is used).
    error : str
        One line saying what failed ("" when done).
    loss : float
        Mean next-token cross-entropy on the run's chunks, nats per token (NaN when not measured).
    tables : RunTables or None
        The run holding its outputs.
    source : str
        The ``checkpoint`` value of its rows in that run (``trained`` for a census sub-run).
    family, norm : str
        Its architecture family and normalisation kind (``RMSNorm``, ``LayerNorm``; "" when
        not loaded).
    replicate : int
        0 for the census's ``--model`` (and a run's own model), k for the k-th series of
        ``--replicates`` (pooled with it by the census claims), −1 for a ``--compare`` series.
    """

    series: str
    checkpoint: str
    model: str
    revision: str
    step: float
    status: str = "done"
    error: str = ""
    loss: float = math.nan
    tables: RunTables | None = None
    source: str = "trained"
    family: str = ""
    norm: str = ""
    replicate: int = 0


def _rows(tables: RunTables | None, name: str, checkpoint: str) -> pd.DataFrame | None:
    """Rows of table ``name`` of one checkpoint (a table without a ``checkpoint`` column
    holds the run's model alone, ``trained``)."""
    df = tables.table(name) if tables is not None else None
    if df is None:
        return None
    if "checkpoint" in df.columns:
        return df[df["checkpoint"] == checkpoint]
    return df if checkpoint == "trained" else df.iloc[0:0]


def _funnel(tables: RunTables | None, checkpoint: str) -> tuple[float, float]:
    if tables is None or not tables.has("cumulative"):
        return math.nan, math.nan
    try:
        return funnel_ends(tables, checkpoint)
    except (NotTested, TooLittleData):
        return math.nan, math.nan


def _funnel_sizes(tables: RunTables | None) -> tuple[float, float]:
    """The operators of the claims' funnel and the residual width (NaN where unknown)."""
    if tables is None or not tables.has("cumulative"):
        return math.nan, math.nan
    return (float(funnel_operators(tables) or math.nan),
            float(funnel_width(tables) or math.nan) if tables.has("eigenvalues") else math.nan)


def _replicates(tables: RunTables | None, checkpoint: str) -> pd.DataFrame | None:
    """The bootstrap replicates of the claims' funnel (:func:`~depthlens.report.statistics.funnel_replicates`),
    None where the run has no such funnel."""
    if tables is None or not tables.has("cumulative"):
        return None
    try:
        return funnel_replicates(tables, checkpoint)
    except (NotTested, TooLittleData):
        return None


def _summary(p: Point) -> dict:
    heads = _rows(p.tables, "heads", p.source)
    coupling = _rows(p.tables, "coupling", p.source)
    first, last = _funnel(p.tables, p.source)
    operators, width = _funnel_sizes(p.tables)
    out = {"erank_one_step": first, "erank_full_depth": last,
           "funnel_ratio": last / first if first > 0 else math.nan, "funnel_operators": operators, "width": width,
           "coupling_significant": np.nan, "coupling_tested": np.nan}
    if coupling is not None and len(coupling) and "significant" in coupling.columns:
        out["coupling_significant"] = float(coupling["significant"].astype(bool).sum())
        out["coupling_tested"] = float(len(coupling))
    for role in ("routing", "sink"):
        out[f"n_{role}"] = float((heads["role"] == role).sum()) if heads is not None and len(heads) else np.nan
    for score in ("prev_token_score", "induction_score", "sink_mass"):
        out[f"max_{score}"] = float(heads[score].max()) if heads is not None and len(heads) else np.nan
    sig = heads is not None and len(heads) and "null_q" in heads.columns
    out["n_significant_reserve"] = float((heads["null_q"] <= Q_LEVEL).sum()) if sig else np.nan
    return out


def _step0(points: list[Point]) -> tuple[float, pd.DataFrame | None, Point | None]:
    """The full-depth erank the series' checkpoints are compared with for B3, its bootstrap
    replicates and the point it is taken from: the step-0 checkpoint's, else the step-0 null
    (``init``) of the first checkpoint's run (with the replicates of every null of
    ``--init-seeds``; the point is then None)."""
    for p in points:
        if p.step == 0 and p.status != "failed":
            return _funnel(p.tables, p.source)[1], _replicates(p.tables, p.source), p
    for p in points:
        if p.status != "failed":
            return _funnel(p.tables, "init")[1], _replicates(p.tables, "init"), None
    return math.nan, None, None


def _step0_interval(reference: pd.DataFrame | None, p: Point, source: Point | None) -> tuple[float, float]:
    """95% percentile interval of ``funnel_step0_over`` at ``p``: over every pair of a reference
    replicate (and step-0 seed) with ``p``'s replicate of the same resampled chunks; exactly 1
    at the reference itself (``source``); unbounded without replicates."""
    if p is source:
        return 1.0, 1.0
    own = _replicates(p.tables, p.source)
    if reference is None or own is None or reference.empty or own.empty:
        return -math.inf, math.inf
    return percentile_interval(funnel_pair_ratios(reference, own))


def census_tables(points: list[Point], text: str) -> dict[str, pd.DataFrame]:
    """The ``census_heads`` and ``census`` tables of ``points`` (in training order within each
    series), identity columns first (model, revision, text)."""
    head_parts, rows = [], []
    for series in dict.fromkeys(p.series for p in points):
        members = [p for p in points if p.series == series]
        reference, replicates, source = _step0(members)
        for order, p in enumerate(members):
            ident = {"model": p.model, "revision": p.revision, "text": text, "series": series,
                     "replicate": p.replicate, "checkpoint": p.checkpoint, "step": p.step, "order": order}
            summary = _summary(p) if p.status != "failed" else {}
            last = summary.get("erank_full_depth", math.nan)
            lo, hi = _step0_interval(replicates, p, source) if p.status != "failed" else (-math.inf, math.inf)
            rows.append({**ident, "status": p.status, "error": p.error, "family": p.family, "norm": p.norm,
                         "loss": p.loss, **summary,
                         "funnel_step0_over": reference / last if last and last > 0 else math.nan,
                         "funnel_step0_over_lo": lo, "funnel_step0_over_hi": hi})
            heads = _rows(p.tables, "heads", p.source) if p.status != "failed" else None
            if heads is not None and len(heads):
                part = heads[["layer", "head", *[c for c in HEAD_COLUMNS if c in heads.columns]]].copy()
                for key, value in reversed(ident.items()):
                    part.insert(0, key, value)
                head_parts.append(part)
    census = pd.DataFrame(rows)
    heads = pd.concat(head_parts, ignore_index=True) if head_parts else pd.DataFrame(
        columns=["model", "revision", "text", "series", "replicate", "checkpoint", "step", "order", "layer", "head",
                 *HEAD_COLUMNS])
    heads["significant"] = heads["null_q"].astype(float) <= Q_LEVEL
    return {"census_heads": heads.reset_index(drop=True), "census": census}


def run_points(tables: RunTables) -> list[Point]:
    """The census points of one run with ``--revisions``: its step-0 null (``init``), its
    revisions in the order given, then the model as loaded (``trained``), each with the step
    its name carries (``init`` is step 0)."""
    manifest = tables.manifest
    config = manifest.get("config") or {}
    model = str(config.get("model", ""))
    main = str((manifest.get("model") or {}).get("revision") or config.get("revision") or "")
    points = []
    for name in checkpoint_order(tables):
        revision = {"init": "", "trained": main}.get(name, name)
        step = 0 if name == "init" else step_of(revision) if revision else None
        points.append(Point(model, name, model, revision, math.nan if step is None else float(step),
                            tables=tables, source=name))
    return points
