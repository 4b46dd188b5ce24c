"""Participation, boundary nodes, amplification, rank-biserial effect, permutation test, FDR table."""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy import stats

from depthlens.errors import InputError
from depthlens.topology import (
    Edges,
    amplification,
    boundary_nodes,
    coupling_table,
    participation_coefficient,
    permutation_pvalue,
    rank_biserial,
)

# communities A = {0, 1, 2}, B = {3, 4, 5}, {6} isolated, {7} with a negative edge only
SMALL = Edges(
    i=np.array([0, 0, 0, 0, 1, 2, 3, 4]),
    j=np.array([1, 2, 3, 7, 5, 4, 4, 5]),
    weight=np.array([0.5, 0.25, 0.25, -0.5, 0.5, -0.6, 0.75, 0.25]),
)
SMALL_MEMBERSHIP = np.array([0, 0, 0, 1, 1, 1, 2, 3])


def test_participation_matches_hand_computation() -> None:
    pc = participation_coefficient(SMALL, 8, SMALL_MEMBERSHIP)
    expected = [
        0.375,  # 0: k = 1, A 0.75, B 0.25 (negative edge to 7 ignored): 1 − 0.5625 − 0.0625
        0.5,  # 1: k = 1, A 0.5, B 0.5
        0.0,  # 2: only positive edge into A (−0.6 to node 4 ignored)
        0.375,  # 3: k = 1, A 0.25, B 0.75
        0.0,  # 4: all positive strength into B
        4 / 9,  # 5: k = 0.75, A 0.5, B 0.25: 1 − 4/9 − 1/9
        0.0,  # 6: isolated
        0.0,  # 7: negative edge only
    ]
    np.testing.assert_allclose(pc, expected, rtol=0, atol=1e-15)


def test_boundary_nodes_quantile_and_ties() -> None:
    pc = np.array([0.375, 0.5, 0.0, 0.375, 0.0, 4 / 9, 0.0, 0.0])
    assert np.flatnonzero(boundary_nodes(pc)).tolist() == [1, 5]  # top 2 of 8
    assert np.flatnonzero(boundary_nodes(pc, 0.6)).tolist() == [0, 1, 3, 5]  # 4th largest tied with 3rd
    assert np.flatnonzero(boundary_nodes(pc, 0.4)).tolist() == [0, 1, 3, 5]  # pc = 0 is never boundary
    perm = np.array([3, 7, 0, 5, 1, 6, 2, 4])
    np.testing.assert_array_equal(boundary_nodes(pc[perm]), boundary_nodes(pc)[perm])
    with pytest.raises(InputError):
        boundary_nodes(pc, 1.0)


def test_amplification_kinds(rng: np.random.Generator) -> None:
    J = rng.normal(size=(6, 6))
    np.testing.assert_allclose(amplification(J), [np.sqrt(np.sum(J[:, i] ** 2)) for i in range(6)], rtol=1e-14)
    np.testing.assert_allclose(amplification(J, "row"), [np.sqrt(np.sum(J[i] ** 2)) for i in range(6)], rtol=1e-14)
    np.testing.assert_array_equal(amplification(J, "diagonal"), [abs(J[i, i]) for i in range(6)])
    with pytest.raises(InputError):
        amplification(J, "trace")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        amplification(J[:, :5])


@pytest.mark.parametrize("ties", [False, True])
def test_rank_biserial_matches_mannwhitneyu(rng: np.random.Generator, ties: bool) -> None:
    for _ in range(20):
        n1, n0 = rng.integers(1, 30, size=2)
        x = rng.integers(0, 5, size=n1) if ties else rng.normal(size=n1)
        y = rng.integers(0, 5, size=n0) if ties else rng.normal(size=n0) + 0.3
        u = stats.mannwhitneyu(x, y).statistic
        assert rank_biserial(x, y) == pytest.approx(2 * u / (n1 * n0) - 1, abs=1e-14)
    assert rank_biserial([3.0, 4.0], [1.0, 2.0]) == 1.0
    assert rank_biserial([1.0], [1.0]) == 0.0


