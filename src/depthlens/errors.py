"""The one error family of depthlens.

Every error the toolkit raises on bad input is a :class:`DepthlensError` whose message is a
single line saying what is wrong and what to do about it. The command line prints that line
without a traceback and exits with status 2.
"""

from __future__ import annotations

import errno

import numpy as np


class DepthlensError(Exception):
    """Base class: a one-line, actionable message about bad input or an impossible request."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class InputError(DepthlensError, ValueError):
    """An array, parameter or option is not acceptable (shape, dtype, range, structure)."""


def one_line(exc: BaseException, limit: int | None = 300) -> str:
    """``Type: message`` of an exception on one line (whitespace collapsed), cut to ``limit``
    characters with ``...`` (None: whole): how terminal lines and failure records show it."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def require_at_least(flag: str, value: int, minimum: int, stage: str) -> None:
    """Refuse a size below a stage's minimum, naming the flag.

    Raises
    ------
    InputError
        ``"--seq-len 1 is too short for the attention stage; pass --seq-len 2 or more."``
    """
    if value < minimum:
        raise InputError(f"{flag} {value} is too short for the {stage} stage; pass {flag} {minimum} or more.")


class ModelError(DepthlensError):
    """A model spec cannot be resolved, loaded or analysed."""


class DataError(DepthlensError):
    """A text source is missing, empty or too short for the request."""


class RunError(DepthlensError):
    """A run directory cannot be created, resumed or written."""


class StorageError(RunError):
    """The run directory cannot be written: the disk is full (``ENOSPC``, ``EDQUOT``), the file
    system is read-only (``EROFS``) or permission is denied (``EACCES``, ``EPERM``).

    Raised by every write into a run (:mod:`depthlens.runs.atomic`); unlike other failures it
    is not isolated to its unit or stage but stops the run at once, since every later write
    would fail the same way. Finished units stay, so ``--resume`` continues once the cause is
    fixed.

    Attributes
    ----------
    reason : str
        ``"no space"``, ``"read-only file system"`` or ``"permission denied"``.
    path : str
        The file or folder that could not be written.
    """

    def __init__(self, message: str, reason: str = "", path: object = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.path = str(path)


#: errno -> reason of a :class:`StorageError`.
STORAGE_ERRNOS = {errno.ENOSPC: "no space", errno.EDQUOT: "no space", errno.EROFS: "read-only file system",
                  errno.EACCES: "permission denied", errno.EPERM: "permission denied"}


def storage_error(exc: OSError, path: object) -> StorageError | None:
    """The :class:`StorageError` of an ``OSError`` raised while writing ``path`` into a run
    directory, or None when ``exc`` is another kind of failure."""
    reason = STORAGE_ERRNOS.get(getattr(exc, "errno", None))
    if reason is None:
        return None
    advice = ("free some space, then rerun with --resume (or pass another --out)" if reason == "no space"
              else "make it writable, then rerun with --resume (or pass another --out)")
    return StorageError(f"cannot write {path}: {reason} ({exc.strerror or exc}); {advice}.", reason, path)


class DecompositionError(DepthlensError, np.linalg.LinAlgError):
    """A dense decomposition failed with every driver of :mod:`depthlens.linalg.guarded`, or
    its input was not finite. Stages record the affected quantities as NaN with this reason."""


class RunIncomplete(DepthlensError):
    """A run finished with failed units or stages (each logged in the run's ``logs/``).

    Attributes
    ----------
    root : Path
        The run directory.
    failures : list of depthlens.runs.failures.UnitFailure
        What failed, in order; ``failure.line()`` is the one-line summary of each.
    """

    def __init__(self, root: object, failures: list) -> None:
        super().__init__(f"{len(failures)} unit(s) or stage(s) of the run in {root} failed; see its logs/ folder.")
        self.root = root
        self.failures = failures
