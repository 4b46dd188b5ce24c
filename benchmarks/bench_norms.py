"""Spectral norms of the powers ``B^k`` (k = 1 … 12) of deflated causal attention heads
(n = 128, three of each kind of ``_matrices.KINDS``): what the Kreiss upper bound and the
transient peak of every head read (docs/methods.md#a3).

:func:`~depthlens.linalg.transients.spectral_norm` takes a power iteration on the Gram
matrix with a Kato–Temple certificate (``O(n²)`` a step) where the matrix has a dominant
singular value, as attention powers do. The naive method, measured in the same run, is the
Gram matrix by ``syrk`` and a partial symmetric eigensolve (``O(n³)``), which the function
falls back to otherwise. Prints the time per norm of each, the ratio, how many norms the
certificate answered and the largest relative difference from LAPACK's SVD. About 10 s on
one core.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _matrices import heads  # noqa: E402

from depthlens.linalg.transients import _certified_top_eigenvalue, _gram_top_eigenvalue, spectral_norm  # noqa: E402

POWERS = 12


def powers(B: np.ndarray) -> list[np.ndarray]:
    """``B, B², …, B^POWERS``."""
    out = [B]
    for _ in range(POWERS - 1):
        out.append(B @ out[-1])
    return out


def naive(X: np.ndarray) -> float:
    """The eigensolve path of :func:`spectral_norm` alone."""
    s = float(np.max(np.abs(X)))
    return s * np.sqrt(max(_gram_top_eigenvalue(X / s), 0.0)) if s else 0.0


def timed(norm, matrices: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """Best of three: seconds per norm, and the values."""
    best, values = np.inf, np.empty(0)
    for _ in range(3):
        start = time.perf_counter()
        values = np.array([norm(X) for X in matrices])
        best = min(best, time.perf_counter() - start)
    return best / len(matrices), values


def main() -> None:
    matrices = [X for _, B in heads(128, 3, seed=11) for X in powers(B) if np.any(X)]
    t_fast, fast = timed(spectral_norm, matrices)
    t_naive, slow = timed(naive, matrices)
    ref = np.array([np.linalg.svd(X, compute_uv=False)[0] for X in matrices])
    certified = sum(_certified_top_eigenvalue(X / np.max(np.abs(X))) is not None for X in matrices)
    print(f"bench_norms: {len(matrices)} powers B^1..B^{POWERS} of deflated heads, n = 128")
    print(f"  certified power iteration: {1e6 * t_fast:8.1f} us per norm ({certified} of {len(matrices)} certified)")
    print(f"  syrk + eigensolve (naive): {1e6 * t_naive:8.1f} us per norm")
    print(f"  speed-up {t_naive / t_fast:5.1f}x; largest relative difference from the SVD: "
          f"{np.max(np.abs(fast - ref) / ref):.1e} (naive {np.max(np.abs(slow - ref) / ref):.1e})")


if __name__ == "__main__":
    main()
