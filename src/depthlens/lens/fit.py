"""Fit Jacobian-lens transport matrices natively, in float64: the reference estimator.

For a prompt of T tokens, with ``h_ℓ,t`` the output of block ℓ at position t and
``h_final,t`` the last block's output (before the final norm), the transport of layer ℓ is

    J_ℓ = (1/|V|) Σ_{t∈V} Σ_{t′∈V, t′≥t} ∂h_final,t′ / ∂h_ℓ,t,

averaged over prompts, where V are the valid positions: all but the first ``skip_first``
(16 by default) and the last ``skip_last`` (1). Sources and targets both range over V, as in
the reference fitting loop and TransformerLens's ``JacobianLens``. Causality makes
``∂h_final,t′/∂h_ℓ,t`` zero for ``t′ < t``, so the sum over targets is the Jacobian of
``S = Σ_{t′∈V} h_final,t′`` (a d-vector): row i of ``J_ℓ`` is the gradient of ``S_i`` with
respect to ``h_ℓ``, summed over ``t ∈ V``. One forward pass and d backward passes (in batches
of directions) give every source layer's transport at once, exact to float64 rounding: no
finite differences and no truncation. Source layers are ``0 .. L − 2``; the last block's
transport is the identity and is not fitted.

An in-memory model runs as a float64 copy (:mod:`depthlens.models.float64`) through its own
forward pass, so every path from ``h_ℓ`` to ``h_final`` counts (keys and values that later
layers share included). A layer-streamed model (:mod:`depthlens.models.streaming`) is
differentiated block by block from the top down, each block filled in float64 only while it
is used (one block resident in float64 at any time); it needs a model whose blocks read
nothing but the residual stream.

Cost per prompt: d backward passes through the network (about ``2 d`` forward passes' work);
memory: the activations of one float64 forward pass, plus the gradients of ``batch``
directions at every source layer (``L · batch · T · d`` float64 numbers); streamed, the
block outputs (``L · T · d``) and ``batch`` replicas of one block's activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..models.adapter import Adapter, adapter_for
from ..models.float64 import Float64Mode, double_copy

__all__ = ["SKIP_FIRST", "SKIP_LAST", "TransportSums", "prompt_transport", "source_layers", "valid_positions"]

#: Positions the reference estimator skips at the start of a prompt, and at its end.
SKIP_FIRST = 16
SKIP_LAST = 1
#: Float64 numbers of gradients held at once (``L · batch · T · d``): about 0.5 GB.
GRADIENT_BUDGET = 64 * 1024 * 1024


def valid_positions(T: int, skip_first: int = SKIP_FIRST, skip_last: int = SKIP_LAST) -> np.ndarray:
    """The valid positions V of a prompt of ``T`` tokens: ``skip_first ≤ t < T − skip_last``.

    Raises
    ------
    InputError
        When no position is left, naming the prompt length that is needed.

    Examples
    --------
    >>> valid_positions(20, 16, 1).tolist()
    [16, 17, 18]
    """
    if skip_first < 0 or skip_last < 0:
        raise InputError(f"skip_first and skip_last are {skip_first} and {skip_last}; pass counts >= 0.")
    if T - skip_last <= skip_first:
        raise InputError(f"a prompt of {T} tokens has no source position once the first {skip_first} and the last "
                         f"{skip_last} are skipped; use prompts of at least {skip_first + skip_last + 1} tokens "
                         "or skip fewer.")
    return np.arange(skip_first, T - skip_last)


def source_layers(n_layers: int, layers: Sequence[int] | None = None) -> list[int]:
    """The source layers of a lens of an ``n_layers`` model: ``layers`` sorted and checked, or
    every layer but the last (``0 .. n_layers − 2``) by default.

    Raises
    ------
    InputError
        A layer outside ``0 .. n_layers − 2`` (the last block's transport is the identity), or
        an empty list; one line naming ``--lens-layers``.

    Examples
    --------
    >>> source_layers(4), source_layers(4, [2, 0])
    ([0, 1, 2], [0, 2])
    """
    if n_layers < 2:
        raise InputError(f"a lens needs a model of at least 2 layers; this one has {n_layers}.")
    if layers is None or len(layers) == 0:
        if layers is not None:
            raise InputError("--lens-layers is empty; name at least one source layer, or leave it out for all.")
        return list(range(n_layers - 1))
    bad = [layer for layer in layers if isinstance(layer, bool) or not 0 <= int(layer) <= n_layers - 2]
    if bad:
        raise InputError(f"--lens-layers {','.join(map(str, bad))}: source layers are 0 .. {n_layers - 2} (the last "
                         f"block's transport is the identity); pass layers in that range.")
    return sorted({int(layer) for layer in layers})


def prompt_transport(adapter: Adapter, input_ids: Tensor, layers: Sequence[int] | None = None, *,
                     skip_first: int = SKIP_FIRST, skip_last: int = SKIP_LAST,
                     batch: int | None = None) -> dict[int, np.ndarray]:
    """The transport matrices of one prompt: ``{ℓ: (1/|V|) Σ_{t∈V} Σ_{t′∈V, t′≥t} ∂h_final,t′/∂h_ℓ,t}``.

    Parameters
    ----------
    adapter : Adapter
        A float64 model's adapter (see :class:`TransportSums`, which makes one), or a
        layer-streamed model's (each block is filled in float64 while it is differentiated).
        The in-memory model's own forward pass runs under
        :class:`~depthlens.models.float64.Float64Mode` with a zero offset after each block
        (:meth:`~depthlens.models.adapter.Adapter.layer_offsets`), so every path from ``h_ℓ``
        to ``h_final`` counts, keys and values that later layers share included.
    input_ids : Tensor, shape (T,) or (1, T)
        One prompt.
    layers : sequence of int, optional
        Source layers (:func:`source_layers`; default ``0 .. L − 2``).
    skip_first, skip_last : int
        Positions left out of V, as sources and as targets (:func:`valid_positions`).
    batch : int, optional
        Output directions per backward pass (default: as many as :data:`GRADIENT_BUDGET`
        allows). The result does not depend on it beyond float64 rounding.

    Returns
    -------
    dict of int to ndarray (d, d), float64
        ``J[i, j] = ∂(Σ_{t′∈V} h_final,t′)_i / ∂(h_ℓ)_j`` summed over ``t ∈ V`` and divided by ``|V|``.

    Raises
    ------
    InputError
        A batch of prompts, a prompt with no valid position, a layer outside ``0 .. L − 2``,
        or a streamed model whose blocks read more than the residual stream.
    """
    ids = adapter.checked_ids(input_ids)
    if ids.shape[0] != 1:
        raise InputError(f"prompt_transport takes one prompt; got a batch of {ids.shape[0]}.")
    L, d, T = adapter.n_layers, adapter.d_model, ids.shape[1]
    layers = source_layers(L, layers)
    V = torch.as_tensor(valid_positions(T, skip_first, skip_last))
    if adapter.streamer is not None:
        return _streamed_transport(adapter, ids, layers, V, batch)
    step = batch or max(1, min(d, GRADIENT_BUDGET // max(1, len(layers) * T * d)))
    with torch.enable_grad(), Float64Mode():
        h, offsets = adapter.layer_offsets(ids)  # a zero offset after each block: its gradient is that of h_ℓ
        S = h[0, V.to(h.device)].sum(dim=0)  # Σ_{t′∈V} h_final,t′
        wanted = [offsets[layer] for layer in layers]
        rows: dict[int, list[Tensor]] = {layer: [] for layer in layers}
        for start in range(0, d, step):
            n = min(step, d - start)
            directions = torch.zeros((n, d), dtype=torch.float64, device=S.device)
            directions[torch.arange(n), torch.arange(start, start + n)] = 1.0
            grads = _batched_vjp(S, wanted, directions)
            for layer, g in zip(layers, grads):
                rows[layer].append(g[:, 0, V.to(g.device)].sum(dim=1).detach())
    return {layer: (torch.cat(rows[layer]) / len(V)).cpu().numpy() for layer in layers}


def _check_streamable(adapter: Adapter) -> None:
    """Refuse a streamed fit where a block reads more than the previous block's output."""
    shared = [layer for layer in range(adapter.n_layers) if adapter.kv_source(layer) != layer]
    if shared or adapter.per_layer_width:
        why = "shares keys and values across layers" if shared else "feeds per-layer inputs to its blocks"
        raise InputError(f"{adapter.family} {why}, so its transport needs the whole model at once; fit the lens "
                         "without --stream-layers.")


def _streamed_transport(adapter: Adapter, ids: Tensor, layers: list[int], V: Tensor,
                        batch: int | None) -> dict[int, np.ndarray]:
    """:func:`prompt_transport` of a layer-streamed model: a float64 forward pass block by block
    that keeps each block's output, then, per batch of output directions, the cotangent
    ``∂S/∂h_ℓ`` carried from the top block down to the lowest source layer, one block's
    vector-Jacobian product at a time (the block recomputed from its kept input on ``batch``
    replicas of the prompt). At most one block is filled in float64 at any time."""
    _check_streamable(adapter)
    streamer = adapter.streamer
    L, d, T = adapter.n_layers, adapter.d_model, ids.shape[1]
    step = batch or max(1, min(d, GRADIENT_BUDGET // (8 * T * d)))
    V = V.to(adapter.device)
    try:
        outputs: list[Tensor] = []
        with torch.no_grad(), Float64Mode():
            h = adapter.embed(ids).to(torch.float64)
            for layer in range(L - 1):
                streamer.ensure(layer, torch.float64)
                h = adapter.block(layer)(h)
                outputs.append(h)
        rows: dict[int, list[Tensor]] = {layer: [] for layer in layers}
        for start in range(0, d, step):
            n = min(step, d - start)
            g = torch.zeros((n, T, d), dtype=torch.float64, device=adapter.device)
            g[:, V, :] = torch.eye(d, dtype=torch.float64, device=g.device)[start:start + n, None, :]
            for layer in range(L - 1, layers[0], -1):  # block `layer` maps h_{layer-1} to h_layer
                streamer.ensure(layer, torch.float64)
                with torch.enable_grad(), Float64Mode():
                    x = outputs[layer - 1].expand(n, T, d).clone().requires_grad_(True)
                    (g,) = torch.autograd.grad(adapter.block(layer)(x), x, grad_outputs=g)
                if layer - 1 in rows:
                    rows[layer - 1].append(g[:, V].sum(dim=1))
    finally:
        streamer.release()  # no float64 block is left for the next forward pass
    return {layer: (torch.cat(rows[layer]) / len(V)).cpu().numpy() for layer in layers}


def _batched_vjp(S: Tensor, inputs: list[Tensor], directions: Tensor) -> list[Tensor]:
    """``directions @ ∂S/∂x`` for every ``x`` of ``inputs``: ``(n, *x.shape)`` each. One
    batched backward pass where autograd can vectorise it, else one pass per direction."""
    try:
        return list(torch.autograd.grad(S, inputs, grad_outputs=directions, retain_graph=True, is_grads_batched=True,
                                        allow_unused=False))
    except RuntimeError:  # an operation without a batching rule
        parts = [torch.autograd.grad(S, inputs, grad_outputs=e, retain_graph=True) for e in directions]
        return [torch.stack([p[k] for p in parts]) for k in range(len(inputs))]


@dataclass
class TransportSums:
    """Running sums of per-prompt transports over prompts: the fit checkpoint's
    ``jacobian_sum`` and ``n_done``.

    :meth:`for_model` runs a float64 copy of a Hugging Face causal LM; :meth:`for_adapter`
    takes a loaded model's adapter (a layer-streamed one is fitted block by block, never
    copied). :meth:`add` adds a prompt, :meth:`mean` is the transport.

    Examples
    --------
    >>> sums = TransportSums.for_model(model, layers=[0, 3])   # doctest: +SKIP
    >>> sums.add(ids); sums.mean()[3].shape                   # doctest: +SKIP
    (576, 576)
    """

    adapter: Adapter
    layers: list[int]
    skip_first: int = SKIP_FIRST
    skip_last: int = SKIP_LAST
    sums: dict[int, np.ndarray] = field(default_factory=dict)
    n_done: int = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, layers: Sequence[int] | None = None, **kwargs: int) -> TransportSums:
        """Start sums for ``model`` (copied to float64; the original is left alone); ``layers``
        as :func:`source_layers` takes them."""
        adapter = adapter_for(double_copy(model).eval())
        return cls(adapter, source_layers(adapter.n_layers, layers), **kwargs)

    @classmethod
    def for_adapter(cls, adapter: Adapter, layers: Sequence[int] | None = None, **kwargs: int) -> TransportSums:
        """Start sums for a loaded model: a float64 copy of an in-memory one
        (:meth:`for_model`), or the layer-streamed model itself.

        Raises
        ------
        InputError
            A streamed model whose blocks read more than the residual stream.
        """
        if adapter.streamer is None:
            return cls.for_model(adapter.model, layers, **kwargs)
        _check_streamable(adapter)
        return cls(adapter, source_layers(adapter.n_layers, layers), **kwargs)

    def add(self, input_ids: Tensor) -> None:
        """Add one prompt's transports."""
        one = prompt_transport(self.adapter, input_ids, self.layers, skip_first=self.skip_first,
                               skip_last=self.skip_last)
        for layer, J in one.items():
            self.sums[layer] = self.sums[layer] + J if layer in self.sums else J
        self.n_done += 1

    def mean(self) -> dict[int, np.ndarray]:
        """The transport of each layer: the sums over :attr:`n_done` prompts."""
        if not self.n_done:
            raise InputError("no prompt was added; add at least one before taking the mean.")
        return {layer: self.sums[layer] / self.n_done for layer in self.layers}
