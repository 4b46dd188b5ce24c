"""Mean sub-layer operators over many tokens: a running accumulator and the drivers over chunks.

:class:`MeanAccumulator` keeps float64 sums and counts per ``(layer, kind)`` (mergeable
across workers and resumable); :func:`mean_operators` runs the forward passes and feeds it
the engines' per-batch sums (:func:`~depthlens.jacobian.sublayer.sublayer_jacobian_sum`);
:func:`chunk_operator_sums` gives the sums chunk by chunk, one sub-layer at a time (what a
bootstrap over chunks resamples: :mod:`depthlens.jacobian.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..errors import InputError
from ..models.adapter import Adapter, Sublayer, check_sublayer
from .options import JacobianMode
from .sublayer import (KINDS, check_dtype, check_jacobian_mode, engine_states, read_states, select_positions,
                       state_reads, sublayer_jacobian_sum)

__all__ = ["MeanAccumulator", "chunk_operator_sums", "mean_operators"]


class MeanAccumulator:
    """Running float64 sums and counts of operators per ``(layer, kind)``; :meth:`mean` divides.

    Examples
    --------
    >>> import torch
    >>> acc = MeanAccumulator()
    >>> acc.add(0, "attn", torch.eye(3).expand(4, 3, 3))
    >>> float(acc.mean()[(0, "attn")].trace()), acc.count(0, "attn")
    (3.0, 4)
    """

    def __init__(self) -> None:
        self._sum: dict[tuple[int, Sublayer], Tensor] = {}
        self._count: dict[tuple[int, Sublayer], int] = {}

    def add(self, layer: int, kind: Sublayer, jacobians: Tensor) -> None:
        """Add a stack of operators ``(N, d, d)`` (or one ``(d, d)``)."""
        J = torch.as_tensor(jacobians)
        if J.ndim == 2:
            J = J.unsqueeze(0)
        if J.ndim != 3 or J.shape[-1] != J.shape[-2]:
            raise InputError(f"jacobians have shape {tuple(J.shape)}; pass (N, d, d) or (d, d).")
        self.add_sum(layer, kind, J.to(torch.float64).sum(0), J.shape[0])

    def add_sum(self, layer: int, kind: Sublayer, total: Tensor, count: int) -> None:
        """Add a precomputed sum of ``count`` operators."""
        total = torch.as_tensor(total).to(torch.float64)
        key = (int(layer), check_sublayer(kind))
        if key in self._sum:
            if self._sum[key].shape != total.shape:
                raise InputError(f"operator shape {tuple(total.shape)} differs from {tuple(self._sum[key].shape)} for {key}.")
            self._sum[key] = self._sum[key] + total.to(self._sum[key].device)
            self._count[key] += int(count)
        else:
            self._sum[key] = total.clone()
            self._count[key] = int(count)

    def merge(self, other: MeanAccumulator) -> None:
        """Add another accumulator's sums and counts (e.g. from another worker)."""
        for key, total in other._sum.items():
            self.add_sum(key[0], key[1], total, other._count[key])

    def keys(self) -> list[tuple[int, Sublayer]]:
        return sorted(self._sum, key=lambda k: (k[0], KINDS.index(k[1])))

    def count(self, layer: int, kind: Sublayer) -> int:
        return self._count.get((int(layer), kind), 0)

    def mean(self) -> dict[tuple[int, Sublayer], np.ndarray]:
        """``{(layer, kind): sum / count}`` as float64 numpy arrays, in layer order."""
        return {k: (self._sum[k] / self._count[k]).cpu().numpy() for k in self.keys()}


def _checked_ids(input_ids: Any, jacobian_mode: str, dtype: Any, batch_size: int) -> torch.Tensor:
    """``input_ids`` as a ``(N, T)`` tensor, after checking the Jacobian mode, the dtype and the
    batch size (one-line :class:`~depthlens.errors.InputError` otherwise)."""
    check_jacobian_mode(jacobian_mode)
    check_dtype(dtype)
    ids = torch.as_tensor(input_ids)
    if ids.ndim == 1:
        ids = ids.unsqueeze(0)
    if ids.ndim != 2 or ids.shape[0] == 0:
        raise InputError(f"input_ids has shape {tuple(ids.shape)}; pass token chunks (N, T).")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"batch_size {batch_size!r} must be a positive integer.")
    return ids


