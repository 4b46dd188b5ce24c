"""The attention-pattern figure of the report: the attention matrices of the heads the attention
stage saved (``arrays/attention_maps.safetensors``: ``--heads``, by default the top routing and
the top sink head), each on its median chunk, as heatmaps.

:func:`attention_maps` returns exactly what is drawn (with each head's pattern features from the
capture stage's ``attention_patterns`` table when the run has it), so tests can compare the
matrices with the tables.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from ..runs.tables import RunTables
from .canvas import MAX_WIDTH, Skip, new_figure

__all__ = ["CAPTIONS", "MAPS", "WEIGHT_FLOOR", "attention_maps", "draw_attention_patterns"]

#: The array file the attention stage writes the chosen heads' matrices to.
MAPS = "attention_maps"
#: Smallest weight the colour scale resolves (a log scale from here to 1).
WEIGHT_FLOOR = 1e-3
#: Heads a row of the figure.
PER_ROW = 3

CAPTIONS: dict[str, str] = {
    "attention_patterns": (
        "The attention matrix A of each chosen head (rows: the query position, columns: the key position it "
        "attends to) on the head's median chunk, colour on a log scale from 0.001 (white) to 1 (black); above "
        "the diagonal is masked grey (causal). By default the heads are the top routing head (largest previous-token or induction "
        "score) and the top sink head (largest sink mass); depthlens attention --heads LAYER.HEAD,... picks "
        "others. Each title gives the head's role and, from the capture stage, its sink mass and "
        "previous-token weight on that chunk. Look for a bright first column (a sink head) or a bright "
        "sub-diagonal (a previous-token head), and for what the rest of each row spreads over."
    ),
}


def attention_maps(t: RunTables) -> list[dict[str, Any]]:
    """What :func:`draw_attention_patterns` draws: per saved head, in the file's order, a dict
    with ``layer``, ``head``, ``chunk``, ``picked`` (``routing``, ``sink`` or ``--heads``),
    ``role`` (from ``heads``, None when unknown), ``A`` (the float64 matrix) and ``sink_mass``
    and ``prev_weight`` (that head's and chunk's row of ``attention_patterns``; None without it).

    Raises
    ------
    Skip
        When the array file is absent or holds no matrix.
    """
    loaded = t.arrays(MAPS)
    if loaded is None:
        raise Skip(f"arrays/{MAPS}.safetensors is absent (the attention stage writes it)")
    arrays, meta = loaded
    keys = [k for k in (meta.get("heads") or "").split(",") if k in arrays] or sorted(arrays)
    if not keys:
        raise Skip(f"arrays/{MAPS}.safetensors holds no matrix")
    chunks = (meta.get("chunks") or "").split(",")
    picked = (meta.get("picked") or "").split(",")
    roles = _roles(t)
    patterns = t.table("attention_patterns")
    out = []
    for i, key in enumerate(keys):
        layer, head = (int(v) for v in key.split("."))
        chunk = int(chunks[i]) if i < len(chunks) and chunks[i].lstrip("-").isdigit() else None
        row = None
        if patterns is not None and chunk is not None and {"layer", "head", "chunk"} <= set(patterns.columns):
            match = patterns[(patterns["layer"] == layer) & (patterns["head"] == head) & (patterns["chunk"] == chunk)]
            row = match.iloc[0] if len(match) else None
        out.append({"layer": layer, "head": head, "chunk": chunk,
                    "picked": picked[i] if len(picked) == len(keys) else picked[0] or None,
                    "role": roles.get((layer, head)), "A": np.asarray(arrays[key], dtype=np.float64),
                    "sink_mass": None if row is None else float(row["sink_mass"]),
                    "prev_weight": None if row is None else float(row["prev_weight"])})
    return out


def _roles(t: RunTables) -> dict[tuple[int, int], str]:
    heads = t.trained("heads")
    if heads is None or not {"layer", "head", "role"} <= set(heads.columns):
        return {}
    return {(int(layer), int(head)): str(role) for layer, head, role in
            heads[["layer", "head", "role"]].itertuples(index=False)}


def draw_attention_patterns(t: RunTables) -> Figure:
    """One heatmap per saved head, :data:`PER_ROW` a row, with one colour bar."""
    maps = attention_maps(t)
    cols = min(len(maps), PER_ROW)
    rows = math.ceil(len(maps) / cols)
    fig = new_figure(min(MAX_WIDTH, 3.5 * cols + 1.0), 3.7 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
    cmap = matplotlib.colormaps["magma_r"].with_extremes(bad="#d9d9d9")
    mesh = None
    for ax, item in zip(axes, maps):
        A = item["A"]
        n = A.shape[0]
        shown = np.where(np.triu(np.ones_like(A, dtype=bool), 1), np.nan, np.maximum(A, WEIGHT_FLOOR))
        mesh = ax.imshow(shown, cmap=cmap, norm=LogNorm(vmin=WEIGHT_FLOOR, vmax=1.0), interpolation="nearest",
                         origin="upper", extent=(-0.5, n - 0.5, n - 0.5, -0.5))
        ax.set_xlim(-0.5 - n / 40, n - 0.5)  # the first column (a sink) clear of the frame
        ax.set_ylim(n - 0.5, -0.5 - n / 40)
        ax.set_xlabel("key position", fontsize=8)
        ax.set_ylabel("query position", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title(_title(item), fontsize=8)
    for ax in axes[len(maps):]:
        ax.set_visible(False)
    if mesh is not None:
        fig.colorbar(mesh, ax=list(axes[: len(maps)]), shrink=0.85, label="attention weight (log)")
    return fig


def _title(item: dict[str, Any]) -> str:
    """``layer L, head H: ROLE (picked by …)`` and, on a second line, the chunk and its features."""
    what = item["role"] or "role unknown"
    if item["picked"] in ("routing", "sink"):
        what += f"; top {item['picked']} score" if item["picked"] != item["role"] else ""
    first = f"layer {item['layer']}, head {item['head']}: {what}"
    second = "median chunk" if item["chunk"] is None else f"chunk {item['chunk']}"
    if item["sink_mass"] is not None:
        second += f", sink mass {item['sink_mass']:.2f}, prev. weight {item['prev_weight']:.2f}"
    return f"{first}\n{second}"
