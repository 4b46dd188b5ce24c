"""The ledger of LAPACK drivers behind every guarded decomposition (:mod:`depthlens.linalg.guarded`).

Counts are kept per process under keys ``"decomposition:driver"`` (``"svd:gesdd"``); worker
processes send theirs back with each task (:mod:`depthlens.executors.local`), and run directories
store the counts of every finished unit and stage. This module imports nothing heavy, so
the report can read and sum counts without loading the numerical core.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

__all__ = ["PRIMARY", "count_difference", "driver_counts", "fallback_count", "merge_counts", "record"]

_COUNTS: Counter[str] = Counter()
_LOCK = threading.Lock()

#: The default (first) driver of each decomposition; any other driver is a fallback.
PRIMARY: dict[str, str] = {"svd": "gesdd", "eigvals": "geev", "eigh": "heevd", "eigh_subset": "heevr", "schur": "gees",
                           "solve": "gesv", "svd_torch": "torch"}


def driver_counts() -> dict[str, int]:
    """How many results each ``decomposition:driver`` pair has produced in this process.

    Results computed in worker processes of :func:`depthlens.executors.local.executor` are merged
    in when their task returns. Keys look like ``"svd:gesdd"``; take differences of two
    snapshots to count a stretch of work.
    """
    with _LOCK:
        return dict(_COUNTS)


def merge_counts(counts: Mapping[str, int]) -> None:
    """Add counts (from another process's :func:`driver_counts` difference) to this process's."""
    with _LOCK:
        _COUNTS.update({k: int(v) for k, v in counts.items() if v})


def count_difference(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    """``after − before`` of two :func:`driver_counts` snapshots, zero entries dropped."""
    return {k: int(v) - int(before.get(k, 0)) for k, v in sorted(after.items()) if int(v) != int(before.get(k, 0))}


def fallback_count(counts: Mapping[str, int]) -> int:
    """Number of results in ``counts`` that came from a driver other than the default."""
    return sum(int(v) for k, v in counts.items() if k.split(":", 1)[1] != PRIMARY.get(k.split(":", 1)[0]))


def record(name: str, driver: str | None, n: int = 1) -> None:
    """Count ``n`` results of decomposition ``name`` produced by ``driver`` (None: the default)."""
    driver = PRIMARY[name] if driver is None else driver
    with _LOCK:
        _COUNTS[f"{name}:{driver}"] += n
