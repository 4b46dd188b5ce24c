"""Failure isolation end to end on a tiny random model: a unit that raises, LAPACK drivers
that do not converge, non-finite weights and a bug each give the documented exit status and
one line per failure, never a traceback on the terminal."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.linalg

from depthlens.cli import main
from depthlens.linalg import guarded
from depthlens.executors.local import executor, ordered_map
from depthlens.runs.failures import EXIT_FAILED_UNITS, FailureLog

SMALL = ["--chunks", "3", "--seq-len", "24", "--null-samples", "2", "--null-chunks", "2", "--extras-chunks", "1",
         "--probe-seqs", "4", "--probe-len", "8", "--n-perm", "50", "--jobs", "1", "--quiet"]



def _cli(command: str, text: Path, out: Path, *extra: str) -> int:
    return main([command, "--model", "random:llama", "--text", str(text), "--out", str(out), *SMALL, *extra])


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _fail(*args, **kwargs):
    raise np.linalg.LinAlgError("SVD did not converge (forced)")


def test_failure_log_writes_traceback_and_one_line(tmp_path: Path) -> None:
    log = FailureLog(tmp_path)
    with log.unit("jacobian", "funnel_init"):
        raise ValueError("bad\nthing")
    with log.unit("jacobian", "ops_trained_isolated"):
        pass
    [failure] = log.of("jacobian")
    assert failure.line() == (f"jacobian unit funnel_init failed: ValueError: bad thing; details in "
                              f"{tmp_path / 'logs' / 'jacobian.log'}")
    text = (tmp_path / "logs" / "jacobian.log").read_text()
    assert "Traceback (most recent call last)" in text and "funnel_init" in text
    with pytest.raises(KeyboardInterrupt), log.unit("jacobian", "x"):
        raise KeyboardInterrupt  # an interrupt is never swallowed


def test_unit_failure_isolated_reported_and_retried_on_resume(text_file: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The funnel of the init checkpoint raises: the other units and stages finish, dependents
    are skipped, the report renders, one line names the log, exit 3; --resume retries it."""
    from depthlens.stages import jacobian as jacobian_stage

    real = jacobian_stage.schur_funnel

    def init_funnel_fails(*args, **kwargs):
        if kwargs.get("label") == "step-0 null (isolated)":  # the init checkpoint's funnel
            raise RuntimeError("simulated funnel crash")
        return real(*args, **kwargs)

    monkeypatch.setattr(jacobian_stage, "schur_funnel", init_funnel_fails)
    out = tmp_path / "run"
    start = time.perf_counter()
    assert _cli("run", text_file, out) == EXIT_FAILED_UNITS
    elapsed = time.perf_counter() - start
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert lines == [f"depthlens: error: jacobian unit funnel_init failed: RuntimeError: simulated funnel crash; "
                     f"details in {out / 'logs' / 'jacobian.log'}"]
    assert "Traceback" not in captured.err and f"report: {out / 'report.html'}" in captured.out
    assert "simulated funnel crash" in (out / "logs" / "jacobian.log").read_text()
    stages = _manifest(out)["stages"]
    assert stages["capture"]["status"] == stages["attention"]["status"] == "done"
    assert stages["jacobian"]["status"] == "failed" and set(stages["jacobian"]["failed_units"]) == {"funnel_init"}
    assert stages["topology"]["status"] == "skipped" and "jacobian" in stages["topology"]["reason"]
    # every finished or failed stage records its wall time; together they fit inside the run's
    timed = [stages[s]["seconds"] for s in ("capture", "attention", "jacobian")]
    assert all(t > 0 for t in timed) and sum(timed) <= elapsed and "seconds" not in stages["topology"], (timed, elapsed)
    # ... and the run prints them, the failed and skipped stages included, before the report line
    out_lines = captured.out.splitlines()
    end = out_lines.index(f"report: {out / 'report.html'}")
    printed = {words[0]: words[1:] for words in map(str.split, out_lines[:end]) if words and words[0] in stages}
    assert printed["jacobian"] == ["failed", f"{stages['jacobian']['seconds']:.1f}", "s"]
    assert printed["topology"] == ["skipped", "-", "s"] and out_lines[end - 1].split()[0] == "stages"
    assert (out / "report.html").is_file() and (out / "claims.json").is_file()
    assert any(lib["internal_api"] == "openblas" for lib in _manifest(out)["environment"]["blas"])
    cumulative = pd.read_parquet(out / "tables" / "cumulative.parquet")
    assert set(cumulative.loc[cumulative["jacobian_mode"] == "isolated", "checkpoint"]) == {"trained"}
    assert set(pd.read_parquet(out / "tables" / "operators.parquet")["checkpoint"]) == {"trained", "init"}

    monkeypatch.undo()
    assert _cli("run", text_file, out, "--resume") == 0
    stages = _manifest(out)["stages"]
    assert all(stages[s]["status"] == "done" for s in ("capture", "attention", "jacobian", "topology"))
    assert set(pd.read_parquet(out / "tables" / "cumulative.parquet")["checkpoint"]) == {"trained", "init"}


