"""Sub-layer Jacobians at observed residuals: validation, token chunks and the two entry points.

:func:`sublayer_jacobians` materialises ``J = I + U`` per token and
:func:`sublayer_jacobian_sum` sums them; both walk the selected tokens ``_TOKEN_CHUNK`` at a
time through the factors of :mod:`.factor` (MLP) and :mod:`.attention_factors` (attention),
on the layer's cached weights (:func:`~depthlens.jacobian._layers.layer_ops`). The method
(modes, exactness, precision, cost) is described in :mod:`depthlens.jacobian.engines`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..models.adapter import SUBLAYERS, Adapter, Sublayer, check_sublayer
from ._layers import layer_ops
from .attention_factors import Chunk, in_context_attn_factor, isolated_attn_factor, isolated_attn_update
from .factor import Factor, mlp_factor
from .options import JACOBIAN_MODES, JacobianMode

__all__ = [
    "KINDS",
    "POSITIONS",
    "check_dtype",
    "check_jacobian_mode",
    "input_state",
    "select_positions",
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

    ``2 * layer`` (the pre-attention residual) for ``attn``, and for ``mlp`` in the
    ``isolated`` mode, whose MLP input is computed inside the one-token block from it;
    ``2 * layer + 1`` (the observed pre-MLP residual) for ``mlp`` in ``isolated_observed`` and
    ``in_context``, except on parallel-residual models, whose MLP reads the pre-attention
    state ``2 * layer`` in every mode.
    """
    adapter.check_layer(layer)
    check_sublayer(kind)
    check_jacobian_mode(jacobian_mode)
    if kind == "mlp" and jacobian_mode != "isolated" and not adapter.parallel_residual:
        return 2 * layer + 1
    return 2 * layer


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


def _factors(
    adapter: Adapter,
    residuals: Tensor,
    layer: int,
    kind: Sublayer,
    jacobian_mode: JacobianMode,
    positions: str | int | Sequence[int],
    dtype: torch.dtype,
) -> Iterator[Factor]:
    """Yield the factored Jacobians of the selected tokens, ``_TOKEN_CHUNK`` tokens at a time, batch-major."""
    check_sublayer(kind)
    check_jacobian_mode(jacobian_mode)
    check_dtype(dtype)
    adapter.check_layer(layer)
    r = _check_residuals(adapter, residuals)
    B, T, _ = r.shape
    pos = select_positions(positions, T)
    dev = adapter.device
    ops = layer_ops(adapter, layer, dtype)
    b_idx = torch.arange(B, device=dev).repeat_interleave(len(pos))
    t_idx = torch.tensor(pos, device=dev).repeat(B)
    in_context = jacobian_mode == "in_context" and kind == "attn"
    block_internal = jacobian_mode == "isolated" and kind == "mlp" and not adapter.parallel_residual
    with torch.no_grad():
        if in_context:
            h = _check_finite(r[:, : max(pos) + 1].to(device=dev, dtype=dtype))
            ctx = Chunk(adapter, layer, ops, h)
        else:
            h = _check_finite(r[:, pos].to(device=dev, dtype=dtype))
    for s in range(0, b_idx.numel(), _TOKEN_CHUNK):
        b, t = b_idx[s : s + _TOKEN_CHUNK], t_idx[s : s + _TOKEN_CHUNK]
        with torch.no_grad():  # closed before the yield: a consumer stopped there keeps its grad mode
            if in_context:
                factor = in_context_attn_factor(adapter, layer, ops, ctx, h[b, t], b, t)
            else:
                x = h.reshape(-1, h.shape[-1])[s : s + _TOKEN_CHUNK]
                if kind == "attn":
                    factor = isolated_attn_factor(adapter, ops, x)
                elif block_internal:
                    factor = mlp_factor(ops, x + isolated_attn_update(adapter, ops, x))
                else:
                    factor = mlp_factor(ops, x)
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
    kind : {"attn", "mlp"}
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
    chunks = [f.dense() for f in _factors(adapter, residuals, layer, kind, jacobian_mode, positions, dtype)]
    return torch.cat(chunks, dim=0)


def sublayer_jacobian_sum(
    adapter: Adapter,
    residuals: Tensor,
    layer: int,
    kind: Sublayer,
    jacobian_mode: JacobianMode = "isolated",
    positions: str | int | Sequence[int] = "last",
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, int]:
    """``(sum_n J_n (d, d), N)`` over the selected tokens, as :func:`sublayer_jacobians` would give.

    Faster than summing the stack: the constant left factor (``Wo``, ``Wd``) is applied once
    to the summed token factors (exact up to float rounding; see :meth:`~depthlens.jacobian.factor.Factor.total`).
    """
    total = None
    count = 0
    for f in _factors(adapter, residuals, layer, kind, jacobian_mode, positions, dtype):
        s = f.total()
        total = s if total is None else total + s
        count += f.n
    assert total is not None
    total.diagonal().add_(float(count))
    return total, count
