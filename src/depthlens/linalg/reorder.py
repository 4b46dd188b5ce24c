"""Blocked reordering of triangular Schur forms: eigenvalue moves as matrix-matrix products.

LAPACK's ``trsen`` and ``trexc`` move one eigenvalue past one neighbour at a time and
apply each 2 × 2 rotation to whole rows and columns of ``T`` and ``Q``: O(n) memory-bound
work per swap, O(n³) in all for a selection or a sort, at a few GFLOP/s. Here the same
swaps are grouped (Kressner, "Block algorithms for reordering standard and generalized Schur
forms", ACM TOMS 32, 2006): up to ``nb`` eigenvalues move together inside a diagonal window
of ``window`` entries with LAPACK ``trsen`` on the window alone, whose unitary ``Z`` then
updates the rest of ``T`` and ``Q`` by three matrix products. The work is the same order
and runs at matrix-multiply speed.

Exactness
    Every step is a unitary similarity computed by LAPACK and applied by BLAS, so the result
    is a Schur form of the input to the backward error of ``trsen`` (about ``n ε ‖T‖``;
    :func:`select_leading` and :func:`sort_diagonal` keep ``Q T Q*`` equal to the input's
    within that). Where the eigenvalues of the groups that swap are distinct, the ordered
    Schur form is unique up to unimodular column scalings, so ``Q Λ Q*`` is that of the
    unblocked reordering to within rounding amplified by the separation of the groups.
    Where equal eigenvalues exist, equal ones never swap with each other (both routines keep
    relative orders within a group), but the form reached is one of the valid forms of the
    order and can differ from the unblocked one.

Input: an upper-triangular ``t`` (complex, or real with real eigenvalues) and a unitary
``q``, both Fortran-ordered and owned by the caller; both are updated in place.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg.lapack

from ..errors import InputError

__all__ = ["NB", "WINDOW", "select_leading", "sort_diagonal"]

#: Diagonal entries a window holds; each step moves up to :data:`NB` eigenvalues by
#: ``WINDOW − NB`` positions (chosen by ``benchmarks/bench_reorder.py`` at n = 4096).
WINDOW = 128
#: Eigenvalues moved together.
NB = 64


def _trsen(block: np.ndarray, select: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``block`` reordered so that ``select`` leads (LAPACK ``trsen``), and the unitary ``Z`` it used."""
    eye = np.eye(len(block), dtype=block.dtype, order="F")
    if block.dtype.kind == "c":
        ts, z, *_, info = scipy.linalg.lapack.ztrsen(select.astype(np.int32), block, eye, job="N")
    else:
        ts, z, *_, info = scipy.linalg.lapack.dtrsen(select.astype(np.int32), block, eye, job="N")
    if info != 0:  # pragma: no cover - trsen fails only on invalid arguments (or 2×2 blocks, absent here)
        raise InputError(f"reordering the Schur form failed (LAPACK trsen info={info}).")
    return ts, z


def _apply(t: np.ndarray, q: np.ndarray, start: int, end: int, ts: np.ndarray, z: np.ndarray) -> None:
    """Put the reordered window ``ts`` at ``[start, end)`` and apply its ``Z`` to the rest of ``t`` and to ``q``."""
    t[start:end, start:end] = ts
    if end < len(t):
        t[start:end, end:] = z.conj().T @ t[start:end, end:]
    if start > 0:
        t[:start, start:end] = t[:start, start:end] @ z
    q[:, start:end] = q[:, start:end] @ z


def select_leading(t: np.ndarray, q: np.ndarray, select: np.ndarray, lo: int = 0, hi: int | None = None, *,
                   window: int = WINDOW, nb: int = NB) -> None:
    """Move the ``select``-ed diagonal entries of ``t[lo:hi, lo:hi]`` to the front of that range, in place.

    Each group (selected, not selected) keeps its relative order, as LAPACK ``trsen`` does;
    ``t`` stays upper triangular and ``q`` accumulates the unitary similarity (``q t q*`` is
    unchanged to about ``n ε ‖t‖``).

    Parameters
    ----------
    t, q : numpy.ndarray, shape (n, n)
        Upper-triangular Schur factor and its unitary basis (Fortran order), updated in place.
    select : numpy.ndarray of bool, shape (n,) or (hi − lo,)
        The entries to lead (the whole diagonal, or the range only).
    lo, hi : int
        The range of the diagonal that is reordered (default: all of it).
    window, nb : int
        Window size and number of eigenvalues moved together (``1 <= nb < window``).
    """
    n = len(t)
    hi = n if hi is None else hi
    if not 1 <= nb < window:
        raise InputError(f"nb={nb} and window={window}: pass 1 <= nb < window.")
    sel = np.array(select[lo:hi] if len(select) == n else select, dtype=bool)
    top = 0  # entries [0, top) of the range are selected and in place
    while True:
        pending = np.flatnonzero(sel[top:]) + top
        in_place = np.flatnonzero(pending != top + np.arange(len(pending)))
        top += len(pending) if len(in_place) == 0 else int(in_place[0])
        pending = pending[pending >= top]
        if len(pending) == 0:
            return
        chunk = pending[pending < pending[0] + window // 2][:nb]
        end = int(chunk[-1]) + 1
        while True:
            start = max(top, end - window)
            local = sel[start:end].copy()
            ts, z = _trsen(np.asfortranarray(t[lo + start:lo + end, lo + start:lo + end]), local)
            _apply(t, q, lo + start, lo + end, ts, z)
            count = int(local.sum())
            sel[start:end] = np.arange(end - start) < count
            if start == top:
                top += count
                break
            end = start + count


def sort_diagonal(t: np.ndarray, q: np.ndarray, rank: np.ndarray, *, window: int = WINDOW, nb: int = NB) -> None:
    """Reorder the Schur form so that its diagonal follows ``rank`` (smallest first), in place.

    A recursive stable partition: the entries of the lower half of the ranks lead
    (:func:`select_leading`), then each half is sorted the same way. Entries of equal rank
    keep their relative order; with ranks from a stable sort of the diagonal this gives the
    order a selection sort with ``trexc`` gives, in O(n³) matrix-product work.

    Parameters
    ----------
    t, q : numpy.ndarray, shape (n, n)
        As :func:`select_leading`.
    rank : numpy.ndarray of int, shape (n,)
        The target position (or any key to sort by) of each current diagonal entry.
    window, nb : int
        As :func:`select_leading`.
    """
    stack = [(0, len(t), np.asarray(rank).copy())]
    while stack:
        lo, hi, keys = stack.pop()
        if hi - lo < 2 or np.all(keys[:-1] <= keys[1:]):
            continue
        split = np.sort(keys, kind="stable")[(hi - lo) // 2]
        first = keys < split
        if not first.any():  # the lower half ties with the median: lead with the median's ties
            first = keys <= split
        select_leading(t, q, first, lo, hi, window=window, nb=nb)
        k = int(first.sum())
        stack.append((lo, lo + k, keys[first]))
        stack.append((lo + k, hi, keys[~first]))
