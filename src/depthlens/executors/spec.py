"""The executor specs, the SLURM settings and their checks, and :class:`Execution` (how a
run runs, without changing any number); :mod:`depthlens.executors` re-exports them."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import re
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError, one_line

if TYPE_CHECKING:
    from .local import Backend

__all__ = ["Execution", "ExecutorSpec", "check_execution", "job_folder", "max_jobs", "open_backend", "parse_executor",
           "parse_slurm_params", "usable_cores"]

@dataclass(frozen=True)
class Execution:
    """How to run, without changing any number: progress bars and where the numerical tasks
    run (:mod:`depthlens.executors`).

    Attributes
    ----------
    quiet : bool
        No progress bars.
    jobs : int
        Worker processes of the ``local`` executor (inline in this process when 1), CPUs of a
        private Ray instance (``ray``); not used by a Ray cluster or by SLURM.
    executor : str
        ``local``, ``ray``, ``ray=HOST:PORT``, ``ray=auto``, ``slurm`` or ``slurm=local``
        (:func:`depthlens.executors.parse_executor`).
    slurm_params : str
        ``key=value,...`` settings of the SLURM jobs
        (:func:`depthlens.executors.parse_slurm_params`); only with a ``slurm`` executor.
    command : tuple of str
        The command line that started the work, for the manifest (``depthlens run ...``); empty:
        this process's ``sys.argv`` (a script calling the API).
    """

    quiet: bool = False
    jobs: int = 2
    executor: str = "local"
    slurm_params: str = ""
    command: tuple[str, ...] = ()

    @property
    def threads(self) -> int:
        """Threads of this process for work that runs beside the executor (the funnel bootstrap's
        replicates, the topology correlations): :attr:`jobs`, at most the usable cores."""
        return max(1, min(self.jobs, usable_cores()))

    def say(self, line: str) -> None:
        """Print ``line`` to stderr unless :attr:`quiet` (a census's or sweep's progress)."""
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)


#: The accepted forms of ``--executor``, for error messages.
FORMS = "local, ray, ray=HOST:PORT, ray=auto, slurm or slurm=local"
#: How long the check of a Ray address waits for a TCP connection (seconds).
CONNECT_TIMEOUT_S = 3.0
#: Where Ray records the address of the cluster last started on this machine (``ray=auto``).
RAY_CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")
#: ``--slurm-params`` key of depthlens itself: tasks per array task.
BLOCK_KEY = "block"
#: submitit keys that ``--slurm-params`` does not take: lists and mappings (no ``key=value``
#: form) and the multi-task layouts (an array task runs its block once, in one process).
EXCLUDED_SLURM_KEYS = frozenset({"setup", "teardown", "srun_args", "additional_parameters", "nodes", "ntasks_per_node",
                                 "tasks_per_node", "use_srun", "map_count"})
INSTALL = "pip install 'depthlens[cluster]'"


@dataclass(frozen=True)
class ExecutorSpec:
    """A parsed ``--executor``.

    Attributes
    ----------
    kind : {"local", "ray", "slurm"}
    address : str or None
        ``ray``: None for a private instance, ``"auto"`` or ``"HOST:PORT"`` for a cluster;
        ``slurm``: None for the cluster, ``"local"`` for local processes; ``local``: None.
    """

    kind: str
    address: str | None = None


def parse_executor(spec: str) -> ExecutorSpec:
    """Parse ``--executor``: ``local``, ``ray``, ``ray=HOST:PORT``, ``ray=auto``, ``slurm``, ``slurm=local``.

    Raises
    ------
    InputError
        Any other form, in one line listing the accepted ones.

    Examples
    --------
    >>> parse_executor("ray=127.0.0.1:6379")
    ExecutorSpec(kind='ray', address='127.0.0.1:6379')
    """
    kind, sep, address = str(spec).strip().partition("=")
    kind, address = kind.strip(), address.strip()
    if kind == "local" and not sep:
        return ExecutorSpec("local")
    if kind == "slurm" and (not sep or address == "local"):
        return ExecutorSpec("slurm", address or None)
    if kind == "ray" and not sep:
        return ExecutorSpec("ray")
    if kind == "ray" and (address == "auto" or _host_port(address) is not None):
        return ExecutorSpec("ray", address)
    raise InputError(f"--executor {spec!r} is not understood; use {FORMS}.")


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` (a ``scheme://`` prefix dropped), None when malformed."""
    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def _slurm_keys() -> set[str]:
    """The keys ``--slurm-params`` takes: submitit's SLURM parameters (its sbatch options and
    its generic names such as ``mem_gb``, ``timeout_min``), less :data:`EXCLUDED_SLURM_KEYS`,
    plus :data:`BLOCK_KEY`."""
    from submitit import SlurmExecutor

    generic = set(SlurmExecutor._equivalence_dict() or {})
    return (SlurmExecutor._valid_parameters() | generic) - EXCLUDED_SLURM_KEYS | {BLOCK_KEY}


