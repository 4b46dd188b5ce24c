"""The lens stage end to end on a tiny random model: its table is the metrics of the mean of
the per-chunk transports computed directly, its artifact reads back as their float16 rounding,
and sizes it cannot fit are refused before the model loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.errors import InputError
from depthlens.executors import Execution
from depthlens.lens import TransportSums, read_transport, transport_table, write_transport
from depthlens.models import load_model
from depthlens.stages import run_stages
from depthlens.workflow import check_plan, prepare, run

QUIET = Execution(quiet=True, jobs=1)


def test_the_stage_fits_the_mean_of_its_chunks(tmp_path: Path) -> None:
    config = RunConfig(model="random:llama", chunks=3, seq_len=20, lens_chunks=2, lens_skip_first=4, lens_dtype="float32")
    out = run(config, tmp_path / "run", stages=("lens",), execution=QUIET)
    ids = prepare(config).chunks.ids
    sums = TransportSums.for_model(load_model("random:llama").model, skip_first=4, skip_last=1)
    for c in range(2):
        sums.add(ids[c])
    expected, _ = transport_table(sums.mean())
    table = pd.read_parquet(out / "tables" / "transport.parquet")
    assert table["n_prompts"].tolist() == [2, 2] and set(table["model"]) == {"random:llama"}
    pd.testing.assert_frame_equal(table.drop(columns=["model", "revision", "text", "n_prompts"]), expected,
                                  check_exact=False, rtol=1e-12, atol=1e-12)
    lens = read_transport(out / "arrays" / "lens.pt")
    assert (lens.n_prompts, lens.dtype, lens.metadata["skip_first"]) == (2, "float32", 4)
    for layer, J in lens:
        np.testing.assert_allclose(J, sums.mean()[layer].astype(np.float32), rtol=0, atol=1e-6)
    assert "lens" not in run_stages()  # hours on a large model: not part of depthlens run


def test_sizes_without_a_source_position_are_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match="--seq-len 17 leaves the lens stage no source position.*--seq-len 18 or more"):
        check_plan(RunConfig(model="random:llama", seq_len=17), ["lens"])
    check_plan(RunConfig(model="random:llama", seq_len=18), ["lens"])
    with pytest.raises(InputError, match="--stream-layers"):
        check_plan(RunConfig(model="random:llama:init=layerwise", seq_len=32, stream_layers=True), ["lens"])
    assert main(["lens", "--model", "random:llama", "--seq-len", "8", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lens-skip-first" in err[0] and not (tmp_path / "r").exists()


def test_lens_from_a_file_analyses_it_without_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``depthlens lens --from FILE``: the transport table of a float16 artifact, its identity
    from the artifact's metadata; a file that is not one exits 2 in one line and writes nothing."""
    rng = np.random.default_rng(0)
    matrices = {layer: np.eye(10) + rng.standard_normal((10, 10)) / 3 for layer in (0, 1, 2)}
    path = write_transport(tmp_path / "published.pt", matrices, n_prompts=5, metadata={"model": "org/tiny"})
    out = tmp_path / "run"
    assert main(["lens", "--from", str(path), "--out", str(out), "--quiet"]) == 0
    table = pd.read_parquet(out / "tables" / "transport.parquet")
    expected, _ = transport_table(path)
    assert set(table["model"]) == {"org/tiny"} and set(table["text"]) == {""} and set(table["n_prompts"]) == {5}
    pd.testing.assert_frame_equal(table.drop(columns=["model", "revision", "text", "n_prompts"]), expected)
    assert main(["lens", "--from", str(path), "--out", str(out), "--resume", "--quiet"]) == 0  # done: read back
    capsys.readouterr()
    bad = tmp_path / "bad.pt"
    bad.write_text("not a lens")
    assert main(["lens", "--from", str(bad), "--out", str(tmp_path / "refused"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a Jacobian-lens artifact" in err[0] and not (tmp_path / "refused").exists()


@pytest.mark.parametrize(("model", "subs"), [("random:llama:num_hidden_layers=4", ("attn", "mlp")),
                                           ("random:gemma4:num_hidden_layers=4", ("attn", "mlp", "ple"))])
def test_the_report_sets_the_transport_beside_the_product_of_mean_jacobians(tmp_path: Path, model, subs) -> None:
    """``transport_against_product``: layer ℓ's transport erank beside the erank of the product of
    the saved mean sub-layer Jacobians over the layers after ℓ (NumPy, from the arrays; three a
    layer on Gemma 4), the descriptive ratio at layer 0, and the figure drawn from both."""
    from depthlens.report.figures import FIGURES, render_figure
    from depthlens.report.statistics import compute_statistic
    from depthlens.report.statistics.residual import transport_against_product
    from depthlens.runs.atomic import map_safetensors
    from depthlens.runs.tables import RunTables

    config = RunConfig(model=model, chunks=3, seq_len=20, lens_chunks=2,
                       lens_skip_first=4, jacobian_mode="isolated", funnel_rank=0, funnel_alphas=(1.0,), funnel_boot=0,
                       null="none")
    out = run(config, tmp_path / "run", stages=("jacobian", "lens"), execution=QUIET)
    tables = RunTables(out)
    pairs = transport_against_product(tables)
    assert pairs["layer"].tolist() == [0, 1, 2] and not pairs["truncated"].any()
    saved = map_safetensors(out / "arrays" / "jacobians_trained_isolated.safetensors")
    transport = pd.read_parquet(out / "tables" / "transport.parquet").set_index("layer")
    for layer in range(3):
        product = np.eye(64)
        for k in range(layer + 1, 4):  # J_mlp J_attn (J_ple J_mlp J_attn) of each later layer, the last one leftmost
            for kind in subs:
                product = saved[f"{k}.{kind}"] @ product
        s = np.linalg.svd(product, compute_uv=False)
        p = s**2 / np.sum(s**2)
        row = pairs.set_index("layer").loc[layer]
        assert row["erank_product"] == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-9)
        assert row["erank_transport"] == transport.loc[layer, "erank"]
    value, _ = compute_statistic("funnel_product_over_transport", tables)
    assert value == pytest.approx(pairs.loc[0, "erank_product"] / pairs.loc[0, "erank_transport"])
    spec = next(f for f in FIGURES if f.name == "transport_funnel")
    path, why = render_figure(spec, tables, tmp_path / "figures")
    assert path is not None and path.is_file(), why