def mean_operators(
    adapter: Adapter,
    input_ids: Tensor,
    jacobian_mode: JacobianMode = "isolated",
    positions: str | int | Sequence[int] = "last",
    batch_size: int = 8,
    progress: bool = False,
    layers: Iterable[int] | None = None,
    dtype: torch.dtype = torch.float64,
    accumulator: MeanAccumulator | None = None,
    label: str = "",
    out: Mapping[tuple[int, Sublayer], np.ndarray] | None = None,
    chunk_positions: Sequence[Sequence[int]] | None = None,
) -> Mapping[tuple[int, Sublayer], np.ndarray]:
    """Mean operators ``J̄ = (1/N) sum J`` of every layer's sub-layers (``attn`` and ``mlp``, and
    ``ple`` where the family has it: :attr:`~depthlens.models.adapter.Adapter.sublayers`) over chunks.

    One forward pass per batch of chunks gives the residual states (and any per-layer inputs:
    :func:`~depthlens.jacobian.sublayer.engine_states`); then, per layer, the engines sum the
    operators of the selected positions (:func:`sublayer_jacobian_sum`).

    Parameters
    ----------
    adapter : Adapter
    input_ids : Tensor (N, T)
        Token chunks (BOS already prepended where wanted).
    jacobian_mode, positions, dtype
        As :func:`sublayer_jacobians`.
    batch_size : int
        Chunks per forward pass.
    progress : bool
        Show a progress bar.
    layers : iterable of int, optional
        Which layers (default all).
    accumulator : MeanAccumulator, optional
        Accumulate into this one (e.g. to continue or merge runs); a new one otherwise.
    label : str
        Names the model in the progress bar (``jacobians <label> (<jacobian_mode>)``), e.g. ``step-0 null``.
    out : mapping, optional
        Writable float64 arrays of zeros, one per ``(layer, kind)`` computed (e.g. memory maps
        of a file laid out by :func:`depthlens.runs.atomic.create_safetensors`): the sums go
        there batch by batch and are divided in place at the end, so no operator is held in
        memory beyond the one being added (models of width 4096 have 8.6 GB of them). The same
        float64 arithmetic as the accumulator, so the same numbers; not with ``accumulator``.
    chunk_positions : sequence of sequences of int, optional
        Each chunk's own positions (0 … T − 1), in place of ``positions``: chunks of their own
        lengths, right-padded (a prompts file). A chunk is read up to its last position only
        (causal: the padding after it changes nothing there). The isolated engines and the
        MLP read tokens alone, so every selected token of a batch goes to one engine call; the
        ``in_context`` attention runs chunk by chunk.

    Returns
    -------
    dict ``{(layer, kind): ndarray (d, d)}`` in float64, layers in order, ``attn`` before ``mlp``
    (``out`` itself when given).

    Raises
    ------
    InputError
        Bad ids, jacobian_mode, positions, batch size or layers.
    """
    ids = _checked_ids(input_ids, jacobian_mode, dtype, batch_size)
    select_positions(positions, ids.shape[1])
    per_chunk = _chunk_positions(chunk_positions, ids.shape)
    wanted = list(range(adapter.n_layers)) if layers is None else [adapter.check_layer(int(x)) for x in layers]
    if out is not None and accumulator is not None:
        raise InputError("pass either an accumulator or out arrays to mean_operators, not both.")
    acc = MeanAccumulator() if accumulator is None else accumulator
    counts: dict[tuple[int, Sublayer], int] = {}
    starts = range(0, ids.shape[0], int(batch_size))
    bar = tqdm(total=len(starts) * len(wanted), desc=f"jacobians {label} ({jacobian_mode})" if label else f"jacobians ({jacobian_mode})", unit="layer", disable=not progress)
    try:
        for s in starts:
            if per_chunk is None:
                states = engine_states(adapter, ids[s : s + int(batch_size)])
            else:  # up to the batch's last selected position
                own = per_chunk[s : s + int(batch_size)]
                states = engine_states(adapter, ids[s : s + int(batch_size), : max(p[-1] for p in own) + 1])
            for layer in wanted:
                for kind in adapter.sublayers:
                    reads = state_reads(adapter, layer, kind, jacobian_mode)
                    if per_chunk is None:
                        residuals, extra = read_states(states, reads)
                        total, count = sublayer_jacobian_sum(adapter, residuals, layer, kind, jacobian_mode, positions,
                                                             dtype, **extra)
                    else:
                        total, count = _own_positions_sum(adapter, states, reads, own, layer, kind, jacobian_mode, dtype)
                    if out is None:
                        acc.add_sum(layer, kind, total, count)
                    else:
                        target = out[(layer, kind)]
                        target += total.to(torch.float64).cpu().numpy()
                        counts[(layer, kind)] = counts.get((layer, kind), 0) + int(count)
                bar.update(1)
            del states
    finally:
        bar.close()
    if out is not None:
        for key, count in counts.items():
            out[key] /= count
        return out
    means = acc.mean()
    return {k: means[k] for k in means if k[0] in set(wanted)} if layers is not None else means


