"""The bootstrap over chunks of the claims' funnel (METHODS B3): the replicate weights, the
resampled means against the mean of explicitly resampled chunks, the two funnel ends of many
products at once against whole curves, the per-chunk operator sums against the engine run on
each chunk alone, and the stage's extra step-0 nulls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.errors import InputError
from depthlens.jacobian import bootstrap, product
from depthlens.jacobian.bootstrap import bootstrap_weights, funnel_bootstrap, mean_of_chunks, resampled_means
from depthlens.jacobian.cumulative import cumulative_ends, cumulative_ranks
from depthlens.jacobian.engines import chunk_operator_sums, input_state, mean_operators, sublayer_jacobian_sum
from depthlens.jacobian.options import JacobianOptions, init_seed_of
from depthlens.jacobian.store import sublayer_keys_backward
from depthlens.models import init_like, load_model
from depthlens.models.hooks import SHARED_BYTES


def _ends(ops: list[np.ndarray], direction: str, rank: int | None) -> np.ndarray:
    """Erank after one step and at full depth from the whole curve of :func:`cumulative_ranks`."""
    curve = cumulative_ranks(ops, direction, rank).sort_values("steps")["erank"].to_numpy()
    return curve[[0, -1]]


def test_weights_count_draws_with_replacement() -> None:
    w = bootstrap_weights(7, 500, seed=3)
    assert w.shape == (500, 7) and w.dtype == np.int64 and (w.sum(axis=1) == 7).all() and (w >= 0).all()
    assert np.array_equal(w, bootstrap_weights(7, 500, seed=3))
    assert not np.array_equal(w, bootstrap_weights(7, 500, seed=4))
    assert np.array_equal(bootstrap_weights(7, 20, seed=3), w[:20])  # more replicates extend the same draws
    # each count is Binomial(7, 1/7): mean 1, variance 6/7
    assert abs(w.mean() - 1.0) < 1e-12 and abs(w.var() - 6 / 7) < 0.1
    assert bootstrap_weights(3, 0, seed=0).shape == (0, 3)
    for bad in ({"n_chunks": 0, "replicates": 2}, {"n_chunks": 3, "replicates": -1}, {"n_chunks": 2.0, "replicates": 1}):
        with pytest.raises(InputError):
            bootstrap_weights(seed=0, **bad)


def test_resampled_mean_is_the_mean_of_the_explicitly_resampled_chunks(rng: np.random.Generator) -> None:
    """Chunks with their own operators (here of unequal numbers): a replicate's mean is the plain
    mean of every operator of the chunks drawn, each chunk as often as it is drawn."""
    d, sizes = 5, [1, 3, 2, 4]
    tokens = [rng.standard_normal((n, d, d)) for n in sizes]
    sums = np.stack([t.sum(axis=0) for t in tokens])
    counts = np.array(sizes)
    weights = bootstrap_weights(len(sizes), 6, seed=1)
    got = list(resampled_means(sums, counts, weights))
    assert len(got) == 6
    for w, mean in zip(weights, got, strict=True):
        drawn = np.concatenate([tokens[c] for c in np.repeat(np.arange(len(sizes)), w)])
        np.testing.assert_allclose(mean, drawn.mean(axis=0), rtol=0, atol=1e-14)
    np.testing.assert_allclose(mean_of_chunks(sums, counts), np.concatenate(tokens).mean(axis=0), rtol=0, atol=1e-14)
    with pytest.raises(InputError, match="weights cover"):
        next(resampled_means(sums, counts, bootstrap_weights(3, 2, seed=0)))
    with pytest.raises(InputError, match="buffer has shape"):
        next(resampled_means(sums, counts, weights, np.empty((6, d * d + 1))))


def test_resampled_means_in_small_blocks_reuse_one_array(rng: np.random.Generator,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of two replicates (the block size patched down) written into the caller's array:
    each replicate, read before the generator moves on, is the mean of one block of one call."""
    d, C, R = 4, 3, 7
    sums, counts = rng.standard_normal((C, d, d)), np.array([2, 1, 3])
    weights = bootstrap_weights(C, R, seed=2)
    whole = [m.copy() for m in resampled_means(sums, counts, weights)]
    monkeypatch.setattr(bootstrap, "_BLOCK_BYTES", 2 * 8 * d * d)
    buffer = np.full(bootstrap.means_buffer(R, d), np.nan)
    assert buffer.shape == (2, d * d)
    for got, want, w in zip(resampled_means(sums, counts, weights, buffer), whole, weights, strict=True):
        assert np.shares_memory(got, buffer)
        np.testing.assert_allclose(got, np.tensordot(w, sums, 1) / (w @ counts), rtol=0, atol=1e-14)
        np.testing.assert_array_equal(got, want)
    with pytest.raises(InputError, match="non-negative integers"):
        next(resampled_means(sums, counts, np.ones((2, 4))))


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("rank", [None, 4])
@pytest.mark.parametrize("device", [None, "cpu"])
def test_ends_of_many_products_equal_their_curves(rng: np.random.Generator, direction: str, rank: int | None,
                                                  device: str | None) -> None:
    """Against the LAPACK curves, in NumPy and in torch (``device``: the products and SVDs of
    a GPU run, here on the CPU)."""
    d, L, R = 9, 7, 3
    products = [[np.eye(d) + rng.standard_normal((d, d)) / 2 for _ in range(L)] for _ in range(R)]
    order = range(L) if direction == "forward" else range(L - 1, -1, -1)
    ends, failures = cumulative_ends(([products[i][b] for i in range(R)] for b in order), L, direction, rank, device)
    assert ends.shape == (R, 2) and failures == [None] * R
    for i in range(R):
        np.testing.assert_allclose(ends[i], _ends(products[i], direction, rank), rtol=1e-11)
        if device is None:  # the same accumulator and scaling as the curve: its ends bit for bit
            assert np.array_equal(ends[i], _ends(products[i], direction, rank))
    threaded, _ = cumulative_ends(([products[i][b] for i in range(R)] for b in order), L, direction, rank, device,
                                  threads=2)
    assert np.array_equal(threaded, ends)  # each product computed as alone, whichever thread runs it
    one, _ = cumulative_ends([[products[0][0]]], 1, direction, rank)  # one step: both ends the same
    np.testing.assert_allclose(one[0], _ends(products[0][:1], direction, rank)[[0, 0]], rtol=1e-12)


