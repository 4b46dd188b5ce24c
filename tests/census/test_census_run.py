"""``depthlens census`` on three tiny local checkpoints: the tables equal running each stage by
hand per checkpoint, the loss equals an independent cross-entropy, a corrupt checkpoint is
skipped and recorded while the rest finish, ``--resume`` skips finished checkpoints, and bad
input is refused before anything is written. Also a run with ``--revisions`` of a local series,
whose report gains part C, and ``--delete-cache`` on a hub cache laid out by hand."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from depthlens.census.cache import delete_cached_revision
from depthlens.census.options import CensusOptions
from depthlens.census.runner import run_census
from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.errors import InputError, RunError, RunIncomplete
from depthlens.models import build_random, load_model
from depthlens.models.tokenizer import random_tokenizer
from depthlens.report.census_figures import norm_placement
from depthlens.runs import RunMode, read_manifest
from depthlens.workflow import prepare, run

STEPS = (0, 10, 100)
STAGES = ("attention", "jacobian", "topology")
SIZES = {"chunks": 4, "seq_len": 24, "probe_seqs": 4, "probe_len": 6, "null_samples": 2, "null_chunks": 2,
         "n_perm": 50, "funnel_boot": 40}
QUIET = Execution(quiet=True, jobs=1)
pytestmark = pytest.mark.full_leg


def _series(root: Path, steps: tuple[int, ...] = STEPS, family: str = "llama", size: str = "num_hidden_layers=2"
            ) -> Path:
    """A folder of ``step-N`` checkpoints: a tiny model with other weights at every step."""
    for k, step in enumerate(steps):
        model = build_random(family, size, seed=k)
        folder = root / f"step-{step}"
        model.save_pretrained(folder)
        random_tokenizer(model).save_pretrained(folder)
    return root


def _config(model: Path, text: Path, **extra) -> RunConfig:
    return RunConfig(preset="quick", model=str(model), text=str(text), **SIZES, **extra)


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> tuple[Path, Path]:
    series = _series(tmp_path_factory.mktemp("series") / "ckpts")
    out = tmp_path_factory.mktemp("census") / "census"
    run_census(_config(series, text_file), CensusOptions(census_stages=STAGES), out, execution=QUIET)
    return series, out


def test_census_tables_equal_each_stage_run_by_hand(census: tuple[Path, Path], text_file: Path,
                                                    tmp_path: Path) -> None:
    series, out = census
    table = pd.read_parquet(out / "tables" / "census.parquet")
    heads = pd.read_parquet(out / "tables" / "census_heads.parquet")
    assert table["checkpoint"].tolist() == [f"step-{s}" for s in STEPS] and (table["status"] == "done").all()
    assert table["step"].tolist() == list(STEPS) and set(table["norm"]) == {"RMSNorm"}
    assert table["funnel_step0_over"].iloc[0] == 1.0  # step 0 is its own reference
    for k, step in enumerate(STEPS):
        by_hand = run(_config(series, text_file, revision=f"step-{step}", null="none"), tmp_path / f"hand{step}",
                      stages=STAGES, execution=QUIET)
        sub = out / "checkpoints" / "ckpts" / f"step-{step}"
        for name in ("heads", "head_chunks", "operators", "cumulative", "coupling"):
            pd.testing.assert_frame_equal(pd.read_parquet(sub / "tables" / f"{name}.parquet"),
                                          pd.read_parquet(by_hand / "tables" / f"{name}.parquet"))
        hand = pd.read_parquet(by_hand / "tables" / "heads.parquet")
        mine = heads[heads["order"] == k].reset_index(drop=True)
        for col in ("layer", "head", "role", "prev_token_score", "induction_score", "sink_mass", "delta_TR1", "null_q"):
            pd.testing.assert_series_equal(mine[col], hand[col], check_names=False)
        cumulative = pd.read_parquet(by_hand / "tables" / "cumulative.parquet")
        curve = cumulative[(cumulative["schur_alpha"] == 1.0) & (cumulative["direction"] == "backward")
                           & (cumulative["checkpoint"] == "trained")].sort_values("steps")
        # a rank cap of 512 above d = 64 caps nothing: the claims' funnel is the exact product
        assert table.loc[k, "erank_full_depth"] == curve["erank"].iloc[-1]
        assert table.loc[k, "erank_one_step"] == curve["erank"].iloc[0]
        coupling = pd.read_parquet(by_hand / "tables" / "coupling.parquet")
        assert table.loc[k, "coupling_significant"] == coupling["significant"].sum()
        assert table.loc[k, "coupling_tested"] == len(coupling)
    # C2's interval: step 0's replicate k over checkpoint's replicate k (the same resampled chunks)
    def replicates(step: int) -> pd.Series:
        boot = pd.read_parquet(out / "checkpoints" / "ckpts" / f"step-{step}" / "tables" / "funnel_boot.parquet")
        return boot[boot["replicate"] >= 1].set_index("replicate")["erank_full_depth"]

    assert (table.loc[0, "funnel_step0_over_lo"], table.loc[0, "funnel_step0_over_hi"]) == (1.0, 1.0)
    for k, step in enumerate(STEPS[1:], start=1):
        ratios = sorted((replicates(0) / replicates(step)).to_numpy())
        assert len(ratios) == 40
        for q, column in ((0.025, "funnel_step0_over_lo"), (0.975, "funnel_step0_over_hi")):
            h = 39 * q  # linear interpolation between order statistics, written out
            want = ratios[int(h)] + (h - int(h)) * (ratios[int(h) + 1] - ratios[int(h)])
            assert table.loc[k, column] == pytest.approx(want, rel=1e-12)


def test_census_loss_is_the_cross_entropy_of_the_checkpoint(census: tuple[Path, Path], text_file: Path) -> None:
    series, out = census
    table = pd.read_parquet(out / "tables" / "census.parquet")
    config = _config(series, text_file, revision="step-10")
    loaded = load_model(str(series), revision="step-10")
    ids = prepare(config, loaded).token_ids
    with torch.no_grad():
        logits = loaded.model(input_ids=ids).logits.double()
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    assert table.loc[1, "loss"] == pytest.approx(float(expected), rel=1e-6)


def test_census_report_shows_part_c_and_its_claims(census: tuple[Path, Path]) -> None:
    _, out = census
    page = (out / "report.html").read_text()
    assert "Part C. Training dynamics" in page and "Part A." not in page
    for claim in ("C1-consolidation-after-formation", "C2-funnel-learned-census", "C3-coupling-trend"):
        assert claim in page
    assert "B2-funnel-trained" not in page  # a census directory scores only the census claims
    assert 'id="fig-census_funnel"><img' in page and 'id="fig-census_coupling"><img' in page


def test_resume_skips_finished_checkpoints(census: tuple[Path, Path], text_file: Path) -> None:
    series, out = census
    before = pd.read_parquet(out / "tables" / "census.parquet")
    marker = out / "checkpoints" / "ckpts" / "step-0" / "tables" / "heads.parquet"
    stamp = marker.stat().st_mtime_ns
    run_census(_config(series, text_file), CensusOptions(census_stages=STAGES), out, run_mode=RunMode.RESUME,
               execution=QUIET)
    assert marker.stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "census.parquet"), before)


def test_a_corrupt_checkpoint_is_skipped_and_recorded(tmp_path: Path, text_file: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    series = _series(tmp_path / "ckpts")
    weights = series / "step-10" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(RunIncomplete) as stopped:  # the census goes on, then says what failed
        run_census(_config(series, text_file), CensusOptions(census_stages=("attention",)), tmp_path / "census",
                   execution=QUIET)
    out = Path(stopped.value.root)
    assert [f.unit for f in stopped.value.failures] == ["step-10"]
    assert (out / "report.html").is_file()
    table = pd.read_parquet(out / "tables" / "census.parquet")
    assert table["status"].tolist() == ["done", "failed", "done"]
    assert "step-10" in table.loc[1, "error"] or "safetensors" in table.loc[1, "error"]
    lines = [line for line in capsys.readouterr().err.splitlines() if "the others go on" in line]
    assert len(lines) == 1 and "step-10" in lines[0]
    heads = pd.read_parquet(out / "tables" / "census_heads.parquet")
    assert set(heads["checkpoint"]) == {"step-0", "step-100"}


def test_a_probe_beyond_the_context_is_refused_up_front(tmp_path: Path, text_file: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """The checkpoints declare a 32-token context, and the probe [BOS, r, r] of --probe-len 16
    needs 33: exit 2 naming --probe-len before anything is written (it once ran every checkpoint
    to 'incomplete' and exited 0)."""
    series = tmp_path / "ckpts"
    for step in (0, 10):
        model = build_random("llama", "num_hidden_layers=1,max_position_embeddings=32", seed=step)
        model.save_pretrained(series / f"step-{step}")
        random_tokenizer(model).save_pretrained(series / f"step-{step}")
    target = tmp_path / "census"
    capsys.readouterr()
    code = main(["census", "--model", str(series), "--preset", "quick", "--text", str(text_file), "--chunks", "2",
                 "--seq-len", "16", "--jobs", "1", "--out", str(target), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--probe-len 16" in err[0] and "--probe-len 15 or less" in err[0]
    assert not target.exists()


def test_an_incomplete_checkpoint_ends_the_census_with_exit_3(tmp_path: Path, text_file: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    series = _series(tmp_path / "ckpts", steps=(0, 10))
    (series / "step-10" / "model.safetensors").write_bytes(b"not weights")
    capsys.readouterr()
    code = main(["census", "--model", str(series), "--text", str(text_file), "--census-stages", "attention",
                 *(f"--{k.replace('_', '-')}={v}" for k, v in SIZES.items()), "--preset", "quick", "--jobs", "1",
                 "--out", str(tmp_path / "census"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 3
    assert [line for line in err.splitlines() if line.startswith("depthlens: error:")] == [
        line for line in err.splitlines() if "census unit step-10 failed" in line]


def test_bad_input_writes_nothing(tmp_path: Path, text_file: Path, census: tuple[Path, Path]) -> None:
    series, out = census
    target = tmp_path / "never"
    with pytest.raises(InputError, match="--revisions"):
        run_census(_config("EleutherAI/pythia-70m", text_file), CensusOptions(), target, execution=QUIET)
    with pytest.raises(InputError, match="not a checkpoint of"):
        run_census(_config(series, text_file, revisions=("step-7",)), CensusOptions(), target, execution=QUIET)
    with pytest.raises(InputError, match="--census-stages"):
        CensusOptions(census_stages=("nope",))
    assert not target.exists()
    with pytest.raises(RunError, match="--resume"):
        run_census(_config(series, text_file), CensusOptions(census_stages=STAGES), out, execution=QUIET)
    assert main(["census", "--model", "random:llama", "--out", str(target), "--quiet"]) == 2
    assert not target.exists()


def test_compare_puts_a_layernorm_series_beside_an_rmsnorm_one(tmp_path: Path, text_file: Path) -> None:
    rms = _series(tmp_path / "rms", steps=(0, 10))
    ln = _series(tmp_path / "ln", steps=(0, 10), family="gpt_neox", size="num_hidden_layers=2")
    out = run_census(_config(rms, text_file), CensusOptions(census_stages=("attention",), compare=(str(ln),)),
                     tmp_path / "census", execution=QUIET)
    table = pd.read_parquet(out / "tables" / "census.parquet")
    assert table.groupby("series")["norm"].first().to_dict() == {str(rms): "RMSNorm", str(ln): "LayerNorm"}
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["ln", "rms"]
    page = (out / "report.html").read_text()
    assert 'id="fig-census_norms"><img' in page and "Where heads and reserve sit, per series" in page
    heads = pd.read_parquet(out / "tables" / "census_heads.parquet")
    last = heads[(heads["series"] == str(ln)) & (heads["checkpoint"] == "step-10")]
    placed = norm_placement(heads, table)
    mine = placed[placed["series"] == str(ln)].set_index("layer")
    for layer, group in last.groupby("layer"):
        assert mine.loc[layer, "n_sink"] == (group["role"] == "sink").sum()
        assert mine.loc[layer, "n_routing"] == (group["role"] == "routing").sum()


def test_run_with_revisions_of_a_series_reports_part_c(tmp_path: Path, text_file: Path) -> None:
    series = _series(tmp_path / "ckpts")
    out = run(_config(series, text_file, revision="step-100", revisions=("step-0", "step-10")), tmp_path / "run",
              stages=("attention", "jacobian"), execution=QUIET, report=True)
    census = pd.read_parquet(out / "tables" / "census.parquet")
    assert census["checkpoint"].tolist() == ["init", "step-0", "step-10", "trained"]
    assert census["step"].tolist()[:3] == [0, 0, 10] and census["step"].iloc[3] == 100
    heads = pd.read_parquet(out / "tables" / "census_heads.parquet")
    assert set(heads["checkpoint"]) == {"step-0", "step-10", "trained"}
    assert "Part C. Training dynamics" in (out / "report.html").read_text()
    stages = read_manifest(out)["stages"]  # the census tables are a stage, with its status and time
    assert stages["census"]["status"] == "done" and stages["census"]["seconds"] >= 0


def test_delete_cache_removes_only_that_revision(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    for ref, commit in (("step1", "a" * 40), ("step2", "b" * 40)):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        blob = repo / "blobs" / (commit[:1] * 64)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(b"x" * 1000)
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "model.safetensors").symlink_to(Path("../..") / "blobs" / blob.name)
    assert delete_cached_revision("org/tiny", "step1", tmp_path / "hub") == 1000
    assert not (repo / "snapshots" / ("a" * 40)).exists() and (repo / "snapshots" / ("b" * 40)).exists()
    assert delete_cached_revision("org/tiny", "step1", tmp_path / "hub") == 0
    assert delete_cached_revision("org/other", "step2", tmp_path / "hub") == 0
    shutil.rmtree(tmp_path / "hub")


def test_replicates_share_the_steps_and_are_marked_for_pooling(tmp_path: Path, text_file: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    first, second = _series(tmp_path / "first", steps=(0, 10)), _series(tmp_path / "second", steps=(0, 10))
    other = _series(tmp_path / "other", steps=(0, 5))
    target = tmp_path / "never"
    assert main(["census", "--model", str(first), "--replicates", str(other), "--census-stages", "attention",
                 "--text", str(text_file), "--out", str(target), "--quiet"]) == 2  # steps 0, 5 against 0, 10
    assert not target.exists()
    with pytest.raises(InputError, match="both in --compare and in --replicates"):
        CensusOptions(replicates=(str(second),), compare=(str(second),))
    for flag in ("--replicates", "--compare"):  # a series named twice, or --model itself, is refused, not dropped
        with pytest.raises(InputError, match=f"{flag} lists .* twice"):
            CensusOptions(**{flag[2:]: (str(second), str(other), str(second))})
        assert main(["census", "--model", str(first), flag, f"{second},{first}", "--census-stages", "attention",
                     "--text", str(text_file), "--out", str(target), "--quiet"]) == 2
        assert f"{flag} lists --model {first} itself" in capsys.readouterr().err and not target.exists()
    out = run_census(_config(first, text_file),
                     CensusOptions(census_stages=("attention",), replicates=(str(second),), compare=(str(other),)),
                     tmp_path / "census", execution=QUIET)
    expected = {str(first): 0, str(second): 1, str(other): -1}
    for name in ("census", "census_heads"):
        table = pd.read_parquet(out / "tables" / f"{name}.parquet")
        assert table.groupby("series")["replicate"].unique().map(list).to_dict() == {
            k: [v] for k, v in expected.items()}
