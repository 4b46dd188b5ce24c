"""Compile the numba kernels into their on-disk cache ahead of the first run (``make install``
runs ``python -m depthlens.precompile``).

The kernels of :mod:`depthlens.linalg._kernels` and :mod:`depthlens.linalg._brent` are
``@njit(cache=True)``: numba compiles each signature on its first call and keeps the machine
code beside the sources (or under ``NUMBA_CACHE_DIR``), keyed by the source file and the CPU.
Without a cache, the first run compiles them in every worker process at once (about 12 s of
each worker on two cores). :func:`precompile` makes every call the stages make on a small
synthetic attention matrix (:func:`~depthlens.linalg.causal.random_causal_attention`): the
per-matrix features with their extras, the matched-null reserves and the certified Kreiss
bracket (:func:`~depthlens.attention.analysis.head_chunk_row`), so each signature the stages
use is compiled once, here. Nothing it computes is kept.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .linalg.causal import random_causal_attention

__all__ = ["precompile"]


def precompile(n: int = 12) -> float:
    """Run the attention analysis of one random causal ``n × n`` matrix with every option the
    stages use (so numba compiles, or loads from its cache, every kernel signature they call)
    and return the seconds it took."""
    from .attention.analysis import head_chunk_row
    from .attention.options import AttentionOptions

    start = time.perf_counter()
    opts = AttentionOptions()
    A = random_causal_attention(n, np.random.default_rng(0))
    head_chunk_row(A, 0, 0, 0, opts, nulls=True, extras=True, certify=True)
    return time.perf_counter() - start


def main() -> int:
    """Compile, and say how long it took."""
    print(f"depthlens: numba kernels compiled into their cache in {precompile():.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
