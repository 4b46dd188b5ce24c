"""Figures: each draws a decodable PNG from small synthetic tables and is skipped (None), never a
crash, when its inputs are missing."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import matplotlib.image as mpimg
import pandas as pd
import pytest

from depthlens.report.figures import CAPTIONS, FIGURES, SPECS, FigureSpec, Skip, make_figures, render_figure
from depthlens.runs.tables import RunTables

from . import build_run, drop_stage, read_table, write_table

# The full leg only: rendering and claims read tables, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the signature."""
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("figs") / "run")


@pytest.mark.parametrize("name", [spec.name for spec in FIGURES])
def test_each_figure_draws_a_decodable_png(run, tmp_path, name):
    path, why = render_figure(SPECS[name], RunTables(run), tmp_path)
    assert path == tmp_path / f"{name}.png" and why == ""
    width, height = png_size(path)
    assert 100 < width <= 1600 and height > 100  # readable at the report's width
    image = mpimg.imread(path)
    assert image.shape[:2] == (height, width)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left nothing behind


def test_captions_cover_every_figure():
    assert set(CAPTIONS) == set(SPECS)
    assert all(len(CAPTIONS[name]) > 80 and "Look for" in CAPTIONS[name] for name in SPECS)


def test_make_figures_on_empty_directory_skips_everything(tmp_path):
    assert make_figures(tmp_path) == {spec.name: None for spec in FIGURES}


def test_missing_stage_skips_only_its_figures(tmp_path):
    run = build_run(tmp_path / "run", stages=("capture", "topology"))
    out = make_figures(run)
    drawn = {"coupling", "residual_profile"}  # topology's coupling and capture's residual profile
    assert all(out[n] is not None for n in drawn)
    assert all(out[n] is None for n in out if n not in drawn)
    # the stale image disappears once its table does
    drop_stage(run, "topology")
    assert make_figures(run)["coupling"] is None
    assert not (run / "figures" / "coupling.png").exists()


def test_missing_columns_or_rows_skip_with_reason(tmp_path):
    run = build_run(tmp_path / "run", stages=("attention", "topology"))
    heads = read_table(run, "heads").drop(columns=["null_TR1_mean"])
    write_table(run, "heads", heads)
    depth = read_table(run, "depth")
    write_table(run, "depth", depth.iloc[:0])
    tables = RunTables(run)
    assert render_figure(SPECS["transient_reserve"], tables, tmp_path) == (
        None, "heads.parquet lacks column 'null_TR1_mean'")
    assert render_figure(SPECS["depth_products"], tables, tmp_path) == (None, "depth.parquet is empty")
    path, why = render_figure(SPECS["eigenvalue_clouds"], tables, tmp_path)
    assert path is None and "stage jacobian not run" in why


def test_depth_products_with_infinite_gaps_and_no_nulls(tmp_path):
    run = build_run(tmp_path / "run", stages=("attention",))
    depth = read_table(run, "depth")
    depth = depth[depth["source"] == "model"]
    depth.loc[:, ["e1", "e2"]] = 0.0  # every prediction exactly 0: all gaps infinite
    write_table(run, "depth", depth)
    path, _ = render_figure(SPECS["depth_products"], RunTables(run), tmp_path)
    assert png_size(path)[0] > 100


def test_single_layer_and_single_checkpoint(tmp_path):
    run = build_run(tmp_path / "run", stages=("jacobian",))
    for name in ("operators", "eigenvalues", "cumulative"):
        df = read_table(run, name)
        df = df[df["checkpoint"] == "trained"]
        if "layer" in df.columns:
            df = df[df["layer"] == 0]
        write_table(run, name, df)
    out = make_figures(run)
    for name in ("eigenvalue_clouds", "operator_profile", "cumulative_erank"):
        assert out[name] is not None and png_size(out[name])[0] > 100


