"""``depthlens train`` on a tiny model (50 steps, seconds): the loss falls, the same seed gives
the same weights, a killed series resumes to the weights of an uninterrupted one, the
checkpoints load through ``load_model`` and run through every stage, and bad input gets one
line and writes nothing."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.errors import InputError, ModelError, RunError
from depthlens.models import load_model, series_checkpoints
from depthlens.runs import RunMode
from depthlens.stages import run_stages
from depthlens.training import TrainOptions, checkpoint_steps, learning_rate, resolve, train
from depthlens.training.batches import TokenStream
from depthlens.training.build import build_model
from depthlens.workflow import check_plan, run

TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "seq_len": 32, "batch_size": 8, "steps": 50, "lr": 3e-3,
        "warmup": 5, "checkpoints": 4, "eval_seqs": 8, "repeat_fraction": 0.25, "repeat_min": 4, "repeat_max": 12}
FLAGS = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--seq-len", "32", "--batch-size", "8", "--steps", "5",
         "--checkpoints", "2", "--quiet"]
STEPS = [0, 1, 4, 14, 50]


def _options(text_file: Path, **changes: object) -> TrainOptions:
    return TrainOptions(text=str(text_file), **{**TINY, **changes})


def _state(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(str(folder / "model.safetensors")), torch.load(folder / "optimizer.pt", weights_only=True)


def _assert_same_checkpoint(a: Path, b: Path) -> None:
    (wa, oa), (wb, ob) = _state(a), _state(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for k in oa["state"]:
        assert all(torch.equal(oa["state"][k][name], ob["state"][k][name]) for name in oa["state"][k])


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    out = tmp_path_factory.mktemp("train") / "series"
    train(_options(text_file), out, quiet=True)
    return out


def test_log_spaced_checkpoints_and_schedule() -> None:
    assert checkpoint_steps(50, 4) == STEPS
    for steps, n in ((1, 1), (7, 30), (2000, 12), (10**6, 20)):
        got = checkpoint_steps(steps, n)
        assert got[0] == 0 and got[-1] == steps and got == sorted(set(got)) and len(got) <= n + 1
    assert learning_rate(5, 1.0, 5, 50) == 1.0 and learning_rate(50, 1.0, 5, 50) == pytest.approx(0.1)
    assert resolve("induction", steps=7).steps == 7 and resolve(None).repeat_fraction == 0.0


@pytest.mark.parametrize("preset", ["census", "replicates"])
def test_the_census_presets_reach_the_census_claims_minimums(preset: str) -> None:
    """The census preset's series, and the replicates preset's seeds pooled by ``census
    --replicates``, can answer C1-C3: 2 boundaries a layer for C3's topology, a layer for each
    of C1's paired layers, enough checkpoints for C2 and C3, and a context that holds the
    default preset's chunks and probe (what they reach is measured, not here)."""
    from depthlens.attention.options import AttentionOptions
    from depthlens.report.claims import load_claims
    from depthlens.training.presets import PRESET_SEEDS

    need = {c.id[:2]: dict(c.min_sample) for c in load_claims() if c.id[:2] in ("C1", "C2", "C3")}
    options, seeds = resolve(preset), PRESET_SEEDS.get(preset, 1)
    layers = seeds * options.n_layers
    assert 2 * layers >= need["C3"]["boundaries"] and layers >= need["C1"]["paired_layers"]
    assert len(checkpoint_steps(options.steps, options.checkpoints)) >= max(need["C2"]["checkpoints"],
                                                                            need["C3"]["checkpoints"])
    assert max(RunConfig().seq_len, 1 + 2 * AttentionOptions().probe_len) <= options.seq_len


def test_the_batch_of_a_step_depends_on_the_seed_and_step_alone(text_file: Path) -> None:
    options = _options(text_file)
    model, tokenizer = build_model(options)
    stream = TokenStream.build(options, tokenizer)
    first = stream.batch(options, 7)
    assert torch.equal(first, TokenStream.build(options, tokenizer).batch(options, 7))
    assert not torch.equal(first, stream.batch(options, 8))
    assert first.shape == (8, 32) and (first[:, 0] == stream.start).all()
    repeated = first[0, 1:].numpy()  # round(0.25 · 8) = 2 rows of a tiled random block
    period = next(m for m in range(4, 13) if np.array_equal(repeated[m:], repeated[:-m]))
    assert set(repeated[:period]) <= set(stream.ordinary.tolist())
    text = tokenizer.decode(first[2, 1:])  # the other rows are windows of the training text
    assert text in tokenizer.decode(stream.train)


