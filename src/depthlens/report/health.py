"""The numerical health of a run: structural facts and numerical checks, not claims.

The mask pins K(A) = √n for every causal stochastic matrix with a simple Perron root
(docs/methods.md#a2): a theorem, so a miss is a numerical problem, not a finding. Beside it: how many Kreiss
brackets were certified and whether the search values lie inside them, which LAPACK drivers
fell back, which rows no driver could compute, and which heads were aggregated by a plain
median instead of a median of logs. Each check reads tables, summaries and the manifest only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .statistics import compute_statistic
from ..runs.tables import RunTables

__all__ = ["HealthCheck", "health_table", "numerical_health"]


@dataclass(frozen=True)
class HealthCheck:
    """One line of the numerical-health section.

    Attributes
    ----------
    name : str
        What is checked.
    value : str
        What the run shows (``—`` when its inputs are missing).
    ok : bool or None
        True when the check passes, False when it does not, None when it could not be made.
    detail : str
        How to read it, or why it could not be made.
    """

    name: str
    value: str
    ok: bool | None
    detail: str


def numerical_health(tables: RunTables) -> list[HealthCheck]:
    """Every check of the module docstring for the run behind ``tables``."""
    return [_kreiss_pinned(tables), _brackets(tables), _fallbacks(tables), _failed_rows(tables),
            _plain_medians(tables)]


def _kreiss_pinned(t: RunTables) -> HealthCheck:
    name = "K(A) = √n for simple Perron roots (§A2, a theorem)"
    value, note = compute_statistic("kreiss_A_pinned_fraction", t)
    if value is None or np.isnan(value):
        return HealthCheck(name, "—", None, note or "no matrix with a simple Perron root")
    flagged = (t.json("attention") or {}).get("kreiss_A_flagged_matrices")
    detail = "fraction of such matrices whose K(A) search reached √n"
    if flagged is not None:
        detail += f"; {flagged} matrices flagged"
    return HealthCheck(name, f"{value:.4f}", value >= 0.99, detail)


def _brackets(t: RunTables) -> HealthCheck:
    name = "certified Kreiss brackets"
    health = (t.json("attention") or {}).get("numerical_health")
    if not isinstance(health, dict) or "brackets" not in health:
        return HealthCheck(name, "—", None, t.why_missing("attention.json") if not t.has("attention.json")
                           else "attention.json records no brackets (--certify none)")
    n, violations = int(health.get("brackets", 0)), int(health.get("bracket_violations", 0))
    uncertified = int(health.get("uncertified", 0))
    return HealthCheck(name, f"{n} brackets, {uncertified} uncertified, {violations} search values outside",
                       violations == 0,
                       "each certified chunk's search value K(B) must lie in its bracket; an uncertified "
                       "bracket stopped at its evaluation budget and is valid but wider")


def _fallbacks(t: RunTables) -> HealthCheck:
    name = "LAPACK driver fallbacks"
    stages = t.manifest.get("stages")
    if not isinstance(stages, dict):
        return HealthCheck(name, "—", None, "manifest.json is absent or records no stages")
    per_stage = {s: int(r.get("fallbacks", 0)) for s, r in stages.items() if isinstance(r, dict)}
    total = sum(per_stage.values())
    detail = ", ".join(f"{s}: {n}" for s, n in per_stage.items() if n) or "every result came from the first driver"
    return HealthCheck(name, str(total), None if total else True, detail)


def _failed_rows(t: RunTables) -> HealthCheck:
    name = "rows no decomposition driver could compute"
    counts = {}
    for table in ("head_chunks", "operators", "cumulative", "funnel_boot"):
        df = t.table(table)
        if df is not None and "failure" in df.columns:
            counts[table] = int(df["failure"].notna().sum())
    if not counts:
        return HealthCheck(name, "—", None, "no table with a failure column")
    total = sum(counts.values())
    return HealthCheck(name, str(total), total == 0, ", ".join(f"{k}: {v}" for k, v in counts.items()))


def _plain_medians(t: RunTables) -> HealthCheck:
    name = "heads aggregated by a plain median"
    heads = t.trained("heads")
    if heads is None or "plain_median" not in heads.columns:
        return HealthCheck(name, "—", None, "heads.parquet lacks plain_median")
    used = heads["plain_median"].fillna("").astype(str)
    n = int((used != "").sum())
    quantities = sorted({q for v in used for q in v.split(",") if q})
    return HealthCheck(name, f"{n} of {len(heads)}", None if n else True,
                       "a scale quantity with a value ≤ 0 cannot take the median of logs"
                       + (f" ({', '.join(quantities)})" if quantities else ""))


def health_table(checks: list[HealthCheck]) -> pd.DataFrame:
    """The checks as a table (for notebooks): name, value, ok, detail."""
    return pd.DataFrame([c.__dict__ for c in checks], columns=["name", "value", "ok", "detail"])
