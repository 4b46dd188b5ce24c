"""Process-parallel map for the CPU-bound numerical work (one BLAS thread per worker).

Results never depend on the number of workers: tasks carry their own seeds and results
come back in submission order.

No worker outlives the process that started it: each worker asks the kernel for SIGKILL
when its parent goes (``prctl(PR_SET_PDEATHSIG)`` on Linux) and also runs a watchdog
thread that exits when its parent pid changes (every POSIX system); the pool's workers are
killed when the body of :func:`executor` raises (Ctrl-C, SIGTERM through
:func:`install_sigterm_handler`, an error). The multiprocessing resource tracker then
sees its last writer go and exits too.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

from . import drivers

T = TypeVar("T")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
WATCHDOG_INTERVAL_S = 0.2
"""How often a worker's watchdog checks that its parent is alive (seconds)."""
_PR_SET_PDEATHSIG = 1


def _raise_interrupt(signum: int, frame: types.FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def install_sigterm_handler() -> Any:
    """Handle SIGTERM like Ctrl-C: raise :class:`KeyboardInterrupt` in the main thread.

    The command line then stops its workers (see :func:`executor`), prints
    ``interrupted; continue with --resume`` and exits 130, and finished units stay for
    ``--resume``. Call it at start-up, from the main thread.

    Returns
    -------
    handler or None
        The SIGTERM handler it replaced (give it back with ``signal.signal(signal.SIGTERM,
        previous)``), or None when nothing was installed: off the main thread, where Python
        cannot install signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def _watch_parent(parent: int) -> None:
    """Exit this process at once when its parent ``parent`` is gone (re-parented)."""
    while os.getppid() == parent:
        time.sleep(WATCHDOG_INTERVAL_S)
    os._exit(1)


def _worker_init(parent: int) -> None:
    """Worker initializer: die with the parent process ``parent``.

    On Linux the kernel sends SIGKILL when the parent thread that started this worker
    exits (``PR_SET_PDEATHSIG``); :func:`executor` pools start their workers from the
    thread that submits, which in depthlens is always the main thread. The watchdog thread
    covers other systems and a parent that died before the ``prctl`` call.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="depthlens-parent-watchdog", daemon=True).start()


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a pool without waiting for its running tasks: cancel what is queued, kill the workers."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle before Python 3.14
    pool.shutdown(wait=False, cancel_futures=True)  # forgets the processes: list them first
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.kill()
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.join(timeout=5)


class InlineExecutor(Executor):
    """Runs each task at submission, in this process (``jobs=1``)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - re-raised by future.result()
            future.set_exception(exc)
        return future


def _counted(fn: Callable[..., T], args: tuple, kwargs: dict) -> tuple[T, dict[str, int]]:
    """Run ``fn`` in a worker; return its result and the decomposition drivers it used."""
    before = drivers.driver_counts()
    result = fn(*args, **kwargs)
    return result, drivers.count_difference(drivers.driver_counts(), before)


class _CountingExecutor(Executor):
    """A process pool whose tasks report the LAPACK drivers they used
    (:mod:`depthlens.linalg.guarded`); the counts are merged into this process's when a
    task finishes, so fallbacks taken in workers are recorded like those taken inline."""

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self.pool = pool

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        outer: Future[T] = Future()

        def finish(inner: Future) -> None:
            try:
                result, counts = inner.result()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                outer.set_exception(exc)
                return
            drivers.merge_counts(counts)
            outer.set_result(result)

        self.pool.submit(_counted, fn, args, kwargs).add_done_callback(finish)
        return outer

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


@contextlib.contextmanager
def executor(jobs: int) -> Iterator[Executor]:
    """An executor with ``jobs`` single-threaded worker processes (inline when ``jobs <= 1``).

    Workers are spawned (not forked), so a parent holding a torch model and its thread pool
    is never duplicated; each worker limits BLAS, OpenMP and numba to one thread. Workers
    exit when this process dies (even by SIGKILL); when the body raises (an error,
    :class:`KeyboardInterrupt` from Ctrl-C or from SIGTERM after
    :func:`install_sigterm_handler`), queued tasks are cancelled and the workers are killed
    instead of finishing their running tasks. Submit from the thread that will outlive the
    pool (in depthlens, the main thread): on Linux a worker dies with the thread that started it.
    """
    if jobs <= 1:
        yield InlineExecutor()
        return
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    os.environ.update({k: "1" for k in THREAD_VARS})
    try:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_init, initargs=(os.getpid(),))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        yield _CountingExecutor(pool)
    except BaseException:
        _kill_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True)


def ordered_map(pool: Executor, fn: Callable[..., T], tasks: Iterable[tuple]) -> list[T]:
    """Submit ``fn(*task)`` for every task and return the results in task order."""
    futures = [pool.submit(fn, *task) for task in tasks]
    return [f.result() for f in futures]
