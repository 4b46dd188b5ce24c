"""Bad input fails early with one line: the whole plan is checked before the model loads,
unwritable or full disks stop a run with one line (and a resumable run), random-model specs
and seeds are validated, and hub access without a network fails at once."""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest

from depthlens import workflow
from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.errors import DataError, InputError, ModelError, StorageError
from depthlens.stages import run_stages




def _args(command: str, text: Path, out: Path, *extra: str) -> list[str]:
    return [command, "--model", "random:llama", "--text", str(text), "--chunks", "4", "--seq-len", "16",
            "--batch-size", "2", "--out", str(out), "--quiet", *extra]


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("depthlens: error:"), err
    return lines[0]


@pytest.fixture
def no_model_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load is a test failure: the plan must be refused before it."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the plan was checked")

    monkeypatch.setattr(workflow, "load_model", refuse)


# ----------------------------------------------------------------------------- finding 4: the plan
@pytest.mark.parametrize(("command", "extra", "flag", "fix"), [
    ("run", ["--seq-len", "2"], "--seq-len 2", "--seq-len 5 or more"),
    ("run", ["--seq-len", "3"], "--seq-len 3", "--seq-len 5 or more"),
    ("run", ["--seq-len", "4"], "--seq-len 4", "--seq-len 5 or more"),
    ("topology", ["--seq-len", "4"], "--seq-len 4", "--seq-len 5 or more"),
    ("topology", ["--chunks", "1", "--seq-len", "5"], "--chunks 1", "--chunks 3 or --seq-len 7"),
    ("run", ["--chunks", "1", "--seq-len", "5"], "--chunks 1", "--chunks 2 or more"),  # ablate's, checked first
    ("topology", ["--chunks", "2", "--seq-len", "5"], "--chunks 2", "--chunks 3 or --seq-len 6"),
    ("run", ["--revisions", "step1"], "--revisions step1", "drop --revisions"),
    ("jacobian", ["--revisions", "step1,step2"], "--revisions step1,step2", "drop --revisions"),
    ("capture", ["--revision", "main"], "--revision 'main'", "drop --revision"),
    ("attention", ["--model", "org/tiny", "--revisions", "step{0..2000..1000}"], "--revisions 'step{0..2000..1000}'",
     "plain comma-separated names"),
    ("attention", ["--model", "org/tiny", "--revisions", "step-{0..}"], "'step-{0..}' is not a range",
     "step{0..143000..1000}"),
    ("attention", ["--model", "./no/such/folder"], "no file or folder at", "check the path"),
    ("attention", ["--model", "no/such.gguf"], "GGUF file", "check the path"),
])
def test_plan_refused_before_the_model_loads(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             no_model_load: None, command: str, extra: list[str], flag: str,
                                             fix: str) -> None:
    out = tmp_path / "run"
    assert main(_args(command, text_file, out, *extra)) == 2
    line = _one_error_line(capsys)
    assert flag in line and fix in line
    assert not out.exists()


