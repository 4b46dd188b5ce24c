"""Per-operator spectral metrics of sub-layer Jacobians ``J = I + U`` (§B2).

Every metric of one operator comes from two decompositions, each computed once:

- the real Schur form of the update ``U = J − I`` (no Schur vectors): the eigenvalues ``μ``
  of U, the eigenvalues ``λ = 1 + μ`` of J, and the non-normal part N of the complex Schur
  form, which J and U share (``J = Q(I + Λ_U + N)Q*``), so one ``‖N‖_F`` gives both Henrici
  departures (:func:`~depthlens.linalg.normality.schur_departure`, read off the real form);
- the SVD of J: ``cond``, ``expand_sv`` and the effective ranks from its singular values;
  the self-alignment for every k from its singular vectors, computed only when it is asked for
  (``self_alignment``: an SVD with vectors takes about 2.4 times one without at d = 576).

U is decomposed rather than J because its eigenvalues then carry absolute errors of about
``n ε ‖U‖`` instead of ``n ε ‖J‖`` (``rot_angle_mean`` reads the phases of ``μ``, which may
be small when J is close to the identity); the eigenvalues of J lose nothing by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from tqdm.auto import tqdm

from ..errors import DecompositionError, InputError
from ..linalg import guarded
from ..linalg._checks import as_square
from ..linalg.normality import complex_fraction, expansion_fraction, rotation_angle_mean, schur_departure, symmetry_index
from ..linalg.ranks import erank, erank_sigma, participation_ratio, self_alignment_svd, stable_rank
from ..linalg.schur import STRUCTURAL_TOL
from ..executors.local import InlineExecutor, submitted

__all__ = ["METRICS", "SELF_ALIGN_K", "TRIVIAL_TOL", "OperatorSpectra", "metrics_and_eigenvalues", "metrics_table", "operator_metrics", "spectra"]

#: Operators submitted and unfinished at once, at most: enough to keep the workers of a large
#: machine busy, while operators read from memory maps (134 MB each at d = 4096) stay on disk.
PENDING = 16

SELF_ALIGN_K: tuple[int, ...] = (1, 8, 64)
"""Subspace sizes of the ``self_align_k`` columns (capped at d)."""

METRICS: tuple[str, ...] = (
    "cond",
    "henrici_rel",
    "henrici_update_rel",
    "symmetry",
    "symmetry_update",
    "complex_frac",
    "complex_frac_nontrivial",
    "rot_angle_mean",
    "expand_eig",
    "expand_sv",
    "spectral_radius",
    *(f"self_align_{k}" for k in SELF_ALIGN_K),
    "erank",
    "erank_sigma",
    "participation_ratio",
    "stable_rank",
)
"""The metric columns of :func:`metrics_table`, in order (names as in §B2)."""

TRIVIAL_TOL = STRUCTURAL_TOL
"""An eigenvalue λ = 1 + μ of J is structurally 1 (trivial) when ``|μ| ≤ TRIVIAL_TOL ·
max(1, max|λ|)``: the exact eigenvalue 1 of a rank-deficient update (the isolated attention
update has rank ≤ n_kv·head_dim) is computed at ``|μ|`` of about ``n ε ‖U‖`` (1e-14 to
1e-12 for float64 mean Jacobians), far below; an operator carrying larger errors (e.g. a mean
of float32 Jacobians, about 1e-7) keeps such noise eigenvalues above it."""


@dataclass(frozen=True)
class OperatorSpectra:
    """Spectra of one operator ``J = I + U``, kept for plots and tables.

    Attributes
    ----------
    eigenvalues : ndarray, shape (d,), complex128
        Eigenvalues ``λ`` of J, by descending modulus (to 10 significant digits of the
        largest), then descending imaginary part.
    update_eigenvalues : ndarray, shape (d,), complex128
        Eigenvalues ``μ = λ − 1`` of U in the same order, as computed from U (accurate to
        about ``n ε ‖U‖``, which ``λ − 1`` would not be).
    singular_values : ndarray, shape (d,), float64
        Singular values of J, descending.
    """

    eigenvalues: np.ndarray
    update_eigenvalues: np.ndarray
    singular_values: np.ndarray


def _operator(J: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(J, U = J − I)``."""
    arr = as_square(J, "J")
    return arr, arr - np.eye(arr.shape[0])


