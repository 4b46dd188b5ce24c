"""The SLURM backend through submitit: ``--executor slurm`` (a cluster) and ``slurm=local``
(submitit's ``LocalExecutor``: each array task a process on this machine).

Thousands of small tasks must not become thousands of jobs: tasks are held back and sent,
when a caller waits on (or asks about) any of their futures, as one job array whose array
tasks each run a block of ``block`` tasks (``--slurm-params block=N``, default
:data:`BLOCK`) in order, one process per array task. A background thread polls the jobs and
completes the futures. An exception raised by a task goes to that task's future (it is not
retried; the block's other tasks go on). A job that dies (node failure, time limit,
``scancel``, out of memory: submitit's ``FailedJobError`` or ``UncompletedJobError``, or no
result at all) is sent again, up to :data:`RETRIES` times, after which its tasks fail with
one line naming the job and its log.

Job files (the pickled blocks, results, sbatch scripts and logs) go to ``RUN/logs/slurm``:
on a cluster the run directory must be on a file system that the compute nodes share. A
block's pickles are deleted once its result is read; the logs stay, listed in the run's
index (``--overwrite`` removes them). Jobs use the interpreter of this process
(``sys.executable``), so the environment with depthlens installed must be visible from the
nodes too; their tasks run single-threaded (BLAS, OpenMP, numba): the jobs inherit that
environment from their submission, and a SLURM job script exports it again.

``--slurm-params`` keys (:func:`depthlens.executors.parse_slurm_params`) are submitit's, each
an sbatch option: ``partition`` (``--partition``), ``time`` in minutes (``--time``, default
:data:`TIME_MIN`; ``timeout_min`` alike), ``mem_gb`` (``--mem=<N>GB``; ``mem``,
``mem_per_cpu``, ``mem_per_gpu`` as sbatch writes them), ``cpus_per_task``
(``--cpus-per-task``), ``gpus_per_node``, ``gpus_per_task``, ``cpus_per_gpu``, ``gres``,
``qos``, ``account``, ``constraint``, ``exclude``, ``nodelist``, ``comment``, ``job_name``
(``--job-name``, default ``depthlens``), ``mail_type``, ``mail_user``, ``wckey``,
``exclusive``, ``dependency``, ``signal_delay_s`` (``--signal=USR2@N``), ``stderr_to_stdout``,
and ``array_parallelism`` (the ``%N`` of ``--array=0-M%N``: array tasks running at once,
default 256). With ``slurm=local`` only ``time`` and ``block`` apply, and every array task
starts at once.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
import traceback
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, RunError, one_line
from ..runs import atomic
from .spec import BLOCK_KEY
from .local import SINGLE_THREADED, Task, environ

__all__ = ["BLOCK", "RETRIES", "SlurmBackend", "run_block", "slurm_backend"]

#: Tasks per array task unless ``--slurm-params block=N`` says otherwise.
BLOCK = 64
#: How many times a job that died is sent again before its tasks fail.
RETRIES = 3
#: The jobs' time limit in minutes unless ``time`` (or ``timeout_min``) says otherwise.
TIME_MIN = 60
#: How often the background thread looks at the jobs in flight (seconds).
POLL_S = 0.5
#: How long a SLURM job that ended may take to show its result file on a shared file system
#: before it counts as dead (seconds; submitit waits as long). A local job writes its result
#: before its process exits, so there it counts as dead at once.
RESULT_GRACE_S = 15.0

_Outcome = tuple[bool, Any]
"""``(True, task())`` or ``(False, the exception the task raised)``."""


def _portable(exc: Exception) -> Exception:
    """``exc`` with its traceback as a note (a pickled exception loses its frames), or a
    :class:`RuntimeError` saying the same when ``exc`` itself cannot be pickled."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    try:
        pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - any pickling failure: send the text instead
        exc = RuntimeError(one_line(exc, None))
    exc.add_note(f"raised in a SLURM job:\n{text}")
    return exc


def run_block(tasks: list[Task]) -> list[_Outcome]:
    """Run a block of tasks in order (one array task); an exception goes into that task's
    outcome and the next task runs."""
    outcomes: list[_Outcome] = []
    for task in tasks:
        try:
            outcomes.append((True, task()))
        except Exception as exc:  # noqa: BLE001 - the task's own error, handed to its future
            outcomes.append((False, _portable(exc)))
    return outcomes


@dataclass
class _Flight:
    """A block in a submitted job: the job, its tasks with their futures, the attempt (0:
    first), and when the job was first seen ended without a result."""

    job: Any
    tasks: list[tuple[Task, Future]]
    attempt: int
    ended: float | None = None