def test_a_failing_figure_warns_and_is_skipped(run, tmp_path):
    def boom(tables):
        raise ZeroDivisionError("synthetic")

    def skip(tables):
        raise Skip("nothing to draw")

    with pytest.warns(RuntimeWarning, match="figure broken failed"):
        assert render_figure(FigureSpec("broken", "A", "Broken", (), boom), RunTables(run), tmp_path) == (
            None, "drawing failed (ZeroDivisionError: synthetic)")
    assert render_figure(FigureSpec("skipped", "A", "Skipped", (), skip), RunTables(run), tmp_path) == (
        None, "nothing to draw")


def _texts(fig) -> list:
    """Every visible, non-empty text artist of a drawn figure (titles, labels, ticks, legends)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_no_routing_or_sink_labels_when_no_head_has_the_role(tmp_path):
    """A random model has no routing or sink heads: no legend entry or panel title says so."""
    run = build_run(tmp_path / "run", stages=("attention",))
    tables = RunTables(run)
    titles = [t.get_text() for t in _texts(SPECS["pseudospectra"].draw(tables))]
    assert "sink head (layer 1, head 1)" in titles  # the synthetic sink pick is a sink head
    heads = read_table(run, "heads").assign(role="other")
    write_table(run, "heads", heads)
    tables = RunTables(run)
    for name in ("transient_reserve", "pseudospectra"):
        texts = [t.get_text() for t in _texts(SPECS[name].draw(tables))]
        assert not [s for s in texts if s.startswith(("routing", "sink")) or "routing head" in s or "sink head" in s]
    reserve = SPECS["transient_reserve"].draw(tables)
    assert [t.get_text() for t in reserve.axes[0].get_legend().get_texts()] == ["no excess", f"other ({len(heads)})"]
    titles = [ax.get_title() for ax in SPECS["pseudospectra"].draw(tables).axes if ax.get_title()]
    assert titles == ["largest previous-token/induction score (layer 0, head 1; role: other)",
                      "largest sink mass (layer 1, head 1; role: other)"]


def _coupling_rows(checkpoints, n_boundaries, with_layer=True):
    rows = []
    for c, checkpoint in enumerate(checkpoints):
        for b in range(n_boundaries):
            row = {"checkpoint": checkpoint, "boundary_index": b, "effect": 0.4 * math.sin(b + c), "significant": b % 5 == 0}
            if with_layer:
                row.update(layer=b // 2, sublayer=("attn", "mlp")[b % 2])
            rows.append(row)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("checkpoints, n_boundaries, with_layer", [
    (["trained"], 4, True),
    (["trained", "init", "stage1-step471000-tokens1975B"], 64, True),
    (["trained", "init"], 160, False),
])
def test_coupling_is_a_readable_heatmap(tmp_path, checkpoints, n_boundaries, with_layer):
    """At most the report's width (1100 px) for any depth and number of checkpoints, every label
    at least 8 pt, one cell per boundary."""
    run = build_run(tmp_path / "run", stages=("topology",))
    write_table(run, "coupling", _coupling_rows(checkpoints, n_boundaries, with_layer))
    tables = RunTables(run)
    path, why = render_figure(SPECS["coupling"], tables, tmp_path)
    assert why == ""
    width, height = png_size(path)
    assert 400 <= width <= 1100 and 200 <= height <= 700
    fig = SPECS["coupling"].draw(tables)
    small = [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < 8]
    assert small == []
    image = fig.axes[0].get_images()[0].get_array()
    rows = len(checkpoints) * (2 if with_layer else 1)
    assert image.shape == (rows, n_boundaries // 2 if with_layer else n_boundaries)
    assert int(image.count()) == len(checkpoints) * n_boundaries  # every boundary drawn, none missing
    stars = [t for t in _texts(fig) if t.get_text() == "*"]
    assert len(stars) == sum(b % 5 == 0 for b in range(n_boundaries)) * len(checkpoints)