def test_a_probe_beyond_the_context_is_refused_before_anything_is_written(
        text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The probe [BOS, r, r] of --probe-len 16 has 33 tokens; a 32-token model once failed the
    attention stage at run time (exit 3) with a message that did not name --probe-len."""
    out = tmp_path / "run"
    assert main(_args("attention", text_file, out, "--model", "random:llama:max_position_embeddings=32",
                      "--seq-len", "16", "--probe-len", "16")) == 2
    line = _one_error_line(capsys)
    assert "--probe-len 16" in line and "--probe-len 15 or less" in line
    assert not out.exists()


def test_plan_minimums_are_the_real_ones() -> None:
    """The smallest sizes the checks accept are ones the stages run with (topology: 3
    positions after the 4 skipped; capture, attention and jacobian: seq_len 2; ablate: a mean
    chunk beside a held-out one)."""
    workflow.check_plan(RunConfig(model="random:llama", chunks=2, seq_len=7), list(run_stages()))  # lens: tests/lens
    with pytest.raises(InputError, match="--chunks 1 leaves no mean chunk"):
        workflow.check_plan(RunConfig(model="random:llama", chunks=1, seq_len=7), ["ablate"])
    workflow.check_plan(RunConfig(model="random:llama", chunks=3, seq_len=5), ["topology"])
    workflow.check_plan(RunConfig(model="random:llama", chunks=1, seq_len=2), ["capture", "attention", "jacobian"])
    with pytest.raises(InputError, match="--seq-len 6"):
        workflow.check_plan(RunConfig(model="random:llama", chunks=1, seq_len=6), ["topology"])


def test_revisions_of_a_gguf_file_refused(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(InputError, match=r"--revisions step1 only applies to hub ids.*a \.gguf file"):
        workflow.check_plan(RunConfig(model=str(gguf), revisions=("step1",)), ["jacobian"])
    with pytest.raises(InputError, match="drop --revision"):
        workflow.check_plan(RunConfig(model="smollm2-135m", revision="main"), ["capture"])
    workflow.check_plan(RunConfig(model="org/name", revisions=("step1",), revision="main"), ["jacobian"])  # a hub id


# ----------------------------------------------------------------------------- finding 5: one line
def test_out_under_a_file_or_in_proc(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(_args("capture", text_file, afile / "run")) == 2
    assert "--out" in _one_error_line(capsys)
    if Path("/proc/self").is_dir():
        assert main(_args("capture", text_file, Path("/proc/depthlens-test/run"))) == 2
        assert "--out" in _one_error_line(capsys)
        assert not Path("/proc/depthlens-test").exists()


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_out_on_a_read_only_file_system(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """mkdir of --out raising EROFS/EACCES (a read-only mount; tests run as root, so no chmod)."""
    out = tmp_path / "ro" / "deeper" / "run"
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "ro")):
            raise OSError(code, os.strerror(code), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert main(_args("capture", text_file, out)) == 2
    line = _one_error_line(capsys)
    assert "--out" in line and str(out) in line
    assert not (tmp_path / "ro").exists()


def _fail_writes(monkeypatch: pytest.MonkeyPatch, *, after: int, what: str) -> None:
    """From the ``after``-th write on, writes fail with ENOSPC: ``parquet`` only the (large)
    table writes; ``all`` every atomic write (manifest included), as a disk that is full."""
    from depthlens.runs import atomic

    calls = {"n": 0}
    if what == "parquet":
        real = pd.DataFrame.to_parquet

        def to_parquet(self, path, *args, **kwargs):
            calls["n"] += 1
            if calls["n"] >= after:
                Path(path).write_bytes(b"PAR1 half")  # a partial write, then the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            return real(self, path, *args, **kwargs)

        monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)
    else:
        real_mkstemp = atomic.tempfile.mkstemp

        def mkstemp(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] >= after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_mkstemp(*args, **kwargs)

        monkeypatch.setattr(atomic, "tempfile", types.SimpleNamespace(mkstemp=mkstemp))


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("what", ["parquet", "all"])
def test_full_disk_stops_with_one_line_and_resumes(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    full, broken = tmp_path / "full", tmp_path / "broken"
    assert main(_args("capture", text_file, full)) == 0
    capsys.readouterr()
    with monkeypatch.context() as patch:
        _fail_writes(patch, after=3 if what == "parquet" else 8, what=what)
        assert main(_args("capture", text_file, broken)) == 2
    line = _one_error_line(capsys)
    assert "no space" in line and "--resume" in line
    manifest = json.loads((broken / "manifest.json").read_text())
    if what == "parquet":
        assert manifest["stages"]["capture"]["status"] == "failed"
        assert manifest["stages"]["capture"]["error"] == "no space"
    else:  # the manifest could not be written either: the line says so
        assert "manifest" in line and "could not be updated" in line
        assert manifest["stages"]["capture"]["status"] == "running"
    for path in _files(broken):  # nothing half-written: every table reads, no temporary file stays
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".parquet":
            pd.read_parquet(path)
    assert not (broken / "logs").exists()  # a full disk is not logged as a unit failure
    assert main(_args("capture", text_file, broken, "--resume")) == 0
    assert json.loads((broken / "manifest.json").read_text())["stages"]["capture"]["status"] == "done"
    for name in ("attention_patterns", "attention_summary", "residual_summary"):
        pd.testing.assert_frame_equal(pd.read_parquet(full / "tables" / f"{name}.parquet"),
                                      pd.read_parquet(broken / "tables" / f"{name}.parquet"))


def test_full_disk_stops_the_run_not_only_the_stage(text_file: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Failure isolation does not apply to ENOSPC: the later stages are not tried and no
    report is rendered."""
    out = tmp_path / "run"
    rendered = []
    monkeypatch.setattr(workflow, "render_report", lambda *a, **k: rendered.append(a))
    _fail_writes(monkeypatch, after=3, what="parquet")
    config = RunConfig(model="random:llama", text=str(text_file), chunks=4, seq_len=16, batch_size=2)
    with pytest.raises(StorageError, match="no space"):
        workflow.run(config, out, stages=("capture", "jacobian"), execution=workflow.Execution(quiet=True),
                     report=True)
    stages = json.loads((out / "manifest.json").read_text())["stages"]
    assert stages["capture"]["status"] == "failed" and "jacobian" not in stages
    assert not rendered


def test_raw_enospc_inside_a_unit_is_not_isolated(tmp_path: Path) -> None:
    from depthlens.runs.failures import FailureLog

    log = FailureLog(tmp_path)
    with pytest.raises(StorageError, match="no space"), log.unit("capture", "batch00000"):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))
    assert not log.failures and not (tmp_path / "logs").exists()
    with log.unit("capture", "batch00001"):
        raise ValueError("an ordinary failure stays isolated")
    assert len(log.failures) == 1


