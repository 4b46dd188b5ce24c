"""Boundary nodes and their coupling to Jacobian amplification (§B5).

Boundary nodes are residual coordinates whose positive correlations spread over several
communities (high participation coefficient). The coupling of a layer is the rank-biserial
effect of boundary against interior amplification, tested by label permutation, with
Benjamini–Hochberg FDR over layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.stats import rankdata

from ..errors import InputError
from ..linalg._checks import as_square
from ..stats import bh_qvalues
from .communities import _as_membership
from .correlation import Edges, _as_edges

__all__ = [
    "CouplingRecord",
    "amplification",
    "boundary_nodes",
    "coupling_table",
    "participation_coefficient",
    "permutation_pvalue",
    "rank_biserial",
]


def participation_coefficient(edges: Edges, n: int, membership: ArrayLike) -> np.ndarray:
    """Participation coefficient of every node over the positive edges.

    ``P_i = 1 − Σ_c (k_ic / k_i)²`` with ``k_i`` the positive strength of node ``i`` (sum of
    its positive edge weights) and ``k_ic`` the part of it going into community ``c``.
    Negative edges are ignored. A node without positive edges gets 0 (it links to no
    community, so it is not a boundary node).

    Parameters
    ----------
    edges : Edges
        Signed edges on nodes ``0 .. n−1``.
    n : int
        Number of nodes.
    membership : array_like of int, shape (n,)
        Community label per node.

    Returns
    -------
    numpy.ndarray, shape (n,), float64, values in ``[0, 1 − 1/C]``

    Raises
    ------
    InputError
        If the edges are invalid for ``n`` or ``membership`` has the wrong shape or labels.

    Notes
    -----
    Exact to rounding; cost ``O(m + n C)`` time and ``O(n C)`` memory, ``C`` communities.
    """
    e = _as_edges(edges, n)
    memb = _as_membership(membership, n)
    pos = e.weight > 0
    src = np.concatenate([e.i[pos], e.j[pos]])
    dst = np.concatenate([e.j[pos], e.i[pos]])
    w = np.concatenate([e.weight[pos], e.weight[pos]])
    n_comm = int(memb.max()) + 1
    into = np.zeros((n, n_comm))
    np.add.at(into, (src, memb[dst]), w)
    strength = into.sum(axis=1)
    share_sq = np.divide((into**2).sum(axis=1), strength**2, out=np.ones(n), where=strength > 0)
    return np.clip(1.0 - share_sq, 0.0, 1.0)


def boundary_nodes(pc: ArrayLike, quantile: float = 0.75) -> np.ndarray:
    """Boundary mask: nodes in the top ``1 − quantile`` share by participation coefficient.

    With ``b = ⌈(1 − quantile) n⌉`` and ``t`` the ``b``-th largest coefficient, boundary
    nodes are those with ``pc >= t`` and ``pc > 0``. Ties at ``t`` are all included, so the
    mask does not depend on node order (and can hold a few more than ``b`` nodes); nodes
    with ``pc = 0`` (all positive strength in one community, or none) are never boundary.

    Parameters
    ----------
    pc : array_like, shape (n,)
        Participation coefficients (see :func:`participation_coefficient`).
    quantile : float
        In ``[0, 1)``; 0.75 (default) keeps the top quartile.

    Returns
    -------
    numpy.ndarray of bool, shape (n,)

    Raises
    ------
    InputError
        If ``pc`` is not a finite 1-d array or ``quantile`` lies outside ``[0, 1)``.
    """
    arr = _as_vector(pc, "pc")
    if not 0.0 <= quantile < 1.0:
        raise InputError(f"quantile must lie in [0, 1), got {quantile!r}.")
    b = int(np.ceil((1.0 - quantile) * arr.size))
    if b == 0:
        return np.zeros(arr.size, dtype=bool)
    threshold = np.sort(arr)[::-1][b - 1]
    return (arr >= threshold) & (arr > 0.0)


def amplification(J: ArrayLike, kind: Literal["column", "row", "diagonal"] = "column") -> np.ndarray:
    """Per-unit amplification of a Jacobian.

    Parameters
    ----------
    J : array_like, shape (d, d)
        Mean sub-layer Jacobian ``J̄`` (output index first).
    kind : {"column", "row", "diagonal"}
        ``"column"`` (default): ``‖J e_i‖₂``, how much a perturbation of unit ``i`` grows;
        ``"row"``: ``‖e_iᵀ J‖₂``, how much unit ``i`` receives; ``"diagonal"``: ``|J_ii|``.

    Returns
    -------
    numpy.ndarray, shape (d,), float64

    Raises
    ------
    InputError
        If ``J`` is not a finite real square matrix or ``kind`` is unknown.

    Notes
    -----
    Exact to rounding; cost ``O(d²)``.
    """
    arr = as_square(J, "J")
    if arr.dtype.kind == "c":
        raise InputError("J is complex; pass a real Jacobian.")
    if kind == "column":
        return np.linalg.norm(arr, axis=0)
    if kind == "row":
        return np.linalg.norm(arr, axis=1)
    if kind == "diagonal":
        return np.abs(np.diag(arr)).copy()
    raise InputError(f"kind must be 'column', 'row' or 'diagonal', got {kind!r}.")


def _as_vector(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf" or arr.ndim != 1:
        raise InputError(f"{name} has shape {arr.shape} and dtype {arr.dtype}; pass a real 1-d array.")
    arr = arr.astype(np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        raise InputError(f"{name} holds NaN or infinity; pass finite values.")
    return arr


def _as_labels(values: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    vals = _as_vector(values, "values")
    lab = np.asarray(labels)
    if lab.dtype != bool or lab.shape != vals.shape:
        raise InputError(f"labels must be a boolean mask of shape {vals.shape}, got shape {lab.shape}, dtype {lab.dtype}.")
    n1 = int(lab.sum())
    if n1 == 0 or n1 == lab.size:
        raise InputError("labels must mark at least one boundary and one interior node.")
    return vals, lab


def _centred_rank_sums(ranks: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``2 R₁ − n₁ (n + 1)`` for each row of ``labels`` (``R₁`` the boundary rank sum).

    Mid-ranks are multiples of 1/2, so the result is exact in float64 for any realistic n
    and permuted copies compare without rounding.
    """
    n = labels.shape[-1]
    n1 = labels.sum(axis=-1)
    return 2.0 * (labels.astype(np.float64) @ ranks) - n1 * (n + 1.0)