def _ordered(mu: np.ndarray) -> np.ndarray:
    """``mu`` by descending ``|λ|`` (``λ = 1 + μ``), then descending ``Im λ``. Moduli are
    compared to 10 significant digits of the largest, so the two members of a conjugate pair,
    whose computed moduli differ in the last bits, tie and come positive part first, on
    every machine (unrounded, thread counts and BLAS kernels flipped some pairs)."""
    lam = 1.0 + mu
    modulus = np.abs(lam)
    top = float(modulus.max()) if modulus.size else 0.0
    key = np.round(modulus / top, 10) if top > 0 else modulus
    return mu[np.lexsort((-lam.imag, -key))]


def spectra(J: ArrayLike) -> OperatorSpectra:
    """Eigenvalues (of J and of U = J − I) and singular values of one operator.

    Parameters
    ----------
    J : array_like, shape (d, d)
        A finite real or complex square operator.

    Returns
    -------
    OperatorSpectra
        Backward stable: eigenvalues from the Schur form of U (errors about ``n ε ‖U‖``),
        singular values from LAPACK ``gesdd`` (errors about ``n ε ‖J‖``).

    Raises
    ------
    InputError
        If ``J`` is not a finite square matrix.

    Notes
    -----
    Cost: one Schur decomposition (without Schur vectors) and one SVD without vectors, O(d³).
    """
    arr, U = _operator(J)
    mu = _ordered(guarded.schur_values(U)[1])
    return OperatorSpectra(eigenvalues=1.0 + mu, update_eigenvalues=mu, singular_values=guarded.svdvals(arr))


def _relative(value: float, norm: float) -> float:
    """``value / norm`` with 0 for the zero matrix (normal), as ``henrici(relative=True)``."""
    return value / norm if norm > 0 else 0.0


def operator_metrics(J: ArrayLike, self_alignment: bool = True) -> dict[str, float]:
    """Every §B2 metric of one operator ``J = I + U``.

    Parameters
    ----------
    J : array_like, shape (d, d)
        A finite real or complex square operator (a sub-layer Jacobian, skip connection
        included).
    self_alignment : bool
        Compute ``self_align_k`` (the SVD with singular vectors); False leaves them NaN and
        takes the singular values alone (the other metrics agree to rounding, about ``n ε``
        relative).

    Returns
    -------
    dict of str to float
        Keys :data:`METRICS`, all Python floats (float64):

        - ``cond`` = σ_max/σ_min (``inf`` for a singular J);
        - ``henrici_rel``, ``henrici_update_rel`` = ``‖N‖_F / ‖J‖_F`` and ``‖N‖_F / ‖U‖_F``
          (0 for U = 0), with N the strictly upper part of the complex Schur factor;
        - ``symmetry``, ``symmetry_update`` = ``‖(M + Mᵀ)/2‖_F² / ‖M‖_F²`` for J and U;
        - ``complex_frac``, ``expand_eig``, ``spectral_radius`` on the eigenvalues of J;
        - ``complex_frac_nontrivial``: ``complex_frac`` among the non-trivial eigenvalues,
          those with ``|μ| = |λ − 1| > tol``, ``tol = TRIVIAL_TOL · max(1, max|λ|)``
          (:data:`TRIVIAL_TOL`; the complex threshold ``1e-8 · max|λ|`` taken over those);
          NaN when there are none (J = I to that tolerance);
        - ``rot_angle_mean``: mean ``|arg μ|`` over the same non-trivial eigenvalues μ of U
          (the trivial ones have rounding-level moduli and random phases); NaN when there
          are none;
        - ``expand_sv``, ``self_align_k`` (k in :data:`SELF_ALIGN_K`, capped at d),
          ``erank``, ``erank_sigma``, ``participation_ratio``, ``stable_rank`` on the SVD of J.

        Exactness: ``‖N‖_F`` is taken from the Schur factor, not from ``‖J‖_F² − Σ|λ|²``, so
        it is accurate to about ``n ε ‖U‖`` without cancellation; everything else is a
        closed form of the two decompositions, backward stable to about ``n ε`` relative.
        The thresholds of ``complex_frac`` (``1e-8 · max|λ|``) and the expansion fractions
        (``1 + 1e-3``) are those of :mod:`depthlens.linalg.normality`.

    Raises
    ------
    InputError
        If ``J`` is not a finite square matrix, or J = 0 (no effective rank is defined).

    Notes
    -----
    Cost: one real Schur decomposition of U without Schur vectors and one SVD of J (with
    vectors for ``self_alignment``), O(d³) each; everything else is O(d²). About 0.25 s at
    d = 576 on one core (0.2 s without the self-alignment).

    Examples
    --------
    >>> import numpy as np
    >>> m = operator_metrics(np.diag([1.0, 2.0, 4.0]))
    >>> m["cond"], m["expand_eig"], m["henrici_rel"]
    (4.0, 0.6666666666666666, 0.0)
    """
    return _analyse(J, self_alignment)[0]


