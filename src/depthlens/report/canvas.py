"""What every figure module of the report shares: the canvas, the role colours, and the
:class:`Skip` a drawing function raises when its inputs are missing."""

from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["DPI", "ROLE_COLOURS", "Skip", "need", "new_figure", "prefer"]

DPI = 100
#: Widest figure, in inches (at :data:`DPI`, the report's 1100 px content width: no downscaling).
MAX_WIDTH = 11.0
ROLE_COLOURS = {"routing": "#1f77b4", "sink": "#d62728", "other": "#9a9a9a"}


class Skip(Exception):
    """Raised inside a figure function when its inputs are missing; the message says why."""


def need(df: pd.DataFrame | None, name: str, *cols: str) -> pd.DataFrame:
    """``df`` when it is present, has ``cols`` and is not empty; else :class:`Skip` saying why."""
    if df is None:
        raise Skip(f"{name} is absent")
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise Skip(f"{name} lacks column {missing[0]!r}")
    if df.empty:
        raise Skip(f"{name} is empty")
    return df


def prefer(df: pd.DataFrame, col: str, value: str) -> tuple[pd.DataFrame, str]:
    """The rows of ``df`` whose ``col`` is ``value`` when any is, else those of its first value;
    with the value chosen (e.g. the isolated Jacobian mode when the run computed it)."""
    values = list(pd.unique(df[col]))
    chosen = value if value in values else values[0]
    return df[df[col] == chosen], str(chosen)


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout figure on the Agg canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig
