"""The command line end to end on a tiny random model: outputs, errors, exit codes, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import depthlens
from depthlens.cli import main

#: The folder this depthlens is imported from, for a child process started in another folder.
SOURCE = str(Path(depthlens.__file__).resolve().parents[1])



def _args(text: Path, out: Path, *extra: str) -> list[str]:
    return ["capture", "--model", "random:llama", "--text", str(text), "--chunks", "6", "--seq-len", "24",
            "--batch-size", "2", "--out", str(out), "--quiet", *extra]


def test_capture_writes_tables(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(_args(text_file, out)) == 0
    assert "run directory" in capsys.readouterr().out
    patterns = pd.read_parquet(out / "tables" / "attention_patterns.parquet")
    summary = pd.read_parquet(out / "tables" / "attention_summary.parquet")
    residual = pd.read_parquet(out / "tables" / "residual_summary.parquet")
    from depthlens.models import load_model

    adapter = load_model("random:llama").adapter
    n_heads, n_layers = adapter.n_heads, adapter.n_layers
    assert len(patterns) == n_layers * n_heads * 6 and len(summary) == n_layers * n_heads
    assert len(residual) == 6 * (2 * n_layers + 1)
    assert set(patterns.columns) >= {"model", "revision", "layer", "head", "chunk", "sink_mass", "prev_weight", "row_entropy"}
    grouped = patterns.groupby(["layer", "head"])["sink_mass"].median().to_numpy()
    np.testing.assert_allclose(summary["sink_mass"].to_numpy(), grouped)
    assert ((patterns["sink_mass"] > 0) & (patterns["sink_mass"] <= 1)).all()


def test_capture_matches_model_attentions(text_file: Path, tmp_path: Path) -> None:
    """Per-head features equal those computed from the model's own eager attentions."""
    import torch

    from depthlens import data
    from depthlens.attention.patterns import sink_mass
    from depthlens.models import load_model

    out = tmp_path / "run"
    assert main(_args(text_file, out, "--seed", "3")) == 0
    loaded = load_model("random:llama", seed=3)
    ids = data.chunks(str(text_file), loaded.tokenizer, 6, 24, seed=3)
    with torch.no_grad():
        att = loaded.model(ids, output_attentions=True).attentions
    patterns = pd.read_parquet(out / "tables" / "attention_patterns.parquet").set_index(["layer", "head", "chunk"])
    for layer, a in enumerate(att):
        expect = sink_mass(a.double().numpy())  # (chunks, heads)
        got = np.array([[patterns.loc[(layer, h, c), "sink_mass"] for h in range(a.shape[1])] for c in range(6)])
        np.testing.assert_allclose(got, expect, atol=1e-5)


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--model", "no-such-model-xyz"], "model"),
        (["--chunks", "0"], "chunks"),
        (["--seq-len", "100000"], "--seq-len"),
        (["--chunks", "100000"], "chunks"),
    ],
)
def test_bad_input_one_line_exit_2(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   extra: list[str], match: str) -> None:
    out = tmp_path / "run"
    assert main(_args(text_file, out) + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("depthlens: error:") and "\n" not in err and match in err
    assert not out.exists()


def test_empty_text_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    out = tmp_path / "run"
    assert main(_args(empty, out)) == 2
    assert "\n" not in capsys.readouterr().err.strip()
    assert not out.exists()


def test_refuses_non_empty_out(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "x").write_text("x")
    assert main(_args(text_file, out)) == 2
    err = capsys.readouterr().err
    assert "choose another --out" in err and "--overwrite" not in err  # not a run: never advise deleting it


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_foreign_folder_with_manifest_is_never_deleted(text_file: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str], flag: str) -> None:
    out = tmp_path / "w"
    (out / "src").mkdir(parents=True)
    (out / "manifest.json").write_text('{"name":"app"}\n')
    (out / "src" / "app.js").write_text("x\n")
    assert main(_args(text_file, out, flag)) == 2
    err = capsys.readouterr().err.strip()
    assert "not a depthlens run" in err and "choose another --out" in err and "\n" not in err
    assert "--overwrite" not in err
    assert (out / "src" / "app.js").read_text() == "x\n" and (out / "manifest.json").read_text() == '{"name":"app"}\n'


