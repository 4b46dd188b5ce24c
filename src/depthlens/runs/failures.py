"""Failure isolation: a unit of work that raises is logged and recorded, and the run goes on.

A failed unit writes its traceback to ``RUN/logs/<stage>.log`` and leaves no finished
marker, so ``--resume`` retries it. Stages run their units inside :func:`unit_guard` and
build their tables from the units that finished; the workflow then marks a stage with failed
units ``failed``, skips the stages that need its output, renders the report and ends with
one line per failure (:func:`failure_lines`) and :data:`EXIT_FAILED_UNITS`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import StorageError, storage_error
from ..errors import one_line
from . import atomic

#: Exit status of a run that finished with failed units or stages (2 is bad input, 130 an
#: interrupt, 1 an internal error).
EXIT_FAILED_UNITS = 3


@dataclass(frozen=True)
class UnitFailure:
    """One unit (or a whole stage, ``unit=None``) that raised, with its one-line error."""

    stage: str
    unit: str | None
    error: str
    log: Path

    def line(self) -> str:
        """``jacobian unit funnel_init failed: …; details in RUN/logs/jacobian.log``."""
        what = f"{self.stage} unit {self.unit}" if self.unit else f"stage {self.stage}"
        return f"{what} failed: {self.error}; details in {self.log}"


def log_exception(root: Path, stage: str, unit: str | None, exc: BaseException) -> UnitFailure:
    """Append ``exc``'s traceback to ``root/logs/<stage>.log`` and return its record."""
    log = Path(root) / "logs" / f"{stage}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    atomic.record(log)  # listed in the run's index, so --overwrite removes it
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    with log.open("a") as fh:
        fh.write(f"--- {now} {stage} {'unit ' + unit if unit else 'stage'} failed\n")
        fh.write("".join(traceback.format_exception(exc)))
    return UnitFailure(stage, unit, one_line(exc), log)


def fatal(exc: BaseException) -> StorageError | None:
    """The :class:`~depthlens.errors.StorageError` that ``exc`` is (or stands for: an
    ``OSError`` of a full disk or read-only file system raised outside the atomic writes), or
    None. Such a failure is not isolated: it stops the run, since every later write would fail
    the same way and even its log could not be written."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return storage_error(exc, exc.filename or "the run directory")
    return None


class FailureLog:
    """The failures of one run, in the order they happened."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.failures: list[UnitFailure] = []

    def record(self, stage: str, unit: str | None, exc: BaseException) -> UnitFailure:
        """Log ``exc`` and remember it."""
        failure = log_exception(self.root, stage, unit, exc)
        self.add(failure)
        return failure

    def add(self, failure: UnitFailure) -> None:
        """Remember a failure already logged elsewhere (e.g. a sub-run's, in its own logs)."""
        self.failures.append(failure)

    def of(self, stage: str) -> list[UnitFailure]:
        """The failures recorded for ``stage``."""
        return [f for f in self.failures if f.stage == stage]

    @contextlib.contextmanager
    def unit(self, stage: str, key: str) -> Iterator[None]:
        """Run one unit: an ``Exception`` is logged, recorded and suppressed (an interrupt is
        not, nor a full disk or read-only file system: :func:`fatal`)."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - isolation is the point; the log keeps the traceback
            stop = fatal(exc)
            if stop is not None:
                if stop is exc:
                    raise
                raise stop from exc
            self.record(stage, key, exc)


def failure_lines(failures: list[UnitFailure]) -> list[str]:
    """One line per failure, for the end of a run."""
    return [f.line() for f in failures]
