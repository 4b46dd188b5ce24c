"""Attention sub-layer factors: isolated (one-token) and in-context (§B1).

``isolated`` (both isolated modes): the token's residual as a one-token sequence; softmax
weight 1, so attention is its value-output path ``Wo E Wv`` between the pre- and post-norm
Jacobians (:func:`isolated_attn_factor`), and :func:`isolated_attn_update` is what it adds to
the residual (the ``isolated`` mode's MLP reads ``x`` plus it).
``in_context``: the diagonal block ``d h_{l+1}[t] / d h_l[t]`` with every other position of
the chunk held fixed; keys and values of the chunk are computed once (:class:`Chunk`), and
only the token's query, own key and own value vary (derivation in :mod:`.engines`). Both
read the model only through the adapter's public interface: its
:class:`~depthlens.models.weights.LayerWeights`, score scale and soft-cap, causal /
sliding-window mask and rotary embedding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError
from ..models.adapter import Adapter
from ..models.weights import LayerWeights, Norm
from .factor import Factor

__all__ = ["Chunk", "in_context_attn_factor", "isolated_attn_factor", "isolated_attn_update"]


def _raw_values(adapter: Adapter, layer: int, ops: LayerWeights, n: Tensor) -> Tensor:
    """``Wv n + bv`` of pre-normed residuals ``n (N, d)``, per key/value head: (N, KV, hd)."""
    v = n @ ops.Wv.T
    if ops.bv is not None:
        v = v + ops.bv
    return v.reshape(-1, adapter.layer_kv_heads(layer), adapter.layer_head_dim(layer))


def _head_values(adapter: Adapter, layer: int, ops: LayerWeights, x: Tensor) -> Tensor:
    """The values ``v_norm(Wv n + bv)`` of residuals ``x (N, d)`` read by ``ops``'s pre-norm: (N, KV, hd)."""
    v = _raw_values(adapter, layer, ops, ops.attn_in(x) if ops.attn_in is not None else x)
    return ops.v_norm(v) if ops.v_norm is not None else v


def _output(adapter: Adapter, layer: int, ops: LayerWeights, values: Tensor) -> Tensor:
    """``Wo E values + bo`` (N, d) of one-token attention (softmax weight 1) from values (N, KV, hd), before any post-norm."""
    rep = adapter.n_heads // values.shape[1]
    a = torch.repeat_interleave(values, rep, dim=1).reshape(values.shape[0], -1) @ ops.Wo.T
    return a if ops.bo is None else a + ops.bo


def isolated_attn_update(adapter: Adapter, layer: int, ops: LayerWeights, x: Tensor,
                         source: tuple[LayerWeights, Tensor] | None = None) -> Tensor:
    """What the attention sub-layer adds to one-token sequences ``x (N, d)``: ``post(Wo E v +
    bo)`` with ``v`` the token's value (the value-output path, post-norm included), so ``x +
    update`` is the block-internal pre-MLP state of the ``isolated`` mode. A layer that reads
    an earlier layer's keys and values (``ops.kv_shared``) takes ``v`` from ``source``: that
    layer's weights and its pre-attention residuals at the same tokens. Exact in the weights' dtype."""
    if ops.kv_shared and source is None:
        raise InputError(f"layer {layer} attends with layer {adapter.kv_source(layer)}'s keys and values; pass that "
                         "layer's pre-attention residuals (kv) at the same tokens.")
    a = _output(adapter, layer, ops, _head_values(adapter, layer, *(source or (ops, x))))
    return ops.attn_post(a) if ops.attn_post is not None else a


