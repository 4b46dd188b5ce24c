"""The lens readout against a direct computation: Hugging Face's own hidden states, moved by
the transport in float64 and unembedded by a float64 copy of the final norm and head; the
logit lens is the lens of the identity; a streamed model reads as the in-memory one; and the
command line writes the table, the figure and the report (on a tiny model, and marked
``real``, on SmolLM2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens.api import open_run
from depthlens.cli import main
from depthlens.errors import InputError, RunError
from depthlens.lens import write_transport
from depthlens.lens.readout import READOUT_COLUMNS, readout, top_predictions
from depthlens.models import load_model
from depthlens.models.float64 import Float64Mode, double_copy

SPEC = "random:llama:init=layerwise,num_hidden_layers=3"


def test_top_predictions_are_the_largest_softmax_entries() -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((4, 50)) * 3
    ids, logit, prob = top_predictions(z, 5)
    full = np.exp(z - z.max(axis=1, keepdims=True))
    full /= full.sum(axis=1, keepdims=True)
    for row in range(4):
        order = sorted(range(50), key=lambda j: -z[row, j])[:5]
        assert ids[row].tolist() == order
        np.testing.assert_allclose(prob[row], full[row, order], rtol=1e-14)
        np.testing.assert_array_equal(logit[row], z[row, order])
    with pytest.raises(InputError, match="top_k is 51"):
        top_predictions(z, 51)


def _lens(d: int, layers: tuple[int, ...], seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {layer: np.eye(d) + rng.standard_normal((d, d)) / 8 for layer in layers}


def test_readout_equals_a_direct_float64_computation() -> None:
    loaded = load_model(SPEC)
    model64 = double_copy(loaded.model).eval()
    ids = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(5))
    lens = _lens(64, (0, 1))
    table = readout(loaded.adapter, lens, ids, top_k=3)
    assert list(table.columns) == list(READOUT_COLUMNS)
    assert sorted(table["layer"].unique()) == [0, 1, 2] and len(table) == 3 * 9 * 2 * 3
    with torch.no_grad(), Float64Mode():
        hidden = loaded.model(input_ids=ids, output_hidden_states=True).hidden_states  # [ℓ + 1]: block ℓ's output
        for layer in (0, 1):
            h = hidden[layer + 1][0].double()
            for kind, x in (("jacobian", h @ torch.from_numpy(lens[layer]).T), ("logit", h)):
                direct = model64.lm_head(model64.model.norm(x)).numpy()
                _check_against(table[(table["layer"] == layer) & (table["lens"] == kind)], direct, 3)
        output = loaded.model(input_ids=ids).logits[0].double().numpy()
    last = table[table["layer"] == 2]
    for kind in ("jacobian", "logit"):  # the last layer reads the model's own output
        _check_against(last[last["lens"] == kind], output, 3)


def _check_against(got: pd.DataFrame, direct: np.ndarray, k: int) -> None:
    """Each reported prediction is the direct computation's logit of that token (float32 to
    1e-4), the k of a position are distinct and none falls below the direct k-th largest by
    more than that tolerance (so a near tie may swap two ranks, but no token is wrong), and
    its probability is the direct softmax's."""
    got = got.sort_values(["position", "rank"])
    positions, ids = got["position"].to_numpy(), got["token_id"].to_numpy()
    tol = 1e-4 * np.abs(direct).max()
    np.testing.assert_allclose(got["logit"].to_numpy(), direct[positions, ids], rtol=0, atol=tol)
    softmax = np.exp(direct - direct.max(axis=1, keepdims=True))
    softmax /= softmax.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got["prob"].to_numpy(), softmax[positions, ids], rtol=1e-3, atol=1e-6)
    kth = np.sort(direct, axis=1)[:, -k]
    assert (direct[positions, ids] >= kth[positions] - 2 * tol).all()
    assert all(len(set(g)) == k for g in ids.reshape(-1, k))