def test_loss_falls_and_the_series_is_complete(series: Path, text_file: Path) -> None:
    assert series_checkpoints(series) == [(f"step-{s}", s) for s in STEPS]
    table = pd.read_parquet(series / "tables" / "training.parquet")
    assert table["step"].tolist() == list(range(51)) and (table["tokens"] == table["step"] * 8 * 32).all()
    assert list(table.columns[:3]) == ["model", "revision", "text"] and set(table["text"]) == {str(text_file)}
    assert math.isnan(table.loc[0, "loss"]) and table["loss"][1:].notna().all()
    assert table["loss"][1:6].mean() > table["loss"][-5:].mean() + 0.5  # from ln 256 ≈ 5.5 down
    held = table.set_index("step")["heldout_loss"]
    assert held.dropna().index.tolist() == STEPS and held[50] < held[0] - 0.5
    assert table["elapsed"].is_monotonic_increasing
    manifest = json.loads((series / "manifest.json").read_text())
    assert manifest["format"] == "depthlens-train" and manifest["status"] == "done"
    assert [c["revision"] for c in manifest["checkpoints"]] == [f"step-{s}" for s in STEPS]
    assert manifest["options"] == _options(text_file).to_dict() and manifest["tokenizer"]["vocab_size"] == 256
    assert {"torch", "transformers", "depthlens"} <= set(manifest["versions"])
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "trainer_state.json"):
        assert (series / "step-14" / name).is_file()
    assert not [p for p in series.iterdir() if p.name.startswith(".")]


def test_same_seed_gives_the_same_weights(series: Path, tmp_path: Path, text_file: Path) -> None:
    train(_options(text_file), tmp_path / "again", quiet=True)
    for name, _ in series_checkpoints(series):
        _assert_same_checkpoint(series / name, tmp_path / "again" / name)
    train(_options(text_file, seed=1, steps=4, checkpoints=1), tmp_path / "other", quiet=True)
    assert not torch.equal(*(_state(p / "step-0")[0]["model.embed_tokens.weight"] for p in (series, tmp_path / "other")))