def _effect(centred: np.ndarray, n1: int, n0: int) -> np.ndarray:
    # U = R₁ − n₁(n₁+1)/2 and 2U/(n₁n₀) − 1 = (2R₁ − n₁(n+1)) / (n₁n₀).
    return centred / (n1 * n0)


def rank_biserial(x_boundary: ArrayLike, x_interior: ArrayLike) -> float:
    """Rank-biserial correlation of two samples, ``2·AUC − 1`` in ``[-1, 1]``.

    ``AUC = U / (n₁ n₀)`` with ``U`` the Mann–Whitney statistic of ``x_boundary``: the
    probability that a boundary value exceeds an interior one, ties counted half. Positive
    means boundary units amplify more. Exact (mid-ranks); cost ``O(n log n)``.

    Raises
    ------
    InputError
        If a sample is empty or not a finite 1-d array.
    """
    xb = _as_vector(x_boundary, "x_boundary")
    xi = _as_vector(x_interior, "x_interior")
    if xb.size == 0 or xi.size == 0:
        raise InputError("rank_biserial needs at least one value in each sample.")
    labels = np.concatenate([np.ones(xb.size, dtype=bool), np.zeros(xi.size, dtype=bool)])
    ranks = rankdata(np.concatenate([xb, xi]))
    return float(_effect(_centred_rank_sums(ranks, labels), xb.size, xi.size))


