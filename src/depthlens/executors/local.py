"""Process-parallel map for the CPU-bound numerical work (one BLAS thread per worker).

Results never depend on the number of workers, nor on where they run: tasks carry their own
seeds and results come back in submission order.

Where the tasks run is the executor's choice (``--executor``, :mod:`depthlens.executors`):
worker processes on this machine (``local``, the pool of this module), a Ray instance or
cluster, or SLURM job arrays. Each is a :class:`Backend` behind one :class:`TaskExecutor`,
which sends every call as a :class:`Task` and merges the LAPACK driver counts the task
reports into this process's (:mod:`depthlens.drivers`), so fallbacks taken anywhere are
recorded like those taken inline.

No local worker outlives the process that started it: each worker asks the kernel for
SIGKILL when its parent goes (``prctl(PR_SET_PDEATHSIG)`` on Linux) and also runs a
watchdog thread that exits when its parent pid changes (every POSIX system); the pool's
workers are killed when the body of :func:`executor` raises (Ctrl-C, SIGTERM through
:func:`install_sigterm_handler`, an error). The multiprocessing resource tracker then sees
its last writer go and exits too. Remote backends cancel their outstanding tasks then.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .. import drivers, interrupts
from ..allocator import keep_freed_memory
from .spec import open_backend, parse_executor

if TYPE_CHECKING:
    from .spec import Execution

T = TypeVar("T")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
#: The environment of a task: one thread for BLAS, OpenMP and numba.
SINGLE_THREADED = {name: "1" for name in THREAD_VARS}
WATCHDOG_INTERVAL_S = 0.2
"""How often a worker's watchdog checks that its parent is alive (seconds)."""
_PR_SET_PDEATHSIG = 1


