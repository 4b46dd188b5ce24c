"""Sub-layer Jacobians at observed residuals: validation, token chunks and the two entry points.

:func:`sublayer_jacobians` materialises ``J = I + U`` per token and
:func:`sublayer_jacobian_sum` sums them; both walk the selected tokens ``_TOKEN_CHUNK`` at a
time through the factors of :mod:`.factor` (MLP) and :mod:`.attention_factors` (attention),
on the layer's cached weights (:func:`~depthlens.jacobian._layers.layer_ops`). The method
(modes, exactness, precision, cost) is described in :mod:`depthlens.jacobian.engines`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..models.adapter import SUBLAYERS, Adapter, Sublayer
from ._layers import layer_ops
from .attention_factors import Chunk, in_context_attn_factor, isolated_attn_factor, isolated_attn_update
from .factor import Factor, mlp_factor, mlp_update, ple_factor
from .options import JACOBIAN_MODES, JacobianMode

__all__ = [
    "KINDS",
    "POSITIONS",
    "check_dtype",
    "check_jacobian_mode",
    "engine_states",
    "input_state",
    "kv_state",
    "read_states",
    "select_positions",
    "state_reads",
    "sublayer_jacobian_sum",
    "sublayer_jacobians",
]

POSITIONS: tuple[str, ...] = ("last", "all")
KINDS: tuple[Sublayer, ...] = SUBLAYERS

#: tokens handled together inside the engines (bounds memory: the in-context engine holds
#: ``chunk x H x T x hd`` keys, the MLP engine ``chunk x F x d`` factors)
_TOKEN_CHUNK = 32


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------


def input_state(adapter: Adapter, layer: int, kind: Sublayer, jacobian_mode: JacobianMode = "isolated") -> int:
    """Index into :meth:`Adapter.residual_states` of the observed residual the engines read for
    sub-layer ``kind`` of ``layer`` in ``jacobian_mode``.

    With ``S`` boundaries a layer (:attr:`Adapter.sublayers`): ``S * layer`` (the pre-attention
    residual) in the ``isolated`` mode, whose later sub-layers read states computed inside the
    one-token block from it, and for attention; ``S * layer + i`` (the observed residual
    before the ``i``-th sub-layer, e.g. the pre-MLP state) in ``isolated_observed`` and
    ``in_context``, except on parallel-residual models, whose MLP reads the pre-attention
    state in every mode.
    """
    adapter.check_layer(layer)
    adapter.check_kind(kind)
    check_jacobian_mode(jacobian_mode)
    first = len(adapter.sublayers) * layer
    if jacobian_mode == "isolated" or adapter.parallel_residual:
        return first
    return first + adapter.sublayers.index(kind)


def kv_state(adapter: Adapter, layer: int, kind: Sublayer, jacobian_mode: JacobianMode = "isolated") -> int | None:
    """Index into :meth:`Adapter.residual_states` of the pre-attention residual of the layer whose
    keys and values ``layer`` reads (:meth:`Adapter.kv_source`), where the engine for ``kind``
    needs it: the ``in_context`` attention (keys and values of the chunk) and the later
    sub-layers of the ``isolated`` block (the token's own value); None otherwise."""
    input_state(adapter, layer, kind, jacobian_mode)  # checks the arguments
    source = adapter.kv_source(layer)
    needed = (kind == "attn" and jacobian_mode == "in_context") or (kind != "attn" and jacobian_mode == "isolated")
    return len(adapter.sublayers) * source if source != layer and needed else None


def state_reads(adapter: Adapter, layer: int, kind: Sublayer,
                jacobian_mode: JacobianMode = "isolated") -> tuple[int, int | None, int | None]:
    """Indices into :func:`engine_states` of what the engine reads for sub-layer ``kind`` of
    ``layer``: the residual (:func:`input_state`), the key/value source's residual
    (:func:`kv_state`, or None) and the layer's per-layer inputs (for ``ple``, or None)."""
    first = len(adapter.sublayers) * adapter.n_layers + 1
    return (input_state(adapter, layer, kind, jacobian_mode), kv_state(adapter, layer, kind, jacobian_mode),
            first + layer if kind == "ple" else None)


def engine_states(adapter: Adapter, input_ids: Tensor) -> Sequence[Tensor]:
    """Everything the engines read of a batch of chunks, indexed as :func:`state_reads` says:
    :meth:`Adapter.residual_states`, then (where the family has them) each layer's per-layer
    inputs ``(B, T, dp)``. Inside :meth:`Adapter.shared_passes` the residual states of a batch
    computed before are not computed again (e.g. the Jacobian modes of one checkpoint)."""
    states = adapter.residual_states(input_ids)
    per_layer = adapter.per_layer_inputs(input_ids)
    return states if per_layer is None else [*states, *per_layer.unbind(2)]


def read_states(states: Sequence[Tensor] | Mapping[int, Tensor],
                reads: tuple[int, int | None, int | None]) -> tuple[Tensor, dict[str, Tensor | None]]:
    """``(residuals, {"kv": ..., "layer_input": ...})`` of ``states`` at ``reads`` (:func:`state_reads`),
    as the engines take them."""
    i, kv, p = reads
    return states[i], {"kv": None if kv is None else states[kv], "layer_input": None if p is None else states[p]}


def check_jacobian_mode(jacobian_mode: str) -> str:
    """``jacobian_mode`` if it is one of :data:`~depthlens.jacobian.options.JACOBIAN_MODES`;
    else :class:`InputError`."""
    if jacobian_mode not in JACOBIAN_MODES:
        raise InputError(f"jacobian_mode {jacobian_mode!r} is not one of {JACOBIAN_MODES}.")
    return jacobian_mode


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if the engines support it (float64, float32); else :class:`InputError`."""
    if dtype not in (torch.float64, torch.float32):
        raise InputError(f"dtype {dtype} is not supported for Jacobians; use torch.float64 (default) or torch.float32.")
    return dtype


def select_positions(positions: str | int | Sequence[int], T: int) -> list[int]:
    """Token positions ``0 .. T-1`` named by ``positions`` ("last", "all", an int or ints, negative from the end).

    Raises
    ------
    InputError
        For anything else, an empty list or out-of-range positions.
    """
    if isinstance(positions, str):
        if positions == "last":
            return [T - 1]
        if positions == "all":
            return list(range(T))
        raise InputError(f"positions {positions!r} is not one of {POSITIONS} or a list of token positions.")
    pos = [positions] if isinstance(positions, (int, np.integer)) else list(positions)
    if not pos:
        raise InputError("positions is empty; pass 'last', 'all' or at least one position.")
    out = []
    for p in pos:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -T <= int(p) < T:
            raise InputError(f"position {p!r} is out of range for chunks of {T} tokens.")
        out.append(int(p) % T)
    return out


def _check_residuals(adapter: Adapter, residuals: Tensor) -> Tensor:
    r = torch.as_tensor(residuals)
    if r.ndim == 2:
        r = r.unsqueeze(0)
    if r.ndim != 3 or r.shape[-1] != adapter.d_model or r.shape[1] == 0 or r.shape[0] == 0:
        raise InputError(
            f"residuals have shape {tuple(r.shape)}; pass (B, T, d) states with d = {adapter.d_model} "
            "(one slice of residual_states)."
        )
    if not r.is_floating_point():
        raise InputError(f"residuals have dtype {r.dtype}; pass floating-point states.")
    return r


def _check_finite(h: Tensor) -> Tensor:
    if not bool(torch.isfinite(h).all()):
        raise InputError("residuals hold NaN or infinite values at the requested positions; check the forward pass.")
    return h


def _extra(given: Tensor | None, needed: bool, like: Tensor, width: int, what: str, fix: str) -> Tensor | None:
    """An extra per-token input of the engine (``(B, T, width)`` over the chunks of ``like``),
    checked where ``needed``; one-line :class:`InputError` when it is missing or misshaped."""
    if not needed:
        return None
    if given is None:
        raise InputError(f"{what} is needed here and was not given; {fix}.")
    x = torch.as_tensor(given)
    if x.ndim == 2:
        x = x.unsqueeze(0)
    if x.ndim != 3 or x.shape[:2] != like.shape[:2] or x.shape[-1] != width or not x.is_floating_point():
        raise InputError(f"{what} has shape {tuple(x.shape)}, dtype {x.dtype}; pass floating-point {tuple(like.shape[:2])}"
                         f" + ({width},) values at the residuals' tokens; {fix}.")
    return x


def _factors(
    adapter: Adapter,
    residuals: Tensor,
    layer: int,
    kind: Sublayer,
    jacobian_mode: JacobianMode,
    positions: str | int | Sequence[int],
    dtype: torch.dtype,
    kv: Tensor | None = None,
    layer_input: Tensor | None = None,
) -> Iterator[Factor]:
    """Yield the factored Jacobians of the selected tokens, ``_TOKEN_CHUNK`` tokens at a time, batch-major."""
    check_jacobian_mode(jacobian_mode)
    check_dtype(dtype)
    adapter.check_layer(layer)
    adapter.check_kind(kind)
    r = _check_residuals(adapter, residuals)
    B, T, _ = r.shape
    pos = select_positions(positions, T)
    dev = adapter.device
    ops = layer_ops(adapter, layer, dtype)
    source = adapter.kv_source(layer)
    kv_r = _extra(kv, kv_state(adapter, layer, kind, jacobian_mode) is not None, r, adapter.d_model,
                  f"kv (the pre-attention residuals of layer {source}, whose keys and values layer {layer} reads)",
                  f"pass residual_states(ids)[{len(adapter.sublayers) * source}]")
    p = _extra(layer_input, kind == "ple", r, adapter.per_layer_width,
               f"layer_input (layer {layer}'s per-layer inputs)", f"pass per_layer_inputs(ids)[:, :, {layer}]")
    src_ops = layer_ops(adapter, source, dtype) if kv_r is not None else None
    scale = ops.out_scale if kind == adapter.sublayers[-1] else 1.0
    b_idx = torch.arange(B, device=dev).repeat_interleave(len(pos))
    t_idx = torch.tensor(pos, device=dev).repeat(B)
    in_context = jacobian_mode == "in_context" and kind == "attn"
    block_internal = jacobian_mode == "isolated" and kind != "attn" and not adapter.parallel_residual

    def tokens(x: Tensor | None) -> Tensor | None:  # the selected tokens, (B * len(pos), width)
        return None if x is None else _check_finite(x[:, pos].to(device=dev, dtype=dtype)).reshape(-1, x.shape[-1])

    with torch.no_grad():
        if in_context:
            h = _check_finite(r[:, : max(pos) + 1].to(device=dev, dtype=dtype))
            ctx = Chunk(adapter, layer, ops, h) if src_ops is None else \
                Chunk(adapter, layer, src_ops, _check_finite(kv_r[:, : max(pos) + 1].to(device=dev, dtype=dtype)))
        else:
            h, kv_t, p_t = tokens(r), tokens(kv_r), tokens(p)
    for s in range(0, b_idx.numel(), _TOKEN_CHUNK):
        b, t = b_idx[s : s + _TOKEN_CHUNK], t_idx[s : s + _TOKEN_CHUNK]
        with torch.no_grad():  # closed before the yield: a consumer stopped there keeps its grad mode
            if in_context:
                factor = in_context_attn_factor(adapter, layer, ops, ctx, h[b, t], b, t)
            else:
                x = h[s : s + _TOKEN_CHUNK]
                if kind == "attn":
                    factor = isolated_attn_factor(adapter, layer, ops, x)
                else:
                    if block_internal:  # the state before this sub-layer inside the one-token block
                        shared = None if src_ops is None else (src_ops, kv_t[s : s + _TOKEN_CHUNK])
                        x = x + isolated_attn_update(adapter, layer, ops, x, shared)
                        if kind == "ple":
                            x = x + mlp_update(ops, x)
                    factor = mlp_factor(ops, x, scale) if kind == "mlp" else \
                        ple_factor(ops, x, p_t[s : s + _TOKEN_CHUNK], scale)
        yield factor


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------


def sublayer_jacobians(
    adapter: Adapter,
    residuals: Tensor,
    layer: int,
    kind: Sublayer,
    jacobian_mode: JacobianMode = "isolated",
    positions: str | int | Sequence[int] = "last",
    dtype: torch.dtype = torch.float64,
    kv: Tensor | None = None,
    layer_input: Tensor | None = None,
) -> Tensor:
    """Jacobians ``J = I + U`` of sub-layer ``kind`` of ``layer`` at the selected tokens: (N, d, d).

    Parameters
    ----------
    adapter : Adapter
    residuals : Tensor (B, T, d)
        The observed states the engine reads, ``adapter.residual_states(ids)[input_state(adapter,
        layer, kind, jacobian_mode)]``: the pre-attention residual for attention and for the
        ``isolated`` MLP, the pre-MLP residual for the other MLP modes (for ``in_context``
        attention, every position up to the selected ones is used as context).
    layer : int
    kind : {"attn", "mlp", "ple"}
        One of the model's :attr:`~depthlens.models.adapter.Adapter.sublayers`; the last one
        of a layer includes the scalar multiplying the layer's output (Gemma 4), so that it
        maps its boundary to the next layer's input.
    jacobian_mode : {"isolated", "isolated_observed", "in_context"}
        See :mod:`depthlens.jacobian.engines`. Attention is the same one-token operator in
        both isolated modes; the ``isolated`` MLP is taken at ``x + Attn(x)`` inside the
        one-token block (so ``mlp @ attn`` is that block's Jacobian), the MLP of the other
        two modes at the observed pre-MLP residual (the same operator in both).
    positions : "last" (default), "all", an int or a sequence of ints
        Token positions (negative counts from the end). Output order is batch-major:
        ``(b0 p0, b0 p1, ..., b1 p0, ...)``.
    dtype : torch.float64 (default) or torch.float32
        Arithmetic dtype (weights are cast once and cached).
    kv : Tensor (B, T, d), optional
        Where ``layer`` attends with an earlier layer's keys and values
        (:meth:`~depthlens.models.adapter.Adapter.kv_source`) and the engine reads them
        (:func:`kv_state`: ``in_context`` attention, the later sub-layers of the ``isolated``
        block): that layer's pre-attention residuals of the same chunks. Attention on such a
        layer varies through its query alone; its one-token (isolated) update is zero.
    layer_input : Tensor (B, T, dp), optional
        For ``ple``: the layer's per-layer inputs of the same chunks
        (:meth:`~depthlens.models.adapter.Adapter.per_layer_inputs`).

    Returns
    -------
    Tensor (N, d, d) with ``N = B x len(positions)``, on the adapter's device.

    Cost
        Isolated attention O(d^2) per token; MLP one ``d x F x d`` product per token;
        in-context attention O(H T hd^2 + H hd d) plus one ``d x (H hd) x d`` product per token.

    Raises
    ------
    InputError
        Bad kind, jacobian_mode, positions, dtype, layer or residual shape / non-finite values.
    """
    chunks = [f.dense() for f in _factors(adapter, residuals, layer, kind, jacobian_mode, positions, dtype, kv,
                                          layer_input)]
    return torch.cat(chunks, dim=0)


def sublayer_jacobian_sum(
    adapter: Adapter,
    residuals: Tensor,
    layer: int,
    kind: Sublayer,
    jacobian_mode: JacobianMode = "isolated",
    positions: str | int | Sequence[int] = "last",
    dtype: torch.dtype = torch.float64,
    kv: Tensor | None = None,
    layer_input: Tensor | None = None,
) -> tuple[Tensor, int]:
    """``(sum_n J_n (d, d), N)`` over the selected tokens, as :func:`sublayer_jacobians` would give.

    Faster than summing the stack: the constant left factor (``Wo``, ``Wd``) is applied once
    to the summed token factors (exact up to float rounding; see :meth:`~depthlens.jacobian.factor.Factor.total`).
    """
    total = None
    count, scale = 0, 1.0
    for f in _factors(adapter, residuals, layer, kind, jacobian_mode, positions, dtype, kv, layer_input):
        s = f.total()
        total = s if total is None else total + s
        count, scale = count + f.n, f.scale
    assert total is not None
    total.diagonal().add_(float(count))
    return (total if scale == 1.0 else total.mul_(scale)), count
