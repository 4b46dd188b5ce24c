"""Part B's statistics of topology–dynamics coupling (claims B5, B5b and B6): FDR-significant
boundaries per checkpoint in training order, their rise, their absence at init, and whether the
coupling's sign follows the operator type."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ...runs.tables import RunTables
from ...stats import proportion_interval, trend_interval
from .core import (Estimate, NotTested, SampleCounter, Statistic, TooLittleData, as_count, config_count,
                   finite_spearman, numeric, registrar, require_columns, select_rows)

STATISTICS: dict[str, Statistic] = {}
register = registrar(STATISTICS)


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
    n = as_count(topo.get("n_perm", (topo.get("options") or {}).get("n_perm")))
    return n if n is not None else config_count(t, "n_perm")


def _significant(t: RunTables, checkpoint: str) -> pd.Series:
    df = select_rows(t.table("coupling"), "coupling.parquet", checkpoint=checkpoint)
    require_columns(df, "coupling.parquet", "significant")
    return df["significant"].astype(bool)


def checkpoint_order(t: RunTables) -> list[str]:
    """The run's checkpoints in training order: ``init`` (step 0), the extra revisions as the
    run listed them (a run option; in the jacobian section of runs made before), then
    ``trained`` (the final weights)."""
    config = t.manifest.get("config") or {}
    revisions = config.get("revisions") or (config.get("jacobian") or {}).get("revisions") or []
    return ["init", *[str(r) for r in revisions], "trained"]


def _tested(t: RunTables, checkpoint: str) -> pd.DataFrame:
    return select_rows(t.table("coupling"), "coupling.parquet", checkpoint=checkpoint)


@register("coupling_monotone_rise", ["coupling"],
          "Spearman rank correlation between training order (init, the revisions, trained) and the number of "
          "FDR-significant coupling boundaries per checkpoint, with its resampling spread (parametric bootstrap of "
          "each checkpoint's count among its tested boundaries, 95% interval); needs at least 3 checkpoints.",
          samples={"boundaries": _boundaries("trained", "init"), "permutations": _permutations})
def _monotone_rise(t: RunTables) -> Estimate:
    df = t.table("coupling")
    require_columns(df, "coupling.parquet", "checkpoint", "significant")
    present = [c for c in checkpoint_order(t) if c in set(df["checkpoint"])]
    if len(present) < 3:
        raise NotTested(f"only {len(present)} checkpoint(s) ({', '.join(present)}); a monotone rise needs "
                        "at least 3", needs="--revisions")
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
        df = select_rows(t.table("coupling"), "coupling.parquet", checkpoint="trained")
        require_columns(df, "coupling.parquet", "effect", column)
        return finite_spearman(numeric(df[column]) * sign, numeric(df["effect"]),
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
        df = select_rows(t.table("coupling"), "coupling.parquet", checkpoint="trained")
        require_columns(df, "coupling.parquet", "effect", "significant", column)
        kind = sign * numeric(df[column])
        symmetric = kind > np.nanmedian(kind)
        sig = df["significant"].astype(bool).to_numpy() & np.isfinite(kind) & (numeric(df["effect"]) != 0)
        if not sig.any():
            raise TooLittleData("no trained boundary has significant coupling")
        agree = np.where(symmetric, numeric(df["effect"]) > 0, numeric(df["effect"]) < 0)[sig]
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
