"""Where the funnel bootstrap stops short: a single chunk, which has nothing to resample, and the
running products beyond a memory budget, which wait on disk with the same numbers."""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens.cli import main
from depthlens.errors import InputError
from depthlens.jacobian import bootstrap, product, store
from depthlens.jacobian.bootstrap import MIN_CHUNKS, bootstrap_weights, funnel_bootstrap, skip_reason
from depthlens.jacobian.cumulative import cumulative_ends, cumulative_ranks
from depthlens.jacobian.engines import chunk_operator_sums
from depthlens.jacobian.options import JacobianOptions
from depthlens.jacobian.store import sublayer_keys_backward
from depthlens.models import load_model

TEXT = " ".join(f"Line {i} of a text about subject {i % 11}, with detail {i % 3}." for i in range(200))


def _ends(ops: list[np.ndarray], rank: int | None) -> np.ndarray:
    """Erank after one step and at full depth of the backward curve of :func:`cumulative_ranks`."""
    return cumulative_ranks(ops, "backward", rank).sort_values("steps")["erank"].to_numpy()[[0, -1]]


def test_one_chunk_is_its_only_resample_and_two_are_the_minimum(rng: np.random.Generator) -> None:
    """The distinct resamples of n chunks (multisets of n draws) counted one by one against
    C(2n − 1, n); over one chunk every replicate is the point estimate (a zero-width interval),
    over two they differ."""
    for n, want in zip(range(1, 6), (1, 3, 10, 35, 126), strict=True):
        assert sum(1 for _ in itertools.combinations_with_replacement(range(n), n)) == want == math.comb(2 * n - 1, n)
    assert MIN_CHUNKS == 2
    reason = skip_reason(1)
    assert reason is not None and "--chunks 2" in reason and "\n" not in reason
    assert skip_reason(2) is None and skip_reason(np.int64(40)) is None
    for bad in (0, -1, True, 1.0):
        with pytest.raises(InputError, match="n_chunks"):
            skip_reason(bad)
    d, L = 4, 3
    for C, spread in ((1, False), (2, True)):
        sums = [rng.standard_normal((C, d, d)) / 3 + np.eye(d) for _ in range(L)]
        table = funnel_bootstrap(((b, sums[b], np.ones(C)) for b in reversed(range(L))),
                                 bootstrap_weights(C, 6, seed=1), L, None)
        values = table[["erank_one_step", "erank_full_depth"]].to_numpy()
        assert (np.ptp(values, axis=0) > 0).any() == spread


def test_boot_table_over_one_chunk_holds_the_point_estimate_alone(rng: np.random.Generator) -> None:
    """Fifty replicates asked for over one chunk: replicate 0 alone, the ends of the backward
    curve of the point means (which still go to ``out``); over two chunks every replicate."""
    d, L = 5, 4
    opts = JacobianOptions(funnel_rank=3)
    for C, replicates in ((1, [0]), (2, list(range(51)))):
        sums = [rng.standard_normal((C, d, d)) / 3 + np.eye(d) for _ in range(L)]
        counts = np.arange(1, C + 1)
        out = {b: np.zeros((d, d)) for b in range(L)}
        table = store.boot_table(((b, sums[b], counts) for b in reversed(range(L))), bootstrap_weights(C, 50, seed=0),
                                 L, d, opts, None, 1, out=out)
        assert table["replicate"].tolist() == replicates and (table["truncation"] == 3).all()
        assert table["failure"].isna().all()
        point = [S.sum(axis=0) / counts.sum() for S in sums]
        for b in range(L):
            np.testing.assert_allclose(out[b], point[b], rtol=0, atol=1e-15)
        np.testing.assert_allclose(table.loc[0, ["erank_one_step", "erank_full_depth"]].to_numpy(dtype=float),
                                   _ends(point, 3), rtol=1e-12)