def _analyse(J: ArrayLike, self_alignment: bool = True) -> tuple[dict[str, float], np.ndarray]:
    """:func:`operator_metrics` and the eigenvalues ``μ`` of U (Schur order), from one Schur form."""
    arr, U = _operator(J)
    d = arr.shape[0]
    t, mu = guarded.schur_values(U)
    lam = 1.0 + mu
    nontrivial = np.abs(mu) > TRIVIAL_TOL * max(1.0, float(np.abs(lam).max()))
    departure = schur_departure(t)  # the same N for J and U
    if self_alignment:
        left, sv, right = guarded.svd(arr)
    else:
        sv = guarded.svdvals(arr)
    out = {
        "cond": float(sv[0] / sv[-1]) if sv[-1] > 0 else float("inf"),
        "henrici_rel": _relative(departure, float(np.linalg.norm(arr))),
        "henrici_update_rel": _relative(departure, float(np.linalg.norm(U))),
        "symmetry": float(symmetry_index(arr)),
        "symmetry_update": float(symmetry_index(U)),
        "complex_frac": float(complex_fraction(lam)),
        "complex_frac_nontrivial": float(complex_fraction(lam[nontrivial])) if nontrivial.any() else float("nan"),
        # the one rule is ``nontrivial``: rel=0 keeps every one of those angles
        "rot_angle_mean": float(rotation_angle_mean(mu[nontrivial], rel=0.0)) if nontrivial.any() else float("nan"),
        "expand_eig": float(expansion_fraction(lam)),
        "expand_sv": float(expansion_fraction(sv)),
        "spectral_radius": float(np.abs(lam).max()),
    }
    for k in SELF_ALIGN_K:
        out[f"self_align_{k}"] = float(self_alignment_svd(left, right, min(k, d)) if self_alignment else np.nan)
    for name, fn in (("erank", erank), ("erank_sigma", erank_sigma), ("participation_ratio", participation_ratio), ("stable_rank", stable_rank)):
        out[name] = float(fn(sv))
    return out, mu


def metrics_table(operators: Mapping[tuple[int, str], ArrayLike], *, progress: bool = False,
                  self_alignment: bool = True) -> pd.DataFrame:
    """:func:`operator_metrics` of every operator, as a tidy table (see :func:`metrics_and_eigenvalues`)."""
    return metrics_and_eigenvalues(operators, progress=progress, self_alignment=self_alignment)[0]