@pytest.mark.parametrize("spec", ["random:llama:hidden_size=notanumber", "random:llama:num_hidden_layers=0",
                                  "random:llama:num_attention_heads=5", "random:gpt2:num_attention_heads=3",
                                  "random:gpt_neox:hidden_size=62", "random:llama:num_key_value_heads=3",
                                  "random:gemma3:num_attention_heads=5", "random:llama:vocab_size=-1"])
def test_random_spec_errors_are_model_errors(spec: str) -> None:
    from depthlens.models import load_model

    with pytest.raises(ModelError, match="--model random:"):
        load_model(spec)


def test_seed_range() -> None:
    from depthlens.models import load_model

    with pytest.raises(InputError, match="--seed"):
        RunConfig(seed=2**64)
    with pytest.raises(InputError, match="--seed"):
        RunConfig(seed=-1)
    RunConfig(seed=2**64 - 1)
    with pytest.raises(InputError, match="--seed"):
        load_model("random:llama", seed=2**64)
    assert load_model("random:llama", seed=2**64 - 1).adapter.n_layers == 2


def _sweep_cases(tmp: Path) -> list[tuple[str, list[str]]]:
    folder = tmp / "cfgdir"
    folder.mkdir()
    binary = tmp / "binary.toml"
    binary.write_bytes(bytes(range(256)))
    afile = tmp / "afile"
    afile.write_text("x")
    return [
        ("run", ["--seq-len", "4"]),
        ("run", ["--chunks", "1", "--seq-len", "5"]),
        ("run", ["--revisions", "step1"]),
        ("capture", ["--revision", "main"]),
        ("capture", ["--model", "random:llama:hidden_size=notanumber"]),
        ("capture", ["--model", "random:llama:num_hidden_layers=0"]),
        ("capture", ["--model", "random:llama:num_attention_heads=5"]),
        ("capture", ["--model", "random:gpt2:num_attention_heads=5"]),
        ("capture", ["--model", "random:llama:num_key_value_heads=3"]),
        ("capture", ["--model", "random:llama:nonsense_key=3"]),
        ("capture", ["--model", "random:"]),
        ("capture", ["--seed", "18446744073709551616"]),
        ("capture", ["--seed", "-1"]),
        ("capture", ["--config", str(folder)]),
        ("capture", ["--config", str(binary)]),
        ("capture", ["--chunks", "0"]),
        ("capture", ["--seq-len", "1"]),
        ("capture", ["--text", str(tmp / "missing.txt")]),
        ("capture", ["--chunks", "100000"]),
        ("capture", ["--jobs", "0"]),
        ("capture", ["--jobs", "100000"]),
        ("capture", ["--model", str(tmp / "missing.gguf")]),
        ("capture", ["--model", "someorg/somemodel"]),
        ("capture", ["--out", str(afile / "run")]),
    ]


