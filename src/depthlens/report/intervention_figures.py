"""The report's figures of the interventions and the contest (§A7), drawn from the
ablate, clamp and contest stages' tables.

=====================  ====  ==================================================================
name                   part  what
=====================  ====  ==================================================================
criticality            A     ablation criticality ΔCE of every head against its reserve TR1, by role
clamp_dose             A     head-mean sink mass and Δ_TR against the clamp dose α, with the control
contest                A     cross-validated score per feature family and target; drop-one deltas
=====================  ====  ==================================================================
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .canvas import ROLE_COLOURS, Skip, need, new_figure
from ..runs.tables import RunTables

__all__ = ["CAPTIONS", "draw_clamp_dose", "draw_contest", "draw_criticality"]

CAPTIONS: dict[str, str] = {
    "criticality": (
        "Ablation criticality ΔCE (the cross-entropy change when the head's output is mean-ablated, nats per "
        "token on held-out chunks, with its bootstrap interval) against the head's transient reserve "
        "TR1 = log K(B), coloured by role; symmetric-log vertical axis. Look for whether reserve says "
        "anything about which heads matter: the seed paper reports that no single operator summary "
        "predicts criticality."
    ),
    "clamp_dose": (
        "The clamp chain: head-mean sink mass (left) and excess reserve Δ_TR (right) over the heads of the "
        "clamped layers, against the dose α (the massive entries at the first token set to α·value; α = 0 "
        "is the zero arm, α = 1 the unclamped model), for the massive dimensions (solid) and the random "
        "ordinary-dimension controls (grey, dashed: the first control seed at every dose, the others at the "
        "zero arm and α = 1 unless --control-curves every); the mean arm is a diamond at the right. Look for "
        "sink mass falling with α → 0 and Δ_TR rising for the massive clamp, and flat control curves."
    ),
    "contest": (
        "The feature-family contest: out-of-fold score (AUROC for routing identity, Spearman for the "
        "others; grouped K-fold by layer) of each family P (pattern), E (eigenvalues), S (norms), "
        "R (resolvent) and of all four, with layer-bootstrap 95% intervals (top); and the drop of the "
        "score when one family is left out of all four (bottom; ★ = required: the interval above 0 and the drop significant, q ≤ 0.05). "
        "Look for R being required for persistence and routing, and no family predicting criticality."
    ),
}


def draw_criticality(t: RunTables) -> Figure:
    """Criticality against TR1 by role (the ``mean`` ablation when the run has it)."""
    abl = need(t.table("ablation"), "ablation.parquet", "layer", "head", "method", "criticality")
    heads = need(t.trained("heads"), "heads.parquet", "layer", "head", "TR1")
    methods = [str(m) for m in pd.unique(abl["method"])]
    method = "mean" if "mean" in methods else methods[0]
    keep = [c for c in ("layer", "head", "TR1", "role") if c in heads.columns]
    df = abl[abl["method"] == method].merge(heads[keep], on=["layer", "head"], how="inner")
    if df.empty:
        raise Skip("no head is in both ablation.parquet and heads.parquet")
    if "role" not in df.columns:
        df = df.assign(role="other")
    fig = new_figure(5.6, 4.4)
    ax = fig.subplots()
    for role, group in df.groupby("role", sort=True):
        y = group["criticality"].to_numpy(float)
        err = None
        if {"criticality_lo", "criticality_hi"} <= set(group.columns) and group["criticality_lo"].notna().any():
            err = np.abs(np.vstack([y - group["criticality_lo"].to_numpy(float),
                                    group["criticality_hi"].to_numpy(float) - y]))
        ax.errorbar(group["TR1"].to_numpy(float), y, yerr=err, fmt="o", ms=3.5, lw=0.6, alpha=0.8,
                    color=ROLE_COLOURS.get(str(role), "#9a9a9a"), label=f"{role} ({len(group)})")
    finite = np.abs(df["criticality"].to_numpy(float))
    finite = finite[np.isfinite(finite) & (finite > 0)]
    ax.set_yscale("symlog", linthresh=float(np.quantile(finite, 0.1)) if finite.size else 1e-3)
    ax.axhline(0.0, color="0.5", lw=0.6)
    ax.set_xlabel("transient reserve TR1 = log K(B)")
    ax.set_ylabel(f"criticality ΔCE ({method} ablation, nats/token)")
    ax.set_title("Ablation criticality against reserve", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def draw_clamp_dose(t: RunTables) -> Figure:
    """Head-mean sink mass and Δ_TR against α for the massive clamp and its controls."""
    df = need(t.table("clamp"), "clamp.parquet", "target", "seed", "arm", "alpha", "sink_mass", "delta_TR1")
    fig = new_figure(9.0, 3.8)
    axes = fig.subplots(1, 2)
    for ax, column, label in ((axes[0], "sink_mass", "head-mean sink mass"),
                              (axes[1], "delta_TR1", r"head-mean excess reserve $\Delta_\mathrm{TR}$ (nats)")):
        for (target, seed), group in df.groupby(["target", "seed"], sort=True):
            massive = target == "massive"
            style = {"color": "#d62728" if massive else "0.55", "ls": "-" if massive else "--",
                     "lw": 1.6 if massive else 0.9}
            dose = group[group["arm"] == "dose"].sort_values("alpha")
            dose = dose[np.isfinite(dose[column].to_numpy(float))]
            name = "massive dims" if massive else f"control, seed {seed}"
            if len(dose):
                ax.plot(dose["alpha"], dose[column], marker="o", ms=3.5, label=name, **style)
            mean = group[(group["arm"] == "mean") & np.isfinite(group[column].to_numpy(float))]
            if len(mean):
                ax.plot([1.08] * len(mean), mean[column], marker="D", ms=5, ls="none", color=style["color"])
        ax.set_xticks([0, 0.25, 0.5, 0.75, 1.0, 1.08], ["0\n(zero)", "0.25", "0.5", "0.75", "1\n(none)", "mean"],
                      fontsize=8)
        ax.set_xlabel("dose α")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle("Clamp chain: massive dimensions at the first token", fontsize=10)
    return fig


_SINGLE = ("P", "E", "S", "R", "all")
_DROP = ("all-P", "all-E", "all-S", "all-R")


def draw_contest(t: RunTables) -> Figure:
    """Scores per family and target (top) and drop-one deltas (bottom), with intervals."""
    df = need(t.table("contest"), "contest.parquet", "target", "features", "metric", "score", "score_lo",
              "score_hi", "delta", "delta_lo", "delta_hi", "required")
    targets = [str(x) for x in pd.unique(df["target"])]
    fig = new_figure(3.4 * len(targets) + 0.6, 5.6)
    axes = np.asarray(fig.subplots(2, len(targets), squeeze=False))
    for j, target in enumerate(targets):
        rows = df[df["target"] == target].set_index("features")
        top, bottom = axes[0, j], axes[1, j]
        single = [f for f in _SINGLE if f in rows.index]
        score = rows.loc[single, "score"].to_numpy(float)
        err = np.abs(np.vstack([score - rows.loc[single, "score_lo"].to_numpy(float),
                                rows.loc[single, "score_hi"].to_numpy(float) - score]))
        top.bar(range(len(single)), score, yerr=err, color=["#4c72b0", "#55a868", "#c44e52", "#8172b2", "0.35"][
            : len(single)], capsize=3)
        top.set_xticks(range(len(single)), single)
        metric = str(rows["metric"].iloc[0])
        top.axhline(0.5 if metric == "auroc" else 0.0, color="0.4", lw=0.7, ls="--")
        top.set_title(f"{target} ({metric})", fontsize=9)
        drop = [f for f in _DROP if f in rows.index]
        delta = rows.loc[drop, "delta"].to_numpy(float)
        derr = np.abs(np.vstack([delta - rows.loc[drop, "delta_lo"].to_numpy(float),
                                 rows.loc[drop, "delta_hi"].to_numpy(float) - delta]))
        bottom.bar(range(len(drop)), delta, yerr=derr, color="0.6", capsize=3)
        for k, required in enumerate(rows.loc[drop, "required"].to_numpy(bool)):
            if required:
                bottom.text(k, float(rows.loc[drop[k], "delta_hi"]), "★", ha="center", va="bottom", fontsize=11)
        bottom.axhline(0.0, color="0.4", lw=0.7)
        bottom.set_xticks(range(len(drop)), [f"−{f[4:]}" for f in drop])
        if j == 0:
            top.set_ylabel("out-of-fold score")
            bottom.set_ylabel("score(all) − score(all − X)")
    fig.suptitle("Feature-family contest (grouped K-fold by layer, layer-bootstrap 95% intervals)", fontsize=10)
    return fig