def _value(text: str) -> Any:
    """A ``--slurm-params`` value: an int, a float, true/false, or the text itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


def parse_slurm_params(text: str) -> dict[str, Any]:
    """Parse ``--slurm-params`` (``partition=cpu,time=60,mem_gb=4,array_parallelism=32,block=64``).

    Keys are submitit's SLURM parameters, each an sbatch option (``partition`` →
    ``--partition``, ``time`` minutes → ``--time``, ``mem_gb`` → ``--mem=<N>GB``,
    ``cpus_per_task`` → ``--cpus-per-task``, ``array_parallelism`` → the ``%N`` of ``--array``,
    ...), and ``block``: tasks per array task (default 64). Values are ints, floats,
    ``true``/``false`` or text.

    Raises
    ------
    InputError
        A malformed item, an unknown key (naming it and the accepted ones), a count (``block``,
        ``time`` in minutes, ``cpus_per_task``, ``array_parallelism``, ...) that is not a positive
        integer, a ``mem_gb`` that is not a positive number, or a ``time`` that is neither
        minutes nor ``[DAYS-]HOURS:MINUTES[:SECONDS]``.
    """
    params: dict[str, Any] = {}
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        return params
    accepted = _slurm_keys()
    for item in items:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key or not value:
            raise InputError(f"--slurm-params item {item!r} is not key=value; pass e.g. "
                             "--slurm-params partition=cpu,time=60,mem_gb=4.")
        if key not in accepted:
            raise InputError(f"--slurm-params key {key!r} is unknown; accepted keys: {', '.join(sorted(accepted))}.")
        params[key] = _value(value)
    for key in (BLOCK_KEY, *_SLURM_COUNTS):
        if key in params and not (isinstance(params[key], int) and not isinstance(params[key], bool) and params[key] > 0):
            raise InputError(f"--slurm-params {key}={params[key]} is invalid; pass a positive integer.")
    if "mem_gb" in params and not (isinstance(params["mem_gb"], (int, float)) and not isinstance(params["mem_gb"], bool)
                                   and params["mem_gb"] > 0):
        raise InputError(f"--slurm-params mem_gb={params['mem_gb']} is invalid; pass a positive number of GB.")
    if "time" in params and not (isinstance(params["time"], int) and not isinstance(params["time"], bool)
                                 and params["time"] > 0 or _SLURM_TIME.match(str(params["time"]))):
        raise InputError(f"--slurm-params time={params['time']} is invalid; pass minutes (a positive integer) or "
                         "SLURM's [DAYS-]HOURS:MINUTES[:SECONDS].")
    return params


#: SLURM settings that count something: each a positive integer.
_SLURM_COUNTS = ("array_parallelism", "timeout_min", "cpus_per_task", "cpus_per_gpu", "gpus_per_node",
                 "gpus_per_task", "num_gpus", "signal_delay_s")
#: A SLURM time limit written as text: ``[DAYS-]HOURS:MINUTES[:SECONDS]``.
_SLURM_TIME = re.compile(r"^(\d+-)?\d+:\d{2}(:\d{2})?$")


def _ray_address(spec: ExecutorSpec) -> str:
    """The ``HOST:PORT`` of a Ray cluster spec (``auto`` resolved as Ray resolves it)."""
    if spec.address != "auto":
        return str(spec.address)
    found = os.environ.get("RAY_ADDRESS", "").strip()
    if not found and RAY_CURRENT_CLUSTER.is_file():
        found = RAY_CURRENT_CLUSTER.read_text().strip()
    if not found or _host_port(found) is None:
        raise InputError("--executor ray=auto found no Ray cluster (RAY_ADDRESS is unset and none was started on "
                         "this machine); start one with `ray start --head`, pass --executor ray=HOST:PORT, or use "
                         "--executor local.")
    return found


def _check_reachable(address: str) -> None:
    """Refuse a Ray address where nothing accepts a TCP connection within :data:`CONNECT_TIMEOUT_S`."""
    host, port = _host_port(address) or ("", 0)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise InputError(f"no Ray cluster answers at {address} ({exc.strerror or one_line(exc)}); start one there "
                         f"with `ray start --head --port={port}` (and `ray start --address={address}` on the other "
                         "machines), or use --executor local.") from None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; the machine's count without one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_jobs() -> int:
    """The most worker processes ``--jobs`` may ask of a local executor or a private Ray
    instance: the usable cores, and never fewer than the default 2."""
    return max(2, usable_cores())


def _is_main_guard(node: ast.stmt) -> bool:
    """Whether ``node`` is ``if __name__ == "__main__":`` (either side of the ``==``)."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)):
        return False
    sides = [node.test.left, *node.test.comparators]
    return ({"__name__"} == {s.id for s in sides if isinstance(s, ast.Name)}
            and {"__main__"} == {s.value for s in sides if isinstance(s, ast.Constant)})


