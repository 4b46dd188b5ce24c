"""The worker pool: results in order, and no worker outlives its parent (SIGKILL, SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from depthlens.executors.local import executor, install_sigterm_handler, ordered_map, submitted

PARENT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    from depthlens.executors.local import executor, install_sigterm_handler


    def sleeper(folder):
        Path(folder, f"worker-{os.getpid()}").touch()
        time.sleep(300)


    if __name__ == "__main__":
        folder = Path(sys.argv[1])
        install_sigterm_handler()
        try:
            with executor(2) as pool:
                futures = [pool.submit(sleeper, str(folder)) for _ in range(4)]
                while len(list(folder.glob("worker-*"))) < 2:
                    time.sleep(0.05)
                from multiprocessing import resource_tracker
                (folder / "tracker").write_text(str(resource_tracker._resource_tracker._pid or ""))
                (folder / "ready").touch()
                [f.result() for f in futures]
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """
)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        import psutil
    except ImportError:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _start_parent(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    """Start the parent script; return it and the pids of its workers and resource tracker."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    folder = tmp_path / "pids"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (folder / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the parent script did not start its workers: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    pids = [int(p.name.removeprefix("worker-")) for p in folder.glob("worker-*")]
    tracker = (folder / "tracker").read_text()
    return proc, pids + ([int(tracker)] if tracker else [])


def _wait_gone(pids: list[int], seconds: float = 5.0) -> list[int]:
    """The pids still alive after up to ``seconds``; kills them (they are this test's) before returning."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _sigterm(proc: subprocess.Popen[str], what: str, pids: list[int] | None = None) -> tuple[str, str, float]:
    """SIGTERM ``proc``: its output and the seconds it took to exit; fails (killing ``proc``
    and ``pids``) if it is still running 30 s later."""
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _wait_gone(pids or [], 0)
        pytest.fail(f"{what} did not exit within 30 s of SIGTERM")
    return out, err, time.monotonic() - t0


def _square(x: int) -> int:
    return x * x


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_workers_die_with_sigkilled_parent(tmp_path: Path) -> None:
    proc, pids = _start_parent(tmp_path)
    assert len(pids) >= 3 and all(_alive(p) for p in pids)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert _wait_gone(pids) == [], "workers or the resource tracker outlived a SIGKILLed parent"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_interrupts_like_ctrl_c_and_stops_workers(tmp_path: Path) -> None:
    proc, pids = _start_parent(tmp_path)
    out, err, seconds = _sigterm(proc, "the parent", pids)
    assert proc.returncode == 130 and "interrupted" in out, err[-2000:]
    assert seconds < 15, "the parent waited for its running tasks instead of stopping them"
    assert _wait_gone(pids) == [], "workers or the resource tracker outlived a SIGTERMed parent"


def test_pool_results_in_order() -> None:
    with executor(2) as pool:
        assert ordered_map(pool, _square, [(i,) for i in range(6)]) == [0, 1, 4, 9, 16, 25]
    with executor(1) as pool:
        assert ordered_map(pool, _square, [(3,)]) == [9]


def test_ordered_map_draws_lazy_tasks_within_the_window() -> None:
    """With max_pending, a generator of tasks is drawn only as results come in: when task i
    is drawn, at most max_pending earlier tasks are unfinished; results stay in order."""
    drawn: list[int] = []
    done: list[int] = []

    def tasks():
        for i in range(20):
            assert i - len(done) < 3, (i, done)  # fewer than max_pending submitted and unfinished
            drawn.append(i)
            yield (i,)

    class Recording:
        """An executor whose futures record when their result is taken."""

        def __init__(self, pool) -> None:
            self.pool = pool

        def submit(self, fn, *args):
            future = self.pool.submit(fn, *args)
            original = future.result

            def result(timeout=None):
                value = original(timeout)
                done.append(args[0])
                return value

            future.result = result
            return future

    with executor(2) as pool:
        assert ordered_map(Recording(pool), _square, tasks(), max_pending=3) == [i * i for i in range(20)]
    assert drawn == list(range(20)) and done == list(range(20))
    # inline, every task is done when submitted: each result is handed over before the next task
    # is drawn, whatever the window (so progress bars move with every result)
    drawn.clear()
    done.clear()
    with executor(1) as pool:
        futures = submitted(pool, _square, tasks(), max_pending=10)
        for i, future in enumerate(futures):
            assert future.result() == i * i and drawn[-1] == i
            done.append(i)


def test_install_sigterm_handler_returns_the_previous_one() -> None:
    import signal as _signal
    import threading

    previous = install_sigterm_handler()
    try:
        with pytest.raises(KeyboardInterrupt):
            _signal.raise_signal(_signal.SIGTERM)
        box: list[object] = []
        thread = threading.Thread(target=lambda: box.append(install_sigterm_handler()))
        thread.start()
        thread.join()
        assert box == [None]  # off the main thread nothing is installed
    finally:
        _signal.signal(_signal.SIGTERM, previous)


AHEAD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    from depthlens.executors.local import AheadExecutor, install_sigterm_handler

    if __name__ == "__main__":
        install_sigterm_handler()
        try:
            with AheadExecutor() as ahead:
                running = ahead.submit(time.sleep, 300)  # a forward pass that takes long
                queued = ahead.submit(Path(sys.argv[1]).touch)
                Path(sys.argv[2]).touch()
                running.result()
        except KeyboardInterrupt:
            print("interrupted", queued.cancelled(), flush=True)
            sys.exit(130)
    """
)


def test_ahead_executor_runs_calls_one_at_a_time_in_order() -> None:
    """Calls run in submission order, never two at once, and exceptions reach the caller."""
    import threading

    from depthlens.executors.local import AheadExecutor

    log, busy, lock = [], [], threading.Lock()

    def call(i: int) -> int:
        with lock:
            busy.append(1)
            assert len(busy) == 1, "two calls ran at once"
        time.sleep(0.01)
        log.append(i)
        with lock:
            busy.pop()
        return i * i

    with AheadExecutor() as ahead:
        futures = [ahead.submit(call, i) for i in range(6)]
        failing = ahead.submit(lambda: 1 / 0)
    assert [f.result() for f in futures] == [i * i for i in range(6)] and log == list(range(6))
    with pytest.raises(ZeroDivisionError):
        failing.result()


def test_read_ahead_yields_every_item_in_order_computing_the_next_in_another_thread() -> None:
    """Nothing runs before the first item is asked for; every item is computed in one other
    thread, the next one while the caller holds the current one; a producer's exception is
    raised in its item's place."""
    import threading

    from depthlens.executors.local import read_ahead

    made: list[tuple[int, int]] = []
    started = {i: threading.Event() for i in range(5)}

    def produce():
        for i in range(4):
            started[i].set()
            made.append((i, threading.get_ident()))
            yield i * 10
        started[4].set()
        raise ValueError("the producer failed")

    items = read_ahead(produce())
    time.sleep(0.05)
    assert made == []  # lazy
    got = []
    with pytest.raises(ValueError, match="the producer failed"):
        for item in items:
            assert started[len(got) + 1].wait(10), "the next item was not computed while the caller held this one"
            got.append(item)
    assert got == [0, 10, 20, 30] and [i for i, _ in made] == [0, 1, 2, 3]
    assert len({t for _, t in made}) == 1 and made[0][1] != threading.get_ident()
    assert list(read_ahead(iter(()))) == [] and list(read_ahead([1, 2])) == [1, 2]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_does_not_wait_for_the_call_ahead(tmp_path: Path) -> None:
    """A stop while a call runs ahead (a 300 s one here) exits at once: the running call is
    abandoned, the queued one cancelled and never run (ThreadPoolExecutor's threads are joined
    at exit, so a stop used to wait for the forward pass in flight)."""
    script, never, ready = tmp_path / "ahead.py", tmp_path / "never", tmp_path / "ready"
    script.write_text(AHEAD)
    proc = subprocess.Popen([sys.executable, str(script), str(never), str(ready)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the script did not start: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    out, err, seconds = _sigterm(proc, "the script")
    assert proc.returncode == 130 and out.strip() == "interrupted True", err[-2000:]
    assert seconds < 10 and not never.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_stop_while_a_worker_starts_kills_it_quietly(monkeypatch: pytest.MonkeyPatch,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """SIGTERM just after the pool spawned a worker, before the worker had its start-up data:
    the interrupt waits until the worker has it and is listed in the pool, and the stop kills
    it (a worker left without its data printed ``EOFError`` and a traceback)."""
    from multiprocessing import util

    from depthlens.executors.local import Task, local_backend

    spawned: list[int] = []

    def spawn_then_stop(path: str | bytes, args: list[str | bytes], passfds: tuple[int, ...]) -> int:
        pid = spawn(path, args, passfds)
        if "spawn_main" in " ".join(map(os.fsdecode, args)):  # a worker, not the resource tracker
            spawned.append(pid)
            signal.raise_signal(signal.SIGTERM)
        return pid

    spawn = util.spawnv_passfds
    monkeypatch.setattr(util, "spawnv_passfds", spawn_then_stop)
    previous = install_sigterm_handler()
    try:
        with pytest.raises(KeyboardInterrupt), local_backend(1) as backend:
            backend.submit(Task(_square, (3,)))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(spawned) == 1
    deadline = time.monotonic() + 30
    while _alive(spawned[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(spawned[0]) and "EOFError" not in capfd.readouterr().err


def test_an_abandoned_call_is_reported_until_it_ends() -> None:
    """A stop leaves the call in flight running (the command line then ends without the
    interpreter's finalisation, which would abort the process inside it)."""
    import threading

    from depthlens.executors.local import AheadExecutor, abandoned_call_running

    started, release = threading.Event(), threading.Event()
    with pytest.raises(KeyboardInterrupt), AheadExecutor() as ahead:
        ahead.submit(lambda: started.set() or release.wait())
        started.wait(10)
        raise KeyboardInterrupt
    assert abandoned_call_running()
    release.set()
    deadline = time.monotonic() + 10
    while abandoned_call_running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not abandoned_call_running()


def _worker_pid(_: int) -> int:
    return os.getpid()


def test_kept_workers_serve_every_body_and_a_failed_body_gets_fresh_ones() -> None:
    """Inside kept_workers, two executor bodies of the same size run on the same worker
    processes (a run's stages spawn once); a body that raises kills its workers and the next
    body starts new ones; after the block the workers are gone."""
    from depthlens.executors.local import kept_workers

    with kept_workers():
        with executor(2) as pool:
            first = set(ordered_map(pool, _worker_pid, [(i,) for i in range(8)]))
        with executor(2) as pool:
            second = set(ordered_map(pool, _worker_pid, [(i,) for i in range(8)]))
        assert second <= first and os.getpid() not in first
        with pytest.raises(RuntimeError), executor(2) as pool:
            ordered_map(pool, _worker_pid, [(0,)])
            raise RuntimeError("a failed stage")
        with executor(2) as pool:
            third = set(ordered_map(pool, _worker_pid, [(i,) for i in range(8)]))
        assert not third & first
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in first | third) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in first | third)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_sigterm_that_a_finaliser_swallowed_prints_nothing_and_stops_the_next_unit(tmp_path: Path) -> None:
    """A SIGTERM handled inside a ``__del__`` raises a KeyboardInterrupt that Python drops,
    printing "Exception ignored in ...": the hook keeps it off stderr, and the run's next unit
    raises it again instead of being stored; an unrelated exception in a finaliser is still
    printed."""
    script = ("import gc, signal, sys\n"
              "import pandas as pd\n"
              "from depthlens.executors.local import install_sigterm_handler\n"
              "from depthlens.runs import RunDirectory, RunMode\n"
              "run = RunDirectory.open(sys.argv[1], RunMode.NEW, {'config_hash': 'x'})\n"
              "class Loud:\n"
              "    def __del__(self):\n"
              "        raise ValueError('a finaliser bug')\n"
              "class Finalised:\n"
              "    def __del__(self):\n"
              "        signal.raise_signal(signal.SIGTERM)\n"
              "        sum(range(1000))\n"
              "install_sigterm_handler()\n"
              "Loud()\n"
              "gc.collect()\n"
              "try:\n"
              "    Finalised()\n"
              "    gc.collect()\n"
              "    print('ran on', flush=True)\n"
              "    run.write_unit('attention', 'u0', {'rows': pd.DataFrame({'a': [1]})})\n"
              "except KeyboardInterrupt as stop:\n"
              "    print('stopped:', stop, run.has_unit('attention', 'u0'))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["ran on", "stopped: signal 15 False"], (done.stdout, done.stderr)
    assert "KeyboardInterrupt" not in done.stderr and "a finaliser bug" in done.stderr, done.stderr


def test_a_sigterm_swallowed_elsewhere_stops_at_the_next_unit(tmp_path: Path) -> None:
    """A recorded SIGTERM whose exception something swallowed without a trace: the run's next
    unit raises it again instead of being stored (the command line then exits 130). Once the
    handler is given back, a stale request is ignored."""
    import signal as _signal

    from depthlens import interrupts
    from depthlens.runs import RunDirectory, RunMode

    run = RunDirectory.open(tmp_path / "run", RunMode.NEW, {"config_hash": "x"})
    previous = install_sigterm_handler()
    try:
        try:
            _signal.raise_signal(_signal.SIGTERM)
            sum(range(1000))
        except KeyboardInterrupt:
            pass  # swallowed, as a library's broad ``except BaseException`` would
        with pytest.raises(KeyboardInterrupt, match="signal 15"):
            run.write_unit("attention", "u0", {"rows": pd.DataFrame({"a": [1]})})
        assert not run.has_unit("attention", "u0")
    finally:
        _signal.signal(_signal.SIGTERM, previous)
    run.write_unit("attention", "u0", {"rows": pd.DataFrame({"a": [1]})})  # the handler is gone: stale
    assert run.has_unit("attention", "u0")
    interrupts.clear()


def test_a_script_read_from_stdin_gets_workers(tmp_path: Path) -> None:
    """``python -`` names its main ``<stdin>``, a file that does not exist: spawned workers
    must not try to run it as their main script (they died with FileNotFoundError and the
    tasks with BrokenProcessPool), and the name is given back afterwards."""
    script = ("import __main__, math\n"
              "from depthlens.executors.local import executor, ordered_map\n"
              "with executor(2) as pool:\n"
              "    print(ordered_map(pool, math.factorial, [(n,) for n in range(6)]))\n"
              "print(__main__.__file__)\n")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[1,", "1,", "2,", "6,", "24,", "120]", "<stdin>"]
