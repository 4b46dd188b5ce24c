"""Residual-stream figures of the report: the stream's magnitude and its massive activations by
layer (the capture stage's ``residual_summary``), and the true transport funnel of the lens
stage beside the product of mean Jacobians.

Each figure has a data function (:func:`residual_profile`, and
:func:`~depthlens.report.statistics.residual.transport_against_product` for the funnel) that
returns exactly what is drawn, so tests can compare it with a direct computation from the tables.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..runs.tables import RunTables
from .canvas import MAX_WIDTH, Skip, need, new_figure
from .statistics import NotTested, TooLittleData
from .statistics.residual import transport_against_product

__all__ = ["CAPTIONS", "MASSIVE_ABS", "draw_residual_profile", "draw_transport_funnel", "residual_profile"]

#: The absolute part of the massive-activation rule (§A7: |h| ≥ 100 and ≥ 1000 × the median).
MASSIVE_ABS = 100.0
#: Order of the boundaries inside a layer; ``final`` (the last block's output) comes last.
BOUNDARY_ORDER = {"pre_attn": 0, "pre_mlp": 1, "pre_ple": 2, "final": 3}

CAPTIONS: dict[str, str] = {
    "residual_profile": (
        "The residual stream's magnitude at every sub-layer boundary (the input of each layer's attention, of "
        "its MLP, and the last block's output), from the capture stage: left, the root mean square, the median "
        "|h| and the largest |h| of each boundary (median over chunks; the band spans the largest |h| over "
        "chunks), log scale, with the absolute massive-activation threshold |h| = 100 dashed; right, the "
        "massive activations (|h| ≥ 100 and ≥ 1000 × the boundary's median |h|) per chunk, mean over chunks. "
        "Look for the layer where the largest |h| jumps by orders of magnitude above the RMS and massive "
        "entries appear: the massive activations the clamp chain (claim A7) starts from."
    ),
    "transport_funnel": (
        "Effective rank of the true transport from block ℓ to the last block's output (the Jacobian lens of "
        "the lens stage: sources and targets over the valid positions, averaged over prompts and source "
        "positions) and of the backward product of the trained mean sub-layer Jacobians over the same "
        "sub-layers (α = 1), against ℓ; with three source layers or fewer each point carries its value. "
        "Look for whether the product of per-layer means funnels as the end-to-end operator does, and where "
        "the two part."
    ),
}


def residual_profile(t: RunTables) -> pd.DataFrame:
    """What :func:`draw_residual_profile` draws, one row per boundary in depth order.

    Columns: ``position`` (0, 1, …), ``layer``, ``boundary``, ``rms``, ``median_abs`` and
    ``max_abs`` (medians over chunks), ``max_abs_top`` (largest ``max_abs`` over chunks),
    ``n_massive`` (mean over chunks), ``chunks``, and ``top_dim`` (the residual dimension of
    ``max_abs`` in most chunks).

    Raises
    ------
    Skip
        When ``residual_summary`` is absent, empty or lacks a column.
    """
    df = need(t.table("residual_summary"), "residual_summary.parquet", "chunk", "layer", "boundary", "rms",
              "median_abs", "max_abs", "n_massive")
    df = df.assign(max_dim=df["max_dim"] if "max_dim" in df.columns else -1)
    keys = ["layer", "boundary"]
    grouped = df.groupby(keys, sort=False)
    out = grouped.agg(rms=("rms", "median"), median_abs=("median_abs", "median"), max_abs=("max_abs", "median"),
                      max_abs_top=("max_abs", "max"), n_massive=("n_massive", "mean"),
                      chunks=("chunk", "nunique")).reset_index()
    top = grouped["max_dim"].agg(lambda s: int(s.mode().min())).rename("top_dim").reset_index()
    out = out.merge(top, on=keys)
    rank = out["boundary"].map(BOUNDARY_ORDER).fillna(len(BOUNDARY_ORDER))
    out = out.assign(_rank=rank).sort_values(["layer", "_rank"]).drop(columns="_rank").reset_index(drop=True)
    out.insert(0, "position", np.arange(len(out)))
    out["layer"] = out["layer"].astype(int)
    out["n_massive"] = out["n_massive"].astype(float)
    return out


def draw_residual_profile(t: RunTables) -> Figure:
    """Residual RMS, median and largest |h| per boundary (log), and massive entries per chunk."""
    prof = residual_profile(t)
    x = prof["position"].to_numpy()
    fig = new_figure(min(MAX_WIDTH, 10.0), 3.8)
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    top = prof["max_abs_top"].to_numpy(float)
    left.fill_between(x, prof["max_abs"].to_numpy(float), top, color="#d62728", alpha=0.15, lw=0,
                      label="largest |h|, range over chunks")
    for col, colour, label in (("max_abs", "#d62728", "largest |h|"), ("rms", "#1f77b4", "RMS"),
                               ("median_abs", "#2ca02c", "median |h|")):
        left.plot(x, prof[col].to_numpy(float), marker=".", color=colour, label=label)
    left.axhline(MASSIVE_ABS, ls="--", lw=0.8, color="0.4", label="|h| = 100")
    left.set_yscale("log")
    left.set_ylabel("|h| (residual units)")
    left.legend(fontsize=7, loc="upper left")
    right.bar(x, prof["n_massive"].to_numpy(float), color="#9467bd", width=0.8)
    right.set_ylabel("massive entries per chunk (mean)")
    if not (prof["n_massive"] > 0).any():
        right.text(0.5, 0.5, "no massive activation", transform=right.transAxes, ha="center", va="center",
                   color="0.4")
        right.set_ylim(0, 1)
    ticks, labels = _layer_ticks(prof)
    for ax in (left, right):
        ax.set_xticks(ticks, labels, fontsize=8)
        ax.set_xlim(-0.7, len(prof) - 0.3)
        ax.set_xlabel("boundary (tick: the input of layer ℓ; out: the last block's output)", fontsize=8)
    peak = prof.loc[prof["max_abs"].idxmax()]
    left.set_title(f"Residual magnitude (largest |h| peaks at layer {int(peak['layer'])}, {_where(peak['boundary'])}, "
                   f"dim {int(peak['top_dim'])})", fontsize=9)
    right.set_title("Massive activations by boundary", fontsize=9)
    return fig


def _where(boundary: str) -> str:
    """A boundary's name in words (``pre_attn`` → ``attention input``)."""
    return {"pre_attn": "attention input", "pre_mlp": "MLP input", "pre_ple": "per-layer-input update",
            "final": "output"}.get(boundary, boundary.replace("_", " "))