def unguarded_script_line() -> tuple[str, int] | None:
    """``(script, line)`` when this call comes from the top level of a script outside
    ``if __name__ == "__main__":``, else None.

    Local worker processes are spawned, and a spawned process re-runs the script's top level
    (as ``__mp_main__``): an unguarded call would start a run in every worker. Found from the
    call stack (the frame running the ``__main__`` module's own code) and the script's syntax
    tree (the top-level statement holding that line). A script with no file (``python -c``,
    ``python -`` reading stdin, an interactive session, a notebook) is never re-run, so it is
    never unguarded.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if main is None or not path or (spec is not None and spec.name.endswith("__main__")):
        return None  # python -m PACKAGE: multiprocessing does not re-run a package's __main__
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return None if _is_main_guard(node) else (path, line)
    return None


def check_execution(execution: Execution) -> None:
    """Check everything ``execution`` needs before any model loads or file is written.

    Raises
    ------
    InputError
        ``--jobs`` below 1 or above :func:`max_jobs` (local and private Ray), a malformed ``--executor`` or ``--slurm-params`` (or SLURM settings without a SLURM
        executor), Ray or submitit not installed (``pip install 'depthlens[cluster]'``), a Ray
        address where no cluster answers, ``--executor slurm`` without ``sbatch``/``srun``
        on ``PATH``; each in one line.
    """
    if isinstance(execution.jobs, bool) or not isinstance(execution.jobs, int) or execution.jobs < 1:
        raise InputError(f"--jobs {execution.jobs} is invalid; pass a positive number of worker processes.")
    spec = parse_executor(execution.executor)
    if spec.address is None and spec.kind in ("local", "ray") and execution.jobs > max_jobs():
        raise InputError(f"--jobs {execution.jobs} is more worker processes than this machine's {usable_cores()} usable "
                         f"CPU cores, which only slows a run down; pass --jobs {max_jobs()} or less.")
    if spec.kind != "slurm" and str(execution.slurm_params).strip():
        raise InputError(f"--slurm-params applies to --executor slurm, and the executor is {spec.kind}; "
                         "drop --slurm-params or pass --executor slurm.")
    if spec.kind == "local":
        unguarded = unguarded_script_line() if execution.jobs > 1 else None
        if unguarded is not None:
            raise InputError(f"{unguarded[0]} line {unguarded[1]} starts a depthlens run at the top level of the script, "
                             "which every worker process re-runs; put it under `if __name__ == \"__main__\":` (or "
                             "pass jobs=1).")
        return
    package = {"ray": "ray", "slurm": "submitit"}[spec.kind]
    if importlib.util.find_spec(package) is None:
        raise InputError(f"--executor {execution.executor} needs {package}, which is not installed: {INSTALL}.")
    if spec.kind == "ray":
        if spec.address is not None:
            _check_reachable(_ray_address(spec))
        return
    parse_slurm_params(execution.slurm_params)
    missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None] if spec.address is None else []
    if missing:
        raise InputError(f"--executor slurm needs SLURM's {' and '.join(missing)} on PATH, which this machine lacks; "
                         "run on a SLURM login node, or use --executor slurm=local (the same jobs as local processes) "
                         "or --executor local.")


def job_folder(run_root: str | os.PathLike[str]) -> Path:
    """Where the SLURM executor keeps its job files for a run: ``RUN/logs/slurm``."""
    return Path(run_root) / "logs" / "slurm"


@contextlib.contextmanager
def open_backend(execution: Execution, run_root: str | os.PathLike[str] | None) -> Iterator[Backend]:
    """The backend of ``execution`` (:class:`depthlens.executors.local.Backend`), open for the
    ``with`` body: started on entry, stopped on exit (its outstanding tasks cancelled when the
    body raises). ``run_root`` is the run directory (needed by SLURM for its job files).

    Raises
    ------
    InputError
        As :func:`check_execution`, or a SLURM executor without ``run_root``.
    """
    spec = parse_executor(execution.executor)
    if spec.kind == "ray":
        from .ray_backend import ray_backend

        with ray_backend(None if spec.address is None else _ray_address(spec), execution.jobs) as backend:
            yield backend
    elif spec.kind == "slurm":
        from .slurm_backend import slurm_backend

        if run_root is None:
            raise InputError("the slurm executor keeps its job files in a run directory, and none was given.")
        with slurm_backend(parse_slurm_params(execution.slurm_params), job_folder(run_root),
                           local=spec.address == "local") as backend:
            yield backend
    else:
        from .local import local_backend

        with local_backend(execution.jobs) as backend:
            yield backend
