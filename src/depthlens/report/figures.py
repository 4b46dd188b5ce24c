"""The report's figures, drawn from a run's tables into ``RUN/figures/NAME.png``.

Every figure reads tables, summaries and arrays only (nothing is recomputed). A figure whose
inputs are missing is skipped (``None``), never an error. Figures are drawn on
:class:`matplotlib.figure.Figure` objects with the Agg canvas, so no pyplot state or GUI
backend is involved.

Figures (part A: attention; part B: residual stream):

=====================  ====  ==================================================================
name                   part  what
=====================  ====  ==================================================================
pseudospectra          A     ε-pseudospectra of B for the most routing-like and most sink-like heads
attention_patterns     A     the chosen heads' attention matrices (:mod:`.pattern_figures`)
transient_reserve      A     TR1 = log K(B) per head against its matched-null mean, by role
depth_products         A     ‖D‖ and the eigenvalue predictions E1, E2 against depth
criticality            A     ablation criticality against TR1 (:mod:`.intervention_figures`)
clamp_dose             A     sink mass and Δ_TR against the clamp dose, with the control
contest                A     the feature-family contest: scores and drop-one deltas
residual_profile       B     residual RMS, largest |h| and massive activations by layer (:mod:`.residual_figures`)
eigenvalue_clouds      B     eigenvalues of the mean Jacobians, early / middle / late layer
operator_profile       B     complex_frac, henrici_update_rel, symmetry against depth
cumulative_erank       B     erank of the cumulative Jacobian for every Schur-split α
coupling               B     heatmap of the coupling effect, layer × (checkpoint, sub-layer), FDR marks
=====================  ====  ==================================================================
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from ..runs.atomic import atomic_path
from .canvas import DPI, MAX_WIDTH, ROLE_COLOURS, Skip, need, new_figure, prefer
from .statistics.residual import exact_rows
from .census_figures import CAPTIONS as CENSUS_CAPTIONS
from .census_figures import draw_census_coupling, draw_census_formation, draw_census_funnel, draw_census_norms
from .intervention_figures import CAPTIONS as INTERVENTION_CAPTIONS
from .intervention_figures import draw_clamp_dose, draw_contest, draw_criticality
from .lens_figures import CAPTIONS as LENS_CAPTIONS
from .lens_figures import draw_lens_readout
from .pattern_figures import CAPTIONS as PATTERN_CAPTIONS
from .pattern_figures import draw_attention_patterns
from .residual_figures import CAPTIONS as RESIDUAL_CAPTIONS
from .residual_figures import draw_residual_profile, draw_transport_funnel
from ..runs.tables import RunTables

FIGURES_DIR = "figures"
CHECKPOINT_STYLES = {"trained": "-", "init": "--"}
PSEUDO_EPS = (1e-3, 1e-2, 1e-1)

#: What to look for in each figure (shown under it in the report).
CAPTIONS: dict[str, str] = {
    "schur_split": (
        "Effective rank of the cumulative Jacobian at full depth (backward accumulation, truncated to rank "
        "512 when the run computed it, as in the paper's figure) against α, the scale of the non-normal part "
        "N in J(α) = Q(Λ + αN)Q*, for the trained model (solid) and its step-0 null (dashed), one colour per "
        "Schur order. The split is basis-dependent: reordering the Schur form changes Q and with it J(0), so "
        "the α = 0 end differs between orders while α = 1 is the real product. Look for the trained curve "
        "rising towards α = 0 (removing N dissolves the funnel) and for how much that depends on the order."
    ),
    "pseudospectra": (
        "ε-pseudospectra of the Perron-deflated operator B = A − P for the head with the largest "
        "previous-token or induction score and the head with the largest sink mass, each on its "
        "median chunk (a panel title calls it a routing or sink head only when it has that role, "
        "and otherwise names its actual role): contours of σ_min(zI − B) at ε = 1e-3, 1e-2, 1e-1, "
        "eigenvalues (the self-attention weights) as dots, unit circle dashed. Look for contours "
        "that bulge far beyond the eigenvalues (and past the unit circle) for the routing head: "
        "that is transient reserve the spectrum does not show; a sink head's contours should "
        "hug its eigenvalues more tightly."
    ),
    "transient_reserve": (
        "Transient reserve TR1 = log K(B) of every head against the mean over its matched "
        "shuffle nulls (same row weights and spectrum), coloured by role; outlined points are "
        "BH-significant. Points above the diagonal carry excess reserve. Look for routing heads "
        "above the line and sink heads below it (signed organisation)."
    ),
    "depth_products": (
        "Norm of the surviving depth deviation ‖D‖ = ‖B_L ⋯ B_1‖ (median over chunks) against "
        "the eigenvalue predictions E1 = ρ(D) and E2 = Π ρ(B_l), for the model (solid) and its "
        "matched nulls (dashed), log scale. Look for ‖D‖ separating from E1/E2 by many orders "
        "of magnitude on the model but not on the nulls. Where a prediction is exactly 0 the "
        "gap is infinite and that point is not drawn (noted in the panel)."
    ),
    "eigenvalue_clouds": (
        "Eigenvalues of the mean sub-layer Jacobians J = I + U of the trained model at an "
        "early, a middle and the last layer (attention ○, MLP ×; step-0 model in grey behind), "
        "unit circle dashed. Look for complex-conjugate clouds (rotation) in early layers that "
        "collapse onto the real axis (near-symmetric operators) late."
    ),
    "operator_profile": (
        "Operator type against depth (sub-layer index: attention then MLP of each layer): "
        "fraction of complex eigenvalues, relative Henrici departure of the update U, and "
        "symmetry of J, trained (solid) beside step 0 (dashed). Look for a monotone gradient "
        "from non-normal, rotation-heavy early layers to near-symmetric late layers in the "
        "trained model and its absence at init."
    ),
    "cumulative_erank": (
        "Effective rank of the cumulative Jacobian C(0→b) (forward, least truncation) against "
        "depth for every Schur-split α (α = 1: the real operators; α = 0: non-normal part "
        "removed), trained solid, step 0 dashed. Look for a funnel (erank falling by an order of "
        "magnitude) at α = 1 in the trained model only, largely removed at α = 0."
    ),
    "coupling": (
        "Coupling between topology and dynamics as a heatmap: one column per layer, one row per "
        "checkpoint and sub-layer (the boundary feeding its attention or its MLP); colour is the "
        "rank-biserial effect of boundary-node versus interior Jacobian amplification (red: "
        "boundary units amplify more, blue: less, grey: missing); a star marks boundaries that are "
        "significant after BH-FDR. Look for significant boundaries in the "
        "trained model and none at init, with the sign following the operator type."
    ),
}


CAPTIONS.update(INTERVENTION_CAPTIONS)
CAPTIONS.update(LENS_CAPTIONS)
CAPTIONS.update(CENSUS_CAPTIONS)
CAPTIONS.update(PATTERN_CAPTIONS)
CAPTIONS.update(RESIDUAL_CAPTIONS)


@dataclass(frozen=True)
class FigureSpec:
    """A figure: its name, report part (``A``/``B``/``C``), title, the run outputs it reads and
    its drawing function ``draw(tables) -> Figure`` (raising :class:`Skip` when it cannot)."""

    name: str
    part: str
    title: str
    needs: tuple[str, ...]
    draw: Callable[[RunTables], Figure]

    @property
    def caption(self) -> str:
        return CAPTIONS[self.name]


# ---------------------------------------------------------------------------------------
# helpers
def _unit_circle(ax) -> None:
    t = np.linspace(0, 2 * np.pi, 361)
    ax.plot(np.cos(t), np.sin(t), ls="--", lw=0.8, color="0.4", zorder=1)


def _checkpoint_style(checkpoint: str) -> str:
    return CHECKPOINT_STYLES.get(checkpoint, ":")


def _checkpoints(df: pd.DataFrame) -> list[str]:
    present = [str(c) for c in pd.unique(df["checkpoint"])]
    return sorted(present, key=lambda c: (c != "trained", c != "init", c))


def _sublayer_index(df: pd.DataFrame) -> np.ndarray:
    return 2 * df["layer"].to_numpy() + (df["sublayer"].to_numpy() == "mlp")


# ---------------------------------------------------------------------------------------
# part A
#: What picked each pseudospectra panel's head (the stage picks by score, whatever the roles).
_PICKED_BY = {"routing": "largest previous-token/induction score", "sink": "largest sink mass"}


def _head_role(t: RunTables, meta: dict[str, str], pick: str) -> str | None:
    """The role (heads.parquet) of the head of panel ``pick``, or None when unknown."""
    heads = t.trained("heads")
    if heads is None or not {"layer", "head", "role"} <= set(heads.columns):
        return None
    try:
        layer, head = int(meta[f"{pick}.layer"]), int(meta[f"{pick}.head"])
    except (KeyError, TypeError, ValueError):
        return None
    match = heads.loc[(heads["layer"] == layer) & (heads["head"] == head), "role"]
    return str(match.iloc[0]) if len(match) else None


def _panel_label(pick: str, role: str | None, where: str) -> str:
    """``"routing head (…)"`` only when the picked head has that role; otherwise what picked it
    and its actual role (a random model has no routing or sink heads)."""
    if role == pick:
        return f"{pick} head ({where})"
    return f"{_PICKED_BY[pick]} ({where}; role: {role or 'unknown'})"


def draw_pseudospectra(t: RunTables) -> Figure:
    loaded = t.arrays("pseudospectra")
    if loaded is None:
        raise Skip("arrays/pseudospectra.safetensors is absent")
    arrays, meta = loaded
    roles = [r for r in ("routing", "sink") if all(f"{r}.{k}" in arrays for k in ("x", "y", "sigma"))]
    if not roles:
        raise Skip("arrays/pseudospectra.safetensors holds no routing or sink grid")
    fig = new_figure(5.0 * len(roles), 4.6)
    axes = fig.subplots(1, len(roles), squeeze=False)[0]
    for ax, role in zip(axes, roles):
        actual = _head_role(t, meta, role)
        colour = ROLE_COLOURS[actual] if actual in ("routing", "sink") else "#ff7f0e"  # visible on grey
        x, y = np.asarray(arrays[f"{role}.x"], float), np.asarray(arrays[f"{role}.y"], float)
        sigma = np.asarray(arrays[f"{role}.sigma"], float)
        if sigma.shape != (y.size, x.size):
            raise Skip(f"{role}.sigma has shape {sigma.shape}, expected {(y.size, x.size)}")
        logs = np.log10(np.maximum(sigma, 1e-300))
        finite = logs[np.isfinite(logs)]
        mesh = ax.pcolormesh(x, y, np.clip(logs, -4, 0.5), cmap="Greys_r", shading="auto", vmin=-4, vmax=0.5)
        levels = [math.log10(e) for e in PSEUDO_EPS if finite.size and finite.min() < math.log10(e) < finite.max()]
        if levels:
            cs = ax.contour(x, y, logs, levels=levels, colors=["#08519c", "#3182bd", "#9ecae1"][: len(levels)],
                            linewidths=1.2)
            ax.clabel(cs, fmt={lv: f"ε=1e{round(lv)}" for lv in levels}, fontsize=7)
        _unit_circle(ax)
        eig = np.asarray(arrays.get(f"{role}.eig", np.empty(0)))
        if eig.size:
            ax.plot(np.real(eig), np.imag(eig) if np.iscomplexobj(eig) else np.zeros(eig.size), "o",
                    ms=3, color=colour, label="eigenvalues of B")
            ax.legend(loc="upper right", fontsize=7)
        where = f"layer {meta.get(f'{role}.layer', '?')}, head {meta.get(f'{role}.head', '?')}"
        ax.set_title(_panel_label(role, actual, where), fontsize=9)
        ax.set_xlabel("Re z")
        ax.set_ylabel("Im z")
        ax.set_aspect("equal")
        ax.set_xlim(x.min(), x.max())
        ax.set_ylim(y.min(), y.max())
    fig.colorbar(mesh, ax=list(axes), shrink=0.8, label=r"$\log_{10}\,\sigma_{\min}(zI - B)$")
    return fig


def draw_transient_reserve(t: RunTables) -> Figure:
    df = need(t.trained("heads"), "heads.parquet", "TR1", "null_TR1_mean")
    df = df[np.isfinite(df["TR1"].astype(float)) & np.isfinite(df["null_TR1_mean"].astype(float))]
    if df.empty:
        raise Skip("no head has both TR1 and a null mean")
    roles = df["role"].astype(str) if "role" in df.columns else pd.Series("other", index=df.index)
    sig = (df["null_q"].astype(float) <= 0.05) if "null_q" in df.columns else pd.Series(False, index=df.index)
    fig = new_figure(5.4, 4.6)
    ax = fig.subplots()
    lo = float(min(df["TR1"].min(), df["null_TR1_mean"].min()))
    hi = float(max(df["TR1"].max(), df["null_TR1_mean"].max()))
    pad = 0.05 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], ls="--", lw=0.8, color="0.4", label="no excess")
    for role in sorted(pd.unique(roles), key=lambda r: (r not in ROLE_COLOURS, r)):
        mask = roles == role
        colour = ROLE_COLOURS.get(role, "#7f7f7f")
        ax.scatter(df.loc[mask, "null_TR1_mean"], df.loc[mask, "TR1"], s=22, color=colour,
                   edgecolors=np.where(sig[mask], "black", "none"), linewidths=0.9,
                   label=f"{role} ({int(mask.sum())})", zorder=3)
    ax.set_xlabel("null mean of TR1 (matched shuffle)")
    ax.set_ylabel("TR1 = log K(B)")
    ax.set_title("Transient reserve against matched null", fontsize=10)
    ax.legend(fontsize=8)
    return fig


_OPERATOR_ORDER = ("mean", "rollout", "chain_routing", "chain_sink")


def draw_depth_products(t: RunTables) -> Figure:
    df = need(t.trained("depth"), "depth.parquet", "operator", "source", "depth", "norm_D", "e1", "e2")
    ops = sorted(pd.unique(df["operator"]).astype(str), key=lambda o: (o not in _OPERATOR_ORDER,
                 _OPERATOR_ORDER.index(o) if o in _OPERATOR_ORDER else 0, o))
    fig = new_figure(4.3 * min(len(ops), 2), 3.6 * math.ceil(len(ops) / 2))
    axes = fig.subplots(math.ceil(len(ops) / 2), min(len(ops), 2), squeeze=False).ravel()
    for ax in axes[len(ops):]:
        ax.set_visible(False)
    colours = {"norm_D": "black", "e1": "#ff7f0e", "e2": "#2ca02c"}
    labels = {"norm_D": "‖D‖", "e1": "E1 = ρ(D)", "e2": r"E2 = $\prod_l\,\rho(B_l)$"}
    for ax, op in zip(axes, ops):
        sub = df[df["operator"] == op]
        notes = []
        for source in ("model", "null"):
            part = sub[sub["source"] == source]
            if part.empty:
                continue
            med = part.groupby("depth")[["norm_D", "e1", "e2"]].median().sort_index()
            for col in ("norm_D", "e1", "e2"):
                vals = med[col].to_numpy(float)
                ok = np.isfinite(vals) & (vals > 0)
                if not ok.all():
                    bad = med.index[~ok].tolist()
                    notes.append(f"{source} {labels[col].split(' ')[0]} = 0 at depth {_ranges(bad)} (gap = ∞)")
                y = np.where(ok, vals, np.nan)
                ax.plot(med.index, y, ls="-" if source == "model" else "--", marker="o", ms=3, color=colours[col])
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("depth (layers)")
        ax.set_title(f"operator: {op}", fontsize=9)
        if notes:
            ax.text(0.02, 0.02, "\n".join(notes[:4]), transform=ax.transAxes, fontsize=6.5, va="bottom",
                    color="#a00000")
    handles = [Line2D([], [], color=colours[c], label=labels[c]) for c in colours]
    handles += [Line2D([], [], color="0.3", ls="-", label="model"), Line2D([], [], color="0.3", ls="--", label="null")]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=7)
    return fig


def _ranges(values: list[int]) -> str:
    values = sorted(int(v) for v in values)
    if len(values) <= 3:
        return ", ".join(map(str, values))
    return f"{values[0]}–{values[-1]}"


# ---------------------------------------------------------------------------------------
# part B
def draw_eigenvalue_clouds(t: RunTables) -> Figure:
    df = need(t.table("eigenvalues"), "eigenvalues.parquet", "checkpoint", "jacobian_mode", "layer", "sublayer", "re", "im")
    df, mode = prefer(df, "jacobian_mode", "isolated")
    df = df[df["sublayer"].isin(("attn", "mlp"))]  # the sub-layer operators (not the full-layer products)
    trained, checkpoint = prefer(df, "checkpoint", "trained")
    init = df[df["checkpoint"] == "init"] if checkpoint != "init" else df.iloc[:0]
    layers = sorted(pd.unique(trained["layer"]))
    picks = list(dict.fromkeys([layers[0], layers[len(layers) // 2], layers[-1]]))
    names = ["early", "middle", "late"] if len(picks) == 3 else ["early", "late"][: len(picks)]
    fig = new_figure(3.8 * len(picks), 3.9)
    axes = fig.subplots(1, len(picks), squeeze=False)[0]
    markers = {"attn": "o", "mlp": "x"}
    for ax, layer, name in zip(axes, picks, names):
        ref = init[init["layer"] == layer]
        if not ref.empty:
            ax.scatter(ref["re"], ref["im"], s=6, color="0.75", label="init", zorder=1)
        for sub, marker in markers.items():
            part = trained[(trained["layer"] == layer) & (trained["sublayer"] == sub)]
            if not part.empty:
                ax.scatter(part["re"], part["im"], s=10, marker=marker, linewidths=0.8,
                           facecolors="none" if marker == "o" else None,
                           edgecolors="#1f77b4" if marker == "o" else None,
                           color=None if marker == "o" else "#d62728", label=sub, zorder=2)
        _unit_circle(ax)
        ax.axhline(0, lw=0.5, color="0.6")
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_title(f"{name}: layer {layer} ({checkpoint}, {mode})", fontsize=9)
        ax.set_xlabel("Re λ")
        ax.set_ylabel("Im λ")
        ax.legend(fontsize=7)
    return fig


_PROFILE = (("complex_frac", "complex eigenvalue fraction"), ("henrici_update_rel", "Henrici departure of U (rel.)"),
            ("symmetry", "symmetry of J"))


def draw_operator_profile(t: RunTables) -> Figure:
    df = need(t.table("operators"), "operators.parquet", "checkpoint", "jacobian_mode", "layer", "sublayer")
    cols = [(c, label) for c, label in _PROFILE if c in df.columns]
    if not cols:
        raise Skip("operators.parquet has none of complex_frac, henrici_update_rel, symmetry")
    df, mode = prefer(df, "jacobian_mode", "isolated")
    df = df[df["sublayer"].isin(("attn", "mlp"))]  # the sub-layer operators (not the full-layer products)
    fig = new_figure(4.0 * len(cols), 3.5)
    axes = fig.subplots(1, len(cols), squeeze=False)[0]
    for ax, (col, label) in zip(axes, cols):
        for checkpoint in _checkpoints(df):
            part = df[df["checkpoint"] == checkpoint].assign(pos=lambda d: _sublayer_index(d)).sort_values("pos")
            line = ax.plot(part["pos"], part[col].astype(float), ls=_checkpoint_style(checkpoint), label=checkpoint)[0]
            for sub, marker in (("attn", "o"), ("mlp", "s")):
                pts = part[part["sublayer"] == sub]
                ax.plot(pts["pos"], pts[col].astype(float), ls="none", marker=marker, ms=3.5, color=line.get_color())
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("sub-layer index 2·layer + (mlp)  (attn ●, mlp ■)")
        ax.set_title(f"{label} ({mode})", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def _cumulative(t: RunTables, direction: str) -> tuple[pd.DataFrame, str]:
    """The cumulative curves of ``direction`` in the funnel's Jacobian mode, and that mode."""
    df = need(t.table("cumulative"), "cumulative.parquet", "checkpoint", "jacobian_mode", "schur_alpha", "direction",
               "truncation", "depth", "steps", "erank")
    df = df[df["direction"] == direction]
    if df.empty:
        raise Skip(f"cumulative.parquet has no {direction} curves")
    return prefer(df, "jacobian_mode", "isolated")