def _value_jacobian(adapter: Adapter, layer: int, ops: LayerWeights, raw: Tensor) -> Tensor:
    """``d v / d n`` per query head with a value norm, at raw values ``raw (N, KV, hd)``
    (:func:`_raw_values`): ``J_v(raw) Wv``, (N, H, hd, d)."""
    KV, hd = raw.shape[1:]
    J = ops.v_norm.jacobian(raw).left(ops.Wv.reshape(KV, hd, -1))  # type: ignore[union-attr]
    return torch.repeat_interleave(J, adapter.n_heads // KV, dim=1)


def isolated_attn_factor(adapter: Adapter, layer: int, ops: LayerWeights, x: Tensor) -> Factor:
    """Attention sub-layer on one-token sequences ``x (N, d)``: value-output path only (an
    update of zero where the keys and values are an earlier layer's, ``ops.kv_shared``)."""
    N, d = x.shape
    if ops.kv_shared:  # softmax weight 1 on a value that does not depend on x
        return Factor(x.new_zeros(d, 1), N, A=x.new_zeros(N, 1, d))
    R = ops.attn_in.jacobian(x) if ops.attn_in is not None else None
    raw = None
    if ops.attn_post is not None or ops.v_norm is not None:  # the values are read
        raw = _raw_values(adapter, layer, ops, ops.attn_in(x) if ops.attn_in is not None else x)
    P = None
    if ops.attn_post is not None:
        values = ops.v_norm(raw) if ops.v_norm is not None else raw
        P = ops.attn_post.jacobian(_output(adapter, layer, ops, values))
    if ops.v_norm is None:
        M = ops.value_output(adapter.n_heads, adapter.layer_kv_heads(layer), adapter.layer_head_dim(layer))
        return Factor(M, N, R=R, P=P)
    return Factor(ops.Wo, N, A=_value_jacobian(adapter, layer, ops, raw).reshape(N, -1, d), R=R, P=P)  # type: ignore[arg-type]


def _rope(
    adapter: Adapter, layer: int, T: int, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor] | None:
    """The model's (cos, sin) for positions 0 .. T-1, cast to ``dtype``; None without RoPE."""
    if not adapter.has_rope:
        return None
    like = torch.empty(0, dtype=dtype, device=device)
    cos, sin = adapter.rope_cos_sin(layer, T, like)
    return cos.to(dtype), sin.to(dtype)


def _qk_jacobian(norm: Norm | None, raw: Tensor, W: Tensor, heads: int, hd: int, per_head: bool) -> Tensor:
    """``d(norm(W n + b))/dn`` per head: (N, heads, hd, d); ``raw`` (N, heads * hd) is ``W n + b``."""
    N = raw.shape[0]
    d = W.shape[1]
    if norm is None:
        return W.reshape(heads, hd, d).expand(N, heads, hd, d)
    if per_head:
        J = norm.jacobian(raw.reshape(N, heads, hd))
        return J.left(W.reshape(heads, hd, d))
    J = norm.jacobian(raw)
    return J.left(W).reshape(N, heads, hd, d)


class Chunk:
    """Keys and values of every position of a batch of chunks, computed once per (layer, batch).

    ``ops`` and ``h`` are those of the layer that computes them: ``layer`` itself, or the
    earlier layer whose keys and values it reads (:meth:`~depthlens.models.adapter.Adapter.kv_source`,
    whose shapes, rotary embedding and mask are ``layer``'s).
    """

    def __init__(self, adapter: Adapter, layer: int, ops: LayerWeights, h: Tensor) -> None:
        B, T, _ = h.shape
        KV, hd = adapter.layer_kv_heads(layer), adapter.layer_head_dim(layer)
        n = ops.attn_in(h) if ops.attn_in is not None else h
        k = n @ ops.Wk.T
        if ops.bk is not None:
            k = k + ops.bk
        if ops.k_norm is not None:
            k = ops.k_norm(k.reshape(B, T, KV, hd)).reshape(B, T, -1) if ops.qk_per_head else ops.k_norm(k)
        v = n @ ops.Wv.T
        if ops.bv is not None:
            v = v + ops.bv
        self.k = k.reshape(B, T, KV, hd).transpose(1, 2)  # (B, KV, T, hd), before RoPE
        v = v.reshape(B, T, KV, hd)
        self.v = (ops.v_norm(v) if ops.v_norm is not None else v).transpose(1, 2)
        self.rope = _rope(adapter, layer, T, h.dtype, h.device)
        if self.rope is not None:
            cos, sin = self.rope
            _, self.k = adapter.apply_rope(self.k[:1, :1], self.k, cos, sin)  # (the query slot gets a dummy)
        self.allowed = adapter.allowed_positions(layer, T, h.device)  # (T, T)


def _rotation(adapter: Adapter, cos: Tensor, sin: Tensor, hd: int) -> Tensor:
    """RoPE as matrices ``R (N, hd, hd)`` from per-token ``cos, sin (N, rot)`` (apply to the identity)."""
    N = cos.shape[0]
    eye = torch.eye(hd, dtype=cos.dtype, device=cos.device).expand(N, 1, hd, hd)
    c = cos[:, None, :].expand(N, hd, cos.shape[-1])
    s = sin[:, None, :].expand(N, hd, sin.shape[-1])
    rows, _ = adapter.apply_rope(eye, eye, c, s)  # row j = (R e_j)^T
    return rows[:, 0].transpose(-1, -2)


def in_context_attn_factor(
    adapter: Adapter, layer: int, ops: LayerWeights, ctx: Chunk, h: Tensor, b: Tensor, t: Tensor
) -> Factor:
    """Attention at tokens ``(b, t)`` of the chunks behind ``ctx``; ``h (N, d)`` their residuals.
    Where the keys and values are an earlier layer's (``ops.kv_shared``), only the query varies."""
    H, KV, hd = adapter.n_heads, adapter.layer_kv_heads(layer), adapter.layer_head_dim(layer)
    rep = H // KV
    N = h.shape[0]
    scale = adapter.attention_scale(layer)
    cap = adapter.attention_softcap(layer)
    R_pre = ops.attn_in.jacobian(h) if ops.attn_in is not None else None
    n = ops.attn_in(h) if ops.attn_in is not None else h
    q_raw = n @ ops.Wq.T
    if ops.bq is not None:
        q_raw = q_raw + ops.bq
    if ops.q_norm is not None:
        qt = ops.q_norm(q_raw.reshape(N, H, hd)) if ops.qk_per_head else ops.q_norm(q_raw).reshape(N, H, hd)
    else:
        qt = q_raw.reshape(N, H, hd)
    if ctx.rope is not None:
        cos, sin = ctx.rope
        Rt = _rotation(adapter, cos[0, t], sin[0, t], hd)  # (N, hd, hd)
        q = torch.einsum("nij,nhj->nhi", Rt, qt)
    else:
        Rt = None
        q = qt
    K = torch.repeat_interleave(ctx.k[b], rep, dim=1)  # (N, H, T, hd)
    V = torch.repeat_interleave(ctx.v[b], rep, dim=1)
    raw = torch.einsum("nhd,nhjd->nhj", q, K) * scale
    if cap is not None:
        th = torch.tanh(raw / cap)
        scores, kappa = th * cap, 1.0 - th * th
    else:
        scores, kappa = raw, None
    mask = ctx.allowed[t][:, None, :]  # (N, 1, T)
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    w = p if kappa is None else p * kappa
    o = torch.einsum("nhj,nhjd->nhd", p, V)
    kbar = torch.einsum("nhj,nhjd->nhd", w, K)
    G = (V * w[..., None]).transpose(-1, -2) @ K  # sum_j w_j v_j k_j^T
    G = scale * (G - o[..., :, None] * kbar[..., None, :])
    if Rt is not None:
        G = G @ Rt[:, None]
        q_back = torch.einsum("nji,nhj->nhi", Rt, q)  # R_t^T q
    else:
        q_back = q
    Jq = _qk_jacobian(ops.q_norm, q_raw, ops.Wq, H, hd, ops.qk_per_head)  # (N, H, hd, d)
    A = (G @ Jq).reshape(N, H * hd, -1)
    if not ops.kv_shared:
        _own_key_and_value(adapter, layer, ops, A, n, q_back, w, p, V, o, t, scale)
    P = None
    if ops.attn_post is not None:
        a = o.reshape(N, H * hd) @ ops.Wo.T
        if ops.bo is not None:
            a = a + ops.bo
        P = ops.attn_post.jacobian(a)
    return Factor(ops.Wo, N, A=A, R=R_pre, P=P)


def _own_key_and_value(adapter: Adapter, layer: int, ops: LayerWeights, A: Tensor, n: Tensor, q_back: Tensor,
                       w: Tensor, p: Tensor, V: Tensor, o: Tensor, t: Tensor, scale: float) -> None:
    """Add to ``A (N, H hd, d)`` what the token's own key and value contribute (in place)."""
    N, H, hd = q_back.shape
    KV = adapter.layer_kv_heads(layer)
    rep = H // KV
    k_raw = n @ ops.Wk.T
    if ops.bk is not None:
        k_raw = k_raw + ops.bk
    Jk = _qk_jacobian(ops.k_norm, k_raw, ops.Wk, KV, hd, ops.qk_per_head)  # (N, KV, hd, d)
    ar = torch.arange(N, device=n.device)
    w_t = w[ar, :, t]  # (N, H)
    p_t = p[ar, :, t]
    v_t = V[ar, :, t]  # (N, H, hd): the token's own value
    qg = q_back.reshape(N, KV, rep, hd)  # query heads grouped by the key they read
    if ops.k_norm is None:  # constant Jk = Wk: no per-token copy
        row = torch.einsum("ngre,ged->ngrd", qg, ops.Wk.reshape(KV, hd, -1))
    else:
        row = qg @ Jk
    row = row.reshape(N, H, -1)  # row_h = (R_t^T q_h)^T dk~/dn of its group
    coef = (scale * w_t)[..., None] * (v_t - o)  # (N, H, hd)
    if ops.v_norm is None:
        Wv = torch.repeat_interleave(ops.Wv.reshape(KV, hd, -1), rep, dim=0)  # (H, hd, d)
    else:
        Wv = _value_jacobian(adapter, layer, ops, _raw_values(adapter, layer, ops, n))  # (N, H, hd, d)
    heads = A.view(N * H, hd, -1)
    heads.baddbmm_(coef.reshape(N * H, hd, 1), row.reshape(N * H, 1, -1))
    heads.view(N, H, hd, -1).addcmul_(p_t[..., None, None], Wv)
