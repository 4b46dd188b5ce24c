"""RunningMoments against numpy.corrcoef / numpy.cov; topk_graph against a brute-force loop."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.errors import InputError
from depthlens.topology import Edges, RunningMoments, topk_graph


def _stream(X: np.ndarray, cuts: list[int]) -> RunningMoments:
    rm = RunningMoments(X.shape[1])
    for a, b in zip([0, *cuts], [*cuts, X.shape[0]]):
        rm.update(X[a:b])
    return rm


def _mixed(rng: np.random.Generator, n: int = 300, d: int = 7) -> np.ndarray:
    return rng.normal(size=(n, 3)) @ rng.normal(size=(3, d)) + rng.normal(size=(n, d))


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(0, 300), max_size=6).map(sorted))
def test_matches_corrcoef_for_any_batch_split(cuts: list[int]) -> None:
    X = _mixed(np.random.default_rng(1))
    rm = _stream(X, cuts)
    assert rm.count == 300
    np.testing.assert_allclose(rm.mean, X.mean(axis=0), rtol=0, atol=1e-13)
    np.testing.assert_allclose(rm.covariance(), np.cov(X, rowvar=False), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rm.correlation(), np.corrcoef(X, rowvar=False), rtol=0, atol=1e-12)


def test_many_batches_of_a_wide_matrix_match_corrcoef(rng: np.random.Generator) -> None:
    # d above the BLAS block sizes, uneven batches: the in-place dsyrk/dsyr updates of the
    # upper triangle against the two-pass float64 reference, to the documented 1e-12.
    X = rng.normal(size=(700, 4)) @ rng.normal(size=(4, 150)) + rng.normal(size=(700, 150)) + 3.0
    rm = _stream(X, [1, 2, 50, 51, *range(100, 700, 37)])
    np.testing.assert_allclose(rm.covariance(ddof=0), np.cov(X, rowvar=False, ddof=0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rm.correlation(), np.corrcoef(X, rowvar=False), rtol=0, atol=1e-12)


def test_covariance_and_correlation_are_exactly_symmetric(rng: np.random.Generator) -> None:
    X = _mixed(rng, n=120, d=40) * rng.uniform(0.1, 10.0, size=40)
    rm = _stream(X, [7, 64])
    for M in (rm.covariance(), rm.correlation()):
        np.testing.assert_array_equal(M, M.T)


def test_large_offset_costs_no_accuracy(rng: np.random.Generator) -> None:
    X = _mixed(rng, n=2000, d=6) + 1e6
    rm = _stream(X, list(range(100, 2000, 100)))
    np.testing.assert_allclose(rm.correlation(), np.corrcoef(X, rowvar=False), rtol=0, atol=1e-12)
    # The naive one-pass formula Σx² − n·mean² loses most digits at this offset.
    naive = (X.T @ X - X.shape[0] * np.outer(X.mean(0), X.mean(0))) / (X.shape[0] - 1)
    assert np.max(np.abs(naive - np.cov(X, rowvar=False))) > 1e-6


def test_float32_batches_accumulate_in_float64(rng: np.random.Generator) -> None:
    X = _mixed(rng).astype(np.float32)
    rm = _stream(X, [50, 51, 200])
    np.testing.assert_allclose(rm.correlation(), np.corrcoef(X.astype(np.float64), rowvar=False), rtol=0, atol=1e-12)


def test_constant_columns_have_zero_correlation_not_nan(rng: np.random.Generator) -> None:
    X = _mixed(rng, n=100, d=5)
    X[:, 1] = 0.1  # its batch means are rounded, so only an exact test catches it
    X[:, 3] = -7.0
    rm = _stream(X, [33, 66])
    R = rm.correlation()
    assert not np.isnan(R).any()
    np.testing.assert_array_equal(rm.constant, [False, True, False, True, False])
    np.testing.assert_array_equal(R[1], np.eye(5)[1])
    np.testing.assert_array_equal(rm.covariance()[:, 3], 0.0)
    keep = [0, 2, 4]
    np.testing.assert_allclose(R[np.ix_(keep, keep)], np.corrcoef(X[:, keep], rowvar=False), rtol=0, atol=1e-12)


def test_bad_input_raises() -> None:
    rm = RunningMoments(3)
    with pytest.raises(InputError):
        rm.update(np.ones((4, 2)))
    with pytest.raises(InputError):
        rm.update(np.array([[1.0, np.nan, 0.0]]))
    rm.update(np.ones((1, 3)))
    with pytest.raises(InputError):
        rm.correlation()
    with pytest.raises(InputError):
        RunningMoments(0)


def _brute_topk(R: np.ndarray, k: int) -> set[tuple[int, int]]:
    d = R.shape[0]
    pairs = set()
    for i in range(d):
        others = [j for j in range(d) if j != i]
        others.sort(key=lambda j: (-abs(R[i, j]), j))
        for j in others[:k]:
            if R[i, j] != 0.0:
                pairs.add((min(i, j), max(i, j)))
    return pairs


@pytest.mark.parametrize("k", [1, 3, 8, 40])
def test_topk_matches_brute_force(rng: np.random.Generator, k: int) -> None:
    R = np.corrcoef(_mixed(rng, n=60, d=30), rowvar=False)
    e = topk_graph(R, k)
    got = list(zip(e.i.tolist(), e.j.tolist()))
    assert got == sorted(_brute_topk(R, k))
    np.testing.assert_array_equal(e.weight, [R[i, j] for i, j in got])


def test_topk_ties_break_to_smaller_index() -> None:
    R = np.eye(5)
    R[0, 1:] = R[1:, 0] = [0.5, -0.5, 0.5, 0.2]
    e = topk_graph(R, 1)
    # node 0 nominates 1 (tie with 2 and 3); nodes 1, 2, 3, 4 nominate 0; zeros carry no edge.
    assert list(zip(e.i, e.j)) == [(0, 1), (0, 2), (0, 3), (0, 4)]
    assert sorted(_brute_topk(R, 1)) == list(zip(e.i.tolist(), e.j.tolist()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), levels=st.integers(1, 6), k=st.integers(1, 12), zero_rows=st.integers(0, 3))
def test_topk_ties_match_brute_force(seed: int, levels: int, k: int, zero_rows: int) -> None:
    # A few distinct |R| values, so ties straddle the k-th place in most rows; rows of
    # zeros stand for constant columns (all their entries tie and none is an edge).
    rng = np.random.default_rng(seed)
    d = 15
    R = np.triu(rng.integers(-levels, levels + 1, size=(d, d)) / levels, 1)
    R = R + R.T
    R[:zero_rows, :] = R[:, :zero_rows] = 0.0
    np.fill_diagonal(R, 1.0)
    e = topk_graph(R, k)
    got = list(zip(e.i.tolist(), e.j.tolist()))
    assert got == sorted(_brute_topk(R, k))
    np.testing.assert_array_equal(e.weight, [R[i, j] for i, j in got])
    assert e.i.dtype == e.j.dtype == np.int64


def test_topk_rejects_bad_input() -> None:
    with pytest.raises(InputError):
        topk_graph(np.array([[1.0, 0.5], [0.2, 1.0]]))
    with pytest.raises(InputError):
        topk_graph(np.eye(3), k=0)
    with pytest.raises(InputError):
        topk_graph(np.ones((2, 3)))
    assert isinstance(topk_graph(np.eye(1)), Edges)


def test_boundary_moments_in_a_memory_mapped_file_are_the_same(tmp_path):
    """The co-moments of every boundary kept in a scratch .npy file (as the topology stage
    does, so 65 boundaries of width 4096 need not fit in memory) give the in-memory
    correlations bit for bit, and the file is what holds them."""
    import torch

    from depthlens.models import load_model
    from depthlens.topology.options import TopologyOptions
    from depthlens.stages.topology import boundary_moments

    adapter = load_model("random:llama").adapter
    ids = torch.randint(0, 256, (5, 12), generator=torch.Generator().manual_seed(2))
    opts = TopologyOptions()
    plain, massive = boundary_moments(adapter, ids, opts, batch_size=2, quiet=True)
    spilled, massive2 = boundary_moments(adapter, ids, opts, batch_size=2, quiet=True, scratch=tmp_path / "m.npy")
    backing = np.load(tmp_path / "m.npy", mmap_mode="r")
    assert backing.shape == (len(plain), adapter.d_model, adapter.d_model) and backing.any()
    assert np.array_equal(massive, massive2)
    for a, b in zip(plain, spilled, strict=True):
        assert np.array_equal(a.correlation(), b.correlation())
    with pytest.raises(InputError, match="Fortran-ordered"):
        RunningMoments(4, out=np.zeros((4, 4)))


def test_boundary_moments_on_threads_are_the_correlations_of_the_states():
    """Batches read ahead and boundaries updated on two threads: the same moments bit for bit
    as on one thread, and the Pearson correlations (numpy's) and massive dimensions of the
    residual states of all chunks at once, at every boundary."""
    import torch

    from depthlens.models import load_model
    from depthlens.residual import massive_mask
    from depthlens.stages.topology import boundary_moments
    from depthlens.topology.options import TopologyOptions

    adapter = load_model("random:llama").adapter
    ids = torch.randint(0, 256, (5, 12), generator=torch.Generator().manual_seed(3))
    opts = TopologyOptions(skip_positions=2)
    one, massive = boundary_moments(adapter, ids, opts, batch_size=2, quiet=True)
    two, massive2 = boundary_moments(adapter, ids, opts, batch_size=2, quiet=True, threads=2)
    assert np.array_equal(massive, massive2)
    states = adapter.residual_states(ids).to(torch.float64).numpy()
    assert len(one) == states.shape[0] - 1
    for b, (a, c) in enumerate(zip(one, two, strict=True)):
        assert np.array_equal(a.correlation(), c.correlation())
        X = states[b, :, opts.skip_positions :].reshape(-1, adapter.d_model)
        np.testing.assert_allclose(c.correlation(), np.corrcoef(X.T), rtol=0, atol=1e-9)
        assert np.array_equal(massive[b], np.any([massive_mask(h).any(axis=0) for h in states[b]], axis=0))