def _layer_ticks(prof: pd.DataFrame) -> tuple[list[int], list[str]]:
    """Tick positions and labels: each layer's first boundary (at most about 16 of them) and
    ``out`` for the last block's output."""
    firsts = prof[prof["boundary"] != "final"].groupby("layer")["position"].min()
    step = max(1, math.ceil(len(firsts) / 16))
    ticks = [int(p) for p in firsts.iloc[::step]]
    labels = [str(int(layer)) for layer in firsts.index[::step]]
    final = prof.loc[prof["boundary"] == "final", "position"]
    if len(final):
        ticks.append(int(final.iloc[0]))
        labels.append("out")
    return ticks, labels


def draw_transport_funnel(t: RunTables) -> Figure:
    """The lens's end-to-end transport against the product of mean Jacobians, per source layer;
    the axis spans the layers with half a step on each side, and few layers get their values."""
    try:
        pairs = transport_against_product(t)
    except (NotTested, TooLittleData) as exc:
        raise Skip(str(exc)) from None
    fig = new_figure(6.0, 4.0)
    ax = fig.subplots()
    layers = pairs["layer"].to_numpy()
    product = "product of mean Jacobians" + (" (rank-truncated)" if pairs["truncated"].any() else "")
    few = len(pairs) <= 3
    for col, style, label in (("erank_transport", "-", r"true transport $J_\ell$ (lens)"), ("erank_product", "--", product)):
        values = pairs[col].to_numpy(float)
        line = ax.plot(layers, values, marker="o" if few else ".", ms=6 if few else 4, ls=style, label=label)[0]
        if few:
            for layer, value in zip(layers, values):
                if np.isfinite(value):
                    ax.annotate(f"{value:.3g}", (layer, value), textcoords="offset points", xytext=(8, 0),
                                va="center", fontsize=8, color=line.get_color())
    ax.set_yscale("log")
    values = pairs[["erank_transport", "erank_product"]].to_numpy(float)
    values = values[np.isfinite(values) & (values > 0)]
    if values.size:  # at least a factor of 4 on each side of the values: a readable log axis
        ax.set_ylim(min(values.min() / 4, ax.get_ylim()[0]), max(values.max() * 4, ax.get_ylim()[1]))
    ax.set_xlim(layers.min() - (1.0 if few else 0.5), layers.max() + (1.0 if few else 0.5))
    if len(layers) <= 16:
        ax.set_xticks(layers)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("source layer ℓ (the operator runs from block ℓ's output to the last block's)")
    ax.set_ylabel("erank")
    ax.set_title("The true funnel against the product of mean Jacobians", fontsize=10)
    ax.legend(fontsize=7)
    return fig