def test_overwrite_keeps_files_the_run_did_not_write(text_file: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(_args(text_file, out)) == 0
    (out / "notes.md").write_text("mine")
    stale = out / "units" / "capture" / ".batch00000.attention_patterns.parquet.abcd1234.tmp"  # a killed write
    stale.write_bytes(b"partial")
    assert main(_args(text_file, out)) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(_args(text_file, out, "--overwrite")) == 0
    assert (out / "notes.md").read_text() == "mine" and not stale.exists()
    assert (out / "tables" / "attention_patterns.parquet").is_file()


@pytest.mark.parametrize("kind", ["folder", "binary", "string bool"])
def test_bad_config_file_one_line_exit_2(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        kind: str) -> None:
    config = tmp_path / "config"
    if kind == "folder":
        config.mkdir()
    elif kind == "binary":
        config.write_bytes(bytes(range(256)))
    else:
        config.write_text('trust_remote_code = "false"\n')
    out = tmp_path / "run"
    assert main(_args(text_file, out, "--config", str(config))) == 2
    err = capsys.readouterr().err.strip()
    named = "config key trust_remote_code = 'false'" if kind == "string bool" else "--config"
    assert err.startswith("depthlens: error:") and "\n" not in err and named in err
    assert "Traceback" not in err and not out.exists()


def test_models_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "smollm2-135m" in text and "llama" in text and "gpt_neox" in text


def test_sigkill_then_resume_gives_identical_tables(text_file: Path, tmp_path: Path) -> None:
    """A run killed with SIGKILL midway and resumed ends with the same Parquet tables."""
    args = ["capture", "--model", "random:llama:hidden_size=128,num_hidden_layers=4", "--text", str(text_file),
            "--chunks", "12", "--seq-len", "48", "--batch-size", "1", "--quiet"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert main([*args, "--out", str(full)]) == 0
    cmd = [sys.executable, "-m", "depthlens", *args, "--out", str(killed)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    units = killed / "units" / "capture"

    def finished() -> int:
        return len(list(units.glob("*.done"))) if units.exists() else 0

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and finished() < 2 and proc.poll() is None:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = finished()
    assert 0 < done < 12, f"kill landed at {done} finished units; the run must be interrupted midway"
    assert not (killed / "tables").exists()
    assert main([*args, "--out", str(killed), "--resume"]) == 0
    for name in ("attention_patterns", "attention_summary", "residual_summary"):
        pd.testing.assert_frame_equal(pd.read_parquet(full / "tables" / f"{name}.parquet"),
                                      pd.read_parquet(killed / "tables" / f"{name}.parquet"))


def test_failed_stage_is_marked_and_reported_then_resumes(text_file: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage failing midway leaves a resumable directory whose report marks it as not run;
    the run ends with RunIncomplete, which lists the failure and its log."""
    import json

    from depthlens import workflow
    from depthlens.config import RunConfig
    from depthlens.errors import RunIncomplete
    from depthlens.runs import RunMode

    def broken(*_: object) -> None:
        raise RuntimeError("simulated crash")

    from depthlens.stages import attention as attention_stage

    monkeypatch.setattr(attention_stage, "run", broken)
    config = RunConfig(model="random:llama", text=str(text_file), chunks=2, seq_len=16)
    out = tmp_path / "run"
    with pytest.raises(RunIncomplete) as info:
        workflow.run(config, out, stages=("capture", "attention"), execution=workflow.Execution(quiet=True, jobs=1),
                     report=True)
    [failure] = info.value.failures
    assert failure.stage == "attention" and failure.unit is None and "simulated crash" in failure.error
    assert "simulated crash" in (out / "logs" / "attention.log").read_text()
    stages = json.loads((out / "manifest.json").read_text())["stages"]
    assert stages["capture"]["status"] == "done" and stages["attention"]["status"] == "failed"
    html = (out / "report.html").read_text()
    assert "simulated crash" in html or "failed" in html
    claims = json.loads((out / "claims.json").read_text())
    verdicts = {c["id"]: c["verdict"] for c in claims["results"]}
    assert verdicts["A5-routing-positive"] == "not tested"
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(attention_stage, "run", lambda *a: calls.append(a))
    workflow.run(config, out, run_mode=RunMode.RESUME, stages=("capture", "attention"),
                 execution=workflow.Execution(quiet=True, jobs=1))
    assert len(calls) == 1
    assert json.loads((out / "manifest.json").read_text())["stages"]["attention"]["status"] == "done"


def test_malformed_claims_refused_before_work(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "claims.toml"
    bad.write_text("[[claim]]\nid = 'x'\n")
    out = tmp_path / "run"
    assert main(_args(text_file, out, "--claims", str(bad))) == 2
    err = capsys.readouterr().err.strip()
    assert "claims" in err and "\n" not in err and not out.exists()


def test_relative_claims_registered_in_the_run_and_report_from_another_folder(
        text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A relative --claims path is copied into the run (RUN/claims.toml, in the run index); ``depthlens
    report RUN`` from another folder scores against that copy, and ``report --claims OTHER`` re-scores,
    flagged with both hashes."""
    import hashlib
    import json

    from depthlens.report import default_claims_path
    from depthlens.report.verdict_text import verdict_label
    from depthlens.runs.atomic import read_index

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    data = default_claims_path().read_bytes()
    (work / "my_claims.toml").write_bytes(data)
    monkeypatch.chdir(work)
    out = tmp_path / "run"
    assert main(_args(text_file, out, "--claims", "my_claims.toml")) == 0
    registered = hashlib.sha256(data).hexdigest()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["claims"] == {"file": "claims.toml", "source": str(work / "my_claims.toml"), "sha256": registered}
    assert (out / "claims.toml").read_bytes() == data and "claims.toml" in read_index(out)
    # the original is edited afterwards and the report is rendered from another folder
    edited = data.replace(b"threshold = 5.0", b"threshold = 9.0", 1)
    assert edited != data
    (work / "my_claims.toml").write_bytes(edited)
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    doc = json.loads((out / "claims.json").read_text())
    assert doc["rescored"] is False and doc["claims_hash"] == doc["registered_claims_hash"] == registered
    # the terminal shows every verdict at a glance: one line per claim, as claims.json has it
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("verdicts")
    for result in doc["results"]:
        line = next(row for row in printed if row.split()[:1] == [result["id"]])
        assert f"  {verdict_label(result)}  " in line
        assert line.endswith(result["criterion"]) or f"{result['criterion']} (" in line
        if result["value_text"]:
            assert f"  {result['value_text']}" in line
    assert 'id="rescored"' not in (out / "report.html").read_text()
    assert main(["report", str(out), "--claims", str(work / "my_claims.toml")]) == 0
    doc = json.loads((out / "claims.json").read_text())
    assert doc["rescored"] is True and doc["registered_claims_hash"] == registered
    assert doc["claims_hash"] == hashlib.sha256(edited).hexdigest()
    html = (out / "report.html").read_text()
    assert 'id="rescored"' in html and registered in html and doc["claims_hash"] in html
    # --overwrite removes the copy with the rest of the run and registers afresh
    monkeypatch.chdir(work)
    assert main(_args(text_file, out, "--claims", "my_claims.toml", "--overwrite")) == 0
    assert (out / "claims.toml").read_bytes() == edited
    # a resume without --claims keeps the registration and its copy
    (work / "my_claims.toml").write_bytes(data)
    assert main(_args(text_file, out, "--resume")) == 0
    assert (out / "claims.toml").read_bytes() == edited
    assert json.loads((out / "manifest.json").read_text())["claims"]["sha256"] == hashlib.sha256(edited).hexdigest()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from depthlens import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"depthlens {__version__}"


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


ATTENTION_FLAGS = ("--null-samples", "--null-chunks", "--extras-chunks", "--certify", "--probe-seqs", "--probe-len")
JACOBIAN_FLAGS = ("--jacobian-mode", "--positions", "--funnel-rank", "--funnel-alphas", "--funnel-boot", "--init-seeds",
                  "--save-arrays")
TOPOLOGY_FLAGS = ("--topk", "--n-perm", "--exclude-massive", "--amplification")


@pytest.mark.parametrize("command,groups", [("capture", ()), ("attention", ("attention",)), ("jacobian", ("jacobian",)),
                                            ("topology", ("jacobian", "topology")),
                                            ("run", ("attention", "jacobian", "topology"))])
def test_stage_help_lists_only_its_options(command: str, groups: tuple[str, ...],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(command, capsys)
    for group, flags in (("attention", ATTENTION_FLAGS), ("jacobian", JACOBIAN_FLAGS), ("topology", TOPOLOGY_FLAGS)):
        for flag in flags:
            assert (flag in text) == (group in groups), (command, flag)
    for flag in ("--preset", "--chunks", "--seq-len", "--model", "--revisions", "--out", "--resume", "--quiet"):
        assert flag in text


def test_revisions_reach_the_attention_stage(text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``--revisions`` is a run option, listed once by ``depthlens attention --help``; on the
    command line it gives the attention tables a checkpoint per revision. A random model has no
    hub revisions: here the model counts as a hub id and its revision is another seed."""
    from depthlens import workflow
    from depthlens.models import load_model

    listed = [line for line in _help("attention", capsys).splitlines() if line.lstrip().startswith("--revisions")]
    assert len(listed) == 1, listed
    monkeypatch.setattr(workflow, "check_spec", lambda spec: "hub")
    monkeypatch.setattr(workflow, "_revision_loader", lambda config: lambda rev: load_model("random:llama", seed=1))
    out = tmp_path / "run"
    assert main(["attention", "--model", "random:llama", "--text", str(text_file), "--chunks", "2", "--seq-len", "12",
                 "--null-samples", "2", "--null-chunks", "1", "--probe-seqs", "2", "--probe-len", "4",
                 "--revisions", "step1", "--jobs", "1", "--out", str(out)]) == 0
    assert "attention heads (revision step1)" in capsys.readouterr().err
    for name in ("heads", "head_chunks", "head_probe", "depth"):
        table = pd.read_parquet(out / "tables" / f"{name}.parquet")
        assert table.groupby("checkpoint")["revision"].unique().map(list).to_dict() == {"trained": [""],
                                                                                          "step1": ["step1"]}
    assert json.loads((out / "manifest.json").read_text())["config"]["revisions"] == ["step1"]


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--null-samples", "0"], "--null-samples 0 must be at least 1"),
        (["--chunks", "0"], "--chunks 0 must be at least 1"),
        (["--n-perm", "0"], "--n-perm 0 must be at least 1"),
        (["--funnel-rank", "-1"], "--funnel-rank -1 must be at least 0"),
        (["--funnel-alphas", "0,2"], "--funnel-alphas 0,2 is invalid"),
        (["--funnel-alphas", "a"], "--funnel-alphas 'a' is not"),
        (["--revisions", "step1,step1"], "--revisions step1,step1 repeats a revision"),
        (["--revisions", "init"], "--revisions init names the init checkpoint"),
        (["--ablation-methods", "mean,shuffle"], "--ablation-methods"),
        (["--ablation-methods", "mean,mean"], "--ablation-methods mean,mean is invalid; pass distinct values of zero"),
        (["--clamp-alphas", "0,1.5"], "--clamp-alphas 0,1.5 is invalid; pass distinct numbers in [0, 1]"),
        (["--contest-targets", "routing,depth"], "--contest-targets"),
        (["--contest-targets", "criticality", "--ablation-methods", "zero"],
         "the contest target criticality is the mean-ablation ΔCE; add mean to --ablation-methods"),
        (["--seq-len", "100000"], "--seq-len 100000 exceeds"),
        (["--chunks", "100000"], "lower --chunks or --seq-len"),
    ],
)
def test_option_errors_name_the_flag(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     extra: list[str], message: str) -> None:
    out = tmp_path / "run"
    args = ["run", "--model", "random:llama", "--text", str(text_file), "--chunks", "2", "--seq-len", "16",
            "--out", str(out), "--quiet"]
    assert main(args + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("depthlens: error:") and message in err and "\n" not in err
    assert not out.exists()


def test_stage_option_classes_name_flags_not_fields() -> None:
    """The option classes of the stages (built by the Python API too) word their errors with flags."""
    from depthlens.attention.options import AttentionOptions
    from depthlens.errors import InputError
    from depthlens.jacobian.options import JacobianOptions
    from depthlens.topology.options import TopologyOptions

    cases = [(lambda: AttentionOptions(null_samples=0), "--null-samples 0 must be at least 1"),
             (lambda: AttentionOptions(null_chunks=-1), "--null-chunks -1 must be at least 0"),
             (lambda: AttentionOptions(certify="some"), "--certify 'some' is unknown"),
             (lambda: AttentionOptions(null_mode="x"), "--null-mode 'x' is unknown"),
             (lambda: JacobianOptions(funnel_rank=-1), "--funnel-rank -1 must be at least 0"),
             (lambda: JacobianOptions(positions="first"), "--positions 'first' is unknown"),
             (lambda: JacobianOptions(jacobian_mode="x"), "--jacobian-mode 'x' is unknown"),
             (lambda: JacobianOptions(null="x"), "--null 'x' is unknown"),
             (lambda: JacobianOptions(save_arrays="int8"), "--save-arrays 'int8' is unknown"),
             (lambda: TopologyOptions(topk=0), "--topk 0 must be at least 1"),
             (lambda: TopologyOptions(n_perm=0), "--n-perm 0 must be at least 1"),
             (lambda: TopologyOptions(amplification="x"), "--amplification 'x' is unknown")]
    for build, message in cases:
        with pytest.raises(InputError) as info:
            build()
        assert str(info.value).startswith(message), str(info.value)


def test_run_prints_its_disk_use(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from depthlens.runs.directory import disk_usage

    out = tmp_path / "run"
    assert main(_args(text_file, out)) == 0
    lines = capsys.readouterr().out.splitlines()
    match = re.fullmatch(r"disk: (\d+\.\d) MB in (.+)", lines[-1])
    assert match and Path(match[2]) == out
    assert float(match[1]) == round(disk_usage(out) / 1e6, 1) > 0


def test_run_prints_each_stages_time(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the disk line, one line per stage with its status and the wall time its manifest
    records, then their sum."""
    import json
    import re

    out = tmp_path / "run"
    assert main(_args(text_file, out)) == 0
    lines = capsys.readouterr().out.splitlines()
    stages = json.loads((out / "manifest.json").read_text())["stages"]
    assert list(stages) == ["capture"]
    stage = re.fullmatch(r"(\w+) +(\w+) +(\d+\.\d) s", lines[-3])
    assert stage and stage.groups() == ("capture", "done", f"{stages['capture']['seconds']:.1f}")
    total = re.fullmatch(r"stages +(\d+\.\d) s", lines[-2])
    assert total and total[1] == stage[3]


def test_progress_bars_name_the_checkpoint(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The jacobian and topology stages loop over the trained model and its step-0 null: every
    bar says which one it runs."""
    out = tmp_path / "run"
    assert main(["topology", "--model", "random:llama", "--text", str(text_file), "--preset", "quick", "--null", "init",
                 "--out", str(out), "--jobs", "1"]) == 0
    err = capsys.readouterr().err
    for desc in ("jacobians trained model (isolated)", "jacobians step-0 null (isolated)",
                 "operator metrics trained model", "operator metrics step-0 null", "schur funnel trained model",
                 "schur funnel step-0 null", "topology correlations trained model", "topology correlations step-0 null",
                 "topology trained model", "topology step-0 null"):
        assert desc in err, desc


def test_stage_accepts_the_unlisted_options_of_other_stages() -> None:
    """One command line works for every stage (same configuration hash for --resume), though
    a stage's help lists only its own options."""
    from depthlens.cli import build_parser

    args = build_parser().parse_args(["capture", "--n-perm", "50", "--null-samples", "3", "--save-arrays", "none"])
    assert (args.n_perm, args.null_samples, args.save_arrays) == (50, 3, "none")


def _readme_commands() -> list[list[str]]:
    """Every ``depthlens`` command line of the README's shell blocks (continuation lines
    joined, comments dropped; a command inside ``sbatch --wrap "..."`` too), as argv lists."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", readme, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if "--wrap" in words:
                words = shlex.split(words[words.index("--wrap") + 1])
            if words and words[0].endswith("bin/depthlens"):
                commands.append(words[1:])
    return commands


def test_readme_commands_parse():
    """The README's command lines name commands and flags that exist (parsed, not run)."""
    from depthlens.cli import build_parser

    commands = _readme_commands()
    assert {c[0] for c in commands} >= {"run", "sweep", "compare", "census", "train", "report"}
    parser = build_parser()
    for argv in commands:
        if argv != ["--version"]:
            parser.parse_args(argv)


def test_report_refuses_a_file_and_a_folder_of_another_tool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``depthlens report FILE`` was an internal error (NotADirectoryError), and a folder whose
    manifest.json belongs to another tool got 14 files written into it."""
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text('{"name": "someone else"}')
    for target, why in ((afile, "it is not a folder"), (other, '"format": "depthlens-run"')):
        capsys.readouterr()
        assert main(["report", str(target)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not a depthlens run directory" in err[0] and why in err[0]
    assert sorted(p.name for p in other.iterdir()) == ["manifest.json"]


def test_an_interrupted_stage_is_recorded_as_interrupted(text_file: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C (or SIGTERM) in a stage: exit 130 and the stage is ``interrupted`` in the manifest,
    not ``failed`` (nothing failed; --resume continues it)."""
    import json

    from depthlens.stages import attention as attention_stage

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(attention_stage, "run", interrupted)
    out = tmp_path / "run"
    assert main(["attention", "--model", "random:llama", "--text", str(text_file), "--chunks", "2", "--seq-len", "16",
                 "--jobs", "1", "--quiet", "--out", str(out)]) == 130
    assert json.loads((out / "manifest.json").read_text())["stages"]["attention"] == {"status": "interrupted"}
    assert "continue with --resume" in capsys.readouterr().err


def test_python_m_ends_an_interrupt_caught_from_string_code_with_130(tmp_path: Path) -> None:
    """``python -m depthlens``: an interrupt that left string-compiled code (a dataclass's
    methods are made so) still ends with 130 and the one line, where CPython alone would end
    the process by SIGINT (-2) after catching it."""
    (tmp_path / "interrupt_in_string_code.py").write_text(
        "import runpy\n"
        "from depthlens import cli\n"
        "def stage(args):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "cli._stage = stage\n"
        "runpy.run_module('depthlens', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-m", "interrupt_in_string_code", "attention", "--out", str(tmp_path / "run")],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), SOURCE])},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == ["depthlens: interrupted"]  # no run folder: nothing to resume


def test_the_manifest_records_the_command_line_and_the_source(text_file: Path, tmp_path: Path) -> None:
    import json

    from depthlens import __version__

    out = tmp_path / "run"
    args = _args(text_file, out)
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"]["argv"] == ["depthlens", *args] and manifest["command"]["cwd"] == os.getcwd()
    assert manifest["source"]["version"] == __version__
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / ".git").exists():
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        assert manifest["source"]["commit"] == head and isinstance(manifest["source"]["dirty"], bool)
    # the command belongs to that run: a later API run in this process records its own sys.argv
    import depthlens

    api = depthlens.analyse("random:llama", text=str(text_file), stages=["capture"], chunks=2, seq_len=16,
                            out=tmp_path / "api", jobs=1)
    assert json.loads((api.path / "manifest.json").read_text())["command"]["argv"] == sys.argv



def test_option_errors_name_the_flag_or_the_config_key_that_gave_the_value(text_file: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A value from the command line is named by its flag, one from --config by its key, also
    when a later check refuses it (the model's context); ``--contest-targets foo`` said "fix it
    in --config" with no config file."""
    config, out = tmp_path / "c.toml", tmp_path / "run"
    base = ["capture", "--model", "random:llama", "--text", str(text_file), "--chunks", "2", "--quiet", "--out", str(out)]
    cases = [(["--contest-targets", "foo"], None,
              "--contest-targets 'foo' is unknown; use a list of persistence, routing, criticality."),
             ([], '[contest]\ncontest_targets = ["foo"]\n', "config key contest_targets = 'foo' is unknown;"),
             ([], "seq_len = 100000\n", "config key seq_len = 100000 exceeds the context of random:llama (256 tokens); "
                                      "pass config key seq_len = 256 or less."),
             (["--seq-len", "100000"], "seq_len = 16\n", "--seq-len 100000 exceeds the context")]  # the flag wins
    for extra, text, message in cases:
        if text is not None:
            config.write_text(text)
        assert main([*base, *extra, *(["--config", str(config)] if text is not None else [])]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("depthlens: error: ") and message in err and "\n" not in err, err
        assert not out.exists()


def test_a_resume_with_other_options_names_them(text_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """It showed two configuration hashes."""
    out = tmp_path / "run"
    assert main(_args(text_file, out)) == 0
    capsys.readouterr()
    assert main(_args(text_file, out, "--resume", "--chunks", "4", "--seed", "2")) == 2
    assert capsys.readouterr().err.strip() == (
        f"depthlens: error: cannot resume {out}: it was started with --chunks 6, --seed 0, not --chunks 4, --seed 2; "
        "rerun with the options it was started with, or pass --overwrite to replace it.")


@pytest.mark.parametrize("given", [None, "ACTIVE"])
def test_command_line_threads_default_to_one_blas_thread_and_passive_openmp_waiting(given: str | None) -> None:
    """The command line starts OpenBLAS on one thread and torch's OpenMP threads waiting
    passively (they spin otherwise, beside the worker processes on the same cores), by setting
    both before numpy and torch load; a value in the environment wins."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OPENBLAS_NUM_THREADS")}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    code = ("import sys, os, depthlens.cli; "
            "print('torch' in sys.modules, os.environ['OMP_WAIT_POLICY'], os.environ['OPENBLAS_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", given or "PASSIVE", "1"]  # torch (and its OpenMP runtime) not yet loaded


def _tensor_page_faults(env: dict[str, str]) -> int:
    """Minor page faults of five fresh 64 MiB torch tensors in a process that loads depthlens's
    command line first, then torch."""
    code = ("import resource, depthlens.cli, torch\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(5):\n    x = torch.ones(2**24); del x\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)")
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout)


def test_command_line_asks_torch_for_huge_pages_unless_told_otherwise() -> None:
    """The command line sets THP_MEM_ALLOC_ENABLE=1 before torch loads, so a fresh 64 MiB tensor
    takes one page fault per 2 MiB instead of per 4 KiB (measured against the same process with
    the user's THP_MEM_ALLOC_ENABLE=0, which wins)."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.is_file() or "[never]" in thp.read_text():
        pytest.skip("this kernel serves no transparent huge pages")
    base = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    huge, small = _tensor_page_faults(base), _tensor_page_faults({**base, "THP_MEM_ALLOC_ENABLE": "0"})
    assert small > 5 * 2**24 * 4 // 4096 // 2  # 4 KiB pages: about one fault per page
    assert huge * 8 < small


#: Runs the command line on argv[1:] and prints its exit status, then whether torch was loaded.
_STATUS_AND_TORCH = """\
import sys
from depthlens.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
print(status, "torch" in sys.modules)
"""


@pytest.mark.parametrize("argv,words", [
    (["run", "--seq-lenn", "4"], ["depthlens run: error: unrecognized arguments: --seq-lenn 4",
                                  "did you mean --seq-len?", "depthlens run --help"]),
    (["run", "--null", "bogus"], ["depthlens run: error: argument --null: invalid choice"]),
    (["run", "--chunks", "0"], ["depthlens: error: --chunks 0 must be at least 1"]),
    (["run", "--jobs", "0"], ["depthlens: error: --jobs 0 is invalid"]),
    (["attention", "--executor", "foo"], ["depthlens: error: --executor 'foo' is not understood"]),
])
def test_a_bad_flag_is_refused_in_one_line_before_torch_loads(argv: list[str], words: list[str],
                                                              tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _STATUS_AND_TORCH, *argv, "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr[-2000:])
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "run").exists()
