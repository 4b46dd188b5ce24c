"""Signed Leiden CPM: planted signed blocks, monotone resolution, determinism, quality."""

from __future__ import annotations

import igraph as ig
import leidenalg as la
import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import adjusted_rand_score

from depthlens.errors import InputError
from depthlens.topology import communities
from depthlens.topology import (
    Edges,
    ResolutionProfile,
    choose_plateau,
    resolution_profile,
    signed_leiden,
    signed_quality,
    topk_graph,
)


def _planted(rng: np.random.Generator, n_obs: int = 2000, size: int = 25) -> tuple[Edges, np.ndarray]:
    """4 blocks sharing a latent factor each; block 3 loads on block 2's factor with sign −1."""
    blocks = np.repeat(np.arange(4), size)
    factor = np.array([0, 1, 2, 2])[blocks]
    sign = np.array([1, 1, 1, -1])[blocks]
    F = rng.normal(size=(n_obs, 3))
    X = F[:, factor] * sign + rng.normal(size=(n_obs, blocks.size))
    return topk_graph(np.corrcoef(X, rowvar=False), 20), blocks


def _hierarchy(rng: np.random.Generator, n_obs: int = 2000, sub: int = 15) -> tuple[Edges, np.ndarray, np.ndarray]:
    """2 big blocks of 3 sub-blocks; r ≈ 0.75 within a sub-block, ≈ 0.3 across sub-blocks."""
    big = np.repeat([0, 1], 3 * sub)
    small = np.repeat(np.arange(6), sub)
    X = rng.normal(size=(n_obs, 2))[:, big] * 0.8 + rng.normal(size=(n_obs, 6))[:, small]
    X += 0.7 * rng.normal(size=X.shape)
    return topk_graph(np.corrcoef(X, rowvar=False), 20), big, small


def test_planted_signed_blocks_are_recovered(rng: np.random.Generator) -> None:
    edges, blocks = _planted(rng)
    assert np.any(edges.weight < 0)
    profile = resolution_profile(edges, blocks.size, seed=3)
    plateau = choose_plateau(profile)
    assert adjusted_rand_score(blocks, plateau.membership) >= 0.9
    anti_a = np.bincount(plateau.membership[blocks == 2]).argmax()
    anti_b = np.bincount(plateau.membership[blocks == 3]).argmax()
    assert anti_a != anti_b
    membership, record = signed_leiden(edges, blocks.size, plateau.gamma, seed=3)
    assert adjusted_rand_score(blocks, membership) >= 0.9
    assert record.resolution == plateau.gamma and record.seed == 3 and record.iterations >= 1


GRID = [0.01, 0.03, 0.1, 0.2, 0.4, 0.7, 0.9]


def _counts(edges: Edges, n: int) -> list[int]:
    return [signed_leiden(edges, n, g, seed=0)[1].n_communities for g in GRID]


def _counts_same_gamma_both_layers(edges: Edges, n: int) -> list[int]:
    """The degenerate set-up: the negative layer also gets resolution γ (find_partition_multiplex)."""
    pos = edges.weight > 0
    graphs = [ig.Graph(n=n, edges=list(zip(edges.i[m], edges.j[m]))) for m in (pos, ~pos)]
    out = []
    for g in GRID:
        parts = [
            la.CPMVertexPartition(graphs[0], weights=edges.weight[pos].tolist(), resolution_parameter=g),
            la.CPMVertexPartition(graphs[1], weights=(-edges.weight[~pos]).tolist(), resolution_parameter=g),
        ]
        opt = la.Optimiser()
        opt.consider_comms = la.ALL_COMMS
        opt.set_rng_seed(0)
        opt.optimise_partition_multiplex(parts, layer_weights=[1, -1], n_iterations=-1)
        out.append(len(set(parts[0].membership)))
    return out


def _splits_monotonically(counts: list[int]) -> bool:
    return all(a <= b for a, b in zip(counts, counts[1:])) and counts[0] < counts[-1]


def test_raising_gamma_splits_a_known_hierarchy(rng: np.random.Generator) -> None:
    edges, big, small = _hierarchy(rng)
    counts = _counts(edges, big.size)
    assert _splits_monotonically(counts)
    assert 2 in counts and 6 in counts
    # Same γ on both layers: the size penalty cancels (even with no negative edge, the empty
    # negative layer carries −γ·pairs), γ no longer matters and the sub-blocks never appear.
    degenerate = _counts_same_gamma_both_layers(edges, big.size)
    assert not _splits_monotonically(degenerate)
    assert max(degenerate) <= 2