def test_ends_of_huge_products_keep_their_ranks(rng: np.random.Generator) -> None:
    """60 factors of norm about 1e8: the unmeasured steps rescale by the largest entry, so
    nothing overflows and the ranks equal the curve's."""
    ops = [1e8 * (np.eye(6) + rng.standard_normal((6, 6)) / 3) for _ in range(60)]
    ends, _ = cumulative_ends(([J] for J in reversed(ops)), 60, "backward", 3)
    np.testing.assert_allclose(ends[0], _ends(ops, "backward", 3), rtol=1e-10)


def test_ends_run_blas_one_thread_a_call_and_catch_non_finite_products(rng: np.random.Generator,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """While the products advance, NumPy's BLAS runs one thread per call (so the bits depend on
    no thread count); ``checked`` skips the per-operator check, and a non-finite product still
    raises, real or complex."""
    from threadpoolctl import threadpool_info, threadpool_limits

    seen: list[int] = []
    push = product.RunningProduct.push

    def spy(self, J, measure=True):
        seen.extend(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")
        return push(self, J, measure)

    monkeypatch.setattr(product.RunningProduct, "push", spy)
    ops = [np.eye(4) + rng.standard_normal((4, 4)) / 3 for _ in range(3)]
    with threadpool_limits(2, user_api="blas"):  # two BLAS threads outside, whatever the machine's setting
        ends, _ = cumulative_ends(([J] for J in ops), 3, threads=2)
        outside = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    assert seen and set(seen) == {1} and outside == {2}
    checked, _ = cumulative_ends(([J] for J in ops), 3, checked=True)
    assert np.array_equal(checked, ends)
    bad = [ops[0], np.full((4, 4), np.nan), ops[2]]
    with pytest.raises(InputError, match=r"steps\[1\]\[0\] has a non-finite entry"):
        cumulative_ends(([J] for J in bad), 3)
    for dtype in (np.float64, np.complex128):
        with pytest.raises(InputError, match="overflowed"):
            cumulative_ends(([J.astype(dtype)] for J in bad), 3, checked=True)
    for x in (rng.standard_normal((5, 3)), rng.standard_normal((5, 3)) + 1j * rng.standard_normal((5, 3))):
        assert product._peak(x) == np.abs(x).max()
        for value in (np.nan, np.inf, -np.inf):
            y = x.copy()
            y[2, 1] = value
            assert not np.isfinite(product._peak(y))


def test_bootstrap_names_a_sub_layer_with_a_non_finite_chunk_sum(rng: np.random.Generator) -> None:
    sums = [rng.standard_normal((3, 4, 4)) for _ in range(2)]
    sums[1][2, 0, 3] = np.inf
    with pytest.raises(InputError, match=r"chunk sums of \(0, 'attn'\) has a non-finite entry"):
        funnel_bootstrap((((1 - b, kind), S, np.ones(3)) for b, (kind, S) in enumerate(zip(("mlp", "attn"), sums))),
                         bootstrap_weights(3, 4, seed=0), 2)


def test_ends_refuse_bad_steps(rng: np.random.Generator) -> None:
    J = np.eye(3)
    for steps, n, match in (([[J]], 2, "holds 1 steps"), ([[J], [J]], 1, "more than n_steps"),
                            ([[J, J], [J]], 2, "holds 1 operators"), ([[J], [J, J]], 2, "more operators than"),
                            ([[J], [np.eye(4)]], 2, "one size"), ([[J]], 0, "n_steps is 0"), ([[]], 1, "holds 0")):
        with pytest.raises(InputError, match=match):
            cumulative_ends(steps, n)
    with pytest.raises(InputError, match="direction"):
        cumulative_ends([[J]], 1, "sideways")
    with pytest.raises(InputError, match="threads is 0"):
        cumulative_ends([[J]], 1, threads=0)


@pytest.mark.parametrize("rank", [None, 3])
def test_bootstrap_replicates_are_the_funnels_of_the_resampled_means(rng: np.random.Generator, rank: int | None
                                                                      ) -> None:
    """Replicate 0 is the funnel of the point means (which go to ``out``); replicate k that of
    the means of the chunks replicate k draws, computed here chunk by explicit chunk."""
    d, L, C = 6, 5, 4
    tokens = [[rng.standard_normal((2, d, d)) / 3 + np.eye(d) for _ in range(C)] for _ in range(L)]  # [op][chunk]
    sums = [np.stack([t.sum(axis=0) for t in op]) for op in tokens]
    counts = np.full(C, 2)
    weights = bootstrap_weights(C, 5, seed=9)
    out = {b: np.zeros((d, d)) for b in range(L)}
    table = funnel_bootstrap(((b, sums[b], counts) for b in reversed(range(L))), weights, L, rank, out=out)
    assert table["replicate"].tolist() == list(range(6)) and table["failure"].isna().all()
    point = [np.concatenate(op).mean(axis=0) for op in tokens]
    for b in range(L):
        np.testing.assert_allclose(out[b], point[b], rtol=0, atol=1e-14)
    got = table[["erank_one_step", "erank_full_depth"]].to_numpy()
    np.testing.assert_allclose(got[0], _ends(point, "backward", rank), rtol=1e-11)
    for k, w in enumerate(weights, start=1):
        drawn = np.repeat(np.arange(C), w)
        means = [np.concatenate([op[c] for c in drawn]).mean(axis=0) for op in tokens]
        np.testing.assert_allclose(got[k], _ends(means, "backward", rank), rtol=1e-11)


def test_boot_table_reads_the_next_sums_ahead_with_the_same_bits(rng: np.random.Generator, monkeypatch) -> None:
    """Under the read-ahead budget the next sub-layer's sums are produced in another thread
    while the replicates use the current one; over it, in the caller's thread; the table is
    bit for bit the same, and :func:`funnel_bootstrap`'s on the same sums."""
    import threading

    from depthlens.jacobian import store

    d, L, C = 7, 6, 5
    sums = [rng.standard_normal((C, d, d)) / 3 + np.eye(d) for _ in range(L)]
    weights = bootstrap_weights(C, 8, seed=4)
    opts = JacobianOptions(funnel_rank=4)
    threads: list[int] = []

    def produced():
        for b in reversed(range(L)):
            threads.append(threading.get_ident())
            yield b, sums[b], np.ones(C)

    tables = {}
    for budget in (C * d * d * 8, C * d * d * 8 - 1):
        monkeypatch.setattr(store, "READ_AHEAD_BYTES", budget)
        threads.clear()
        tables[budget] = store.boot_table(produced(), weights, L, d, opts, None, 2)
        ahead = budget == C * d * d * 8
        assert len(set(threads)) == 1 and (threads[0] != threading.get_ident()) == ahead
    first, second = tables.values()
    direct = funnel_bootstrap(((b, sums[b], np.ones(C)) for b in reversed(range(L))), weights, L, 4)
    for column in ("erank_one_step", "erank_full_depth"):
        assert np.array_equal(first[column].to_numpy(), second[column].to_numpy())
        assert np.array_equal(first[column].to_numpy(), direct[column].to_numpy())
    assert (first["truncation"] == 4).all() and first["failure"].isna().all()


@pytest.fixture(scope="module")
def llama():
    ad = load_model("random:llama").adapter
    return ad, torch.randint(0, 256, (5, 8), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("mode", ["isolated", "in_context"])
@pytest.mark.parametrize("positions", ["last", "all", [2, -1]])
def test_chunk_sums_are_the_engine_on_each_chunk_alone(llama, mode: str, positions) -> None:
    """Kept states trimmed to the selected positions (isolated) or whole (in context): each
    chunk's sum is the engine's on that chunk's own full states, bit for bit, and their mean is
    :func:`mean_operators` to rounding."""
    ad, ids = llama
    keys = sublayer_keys_backward(ad.n_layers)
    got = list(chunk_operator_sums(ad, ids, keys, mode, positions, batch_size=2))
    assert [k for k, _, _ in got] == keys == [(1, "mlp"), (1, "attn"), (0, "mlp"), (0, "attn")]
    hs = torch.cat([ad.residual_states(ids[s : s + 2]) for s in range(0, 5, 2)], dim=1)  # the same float32 passes
    means = mean_operators(ad, ids, jacobian_mode=mode, positions=positions, batch_size=2)
    for (layer, kind), sums, counts in got:
        assert sums.shape == (5, ad.d_model, ad.d_model) and sums.dtype == np.float64
        for c in range(5):
            total, count = sublayer_jacobian_sum(ad, hs[input_state(ad, layer, kind, mode)][c : c + 1], layer, kind,
                                                 mode, positions)
            assert np.array_equal(sums[c], total.numpy()) and counts[c] == count
        np.testing.assert_allclose(mean_of_chunks(sums, counts), means[(layer, kind)], rtol=0,
                                   atol=1e-13 * np.abs(means[(layer, kind)]).max())


def test_modes_inside_shared_passes_share_their_forward_passes(llama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The isolated chunk sums then the in-context means inside one block: the second mode runs
    no forward pass and every number is bit for bit the unshared one; a budget too small keeps
    nothing; nothing outlives the block."""
    ad, ids = llama
    keys = sublayer_keys_backward(ad.n_layers)
    alone = ([S for _, S, _ in chunk_operator_sums(ad, ids, keys, "isolated", "last", batch_size=2)],
             mean_operators(ad, ids, jacobian_mode="in_context", positions="all", batch_size=2))
    passes: list[int] = []
    forward = type(ad)._residual_states
    monkeypatch.setattr(type(ad), "_residual_states", lambda self, x: passes.append(len(x)) or forward(self, x))
    for budget, want in ((SHARED_BYTES, [2, 2, 1]), (0, [2, 2, 1] * 2)):
        passes.clear()
        with ad.shared_passes(budget):
            sums = [S for _, S, _ in chunk_operator_sums(ad, ids, keys, "isolated", "last", batch_size=2)]
            means = mean_operators(ad, ids, jacobian_mode="in_context", positions="all", batch_size=2)
        assert passes == want
        assert all(np.array_equal(a, b) for a, b in zip(sums, alone[0], strict=True))
        assert all(np.array_equal(means[k], alone[1][k]) for k in alone[1])
    passes.clear()
    mean_operators(ad, ids, jacobian_mode="in_context", positions="all", batch_size=2)
    assert passes == [2, 2, 1]  # the block's states went with it


def test_chunk_sums_refuse_bad_input(llama) -> None:
    ad, ids = llama
    for kwargs, match in (({"keys": []}, "keys is empty"), ({"keys": [(5, "attn")]}, "layer"),
                          ({"keys": [(0, "ffn")]}, "ffn"), ({"keys": [(0, "attn")], "batch_size": 0}, "batch_size"),
                          ({"keys": [(0, "attn")], "positions": "middle"}, "positions")):
        with pytest.raises(InputError, match=match):
            next(chunk_operator_sums(ad, ids, **kwargs))


def test_extra_step0_nulls_are_distinct_initialisations() -> None:
    """The nulls of run seeds seed, seed + 1, seed + 2 are three different draws of the same
    architecture; the first is the stage's ``init`` checkpoint."""
    loaded = load_model("random:llama")
    assert JacobianOptions(seed=5).init_seed == init_seed_of(5)
    seeds = [init_seed_of(5 + k) for k in range(3)]
    assert len(set(seeds)) == 3
    weights = [init_like(loaded, seed=s).adapter.layer_weights(0).Wg for s in seeds]
    assert all(w.shape == weights[0].shape for w in weights)
    assert not any(torch.equal(weights[i], weights[j]) for i in range(3) for j in range(i + 1, 3))
    assert torch.equal(weights[0], init_like(loaded, seed=seeds[0]).adapter.layer_weights(0).Wg)