class SlurmBackend:
    """Tasks held back, then sent as job arrays of blocks through a submitit executor
    (module notes); a background thread completes their futures."""

    local_files = False

    def __init__(self, executor: Any, block: int, result_grace_s: float) -> None:
        self._executor = executor
        self._block = block
        self._result_grace_s = result_grace_s
        self._lock = threading.Lock()
        self._submitting = threading.Lock()  # submitit executors are not thread-safe
        self._held: list[tuple[Task, Future]] = []
        self._flights: list[_Flight] = []
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="depthlens-slurm-poller", daemon=True)
        self._poller.start()

    def submit(self, task: Task) -> Future[tuple[Any, dict[str, int]]]:
        future: Future[tuple[Any, dict[str, int]]] = Future()
        with self._lock:
            self._held.append((task, future))
        return future

    def flush(self) -> None:
        """Send the held tasks as one job array of blocks."""
        with self._lock:
            held, self._held = self._held, []
        if held:
            self._send([held[i : i + self._block] for i in range(0, len(held), self._block)], attempt=0)

    def _send(self, blocks: list[list[tuple[Task, Future]]], attempt: int) -> None:
        """Submit ``blocks`` as one job array; a submission that fails (sbatch refused it)
        fails their futures."""
        try:
            with self._submitting, environ(SINGLE_THREADED):  # the jobs inherit it (see _submitit_executor)
                jobs = self._executor.map_array(run_block, [[task for task, _ in block] for block in blocks])
        except Exception as exc:  # noqa: BLE001 - handed to the tasks' futures
            for block in blocks:
                for _, future in block:
                    future.set_exception(RunError(f"submitting SLURM jobs failed: {one_line(exc)}"))
            return
        with self._lock:
            self._flights += [_Flight(job, block, attempt) for job, block in zip(jobs, blocks, strict=True)]

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._check()
            except Exception as exc:  # noqa: BLE001 - never leave a caller waiting on a dead poller
                with self._lock:
                    flights, self._flights = self._flights, []
                for flight in flights:
                    for _, future in flight.tasks:
                        future.set_exception(exc)

    def _check(self) -> None:
        """Complete the futures of every finished job; send the blocks of dead jobs again."""
        with self._lock:
            flights = list(self._flights)
        for flight in flights:
            outcome = self._outcome(flight)
            if outcome is None:
                continue
            with self._lock:
                self._flights.remove(flight)
            _tidy(flight.job)
            if isinstance(outcome, list):
                for (_, future), (ok, value) in zip(flight.tasks, outcome, strict=True):
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
            elif flight.attempt < RETRIES:
                self._send([flight.tasks], flight.attempt + 1)
            else:
                error = RunError(f"SLURM job {flight.job.job_id} died {flight.attempt + 1} times, the last time: "
                                 f"{outcome}; see {flight.job.paths.stderr}.")
                for _, future in flight.tasks:
                    future.set_exception(error)

    def _outcome(self, flight: _Flight) -> list[_Outcome] | str | None:
        """The outcomes of a finished job's block, why it died (a line), or None while it runs."""
        from submitit.core.utils import FailedJobError, UncompletedJobError

        job = flight.job
        if not job.done():
            return None
        if job.paths.result_pickle.exists():
            try:
                return job.result()
            except (FailedJobError, UncompletedJobError) as exc:
                return one_line(exc)
        now = time.monotonic()
        flight.ended = now if flight.ended is None else flight.ended
        if now - flight.ended < self._result_grace_s:
            return None
        return f"it ended without a result (state {job.state})"

    def close(self) -> None:
        """Send what is held, wait for every job in flight, stop the poller."""
        self.flush()
        while True:
            with self._lock:
                if not self._flights:
                    break
            time.sleep(POLL_S)
        self._stop.set()
        self._poller.join()

    def cancel(self) -> None:
        """Stop the poller, cancel every job in flight and every future not done."""
        self._stop.set()
        self._poller.join()
        with self._lock:
            flights, self._flights = self._flights, []
            held, self._held = self._held, []
        for flight in flights:
            with contextlib.suppress(Exception):
                flight.job.cancel(check=False)
        for _, future in held + [item for flight in flights for item in flight.tasks]:
            future.cancel()


def _tidy(job: Any) -> None:
    """Delete a settled job's pickles (its block and result) and list its remaining files
    (logs) in the run's index."""
    for path in (job.paths.submitted_pickle, job.paths.result_pickle):
        Path(path).unlink(missing_ok=True)
    for path in sorted(Path(job.paths.folder).glob(f"{job.job_id}_*")):
        atomic.record(path)


def _submitit_executor(params: dict[str, Any], folder: Path, local: bool) -> Any:
    """The submitit executor of the settings ``params`` (``block`` removed). Jobs inherit the
    single-threaded environment of their submission (:meth:`SlurmBackend._send`); a SLURM job
    script exports it again, in case the site's sbatch does not pass the environment on."""
    import submitit

    timeout = params.pop("time", params.pop("timeout_min", TIME_MIN))
    if local:
        executor = submitit.LocalExecutor(folder)
        executor.update_parameters(timeout_min=timeout)
        return executor
    executor = submitit.SlurmExecutor(folder)
    setup = [f"export {name}={value}" for name, value in SINGLE_THREADED.items()]
    try:
        executor.update_parameters(**executor._convert_parameters({"job_name": "depthlens", **params}), time=timeout,
                                   setup=setup)
    except (ValueError, TypeError) as exc:
        raise InputError(f"--slurm-params is not accepted by submitit: {one_line(exc)}") from None
    return executor


@contextlib.contextmanager
def slurm_backend(params: dict[str, Any], folder: Path, local: bool = False) -> Iterator[SlurmBackend]:
    """A :class:`SlurmBackend` for the ``with`` body, its job files in ``folder``: SLURM job
    arrays (``local`` False) or local processes (``local`` True). ``params`` are parsed
    ``--slurm-params``. When the body raises, the jobs in flight are cancelled; otherwise the
    exit waits for them.

    Raises
    ------
    InputError
        Settings that submitit refuses.
    """
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(params)
    block = params.pop(BLOCK_KEY, BLOCK)
    backend = SlurmBackend(_submitit_executor(params, folder, local), block, 0.0 if local else RESULT_GRACE_S)
    try:
        yield backend
    except BaseException:
        backend.cancel()
        raise
    backend.close()