def test_hierarchy_levels_match_the_plants(rng: np.random.Generator) -> None:
    edges, big, small = _hierarchy(rng)
    low = signed_leiden(edges, big.size, 0.03)[0]
    high = signed_leiden(edges, big.size, 0.4)[0]
    assert adjusted_rand_score(big, low) == 1.0
    assert adjusted_rand_score(small, high) == 1.0


def test_same_seed_same_partition(rng: np.random.Generator) -> None:
    edges, blocks = _planted(rng)
    a, ra = signed_leiden(edges, blocks.size, 0.05, seed=11)
    b, rb = signed_leiden(edges, blocks.size, 0.05, seed=11)
    np.testing.assert_array_equal(a, b)
    assert ra == rb
    pa = resolution_profile(edges, blocks.size, seed=5, max_evals=12)
    pb = resolution_profile(edges, blocks.size, seed=5, max_evals=12)
    assert pa.table.equals(pb.table)
    np.testing.assert_array_equal(pa.memberships, pb.memberships)


def test_profile_on_workers_equals_inline_and_splits_the_widest_first(rng: np.random.Generator) -> None:
    """A round's Leiden runs on two worker processes give the inline profile exactly; each
    round halves the widest splittable intervals, so the first round after the two ends
    evaluates their geometric midpoint, and the cap counts every run."""
    from depthlens.executors.local import executor

    edges, blocks = _planted(rng)
    inline = resolution_profile(edges, blocks.size, seed=5, max_evals=9)
    with executor(2) as pool:
        pooled = resolution_profile(edges, blocks.size, seed=5, max_evals=9, pool=pool)
    pd.testing.assert_frame_equal(inline.table, pooled.table, check_exact=True)
    np.testing.assert_array_equal(inline.memberships, pooled.memberships)
    gammas = inline.table["gamma"].to_numpy()
    assert len(gammas) <= 9 and gammas[0] == 1e-3 and gammas[-1] == 0.5
    assert np.any(np.isclose(gammas, np.sqrt(1e-3 * 0.5), rtol=1e-15))


def test_quality_matches_hand_and_leidenalg() -> None:
    # triangle 0-1-2 (+0.5, +0.4, −0.3), edge 2-3 (+0.2), isolated node 4
    e = Edges(i=np.array([0, 0, 1, 2]), j=np.array([1, 2, 2, 3]), weight=np.array([0.5, -0.3, 0.4, 0.2]))
    m = np.array([0, 0, 0, 1, 2])
    # inside: 0.5 − 0.3 + 0.4 = 0.6; pairs: 3 + 0 + 0 = 3
    assert signed_quality(e, 5, m, 0.1) == pytest.approx(0.6 - 0.1 * 3, abs=1e-15)
    membership, record = signed_leiden(e, 5, 0.1)
    pos = e.weight > 0
    layers = [
        la.CPMVertexPartition(
            ig.Graph(n=5, edges=list(zip(e.i[s], e.j[s]))), initial_membership=membership.tolist(),
            weights=np.abs(e.weight[s]).tolist(), resolution_parameter=g,
        )
        for s, g in ((pos, 0.1), (~pos, 0.0))
    ]
    # leidenalg counts each pair twice in a CPM layer's quality
    assert record.quality == pytest.approx((layers[0].quality() - layers[1].quality()) / 2, abs=1e-12)
    assert record.sizes == tuple(np.bincount(membership)) and record.n_communities == len(record.sizes)