def _chunk_positions(chunk_positions: Sequence[Sequence[int]] | None, shape: tuple[int, ...]) -> list[list[int]] | None:
    """Each chunk's positions, checked (non-empty, ascending, in ``0 … T − 1``); None stays None."""
    if chunk_positions is None:
        return None
    n, T = shape
    out = [sorted(int(p) for p in pos) for pos in chunk_positions]
    if len(out) != n:
        raise InputError(f"chunk_positions has {len(out)} entries for {n} chunks; pass one list of positions per chunk.")
    for c, pos in enumerate(out):
        if not pos or pos[0] < 0 or pos[-1] >= T or len(set(pos)) != len(pos):
            raise InputError(f"chunk_positions[{c}] = {pos} is not a non-empty list of distinct positions 0 … {T - 1}.")
    return out


def _own_positions_sum(adapter: Adapter, states: Sequence[Tensor], reads: tuple[int, int | None, int | None],
                       own: Sequence[Sequence[int]], layer: int, kind: Sublayer, jacobian_mode: JacobianMode,
                       dtype: torch.dtype) -> tuple[Tensor, int]:
    """``(sum J, count)`` over chunk b's positions ``own[b]`` of a batch's ``states`` (each
    (B, T, ·), read at ``reads``): one engine call on all the selected tokens where the engine
    reads each token alone (the isolated modes, the MLP), else (the ``in_context`` attention)
    one per chunk."""
    if jacobian_mode == "in_context" and kind == "attn":
        total, count = None, 0
        for b, pos in enumerate(own):
            residuals, extra = read_states({i: states[i][b : b + 1] for i in reads if i is not None}, reads)
            t, c = sublayer_jacobian_sum(adapter, residuals, layer, kind, jacobian_mode, list(pos), dtype, **extra)
            total, count = (t if total is None else total + t), count + c
        assert total is not None
        return total, count
    kept = {i: torch.cat([states[i][b, list(pos)] for b, pos in enumerate(own)])[None] for i in reads if i is not None}
    residuals, extra = read_states(kept, reads)
    return sublayer_jacobian_sum(adapter, residuals, layer, kind, jacobian_mode, "all", dtype, **extra)


def chunk_operator_sums(
    adapter: Adapter,
    input_ids: Tensor,
    keys: Sequence[tuple[int, Sublayer]],
    jacobian_mode: JacobianMode = "isolated",
    positions: str | int | Sequence[int] = "last",
    batch_size: int = 8,
    dtype: torch.dtype = torch.float64,
    progress: bool = False,
    label: str = "",
    chunk_positions: Sequence[Sequence[int]] | None = None,
) -> Iterator[tuple[tuple[int, Sublayer], np.ndarray, np.ndarray]]:
    """The operators of every chunk summed per chunk, one sub-layer at a time in the order of ``keys``.

    The forward passes run first (``batch_size`` chunks each) and keep the residual states the
    engines read for ``keys`` (:func:`~depthlens.jacobian.sublayer.state_reads`): in the two
    isolated modes only the selected positions (the engines read nothing else there), in
    ``in_context`` whole chunks. Then, per key, :func:`sublayer_jacobian_sum` runs on each
    chunk alone.

    Parameters
    ----------
    adapter : Adapter
    input_ids : Tensor (C, T)
        Token chunks, as :func:`mean_operators`.
    keys : sequence of (layer, kind)
        The sub-layers, in the order they are yielded (e.g. from the last one down, the order of
        a backward product).
    jacobian_mode, positions, batch_size, dtype, progress, label, chunk_positions
        As :func:`mean_operators`.

    Yields
    ------
    (key, sums, counts)
        ``sums`` float64 ``(C, d, d)``: ``sums[c]`` is the sum of the operators ``J = I + U`` at
        the selected positions of chunk c, what :func:`sublayer_jacobian_sum` gives for chunk c
        alone; ``counts`` int ``(C,)`` their numbers. Their mean
        (:func:`~depthlens.jacobian.bootstrap.mean_of_chunks`) is the mean
        operator of :func:`mean_operators` to rounding (it adds chunk sums, not batch sums; the
        same arithmetic otherwise).

    Raises
    ------
    InputError
        Bad ids, jacobian_mode, positions, batch size or keys (raised on the first ``next``).

    Notes
    -----
    Memory: the kept states (``C × len(positions) × d`` per state the keys read in the isolated
    modes, ``C × T × d`` in ``in_context``, in the model dtype) and one ``(C, d, d)`` float64
    array per key at a time. Cost: the forward passes of :func:`mean_operators` and, per key
    and chunk, the engine's sum, whose constant left factor is applied once per chunk instead
    of once per batch (one ``d × K × d`` product per chunk).
    """
    ids = _checked_ids(input_ids, jacobian_mode, dtype, batch_size)
    selected = select_positions(positions, ids.shape[1])
    per_chunk = _chunk_positions(chunk_positions, ids.shape)
    wanted = [(adapter.check_layer(int(layer)), adapter.check_kind(kind)) for layer, kind in keys]
    if not wanted:
        raise InputError("keys is empty; pass the (layer, kind) sub-layers whose chunk sums are wanted.")
    if per_chunk is not None:
        yield from _own_chunk_sums(adapter, ids, wanted, jacobian_mode, per_chunk, int(batch_size), dtype, progress,
                                   label)
        return
    # the isolated engines read the selected positions alone: keep those, and select them all later
    trim = jacobian_mode != "in_context"
    read: str | int | Sequence[int] = "all" if trim else positions
    states: dict[int, list[Tensor]] = {i: [] for key in wanted for i in state_reads(adapter, *key, jacobian_mode)
                                       if i is not None}
    starts = range(0, ids.shape[0], int(batch_size))
    name = f"{label} ({jacobian_mode})" if label else f"({jacobian_mode})"
    for s in tqdm(starts, desc=f"forward passes {name}", unit="batch", disable=not progress):
        hs = engine_states(adapter, ids[s : s + int(batch_size)])
        for index, kept in states.items():
            kept.append(hs[index][:, selected] if trim else hs[index].clone())  # copies: hs is freed
        del hs
    kept = {index: list(torch.cat(parts, dim=0)) for index, parts in states.items()}
    del states
    yield from _sums_per_chunk(adapter, kept, wanted, jacobian_mode, [read] * ids.shape[0], dtype, progress, name)


