"""Ablation criticality of attention heads (§A7): the change in next-token
cross-entropy when one head's output is replaced before the output projection.

The run's chunks are split in two disjoint sets (:func:`split_chunks`): the last
``heldout_chunks`` are the *held-out* chunks, on which cross-entropies are measured; the others
are the *mean chunks*, which give the head means (``mean`` ablation) and the replacement
outputs (``resample`` ablation). Three ablations of head ``(l, h)``, at the input of layer
``l``'s output projection (:meth:`~depthlens.models.adapter.Adapter.ablate_head`):

- ``mean``: the head's mean output vector over every token of every mean chunk (summed in
  float64, :func:`head_means`);
- ``zero``: zeros;
- ``resample``: its output on mean chunk ``i mod n_mean`` in place of its output on held-out
  chunk ``i`` (``i`` counts held-out chunks from 0; :func:`resample_sources`).

``criticality`` is ΔCE in nats per token: the mean over every predicted token of the held-out
chunks (positions ``0 .. T-2`` predicting ``1 .. T-1``) of ``CE_ablated − CE_clean``, with a 95%
percentile bootstrap interval over held-out chunks (:func:`bootstrap_counts`,
:func:`ratio_interval`).

Structure (what makes it affordable): no full forward pass per head. The clean residual
stream of a batch of held-out chunks is computed once through the adapter's own maps
(``h = embed(ids)``, then ``block(k)`` for every layer, keeping each layer's input;
:func:`clean_pass`), and so is the clean cross-entropy. The ablations of layer ``l``'s heads
start from the kept input of layer ``l``, repeated once per head, and run only ``block(l) …
block(L−1)`` and ``unembed``, each copy with its own head ablated (:func:`ablated_nll`): one
pass per layer instead of one per head, with the same arithmetic. Layers below ``l`` are
unchanged by the ablation, so skipping them is exact; and because clean and ablated values
go through the same maps and cross-entropy, a head whose output-projection slice is zero gets
ΔCE = 0 (bit for bit in the suite, whose BLAS computes a row the same way whatever the
batch). A model whose layers are not maps of the residual alone (Gemma 4:
``Adapter.block_maps`` False) has no layer to start from: its clean and ablated passes are
its own forward pass, each whole (about twice the work).

Arithmetic: forward passes in the model dtype (float32 by default); per-token cross-entropies
from float32 logits (``log_softmax`` of a few chunks at a time; bfloat16/float16 logits are
cast to float32 first), converted to float64 and summed in float64 (per chunk, then over chunks).
Against an independent computation (the model's own forward pass with the ablation hook, a
float64 ``log_softmax``), ΔCE agrees to float32 rounding: within 1e-5 nats per token in the
tests, about 1e-7 on SmolLM2 (``benchmarks/bench_ablation.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError
from ..models.interventions import ABLATION_METHODS

__all__ = [
    "BOOT_TAG",
    "LOGITS_BUDGET",
    "ROWS_BUDGET",
    "CleanPass",
    "ROW_COLUMNS",
    "ablated_nll",
    "aggregate",
    "bootstrap_counts",
    "clean_pass",
    "criticality",
    "head_means",
    "head_outputs",
    "layer_rows",
    "ratio_interval",
    "resample_sources",
    "split_chunks",
    "token_nll",
]

#: Fixed tag of the bootstrap stream: ``numpy.random.SeedSequence([seed, BOOT_TAG])``.
BOOT_TAG = 0xAB1A7E
#: Most logits (float32 values) :func:`token_nll` forms at once: 2**25 (128 MiB).
LOGITS_BUDGET = 2**25
#: Most residual values (rows × model width) one pass of :func:`ablated_nll` carries: 2**24
#: (64 MiB in float32), so the heads of a layer share passes without memory growing with them.
ROWS_BUDGET = 2**24
#: Columns of the per-chunk rows (:func:`layer_rows`), the stage's unit tables.
ROW_COLUMNS = ("layer", "head", "method", "chunk", "delta_ce_sum", "ce_clean_sum", "n_tokens")


# ----------------------------------------------------------------------------- chunks
def split_chunks(n_chunks: int, heldout_chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean chunks and the held-out chunks of a run of ``n_chunks`` chunks.

    Parameters
    ----------
    n_chunks : int
        Chunks of the run, at least 2.
    heldout_chunks : int
        How many of them, the last ones, are held out; above ``n_chunks − 1`` it means every
        chunk but the first (at least one chunk gives the means).

    Returns
    -------
    mean, heldout : ndarray of int
        Global chunk indices ``0 .. n_chunks − h − 1`` and the rest (``h = min(heldout_chunks,
        n_chunks − 1)``); disjoint, neither empty.

    Raises
    ------
    InputError
        When ``n_chunks < 2`` or ``heldout_chunks < 1``.

    Examples
    --------
    >>> [a.tolist() for a in split_chunks(7, 4)], [a.tolist() for a in split_chunks(3, 4)]
    ([[0, 1, 2], [3, 4, 5, 6]], [[0], [1, 2]])
    """
    if heldout_chunks < 1:
        raise InputError(f"--heldout-chunks {heldout_chunks} is invalid; pass 1 or more.")
    if n_chunks < 2:
        raise InputError(f"--chunks {n_chunks} leaves no mean chunk beside a held-out one for the ablate stage; "
                         "pass --chunks 2 or more.")
    n_mean = n_chunks - min(heldout_chunks, n_chunks - 1)
    return np.arange(n_mean), np.arange(n_mean, n_chunks)


