"""A bootstrap over chunks of the funnel's two ends under the claims' protocol (§B3; claims B2, B3, C2).

The mean operators average over the run's C text chunks, so the funnel's erank after one step
and at full depth are functions of that sample of chunks. A replicate draws C chunks with
replacement, held as integer weights ``w_c`` (how often chunk c is drawn, ``Σ_c w_c = C``).
Its mean operator of every sub-layer is ``Σ_c w_c S_c / Σ_c w_c n_c``, with ``S_c`` the sum of
chunk c's operators (:func:`~depthlens.jacobian.mean.chunk_operator_sums`) and ``n_c`` their
number: exactly the mean over the explicitly resampled chunks (``Σ_c w_c J̄_c / C`` with
``J̄_c`` chunk c's mean, since every chunk has the same number of positions). The replicate's
funnel is the same product of every sub-layer's mean operator, accumulated the same way
(:func:`~depthlens.jacobian.cumulative.cumulative_ends`), and replicate 0 (every chunk once)
is the point estimate.

The weights depend on the run seed and the chunk count alone (:func:`bootstrap_weights`), so
replicate k resamples the same chunks on every checkpoint of a run (and of a census, whose runs
share their chunks): a ratio between two checkpoints is bootstrapped in pairs.

What an interval from the replicates means: their 2.5 and 97.5 percentiles (the percentile
bootstrap) estimate how far the statistic would move had the run drawn another C chunks of
the same text source; it covers the chunk sampling of the mean operators only, not other text
sources, other weights or the protocol's choices. A run of fewer than :data:`MIN_CHUNKS` chunks
has nothing to resample (:func:`skip_reason`).

Memory: the replicates' running products are held in memory up to :data:`HELD_BYTES` and
parked on disk beyond it (:func:`~depthlens.jacobian.cumulative.cumulative_ends`'s
``held_bytes``), so they take no more whatever the width and the number of replicates.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import numpy as np
import pandas as pd

from ..errors import InputError
from ..linalg._checks import as_square
from .cumulative import cumulative_ends

__all__ = ["BOOT_TAG", "HELD_BYTES", "MIN_CHUNKS", "bootstrap_weights", "funnel_bootstrap", "mean_of_chunks",
           "means_buffer", "resampled_means", "skip_reason"]

#: Second entry of the weights' ``SeedSequence([seed, BOOT_TAG])``: a stream of its own.
BOOT_TAG = 0xB007
#: Replicate means formed together: at most this many bytes of them at a time.
_BLOCK_BYTES = 1 << 28
#: Running products of the replicates held in memory (1 GiB); the others wait on disk
#: (:func:`funnel_bootstrap`).
HELD_BYTES = 1 << 30
#: Fewest chunks a bootstrap resamples (:func:`skip_reason`).
MIN_CHUNKS = 2


def skip_reason(n_chunks: int) -> str | None:
    """Why a bootstrap over ``n_chunks`` chunks is not run (one line naming ``--chunks``), or
    None when it is: at least :data:`MIN_CHUNKS` chunks.

    With n chunks a replicate is one of C(2n − 1, n) distinct resamples (multisets of n draws
    from n chunks): 1, 3, 10, 35, 126 for n = 1 … 5. One chunk gives one resample, the chunk
    itself: every replicate is the point estimate and the interval has zero width, a certainty
    the run does not have, so a single chunk is not resampled at all. From two chunks on the
    replicates differ and the interval spans the spread between chunks, the variation it is
    meant to measure. With very few chunks the interval is coarse (its tails hold a few
    distinct resamples) and covers less than its nominal 95%: a weak interval for the report
    to weigh, not one that means nothing, so two chunks suffice.

    Raises
    ------
    InputError
        If ``n_chunks`` is not a positive integer.

    Examples
    --------
    >>> print(skip_reason(1))
    one chunk is its only resample, so every replicate would be the point estimate: no replicates, no interval; pass --chunks 2 or more for one.
    >>> skip_reason(2) is None
    True
    """
    if isinstance(n_chunks, bool) or not isinstance(n_chunks, (int, np.integer)) or n_chunks < 1:
        raise InputError(f"n_chunks is {n_chunks!r}; pass an integer of at least 1.")
    if n_chunks >= MIN_CHUNKS:
        return None
    return ("one chunk is its only resample, so every replicate would be the point estimate: no replicates, no "
            f"interval; pass --chunks {MIN_CHUNKS} or more for one.")


def bootstrap_weights(n_chunks: int, replicates: int, seed: int) -> np.ndarray:
    """How often each chunk is drawn in each replicate: ``(replicates, n_chunks)`` int64.

    Replicate k draws ``n_chunks`` chunk indices uniformly with replacement from
    ``numpy.random.default_rng(SeedSequence([seed, BOOT_TAG]))`` (all replicates' draws in one
    call, replicate by replicate) and counts them; every row sums to ``n_chunks``.

    Raises
    ------
    InputError
        If ``n_chunks`` is not positive or ``replicates`` is negative.

    Examples
    --------
    >>> w = bootstrap_weights(4, 3, seed=0)
    >>> w.shape, w.sum(axis=1).tolist()
    ((3, 4), [4, 4, 4])
    """
    for name, value, low in (("n_chunks", n_chunks, 1), ("replicates", replicates, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InputError(f"{name} is {value!r}; pass an integer of at least {low}.")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), BOOT_TAG]))
    draws = rng.integers(0, n_chunks, size=(int(replicates), int(n_chunks)))
    counts = np.zeros((int(replicates), int(n_chunks)), dtype=np.int64)
    for k, row in enumerate(draws):
        counts[k] = np.bincount(row, minlength=int(n_chunks))
    return counts


def mean_of_chunks(sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The mean operator ``Σ_c sums[c] / Σ_c counts[c]`` of per-chunk sums, float64 (every chunk once)."""
    return np.asarray(sums, dtype=np.float64).sum(axis=0) / float(np.sum(counts))


