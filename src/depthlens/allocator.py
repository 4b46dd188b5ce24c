"""The C allocator's policy for a depthlens process: freed memory is kept for reuse.

glibc's ``malloc`` serves a request above its mmap threshold (at most 32 MiB) with a fresh
mapping and unmaps it on ``free``; memory freed at the top of the heap beyond the trim threshold
goes back to the kernel as well. Either way the next array of that size faults every 4 KiB page
in again, zeroed by the kernel. The analyses allocate and drop arrays of tens to hundreds of MB
thousands of times (per-chunk Jacobian stacks, bootstrap blocks, attention matrices, logits),
so without a policy a run spends much of its system time faulting pages in. With
:func:`keep_freed_memory` every block comes from the heap and stays there once freed (what it
saves: benchmarks/RESULTS.md, section ``bench_hugepages``).

The cost is that memory freed late in a run is not given back to the system before the process
ends; the peak, which is what a machine must hold, does not change. Numbers do not change either:
this decides where arrays live, not what is computed. Blocks that a thread other than the main
one asks for beyond glibc's per-thread heap size (64 MiB) are still mapped: glibc has no other
place for them.

The console script applies the policy to its own process, and the local executor's worker
processes apply it whoever started them. A Python session that imports depthlens keeps its own
policy unless it calls :func:`keep_freed_memory` (a notebook may prefer memory given back).
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["M_MMAP_MAX", "M_TRIM_THRESHOLD", "keep_freed_memory"]

#: ``mallopt`` parameter numbers of glibc (``malloc.h``).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: The trim threshold set: the largest C ``int``, so the heap's free top is never trimmed.
_NEVER = 2**31 - 1


def keep_freed_memory() -> bool:
    """Have glibc's ``malloc`` serve every block from the heap and keep what is freed.

    Sets ``M_MMAP_MAX = 0`` (no block gets a mapping of its own) and ``M_TRIM_THRESHOLD`` to
    the largest C ``int`` (the heap is not shrunk), the same as starting the process with
    ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647``; blocks already allocated are not
    moved.

    Returns
    -------
    bool
        True when both settings were accepted; False, changing nothing, where the C library
        has no ``mallopt`` or refuses them (macOS, Windows, musl).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, _NEVER))
