"""The one error family of depthlens.

Every error the toolkit raises on bad input is a :class:`DepthlensError` whose message is a
single line saying what is wrong and what to do about it. The command line prints that line
without a traceback and exits with status 2.
"""

from __future__ import annotations

import numpy as np


class DepthlensError(Exception):
    """Base class: a one-line, actionable message about bad input or an impossible request."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class InputError(DepthlensError, ValueError):
    """An array, parameter or option is not acceptable (shape, dtype, range, structure)."""


class ModelError(DepthlensError):
    """A model spec cannot be resolved, loaded or analysed."""


class DataError(DepthlensError):
    """A text source is missing, empty or too short for the request."""


class RunError(DepthlensError):
    """A run directory cannot be created, resumed or written."""


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
