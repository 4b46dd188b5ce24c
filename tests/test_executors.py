"""Executors (``--executor local | ray[=ADDRESS] | slurm[=local]``): the spec and its one-line
errors before anything is written, and the attention stage on a real local Ray cluster (two
nodes; one run with a worker killed mid-stage) and on SLURM's code path (submitit's
LocalExecutor), whose tables equal the local pool's; the SLURM backend's blocks and retries."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from depthlens.cli import main
from depthlens.executors import Execution
from depthlens.errors import InputError, RunError, require_at_least
from depthlens.executors.spec import FORMS, ExecutorSpec, parse_executor, parse_slurm_params
from depthlens.executors.local import executor
from depthlens.runs import atomic
from tests import executor_tasks as tasks
from tests.test_determinism import assert_tables_close

HAS_RAY = importlib.util.find_spec("ray") is not None
HAS_SUBMITIT = importlib.util.find_spec("submitit") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'depthlens[cluster]')")
needs_submitit = pytest.mark.skipif(not HAS_SUBMITIT, reason="submitit is not installed (pip install 'depthlens[cluster]')")

#: A small attention run whose head tasks (extras on every chunk, n = 128) last long enough
#: to catch a Ray worker running one.
SIZES = ("--model", "random:llama", "--chunks", "2", "--seq-len", "128", "--batch-size", "2", "--null-samples", "2",
         "--null-chunks", "1", "--extras-chunks", "2", "--probe-seqs", "2", "--probe-len", "6")
TABLES = ("heads", "head_chunks", "head_probe", "depth")
#: The attention stage's task functions, as Ray names its workers' processes (``ray::NAME``).
TASKS = ("head_chunk_row", "certify_row", "induction_row", "depth_chunk_rows")
#: Ray settings of the test cluster and its clients: no token authentication (Ray's default
#: for ``ray start`` writes ~/.ray/auth_token), no usage statistics.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
REPO = Path(__file__).resolve().parents[1]


def _argv(text: Path, out: Path, *flags: str) -> list[str]:
    return ["attention", *SIZES, "--text", str(text), "--out", str(out), "--quiet", *flags]


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(out / "tables" / f"{name}.parquet") for name in TABLES}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def local_tables(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> dict[str, pd.DataFrame]:
    """The attention tables of the local executor (inline), the reference of every backend."""
    out = tmp_path_factory.mktemp("local") / "run"
    assert main(_argv(text_file, out, "--jobs", "1")) == 0
    return _tables(out)


# ----------------------------------------------------------------------------- the spec
@pytest.mark.parametrize("spec, parsed", [
    ("local", ExecutorSpec("local")), ("ray", ExecutorSpec("ray")), ("ray=auto", ExecutorSpec("ray", "auto")),
    (" ray=10.0.0.7:6379 ", ExecutorSpec("ray", "10.0.0.7:6379")), ("slurm", ExecutorSpec("slurm")),
    ("slurm=local", ExecutorSpec("slurm", "local"))])
def test_executor_specs(spec: str, parsed: ExecutorSpec) -> None:
    assert parse_executor(spec) == parsed


@pytest.mark.parametrize("spec", ["rays", "ray=", "ray=host", "ray=host:0", "ray=:6379", "slurm=cluster", "local=2", ""])
def test_malformed_specs_list_the_accepted_forms(spec: str) -> None:
    with pytest.raises(InputError, match=f"use {FORMS}"):
        parse_executor(spec)


@needs_submitit
def test_slurm_params() -> None:
    assert parse_slurm_params("partition=cpu, time=60,mem_gb=4.5,cpus_per_task=1,array_parallelism=32,block=64,"
                              "exclusive=true") == {"partition": "cpu", "time": 60, "mem_gb": 4.5, "cpus_per_task": 1,
                                                    "array_parallelism": 32, "block": 64, "exclusive": True}
    assert parse_slurm_params("") == {}
    assert parse_slurm_params("time=1-02:30:00") == {"time": "1-02:30:00"}  # SLURM's own time format
    with pytest.raises(InputError, match=r"key 'partitoin' is unknown; accepted keys: account, .*block.*partition"):
        parse_slurm_params("partitoin=cpu")
    for bad, message in [("partition", "is not key=value"), ("setup=x", "key 'setup' is unknown"),
                         ("block=0", "block=0 is invalid"), ("array_parallelism=2.5", "is invalid"),
                         ("time=abc", "time=abc is invalid; pass minutes"), ("time=-5", "time=-5 is invalid"),
                         ("mem_gb=lots", "mem_gb=lots is invalid"), ("cpus_per_task=0", "cpus_per_task=0 is invalid")]:
        with pytest.raises(InputError, match=message):
            parse_slurm_params(bad)


def _refused(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command line, which must refuse in one line (exit 2) and write nothing."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("depthlens: error: "), err
    assert not out.exists()
    return err


@pytest.mark.parametrize("flags, message", [
    (["--executor", "rays"], f"--executor 'rays' is not understood; use {FORMS}."),
    (["--slurm-params", "partition=cpu"], "--slurm-params applies to --executor slurm"),
    pytest.param(["--executor", "slurm=local", "--slurm-params", "partitoin=cpu"], "key 'partitoin' is unknown",
                 marks=needs_submitit),
    pytest.param(["--executor", "ray=auto"], "found no Ray cluster", marks=needs_ray),
], ids=["malformed-spec", "slurm-params-without-slurm", "unknown-slurm-key", "ray-auto-without-cluster"])
def test_bad_executor_is_refused_before_anything_is_written(text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], flags: list[str],
                                                            message: str) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr("depthlens.executors.spec.RAY_CURRENT_CLUSTER", tmp_path / "no_cluster")
    out = tmp_path / "run"
    assert message in _refused(_argv(text_file, out, *flags), out, capsys)


@needs_ray
def test_unreachable_ray_address_is_refused(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{_free_port()}"
    out = tmp_path / "run"
    err = _refused(_argv(text_file, out, "--executor", f"ray={address}"), out, capsys)
    assert f"no Ray cluster answers at {address}" in err and "ray start --head" in err and "--executor local" in err
    import depthlens

    with pytest.raises(InputError, match=f"no Ray cluster answers at {address}"):  # the Python API alike
        depthlens.analyse("random:llama", text=str(text_file), stages=["attention"], out=out, executor=f"ray={address}")
    assert not out.exists()


@needs_submitit
def test_slurm_without_sbatch_is_refused(text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "run"
    err = _refused(_argv(text_file, out, "--executor", "slurm"), out, capsys)
    assert "needs SLURM's sbatch and srun on PATH" in err and "--executor slurm=local" in err


def test_missing_package_says_what_to_install(text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    out = tmp_path / "run"
    err = _refused(_argv(text_file, out, "--executor", "ray"), out, capsys)
    assert "needs ray, which is not installed: pip install 'depthlens[cluster]'" in err


# ----------------------------------------------------------------------------- SIGTERM
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("spec", ["local", pytest.param("ray", marks=needs_ray)])
def test_sigterm_mid_stage_ends_the_same_on_every_executor(spec: str, text_file: Path, tmp_path: Path) -> None:
    """SIGTERM once the stage's first unit is done: exit 130, the one line saying --resume,
    the stage ``interrupted``, under a private Ray instance (whose start replaces the SIGTERM
    handler, and whose stop resets it) as under the local pool; no abort, no stack dump."""
    import json

    out = tmp_path / "run"
    argv = ["attention", *SIZES, "--chunks", "8", "--batch-size", "1", "--text", str(text_file), "--out", str(out),
            "--quiet", "--jobs", "2", "--executor", spec]
    proc = subprocess.Popen([sys.executable, "-m", "depthlens", *argv], env={**os.environ, **RAY_ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list((out / "units" / "attention").glob("*.done")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == ["depthlens: interrupted; continue with --resume"], err[-3000:]
    assert json.loads((out / "manifest.json").read_text())["stages"]["attention"] == {"status": "interrupted"}


# ----------------------------------------------------------------------------- a Ray cluster
def _processes() -> dict[int, tuple[str, int, int]]:
    """Every live process: pid -> (title, parent pid, process group)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            title = Path(entry.path, "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            state, parent, group = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state not in ("Z", "X"):
            found[int(entry.name)] = (title, int(parent), int(group))
    return found


def _cluster_processes(groups: set[int]) -> dict[int, str]:
    """The processes of the test cluster (pid -> title): those in the process groups
    ``groups`` that each node's ``ray start --block`` leads, and their descendants (Ray's
    workers lead groups of their own)."""
    table = _processes()
    ours = {}
    for pid, (title, parent, group) in table.items():
        seen = set()
        while group not in groups and parent in table and parent not in seen:
            seen.add(parent)
            _, parent, group = table[parent]
        if group in groups:
            ours[pid] = title
    return ours


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, set[int]]]:
    """A Ray cluster of two nodes (one CPU each) on this machine: its address and the process
    groups of its nodes (:func:`_cluster_processes`). Stopped by killing exactly its
    processes, whatever happened."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install 'depthlens[cluster]')")
    import ray

    port = _free_port()
    address = f"127.0.0.1:{port}"
    temp = Path(tempfile.mkdtemp(prefix="dlray-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    logs = tmp_path_factory.mktemp("ray-logs")
    env = {**os.environ, **RAY_ENV}
    ray_cli = str(Path(sys.executable).with_name("ray"))
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats", "--block"]
    nodes: list[subprocess.Popen] = []
    try:
        for k, args in enumerate([["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}"],
                                  [f"--address={address}"]]):
            with open(logs / f"node{k}.log", "w") as log:
                nodes.append(subprocess.Popen([ray_cli, "start", *args, *common], env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            if k == 0:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                        break
                    except OSError:
                        assert time.monotonic() < deadline and nodes[0].poll() is None, (logs / "node0.log").read_text()
                        time.sleep(0.2)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in RAY_ENV.items():
                patch.setenv(key, value)
            ray.init(address=address, log_to_driver=False, logging_level="ERROR")
            try:
                deadline = time.monotonic() + 60
                while sum(node["Alive"] for node in ray.nodes()) < 2:
                    assert time.monotonic() < deadline, (logs / "node1.log").read_text()
                    time.sleep(0.2)
            finally:
                ray.shutdown()
        yield address, {node.pid for node in nodes}
    finally:
        groups = {node.pid for node in nodes}
        for pid in _cluster_processes(groups):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in nodes:
            node.wait()
        deadline = time.monotonic() + 30
        while _cluster_processes(groups) and time.monotonic() < deadline:
            time.sleep(0.2)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.full_leg
def test_ray_cluster_gives_the_local_tables(ray_cluster: tuple[str, set[int]], local_tables: dict[str, pd.DataFrame],
                                            text_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    address, _ = ray_cluster
    for key, value in RAY_ENV.items():
        monkeypatch.setenv(key, value)
    assert main(_argv(text_file, tmp_path / "run", "--executor", f"ray={address}")) == 0
    assert_tables_close(_tables(tmp_path / "run"), local_tables)
    with executor(Execution(executor=f"ray={address}"), tmp_path) as pool:  # a task's own error comes back as raised
        with pytest.raises(InputError, match="--seq-len 1 is too short") as caught:
            pool.submit(require_at_least, "--seq-len", 1, 2, "attention").result()
    assert "raised on a Ray worker" in caught.value.__notes__[0]


@pytest.mark.full_leg
def test_killed_ray_worker_is_retried(ray_cluster: tuple[str, set[int]], local_tables: dict[str, pd.DataFrame],
                                      text_file: Path, tmp_path: Path) -> None:
    """SIGKILL a worker while it runs a task of the stage: Ray runs the task again and the run
    ends with the local tables."""
    address, groups = ray_cluster
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "depthlens", *_argv(text_file, out, "--executor", f"ray={address}")],
                                env={**os.environ, **RAY_ENV}, stdout=sink, stderr=subprocess.STDOUT)
    killed = None
    deadline = time.monotonic() + 240
    try:
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            workers = [pid for pid, title in _cluster_processes(groups).items()
                       if title.startswith("ray::") and title[5:].split("(")[0].strip() in TASKS]
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed = workers[0]
            time.sleep(0.01)
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed is not None, "no Ray worker was caught running an attention task"
    assert_tables_close(_tables(out), local_tables)


# ----------------------------------------------------------------------------- SLURM (submitit)
@needs_submitit
@pytest.mark.full_leg
def test_slurm_local_gives_the_local_tables(local_tables: dict[str, pd.DataFrame], text_file: Path,
                                            tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(_argv(text_file, out, "--executor", "slurm=local", "--slurm-params", "block=5,time=10")) == 0
    assert_tables_close(_tables(out), local_tables)
    folder = out / "logs" / "slurm"
    assert sorted(folder.glob("*_log.out")) and not sorted(folder.glob("*.pkl"))  # pickles go once read
    assert {f"logs/slurm/{p.name}" for p in folder.iterdir()} <= set(atomic.read_index(out))  # --overwrite removes them


@needs_submitit
@pytest.mark.full_leg
def test_slurm_blocks_resend_dead_jobs_not_task_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four tasks in blocks of two: one job array of two array tasks. The block whose job dies
    is sent again (one more job) and completes; the task that raises gets its exception, once,
    and its block's other task its result. A job that keeps dying fails its tasks with one
    line after the retries."""
    from depthlens.executors import slurm_backend

    monkeypatch.chdir(REPO)  # the jobs import tests.executor_tasks from here
    calls = tmp_path / "calls"
    calls.mkdir()
    with executor(Execution(executor="slurm=local", slurm_params="block=2"), tmp_path / "run") as pool:
        futures = [pool.submit(tasks.square, 3), pool.submit(tasks.die_once, str(tmp_path / "marker")),
                   pool.submit(tasks.fail, str(calls)), pool.submit(tasks.square, 4)]
        assert [futures[k].result() for k in (0, 1, 3)] == [9, "survived", 16]
        with pytest.raises(ValueError, match="the task's own error"):
            futures[2].result()
    assert len(list(calls.iterdir())) == 1
    assert len(list((tmp_path / "run" / "logs" / "slurm").glob("*_log.out"))) == 3
    monkeypatch.setattr(slurm_backend, "RETRIES", 1)
    with executor(Execution(executor="slurm=local"), tmp_path / "dying") as pool:
        with pytest.raises(RunError, match=r"SLURM job \d+ died 2 times, the last time: it ended without a result"):
            pool.submit(tasks.die).result()
