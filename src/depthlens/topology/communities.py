"""Signed Leiden CPM communities and the resolution profile (§B5).

The signed constant Potts model on a graph with signed weights ``w_ij`` scores a partition as

    Q(γ) = Σ_c [ W⁺_c − γ · n_c (n_c − 1) / 2 − W⁻_c ],

with ``W⁺_c`` (``W⁻_c``) the total positive weight (absolute negative weight) of edges
inside community ``c`` and ``n_c`` its size. It is optimised as a two-layer multiplex in
``leidenalg``: a CPM partition of the positive edges with resolution ``γ`` (layer weight +1)
and a CPM partition of the negative edges, as magnitudes, with resolution 0 (layer weight −1).
Only the positive layer carries the size penalty; giving both layers the same ``γ`` (as
``leidenalg.find_partition_multiplex`` does) cancels it and makes the result independent of
``γ``.

``leidenalg`` reports each CPM layer's quality doubled (it sums ordered pairs); the
``quality`` recorded here is ``Q(γ)`` above, recomputed from the membership.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Literal

import igraph as ig
import leidenalg as la
import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from ..errors import InputError
from ..executors.local import InlineExecutor, submitted
from .correlation import Edges, _as_edges

__all__ = [
    "LeidenRecord",
    "Plateau",
    "ResolutionProfile",
    "choose_plateau",
    "resolution_profile",
    "signed_leiden",
    "signed_quality",
]

#: Default resolution range of the profile: correlation top-k graphs of residual streams have
#: edge weights of order 0.01 – 0.9, so γ = 1 (leidenalg's default) leaves only singletons,
#: while below about 1e-3 the size penalty stops mattering and whole components merge.
GAMMA_RANGE: tuple[float, float] = (1e-3, 0.5)
#: Intervals a round of :func:`resolution_profile`'s bisection halves at once (their Leiden
#: runs are independent, so a pool runs them side by side; fixed, so results never depend on it).
PROFILE_ROUND = 4


@dataclass(frozen=True)
class LeidenRecord:
    """What one signed Leiden run did.

    Attributes
    ----------
    quality : float
        Signed CPM quality ``Q(γ)`` of the returned partition (see the module docstring).
    n_communities : int
        Number of communities.
    sizes : tuple of int
        Community sizes, indexed by community label (labels are ordered by decreasing size).
    resolution : float
        ``γ`` of the positive layer.
    seed : int
        Seed of the optimiser's random number generator.
    iterations : int
        Leiden iterations run (each a full pass of moving, refinement and aggregation).
    """

    quality: float
    n_communities: int
    sizes: tuple[int, ...]
    resolution: float
    seed: int
    iterations: int


def _consider_comms(resolution: float) -> int:
    """Candidate communities of a node move: its neighbours' in either layer, plus an empty one.

    This is exact for ``consider_comms = ALL_COMMS`` whenever ``γ > 0``. A community ``c``
    that holds no neighbour of the moving node ``v`` (in either layer) changes the negative
    layer exactly as a move to an empty community does, and the positive layer by
    ``γ n_v n_c`` less (``n_v``, ``n_c`` node sizes), so it never beats the empty community
    (offered whenever ``v`` shares its community) nor staying put (when ``v`` is alone). The
    arg-max over all communities therefore lies among the neighbours' communities and the empty
    one, and leidenalg picks the same move; only exact floating-point ties between two
    candidates could be broken in another order. At ``γ = 0`` the size penalty vanishes and
    such non-neighbour moves tie with the empty community, so ``ALL_COMMS`` is used there.
    The move scan then costs ``O(degree)`` per node instead of ``O(number of communities)``.
    """
    return la.ALL_NEIGH_COMMS if resolution > 0.0 else la.ALL_COMMS


class _SignedGraph:
    """The positive and negative layers of a signed graph (built for each Leiden run, in the
    process that runs it: a profile's runs may go to worker processes)."""

    def __init__(self, e: Edges, n: int) -> None:
        pos = e.weight > 0
        self.edges = e
        self.n = n
        self._layers = [
            (ig.Graph(n=n, edges=np.column_stack([e.i[m], e.j[m]]).tolist()), np.abs(e.weight[m]).tolist())
            for m in (pos, ~pos)
        ]

    def leiden(self, gamma: float, seed: int, n_iterations: int) -> tuple[np.ndarray, LeidenRecord]:
        """Signed Leiden at ``γ`` (validated by the caller); see :func:`signed_leiden`."""
        (g_pos, w_pos), (g_neg, w_neg) = self._layers
        layers = [
            la.CPMVertexPartition(g_pos, weights=w_pos, resolution_parameter=gamma),
            la.CPMVertexPartition(g_neg, weights=w_neg, resolution_parameter=0.0),
        ]
        optimiser = la.Optimiser()
        optimiser.consider_comms = _consider_comms(gamma)
        optimiser.set_rng_seed(int(seed))
        iterations = 0
        while n_iterations < 0 or iterations < n_iterations:
            improvement = optimiser.optimise_partition_multiplex(layers, layer_weights=[1, -1], n_iterations=1)
            iterations += 1
            if n_iterations < 0 and improvement <= 0:
                break
        membership = np.asarray(layers[0].membership, dtype=np.int64)
        a, b = _quality_terms(self.edges, self.n, membership)
        sizes = np.bincount(membership)
        record = LeidenRecord(
            quality=a - gamma * b,
            n_communities=int(sizes.size),
            sizes=tuple(int(s) for s in sizes),
            resolution=gamma,
            seed=int(seed),
            iterations=iterations,
        )
        return membership, record


def _quality_terms(e: Edges, n: int, membership: np.ndarray) -> tuple[float, float]:
    """``(A, B)`` with ``Q(γ) = A − γ B``: signed in-community weight and Σ n_c(n_c − 1)/2."""
    inside = membership[e.i] == membership[e.j]
    return float(e.weight[inside].sum()), _pairs(np.bincount(membership))


def _pairs(sizes: ArrayLike) -> float:
    """``Σ_c n_c (n_c − 1) / 2``: the node pairs inside communities of the given sizes."""
    s = np.asarray(sizes, dtype=np.float64)
    return float((s * (s - 1.0) / 2.0).sum())


def signed_quality(edges: Edges, n: int, membership: ArrayLike, resolution: float) -> float:
    """Signed CPM quality ``Q(γ)`` of a membership (see the module docstring). Exact; O(m + n).

    Raises
    ------
    InputError
        If the edges are invalid for ``n`` or ``membership`` is not ``n`` non-negative integers.
    """
    e = _as_edges(edges, n)
    memb = _as_membership(membership, n)
    a, b = _quality_terms(e, n, memb)
    return a - float(resolution) * b


def _as_membership(membership: ArrayLike, n: int) -> np.ndarray:
    memb = np.asarray(membership)
    if memb.shape != (n,) or memb.dtype.kind not in "iu" or (n and memb.min() < 0):
        raise InputError(f"membership must be {n} non-negative integer labels, got shape {memb.shape}, dtype {memb.dtype}.")
    return memb.astype(np.int64)


def _check_resolution(resolution: float) -> float:
    gamma = float(resolution)
    if not (math.isfinite(gamma) and gamma >= 0.0):
        raise InputError(f"resolution must be a finite non-negative number, got {resolution!r}.")
    return gamma


def signed_leiden(
    edges: Edges,
    n: int,
    resolution: float,
    seed: int = 0,
    n_iterations: int = -1,
) -> tuple[np.ndarray, LeidenRecord]:
    """Signed Leiden CPM partition of a signed graph.

    Parameters
    ----------
    edges : Edges
        Signed edges on nodes ``0 .. n−1`` (e.g. from :func:`topk_graph`).
    n : int
        Number of nodes (isolated nodes included; each ends up a singleton).
    resolution : float
        ``γ >= 0`` of the positive layer. Correlation graphs want ``γ`` in about
        ``[1e-3, 0.5]`` (:data:`GAMMA_RANGE`); pick it with :func:`resolution_profile`.
    seed : int
        Seed of leidenalg's random number generator; the same seed gives the same partition.
    n_iterations : int
        Leiden iterations; negative runs until an iteration no longer improves the quality.

    Returns
    -------
    membership : numpy.ndarray of int64, shape (n,)
        Community label per node, labels ``0 .. C−1`` by decreasing community size.
    record : LeidenRecord

    Raises
    ------
    InputError
        If the edges are invalid for ``n`` or ``resolution`` is negative or not finite.

    Notes
    -----
    Heuristic (Leiden guarantees γ-connected communities, not the optimum). Moves pick the
    best of all communities (``consider_comms = ALL_COMMS``), so two nodes joined only by
    negative edges can still be separated into unrelated communities. For ``γ > 0`` the scan
    is restricted to the neighbours' communities and an empty one, which contain that best
    move (see :func:`_consider_comms`): the partition equals the ``ALL_COMMS`` run's for the
    same seed, barring exact floating-point ties between candidate moves. Cost about ``O(m)``
    per iteration, ``m`` the number of edges (``ALL_COMMS`` scans cost ``O(n C)``, ``C``
    communities).

    Examples
    --------
    >>> e = Edges(i=np.array([0, 2]), j=np.array([1, 3]), weight=np.array([0.9, 0.8]))
    >>> signed_leiden(e, 4, resolution=0.1)[0]
    array([0, 0, 1, 1])
    """
    gamma = _check_resolution(resolution)
    return _SignedGraph(_as_edges(edges, n), n).leiden(gamma, seed, n_iterations)


@dataclass(frozen=True)
class ResolutionProfile:
    """Partitions of one graph over a range of ``γ``.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per evaluated ``γ``, increasing: ``gamma``, ``n_communities``, ``quality``
        (``Q(γ)`` of the row's partition), ``found_at`` (the ``γ`` whose Leiden run produced
        the partition; see :func:`resolution_profile`) and ``iterations`` (of that run).
    memberships : numpy.ndarray of int64, shape (len(table), n)
        The partition of each row.
    n : int
        Number of nodes.
    seed : int
        Seed of every Leiden run.
    scale : {"log", "linear"}
        How ``γ`` was bisected, and how :func:`choose_plateau` measures widths.
    """

    table: pd.DataFrame
    memberships: np.ndarray
    n: int
    seed: int
    scale: Literal["log", "linear"]


def _position(gamma: float | np.ndarray, scale: str) -> float | np.ndarray:
    return np.log(gamma) if scale == "log" else gamma


def resolution_profile(
    edges: Edges,
    n: int,
    gammas: Sequence[float] | None = None,
    gamma_range: tuple[float, float] = GAMMA_RANGE,
    seed: int = 0,
    n_iterations: int = -1,
    scale: Literal["log", "linear"] = "log",
    tol: float = 0.05,
    max_evals: int = 32,
    pool: Executor | None = None,
) -> ResolutionProfile:
    """Signed Leiden partitions over a sweep of the resolution ``γ``.

    With ``gammas`` given, :func:`signed_leiden` runs at each of them. Otherwise ``γ`` is
    bisected in ``gamma_range``: both ends are evaluated, then in rounds the
    :data:`PROFILE_ROUND` widest intervals whose numbers of communities at their ends differ
    and that are wider than ``tol`` (in ``log γ`` or ``γ``) are halved (at the geometric
    midpoint for ``scale="log"``, arithmetic for ``"linear"``; ties: lower ``γ`` first), up
    to ``max_evals`` Leiden runs. The runs of a round are independent and go to ``pool``;
    the round's size is fixed, so the profile does not depend on the pool. ``leidenalg``'s own
    ``Optimiser.resolution_profile`` bisects a single graph and cannot drive the signed
    two-layer model, hence this implementation.

    Because ``Q(γ) = A − γ B`` is linear in ``γ`` for a fixed partition, every row finally
    takes, among all partitions found in the sweep, the one of highest ``Q`` at its ``γ``
    (keeping its own on ties). The upper envelope of lines makes the number of node pairs
    inside communities non-increasing in ``γ``, which removes most of the non-monotonicity
    that the heuristic produces between independent runs (the number of communities can
    still step back by one or two). ``found_at`` records where each partition came from.

    Parameters
    ----------
    edges, n, seed, n_iterations
        As for :func:`signed_leiden`.
    gammas : sequence of float, optional
        Explicit resolutions (positive for ``scale="log"``); overrides the bisection.
    gamma_range : (float, float)
        ``(low, high)`` of the bisection; default :data:`GAMMA_RANGE` ``(1e-3, 0.5)``.
    scale : {"log", "linear"}
        Bisection and width scale. ``"log"`` (default) because the structure of correlation
        graphs spreads over orders of magnitude of ``γ``; ``"linear"`` follows leidenalg's
        ``linear_bisection``.
    tol : float
        Smallest interval that is still split (``log γ`` units for ``"log"``, so 0.05 ≈ 5 %).
    max_evals : int
        Cap on Leiden runs of the bisection (at least 2).
    pool : Executor, optional
        Worker processes for the Leiden runs (:func:`depthlens.executors.local.executor`); default
        inline. The result does not depend on it.

    Returns
    -------
    ResolutionProfile

    Raises
    ------
    InputError
        If the edges are invalid, ``gamma_range`` is not ``0 <= low < high`` (``0 < low`` on the
        log scale), a ``γ`` is negative, or ``max_evals < 2``.

    Notes
    -----
    Cost: the number of evaluated ``γ`` times one :func:`signed_leiden` run, a round's runs
    side by side on a pool. Every run starts from singletons with the same ``seed``, so each
    row is exactly the :func:`signed_leiden` partition at its ``γ`` (before the envelope).
    """
    e = _as_edges(edges, n)
    if scale not in ("log", "linear"):
        raise InputError(f"scale must be 'log' or 'linear', got {scale!r}.")
    pool = pool if pool is not None else InlineExecutor()
    runs: dict[float, tuple[np.ndarray, LeidenRecord]] = {}

    def run(new: list[float]) -> None:
        new = [g for g in dict.fromkeys(new) if g not in runs]
        for gamma, future in zip(new, submitted(pool, signed_leiden, ((e, n, g, seed, n_iterations) for g in new))):
            runs[gamma] = future.result()

    if gammas is not None:
        grid = sorted({_check_resolution(g) for g in gammas})
        if not grid or (scale == "log" and grid[0] <= 0.0):
            raise InputError("gammas must be a non-empty list of resolutions, positive on the log scale.")
        run(grid)
    else:
        low, high = (_check_resolution(g) for g in gamma_range)
        if not (low < high and (scale == "linear" or low > 0.0)):
            raise InputError(f"gamma_range must be (low, high) with 0 < low < high, got {gamma_range!r}.")
        if max_evals < 2:
            raise InputError(f"max_evals must be at least 2, got {max_evals}.")
        run([low, high])
        while len(runs) < max_evals:
            grid = sorted(runs)
            counts = _envelope(runs, grid)[1]
            widths = np.diff(_position(np.array(grid), scale))
            split = [k for k in range(len(grid) - 1) if counts[k] != counts[k + 1] and widths[k] > tol]
            if not split:
                break
            chosen = sorted(split, key=lambda s: (-widths[s], s))[:min(PROFILE_ROUND, max_evals - len(runs))]
            run([math.sqrt(grid[k] * grid[k + 1]) if scale == "log" else (grid[k] + grid[k + 1]) / 2.0 for k in chosen])
    grid = sorted(runs)
    source, counts, quality = _envelope(runs, grid)
    table = pd.DataFrame(
        {
            "gamma": np.array(grid),
            "n_communities": counts,
            "quality": quality,
            "found_at": np.array([grid[s] for s in source]),
            "iterations": np.array([runs[grid[s]][1].iterations for s in source], dtype=np.int64),
        }
    )
    memberships = np.stack([runs[grid[s]][0] for s in source])
    return ResolutionProfile(table=table, memberships=memberships, n=int(n), seed=int(seed), scale=scale)


def _envelope(
    runs: dict[float, tuple[np.ndarray, LeidenRecord]], grid: list[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per ``γ`` in ``grid``: index of the best partition found, its community count and ``Q(γ)``."""
    gam = np.array(grid)
    q_own = np.array([runs[g][1].quality for g in grid])
    b = np.array([_pairs(runs[g][1].sizes) for g in grid])
    a = q_own + gam * b
    values = a[None, :] - gam[:, None] * b[None, :]
    best = np.argmax(values, axis=1)
    own = np.arange(len(grid))
    margin = 1e-12 * np.maximum(1.0, np.abs(q_own))
    source = np.where(values[own, best] > q_own + margin, best, own)
    counts = np.array([runs[grid[s]][1].n_communities for s in source], dtype=np.int64)
    return source, counts, values[own, source]


@dataclass(frozen=True)
class Plateau:
    """The chosen resolution of a profile.

    Attributes
    ----------
    gamma : float
        Chosen ``γ``: the profile row of the plateau closest to its centre.
    gamma_low, gamma_high : float
        First and last ``γ`` of the plateau (an inner bound of the true interval).
    width : float
        ``gamma_high − gamma_low`` on the profile's scale (``log γ`` or ``γ``).
    n_communities : int
        Number of communities on the plateau.
    row : int
        Row of the profile table at ``gamma``.
    membership : numpy.ndarray of int64, shape (n,)
        The partition at ``gamma``.
    """

    gamma: float
    gamma_low: float
    gamma_high: float
    width: float
    n_communities: int
    row: int
    membership: np.ndarray


def choose_plateau(profile: ResolutionProfile) -> Plateau:
    """Widest plateau of the number of communities in a resolution profile.

    A plateau is a maximal run of consecutive rows with the same ``n_communities``; runs
    with one community or with ``n`` (all singletons) are excluded as trivial. Width is the
    distance between the run's first and last ``γ`` on the profile's scale; ties go to the
    run at lower ``γ``. Within the run the row nearest the centre is chosen (lower on ties).

    Raises
    ------
    InputError
        If every row is trivial (widen ``gamma_range`` or check the graph has structure).
    """
    gam = profile.table["gamma"].to_numpy()
    counts = profile.table["n_communities"].to_numpy()
    pos = _position(gam, profile.scale)
    best: tuple[float, int, int] | None = None
    start = 0
    for end in range(1, len(counts) + 1):
        if end < len(counts) and counts[end] == counts[start]:
            continue
        if counts[start] not in (1, profile.n):
            width = float(pos[end - 1] - pos[start])
            if best is None or width > best[0]:
                best = (width, start, end - 1)
        start = end
    if best is None:
        raise InputError("the resolution profile has no non-trivial plateau; widen gamma_range or check the graph.")
    width, first, last = best
    centre = (pos[first] + pos[last]) / 2.0
    row = first + int(np.argmin(np.abs(pos[first : last + 1] - centre)))
    return Plateau(
        gamma=float(gam[row]),
        gamma_low=float(gam[first]),
        gamma_high=float(gam[last]),
        width=width,
        n_communities=int(counts[row]),
        row=row,
        membership=profile.memberships[row].copy(),
    )