def _sums_per_chunk(adapter: Adapter, kept: dict[int, list[Tensor]], wanted: list[tuple[int, Sublayer]],
                    jacobian_mode: JacobianMode, reads: Sequence[str | int | Sequence[int]], dtype: torch.dtype,
                    progress: bool, name: str) -> Iterator[tuple[tuple[int, Sublayer], np.ndarray, np.ndarray]]:
    """Per key of ``wanted``, the engine's sum of each chunk alone: chunk ``c``'s kept states
    ``kept[state][c]`` (T_c, ·), read at ``reads[c]``."""
    n_chunks, d = len(reads), adapter.d_model
    for layer, kind in tqdm(wanted, desc=f"chunk jacobians {name}", unit="sub-layer", disable=not progress):
        indices = state_reads(adapter, layer, kind, jacobian_mode)
        sums = np.empty((n_chunks, d, d), dtype=np.float64)
        counts = np.empty(n_chunks, dtype=np.int64)
        for c in range(n_chunks):
            residuals, extra = read_states({i: kept[i][c][None] for i in indices if i is not None}, indices)
            total, count = sublayer_jacobian_sum(adapter, residuals, layer, kind, jacobian_mode, reads[c], dtype, **extra)
            sums[c] = total.to(torch.float64).cpu().numpy()
            counts[c] = count
        yield (layer, kind), sums, counts


def _own_chunk_sums(adapter: Adapter, ids: Tensor, wanted: list[tuple[int, Sublayer]], jacobian_mode: JacobianMode,
                    per_chunk: list[list[int]], batch_size: int, dtype: torch.dtype, progress: bool,
                    label: str) -> Iterator[tuple[tuple[int, Sublayer], np.ndarray, np.ndarray]]:
    """:func:`chunk_operator_sums` with each chunk's own positions ``per_chunk``: the kept states
    are, per chunk, those of its positions (isolated modes) or of its positions up to its last
    one (``in_context``), and each chunk's sum reads its own alone."""
    trim = jacobian_mode != "in_context"
    states: dict[int, list[Tensor]] = {i: [] for key in wanted for i in state_reads(adapter, *key, jacobian_mode)
                                       if i is not None}
    name = f"{label} ({jacobian_mode})" if label else f"({jacobian_mode})"
    for s in tqdm(range(0, ids.shape[0], batch_size), desc=f"forward passes {name}", unit="batch", disable=not progress):
        own = per_chunk[s : s + batch_size]
        hs = engine_states(adapter, ids[s : s + batch_size, : max(p[-1] for p in own) + 1])
        for index, kept in states.items():
            kept.extend(hs[index][b, pos] if trim else hs[index][b, : pos[-1] + 1].clone() for b, pos in enumerate(own))
        del hs
    reads: list[str | int | Sequence[int]] = ["all" if trim else pos for pos in per_chunk]
    yield from _sums_per_chunk(adapter, states, wanted, jacobian_mode, reads, dtype, progress, name)
