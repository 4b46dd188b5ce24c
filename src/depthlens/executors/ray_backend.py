"""The Ray backend: ``--executor ray`` (a private instance) and ``ray=HOST:PORT`` / ``ray=auto``
(an existing cluster).

Each task is one Ray task named after its function, so a worker running it shows the process
title ``ray::head_chunk_row`` (and the Ray dashboard the same name). A task whose worker or
node dies is re-run by Ray up to :data:`MAX_RETRIES` times; an exception raised by the
task's own code is not retried and reaches the caller as that exception, with the worker's
traceback as a note. Tasks run single-threaded (BLAS, OpenMP, numba) through their
``runtime_env``.

A private instance (``ray``) is started with ``--jobs`` CPUs when the stage opens the
executor and shut down when it closes; a cluster is connected to and disconnected from (it
keeps running). A Ray already initialised in this process (by the caller of the Python API)
is used as it is and left running. Ray is started quietly: no dashboard, no usage
statistics, worker output not forwarded.

Starting and stopping Ray leaves this process's SIGTERM handler as it was
(:func:`_keeping_sigterm_handler`): ``ray.init`` replaces it with its own (``sys.exit``,
then a C++ handler that dumps a stack trace) and ``ray.shutdown`` resets it to the default
action, which would end a SIGTERMed run with exit 134 or 143 instead of the command line's
"interrupted; continue with --resume" and exit 130.

A cluster's nodes need the same depthlens installed (and the same numpy, scipy, numba):
tasks are references to depthlens functions with their array arguments, resolved on the
node that runs them. Token authentication (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``) is Ray's
own business: set it in the environment of the run as the cluster expects.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from ..errors import RunError, one_line
from .local import SINGLE_THREADED, Task, environ

__all__ = ["MAX_RETRIES", "RayBackend", "ray_backend"]

#: How many times Ray re-runs a task whose worker or node died (not one whose code raised).
MAX_RETRIES = 3
#: Terminal colour codes in Ray's error reports.
_ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")


def _run(task: Task) -> tuple[Any, dict[str, int]]:
    """The Ray task: run ``task`` on the worker (see :meth:`depthlens.executors.local.Task.__call__`)."""
    return task()


class RayBackend:
    """Tasks as Ray tasks of the Ray this process is connected to (:func:`ray_backend`)."""

    local_files = False

    def __init__(self, ray: Any) -> None:
        self._ray = ray
        self._remote = ray.remote(_run)
        self._options = {"max_retries": MAX_RETRIES, "retry_exceptions": False,
                         "runtime_env": {"env_vars": dict(SINGLE_THREADED)}}
        self._running: set[Any] = set()
        self._lock = threading.Lock()

    def submit(self, task: Task) -> Future[tuple[Any, dict[str, int]]]:
        ref = self._remote.options(name=task.name, **self._options).remote(task)
        out: Future[tuple[Any, dict[str, int]]] = Future()

        def finish(inner: Future) -> None:
            with self._lock:
                self._running.discard(ref)
            try:
                out.set_result(inner.result())
            except BaseException as exc:  # noqa: BLE001 - the task's error, a task lost for good, a cancellation
                out.set_exception(self._original(exc))

        with self._lock:
            self._running.add(ref)
        ref.future().add_done_callback(finish)
        return out

    def _original(self, exc: BaseException) -> BaseException:
        """The exception a task's own code raised (with Ray's report of the worker and its
        traceback as a note) for Ray's wrapper of it; any other exception as it is."""
        cause = getattr(exc, "cause", None) if isinstance(exc, self._ray.exceptions.RayTaskError) else None
        if not isinstance(cause, BaseException):
            return exc
        cause.add_note("raised on a Ray worker:\n" + _ANSI_CODES.sub("", str(exc)))
        return cause

    def flush(self) -> None:
        """Nothing is held back: every task goes to Ray at submission."""

    def cancel(self) -> None:
        """Cancel (and kill the workers of) every task that has not finished."""
        with self._lock:
            running = list(self._running)
        for ref in running:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)


@contextlib.contextmanager
def _keeping_sigterm_handler() -> Iterator[None]:
    """Give back, at the end of the ``with`` body (``ray.init`` or ``ray.shutdown``), the
    SIGTERM handler this process had at its start; a SIGTERM that Ray's own handler caught in
    the meantime (``sys.exit(SIGTERM)``) is then raised again for that handler (with
    :func:`depthlens.executors.local.install_sigterm_handler`'s, a :class:`KeyboardInterrupt`). Off the
    main thread, or when the handler was not installed from Python, the body runs as it is."""
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    if previous is None:
        yield
        return
    caught = False
    try:
        yield
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        caught = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    if caught:
        signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def ray_backend(address: str | None, jobs: int) -> Iterator[RayBackend]:
    """A :class:`RayBackend` on a private Ray instance with ``jobs`` CPUs (``address`` None) or
    on the cluster at ``address`` (``HOST:PORT``), for the ``with`` body. When the body raises,
    the outstanding tasks are cancelled; what this call started or connected is shut down.

    Raises
    ------
    RunError
        Ray could not be started or the cluster not joined (one line with Ray's reason).
    """
    import ray

    started = not ray.is_initialized()
    if started:
        where = f"the Ray cluster at {address}" if address else "a private Ray instance"
        try:
            with environ({"RAY_USAGE_STATS_ENABLED": "0"}), _keeping_sigterm_handler():
                ray.init(address=address or "local", num_cpus=None if address else jobs, include_dashboard=False,
                         log_to_driver=False, logging_level=logging.ERROR)
        except Exception as exc:  # noqa: BLE001 - Ray raises many kinds (ConnectionError, RuntimeError, auth errors)
            raise RunError(f"could not start or join {where}: {one_line(exc)}; check it with `ray status` or use "
                           "--executor local.") from exc
    backend = RayBackend(ray)
    try:
        yield backend
    except BaseException:
        backend.cancel()
        raise
    finally:
        if started:
            with _keeping_sigterm_handler():
                ray.shutdown()
