"""One head's operators, whole: the attention matrix ``A``, its Perron deflation ``B = A − P``,
the spectrum, the ε-pseudospectrum on the report's grid and the transient ``‖B^k‖`` with its
peak and the Kreiss constant (§A1–A3), for one (layer, head, chunk).

Model-free, like the rest of the analysis: a float64 matrix in, records out. Two callers:

* :meth:`depthlens.api.Run.head` recomputes one head of a run on demand and returns the
  :class:`HeadView` of :func:`head_view`;
* the attention stage saves, for every head's median chunk, the coarse grid and sampled
  transient of :func:`explorer_arrays` to ``arrays/head_spectra.safetensors``, which the
  report's head explorer draws.

Every number goes through the functions the stage uses (:func:`~depthlens.attention.features.matrix_features`,
:func:`~depthlens.linalg.pseudospectra.pseudospectrum`, :func:`~depthlens.linalg.transients.power_norms`),
so a view of a run's head and chunk has the run's table values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DecompositionError, InputError
from ..linalg.causal import check_causal_stochastic, deflate
from ..linalg.pseudospectra import SigmaGrid, pseudospectrum
from ..linalg.transients import power_norms, power_norms_at
from . import features
from .options import AttentionOptions

__all__ = ["EXPLORER_ARRAYS", "EXPLORER_GRID", "EXPLORER_POWERS", "HeadView", "PSEUDO_GRID", "PSEUDO_TOL",
           "explorer_arrays", "head_view"]

#: Grid axis of the saved pseudospectra (the square [−1.5, 1.5]², 121 points a side).
PSEUDO_GRID = np.linspace(-1.5, 1.5, 121)
#: Relative tolerance of σ_min on that grid: contours need far less than the default 1e-14,
#: and clustered singular values of routing heads made 1e-14 fall back to dense SVDs.
PSEUDO_TOL = 1e-9
#: Grid axis of the head explorer: every third point of :data:`PSEUDO_GRID` (41 a side, step
#: 0.075): about 0.08 CPU-seconds per head at n = 128, and the report's data stays small.
EXPLORER_GRID = PSEUDO_GRID[::3].copy()
#: Powers ``k`` of the explorer's transient ``‖B^k‖``: every ``k`` up to 16, then steps of
#: ``2^{1/4}`` up to 128 (28 powers; 128 products per head and 28 eigensolves, about 0.05 s at
#: n = 128; past every transient peak of SmolLM2-135M, whose largest per-chunk ``peak_k`` is 104).
EXPLORER_POWERS = np.unique(np.concatenate([np.arange(1, 17), np.round(2.0 ** np.linspace(4, 7, 13))])).astype(np.int64)
#: The array file of the explorer's data (``arrays/head_spectra.safetensors``).
EXPLORER_ARRAYS = "head_spectra"


@dataclass(frozen=True, eq=False)
class HeadView:
    """One (layer, head, chunk) of a run, recomputed in float64.

    Attributes
    ----------
    layer, head, chunk : int
        Which head (0-based layer and head) and which text chunk.
    A : ndarray, shape (n, n)
        The attention matrix (float64 from the pre-softmax scores): causal, row-stochastic.
    B : ndarray, shape (n, n)
        The Perron deflation ``A − P`` (``P = 1 e_1ᵀ``).
    eigenvalues : ndarray, shape (n,)
        The eigenvalues of ``B``, exactly its diagonal: ``0, A_22, …, A_nn``.
    pseudospectrum : SigmaGrid
        ``σ_min(zI − B)`` on the grid of the report's pseudospectra figure (``x = y =``
        :data:`PSEUDO_GRID`, relative tolerance :data:`PSEUDO_TOL`); ``Λ_ε(B)`` is where it is
        ``≤ ε``.
    powers : ndarray of int, shape (kmax + 1,)
        ``0, 1, …, kmax``.
    transient : ndarray, shape (kmax + 1,)
        ``‖B^k‖₂`` for those powers (exact up to rounding, :func:`~depthlens.linalg.transients.power_norms`).
    values : dict
        Every per-matrix quantity of §A3 (the ``head_chunks`` columns of
        :func:`~depthlens.attention.features.matrix_features`, with the ε-pseudospectral radii
        and the certified Kreiss bracket ``kreiss_B_lo``/``kreiss_B_hi``).
    chunk_row : dict or None
        The run's ``head_chunks`` row of this head and chunk (trained model), None when the
        run has none.
    head_row : dict or None
        The run's ``heads`` row of this head (aggregated over chunks), None when absent.
    """

    layer: int
    head: int
    chunk: int
    A: np.ndarray = field(repr=False)
    B: np.ndarray = field(repr=False)
    eigenvalues: np.ndarray = field(repr=False)
    pseudospectrum: SigmaGrid = field(repr=False)
    powers: np.ndarray = field(repr=False)
    transient: np.ndarray = field(repr=False)
    values: dict[str, float] = field(repr=False)
    chunk_row: dict[str, Any] | None = field(default=None, repr=False)
    head_row: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        """Tokens in the chunk (the matrices are n × n)."""
        return int(self.A.shape[0])

    @property
    def kreiss_B(self) -> float:
        """``K(B)``: the value of the global search (a point evaluated, so a lower bound)."""
        return self.values["kreiss_B"]

    @property
    def kreiss_B_upper(self) -> float:
        """The rigorous power-norm upper bound on ``K(B)`` (``inf`` when not finite)."""
        return self.values["kreiss_B_upper"]

    @property
    def kreiss_B_lo(self) -> float:
        """Lower end of the certified bracket of ``K(B)``."""
        return self.values["kreiss_B_lo"]

    @property
    def kreiss_B_hi(self) -> float:
        """Upper end of the certified bracket of ``K(B)``."""
        return self.values["kreiss_B_hi"]

    @property
    def kreiss_B_certified(self) -> bool:
        """Whether the bracket met the run's ``rtol`` (or ``K = ∞`` is certain)."""
        return bool(self.values["kreiss_B_certified"])

    @property
    def TR1(self) -> float:
        """Transient reserve ``log K(B)``."""
        return self.values["TR1"]

    @property
    def peak_B(self) -> float:
        """``G(B) = max_{k≥1} ‖B^k‖`` (certified when ``peak_certified``)."""
        return self.values["peak_B"]

    @property
    def peak_k(self) -> int:
        """The smallest ``k ≥ 1`` attaining :attr:`peak_B`."""
        return int(self.values["peak_k"])

    @property
    def peak_certified(self) -> bool:
        """Whether :attr:`peak_B` is the supremum over every power (not just those scanned)."""
        return bool(self.values["peak_certified"])

    def __repr__(self) -> str:
        return (f"HeadView(layer={self.layer}, head={self.head}, chunk={self.chunk}, n={self.n}, "
                f"kreiss_B={self.kreiss_B:.6g}, peak_B={self.peak_B:.6g}, peak_k={self.peak_k})")