def draw_cumulative_erank(t: RunTables) -> Figure:
    df, mode = _cumulative(t, "forward")
    if "schur_order" in df.columns:  # the claims' order (α = 1 does not depend on it)
        df = df[(df["schur_order"] == "lapack") | np.isclose(df["schur_alpha"].astype(float), 1.0)]
    alphas = sorted(pd.unique(df["schur_alpha"].astype(float)))
    cmap = matplotlib.colormaps["viridis"]
    fig = new_figure(6.0, 4.2)
    ax = fig.subplots()
    for checkpoint in _checkpoints(df):
        part = df[df["checkpoint"] == checkpoint]
        part = part[part["truncation"] == part["truncation"].max()]
        for i, alpha in enumerate(alphas):
            curve = part[np.isclose(part["schur_alpha"].astype(float), alpha)].sort_values("depth")
            if curve.empty:
                continue
            colour = cmap(i / max(len(alphas) - 1, 1))
            ax.plot(curve["depth"] + 1, curve["erank"], ls=_checkpoint_style(checkpoint), color=colour, marker=".",
                    label=f"{checkpoint} α={alpha:g}" if checkpoint == "trained" or i in (0, len(alphas) - 1)
                    else None)
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("sub-layer steps in the product")
    ax.set_ylabel(r"erank of $C_{0\to b}$")
    ax.set_title(f"Cumulative erank, forward ({mode})", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return fig


#: Smallest font of the coupling heatmap, in points.
COUPLING_FONT = 8.0


def draw_schur_split(t: RunTables) -> Figure:
    """Full-depth erank against α, one line per checkpoint and Schur order with a split (B2
    protocol; by default the trained model's only, the step-0 null having α = 1 alone)."""
    df, mode = _cumulative(t, "backward")
    truncated = df[~exact_rows(df)]
    df, protocol = (truncated, "rank-truncated") if not truncated.empty else (df, "exact")
    df = df[df["steps"] == df["steps"].max()]
    if df["schur_alpha"].astype(float).nunique() < 2:
        raise Skip("the run has no Schur split (--funnel-alphas 1 alone)")
    has_order = "schur_order" in df.columns
    fig = new_figure(6.0, 4.0)
    ax = fig.subplots()
    for checkpoint in _checkpoints(df):
        part = df[df["checkpoint"] == checkpoint]
        at_one = np.isclose(part["schur_alpha"].astype(float), 1.0)
        orders = [o for o in pd.unique(part.loc[~at_one, "schur_order"])] if has_order else ["lapack"]
        for j, order in enumerate(orders):
            rows = part[(part["schur_order"].to_numpy() == order) | at_one] if has_order else part
            curve = rows.assign(schur_alpha=rows["schur_alpha"].astype(float)).groupby("schur_alpha")["erank"].first().sort_index()
            if len(curve) < 2:
                continue
            ax.plot(curve.index, curve.to_numpy(), ls=_checkpoint_style(checkpoint), marker="o", ms=3,
                    color=matplotlib.colormaps["tab10"](j), label=f"{checkpoint}, {str(order).replace('_', ' ')}")
    ax.set_yscale("log")
    ax.set_xlabel("α (scale of the non-normal part N)")
    ax.set_ylabel("erank at full depth")
    ax.set_title(f"Schur split at full depth (backward, {protocol}, {mode})", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return fig


def draw_coupling(t: RunTables) -> Figure:
    """Heatmap of the coupling effect: columns are layers (boundaries when the table has no
    layer), rows (checkpoint, sub-layer); at most :data:`MAX_WIDTH` wide whatever the depth."""
    df = need(t.table("coupling"), "coupling.parquet", "checkpoint", "boundary_index", "effect")
    checkpoints = _checkpoints(df)
    if {"layer", "sublayer"} <= set(df.columns):
        cols = sorted(int(v) for v in pd.unique(df["layer"]))
        present = [str(v) for v in pd.unique(df["sublayer"])]
        subs = [s for s in ("attn", "mlp") if s in present] + sorted(s for s in present if s not in ("attn", "mlp"))
        rows = [(c, s) for c in checkpoints for s in subs]
        row_of = {row: i for i, row in enumerate(rows)}
        keys = list(zip(df["checkpoint"].astype(str), df["sublayer"].astype(str), df["layer"].astype(int)))
        labels = [f"{c} · {s}" for c, s in rows]
        xlabel = "layer (row: checkpoint · sub-layer whose input boundary is analysed)"
    else:
        cols = sorted(int(v) for v in pd.unique(df["boundary_index"]))
        subs = [None]
        rows = [(c, None) for c in checkpoints]
        row_of = {(c, None): i for i, (c, _) in enumerate(rows)}
        keys = list(zip(df["checkpoint"].astype(str), [None] * len(df), df["boundary_index"].astype(int)))
        labels = list(checkpoints)
        xlabel = "boundary"
    col_of = {c: j for j, c in enumerate(cols)}
    effect = np.full((len(rows), len(cols)), np.nan)
    sig = np.zeros(effect.shape, dtype=bool)
    flags = df["significant"].astype(bool).to_numpy() if "significant" in df.columns else np.zeros(len(df), bool)
    for (checkpoint, sub, col), value, flag in zip(keys, df["effect"].astype(float).to_numpy(), flags):
        i, j = row_of[(checkpoint, sub)], col_of[col]
        effect[i, j], sig[i, j] = value, flag
    finite = np.abs(effect[np.isfinite(effect)])
    lim = max(0.25, float(finite.max()) if finite.size else 0.0)  # small effects stay pale
    width = min(MAX_WIDTH, max(5.0, 2.6 + 0.3 * len(cols)))
    height = max(2.6, 1.5 + 0.3 * len(rows))
    fig = new_figure(width, height)
    ax = fig.subplots()
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#e5e5e5")
    mesh = ax.imshow(np.ma.masked_invalid(effect), cmap=cmap, vmin=-lim, vmax=lim, aspect="auto",
                     interpolation="nearest")
    for i, j in zip(*np.nonzero(sig)):
        strong = abs(effect[i, j]) > 0.6 * lim  # a dark cell: white star
        ax.text(j, i, "*", ha="center", va="center", fontsize=COUPLING_FONT + 3, color="white" if strong else "black")
    # one tick label per ~0.3 in of axes width, so labels never overlap at 8 pt
    per_tick = len(cols) * 0.3 / max(width - 3.2, 1.0)
    step = next(k for k in (1, 2, 4, 5, 10, 20, 25, 50, 100, 10**9) if k >= per_tick)
    ticks = list(range(0, len(cols), step))
    ax.set_xticks(ticks, [str(cols[k]) for k in ticks], fontsize=COUPLING_FONT)
    ax.set_yticks(range(len(rows)), labels, fontsize=COUPLING_FONT)
    for k in range(1, len(checkpoints)):
        ax.axhline(k * len(subs) - 0.5, color="white", lw=2.5)
    ax.set_xlabel(xlabel, fontsize=COUPLING_FONT + 1)
    ax.set_title("Topology–dynamics coupling (* = FDR-significant)", fontsize=COUPLING_FONT + 2)
    bar = fig.colorbar(mesh, ax=ax, shrink=0.9, pad=0.01)
    bar.set_label("rank-biserial effect\n(boundary − interior)", fontsize=COUPLING_FONT)
    bar.ax.tick_params(labelsize=COUPLING_FONT)
    return fig


#: Every figure, in report order.
FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("pseudospectra", "A", "Pseudospectra of routing and sink heads", ("arrays/pseudospectra",),
               draw_pseudospectra),
    FigureSpec("attention_patterns", "A", "Attention patterns of the chosen heads", ("arrays/attention_maps",),
               draw_attention_patterns),
    FigureSpec("transient_reserve", "A", "Transient reserve against matched nulls", ("heads",),
               draw_transient_reserve),
    FigureSpec("depth_products", "A", "Depth products against eigenvalue predictions", ("depth",),
               draw_depth_products),
    FigureSpec("criticality", "A", "Ablation criticality against transient reserve", ("ablation", "heads"),
               draw_criticality),
    FigureSpec("clamp_dose", "A", "The clamp chain against the dose", ("clamp",), draw_clamp_dose),
    FigureSpec("contest", "A", "The feature-family contest", ("contest",), draw_contest),
    FigureSpec("residual_profile", "B", "Residual magnitude and massive activations by layer", ("residual_summary",),
               draw_residual_profile),
    FigureSpec("eigenvalue_clouds", "B", "Eigenvalues of the mean Jacobians", ("eigenvalues",),
               draw_eigenvalue_clouds),
    FigureSpec("operator_profile", "B", "Operator type against depth", ("operators",), draw_operator_profile),
    FigureSpec("cumulative_erank", "B", "Cumulative effective rank and the Schur split", ("cumulative",),
               draw_cumulative_erank),
    FigureSpec("schur_split", "B", "The Schur split at full depth, per Schur order", ("cumulative",),
               draw_schur_split),
    FigureSpec("transport_funnel", "B", "The true funnel against the product of mean Jacobians",
               ("transport", "cumulative"), draw_transport_funnel),
    FigureSpec("lens_readout", "B", "What each layer predicts: the Jacobian lens against the logit lens",
               ("readout",), draw_lens_readout),
    FigureSpec("coupling", "B", "Topology–dynamics coupling", ("coupling",), draw_coupling),
    FigureSpec("census_formation", "C", "Formation against consolidation over training", ("census_heads",),
               draw_census_formation),
    FigureSpec("census_funnel", "C", "The funnel over training", ("census",), draw_census_funnel),
    FigureSpec("census_coupling", "C", "Coupling over training", ("census",), draw_census_coupling),
    FigureSpec("census_norms", "C", "Where heads and reserve sit, per series", ("census_heads", "census"),
               draw_census_norms),
)
SPECS = {spec.name: spec for spec in FIGURES}


def render_figure(spec: FigureSpec, tables: RunTables, folder: str | Path) -> tuple[Path | None, str]:
    """Draw one figure into ``folder/NAME.png`` (atomically).

    Returns ``(path, "")``, or ``(None, why)`` when its inputs are missing or drawing it
    failed (a failure is also issued as a ``RuntimeWarning``; the report never crashes on a
    figure).
    """
    for output in spec.needs:
        if not tables.has(output):
            return None, tables.why_missing(output)
    try:
        fig = spec.draw(tables)
    except Skip as exc:
        return None, str(exc)
    except Exception as exc:  # a figure must never take the report down
        warnings.warn(f"figure {spec.name} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return None, f"drawing failed ({type(exc).__name__}: {exc})"
    path = Path(folder) / f"{spec.name}.png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path, ""


def build_figures(run_dir: str | Path | RunTables) -> dict[str, tuple[Path | None, str]]:
    """Every figure of :data:`FIGURES`: name → (path or None, why it was skipped)."""
    tables = run_dir if isinstance(run_dir, RunTables) else RunTables(run_dir)
    folder = tables.root / FIGURES_DIR
    out = {}
    for spec in FIGURES:
        stale = folder / f"{spec.name}.png"
        path, why = render_figure(spec, tables, folder)
        if path is None and stale.is_file():
            stale.unlink()  # never leave an old image beside tables that no longer support it
        out[spec.name] = (path, why)
    return out


def make_figures(run_dir: str | Path) -> dict[str, Path | None]:
    """Draw every figure into ``RUN/figures/``; name → PNG path, or None when skipped."""
    return {name: path for name, (path, _) in build_figures(run_dir).items()}