def test_bad_input_sweep(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every bad input: exit 2, exactly one ``depthlens: error:`` line, no traceback, no
    output directory left behind."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub case must not touch the network
    failures = []
    for i, (command, extra) in enumerate(_sweep_cases(tmp_path)):
        out = tmp_path / f"run{i}"
        args = _args(command, text_file, out)
        if "--out" in extra:
            args = args[: args.index("--out")] + args[args.index("--out") + 2 :]
        code = main([*args, *extra])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        ok = (code == 2 and len(lines) == 1 and lines[0].startswith("depthlens: error:")
              and "Traceback" not in err and not out.exists())
        if not ok:
            failures.append(f"{command} {' '.join(extra)}: exit {code}, stderr {err!r}, out exists {out.exists()}")
    assert not failures, "\n".join(failures)


# ----------------------------------------------------------------------------- finding 11: offline hub
def _complete(line: str) -> None:
    assert line.endswith(".") and "..." not in line and "…" not in line, line


def test_hub_offline_flag_fails_at_once(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    start = time.monotonic()
    assert main(_args("capture", text_file, out, "--model", "someorg/somemodel")) == 2
    assert time.monotonic() - start < 5
    line = _one_error_line(capsys)
    _complete(line)
    assert "someorg/somemodel" in line and "not in the local Hugging Face cache" in line and "HF_HUB_OFFLINE" in line
    assert not out.exists()


def test_hub_unreachable_fails_fast(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Without HF_HUB_OFFLINE one quick probe decides; no 28 s of client retries."""
    from depthlens.models import hub

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)

    def unreachable(address, timeout=None):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(hub.socket, "create_connection", unreachable)
    hub._probe.cache_clear()
    try:
        out = tmp_path / "run"
        start = time.monotonic()
        assert main(_args("capture", text_file, out, "--model", "someorg/somemodel", "--revision", "step1")) == 2
        assert time.monotonic() - start < 5
        line = _one_error_line(capsys)
        _complete(line)
        assert "cannot be reached" in line and "someorg/somemodel" in line and "step1" in line
        assert not out.exists()
    finally:
        hub._probe.cache_clear()


def test_wikitext_offline_one_complete_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """--text wikitext-2 with HF_DATASETS_OFFLINE=1 and nothing cached: datasets is told to stay
    offline, and its failure becomes one complete line."""
    from depthlens import data

    config = types.SimpleNamespace(HF_HUB_OFFLINE=False, HF_DATASETS_OFFLINE=False)

    def load_dataset(*args: object, **kwargs: object) -> None:
        assert config.HF_HUB_OFFLINE and config.HF_DATASETS_OFFLINE, "datasets was not switched offline"
        raise ConnectionError("Couldn't reach 'wikitext' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(config=config, load_dataset=load_dataset))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        data.load_text("wikitext-2")
    assert time.monotonic() - start < 5
    message = str(info.value)
    _complete(message)
    assert "--text wikitext-2" in message and "HF_DATASETS_OFFLINE" in message and "\n" not in message


def test_jobs_beyond_the_cores_are_refused_naming_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """--jobs 1000 once started 33 workers on 2 cores; the bound is the usable cores (at least
    the default 2), for a local executor and a private Ray instance, not for a cluster."""
    from depthlens.executors import spec as executors
    from depthlens.executors import Execution

    monkeypatch.setattr(executors, "usable_cores", lambda: 4)
    executors.check_execution(Execution(jobs=4))
    with pytest.raises(InputError, match="--jobs 5 is more worker processes than this machine's 4 usable CPU cores"
                                         ".*pass --jobs 4 or less"):
        executors.check_execution(Execution(jobs=5))
    monkeypatch.setattr(executors, "usable_cores", lambda: 1)
    executors.check_execution(Execution(jobs=2))  # the default always passes



def test_threads_beside_the_executor_are_the_jobs_capped_at_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """The funnel bootstrap's and the topology correlations' threads: --jobs, but never more
    than the cores this process may run on (the default --jobs 2 on one core runs one)."""
    from depthlens.executors import spec as executors
    from depthlens.executors import Execution

    monkeypatch.setattr(executors, "usable_cores", lambda: 4)
    assert [Execution(jobs=j).threads for j in (1, 2, 4, 8)] == [1, 2, 4, 4]
    monkeypatch.setattr(executors, "usable_cores", lambda: 1)
    assert Execution(jobs=2).threads == 1
