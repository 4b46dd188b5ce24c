"""Attention sub-layer factors: isolated (one-token) and in-context (METHODS B1).

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

from ..models.adapter import Adapter
from ..models.weights import LayerWeights, Norm
from .factor import Factor

__all__ = ["Chunk", "in_context_attn_factor", "isolated_attn_factor", "isolated_attn_update"]


def _value_output(adapter: Adapter, ops: LayerWeights, x: Tensor) -> Tensor:
    """The output projection of one-token attention at residuals ``x (N, d)``, before any
    post-norm: ``Wo E (Wv n + bv) + bo`` with ``n`` the pre-normed ``x`` (softmax weight 1)."""
    H, KV, hd = adapter.n_heads, adapter.n_kv_heads, adapter.head_dim
    n = ops.attn_in(x) if ops.attn_in is not None else x
    a = n @ ops.value_output(H, KV, hd).T
    if ops.bv is not None:
        bv = torch.repeat_interleave(ops.bv.reshape(KV, hd), H // KV, dim=0).reshape(-1)
        a = a + ops.Wo @ bv
    if ops.bo is not None:
        a = a + ops.bo
    return a


def isolated_attn_update(adapter: Adapter, ops: LayerWeights, x: Tensor) -> Tensor:
    """What the attention sub-layer adds to one-token sequences ``x (N, d)``: ``post(Wo E (Wv
    n + bv) + bo)`` (the value-output path, post-norm included), so ``x + update`` is the
    block-internal pre-MLP state of the ``isolated`` mode. Exact in the weights' dtype."""
    a = _value_output(adapter, ops, x)
    return ops.attn_post(a) if ops.attn_post is not None else a


def isolated_attn_factor(adapter: Adapter, ops: LayerWeights, x: Tensor) -> Factor:
    """Attention sub-layer on one-token sequences ``x (N, d)``: value-output path only."""
    M = ops.value_output(adapter.n_heads, adapter.n_kv_heads, adapter.head_dim)
    R = ops.attn_in.jacobian(x) if ops.attn_in is not None else None
    P = ops.attn_post.jacobian(_value_output(adapter, ops, x)) if ops.attn_post is not None else None
    return Factor(M, x.shape[0], R=R, P=P)


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
    """Keys and values of every position of a batch of chunks, computed once per (layer, batch)."""

    def __init__(self, adapter: Adapter, layer: int, ops: LayerWeights, h: Tensor) -> None:
        B, T, _ = h.shape
        KV, hd = adapter.n_kv_heads, adapter.head_dim
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
        self.v = v.reshape(B, T, KV, hd).transpose(1, 2)
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
    """Attention at tokens ``(b, t)`` of the chunks behind ``ctx``; ``h (N, d)`` their residuals."""
    H, KV, hd = adapter.n_heads, adapter.n_kv_heads, adapter.head_dim
    rep = H // KV
    N = h.shape[0]
    scale = adapter.attention_scale(layer)
    cap = adapter.attention_softcap(layer)
    R_pre = ops.attn_in.jacobian(h) if ops.attn_in is not None else None
    n = ops.attn_in(h) if ops.attn_in is not None else h
    q_raw = n @ ops.Wq.T
    if ops.bq is not None:
        q_raw = q_raw + ops.bq
    k_raw = n @ ops.Wk.T
    if ops.bk is not None:
        k_raw = k_raw + ops.bk
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
    Jk = _qk_jacobian(ops.k_norm, k_raw, ops.Wk, KV, hd, ops.qk_per_head)  # (N, KV, hd, d)
    ar = torch.arange(N, device=h.device)
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
    Wv = torch.repeat_interleave(ops.Wv.reshape(KV, hd, -1), rep, dim=0)  # (H, hd, d)
    A = (G @ Jq).reshape(N * H, hd, -1)
    A = torch.baddbmm(A, coef.reshape(N * H, hd, 1), row.reshape(N * H, 1, -1))
    A = A.reshape(N, H, hd, -1).addcmul_(p_t[..., None, None], Wv).reshape(N, H * hd, -1)
    P = None
    if ops.attn_post is not None:
        a = o.reshape(N, H * hd) @ ops.Wo.T
        if ops.bo is not None:
            a = a + ops.bo
        P = ops.attn_post.jacobian(a)
    return Factor(ops.Wo, N, A=A, R=R_pre, P=P)
