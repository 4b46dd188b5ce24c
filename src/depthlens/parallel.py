"""Process-parallel map for the CPU-bound numerical work (one BLAS thread per worker).

Results never depend on the number of workers: tasks carry their own seeds and results
come back in submission order.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


class InlineExecutor(Executor):
    """Runs each task at submission, in this process (``jobs=1``)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - re-raised by future.result()
            future.set_exception(exc)
        return future


@contextlib.contextmanager
def executor(jobs: int) -> Iterator[Executor]:
    """An executor with ``jobs`` single-threaded worker processes (inline when ``jobs <= 1``).

    Workers are spawned (not forked), so a parent holding a torch model and its thread pool
    is never duplicated; each worker limits BLAS, OpenMP and numba to one thread.
    """
    if jobs <= 1:
        yield InlineExecutor()
        return
    saved = {k: os.environ.get(k) for k in THREAD_VARS}
    os.environ.update({k: "1" for k in THREAD_VARS})
    try:
        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    with pool:
        yield pool


def ordered_map(pool: Executor, fn: Callable[..., T], tasks: Iterable[tuple]) -> list[T]:
    """Submit ``fn(*task)`` for every task and return the results in task order."""
    futures = [pool.submit(fn, *task) for task in tasks]
    return [f.result() for f in futures]