def _check_weights(weights: Any, n_chunks: int | None = None) -> np.ndarray:
    w = np.asarray(weights)
    if w.ndim != 2 or w.dtype.kind not in "iu" or np.any(w < 0) or (w.shape[0] and np.any(w.sum(axis=1) == 0)):
        raise InputError("weights must be (replicates, chunks) non-negative integers with a drawn chunk in every row, "
                         "as bootstrap_weights gives.")
    if n_chunks is not None and w.shape[1] != n_chunks:
        raise InputError(f"weights cover {w.shape[1]} chunks, the sums {n_chunks}; pass weights of the run's chunks.")
    return w.astype(np.float64)


def resampled_means(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray,
                    buffer: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The replicates' mean operators ``Σ_c w_kc sums[c] / Σ_c w_kc counts[c]``, one per row of ``weights``.

    Formed a block of replicates at a time by one matrix product ``(block, C) × (C, d²)``
    (float64, exact to rounding), blocks of at most 256 MB, written into one array that is
    reused from block to block (and from call to call with ``buffer``): a fresh 256 MB
    array per block costs more in page faults than the product itself.

    Parameters
    ----------
    sums : ndarray (C, d, d)
        Per-chunk operator sums (:func:`~depthlens.jacobian.mean.chunk_operator_sums`).
    counts : ndarray (C,)
        Operators per chunk.
    weights : ndarray (R, C) of int
        As :func:`bootstrap_weights`.
    buffer : ndarray, optional
        A float64 array of :func:`means_buffer`'s shape for these sizes, to hold the blocks
        (e.g. one for every sub-layer of a funnel); a new one otherwise.

    Yields
    ------
    ndarray (d, d) float64, replicate by replicate: views of the block array, valid until the
    generator moves past their block (copy one to keep it).

    Raises
    ------
    InputError
        If the shapes do not match or the weights are not as :func:`bootstrap_weights` gives.
    """
    S = np.asarray(sums, dtype=np.float64)
    if S.ndim != 3 or S.shape[1] != S.shape[2] or np.shape(counts) != (S.shape[0],):
        raise InputError(f"sums have shape {S.shape} and counts {np.shape(counts)}; pass (C, d, d) and (C,).")
    w = _check_weights(weights, S.shape[0])
    d = S.shape[1]
    flat = S.reshape(S.shape[0], d * d)
    totals = w @ np.asarray(counts, dtype=np.float64)
    shape = means_buffer(w.shape[0], d)
    if buffer is None:
        buffer = np.empty(shape, dtype=np.float64)
    elif buffer.shape != shape or buffer.dtype != np.float64:
        raise InputError(f"buffer has shape {buffer.shape} and dtype {buffer.dtype}; pass float64 {shape}.")
    for start in range(0, w.shape[0], shape[0]):
        rows = w[start : start + shape[0]]
        means = buffer[: rows.shape[0]]
        np.matmul(rows, flat, out=means)
        means /= totals[start : start + shape[0], None]
        yield from means.reshape(-1, d, d)


def means_buffer(replicates: int, d: int) -> tuple[int, int]:
    """The shape of :func:`resampled_means`'s block array: ``(block, d²)``, blocks of at most 256 MB."""
    return max(1, min(int(replicates), _BLOCK_BYTES // (8 * d * d))), d * d


def funnel_bootstrap(sums: Iterable[tuple[Any, np.ndarray, np.ndarray]], weights: np.ndarray, n_operators: int,
                     rank: int | None = None, direction: str = "backward",
                     out: MutableMapping[Any, np.ndarray] | None = None, device: str | None = None,
                     threads: int = 1) -> pd.DataFrame:
    """Erank after one step and at full depth of the funnel of every replicate (§B3).

    Parameters
    ----------
    sums : iterable of (key, ndarray (C, d, d), ndarray (C,))
        Per sub-layer: its key, its per-chunk operator sums and counts
        (:func:`~depthlens.jacobian.mean.chunk_operator_sums`), in the order ``direction``
        multiplies them (backward: the last sub-layer first).
    weights : ndarray (R, C) of int
        The replicates (:func:`bootstrap_weights`); R = 0 gives the point estimate alone.
    n_operators : int
        Number of sub-layers (the product's full depth).
    rank : int or None
        Truncation of the running product, as :func:`~depthlens.jacobian.cumulative.cumulative_ranks`
        (the claims' protocol: 512).
    direction : {"backward", "forward"}
        As :func:`~depthlens.jacobian.cumulative.cumulative_ranks` (the claims': backward).
    out : mutable mapping, optional
        The point mean operator of every key (:func:`mean_of_chunks`) is written into
        ``out[key][...]`` as its sums pass (e.g. the run's operator file).
    device, threads
        Torch device of the products and singular values, and replicates advanced side by side
        in threads, as :func:`~depthlens.jacobian.cumulative.cumulative_ends` (neither changes
        a number beyond rounding; ``threads`` none at all).

    Returns
    -------
    DataFrame
        One row per replicate: ``replicate`` (0: every chunk once, the point estimate; k ≥ 1:
        row k − 1 of ``weights``), ``erank_one_step``, ``erank_full_depth`` (NaN where
        ``failure`` says why no SVD driver converged) and ``failure``. Replicate 0's values
        are those of :func:`~depthlens.jacobian.cumulative.cumulative_ranks` on the point means
        to rounding.

    Raises
    ------
    InputError
        As :func:`~depthlens.jacobian.cumulative.cumulative_ends` and :func:`resampled_means`.

    Notes
    -----
    Cost: per sub-layer one ``(R, C) × (C, d²)`` product for the means; per replicate the
    products of one curve, O(L d² k), and two SVDs. Memory: one sub-layer's sums, a block of
    replicate means (at most 256 MiB) and at most :data:`HELD_BYTES` of running products (d × k
    float64 each; at least 2 ``threads`` of them, the products in flight beside their new
    ones); the other replicates are parked on disk (under ``$TMPDIR``) between steps, a write
    and a read of d × k per replicate and step, with the same numbers bit for bit
    (:func:`~depthlens.jacobian.cumulative.cumulative_ends`'s ``held_bytes``).
    """
    w = _check_weights(weights).astype(np.int64)

    def steps() -> Iterator[Iterator[np.ndarray]]:
        buffer = None  # one block array for every sub-layer: each step is used up before the next
        for key, S, counts in sums:
            # a non-finite chunk sum makes the point mean non-finite: one check covers every replicate
            point = as_square(mean_of_chunks(S, counts), f"the mean of the chunk sums of {key!r}")
            if out is not None:
                out[key][...] = point
            if buffer is None:
                buffer = np.empty(means_buffer(len(w), point.shape[0]), dtype=np.float64)
            yield itertools.chain((point,), resampled_means(S, counts, w, buffer))

    ends, failures = cumulative_ends(steps(), n_operators, direction, rank, device, threads, checked=True,
                                     held_bytes=HELD_BYTES)
    return pd.DataFrame({"replicate": np.arange(len(ends)), "erank_one_step": ends[:, 0],
                         "erank_full_depth": ends[:, 1], "failure": pd.Series(failures, dtype=object)})