def default_kmax(n: int, peak_k: float) -> int:
    """The powers a view's transient covers by default: ``max(n, 2·peak_k)`` (past the peak and,
    for a previous-token head, to the nilpotent end), at most the scan cap ``20n + 100`` of
    :func:`~depthlens.linalg.transients.peak_transient`."""
    cap = 20 * n + 100
    k = int(peak_k) if math.isfinite(peak_k) and peak_k > 0 else 1
    return min(max(n, 2 * k), cap)


def head_view(
    A: np.ndarray,
    opts: AttentionOptions,
    *,
    layer: int,
    head: int,
    chunk: int,
    kmax: int | None = None,
    rows: np.ndarray | None = None,
    chunk_row: Mapping[str, Any] | None = None,
    head_row: Mapping[str, Any] | None = None,
) -> HeadView:
    """The :class:`HeadView` of one attention matrix ``A``.

    Parameters
    ----------
    A : ndarray, shape (n, n)
        Causal row-stochastic attention matrix, float64.
    opts : AttentionOptions
        The run's attention options (``rtol`` and ``certify_evals`` of the Kreiss bracket).
    layer, head, chunk : int
        Where ``A`` comes from (recorded in the view).
    kmax : int, optional
        Last power of the transient; default :func:`default_kmax`.
    rows : ndarray of bool, shape (n,), optional
        A prompt's analysed rows, as the stage passes them to
        :func:`~depthlens.attention.features.matrix_features` (default: every row).
    chunk_row, head_row : mapping, optional
        The run's table rows, kept in the view.

    Returns
    -------
    HeadView

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic, or ``kmax < 1``.
    DecompositionError
        When no driver of :mod:`depthlens.linalg.guarded` handles the matrix.

    Notes
    -----
    Cost: the A3 quantities with a certified Kreiss bracket (a few thousand ``O(n²)``
    ``σ_min`` evaluations), 14 641 grid points of ``O(n²)`` each, and ``kmax`` products and
    eigensolves of ``O(n³)``: about a second at n = 128.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.tril(np.ones((4, 4))); A /= A.sum(axis=1, keepdims=True)
    >>> v = head_view(A, AttentionOptions(), layer=0, head=0, chunk=0)
    >>> v.eigenvalues.round(3).tolist(), v.transient[:2].round(3).tolist()
    ([0.0, 0.5, 0.333, 0.25], [1.0, 1.33])
    """
    A = check_causal_stochastic(A)
    if A.ndim != 2:
        raise InputError(f"A has shape {A.shape}; pass one (n, n) attention matrix.")
    select = {} if rows is None else {"rows": rows}  # as the stage's heads phase: a prompt's analysed rows
    values = features.matrix_features(A, extras=True, certify=(opts.rtol, opts.certify_evals), **select)
    B = deflate(A)
    n = A.shape[0]
    kmax = default_kmax(n, values["peak_k"]) if kmax is None else int(kmax)
    if kmax < 1:
        raise InputError(f"kmax={kmax} is out of range; pass kmax >= 1 (or None for max(n, 2·peak_k)).")
    return HeadView(
        layer=int(layer), head=int(head), chunk=int(chunk), A=A, B=B, eigenvalues=np.diagonal(B).copy(),
        pseudospectrum=pseudospectrum(B, PSEUDO_GRID, PSEUDO_GRID, tol=PSEUDO_TOL),
        powers=np.arange(kmax + 1), transient=power_norms(B, kmax), values=values,
        chunk_row=None if chunk_row is None else dict(chunk_row),
        head_row=None if head_row is None else dict(head_row),
    )


def explorer_arrays(A: np.ndarray) -> dict[str, np.ndarray] | None:
    """The head explorer's data of one attention matrix ``A`` (a head's median chunk):
    ``sigma`` = ``σ_min(zI − B)`` on :data:`EXPLORER_GRID`² (rows the imaginary axis, to
    :data:`PSEUDO_TOL` relative), ``transient`` = ``‖B^k‖`` exactly at :data:`EXPLORER_POWERS`
    (:func:`~depthlens.linalg.transients.power_norms_at`) and ``eig`` = the diagonal of ``B``
    (its eigenvalues), all float64; None when no decomposition driver handles the matrix.

    Raises
    ------
    InputError
        If ``A`` is not causal row-stochastic.
    """
    B = deflate(A)
    try:
        sigma = pseudospectrum(B, EXPLORER_GRID, EXPLORER_GRID, tol=PSEUDO_TOL).sigma
        transient = power_norms_at(B, EXPLORER_POWERS)
    except DecompositionError:
        return None
    return {"sigma": sigma, "transient": transient, "eig": np.diagonal(B).copy()}
