"""Per-matrix quantities of §A3 for one causal attention matrix, in float64.

Kept model-free: a matrix in, a flat dict of named numbers out, so every column of the
attention tables traces back to one function here.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np

from ..linalg.causal import check_causal_stochastic, deflate, flag_nonsimple_perron
from ..linalg import guarded
from ..linalg.kreiss import CertificationBudgetWarning, KreissResult, kreiss
from ..linalg.normality import henrici, numerical_abscissa, numerical_radius
from ..linalg.nulls import shuffle_null
from ..linalg.pseudospectra import pseudospectral_radius
from ..linalg.sigma import sigma_min
from ..linalg.transients import contracts, peak_of_sequence, peak_transient
from .patterns import prev_weight, row_entropy, sink_mass

EPSILONS: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
#: Distances from 1 of the points where the K(A) = √n check is evaluated.
KREISS_A_DELTAS = (1e-7, 1e-9, 1e-11)
#: Relative tolerance of the K(A) = √n check.
KREISS_A_RTOL = 1e-3
#: Search grid ``(log radius, angle)`` of the Kreiss value for attention matrices, model and
#: nulls alike. Deflated causal stochastic matrices take the real-axis search, which reads only
#: the radius count (11 points in log(r−1) before Brent refines); the angle count serves a
#: matrix without the axis reduction (:mod:`depthlens.linalg.kreiss_search`).
SEARCH_GRID = (11, 9)


def kreiss_b(B: np.ndarray, **options: object) -> KreissResult:
    """:func:`~depthlens.linalg.kreiss.kreiss` of a deflated attention matrix on :data:`SEARCH_GRID`."""
    return kreiss(B, grid=SEARCH_GRID, **options)


def kreiss_a_check(A: np.ndarray, deltas: Sequence[float] = KREISS_A_DELTAS) -> float:
    """Lower bound on ``K(A)``: the largest ``δ / σ_min((1+δ)I − A)`` over ``δ`` in ``deltas``.

    For a causal row-stochastic ``A``, ``K(A) ≤ sup_k ‖A^k‖ ≤ √n`` exactly (§A2), and
    ``(z−1)(zI−A)⁻¹ = P/z + (z−1)(zI−B)⁻¹`` tends to ``P`` (norm √n) as ``z → 1⁺``, so each
    value lies within about ``δ(√n + ‖(I−B)⁻¹‖)`` below √n when the Perron root is simple.
    Several ``δ`` cover heads whose largest self-weight is close to 1 (``‖(I−B)⁻¹‖`` large);
    a value still below ``√n(1 − rtol)`` flags a Perron root that is numerically not simple.
    """
    z = 1.0 + np.asarray(deltas, dtype=np.float64)
    return float(np.max((z - 1.0) / sigma_min(A, z).sigma))


def transient_peak(B: np.ndarray, kb: KreissResult) -> tuple[float, int, bool]:
    """``G(B) = max_k ‖B^k‖``, its argmax and whether it is certified, reusing the power norms
    of the Kreiss upper bound (the same scan with the same exact-norm rule as
    :func:`peak_transient`), else computed afresh by :func:`peak_transient`.

    The peak is certified (the supremum over every ``k``) when the scan ends with a zero
    power, a geometric tail or ``‖B‖ < 1``, or contains a power of norm below 1; otherwise it
    is the maximum over the ``20n + 100`` powers scanned (heads with ``ρ(B)`` within about
    ``1e-3`` of 1 decay too slowly to certify).
    """
    pb = kb.power_bound
    if pb is not None and pb.tail in ("geometric", "nilpotent", "contraction", "none") and pb.norms.size > 1:
        peak, k = peak_of_sequence(pb.norms, pb.exact)
        return peak, k, pb.tail != "none" or any(contracts(a, B.shape[-1]) for a in pb.norms[1:])
    result = peak_transient(B)
    return result.peak, result.argmax, result.certified


def matrix_features(
    A: np.ndarray, *, extras: bool, eps: Sequence[float] = EPSILONS, certify: tuple[float, int] | None = None,
    rows: np.ndarray | None = None,
) -> dict[str, float]:
    """All §A3 quantities of one causal attention matrix.

    Parameters
    ----------
    A : ndarray, shape (n, n)
        Causal row-stochastic attention matrix (float64).
    extras : bool
        Also compute the costlier ε-pseudospectral radii, numerical range of ``B`` and
        power-norm upper bound ``kreiss_B_upper`` (about half the matrix's time without it:
        its scan runs until the Neumann series' tail is negligible, the transient peak's only
        until a power contracts).
    certify : (rtol, max_evals), optional
        Also certify ``K(B)`` (the columns of :func:`certified_reserve`), from the same search
        that gives ``kreiss_B`` and the same power bound that gives ``kreiss_B_upper`` (then
        computed whatever ``extras``).
    rows : ndarray of bool, shape (n,), optional
        The analysed rows (query positions) of a prompt: ``sink_mass``, ``prev_weight`` and
        ``row_entropy`` average over them only (NaN when none qualifies); the operator
        quantities are those of the whole matrix. Default: every row.

    Returns
    -------
    dict
        ``sink_mass, prev_weight, row_entropy, rho_B, norm_B, henrici_A, henrici_A_rel,
        henrici_B, henrici_B_rel, kreiss_A, kreiss_A_ok, perron_simple, kreiss_B,
        kreiss_B_upper, TR1, peak_B, peak_k, peak_certified, TR2``, and with ``extras``: ``psr_B@ε`` and
        ``TR4@ε`` for each ε, ``num_abscissa_B``, ``num_radius_B`` (NaN columns otherwise,
        marked as not computed by the caller's ``extras`` flag, and so is ``kreiss_B_upper``
        without ``extras`` or ``certify``); with ``certify`` also ``kreiss_B_lo``,
        ``kreiss_B_hi``, ``kreiss_B_certified``.

    Notes
    -----
    ``kreiss_B`` is the value of a global search (a lower bound, typically exact to 1e-10);
    ``kreiss_B_upper`` the rigorous power-norm upper bound (``inf`` when the powers do not
    fall below 1 within ``20n + 100``). ``peak_certified`` is 1 when ``peak_B`` is the
    supremum over all powers (see :func:`transient_peak`); ``peak_B``, ``peak_k`` and
    ``peak_certified`` are the same numbers whether or not the bound's scan is reused.
    ``henrici`` uses the triangular closed form (exact). ``norm_B`` is a dense SVD (exact to
    rounding).
    """
    A = check_causal_stochastic(A)
    B = deflate(A)
    n = A.shape[-1]
    out: dict[str, float] = {
        "sink_mass": float(sink_mass(A, rows)),
        "prev_weight": float(prev_weight(A, rows)),
        "row_entropy": float(row_entropy(A, rows)),
        "rho_B": float(np.diagonal(A)[1:].max()) if n > 1 else 0.0,
        "norm_B": guarded.norm2(B),
    }
    for name, M in (("A", A), ("B", B)):
        h = float(henrici(M))
        out[f"henrici_{name}"] = h
        out[f"henrici_{name}_rel"] = h / float(np.linalg.norm(M)) if h > 0 else 0.0
    simple = not bool(flag_nonsimple_perron(A))
    k_a = kreiss_a_check(A) if simple else math.nan
    out["perron_simple"] = float(simple)
    out["kreiss_A"] = k_a
    out["kreiss_A_ok"] = float(simple and k_a >= math.sqrt(n) * (1.0 - KREISS_A_RTOL))
    kb = kreiss_b(B, upper=extras) if certify is None else _certified_kreiss_b(B, *certify)
    out["kreiss_B"] = kb.value
    out["kreiss_B_upper"] = kb.upper if extras or certify is not None else math.nan
    out["TR1"] = math.log(kb.value)
    peak, k_peak, certified = transient_peak(B, kb)
    out["peak_B"] = peak
    out["peak_k"] = float(k_peak)
    out["peak_certified"] = float(certified)
    out["TR2"] = math.log(peak) if peak > 0 else -math.inf
    for e in eps:
        if extras:
            r = pseudospectral_radius(B, e).value
            out[f"psr_B@{e:g}"] = r
            out[f"TR4@{e:g}"] = (r - out["rho_B"]) / e
        else:
            out[f"psr_B@{e:g}"] = out[f"TR4@{e:g}"] = math.nan
    out["num_abscissa_B"] = float(numerical_abscissa(B)) if extras else math.nan
    out["num_radius_B"] = float(numerical_radius(B)) if extras else math.nan
    if certify is not None:
        out.update(bracket_columns(kb))
    return out


def null_reserves(A: np.ndarray, null_mode: str, n_samples: int, rng: np.random.Generator) -> np.ndarray:
    """``TR1 = log K(B̃)`` of ``n_samples`` matched shuffle nulls of ``A`` (§A4)."""
    nulls = shuffle_null(A, null_mode, n_samples, rng=rng)
    return np.array([math.log(kreiss_b(B, upper=False).value) for B in deflate(nulls)])


def _certified_kreiss_b(B: np.ndarray, rtol: float, max_evals: int) -> KreissResult:
    """:func:`kreiss_b` with ``certify=True``; the
    :class:`~depthlens.linalg.kreiss.CertificationBudgetWarning` of a matrix that exhausts
    ``max_evals`` is silenced (the table's flag records it), so the stage's workers do not
    repeat it per head."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CertificationBudgetWarning)
        return kreiss_b(B, certify=True, rtol=rtol, max_evals=max_evals)


def bracket_columns(kb: KreissResult) -> dict[str, float]:
    """``kreiss_B_lo``, ``kreiss_B_hi`` and ``kreiss_B_certified`` of a certified result: the
    bracket (``lo ≤ K(B) ≤ hi`` up to the margins stated in :mod:`depthlens.linalg.kreiss`,
    whether or not certified) and 1 when it met ``rtol`` (or ``K = ∞`` is certain), 0 when the
    budget ran out or the verdict ``K = ∞`` rests on a numerical rank decision."""
    return {"kreiss_B_lo": kb.lo, "kreiss_B_hi": kb.hi, "kreiss_B_certified": float(kb.certified)}


def certified_reserve(A: np.ndarray, rtol: float, max_evals: int) -> dict[str, float]:
    """:func:`bracket_columns` of ``K(B)`` by branch and bound, within ``rtol`` when
    ``kreiss_B_certified`` is 1; a matrix that exhausts ``max_evals`` σ_min evaluations keeps
    the (valid, wider) bracket reached so far with ``kreiss_B_certified`` 0, without a warning."""
    return bracket_columns(_certified_kreiss_b(deflate(A), rtol, max_evals))