def test_non_converging_svd_falls_back_and_is_recorded(text_file: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy's gesdd forced to fail in the jacobian stage: every SVD comes from gesvd, the
    manifest counts them, and the tables agree with an unforced run to rounding."""
    plain, forced = tmp_path / "plain", tmp_path / "forced"
    assert _cli("jacobian", text_file, plain) == 0
    monkeypatch.setattr(np.linalg, "svd", _fail)
    assert _cli("jacobian", text_file, forced) == 0
    monkeypatch.undo()
    record = _manifest(forced)["stages"]["jacobian"]
    assert record["drivers"].get("svd:gesvd", 0) > 0 and "svd:gesdd" not in record["drivers"]
    assert record["fallbacks"] == record["drivers"]["svd:gesvd"]
    assert _manifest(forced)["drivers"]["svd:gesvd"] == record["drivers"]["svd:gesvd"]
    assert _manifest(plain)["stages"]["jacobian"]["fallbacks"] == 0
    done = json.loads((forced / "units" / "jacobian" / "funnel_trained.done").read_text())
    assert done["drivers"]["svd:gesvd"] > 0
    for name in ("operators", "cumulative"):
        a, b = (pd.read_parquet(root / "tables" / f"{name}.parquet") for root in (plain, forced))
        # Two backward-stable SVD drivers: singular values agree to a small multiple of d·ε·σ_max,
        # and the funnel's ranks through products of up to 2L factors to far better than 1e-8.
        num = a.select_dtypes("number").columns
        np.testing.assert_allclose(b[num].to_numpy(float), a[num].to_numpy(float), rtol=1e-8, atol=1e-10)


def test_every_driver_failing_gives_nan_with_reason(text_file: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """No SVD driver converges: the stage still finishes; the affected quantities are NaN and
    their rows say why."""
    monkeypatch.setattr(np.linalg, "svd", _fail)
    monkeypatch.setattr(scipy.linalg, "svd", _fail)
    out = tmp_path / "run"
    assert _cli("jacobian", text_file, out) == 0
    operators = pd.read_parquet(out / "tables" / "operators.parquet")
    assert operators["failure"].str.contains("svd did not converge with any driver").all()
    assert operators["cond"].isna().all()
    funnel = pd.read_parquet(out / "tables" / "cumulative.parquet")
    assert funnel["failure"].notna().all() and funnel["erank"].isna().all()


def test_nan_weights_refused_before_any_work(text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from depthlens import workflow

    real = workflow.load_model

    def poisoned(*args, **kwargs):
        loaded = real(*args, **kwargs)
        with torch.no_grad():
            loaded.model.model.layers[1].mlp.down_proj.weight[3, 5] = float("nan")
        return loaded

    monkeypatch.setattr(workflow, "load_model", poisoned)
    out = tmp_path / "run"
    assert _cli("run", text_file, out) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "NaN or infinite weights" in err and "layer 1 " in err
    assert not out.exists()


def test_bug_gives_one_line_and_a_log(text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from depthlens import workflow

    def bug(*args, **kwargs):
        return 1 / 0

    monkeypatch.setattr(workflow, "prepare", bug)
    assert _cli("capture", text_file, tmp_path / "run") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("depthlens: internal error: ZeroDivisionError")
    log = Path(err.rsplit("details in ", 1)[1])
    assert "Traceback (most recent call last)" in log.read_text()
    log.unlink()


def test_worker_driver_counts_reach_the_parent() -> None:
    before = guarded.driver_counts()
    with executor(2) as pool:
        norms = ordered_map(pool, guarded.norm2, [(np.eye(3),), (2 * np.eye(3),), (np.ones((2, 2)),)])
    assert norms == [1.0, 2.0, 2.0]
    assert guarded.count_difference(guarded.driver_counts(), before) == {"svd:gesdd": 3}


def test_doctor_command_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    assert "all 5 checks passed" in capsys.readouterr().out
