"""The report's figures of a checkpoint census (part C), drawn from the ``census`` and
``census_heads`` tables.

=================  ====  ======================================================================
name               part  what
=================  ====  ======================================================================
census_formation   C     role scores (formation) and significant reserve (consolidation) against
                         step, per head group, with the median onsets
census_funnel      C     full-depth erank, B3 ratio and loss against step
census_coupling    C     FDR-significant coupling boundaries against step
census_norms       C     where routing and sink heads, and their reserve, sit in each series
                         (e.g. LayerNorm against RMSNorm), at the last checkpoint
=================  ====  ======================================================================

The step axis is symmetric-log (linear below 1), so step 0 shows beside log-spaced steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .onsets import GROUPS, head_onsets
from .canvas import ROLE_COLOURS, Skip, need, new_figure
from ..runs.tables import RunTables

__all__ = ["CAPTIONS", "draw_census_coupling", "draw_census_formation", "draw_census_funnel", "draw_census_norms",
           "norm_placement"]

CAPTIONS: dict[str, str] = {
    "census_formation": (
        "Formation against consolidation over training, one panel per head group (heads grouped by their role at "
        "the last checkpoint: previous-token or induction score ≥ 0.3, else sink mass ≥ 0.5). Solid: the group's "
        "mean role score (formation); dashed: the fraction of the group whose excess reserve Δ_TR is significant "
        "(BH q ≤ 0.05) with the role's sign (consolidation). Vertical lines: median sustained onsets of each. "
        "Look for consolidation lines to the right of formation lines (claim C1). It draws the census's --model "
        "series; C1 also pools the layers of its --replicates."
    ),
    "census_funnel": (
        "The funnel over training: full-depth effective rank of the cumulative Jacobian (backward, rank-"
        "truncated, α = 1), B3's ratio of the step-0 erank to each checkpoint's (dotted line: the claim's "
        "threshold 5), and the loss on the census chunks. Look for the erank falling and the ratio crossing 5 as "
        "the loss falls (claim C2)."
    ),
    "census_coupling": (
        "FDR-significant topology–dynamics coupling boundaries per checkpoint (of the boundaries tested, "
        "grey). Look for a monotone rise with training (claim C3; the seed reports 0 → 14 → 24 layers)."
    ),
    "census_norms": (
        "Where the heads sit in each series at its last checkpoint, against relative depth (layer / (L − 1)): "
        "routing and sink heads per layer (top), and the mean excess reserve Δ_TR of each role per layer "
        "(bottom). With a LayerNorm and an RMSNorm series trained on the same data and seed, this is the "
        "seed's comparison of where the two families implement the same functions. Look for routing and sink "
        "heads, and the sign of their reserve, at other depths in the LayerNorm series than in the RMSNorm one."
    ),
}


def _primary(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["series"] == df["series"].iloc[0]].sort_values("order")


def _steps_axis(ax, steps: np.ndarray) -> None:
    """Symmetric-log step axis with plain tick labels (1000, not mathtext 10³, whose fonts a
    minimal matplotlib install lacks)."""
    ax.set_xscale("symlog", linthresh=1.0)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel("training step")
    if len(steps):
        ax.set_xlim(min(0.0, float(np.nanmin(steps))), float(np.nanmax(steps)) * 1.15 + 1)


def _x(df: pd.DataFrame) -> np.ndarray:
    """The step of each checkpoint, or its order where the name carries no step."""
    step = pd.to_numeric(df["step"], errors="coerce").to_numpy(dtype=float)
    return np.where(np.isfinite(step), step, pd.to_numeric(df["order"]).to_numpy(dtype=float))


def draw_census_formation(t: RunTables) -> Figure:
    heads = _primary(need(t.table("census_heads"), "census_heads.parquet", "series", "order", "step",
                          "prev_token_score", "induction_score", "sink_mass", "delta_TR1", "null_q"))
    onsets = head_onsets(heads)
    if onsets.empty:
        raise Skip("no head reaches a role threshold at the last checkpoint")
    groups = [g for g in GROUPS if (onsets["group"] == g).any()]
    fig = new_figure(4.2 * len(groups), 3.4)
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    by_order = heads.drop_duplicates("order").sort_values("order")
    x = _x(by_order)
    for ax, group in zip(axes, groups):
        members = onsets[onsets["group"] == group]
        score, sign = GROUPS[group]
        keyed = heads.merge(members[["layer", "head"]], on=["layer", "head"])
        per = keyed.groupby("order")
        mean = per[score].mean().reindex(by_order["order"]).to_numpy()
        consolidated = keyed.assign(ok=(keyed["null_q"] <= 0.05) & (np.sign(keyed["delta_TR1"]) == sign))
        frac = consolidated.groupby("order")["ok"].mean().reindex(by_order["order"]).to_numpy(dtype=float)
        colour = ROLE_COLOURS["sink" if group == "sink" else "routing"]
        ax.plot(x, mean, "-o", color=colour, ms=3, label=f"mean {score.replace('_', ' ')}")
        ax.plot(x, frac, "--s", color="black", ms=3, label=r"fraction significant $\Delta_\mathrm{TR}$")
        for col, style, what in (("formation_step", "-", "formation"), ("consolidation_step", "--", "consolidation")):
            onset = members[col].dropna()
            if len(onset):
                ax.axvline(float(onset.median()), color="grey", ls=style, lw=1, label=f"median {what} onset")
        _steps_axis(ax, x)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{group} heads (n = {len(members)})", fontsize=10)
        ax.legend(fontsize=7, loc="best")
    return fig


def draw_census_funnel(t: RunTables) -> Figure:
    census = _primary(need(t.table("census"), "census.parquet", "series", "order", "step", "status",
                           "erank_full_depth", "funnel_step0_over", "loss"))
    census = census[census["status"] != "failed"]
    if census.empty:
        raise Skip("every checkpoint failed")
    x = _x(census)
    fig = new_figure(11, 3.2)
    axes = fig.subplots(1, 3)
    panels = (("erank_full_depth", "full-depth erank"), ("funnel_step0_over", "step-0 erank / erank (B3)"),
              ("loss", "loss (nats per token)"))
    drawn = 0
    for ax, (col, label) in zip(axes, panels):
        y = pd.to_numeric(census[col], errors="coerce").to_numpy(dtype=float)
        if np.isfinite(y).any():
            ax.plot(x, y, "-o", ms=3, color="#1f77b4")
            drawn += 1
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
        if col == "funnel_step0_over":
            ax.axhline(5.0, color="grey", ls=":", lw=1)
        _steps_axis(ax, x)
        ax.set_ylabel(label)
    if not drawn:
        raise Skip("no checkpoint has a funnel or a loss (run the jacobian stage)")
    return fig


def draw_census_coupling(t: RunTables) -> Figure:
    census = _primary(need(t.table("census"), "census.parquet", "series", "order", "step", "status",
                           "coupling_significant", "coupling_tested"))
    census = census[(census["status"] != "failed") & census["coupling_significant"].notna()]
    if census.empty:
        raise Skip("no checkpoint has coupling counts (run the topology stage)")
    x = _x(census)
    fig = new_figure(5.5, 3.2)
    ax = fig.subplots()
    ax.plot(x, census["coupling_tested"].to_numpy(dtype=float), ":", color="grey", label="boundaries tested")
    ax.plot(x, census["coupling_significant"].to_numpy(dtype=float), "-o", ms=3, color="#1f77b4",
            label="FDR-significant")
    _steps_axis(ax, x)
    ax.set_ylabel("boundaries")
    ax.legend(fontsize=8)
    return fig


def norm_placement(census_heads: pd.DataFrame, census: pd.DataFrame) -> pd.DataFrame:
    """Per series (at its last checkpoint with heads) and layer: the relative depth, the counts
    of routing and sink heads and the mean Δ_TR of each role (NaN where a role has no head).

    Returns
    -------
    DataFrame
        Columns ``series``, ``norm``, ``checkpoint``, ``layer``, ``depth`` (layer / (L − 1)),
        ``n_routing``, ``n_sink``, ``delta_TR1_routing``, ``delta_TR1_sink``.
    """
    known = census[census["norm"].astype(str) != ""] if "norm" in census.columns else census.iloc[0:0]
    norms = known.groupby("series")["norm"].first().to_dict() if len(known) else {}
    rows = []
    for series, heads in census_heads.groupby("series", sort=False):
        last = heads[heads["order"] == heads["order"].max()]
        n_layers = int(last["layer"].max()) + 1
        for layer, group in last.groupby("layer"):
            row = {"series": series, "norm": norms.get(series, ""), "checkpoint": str(group["checkpoint"].iloc[0]),
                   "layer": int(layer), "depth": layer / max(1, n_layers - 1)}
            for role in ("routing", "sink"):
                mine = group[group["role"] == role]
                row[f"n_{role}"] = int(len(mine))
                row[f"delta_TR1_{role}"] = float(mine["delta_TR1"].mean()) if len(mine) else np.nan
            rows.append(row)
    return pd.DataFrame(rows)


def draw_census_norms(t: RunTables) -> Figure:
    heads = need(t.table("census_heads"), "census_heads.parquet", "series", "order", "layer", "role", "delta_TR1")
    census = need(t.table("census"), "census.parquet", "series", "norm")
    if heads["series"].nunique() < 2:
        raise Skip("the census has one series; pass --compare with a series of another family")
    table = norm_placement(heads, census)
    series = list(pd.unique(table["series"]))
    fig = new_figure(4.2 * len(series), 5.2)
    axes = fig.subplots(2, len(series), squeeze=False, sharey="row")
    for k, name in enumerate(series):
        part = table[table["series"] == name]
        width = 0.4 / max(1, len(part))
        for offset, role in ((-width / 2, "routing"), (width / 2, "sink")):
            axes[0, k].bar(part["depth"] + offset, part[f"n_{role}"], width=width, color=ROLE_COLOURS[role],
                           label=role)
            axes[1, k].plot(part["depth"], part[f"delta_TR1_{role}"], "-o", ms=3, color=ROLE_COLOURS[role],
                            label=role)
        axes[1, k].axhline(0.0, color="grey", lw=0.8)
        norm = part["norm"].iloc[0] if len(part) else ""
        axes[0, k].set_title(f"{name}" + (f" ({norm})" if norm else ""), fontsize=9)
        axes[0, k].set_ylabel("heads")
        axes[1, k].set_ylabel(r"mean $\Delta_\mathrm{TR}$ (nats)")
        axes[1, k].set_xlabel("relative depth")
        axes[0, k].legend(fontsize=7)
    return fig