def resample_sources(n_mean: int, n_heldout: int) -> np.ndarray:
    """The mean chunk whose head outputs replace those of held-out chunk ``i``: ``i mod n_mean``.

    ``i`` counts held-out chunks from 0; the result indexes the mean chunks, which are the
    run's first chunks, so it is also the global chunk index.

    Examples
    --------
    >>> resample_sources(3, 5).tolist()
    [0, 1, 2, 0, 1]
    """
    return np.arange(n_heldout) % n_mean


# ----------------------------------------------------------------------------- forward maps
def token_nll(adapter, h_final: Tensor, ids: Tensor) -> Tensor:
    """Next-token cross-entropy at every predicted position, from the last layer's output.

    Parameters
    ----------
    adapter : Adapter
    h_final : Tensor, shape (B, T, d)
        Output of the last layer (before the final norm).
    ids : LongTensor, shape (B, T)
        The chunks' tokens; position ``t`` predicts ``ids[:, t + 1]``.

    Returns
    -------
    Tensor, shape (B, T − 1), float64, on the CPU
        ``−log softmax(unembed(h))[t, ids[t + 1]]`` for ``t = 0 .. T−2``: logits and
        ``log_softmax`` in float32 (float64 for a float64 model), then converted to float64.
        Chunks are unembedded in groups of at most :data:`LOGITS_BUDGET` logits (at least one
        chunk), so memory stays bounded whatever the batch and the vocabulary.
    """
    B, T = ids.shape
    V = adapter.vocab_size
    group = max(1, LOGITS_BUDGET // max(1, (T - 1) * V))
    out = torch.empty((B, T - 1), dtype=torch.float64)
    for start in range(0, B, group):
        stop = min(start + group, B)
        logits = adapter.unembed(h_final[start:stop, :-1])
        if logits.dtype not in (torch.float32, torch.float64):
            logits = logits.float()
        targets = ids[start:stop, 1:].to(logits.device).reshape(-1)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, reduction="none")
        out[start:stop] = nll.reshape(stop - start, T - 1).to("cpu", torch.float64)
    return out


@dataclass
class CleanPass:
    """The clean residual stream of one batch of held-out chunks.

    Attributes
    ----------
    ids : LongTensor, shape (B, T)
        Token ids, on the model's device.
    chunks : ndarray of int
        Global chunk index of each row.
    states : dict of int to Tensor
        ``states[l]``: the input of layer ``l`` (B, T, d) in the model dtype, for the layers
        kept.
    nll : Tensor, shape (B, T − 1), float64
        The clean per-token cross-entropy (:func:`token_nll`).
    counted : BoolTensor, shape (B, T − 1), optional
        Which predictions the sums of :func:`layer_rows` count (prompts: the analysed positions
        inside each prompt); None: every one.
    """

    ids: Tensor
    chunks: np.ndarray
    states: dict[int, Tensor]
    nll: Tensor
    counted: Tensor | None = None