def test_a_killed_series_resumes_to_the_same_weights(series: Path, tmp_path: Path, text_file: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "killed"
    batch = TokenStream.batch

    def killed_at_step_20(self: TokenStream, options: TrainOptions, step: int) -> torch.Tensor:
        if step == 20:
            raise KeyboardInterrupt
        return batch(self, options, step)

    monkeypatch.setattr(TokenStream, "batch", killed_at_step_20)
    with pytest.raises(KeyboardInterrupt):
        train(_options(text_file), out, quiet=True)
    monkeypatch.undo()
    assert [s for _, s in series_checkpoints(out)] == [0, 1, 4, 14]
    leftover = out / ".step-50.abcd1234.tmp"  # a checkpoint write cut short by a kill
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    with pytest.raises(RunError, match="holds a training series; pass --resume"):
        train(_options(text_file), out, quiet=True)
    train(_options(text_file), out, RunMode.RESUME, quiet=True)
    assert not leftover.exists()
    for name, _ in series_checkpoints(series):
        _assert_same_checkpoint(series / name, out / name)
    ours, theirs = (pd.read_parquet(p / "tables" / "training.parquet") for p in (out, series))
    columns = ["step", "tokens", "loss", "lr", "heldout_loss"]
    pd.testing.assert_frame_equal(ours[columns], theirs[columns])
    assert json.loads((out / "manifest.json").read_text())["status"] == "done"
    before = (out / "step-50" / "model.safetensors").stat().st_mtime_ns
    train(_options(text_file), out, RunMode.RESUME, quiet=True)  # a finished series stays as it is
    assert (out / "step-50" / "model.safetensors").stat().st_mtime_ns == before
    with pytest.raises(RunError, match="it was started with --lr 0.003, not --lr 0.01; rerun"):
        train(_options(text_file, lr=1e-2), out, RunMode.RESUME, quiet=True)


def test_checkpoints_load_as_revisions_of_the_series(series: Path) -> None:
    loaded = load_model(series, revision="step-14")
    assert loaded.provenance["revision"] == "step-14" and loaded.provenance["source"] == "local"
    weights = load_file(str(series / "step-14" / "model.safetensors"))
    assert torch.equal(loaded.model.model.embed_tokens.weight, weights["model.embed_tokens.weight"])
    assert load_model(series).provenance["revision"] == "step-50"
    with pytest.raises(ModelError, match="step-7.*it holds step-0, step-1, step-4, step-14, step-50"):
        load_model(series, revision="step-7")
    check_plan(RunConfig(model=str(series), revision="step-4"), ["capture"])
    with pytest.raises(InputError, match="only applies to hub ids"):  # a single checkpoint has no revisions
        check_plan(RunConfig(model=str(series / "step-4"), revision="step-4"), ["capture"])


def test_a_checkpoint_runs_through_every_stage(series: Path, tmp_path: Path, text_file: Path) -> None:
    config = RunConfig(model=str(series), revision="step-50", text=str(text_file), chunks=3, seq_len=24,
                       null_samples=2, null_chunks=2, extras_chunks=1, probe_seqs=4, probe_len=8, n_perm=50,
                       heldout_chunks=1, ablation_boot=50, clamp_chunks=2, control_seeds=1, clamp_null_samples=1,
                       contest_chunks=2, contest_boot=50, contest_perm=50)
    root = run(config, tmp_path / "run", stages=run_stages(), execution=Execution(quiet=True, jobs=1))
    manifest = json.loads((root / "manifest.json").read_text())
    assert {s: v["status"] for s, v in manifest["stages"].items()} == {s: "done" for s in run_stages()}
    assert manifest["model"]["revision"] == "step-50"
    heads = pd.read_parquet(root / "tables" / "heads.parquet")
    assert set(heads["revision"]) == {"step-50"} and len(heads) == 2 * 2 * heads["checkpoint"].nunique()


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_layernorm_families_train_resume_and_load(family: str, tmp_path: Path, text_file: Path) -> None:
    options = _options(text_file, family=family, steps=6, checkpoints=2)
    train(options, tmp_path / "whole", quiet=True)
    train(_options(text_file, family=family, steps=6, checkpoints=2), tmp_path / "part", quiet=True)
    shutil.rmtree(tmp_path / "part" / "step-6")  # as if killed before its last checkpoint: resumed from step-1
    train(options, tmp_path / "part", RunMode.RESUME, quiet=True)
    _assert_same_checkpoint(tmp_path / "whole" / "step-6", tmp_path / "part" / "step-6")
    loaded = load_model(tmp_path / "whole", revision="step-6")
    assert loaded.family == family and loaded.adapter.n_layers == 2 and loaded.adapter.max_seq_len == 32


def test_the_tokenizer_of_a_model_sets_the_vocabulary(tmp_path: Path, text_file: Path) -> None:
    from depthlens.models.tokenizer import byte_tokenizer

    byte_tokenizer(300, bos_token_id=0, eos_token_id=1).save_pretrained(tmp_path / "tok")
    train(_options(text_file, tokenizer=str(tmp_path / "tok"), steps=2, checkpoints=1), tmp_path / "s", quiet=True)
    loaded = load_model(tmp_path / "s")
    assert loaded.model.config.vocab_size == 300 and len(loaded.tokenizer) == 300
    assert json.loads((tmp_path / "s" / "manifest.json").read_text())["tokenizer"]["vocab_size"] == 300


@pytest.mark.parametrize("flags, message", [
    (["--family", "nope"], "--family 'nope' is unknown; use one of llama"),
    (["--text", "MISSING"], "does not exist"),
    (["--n-heads", "3"], "--n-heads 3 does not divide --d-model 32"),
    (["--repeat-fraction", "0.5", "--repeat-max", "20"], "--repeat-max 20 leaves no room for two copies"),
    (["--tokenizer", "random:llama"], "leave --tokenizer out"),
])
def test_bad_input_gives_one_line_and_writes_nothing(flags: list[str], message: str, tmp_path: Path,
                                                     text_file: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    flags = [str(tmp_path / "missing.txt") if f == "MISSING" else f for f in flags]
    assert main(["train", "--text", str(text_file), *FLAGS, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and not out.exists()


def test_the_output_folder_is_checked_before_anything_is_written(tmp_path: Path, text_file: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    args = ["train", "--text", str(text_file), *FLAGS]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for mode, message in (([], "is not empty and holds no training series"), (["--resume"], "refusing to resume"),
                          (["--overwrite"], "refusing to overwrite")):
        assert main([*args, "--out", str(other), *mode]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
        assert [p.name for p in other.iterdir()] == ["notes.txt"]
    out = tmp_path / "series"
    assert main([*args, "--out", str(out)]) == 0
    assert f"series: {out}" in capsys.readouterr().out
    (out / "notes.txt").write_text("mine")
    assert main([*args, "--out", str(out)]) == 2
    assert "pass --resume to continue it or --overwrite" in capsys.readouterr().err
    assert main([*args, "--seed", "3", "--out", str(out), "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt", "step-0", "step-1", "step-5",
                                                      "tables"]
    assert json.loads((out / "manifest.json").read_text())["options"]["seed"] == 3
    assert main([*args, "--seed", "4", "--out", str(out), "--resume"]) == 2  # it showed two options hashes
    assert capsys.readouterr().err.strip() == (
        f"depthlens: error: cannot resume {out}: it was started with --seed 3, not --seed 4; rerun with the options it "
        "was started with, or pass --overwrite to replace it.")
