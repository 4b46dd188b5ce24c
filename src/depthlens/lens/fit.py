"""Fit Jacobian-lens transport matrices natively, in float64.

For a prompt of T tokens, with ``h_ℓ,t`` the output of block ℓ at position t and
``h_final,t`` the last block's output (before the final norm), the transport of layer ℓ is

    J_ℓ = (1/|V|) Σ_{t∈V} Σ_{t′≥t} ∂h_final,t′ / ∂h_ℓ,t,

averaged over prompts, where V are the valid source positions: all but the first
``skip_first`` (16 in the reference estimator) and the last ``skip_last`` (1). Causality
makes ``∂h_final,t′/∂h_ℓ,t`` zero for ``t′ < t``, so the sum over ``t′ ≥ t`` is the Jacobian of
``S = Σ_{t′} h_final,t′`` (a d-vector): row i of ``J_ℓ`` is the gradient of ``S_i`` with
respect to ``h_ℓ``, summed over ``t ∈ V``. One forward pass and d backward passes (in batches
of directions) therefore give every layer's transport at once: exact to float64 rounding
(the model is run as a float64 copy, :mod:`depthlens.models.float64`), no finite differences
and no truncation.

Cost per prompt: d backward passes through the network (about ``2 d`` forward passes' work);
memory: the activations of one float64 forward pass, plus the gradients of ``batch``
directions at every layer (``L · batch · T · d`` float64 numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..models.adapter import Adapter, adapter_for
from ..models.float64 import Float64Mode, double_copy

__all__ = ["SKIP_FIRST", "SKIP_LAST", "TransportSums", "prompt_transport", "valid_positions"]

#: Source positions the reference estimator skips at the start of a prompt, and at its end.
SKIP_FIRST = 16
SKIP_LAST = 1
#: Float64 numbers of gradients held at once (``L · batch · T · d``): about 0.5 GB.
GRADIENT_BUDGET = 64 * 1024 * 1024


def valid_positions(T: int, skip_first: int = SKIP_FIRST, skip_last: int = SKIP_LAST) -> np.ndarray:
    """The source positions V of a prompt of ``T`` tokens: ``skip_first ≤ t < T − skip_last``.

    Raises
    ------
    InputError
        When no position is left, naming the prompt length that is needed.
    """
    if skip_first < 0 or skip_last < 0:
        raise InputError(f"skip_first and skip_last are {skip_first} and {skip_last}; pass counts >= 0.")
    if T - skip_last <= skip_first:
        raise InputError(f"a prompt of {T} tokens has no source position once the first {skip_first} and the last "
                         f"{skip_last} are skipped; use prompts of at least {skip_first + skip_last + 1} tokens "
                         "or skip fewer.")
    return np.arange(skip_first, T - skip_last)


def prompt_transport(adapter: Adapter, input_ids: Tensor, layers: list[int] | None = None, *,
                     skip_first: int = SKIP_FIRST, skip_last: int = SKIP_LAST,
                     batch: int | None = None) -> dict[int, np.ndarray]:
    """The transport matrices of one prompt: ``{ℓ: (1/|V|) Σ_{t∈V} Σ_{t′≥t} ∂h_final,t′/∂h_ℓ,t}``.

    Parameters
    ----------
    adapter : Adapter
        A float64 model's adapter (see :class:`TransportSums`, which makes one); the model's
        own forward pass runs under :class:`~depthlens.models.float64.Float64Mode` with a zero
        offset after each block (:meth:`~depthlens.models.adapter.Adapter.layer_offsets`), so
        every path from ``h_ℓ`` to ``h_final`` counts, keys and values that later layers share
        included.
    input_ids : Tensor, shape (T,) or (1, T)
        One prompt.
    layers : list of int, optional
        Source layers (default: every layer, ``0 .. L − 1``; the last one's transport is the
        identity).
    skip_first, skip_last : int
        Positions left out of V (:func:`valid_positions`).
    batch : int, optional
        Output directions per backward pass (default: as many as :data:`GRADIENT_BUDGET`
        allows). The result does not depend on it beyond float64 rounding.

    Returns
    -------
    dict of int to ndarray (d, d), float64
        ``J[i, j] = ∂(Σ_{t′} h_final,t′)_i / ∂(h_ℓ)_j`` summed over V and divided by ``|V|``.
    """
    ids = adapter.checked_ids(input_ids)
    if ids.shape[0] != 1:
        raise InputError(f"prompt_transport takes one prompt; got a batch of {ids.shape[0]}.")
    L, d, T = adapter.n_layers, adapter.d_model, ids.shape[1]
    layers = list(range(L)) if layers is None else [adapter.check_layer(layer) for layer in layers]
    V = torch.as_tensor(valid_positions(T, skip_first, skip_last))
    step = batch or max(1, min(d, GRADIENT_BUDGET // max(1, L * T * d)))
    with torch.enable_grad(), Float64Mode():
        h, offsets = adapter.layer_offsets(ids)  # a zero offset after each block: its gradient is that of h_ℓ
        S = h[0].sum(dim=0)  # Σ_{t′} h_final,t′
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

    ``TransportSums.for_model(model)`` runs a float64 copy of a Hugging Face causal LM (or of an
    adapter's model); :meth:`add` adds a prompt, :meth:`mean` is the transport.
    """

    adapter: Adapter
    layers: list[int]
    skip_first: int = SKIP_FIRST
    skip_last: int = SKIP_LAST
    sums: dict[int, np.ndarray] = field(default_factory=dict)
    n_done: int = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, layers: list[int] | None = None, **kwargs: int) -> TransportSums:
        """Start sums for ``model`` (copied to float64; the original is left alone)."""
        adapter = adapter_for(double_copy(model).eval())
        return cls(adapter, list(range(adapter.n_layers)) if layers is None else list(layers), **kwargs)

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