def clean_pass(adapter, ids: Tensor, chunks: Sequence[int], keep: Collection[int] | None = None,
               counted: np.ndarray | None = None) -> CleanPass:
    """Run ``embed`` then ``block(0) … block(L−1)`` on ``ids`` and keep layer inputs.

    Parameters
    ----------
    adapter : Adapter
    ids : LongTensor, shape (B, T)
    chunks : sequence of int
        Global chunk index of each row (carried along).
    keep : collection of int, optional
        Layers whose inputs are kept (default every layer): ``B·T·d`` values each.
    counted : ndarray of bool, shape (B, T − 1), optional
        The predictions that count (:attr:`CleanPass.counted`).

    Returns
    -------
    CleanPass
    """
    ids = torch.as_tensor(ids).to(adapter.device)
    states: dict[int, Tensor] = {}
    with torch.inference_mode():
        if adapter.block_maps:
            h = adapter.embed(ids)
            for k in range(adapter.n_layers):
                if keep is None or k in keep:
                    states[k] = h
                h = adapter.block(k)(h)
        else:  # no layer to start from: the ablations run the whole forward pass (ablated_nll)
            h = adapter.final_state(ids)
        nll = token_nll(adapter, h, ids)
    return CleanPass(ids, np.asarray(chunks, dtype=np.int64), states, nll,
                     None if counted is None else torch.as_tensor(np.asarray(counted, dtype=bool)))


def _block_path_with_hook(adapter, ids: Tensor, last: int, on_output: Callable[[int, Tensor], None]) -> None:
    """Run ``embed`` and ``block(0) … block(last)`` with ``on_output(layer, x)`` seeing every
    output projection's input ``x`` (B, T, H·hd) (the model's own forward pass where the
    adapter has no block maps, as :func:`clean_pass`)."""
    ids = torch.as_tensor(ids).to(adapter.device)
    if not adapter.block_maps:
        with torch.inference_mode():
            adapter.each_head_output(ids, last, on_output)
        return
    with torch.inference_mode():
        h = adapter.embed(ids)
        for k in range(last + 1):

            def hook(module: nn.Module, args: tuple, layer: int = k) -> None:
                on_output(layer, args[0])

            handle = adapter.out_proj(k).register_forward_pre_hook(hook)
            try:
                h = adapter.block(k)(h)
            finally:
                handle.remove()


def head_outputs(adapter, ids: Tensor, layers: Collection[int] | None = None) -> dict[int, Tensor]:
    """Every head's output before the output projection, per layer, through the block path.

    Parameters
    ----------
    adapter : Adapter
    ids : LongTensor, shape (B, T)
    layers : collection of int, optional
        Layers to return (default all); the pass stops after the last of them.

    Returns
    -------
    dict of int to Tensor, shape (B, T, H, hd)
        In the model dtype, on the model's device. The same values as
        :meth:`~depthlens.models.adapter.Adapter.head_outputs` up to float rounding (that one
        runs the model's own forward pass).
    """
    wanted = set(range(adapter.n_layers)) if layers is None else set(layers)
    out: dict[int, Tensor] = {}
    if not wanted:
        return out

    def keep(layer: int, x: Tensor) -> None:
        if layer in wanted:
            out[layer] = x.reshape(*x.shape[:2], adapter.n_heads, adapter.layer_head_dim(layer)).clone()

    _block_path_with_hook(adapter, ids, max(wanted), keep)
    return out


def head_means(adapter, ids: Tensor, batch_size: int, lengths: np.ndarray | None = None) -> list[Tensor]:
    """Each head's mean output vector over every token of ``ids`` (the mean chunks).

    Parameters
    ----------
    adapter : Adapter
    ids : LongTensor, shape (N, T)
    batch_size : int
        Chunks per forward pass.
    lengths : ndarray of int, shape (N,), optional
        Each chunk's length (prompts right-padded to T): only its first ``lengths[i]``
        positions count. Default: all T.

    Returns
    -------
    list of Tensor, shape (H, hd_l), float64, on the CPU
        Per layer ``l`` (of head width ``hd_l``): the sum over chunks and positions of the
        head outputs (each converted to float64 before summing) divided by ``N·T`` (by
        ``Σ lengths``).
    """
    L, H = adapter.n_layers, adapter.n_heads
    sums = [torch.zeros((H, adapter.layer_head_dim(layer)), dtype=torch.float64) for layer in range(L)]
    N, T = ids.shape
    inside: list[Tensor | None] = [None]  # the current batch's real positions (B, T), with lengths

    def add(layer: int, x: Tensor) -> None:
        if inside[0] is not None:
            x = x[inside[0].to(x.device)]
        sums[layer] += x.reshape(-1, *sums[layer].shape).to("cpu", torch.float64).sum(dim=0)

    for start in range(0, N, batch_size):
        if lengths is not None:
            inside[0] = torch.arange(T)[None, :] < torch.as_tensor(lengths[start : start + batch_size])[:, None]
        _block_path_with_hook(adapter, ids[start : start + batch_size], L - 1, add)
    count = N * T if lengths is None else int(np.sum(lengths))
    return [total / count for total in sums]


