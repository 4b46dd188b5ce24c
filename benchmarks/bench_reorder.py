"""Schur reordering: blocked moves (:mod:`depthlens.linalg.reorder`) vs LAPACK's unblocked ``trsen`` / ``trexc``.

On one n × n operator shaped like a sub-layer Jacobian (``I + G / (2 √n)``, eigenvalues
around 1 on both sides of the unit circle), from one complex Schur form: the
``outside_first`` selection (``ztrsen`` against :func:`~depthlens.linalg.reorder.select_leading`)
and the ``canonical`` sort (the ``trexc`` selection sort against
:func:`~depthlens.linalg.reorder.sort_diagonal`). Prints each time, the ratio, and the
agreement of the normal parts ``Q Λ Q*``. One BLAS thread, as the jacobian stage's workers run.

Run ``python benchmarks/bench_reorder.py [n ...]`` (default 256, 576, 1024 and 2048: the threshold
:data:`~depthlens.linalg.schur.BLOCKED_FROM`, SmolLM2's width and beyond; the 8B shape is
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


def _blocked(move: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
             ) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``move`` as :mod:`depthlens.linalg.schur` takes it from :data:`~depthlens.linalg.schur.BLOCKED_FROM` on."""
    def run(t: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        schur.BLOCKED_FROM = 0
        try:
            return move(t, q)
        finally:
            schur.BLOCKED_FROM = sys.maxsize

    return run


def main(sizes: list[int]) -> None:
    """Time both methods of both moves at each size and print ratios and agreement."""
    schur.BLOCKED_FROM = sys.maxsize  # LAPACK's unblocked routines, but where _blocked switches for one move
    rng = np.random.default_rng(0)
    print(f"bench_reorder: window {reorder.WINDOW}, {reorder.NB} eigenvalues per move, 1 BLAS thread")
    for n in sizes:
        M = np.eye(n) + 0.5 * rng.standard_normal((n, n)) / np.sqrt(n)
        t, q = scipy.linalg.schur(M, output="complex")
        outside = np.abs(np.diagonal(t)) > 1
        moves = {f"outside_first ({int(outside.sum())} of {n} lead)": lambda tt, qq: schur._leading(tt, qq, outside),
                 "canonical sort": schur._canonical_order}
        for name, move in moves.items():
            t_lapack, ref = _timed(move, t, q)
            t_blocked, got = _timed(_blocked(move), t, q)
            diff = np.linalg.norm(got - ref) / np.linalg.norm(ref)
            print(f"  n={n:5d} {name:34s}: LAPACK {t_lapack:7.2f} s, blocked {t_blocked:7.2f} s, "
                  f"{t_lapack / t_blocked:5.1f}x; normal parts differ by {diff:.1e} (relative Frobenius)")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [256, 576, 1024, 2048])
