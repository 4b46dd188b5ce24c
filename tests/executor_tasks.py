"""Tasks for the SLURM backend's tests (tests/test_executors.py), in a module of their own:
each job imports it, and it imports nothing heavy, so the jobs start quickly."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path


def square(x: int) -> int:
    return x * x


def die_once(marker: str) -> str:
    """Kill this job's process the first time (the job dies without a result); return after."""
    if not Path(marker).exists():
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def die() -> None:
    """Kill this job's process, every time."""
    os.kill(os.getpid(), signal.SIGKILL)


def fail(calls: str) -> None:
    """Record the call in the folder ``calls``, then raise (the task's own error)."""
    Path(calls, uuid.uuid4().hex).touch()
    raise ValueError("the task's own error")