def _slow_pvalue(values: np.ndarray, labels: np.ndarray, n_perm: int, rng: np.random.Generator) -> float:
    n1, n0 = labels.sum(), (~labels).sum()

    def dev(lab: np.ndarray) -> float:
        return abs(stats.mannwhitneyu(values[lab], values[~lab]).statistic - n1 * n0 / 2)

    observed = dev(labels)
    hits = sum(dev(rng.permutation(labels)) >= observed for _ in range(n_perm))
    return (1 + hits) / (1 + n_perm)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_permutation_pvalue_matches_slow_loop(seed: int) -> None:
    gen = np.random.default_rng(100 + seed)
    values = gen.integers(0, 6, size=14).astype(float)  # many ties
    labels = np.zeros(14, dtype=bool)
    labels[gen.choice(14, size=4, replace=False)] = True
    values[labels] += seed  # from no effect to a clear one
    fast = permutation_pvalue(values, labels, 300, np.random.default_rng(seed))
    slow = _slow_pvalue(values, labels, 300, np.random.default_rng(seed))
    assert fast == slow


def test_permutation_pvalue_bad_input() -> None:
    with pytest.raises(InputError):
        permutation_pvalue([1.0, 2.0], [True, True])
    with pytest.raises(InputError):
        permutation_pvalue([1.0, 2.0, 3.0], [True, False])
    with pytest.raises(InputError):
        permutation_pvalue([1.0, 2.0], [1, 0])
    with pytest.raises(InputError):
        permutation_pvalue([1.0, 2.0], [True, False], n_perm=0)


def _layers(rng: np.random.Generator, n_layers: int, d: int, shift: float = 0.0) -> dict[int, tuple]:
    out = {}
    for layer in range(n_layers):
        boundary = rng.random(d) < 0.25
        out[layer] = (rng.lognormal(size=d) + shift * boundary, boundary)
    return out


def test_coupling_table_is_calibrated_under_the_null() -> None:
    layers = _layers(np.random.default_rng(7), 200, 200)
    start = time.perf_counter()
    table, record = coupling_table(layers, n_perm=500, seed=1)
    assert time.perf_counter() - start < 10.0
    assert len(table) == 200 and record.n_perm == 500
    assert (table["q"] <= 0.05).sum() <= 6  # at most 3 % of layers
    assert stats.kstest(table["p"], "uniform").pvalue > 0.01


def test_coupling_table_numbers_and_seeds() -> None:
    layers = _layers(np.random.default_rng(8), 6, 80, shift=1.5)
    table, record = coupling_table(layers, n_perm=200, seed=4)
    assert table["layer"].tolist() == list(range(6))
    assert list(table.columns) == ["layer", "effect", "p", "q", "sign", "n_boundary_nodes", "n_interior_nodes"]
    children = np.random.SeedSequence(4).spawn(6)
    for row in table.itertuples():
        values, boundary = layers[row.layer]
        assert row.effect == pytest.approx(rank_biserial(values[boundary], values[~boundary]), abs=1e-14)
        assert row.p == permutation_pvalue(values, boundary, 200, np.random.default_rng(children[row.layer]))
        assert row.sign == np.sign(row.effect) and row.n_boundary_nodes == boundary.sum()
        assert row.n_interior_nodes == (~boundary).sum()
        assert record.spawn_keys[row.layer] == (row.layer,)
    np.testing.assert_allclose(table["q"], stats.false_discovery_control(table["p"]), rtol=1e-12)
    assert (table["effect"] > 0).all() and (table["q"] < 0.05).all()
    # order and presence of other layers do not change a layer's result
    subset, _ = coupling_table({5: layers[5], 2: layers[2]}, n_perm=200, seed=4)
    assert subset["layer"].tolist() == [2, 5]
    np.testing.assert_array_equal(subset["p"], table["p"].to_numpy()[[2, 5]])


def test_coupling_table_bad_input() -> None:
    with pytest.raises(InputError):
        coupling_table({-1: (np.ones(3), np.array([True, False, False]))})
    with pytest.raises(InputError, match="layer 0"):
        coupling_table({0: (np.ones(3), np.array([True, True, True]))})