def _permutation_test(
    values: np.ndarray, labels: np.ndarray, n_perm: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Observed rank-biserial effect and its two-sided label-permutation p-value."""
    ranks = rankdata(values)
    observed = _centred_rank_sums(ranks, labels)
    permuted = rng.permuted(np.broadcast_to(labels, (n_perm, labels.size)), axis=1)
    null = _centred_rank_sums(ranks, permuted)
    p = (1.0 + np.count_nonzero(np.abs(null) >= abs(observed))) / (1.0 + n_perm)
    n1 = int(labels.sum())
    return float(_effect(observed, n1, labels.size - n1)), float(p)


def permutation_pvalue(
    values: ArrayLike, labels: ArrayLike, n_perm: int = 1000, rng: np.random.Generator | int | None = None
) -> float:
    """Two-sided label-permutation p-value of the rank-biserial effect.

    ``p = (1 + #{|r_perm| >= |r_obs|}) / (1 + n_perm)``, the permutations drawn as
    ``rng.permuted`` of the label row (equivalently one ``rng.permutation(labels)`` per
    permutation, in order). Never 0; exact as a Monte Carlo test (valid at every level).

    Parameters
    ----------
    values : array_like, shape (n,)
        Amplification per unit.
    labels : array_like of bool, shape (n,)
        True for boundary units; both groups non-empty.
    n_perm : int
        Number of permutations (at least 1).
    rng : numpy.random.Generator or int, optional
        Source of the permutations (an int seeds a new generator).

    Returns
    -------
    float

    Raises
    ------
    InputError
        If the inputs do not match or a group is empty.

    Notes
    -----
    Vectorised: mid-ranks are computed once and every permutation's rank sum is one row of
    a ``(n_perm, n) @ (n,)`` product. Comparisons use the exact half-integer rank sums.
    Cost ``O(n_perm n)`` time and memory.
    """
    vals, lab = _as_labels(values, labels)
    if int(n_perm) != n_perm or n_perm < 1:
        raise InputError(f"n_perm must be a positive integer, got {n_perm!r}.")
    return _permutation_test(vals, lab, int(n_perm), np.random.default_rng(rng))[1]


@dataclass(frozen=True)
class CouplingRecord:
    """Randomness of a :func:`coupling_table`.

    Attributes
    ----------
    seed : int
        Root seed.
    n_perm : int
        Permutations per layer.
    spawn_keys : dict of int to tuple of int
        Layer → spawn key of its generator: ``SeedSequence(seed, spawn_key=key)``, the same
        as child ``layer`` of ``SeedSequence(seed).spawn(...)``, whatever the layers' order.
    """

    seed: int
    n_perm: int
    spawn_keys: dict[int, tuple[int, ...]]


def coupling_table(
    per_layer_inputs: Mapping[int, tuple[ArrayLike, ArrayLike]],
    n_perm: int = 1000,
    seed: int = 0,
) -> tuple[pd.DataFrame, CouplingRecord]:
    """Boundary-versus-interior amplification coupling per layer, with BH-FDR over layers.

    Parameters
    ----------
    per_layer_inputs : mapping of int to (amplification, boundary)
        Layer index (non-negative) → amplification per unit (from :func:`amplification`)
        and the boundary mask (from :func:`boundary_nodes`), both of shape ``(d,)``.
    n_perm : int
        Label permutations per layer.
    seed : int
        Root seed. Layer ``l`` draws from ``SeedSequence(seed).spawn(l + 1)[l]``, so the
        result of a layer does not depend on which other layers are present or their order.

    Returns
    -------
    table : pandas.DataFrame
        One row per layer, by increasing layer: ``layer``, ``effect`` (rank-biserial, see
        :func:`rank_biserial`), ``p`` (see :func:`permutation_pvalue`), ``q``
        (Benjamini–Hochberg over the layers of this table), ``sign`` (−1, 0 or +1 of the
        effect), ``n_boundary_nodes``, ``n_interior_nodes``.
    record : CouplingRecord

    Raises
    ------
    InputError
        If a layer key is not a non-negative integer, or a layer's inputs are invalid.
    """
    if int(n_perm) != n_perm or n_perm < 1:
        raise InputError(f"n_perm must be a positive integer, got {n_perm!r}.")
    bad = [k for k in per_layer_inputs if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 0]
    if bad:
        raise InputError(f"layer keys must be non-negative integers, got {bad[0]!r}.")
    root = np.random.SeedSequence(int(seed))
    rows = []
    keys: dict[int, tuple[int, ...]] = {}
    for layer in sorted(per_layer_inputs):
        values, labels = per_layer_inputs[layer]
        try:
            vals, lab = _as_labels(values, labels)
        except InputError as exc:
            raise InputError(f"layer {layer}: {exc}") from exc
        child = np.random.SeedSequence(root.entropy, spawn_key=(*root.spawn_key, int(layer)))
        keys[int(layer)] = tuple(child.spawn_key)
        effect, p = _permutation_test(vals, lab, int(n_perm), np.random.default_rng(child))
        n1 = int(lab.sum())
        rows.append((int(layer), effect, p, int(np.sign(effect)), n1, lab.size - n1))
    table = pd.DataFrame(rows, columns=["layer", "effect", "p", "sign", "n_boundary_nodes", "n_interior_nodes"])
    table.insert(3, "q", bh_qvalues(table["p"].to_numpy()))
    return table, CouplingRecord(seed=int(seed), n_perm=int(n_perm), spawn_keys=keys)