def test_profile_grid_and_plateau_rule() -> None:
    edges = Edges(i=np.array([0, 2]), j=np.array([1, 3]), weight=np.array([0.9, 0.8]))
    profile = resolution_profile(edges, 4, gammas=[0.5, 0.01, 2.0, 0.1])
    assert profile.table["gamma"].tolist() == [0.01, 0.1, 0.5, 2.0]
    assert profile.table["n_communities"].tolist() == [2, 2, 2, 4]
    plateau = choose_plateau(profile)
    assert (plateau.n_communities, plateau.gamma_low, plateau.gamma_high) == (2, 0.01, 0.5)
    assert plateau.gamma == 0.1 and plateau.width == pytest.approx(np.log(50))
    # hand-made profile: plateaus 3 (width log 4) and 5 (width log 8); 1 and n are excluded
    table = pd.DataFrame(
        {"gamma": [0.001, 0.002, 0.008, 0.01, 0.02, 0.16, 0.5], "n_communities": [1, 3, 3, 4, 5, 5, 10]}
    )
    fake = ResolutionProfile(table=table, memberships=np.zeros((7, 10), dtype=np.int64), n=10, seed=0, scale="log")
    chosen = choose_plateau(fake)
    assert (chosen.n_communities, chosen.gamma_low, chosen.gamma_high, chosen.row) == (5, 0.02, 0.16, 4)


def test_bad_input_raises() -> None:
    e = Edges(i=np.array([0]), j=np.array([1]), weight=np.array([0.5]))
    with pytest.raises(InputError):
        signed_leiden(e, 1, 0.1)  # endpoint outside n
    with pytest.raises(InputError):
        signed_leiden(Edges(np.array([1]), np.array([0]), np.array([0.5])), 2, 0.1)
    with pytest.raises(InputError):
        signed_leiden(Edges(np.array([0, 0]), np.array([1, 1]), np.array([0.5, 0.2])), 2, 0.1)
    with pytest.raises(InputError):
        signed_leiden(Edges(np.array([0]), np.array([1]), np.array([0.0])), 2, 0.1)
    with pytest.raises(InputError):
        signed_leiden(e, 2, -1.0)
    with pytest.raises(InputError):
        resolution_profile(e, 2, gamma_range=(0.5, 0.1))
    with pytest.raises(InputError):
        choose_plateau(resolution_profile(e, 2, gammas=[0.01, 2.0]))  # only trivial rows


def _residual_like(rng: np.random.Generator, d: int = 200, n_obs: int = 2000) -> Edges:
    """Top-20 graph of d coordinates: d/12 latent groups with signed loadings, 3 global factors."""
    group = np.arange(d) // 12
    load = rng.uniform(0.3, 1.5, size=d) * rng.choice([-1.0, 1.0], size=d)
    X = rng.normal(size=(n_obs, group.max() + 1))[:, group] * load
    X += rng.normal(size=(n_obs, 3)) @ rng.normal(scale=0.3, size=(3, d)) + rng.normal(size=(n_obs, d))
    return topk_graph(np.corrcoef(X, rowvar=False), 20)


def _all_comms_leiden(edges: Edges, n: int, gamma: float, seed: int) -> np.ndarray:
    """METHODS B5 by hand: positive layer at γ, negative layer at 0, ALL_COMMS, iterate to no gain."""
    pos = edges.weight > 0
    parts = [
        la.CPMVertexPartition(ig.Graph(n=n, edges=list(zip(edges.i[m], edges.j[m]))),
                              weights=np.abs(edges.weight[m]).tolist(), resolution_parameter=res)
        for m, res in ((pos, gamma), (~pos, 0.0))
    ]
    opt = la.Optimiser()
    opt.consider_comms = la.ALL_COMMS
    opt.set_rng_seed(seed)
    while opt.optimise_partition_multiplex(parts, layer_weights=[1, -1], n_iterations=1) > 0:
        pass
    return np.asarray(parts[0].membership, dtype=np.int64)


def test_neighbour_scan_equals_all_communities(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The neighbour-community scan reproduces ALL_COMMS partitions, profile and plateau exactly."""
    d = 200
    edges = _residual_like(rng, d)
    for gamma in (0.0, 1e-3, 0.01, 0.05, 0.2, 0.5):
        for seed in (0, 7):
            assert np.array_equal(signed_leiden(edges, d, gamma, seed=seed)[0], _all_comms_leiden(edges, d, gamma, seed))
    new = resolution_profile(edges, d, seed=3)
    monkeypatch.setattr(communities, "_consider_comms", lambda resolution: la.ALL_COMMS)
    old = resolution_profile(edges, d, seed=3)
    pd.testing.assert_frame_equal(new.table, old.table, check_exact=True)
    assert np.array_equal(new.memberships, old.memberships)
    a, b = choose_plateau(new), choose_plateau(old)
    assert (a.gamma, a.row, a.n_communities) == (b.gamma, b.row, b.n_communities)
    assert len(new.table) > 10 and 1 < a.n_communities < d
