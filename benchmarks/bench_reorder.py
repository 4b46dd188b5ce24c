"""Schur reordering: blocked moves (:mod:`depthlens.linalg.reorder`) vs LAPACK's unblocked ``trsen`` / ``trexc``.

On one n × n operator shaped like a sub-layer Jacobian (``I + G / (2 √n)``, eigenvalues
around 1 on both sides of the unit circle), from one complex Schur form: the
``outside_first`` selection (``ztrsen`` against :func:`~depthlens.linalg.reorder.select_leading`)
and the ``canonical`` sort (the ``trexc`` selection sort against
:func:`~depthlens.linalg.reorder.sort_diagonal`). Prints each time, the ratio, and the
agreement of the normal parts ``Q Λ Q*``. One BLAS thread, as the jacobian stage's workers run.

Run ``python benchmarks/bench_reorder.py [n ...]`` (default 1024 and 2048; the 8B shape is
4096, where the unblocked moves take minutes).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402

from depthlens.linalg import reorder, schur  # noqa: E402


def _timed(move: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]], t: np.ndarray,
           q: np.ndarray) -> tuple[float, np.ndarray]:
    """Seconds of one reordering of copies of ``(t, q)``, and the normal part it gives."""
    tt, qq = np.array(t, order="F"), np.array(q, order="F")
    start = time.perf_counter()
    tt, qq = move(tt, qq)
    seconds = time.perf_counter() - start
    return seconds, (qq * np.diagonal(tt)) @ qq.conj().T


def _blocked_sort(t: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lam = np.diagonal(t)
    order = np.lexsort((-lam.real, -lam.imag, -np.round(np.abs(lam) / np.abs(lam).max(), 10)))
    rank = np.empty(len(t), dtype=np.int64)
    rank[order] = np.arange(len(t))
    reorder.sort_diagonal(t, q, rank)
    return t, q


def main(sizes: list[int]) -> None:
    """Time both methods of both moves at each size and print ratios and agreement."""
    schur.BLOCKED_FROM = sys.maxsize  # the module's own functions stay on LAPACK's unblocked routines here
    rng = np.random.default_rng(0)
    print(f"bench_reorder: window {reorder.WINDOW}, {reorder.NB} eigenvalues per move, 1 BLAS thread")
    for n in sizes:
        M = np.eye(n) + 0.5 * rng.standard_normal((n, n)) / np.sqrt(n)
        t, q = scipy.linalg.schur(M, output="complex")
        outside = np.abs(np.diagonal(t)) > 1
        moves = {
            f"outside_first ({int(outside.sum())} of {n} lead)": (
                lambda tt, qq: schur._leading(tt, qq, outside),
                lambda tt, qq: (reorder.select_leading(tt, qq, outside), (tt, qq))[1]),
            "canonical sort": (schur._canonical_order, _blocked_sort),
        }
        for name, (unblocked, blocked) in moves.items():
            t_lapack, ref = _timed(unblocked, t, q)
            t_blocked, got = _timed(blocked, t, q)
            diff = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            print(f"  n={n:5d} {name:34s}: LAPACK {t_lapack:7.2f} s, blocked {t_blocked:7.2f} s, "
                  f"{t_lapack / t_blocked:5.1f}x; normal parts differ by {diff:.1e} (relative Frobenius)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1024, 2048])