def test_the_identity_lens_is_the_logit_lens_and_a_streamed_model_reads_the_same() -> None:
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(6))
    loaded = load_model(SPEC)
    identity = readout(loaded.adapter, {0: np.eye(64), 1: np.eye(64)}, ids, top_k=2)
    jac, logit = (identity[identity["lens"] == k].drop(columns="lens").reset_index(drop=True)
                  for k in ("jacobian", "logit"))
    pd.testing.assert_frame_equal(jac, logit)
    lens = _lens(64, (0, 1), seed=2)
    streamed = readout(load_model(SPEC, stream_layers=True).adapter, lens, ids, top_k=2)
    pd.testing.assert_frame_equal(streamed, readout(loaded.adapter, lens, ids, top_k=2), check_exact=False,
                                  rtol=1e-6, atol=1e-6)
    with pytest.raises(InputError, match="no transport of layer 1"):
        readout(loaded.adapter, {0: np.eye(64)}, ids, layers=[1])
    with pytest.raises(InputError, match="the lens is 32 wide and the model 64"):
        readout(loaded.adapter, {0: np.eye(32)}, ids)


def test_the_command_line_reads_a_prompt_into_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["lens", "--model", SPEC, "--chunks", "2", "--seq-len", "20", "--lens-chunks", "1",
                 "--lens-skip-first", "4", "--out", str(out), "--quiet", "--readout", "the cat sat",
                 "--readout-top-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "top prediction by layer" in printed and "transport erank by source layer" in printed
    table = pd.read_parquet(out / "tables" / "readout.parquet")
    assert set(table["prompt"]) == {"the cat sat"} and set(table["model"]) == {SPEC}
    run = open_run(out)
    again = run.readout("the cat sat", top_k=2)
    pd.testing.assert_frame_equal(table.drop(columns=["model", "revision", "text"]), again)
    one = run.readout("the cat sat", 0, top_k=1)
    assert set(one["layer"]) == {0} and set(one["rank"]) == {0}
    assert (out / "figures" / "lens_readout.png").is_file()
    page = (out / "report.html").read_text()
    assert "What each layer predicts" in page and "Lens readout" in page
    # a lens file alone reads through --model; without a model, Python says what is missing
    lens = write_transport(tmp_path / "lens.pt", _lens(64, (0, 1)), n_prompts=1, metadata={"model_name": SPEC})
    assert main(["lens", "--from", str(lens), "--model", SPEC, "--out", str(tmp_path / "from"), "--quiet",
                 "--readout", "the cat sat"]) == 0
    assert pd.read_parquet(tmp_path / "from" / "tables" / "readout.parquet")["layer"].max() == 2
    with pytest.raises(RunError, match="pass the model it was fitted on"):
        open_run(tmp_path / "from").readout("the cat sat")
    capsys.readouterr()
    assert main(["lens", "--model", SPEC, "--out", str(tmp_path / "bad"), "--quiet", "--readout", "x",
                 "--readout-top-k", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--readout-top-k 0 is invalid" in err[0] and not (tmp_path / "bad").exists()


def test_a_streamed_model_fits_and_reads_from_the_command_line(tmp_path: Path) -> None:
    """``depthlens lens --stream-layers --readout``: the same tables as the in-memory run."""
    outs = []
    for flags in ([], ["--stream-layers"]):
        out = tmp_path / f"run{len(flags)}"
        assert main(["lens", "--model", SPEC, "--chunks", "1", "--seq-len", "12", "--lens-chunks", "1",
                     "--lens-skip-first", "2", "--out", str(out), "--quiet", "--readout", "a b c", *flags]) == 0
        outs.append(out)
    for name in ("transport", "readout"):
        pd.testing.assert_frame_equal(pd.read_parquet(outs[1] / "tables" / f"{name}.parquet"),
                                      pd.read_parquet(outs[0] / "tables" / f"{name}.parquet"), check_exact=False,
                                      rtol=1e-6, atol=1e-9)


@pytest.mark.real
def test_smollm2_reads_out_through_its_own_lens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On SmolLM2, a lens of its top two source layers fitted on one chunk reads a prompt; at
    the model's output both lenses are the model's own prediction."""
    out = tmp_path / "run"
    assert main(["lens", "--model", "smollm2-135m", "--chunks", "1", "--seq-len", "24", "--lens-chunks", "1",
                 "--lens-layers", "27,28", "--out", str(out), "--quiet",
                 "--readout", "The capital of France is the city of"]) == 0
    table = pd.read_parquet(out / "tables" / "readout.parquet")
    assert sorted(table["layer"].unique()) == [27, 28, 29]
    top = table[(table["rank"] == 0) & (table["position"] == table["position"].max())].set_index(["layer", "lens"])
    assert top.loc[(29, "jacobian"), "prediction"] == top.loc[(29, "logit"), "prediction"]
    assert 0.0 < top.loc[(28, "jacobian"), "prob"] <= 1.0