def install_sigterm_handler() -> Any:
    """Handle SIGTERM like Ctrl-C: raise :class:`KeyboardInterrupt` in the main thread.

    The command line then stops its workers (see :func:`executor`), prints
    ``interrupted; continue with --resume`` and exits 130, and finished units stay for
    ``--resume``. A signal whose exception a finaliser swallowed prints nothing and is
    raised again where the next unit is stored (:mod:`depthlens.interrupts`). Call it at start-up, from the main thread.

    Returns
    -------
    handler or None
        The SIGTERM handler it replaced (give it back with ``signal.signal(signal.SIGTERM,
        previous)``), or None when nothing was installed: off the main thread, where Python
        cannot install signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    interrupts.clear()
    interrupts.install_quiet_hook()
    return signal.signal(signal.SIGTERM, interrupts.raise_interrupt)


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set the environment variables ``values`` for the ``with`` body, then restore them."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _watch_parent(parent: int) -> None:
    """Exit this process at once when its parent ``parent`` is gone (re-parented)."""
    while os.getppid() == parent:
        time.sleep(WATCHDOG_INTERVAL_S)
    os._exit(1)


def _worker_init(parent: int) -> None:
    """Worker initializer: die with the parent process ``parent``; keep freed memory for reuse
    as the parent does (:func:`~depthlens.allocator.keep_freed_memory`).

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
    keep_freed_memory()
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


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM during the ``with`` body, then deliver the first that came
    to the handler this process has for it. Off the main thread, or for a handler not
    installed from Python, the signal is left as it is."""
    main = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)} if main else {}
    held: list[int] = []
    for signum, handler in previous.items():
        if handler is not None:
            signal.signal(signum, lambda received, _: held.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
    if held:
        signal.raise_signal(held[0])


class _WorkerProcess(SpawnProcess):
    """A spawned worker process that starts with BLAS, OpenMP and numba on one thread: the
    environment says so while it starts (it is read when the libraries load), and only then,
    so this process's own libraries are left alone. It ignores Ctrl-C (:func:`_ctrl_c_ignored`)."""

    def start(self) -> None:
        with environ(SINGLE_THREADED), _main_file_hidden(), _ctrl_c_ignored():
            super().start()


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """While active, SIGINT is ignored, which the processes started then inherit (Python keeps
    an ignored SIGINT ignored); a SIGINT that arrives meanwhile is held and delivered after.

    Ctrl-C reaches every process of the terminal's process group: a worker would stop with a
    traceback of its own, where the parent alone handles it and kills its workers. Off the
    main thread, or for a handler not installed from Python, nothing changes."""
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    if handler is None:
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@contextlib.contextmanager
def _main_file_hidden() -> Iterator[None]:
    """While active, a ``__main__`` module whose ``__file__`` names no file has none.

    ``python -`` runs a script read from stdin as ``__main__`` with ``__file__ = "<stdin>"``;
    spawn would have every worker run that path as the main script and fail
    (FileNotFoundError), where a main without a file (``python -c``, a notebook) is not re-run.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or os.path.isfile(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class _WorkerContext(SpawnContext):
    """The ``spawn`` start method with :class:`_WorkerProcess` workers."""

    Process = _WorkerProcess


class InlineExecutor(Executor):
    """Runs each task at submission, in this process (``jobs=1``)."""

    #: Tasks get arrays as they are (nothing to gain from files, :attr:`TaskExecutor.local_files`).
    local_files = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - re-raised by future.result()
            future.set_exception(exc)
        return future


#: The threads of :class:`AheadExecutor` s that were shut down without waiting for their call.
_ABANDONED: list[threading.Thread] = []


def abandoned_call_running() -> bool:
    """Whether a call that an :class:`AheadExecutor` abandoned on a stop still runs.

    While one runs (a forward pass, in torch's C++ code with the GIL released), the
    interpreter's finalisation would end its thread there, which aborts the process
    ("terminate called without an active exception", exit 134): the command line then ends
    with :func:`os._exit` instead.
    """
    return any(thread.is_alive() for thread in _ABANDONED)


class AheadExecutor(Executor):
    """Runs submitted calls one at a time, in submission order, in one daemon thread of this
    process: work done ahead (the next forward pass) while this thread hands out the last.

    Unlike :class:`~concurrent.futures.ThreadPoolExecutor`, whose threads the interpreter
    joins at exit, a stop (Ctrl-C, SIGTERM) does not wait for the call in flight: leaving the
    ``with`` block on an exception cancels the queued calls and abandons the running one,
    whose result nothing reads (:func:`abandoned_call_running` says whether it still runs).
    On a normal exit the block waits for the calls submitted.
    """

    def __init__(self, name: str = "depthlens-ahead") -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - re-raised by future.result()
                future.set_exception(exc)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:  # the calls not started yet; the running one is abandoned when not waited for
            with contextlib.suppress(Exception):
                while (item := self._queue.get_nowait()) is not None:
                    item[0].cancel()
        self._queue.put(None)
        if wait:
            self._thread.join()
        else:
            _ABANDONED[:] = [t for t in _ABANDONED if t.is_alive()] + [self._thread]

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)


#: Largest item (bytes) callers let :func:`read_ahead` compute while they use the one before:
#: two items are in memory then. 512 MiB: the funnel bootstrap's per-chunk sums of one
#: sub-layer up to d ≈ 1400 at 32 chunks (the 8B shape's single chunk: 134 MB), a topology
#: batch of SmolLM2's residual states (145 MB).
READ_AHEAD_BYTES = 2**29


def read_ahead(items: Iterable[T]) -> Iterator[T]:
    """The items of ``items`` in order, each next one computed in an :class:`AheadExecutor`'s
    thread while the caller uses the current one (one item ahead: memory for two at once).

    For a producer that leaves the interpreter (torch, BLAS) feeding a consumer that does too:
    the two overlap on separate cores. Nothing runs until the first item is asked for, so the
    producer starts under whatever the caller set up by then (e.g. a BLAS thread limit, which
    is process-wide); an exception of the producer is raised where its item would have been.
    """
    it = iter(items)
    end = object()
    with AheadExecutor() as ahead:
        pending = ahead.submit(next, it, end)
        while (item := pending.result()) is not end:
            pending = ahead.submit(next, it, end)
            yield item


@dataclass(frozen=True)
class Task:
    """One call ``fn(*args, **kwargs)`` as it travels to a worker: ``fn`` is pickled by
    reference (a module-level function of depthlens), the arguments by value."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The function's name (Ray shows it in the worker's process title, ``ray::NAME``)."""
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def __call__(self) -> tuple[Any, dict[str, int]]:
        """Run the call here; return its result and the decomposition drivers it used."""
        before = drivers.driver_counts()
        result = self.fn(*self.args, **self.kwargs)
        return result, drivers.count_difference(drivers.driver_counts(), before)


class Backend(Protocol):
    """Where a :class:`TaskExecutor` runs its tasks: the local pool (:func:`local_backend`),
    Ray or SLURM (:mod:`depthlens.executors`)."""

    #: Whether tasks run on this machine, so arrays can be handed over as files in its
    #: temporary folder (memory-mapped instead of copied into every task).
    local_files: bool

    def submit(self, task: Task) -> Future[tuple[Any, dict[str, int]]]:
        """Start ``task`` (or queue it); the future gets what ``task()`` returns, or its exception."""

    def flush(self) -> None:
        """Send the tasks still held back (a backend that batches them); called before a
        caller waits on or asks about any future."""


class _Waiting(Future):
    """A future that first has its backend send the tasks it holds back whenever someone
    waits on it or asks whether it is done."""

    def __init__(self, flush: Callable[[], None]) -> None:
        super().__init__()
        self._flush = flush

    def result(self, timeout: float | None = None) -> Any:
        self._flush()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._flush()
        return super().exception(timeout)

    def done(self) -> bool:
        self._flush()
        return super().done()


class TaskExecutor(Executor):
    """An executor whose tasks run on ``backend`` and report the LAPACK drivers they used
    (:mod:`depthlens.linalg.guarded`); the counts are merged into this process's when a task
    finishes, so fallbacks taken in workers are recorded like those taken inline."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @property
    def local_files(self) -> bool:
        """Whether tasks run on this machine (:attr:`Backend.local_files`)."""
        return self.backend.local_files

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        outer: Future[T] = _Waiting(self.backend.flush)

        def finish(inner: Future) -> None:
            try:
                result, counts = inner.result()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                outer.set_exception(exc)
                return
            drivers.merge_counts(counts)
            outer.set_result(result)

        self.backend.submit(Task(fn, args, kwargs)).add_done_callback(finish)
        return outer


class _LocalBackend:
    """The spawned worker processes of :func:`local_backend`."""

    local_files = True

    def __init__(self, pool: ProcessPoolExecutor) -> None:
        self.pool = pool

    def submit(self, task: Task) -> Future[tuple[Any, dict[str, int]]]:
        """Queue ``task``; a stop meanwhile waits until a worker the pool starts for it has its
        start-up data and is listed in the pool, so the stop kills it with the others (a worker
        left without that data prints ``EOFError`` and its traceback)."""
        with _stops_held():
            return self.pool.submit(task)

    def flush(self) -> None:
        """Nothing is held back: the pool queues every task at submission."""


#: The pools that :func:`kept_workers` keeps, innermost last: ``{jobs: pool}`` each.
_KEPT: list[dict[int, ProcessPoolExecutor]] = []


@contextlib.contextmanager
def kept_workers() -> Iterator[None]:
    """Keep the local worker processes that :func:`local_backend` starts in the ``with`` body
    alive until the body ends, for the next :func:`local_backend` of the same size to reuse.

    A worker imports torch and depthlens when it starts (seconds of CPU each), so the stages
    of one run share one pool instead of spawning their own. A pool whose body raised is
    killed as before and a fresh one is started by the next :func:`local_backend`; when this
    body ends the kept pools are shut down (killed when it raised).
    """
    kept: dict[int, ProcessPoolExecutor] = {}
    _KEPT.append(kept)
    try:
        yield
    except BaseException:
        for pool in kept.values():
            _kill_workers(pool)
        raise
    finally:
        _KEPT.remove(kept)
        for pool in kept.values():
            pool.shutdown(wait=True)


@contextlib.contextmanager
def local_backend(jobs: int) -> Iterator[_LocalBackend]:
    """``jobs`` single-threaded worker processes on this machine (the ``local`` executor).

    Workers are spawned (not forked), so a parent holding a torch model and its thread pool
    is never duplicated; BLAS, OpenMP and numba get one thread through the environment each
    worker starts with (:class:`_WorkerProcess`; workers start as tasks arrive). Workers exit
    when this process dies (even by SIGKILL); when the body raises, queued tasks are
    cancelled and the workers killed instead of finishing their running tasks. Inside
    :func:`kept_workers` the pool outlives the body (unless the body raised) and is reused.
    """
    kept = _KEPT[-1] if _KEPT else None
    pool = kept.pop(jobs, None) if kept is not None else None
    if pool is not None and getattr(pool, "_broken", False):  # a worker died: start afresh
        _kill_workers(pool)
        pool = None
    if pool is None:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=_WorkerContext(), initializer=_worker_init,
                                   initargs=(os.getpid(),))
    try:
        yield _LocalBackend(pool)
    except BaseException:
        _kill_workers(pool)
        raise
    if kept is not None:
        kept[jobs] = pool
    else:
        pool.shutdown(wait=True)


@contextlib.contextmanager
def executor(execution: Execution | int, run_root: str | Path | None = None) -> Iterator[Executor]:
    """The executor of ``execution`` (:class:`depthlens.executors.Execution`; an int ``n``: the
    local pool of ``n`` workers).

    ``local`` (the default) runs the tasks on ``jobs`` single-threaded worker processes
    (:func:`local_backend`; inline in this process when ``jobs <= 1``); ``ray`` and
    ``slurm`` send them to Ray or to SLURM job arrays (:mod:`depthlens.executors`; SLURM's
    job files go to ``run_root/logs/slurm``). Whatever the backend, when the body raises (an
    error, :class:`KeyboardInterrupt` from Ctrl-C or from SIGTERM after
    :func:`install_sigterm_handler`) the outstanding tasks are cancelled and local workers
    killed instead of finishing their running tasks. Submit from the thread that will
    outlive the pool (in depthlens, the main thread): on Linux a local worker dies with the
    thread that started it.
    """
    jobs = execution if isinstance(execution, int) else execution.jobs
    if jobs <= 1 and (isinstance(execution, int) or parse_executor(execution.executor).kind == "local"):
        yield InlineExecutor()
        return
    with local_backend(jobs) if isinstance(execution, int) else open_backend(execution, run_root) as backend:
        yield TaskExecutor(backend)


def submitted(pool: Executor, fn: Callable[..., T], tasks: Iterable[tuple], max_pending: int | None = None
              ) -> Iterator[Future]:
    """The futures of ``fn(*task)`` for every task, in task order, each yielded once submitted.

    ``tasks`` may be lazy: with ``max_pending``, once that many futures are out the oldest is
    yielded before the next task is drawn, and a consumer that takes each result before
    asking for the next future keeps at most ``max_pending`` tasks unfinished at once. So the
    workers stay busy across the groups a generator yields (e.g. one layer's matrices after
    another) without a barrier between groups, the arguments in flight stay bounded, and with
    the inline executor (which runs a task when it is submitted) every result arrives as soon
    as it is computed, so progress bars move."""
    if isinstance(pool, InlineExecutor):  # each task is done when submitted: hand it over at once
        max_pending = 1
    pending: deque[Future] = deque()
    for task in tasks:
        pending.append(pool.submit(fn, *task))
        if max_pending is not None and len(pending) >= max_pending:
            yield pending.popleft()
    yield from pending


def ordered_map(pool: Executor, fn: Callable[..., T], tasks: Iterable[tuple], max_pending: int | None = None) -> list[T]:
    """The results of ``fn(*task)`` for every task, in task order (:func:`submitted`)."""
    return [future.result() for future in submitted(pool, fn, tasks, max_pending)]