def ablated_nll(adapter, clean: CleanPass, layer: int, heads: Sequence[int], method: str,
                values: Tensor | None) -> Tensor:
    """Per-token cross-entropy of ``clean``'s chunks with each of ``heads`` of ``layer`` ablated
    in turn, in one pass per group of heads.

    The kept input of ``layer`` is repeated once per head (a block of rows each) and run through
    ``block(layer) … block(L−1)`` and the cross-entropy exactly as :func:`clean_pass` does, with
    :meth:`~depthlens.models.adapter.Adapter.ablate_each` ablating block ``i``'s head
    ``heads[i]``. Layers below ``layer`` are unchanged by an ablation, so skipping them is exact.
    Heads go :data:`ROWS_BUDGET` rows (of the model width) at a time, at least one head a pass.

    Parameters
    ----------
    adapter : Adapter
    clean : CleanPass
        Must keep layer ``layer``.
    layer : int
    heads : sequence of int
    method : {"mean", "zero", "resample"}
    values : Tensor or None
        None for zero, ``(n, hd)`` for mean, ``(n, B, T, hd)`` for resample (rows as ``clean``),
        ``n = len(heads)``.

    Returns
    -------
    Tensor, shape (n, B, T − 1), float64
    """
    B, T = clean.ids.shape
    group = max(1, ROWS_BUDGET // (B * T * adapter.d_model))
    out = []
    for start in range(0, len(heads), group):
        part = list(heads[start : start + group])
        n = len(part)
        with torch.inference_mode(), adapter.ablate_each(
                layer, part, method, None if values is None else values[start : start + n]):
            if adapter.block_maps:
                h = clean.states[layer].repeat(n, 1, 1)
                for k in range(layer, adapter.n_layers):
                    h = adapter.block(k)(h)
            else:
                h = adapter.final_state(clean.ids.repeat(n, 1))
            out.append(token_nll(adapter, h, clean.ids.repeat(n, 1)).reshape(n, B, T - 1))
    return torch.cat(out)


def _values(method: str, layer: int, heads: Sequence[int], means: list[Tensor] | None,
            sources: dict[int, Tensor] | None) -> Tensor | None:
    """The ``values`` of :meth:`~depthlens.models.adapter.Adapter.ablate_each` for ``heads`` of ``layer``."""
    if method == "zero":
        return None
    if method == "mean":
        if means is None:
            raise InputError("mean ablation needs the head means (head_means over the mean chunks).")
        return means[layer][list(heads)]
    if method == "resample":
        if sources is None or layer not in sources:
            raise InputError(f"resample ablation needs the head outputs of layer {layer} on the paired mean chunks.")
        return sources[layer][:, :, list(heads)].movedim(2, 0)
    raise InputError(f"ablation method {method!r} is not one of {ABLATION_METHODS}.")


def layer_rows(
    adapter,
    clean: CleanPass,
    layer: int,
    methods: Sequence[str],
    means: list[Tensor] | None = None,
    sources: dict[int, Tensor] | None = None,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """ΔCE sums of every head of ``layer`` under every method, per held-out chunk of ``clean``.

    Parameters
    ----------
    adapter : Adapter
    clean : CleanPass
        A batch of held-out chunks, keeping layer ``layer``.
    layer : int
    methods : sequence of str
        Ablation methods, in the order of the rows.
    means : list of Tensor (H, hd_l), optional
        :func:`head_means` of the mean chunks (needed for ``mean``).
    sources : dict of int to Tensor (B, T, H, hd), optional
        :func:`head_outputs` of the mean chunks paired with ``clean``'s rows by
        :func:`resample_sources` (needed for ``resample``).
    progress : callable, optional
        Called with the layer's number of heads when they are done.

    Returns
    -------
    DataFrame
        Columns :data:`ROW_COLUMNS`, one row per (head, method, chunk): ``delta_ce_sum`` is the
        float64 sum over the chunk's predicted tokens of ``CE_ablated − CE_clean``,
        ``ce_clean_sum`` that of ``CE_clean``, ``n_tokens = T − 1`` (with ``clean.counted``:
        the sums over the counted predictions only, ``n_tokens`` their number; the others, a
        prompt's padding or positions not analysed, enter no number).
    """
    heads = list(range(adapter.n_heads))
    counted = torch.ones_like(clean.nll, dtype=torch.bool) if clean.counted is None else clean.counted
    zero = torch.zeros((), dtype=torch.float64)
    clean_sum = torch.where(counted, clean.nll, zero).sum(dim=1).cpu().numpy()
    n_tokens = counted.sum(dim=1).cpu().numpy().astype(np.int64)
    delta = {method: torch.where(counted, ablated_nll(adapter, clean, layer, heads, method,
                                                      _values(method, layer, heads, means, sources)) - clean.nll,
                                 zero).sum(dim=2).cpu().numpy()
             for method in methods}
    if progress is not None:
        progress(len(heads))
    B = len(clean.chunks)
    return pd.DataFrame({
        "layer": layer, "head": np.repeat(heads, len(methods) * B),
        "method": np.tile(np.repeat(list(methods), B), len(heads)), "chunk": np.tile(clean.chunks, len(heads) * len(methods)),
        "delta_ce_sum": np.stack([delta[m] for m in methods], axis=1).reshape(-1),
        "ce_clean_sum": np.tile(clean_sum, len(heads) * len(methods)),
        "n_tokens": np.tile(n_tokens, len(heads) * len(methods)),
    })[list(ROW_COLUMNS)]


# ----------------------------------------------------------------------------- bootstrap
def bootstrap_counts(n_chunks: int, n_boot: int, seed: int) -> np.ndarray:
    """How often each chunk is drawn in each bootstrap resample.

    Parameters
    ----------
    n_chunks : int
        Chunks resampled (with replacement, ``n_chunks`` draws per resample).
    n_boot : int
        Resamples.
    seed : int
        The run's seed; the stream is ``default_rng(SeedSequence([seed, BOOT_TAG]))``.

    Returns
    -------
    ndarray, shape (n_boot, n_chunks), int64
        Row sums are ``n_chunks``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), BOOT_TAG]))
    draws = rng.integers(0, n_chunks, size=(n_boot, n_chunks))
    counts = np.zeros((n_boot, n_chunks), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(n_boot), n_chunks), draws.ravel()), 1)
    return counts


def ratio_interval(sums: np.ndarray, tokens: np.ndarray, counts: np.ndarray,
                   level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of ``Σ sums / Σ tokens`` over resampled chunks.

    Parameters
    ----------
    sums : ndarray, shape (R, C)
        Per chunk sums (e.g. ΔCE) of R quantities over the same C chunks.
    tokens : ndarray, shape (C,)
        Tokens per chunk.
    counts : ndarray, shape (n_boot, C)
        :func:`bootstrap_counts`.
    level : float
        Coverage; the interval runs from the ``(1 − level)/2`` to the ``(1 + level)/2``
        percentile (numpy's linear interpolation) of the resampled ratios.

    Returns
    -------
    lo, hi : ndarray, shape (R,)
    """
    c = np.asarray(counts, dtype=np.float64)
    ratios = (np.asarray(sums, dtype=np.float64) @ c.T) / (c @ np.asarray(tokens, dtype=np.float64))
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(ratios, [tail, 100 - tail], axis=1)
    return lo, hi


def aggregate(rows: pd.DataFrame, methods: Sequence[str], n_boot: int, seed: int) -> pd.DataFrame:
    """The ``ablation`` table from per-chunk rows (:func:`layer_rows`).

    Rows are put in (layer, head, method in ``methods`` order, chunk) order first, so the
    result does not depend on the order the units were computed or read in (a resumed run
    gives the same numbers). Every (layer, head, method) is resampled with the same bootstrap
    draws over its chunks (:func:`bootstrap_counts`); a row with fewer chunks (a failed unit)
    reports them in ``n_chunks`` and is resampled over those.

    Returns
    -------
    DataFrame
        Columns ``layer, head, method, criticality, criticality_lo, criticality_hi, ce_clean,
        n_chunks, n_tokens``; ``criticality = Σ delta_ce_sum / Σ n_tokens`` and
        ``ce_clean = Σ ce_clean_sum / Σ n_tokens``, sums in float64 in chunk order;
        ``criticality_lo``/``criticality_hi`` NaN for a head measured on one chunk (a bootstrap
        over one chunk has no spread).
    """
    order = {m: i for i, m in enumerate(methods)}
    rows = rows.assign(_m=rows["method"].map(order)).sort_values(["layer", "head", "_m", "chunk"], kind="stable")
    # the chunk set of each (layer, head, method), as a label; rows sharing one are resampled together
    rows["_set"] = rows.groupby(["layer", "head", "_m"], sort=False)["chunk"].transform(lambda c: ",".join(map(str, c)))
    out = []
    for label, group in rows.groupby("_set", sort=False):
        C = label.count(",") + 1  # every key of the group has these C chunks, in chunk order
        delta = group["delta_ce_sum"].to_numpy(np.float64).reshape(-1, C)
        clean = group["ce_clean_sum"].to_numpy(np.float64).reshape(-1, C)
        tokens = group["n_tokens"].to_numpy(np.float64).reshape(-1, C)
        keys = group.iloc[::C]
        total = tokens.sum(axis=1)
        if C > 1:
            lo, hi = ratio_interval(delta, tokens[0], bootstrap_counts(C, n_boot, seed))
        else:  # resampling one chunk gives that chunk every time: no interval, not a point one
            lo = hi = np.full(len(delta), np.nan)
        out.append(pd.DataFrame({
            "layer": keys["layer"].to_numpy(np.int64), "head": keys["head"].to_numpy(np.int64),
            "method": keys["method"].to_numpy(), "_m": keys["_m"].to_numpy(),
            "criticality": delta.sum(axis=1) / total, "criticality_lo": lo, "criticality_hi": hi,
            "ce_clean": clean.sum(axis=1) / total, "n_chunks": np.full(len(keys), C, dtype=np.int64),
            "n_tokens": total.astype(np.int64),
        }))
    columns = ["layer", "head", "method", "criticality", "criticality_lo", "criticality_hi", "ce_clean", "n_chunks",
               "n_tokens"]
    if not out:
        return pd.DataFrame(columns=columns)
    table = pd.concat(out, ignore_index=True).sort_values(["layer", "head", "_m"], kind="stable")
    return table[columns].reset_index(drop=True)


# ----------------------------------------------------------------------------- in memory
def criticality(
    adapter,
    token_ids: Tensor,
    methods: Sequence[str] = ("mean",),
    heldout_chunks: int = 4,
    batch_size: int = 4,
    n_boot: int = 1000,
    seed: int = 0,
    layers: Collection[int] | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Ablation criticality of every head, in memory (the ablate stage without a run directory).

    Parameters
    ----------
    adapter : Adapter
    token_ids : LongTensor, shape (chunks, T)
        The run's chunks; the last ``heldout_chunks`` are held out.
    methods : sequence of {"mean", "zero", "resample"}
    heldout_chunks, batch_size, n_boot, seed : int
        As the stage's options (``batch_size``: held-out and mean chunks per forward pass).
    layers : collection of int, optional
        Only these layers' heads (default all).
    progress : callable, optional
        Called with 1 after each head of each batch.

    Returns
    -------
    table, rows : DataFrame
        The ``ablation`` table (:func:`aggregate`) and the per-chunk rows it came from.
    """
    token_ids = torch.as_tensor(token_ids)
    mean_idx, held_idx = split_chunks(token_ids.shape[0], heldout_chunks)
    wanted = sorted(range(adapter.n_layers) if layers is None else layers)
    means = head_means(adapter, token_ids[mean_idx], batch_size) if "mean" in methods else None
    pairs = resample_sources(len(mean_idx), len(held_idx))
    frames = []
    for start in range(0, len(held_idx), batch_size):
        batch = held_idx[start : start + batch_size]
        clean = clean_pass(adapter, token_ids[batch], batch, keep=wanted)
        sources = (head_outputs(adapter, token_ids[mean_idx[pairs[start : start + batch_size]]], wanted)
                   if "resample" in methods else None)
        for layer in wanted:
            frames.append(layer_rows(adapter, clean, layer, methods, means, sources, progress))
        del clean, sources
    rows = pd.concat(frames, ignore_index=True)
    return aggregate(rows, methods, n_boot, seed), rows
