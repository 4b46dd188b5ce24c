"""The attention-pattern, residual-profile and transport figures: each figure's data against a
direct computation from the tables, the transport axis of a two-layer model, and no raw TeX or
column name in any figure's text."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from depthlens.attention.patterns import prev_weight, sink_mass
from depthlens.report.canvas import Skip
from depthlens.report.figures import FIGURES
from depthlens.report.pattern_figures import attention_maps, draw_attention_patterns
from depthlens.report.residual_figures import draw_residual_profile, draw_transport_funnel, residual_profile
from depthlens.runs.tables import RunTables

from . import MAP_CHUNK, MAP_HEADS, attention_map, build_run, write_table

pytestmark = pytest.mark.full_leg


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("stream") / "run")


def test_residual_profile_is_the_table_reduced_per_boundary(run: Path) -> None:
    df = pd.read_parquet(run / "tables" / "residual_summary.parquet")
    prof = residual_profile(RunTables(run))
    order = [(layer, b) for layer in range(4) for b in ("pre_attn", "pre_mlp")] + [(4, "final")]
    assert list(zip(prof["layer"], prof["boundary"])) == order and list(prof["position"]) == list(range(9))
    for row in prof.itertuples():
        part = df[(df["layer"] == row.layer) & (df["boundary"] == row.boundary)]
        assert row.rms == pytest.approx(part["rms"].median())
        assert row.median_abs == pytest.approx(part["median_abs"].median())
        assert row.max_abs == pytest.approx(part["max_abs"].median())
        assert row.max_abs_top == pytest.approx(part["max_abs"].max())
        assert row.n_massive == pytest.approx(part["n_massive"].mean())
        assert row.chunks == part["chunk"].nunique() and row.top_dim == part["max_dim"].mode().min()
    assert (prof["n_massive"] > 0).tolist() == [layer >= 2 for layer, _ in order]
    assert len(draw_residual_profile(RunTables(run)).axes) == 2


def test_attention_maps_are_the_saved_matrices_with_their_pattern_rows(run: Path) -> None:
    """Each drawn matrix is the saved one, and its pattern features computed directly from it
    equal the capture stage's attention_patterns row of that head and chunk."""
    maps = attention_maps(RunTables(run))
    patterns = pd.read_parquet(run / "tables" / "attention_patterns.parquet")
    heads = pd.read_parquet(run / "tables" / "heads.parquet").set_index(["layer", "head"])["role"]
    assert [(m["layer"], m["head"]) for m in maps] == list(MAP_HEADS)
    for m in maps:
        np.testing.assert_array_equal(m["A"], attention_map(m["layer"], m["head"]))
        assert m["chunk"] == MAP_CHUNK and m["picked"] == MAP_HEADS[(m["layer"], m["head"])]
        assert m["role"] == heads.loc[(m["layer"], m["head"])]
        row = patterns[(patterns["layer"] == m["layer"]) & (patterns["head"] == m["head"])
                       & (patterns["chunk"] == m["chunk"])].iloc[0]
        assert m["sink_mass"] == pytest.approx(float(sink_mass(m["A"]))) == pytest.approx(row["sink_mass"])
        assert m["prev_weight"] == pytest.approx(float(prev_weight(m["A"]))) == pytest.approx(row["prev_weight"])
    fig = draw_attention_patterns(RunTables(run))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[0].startswith("layer 0, head 0: routing") and f"chunk {MAP_CHUNK}, sink mass" in titles[0]


def test_attention_patterns_skip_without_the_arrays(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run", stages=("attention",), pseudospectra=False)
    with pytest.raises(Skip, match="attention_maps.safetensors is absent"):
        attention_maps(RunTables(run))


def _two_layer_run(root: Path) -> Path:
    """A run of a two-layer model with the lens stage: one source layer (0) below the last."""
    run = build_run(root, stages=("jacobian", "lens"))
    for name, keep in (("transport", lambda d: d["layer"] < 2), ("operators", lambda d: d["layer"] < 2),
                       ("cumulative", lambda d: d["steps"] <= 4)):
        df = pd.read_parquet(run / "tables" / f"{name}.parquet")
        write_table(run, name, df[keep(df)])
    return run


def test_transport_of_a_two_layer_model_is_readable(tmp_path: Path) -> None:
    """One source layer: the axis spans it with room on each side (not ±0.045), the log axis
    spans at least a factor of 16, and both points carry their values."""
    run = _two_layer_run(tmp_path / "run")
    fig = draw_transport_funnel(RunTables(run))
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo <= -0.9 and hi >= 0.9 and list(ax.get_xticks()) == [0]
    ylo, yhi = ax.get_ylim()
    assert yhi / ylo >= 16
    notes = [t.get_text() for t in ax.texts]
    assert len(notes) == 2 and "20" in notes  # the transport's erank at layer 0


def test_no_figure_text_shows_raw_tex_or_column_names(run: Path) -> None:
    """Every text of every figure is plain Unicode or mathtext (inside $…$): no bare ``_``,
    ``^``, ``{`` or ``}``."""
    tables = RunTables(run)
    drawn = 0
    for spec in FIGURES:
        try:
            fig = spec.draw(tables)
        except Skip:
            continue
        fig.canvas.draw()
        drawn += 1
        for text in fig.findobj(Text):
            value = text.get_text()
            assert "$" in value or not re.search(r"[_^{}]", value), (spec.name, value)
    assert drawn >= len(FIGURES) - 1  # the transport funnel needs a lens run with matching depth