def metrics_and_eigenvalues(
    operators: Mapping[tuple[int, str], ArrayLike], *, progress: bool = False, pool: Executor | None = None,
    label: str = "", self_alignment: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`operator_metrics` of every operator as a tidy table, and the eigenvalues of every
    operator from the same Schur forms (no second decomposition).

    Parameters
    ----------
    operators : mapping of (layer, sublayer) to array_like (d, d)
        The operators, e.g. ``{(0, "attn"): J, (0, "mlp"): J, ...}``; rows follow the
        mapping's order.
    progress : bool
        Show a progress bar (tqdm); ``label`` (e.g. ``step-0 null (isolated)``) follows its name.
    pool : Executor, optional
        Worker processes for the decompositions (:func:`depthlens.executors.local.executor`);
        results do not depend on it.
    self_alignment : bool
        As :func:`operator_metrics`: False leaves the ``self_align_k`` columns NaN and skips
        the singular vectors.

    Returns
    -------
    metrics : DataFrame
        Columns ``layer`` (int), ``sublayer`` (str), then :data:`METRICS` (float64) and
        ``failure``, one row per operator. ``failure`` is None, or the reason why no driver
        of :mod:`depthlens.linalg.guarded` could decompose the operator; that row's metrics
        are NaN and it has no eigenvalue rows.
    eigenvalues : DataFrame
        ``layer``, ``sublayer``, ``re``, ``im``: the eigenvalues of every J, ordered as
        :attr:`OperatorSpectra.eigenvalues` (equal to :func:`spectra`'s).

    Raises
    ------
    InputError
        If ``operators`` is empty, a key is not a ``(layer, sublayer)`` pair, or an operator
        is rejected by :func:`operator_metrics` (the message names its key).

    Notes
    -----
    Cost: :func:`operator_metrics` per operator (60 operators of size 576 in about 30 s on
    one core); two single-threaded workers on two cores run two decompositions at full
    speed each. OpenBLAS with two threads measured several times slower than with one on a
    two-core machine; set ``OPENBLAS_NUM_THREADS=1`` there.
    """
    if not isinstance(operators, Mapping) or not operators:
        raise InputError("operators is empty or not a mapping; pass {(layer, sublayer): J} with at least one operator.")
    for key in operators:
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], (int, np.integer)) and isinstance(key[1], str)):
            raise InputError(f"operator key {key!r} is not a (layer, sublayer) pair; key operators as (int, str).")
    pool = pool if pool is not None else InlineExecutor()
    # a bounded window: operators are read (e.g. from memory maps) only as the workers need them,
    # and inline ones report progress one by one
    futures = submitted(pool, _analyse, ((J, self_alignment) for J in operators.values()), max_pending=PENDING)
    rows, eigen = [], []
    for key, future in tqdm(zip(operators, futures), total=len(operators), desc=f"operator metrics {label}".strip(), unit="op", disable=not progress):
        ident = {"layer": int(key[0]), "sublayer": str(key[1])}
        try:
            metrics, mu = future.result()
        except DecompositionError as exc:  # every driver failed: NaN metrics, the reason kept
            rows.append({**ident, "failure": str(exc)})
            continue
        except InputError as exc:
            raise InputError(f"operator {key!r}: {exc}") from exc
        rows.append({**ident, **metrics, "failure": None})
        lam = 1.0 + _ordered(mu)
        eigen.append(pd.DataFrame({**ident, "re": lam.real, "im": lam.imag}))
    table = pd.DataFrame(rows, columns=["layer", "sublayer", *METRICS, "failure"])
    eigen_table = pd.concat(eigen, ignore_index=True) if eigen else pd.DataFrame(columns=["layer", "sublayer", "re", "im"])
    return table.astype({name: np.float64 for name in METRICS}), eigen_table