def _count_in_memory(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[Path]]:
    """Spy on :class:`~depthlens.jacobian.product.RunningProduct`: per push, the factors in
    memory while it runs (every product's held factor, the one it reads back if parked, and the
    new product it forms), and every file a product is parked in."""
    made: list[product.RunningProduct] = []
    peaks: list[int] = []
    parked: list[Path] = []
    init, push, park = product.RunningProduct.__init__, product.RunningProduct.push, product.RunningProduct.park

    def spy_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    def spy_push(self, J, measure=True):
        held = sum(acc.factor is not None for acc in made)
        peaks.append(held + (self.parked is not None) + 1)
        return push(self, J, measure)

    def spy_park(self, path):
        parked.append(path)
        return park(self, path)

    monkeypatch.setattr(product.RunningProduct, "__init__", spy_init)
    monkeypatch.setattr(product.RunningProduct, "push", spy_push)
    monkeypatch.setattr(product.RunningProduct, "park", spy_park)
    return peaks, parked


def test_products_beyond_the_budget_wait_on_disk(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """Nine products of four steps, one thread, a budget of five factors: three stay in memory
    (five less the two of the product in flight), the other six are parked after each of their
    first three steps, at most five factors are ever in memory (nine and the new one without a
    budget), and the scratch folder goes at the end."""
    d, L, R, rank = 6, 4, 9, 2
    each = d * rank * 8
    products = [[np.eye(d) + rng.standard_normal((d, d)) / 2 for _ in range(L)] for _ in range(R)]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    peaks, parked = _count_in_memory(monkeypatch)
    steps = ([products[i][b] for i in range(R)] for b in range(L))
    free, _ = cumulative_ends(steps, L, "forward", rank)
    assert max(peaks) == R + 1 and not parked
    peaks.clear()
    steps = ([products[i][b] for i in range(R)] for b in range(L))
    bounded, _ = cumulative_ends(steps, L, "forward", rank, held_bytes=5 * each + each - 1)
    assert max(peaks) == 5 and len(peaks) == R * L
    assert len(parked) == (R - 3) * (L - 1) and {p.name for p in parked} == {f"{i:04d}.npy" for i in range(3, R)}
    assert np.array_equal(bounded, free) and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("rank", [None, 3])
@pytest.mark.parametrize("device", [None, "cpu"])
def test_parked_products_give_the_same_bits(rng: np.random.Generator, direction: str, rank: int | None,
                                            device: str | None) -> None:
    """Every budget (everything parked, some products held, no budget) and one or two threads:
    the ends and failures bit for bit those of the products all held in memory."""
    d, L, R = 7, 5, 6
    products = [[np.eye(d) + rng.standard_normal((d, d)) / 2 for _ in range(L)] for _ in range(R)]
    order = range(L) if direction == "forward" else range(L - 1, -1, -1)

    def ends(**kwargs):
        return cumulative_ends(([products[i][b] for i in range(R)] for b in order), L, direction, rank, device,
                               **kwargs)

    want, failures = ends()
    each = d * min(rank or d, d) * 8
    for threads, held_bytes in itertools.product((1, 2), (0, 6 * each, None)):
        got, got_failures = ends(threads=threads, held_bytes=held_bytes)
        assert np.array_equal(got, want) and got_failures == failures == [None] * R


def test_the_memory_plan_at_the_8b_width() -> None:
    """The memory plan of docs/guide/usage.md at d = 4096: a rank-512 product 16 MiB, an exact one 128 MiB, 1 GiB
    of them held, and a block of replicate means of 256 MiB (two at a time)."""
    d, mib = 4096, 1 << 20
    assert (d * 512 * 8, d * d * 8) == (16 * mib, 128 * mib) and bootstrap.HELD_BYTES == 1024 * mib
    rows, width = bootstrap.means_buffer(51, d)
    assert (rows, width * 8 * rows) == (2, 256 * mib)


def test_held_bytes_and_park_refuse_bad_input() -> None:
    J = np.eye(3)
    for bad in (-1, 1.5, True):
        with pytest.raises(InputError, match="held_bytes"):
            cumulative_ends([[J]], 1, held_bytes=bad)
    with pytest.raises(InputError, match="no factor in memory to park"):
        product.RunningProduct(3).park(Path("unused.npy"))


@pytest.fixture(scope="module")
def model_sums() -> tuple[list, int, int]:
    """The isolated per-chunk operator sums of a three-layer random Llama over five chunks, from
    the last sub-layer down, with the model width and the number of sub-layers."""
    ad = load_model("random:llama:num_hidden_layers=3").adapter
    ids = torch.randint(0, 256, (5, 8), generator=torch.Generator().manual_seed(3))
    keys = sublayer_keys_backward(ad.n_layers, ad.sublayers)
    return list(chunk_operator_sums(ad, ids, keys, "isolated", "last", batch_size=2)), ad.d_model, len(keys)


@pytest.mark.parametrize("threads", [1, 2])
def test_bootstrap_of_a_random_model_within_a_small_budget(model_sums, threads: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap of a tiny random model with room for eight exact d × d products (d = 64):
    the replicates beyond it are parked, at most eight factors are in memory at once (one
    thread: counted), and the table is bit for bit the one with every product in memory."""
    sums, d, L = model_sums
    weights = bootstrap_weights(5, 20, seed=7)
    opts = JacobianOptions(funnel_rank=0)

    def table() -> pd.DataFrame:
        return store.boot_table(iter(sums), weights, L, d, opts, None, threads)

    free = table()
    peaks, parked = _count_in_memory(monkeypatch)
    monkeypatch.setattr(bootstrap, "HELD_BYTES", 8 * d * d * 8)
    bounded = table()
    assert len(parked) == (21 - (8 - 2 * threads)) * (L - 1)
    if threads == 1:
        assert max(peaks) == 8
    pd.testing.assert_frame_equal(bounded, free, check_exact=True)
    assert (free["truncation"] == d).all() and free["replicate"].tolist() == list(range(21))


def test_stage_over_one_chunk_records_the_point_estimate_alone(tmp_path: Path) -> None:
    """``--chunks 1`` with the default 50 replicates and three step-0 seeds: each checkpoint's
    funnel_boot rows are replicate 0 alone, the ends of its backward α = 1 curve in the
    cumulative table, and the extra nulls are not run; two chunks give every replicate."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    for chunks, replicates in ((1, [0]), (2, list(range(51)))):
        out = tmp_path / f"run{chunks}"
        assert main(["jacobian", "--model", "random:llama:num_hidden_layers=3", "--text", str(text), "--chunks",
                     str(chunks), "--seq-len", "8", "--jacobian-mode", "isolated", "--funnel-alphas", "1",
                     "--init-seeds", "3", "--out", str(out), "--quiet"]) == 0
        boot = pd.read_parquet(out / "tables" / "funnel_boot.parquet")
        cum = pd.read_parquet(out / "tables" / "cumulative.parquet")
        seeds = {("init", 0.0), ("trained", -1.0)} | ({("init", 1.0), ("init", 2.0)} if chunks > 1 else set())
        by_seed = boot.groupby(["checkpoint", boot["init_seed"].fillna(-1)])["replicate"].apply(list).to_dict()
        assert by_seed == {key: replicates for key in seeds}
        for checkpoint in ("trained", "init"):
            curve = cum[(cum["checkpoint"] == checkpoint) & (cum["direction"] == "backward")].sort_values("steps")
            point = boot[(boot["checkpoint"] == checkpoint) & (boot["replicate"] == 0)
                         & (boot["init_seed"].fillna(0) == 0)]
            np.testing.assert_allclose(point[["erank_one_step", "erank_full_depth"]].to_numpy()[0],
                                       curve["erank"].to_numpy()[[0, -1]], rtol=1e-10)
