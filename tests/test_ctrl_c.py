"""Ctrl-C on the command line: SIGINT to the whole process group (as a terminal sends it), during
model loading and in the middle of a stage. The command exits 130 within seconds with one line
on stderr, which advises ``--resume`` only where a run folder exists to resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import depthlens

# The full leg only: signal handling and process groups, which no thread count or BLAS kernel changes.
pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process groups"),
              pytest.mark.full_leg]

#: The folder this depthlens is imported from, for a child process started in another folder.
SOURCE = str(Path(depthlens.__file__).resolve().parents[1])
#: Seconds from the SIGINT to the end of the process.
EXIT_WITHIN_S = 3.0
SIZES = ("--model", "random:llama", "--preset", "quick", "--jobs", "2", "--quiet")

#: Runs ``python -m depthlens`` with the model loader wrapped so that SIGINT reaches the process
#: group once loading has begun; the time it was sent goes to the file named by argv[1].
_DURING_LOADING = """\
import os, runpy, signal, sys, time
def interrupted_load(*args, **kwargs):
    with open(stamp, "w") as fh:
        fh.write(repr(time.time()))
    os.killpg(os.getpgrp(), signal.SIGINT)
    return load(*args, **kwargs)
if __name__ == "__main__":
    from depthlens import workflow
    stamp = sys.argv.pop(1)
    load, workflow.load_model = workflow.load_model, interrupted_load
    runpy.run_module("depthlens", run_name="__main__")
"""


def _default_sigint() -> None:
    """In the child before it runs: SIGINT back to its default, which Python then turns into
    KeyboardInterrupt. A shell starts background jobs with SIGINT ignored, and a process that
    inherits that disposition keeps ignoring SIGINT, as a background job should; the test is of a
    command started from a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ended(proc: subprocess.Popen[str]) -> tuple[str, float]:
    """``proc``'s stderr once it ended, and the time it ended; fails (killing its group) if it
    runs 60 s more."""
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the command did not end within 60 s of Ctrl-C")
    return err, time.time()


def _check_one_line(err: str, proc: subprocess.Popen[str], out: Path) -> None:
    lines = err.strip().splitlines()
    assert proc.returncode == 130, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("depthlens: interrupted"), err[-3000:]
    assert "Traceback" not in err and "Process _WorkerProcess" not in err
    assert ("--resume" in lines[0]) == (out / "manifest.json").is_file(), (lines[0], out.exists())


def test_ctrl_c_during_model_loading(text_file: Path, tmp_path: Path) -> None:
    """Before the run folder exists: no advice to resume what was never started."""
    (tmp_path / "interrupt_while_loading.py").write_text(_DURING_LOADING)
    stamp, out = tmp_path / "sent", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), SOURCE])}
    proc = subprocess.Popen([sys.executable, "-m", "interrupt_while_loading", str(stamp), "run", *SIZES, "--text",
                             str(text_file), "--out", str(out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    err, ended = _ended(proc)
    _check_one_line(err, proc, out)
    assert not out.exists()
    assert ended - float(stamp.read_text()) < EXIT_WITHIN_S


def _running(out: Path, stage: str) -> bool:
    """Whether the manifest in ``out`` says ``stage`` is running."""
    try:
        return json.loads((out / "manifest.json").read_text())["stages"][stage]["status"] == "running"
    except (OSError, ValueError, KeyError, TypeError):
        return False


def test_ctrl_c_mid_stage_stops_the_workers_at_once(text_file: Path, tmp_path: Path) -> None:
    """In the contest stage of a quick run, with worker processes busy and four stages done:
    one line advising --resume, no worker's traceback, and no wait for the running tasks or
    for a report of what finished."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "depthlens", "run", "--model", "random:llama", "--preset", "quick",
                             "--text", str(text_file), "--out", str(out), "--jobs", "2", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        deadline = time.monotonic() + 600
        while not _running(out, "contest"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # the stage's tasks are with the workers
        sent = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        err, ended = _ended(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _check_one_line(err, proc, out)
    assert "continue with --resume" in err
    assert ended - sent < EXIT_WITHIN_S
