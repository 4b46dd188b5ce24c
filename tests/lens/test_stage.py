"""The lens stage end to end on a tiny random model: its table is the metrics of the mean of
the per-chunk transports computed directly, its artifact reads back as their float16 rounding,
and sizes it cannot fit are refused before the model loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.errors import InputError
from depthlens.executors import Execution
from depthlens.lens import PROVENANCE_KEYS, TransportSums, read_transport, transport_table, write_transport
from depthlens.models import load_model
from depthlens.stages import run_stages
from depthlens.workflow import check_plan, prepare, run

QUIET = Execution(quiet=True, jobs=1)


def _plain(value: object) -> bool:
    """What TransformerLens's metadata check accepts: None, bool, int, float, str, and lists,
    tuples and string-keyed dicts of them."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    return type(value) is dict and all(type(k) is str and _plain(v) for k, v in value.items())


def _load_as_transformer_lens(path: Path, n_layers: int, model_name: str) -> dict:
    """The artifact read as TransformerLens's ``JacobianLens.load`` and ``validate_model`` read
    it (the format, not the package): a ``weights_only`` load, ``J`` as int layer → (d, d),
    ``n_prompts`` and ``d_model`` as ints, plain metadata whose ``model_name`` is the model's,
    source layers in ``0 .. L − 2`` and the target the final block."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    jacobians = {int(layer): matrix.float() for layer, matrix in payload["J"].items()}
    d_model, metadata = int(payload["d_model"]), payload.get("metadata") or {}
    assert all(m.shape == (d_model, d_model) for m in jacobians.values())
    assert _plain(metadata) and metadata.get("model_name") == model_name
    assert all(0 <= layer < n_layers - 1 for layer in jacobians)
    assert int(metadata.get("target_layer", n_layers - 1)) == n_layers - 1
    assert sorted(jacobians) == payload["source_layers"] and int(payload.get("n_prompts", 0)) >= 1
    return {"J": jacobians, "n_prompts": int(payload["n_prompts"]), "d_model": d_model, "metadata": metadata}


def test_the_stage_fits_the_mean_of_its_chunks(tmp_path: Path) -> None:
    config = RunConfig(model="random:llama:num_hidden_layers=4", chunks=3, seq_len=20, lens_chunks=2,
                       lens_layers=(2, 0), lens_skip_first=4, lens_dtype="float32")
    out = run(config, tmp_path / "run", stages=("lens",), execution=QUIET)
    ids = prepare(config).chunks.ids
    sums = TransportSums.for_model(load_model("random:llama:num_hidden_layers=4").model, [0, 2], skip_first=4,
                                   skip_last=1)
    for c in range(2):
        sums.add(ids[c])
    expected, _ = transport_table(sums.mean())
    table = pd.read_parquet(out / "tables" / "transport.parquet")
    assert table["layer"].tolist() == [0, 2] and table["n_prompts"].tolist() == [2, 2]
    assert set(table["model"]) == {"random:llama:num_hidden_layers=4"}
    pd.testing.assert_frame_equal(table.drop(columns=["model", "revision", "text", "n_prompts"]), expected,
                                  check_exact=False, rtol=1e-12, atol=1e-12)
    lens = read_transport(out / "arrays" / "lens.pt")
    assert (lens.n_prompts, lens.dtype, lens.source_layers) == (2, "float32", (0, 2))
    meta = lens.metadata
    assert [key for key in PROVENANCE_KEYS if key not in meta] == []
    assert (meta["model_name"], meta["target_layer"], meta["skip_first_positions"], meta["estimator"]) == (
        "random:llama:num_hidden_layers=4", 3, 4, "jacobian_lens")
    assert (meta["corpus"], meta["n_prompts"], meta["max_seq_len"], meta["fit_dtype"]) == ("python-docs", 2, 20,
                                                                                            "float64")
    for layer, J in lens:
        np.testing.assert_allclose(J, sums.mean()[layer].astype(np.float32), rtol=0, atol=1e-6)
    loaded = _load_as_transformer_lens(out / "arrays" / "lens.pt", 4, "random:llama:num_hidden_layers=4")
    assert (loaded["n_prompts"], loaded["d_model"], sorted(loaded["J"])) == (2, 64, [0, 2])
    fit = torch.load(out / "arrays" / "lens_fit.pt", weights_only=True)
    assert (fit["n_done"], fit["source_layers"], fit["target_layer"], fit["chunks"]) == (2, [0, 2], 3, [0, 1])
    assert "lens" not in run_stages()  # hours on a large model: not part of depthlens run


def test_a_streamed_run_fits_what_the_in_memory_run_fits(tmp_path: Path) -> None:
    spec = "random:llama:init=layerwise,num_hidden_layers=3"
    tables = []
    for streamed in (False, True):
        config = RunConfig(model=spec, chunks=2, seq_len=12, lens_chunks=2, lens_skip_first=2,
                           stream_layers=streamed)
        out = run(config, tmp_path / f"run{streamed}", stages=("lens",), execution=QUIET)
        tables.append(pd.read_parquet(out / "tables" / "transport.parquet"))
    assert tables[0]["layer"].tolist() == [0, 1]
    pd.testing.assert_frame_equal(tables[1], tables[0], check_exact=False, rtol=1e-9, atol=1e-12)


def test_sizes_without_a_source_position_are_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InputError, match="--seq-len 17 leaves the lens stage no source position.*--seq-len 18 or more"):
        check_plan(RunConfig(model="random:llama", seq_len=17), ["lens"])
    check_plan(RunConfig(model="random:llama", seq_len=18), ["lens"])
    with pytest.raises(InputError, match="--lens-layers -1 is invalid"):
        RunConfig(model="random:llama", lens_layers=(-1,))
    assert main(["lens", "--model", "random:llama", "--seq-len", "8", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lens-skip-first" in err[0] and not (tmp_path / "r").exists()
    assert main(["lens", "--model", "random:llama", "--lens-layers", "1", "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lens-layers 1: source layers are 0 .. 0" in err[0] and not (tmp_path / "r").exists()


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
    written_by_tl = tmp_path / "tl.pt"  # as TransformerLens's JacobianLens.save writes a fit of its own
    torch.save({"J": {k: torch.tensor(v, dtype=torch.float16) for k, v in matrices.items()}, "n_prompts": 5,
                "source_layers": [0, 1, 2], "d_model": 10,
                "metadata": {"model_name": "org/tl", "model_revision": None, "transformer_lens_version": "4.3.0",
                             "estimator": "jacobian_lens", "processing": {"compatibility_mode": False},
                             "target_layer": 3, "skip_first_positions": 16, "transformer_lens_fit": True}},
               written_by_tl)
    checkpoint = tmp_path / "tl_fit.pt"  # and the reference fitting loop's checkpoint
    torch.save({"jacobian_sum": {k: torch.tensor(5 * v, dtype=torch.float32) for k, v in matrices.items()},
                "n_done": 5, "next_idx": 5, "source_layers": [0, 1, 2], "target_layer": 3, "skip_first": 16},
               checkpoint)
    for file, name in ((written_by_tl, "org/tl"), (checkpoint, str(checkpoint))):
        assert main(["lens", "--from", str(file), "--out", str(tmp_path / file.stem), "--quiet"]) == 0
        table = pd.read_parquet(tmp_path / file.stem / "tables" / "transport.parquet")
        assert set(table["model"]) == {name} and table["layer"].tolist() == [0, 1, 2]
        pd.testing.assert_frame_equal(table.drop(columns=["model", "revision", "text", "n_prompts"]),
                                      transport_table(file)[0], check_exact=False, rtol=1e-6)
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


def test_a_resume_of_a_finished_lens_run_renders_the_report_and_prints_the_transport(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``depthlens lens --resume`` into a finished run recomputes nothing, renders report.html
    again and prints each source layer's transport erank as the run's table holds it."""
    out = tmp_path / "run"
    argv = ["lens", "--model", "random:llama:num_hidden_layers=4", "--chunks", "2", "--seq-len", "20", "--lens-chunks",
            "1", "--lens-layers", "0,2", "--lens-skip-first", "4", "--out", str(out), "--quiet", "--jobs", "1"]
    assert main(argv) == 0
    (out / "report.html").unlink()
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert (out / "report.html").is_file()
    start = next(i for i, line in enumerate(printed) if line.startswith("transport erank by source layer"))
    rows = [line.split() for line in printed[start + 1:] if line.startswith("  layer ")]
    shown = {int(words[1].rstrip(":")): float(words[2]) for words in rows}
    table = pd.read_parquet(out / "tables" / "transport.parquet")
    assert sorted(shown) == sorted(int(layer) for layer in table["layer"]) == [0, 2]
    for layer, erank in zip(table["layer"], table["erank"]):
        assert shown[int(layer)] == pytest.approx(float(erank), abs=0.0051)
