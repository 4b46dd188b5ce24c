"""The profiles of the cross-model report (:mod:`depthlens.report.compare`): one quantity
against depth per run, overlaid on a normalised depth axis (0 = first, 1 = last), one colour
per model.

Every profile reads the trained rows of one table (:meth:`RunTables.trained`); a Jacobian
profile uses the isolated operators when the run computed them (the claims' protocol), else
the run's first mode.

==============  ==========  ===================================================================
name            table       value against normalised depth
==============  ==========  ===================================================================
complex_frac    operators   ``complex_frac_nontrivial`` of the full-layer operator, per layer
                            (layer / (L − 1))
henrici         operators   ``henrici_update_rel`` of the full-layer operator, per layer
erank_funnel    cumulative  ``erank`` of the forward product C_{0→b} at α = 1, least truncation,
                            per sub-layer step (b / (S − 1), S steps)
delta_tr_roles  heads       mean ``delta_TR1`` of the routing and of the sink heads of each layer
                            (layer / (L − 1))
eig_gap         depth       median ``gap_e1`` = log10(‖D‖ / E1) over chunks (and null samples) of
                            the head-mean products, model and null, per depth b ((b − 1) / (L − 1))
==============  ==========  ===================================================================

L is the number of layers of the run's table (its largest layer + 1, or its largest product
depth); a profile with one point sits at 0. Points whose value is not finite (an infinite gap
where E1 underflows to 0, NaN) are left out. A run whose table lacks a profile is left out of
that figure, and the figure's caption says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter

from .canvas import Skip, need, new_figure, prefer
from ..runs.tables import RunTables

__all__ = ["PROFILES", "PROFILE_COLUMNS", "SERIES_STYLES", "ProfileSpec", "build_profiles", "draw_profile",
           "model_colours", "run_profile"]

#: Columns of the profiles DataFrame (:func:`build_profiles`).
PROFILE_COLUMNS = ("run", "profile", "series", "position", "depth", "value")
#: Line style of a series (solid when not listed).
SERIES_STYLES = {"sink": "--", "null": "--"}


@dataclass(frozen=True)
class ProfileSpec:
    """A profile: its name, title, y-axis label, caption, whether its y axis is logarithmic,
    and ``build(tables)``, the run's points (:func:`run_profile`) or :class:`Skip` saying why
    the run lacks them."""

    name: str
    title: str
    ylabel: str
    caption: str
    log: bool
    build: Callable[[RunTables], pd.DataFrame]


def _trained(t: RunTables, name: str, *cols: str) -> pd.DataFrame:
    """The trained rows of ``name`` with ``cols``, or :class:`Skip` saying why they are missing."""
    df = t.trained(name)
    if df is None:
        raise Skip(t.why_missing(name))
    return need(df, f"{name}.parquet", *cols)


def _normalised(x: np.ndarray, first: float, last: float) -> np.ndarray:
    """``(x − first) / (last − first)``; 0 when there is a single position."""
    x = np.asarray(x, dtype=float)
    return (x - first) / (last - first) if last > first else np.zeros_like(x)


def _points(series: str, position: np.ndarray, depth: np.ndarray, value: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"series": series, "position": np.asarray(position, dtype=float),
                         "depth": np.asarray(depth, dtype=float), "value": np.asarray(value, dtype=float)})


def _layer_operator(column: str) -> Callable[[RunTables], pd.DataFrame]:
    """The profile of ``column`` of the full-layer operators (sub-layer ``layer``) per layer."""

    def build(t: RunTables) -> pd.DataFrame:
        df = _trained(t, "operators", "jacobian_mode", "layer", "sublayer", column)
        df, _ = prefer(df, "jacobian_mode", "isolated")
        last = float(df["layer"].max())
        df = df[df["sublayer"] == "layer"].sort_values("layer")
        if df.empty:
            raise Skip("operators.parquet has no full-layer operators (sub-layer `layer`)")
        layer = df["layer"].to_numpy(dtype=float)
        return _points("layer operator", layer, _normalised(layer, 0.0, last), df[column].to_numpy(dtype=float))

    return build


def _erank_funnel(t: RunTables) -> pd.DataFrame:
    df = _trained(t, "cumulative", "jacobian_mode", "schur_alpha", "direction", "truncation", "depth", "erank")
    df = df[(df["direction"] == "forward") & np.isclose(df["schur_alpha"].astype(float), 1.0)]
    if df.empty:
        raise Skip("cumulative.parquet has no forward product at α = 1")
    df, _ = prefer(df, "jacobian_mode", "isolated")
    df = df[df["truncation"] == df["truncation"].max()].sort_values("depth")
    step = df["depth"].to_numpy(dtype=float)
    return _points("forward product", step, _normalised(step, 0.0, float(step.max())),
                   df["erank"].to_numpy(dtype=float))


def _delta_tr_roles(t: RunTables) -> pd.DataFrame:
    df = _trained(t, "heads", "layer", "role", "delta_TR1")
    last = float(df["layer"].max())
    parts = []
    for role in ("routing", "sink"):
        mean = df[df["role"] == role].groupby("layer")["delta_TR1"].mean().sort_index()
        if len(mean):
            layer = mean.index.to_numpy(dtype=float)
            parts.append(_points(role, layer, _normalised(layer, 0.0, last), mean.to_numpy(dtype=float)))
    if not parts:
        raise Skip("heads.parquet has no routing or sink heads")
    return pd.concat(parts, ignore_index=True)


def _eig_gap(t: RunTables) -> pd.DataFrame:
    df = _trained(t, "depth", "operator", "source", "depth", "gap_e1")
    df, _ = prefer(df, "operator", "mean")
    last = float(df["depth"].max())
    parts = []
    for source in ("model", "null"):
        median = df[df["source"] == source].groupby("depth")["gap_e1"].median().sort_index()
        if len(median):
            depth = median.index.to_numpy(dtype=float)
            parts.append(_points(source, depth, _normalised(depth, 1.0, last), median.to_numpy(dtype=float)))
    if not parts:
        raise Skip("depth.parquet has no model or null rows")
    return pd.concat(parts, ignore_index=True)


#: Every profile, in report order.
PROFILES: tuple[ProfileSpec, ...] = (
    ProfileSpec("complex_frac", "Complex eigenvalue fraction against depth", "complex_frac_nontrivial", (
        "Fraction of complex eigenvalues (among those that are not structurally 1: complex_frac_nontrivial) of "
        "each layer's full-layer mean Jacobian J̄_mlp·J̄_attn, trained model, against layer / (L − 1). Look for "
        "rotation-heavy early layers (claim B1) and whether the models agree."), False,
        _layer_operator("complex_frac_nontrivial")),
    ProfileSpec("henrici", "Henrici departure against depth", "henrici_update_rel", (
        "Relative Henrici departure from normality of the update U = J − I of each layer's full-layer mean "
        "Jacobian, trained model, against layer / (L − 1). Look for non-normal early layers giving way to "
        "near-normal late ones in trained models, and its absence at initialisation."), False,
        _layer_operator("henrici_update_rel")),
    ProfileSpec("erank_funnel", "The erank funnel against depth", r"erank of $C_{0\to b}$", (
        "Effective rank of the cumulative Jacobian C(0→b) (forward from the input, α = 1, the least truncated "
        "product the run computed), trained model, against the normalised sub-layer step b / (S − 1). Look for "
        "a funnel (erank falling by an order of magnitude) in trained models and not at initialisation "
        "(claims B2, B3)."), True, _erank_funnel),
    ProfileSpec("delta_tr_roles", "Excess reserve Δ_TR by head role against depth", r"mean $\Delta_\mathrm{TR}$ (nats)", (
        "Mean excess transient reserve Δ_TR of the routing heads (solid) and of the sink heads (dashed) of each "
        "layer, trained model, against layer / (L − 1). Look for positive reserve in routing heads and negative "
        "in sink heads (claims A5, A6), and where along depth each model places them."), False, _delta_tr_roles),
    ProfileSpec("eig_gap", "Eigenvalue-prediction error against depth", "median log10(‖D‖ / E1)", (
        "Eigenvalue-prediction error log10(‖D‖ / E1) of the head-mean depth products D(1→b), median over "
        "chunks, for the model (solid) and its matched shuffle nulls (dashed), against (b − 1) / (L − 1); "
        "infinite gaps (E1 underflowing to 0) are not drawn. Look for a gap of many orders of magnitude on trained "
        "models and not on the nulls (claim A2)."), False, _eig_gap),
)
SPECS = {spec.name: spec for spec in PROFILES}


def run_profile(name: str, tables: RunTables) -> pd.DataFrame:
    """The finite points of profile ``name`` of one run.

    Returns
    -------
    DataFrame
        Columns ``series`` (a line of the figure: ``layer operator``, ``forward product``,
        ``routing``/``sink`` or ``model``/``null``), ``position`` (the layer, sub-layer step or
        product depth), ``depth`` (``position`` normalised to [0, 1]) and ``value``, by series
        and position.

    Raises
    ------
    Skip
        When the run lacks the profile (its stage did not run, the table lacks the rows or
        columns, or no value is finite), with the reason.
    """
    points = SPECS[name].build(tables)
    points = points[np.isfinite(points["value"].to_numpy(dtype=float))].reset_index(drop=True)
    if points.empty:
        raise Skip(f"no finite {name} value")
    return points


def build_profiles(runs: Mapping[str, RunTables]) -> tuple[pd.DataFrame, dict[str, dict[str, str]]]:
    """Every profile of every run: the points, and why each run lacks the profiles it lacks.

    Parameters
    ----------
    runs : mapping
        Label → the run's tables, in column order.

    Returns
    -------
    points : DataFrame
        Columns :data:`PROFILE_COLUMNS`: ``run`` (its label), ``profile`` (a name of
        :data:`PROFILES`) and the columns of :func:`run_profile`.
    missing : dict
        Profile name → label → the reason that run has no points of it.
    """
    parts, missing = [], {spec.name: {} for spec in PROFILES}
    for label, tables in runs.items():
        for spec in PROFILES:
            try:
                points = run_profile(spec.name, tables)
            except Skip as exc:
                missing[spec.name][label] = str(exc)
                continue
            parts.append(points.assign(run=label, profile=spec.name))
    points = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=list(PROFILE_COLUMNS))
    return points[list(PROFILE_COLUMNS)], missing


def model_colours(labels: list[str]) -> dict[str, str]:
    """One colour per model, by its position among ``labels`` (the same in every figure)."""
    cmap = matplotlib.colormaps["tab10"]
    return {label: to_hex(cmap(i % 10)) for i, label in enumerate(labels)}


def draw_profile(spec: ProfileSpec, points: pd.DataFrame, colours: Mapping[str, str]) -> Figure:
    """Profile ``spec`` of every run in ``points`` (:func:`build_profiles`) on one axis: one
    colour per model, the line style of each series (:data:`SERIES_STYLES`).

    Raises
    ------
    Skip
        When no run has the profile.
    """
    data = points[points["profile"] == spec.name]
    if data.empty:
        raise Skip("no run has it")
    series = list(pd.unique(data["series"]))
    styles = {s: SERIES_STYLES.get(s, "-") for s in series}
    fig = new_figure(7.0, 4.0)
    ax = fig.subplots()
    for (run, name), curve in data.groupby(["run", "series"], sort=False):
        ax.plot(curve["depth"], curve["value"], ls=styles[name], marker="o", ms=3, color=colours[run])
    if spec.name == "delta_tr_roles":
        ax.axhline(0.0, color="0.5", lw=0.8)
    if spec.log:  # plain tick labels (not mathtext, whose fonts a minimal matplotlib install lacks)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(LogFormatter())
        ax.yaxis.set_minor_formatter(LogFormatter())
    ax.set_xlim(-0.03, 1.03)
    ax.set_xlabel("normalised depth (0 = first, 1 = last)")
    ax.set_ylabel(spec.ylabel)
    ax.set_title(spec.title, fontsize=10)
    handles = [Line2D([], [], color=colours[run], marker="o", ms=3, label=run) for run in pd.unique(data["run"])]
    if len(series) > 1:
        handles += [Line2D([], [], color="0.3", ls=styles[s], label=s) for s in series]
    ax.legend(handles=handles, fontsize=7, loc="best")
    return fig
