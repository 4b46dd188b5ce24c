"""Exact sub-layer Jacobians of the residual stream (METHODS B1), in closed form.

Operators
    For every layer ``l`` two maps, skip connection included, ``J = I + U``:
    ``attn`` (pre-attention residual -> pre-MLP residual) and ``mlp`` (pre-MLP residual ->
    next pre-attention residual). Each is evaluated at an observed residual (from
    :meth:`Adapter.residual_states`) and returned as a dense ``(d, d)`` matrix per token.

Modes
    ``isolated`` (default): the token's residual fed through the sub-layer as a one-token
    sequence. One key means softmax weight 1, so attention is its value-output path and
    ``U_attn = P(a) Wo E Wv N(x)`` where ``N`` is the pre-norm Jacobian, ``E`` repeats each
    key/value head for the query heads of its group, and ``P`` the post-norm Jacobian (Gemma 3,
    OLMo 2/3) at the attention output ``a``. RoPE and q/k norms act on queries and keys only,
    so they drop out. ``Wo E Wv`` is formed once per layer, so a token costs O(d^2).
    ``in_context``: the diagonal block ``d h_{l+1}[t] / d h_l[t]`` with every other position
    of the chunk held fixed. Keys and values of the other positions are computed once per
    chunk; only the token's query, own key and own value vary. Per query head ``h`` (key/value
    group ``g``) with weights ``p_j``, softmax-slope ``kappa_j`` (1 without soft-capping),
    ``w_j = kappa_j p_j``, output ``o = sum_j p_j v_j`` and ``kbar = sum_j w_j k_j``:

    - through the query: ``do/dq = c (sum_j w_j v_j k_j^T - o kbar^T)``, ``c`` the score scale;
    - through the own key: ``do/dk_t = c w_t (v_t - o) q^T``;
    - through the own value: ``do/dv_t = p_t I``;

    RoPE is the fixed rotation ``R_t`` (``q = R_t q~``, ``k_t = R_t k~_t``), q/k norms enter
    through their Jacobians, so ``do/dn = (do/dq) R_t Jq Wq + (do/dk_t) R_t Jk Wk + p_t Wv``
    (``n`` the normed residual) and ``U = P(a) Wo (do/dn) N(h_t)``.
    The MLP is position-wise, so both modes give the same MLP operator at the same residual.
    MLP: ``U_mlp = P(out) Wd [diag(act'(u) * w) Wg + diag(act(u)) Wu] N(x)`` (gated:
    Llama, Gemma 3, OLMo) or ``P(out) Wd diag(act'(u)) Wi N(x)`` (GPT-2, GPT-NeoX); ``act'``
    comes from forward-mode differentiation of the model's own activation module (exact for an
    elementwise function). Norm Jacobians: see :class:`~depthlens.jacobian._layers.NormJacobian`.

Parallel residual (GPT-NeoX / Pythia with ``use_parallel_residual``)
    The layer is ``h' = h + A(h) + F(h)``: both branches read the pre-attention state ``h``.
    depthlens defines ``attn = I + dA/dh`` and ``mlp = I + dF/dh``, both evaluated at ``h``
    (state ``2l``; :func:`input_state` says which state to pass). The block Jacobian is
    ``I + dA/dh + dF/dh = attn + mlp - I``, which differs from the product ``mlp @ attn`` by
    ``dF/dh dA/dh``: cumulative products over such operators are a convention, not the model's
    exact chain rule.

Precision
    Every engine reads the layer's weights once, casts them to ``dtype`` (float64 by default)
    and caches them per adapter (:func:`~depthlens.jacobian._layers.layer_ops`); all arithmetic,
    norms included, runs in that dtype. The operator is that of the float64 copy of the weights
    (for a float32 model: exactly the model's weights, evaluated without float32 rounding).
    RoPE angles are the model's own (its rotary module computes cos/sin in float32), used as
    they are. Residual inputs are cast to ``dtype``.

Cost (d model width, F MLP width, H query heads of width hd, T context)
    Per token and layer, materialised (``sublayer_jacobians``): isolated attention O(d^2);
    in-context attention O(H T hd^2 + H hd^2 d) plus one ``d x (H hd) x d`` product; MLP one
    ``d x F x d`` product (the same FLOPs as one reverse-mode Jacobian, so the dense MLP path is
    no faster than autograd in the same dtype). Summed (``sublayer_jacobian_sum``,
    ``mean_operators``): the constant left factor (``Wo``, ``Wd``) is applied once per batch to
    the summed token factors, so a token costs O(F d) (MLP) or O(H hd d + H T hd^2) (attention)
    and a batch adds one ``d x K x d`` product.

Examples
--------
>>> import torch
>>> from depthlens.models import load_model
>>> from depthlens.jacobian.engines import sublayer_jacobians, input_state
>>> ad = load_model("random:llama").adapter
>>> hs = ad.residual_states(torch.randint(0, 256, (2, 8)))
>>> J = sublayer_jacobians(ad, hs[input_state(ad, 0, "attn")], 0, "attn", mode="in_context")
>>> J.shape, J.dtype
(torch.Size([2, 64, 64]), torch.float64)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..errors import InputError
from ._layers import LayerOps, NormJacobian, clear_cache, layer_ops

__all__ = [
    "MODES",
    "POSITIONS",
    "MeanAccumulator",
    "clear_cache",
    "input_state",
    "mean_operators",
    "sublayer_jacobian_sum",
    "sublayer_jacobians",
]

MODES: tuple[str, ...] = ("isolated", "in_context")
POSITIONS: tuple[str, ...] = ("last", "all")
KINDS: tuple[str, ...] = ("attn", "mlp")

#: tokens handled together inside the engines (bounds memory: the in-context engine holds
#: ``chunk x H x T x hd`` keys, the MLP engine ``chunk x F x d`` factors)
_TOKEN_CHUNK = 32


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------


def input_state(adapter, layer: int, kind: str) -> int:
    """Index into :meth:`Adapter.residual_states` of the residual that sub-layer ``kind`` of ``layer`` reads.

    ``2 * layer`` for ``attn``; ``2 * layer + 1`` for ``mlp``, except on parallel-residual
    models, whose MLP reads the pre-attention state ``2 * layer``.
    """
    adapter._check_layer(layer)
    _check_kind(kind)
    if kind == "mlp" and not adapter.parallel_residual:
        return 2 * layer + 1
    return 2 * layer


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise InputError(f"sublayer {kind!r} is not one of {KINDS}.")
    return kind


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise InputError(f"mode {mode!r} is not one of {MODES}.")
    return mode


def _check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in (torch.float64, torch.float32):
        raise InputError(f"dtype {dtype} is not supported for Jacobians; use torch.float64 (default) or torch.float32.")
    return dtype


def _positions(positions: str | int | Sequence[int], T: int) -> list[int]:
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


def _check_residuals(adapter, residuals: Tensor) -> Tensor:
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


# ---------------------------------------------------------------------------------------
# the factored form U = P W A R of a batch of tokens
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Factor:
    """``U_n = P_n @ W @ A_n @ R_n`` for a batch of N tokens; a missing factor is the identity.

    ``W`` (d, K) is constant (``Wo``, ``Wd`` or ``Wo E Wv``). The token factor ``A_n`` (K, m) is
    either dense (``A`` (N, K, m)) or a sum of row-scaled constant matrices
    ``A_n = sum_i diag(alphas[n, i]) Bs[i]`` (the MLP: ``Bs = (Wg, Wu)``), or the identity.
    ``R`` is the pre-norm Jacobian (size m), ``P`` the post-norm Jacobian (size d), both
    structured (:class:`NormJacobian`).
    """

    W: Tensor
    n: int
    A: Tensor | None = None
    alphas: Tensor | None = None
    Bs: tuple[Tensor, ...] = ()
    R: NormJacobian | None = None
    P: NormJacobian | None = None

    def _A_dense(self) -> Tensor | None:
        if self.alphas is None:
            return self.A
        A = self.alphas[:, 0, :, None] * self.Bs[0]
        for i in range(1, len(self.Bs)):
            A.addcmul_(self.alphas[:, i, :, None], self.Bs[i])
        return A

    def dense(self) -> Tensor:
        """``J = I + U``: (N, d, d)."""
        A = self._A_dense()
        X = self.W @ A if A is not None else self.W.expand(self.n, *self.W.shape)
        if self.R is not None:
            X = self.R.right(X)
        if self.P is not None:
            X = self.P.left(X)
        elif A is None and self.R is None:
            X = X.clone()
        X.diagonal(dim1=-2, dim2=-1).add_(1.0)
        return X

    def _weighted(self, c: Tensor) -> Tensor:
        """``sum_n c_n A_n R_n`` (K, m), without forming ``A_n R_n`` token by token.

        With ``R_n = diag(g) (I - V_n^T V_n / m) / s_n``:
        ``sum_n (c_n/s_n) A_n diag(g) - sum_n (c_n/(s_n m)) (A_n (g * V_n)^T) V_n``.
        """
        R = self.R
        w = c if R is None else c / R.scale
        K = self.W.shape[1]
        dt = self.W.dtype
        if self.alphas is not None:
            aw = torch.einsum("n,nik->ik", w, self.alphas)
            S = sum(aw[i, :, None] * B for i, B in enumerate(self.Bs))
        elif self.A is not None:
            S = torch.einsum("n,nkm->km", w, self.A)
        else:
            S = torch.diag(w.sum().expand(K)).to(dt)
        if R is None:
            return S
        S = S * R.gain
        gV = R.vecs * R.gain  # (N, c, m)
        if self.alphas is not None:  # A_n (g V_n)^T = sum_i alpha_in * (B_i (g V_n)^T)
            AV = sum(self.alphas[:, i, None, :] * (gV @ B.T) for i, B in enumerate(self.Bs))  # (N, c, K)
        elif self.A is not None:
            AV = gV @ self.A.transpose(-1, -2)
        else:
            AV = gV
        return S - torch.einsum("n,nck,ncm->km", w / R.m, AV, R.vecs)

    def _rows(self, Z: Tensor) -> Tensor:
        """``Z_n A_n R_n`` for left vectors ``Z (N, c, K)``: (N, c, m)."""
        if self.alphas is not None:
            rows = sum((Z * self.alphas[:, i, None, :]) @ B for i, B in enumerate(self.Bs))
        elif self.A is not None:
            rows = Z @ self.A
        else:
            rows = Z
        return self.R.right(rows) if self.R is not None else rows

    def total(self) -> Tensor:
        """``sum_n U_n`` (d, d) with ``W`` applied once to summed token factors.

        No post-norm: ``W sum_n A_n R_n``. With ``P_n = diag(g) (I - sum_c u u^T / d) / s_n``:
        ``diag(g) [W sum_n A_n R_n / s_n - sum_n sum_c u_nc (u_nc^T W A_n R_n) / (d s_n)]``.
        Cost O(N K m) in matrix products plus one ``d x K x m`` product, instead of N of them.
        """
        ones = torch.ones(self.n, dtype=self.W.dtype, device=self.W.device)
        if self.P is None:
            return self.W @ self._weighted(ones)
        P = self.P
        first = self.W @ self._weighted(1.0 / P.scale)
        rows = self._rows(P.vecs @ self.W)  # (N, c, m)
        second = torch.einsum("n,ncd,nce->de", 1.0 / (P.scale * P.m), P.vecs, rows)
        return P.gain[:, None] * (first - second)


def _act_and_slope(act, u: Tensor) -> tuple[Tensor, Tensor]:
    """``act(u)`` and its elementwise derivative, by forward-mode differentiation of the model's activation."""
    return torch.func.jvp(act, (u,), (torch.ones_like(u),))


def _mlp_factor(ops: LayerOps, x: Tensor) -> _Factor:
    """MLP sub-layer at residuals ``x (N, d)``."""
    R = ops.mlp_in.jacobian(x) if ops.mlp_in is not None else None
    n = ops.mlp_in(x) if ops.mlp_in is not None else x
    u = n @ ops.Wg.T
    if ops.bg is not None:
        u = u + ops.bg
    f, df = _act_and_slope(ops.act, u)
    if ops.Wu is not None:
        w = n @ ops.Wu.T
        if ops.bu is not None:
            w = w + ops.bu
        alphas, Bs = torch.stack([df * w, f], dim=1), (ops.Wg, ops.Wu)
        z = f * w
    else:
        alphas, Bs = df[:, None, :], (ops.Wg,)
        z = f
    P = None
    if ops.mlp_post is not None:
        out = z @ ops.Wd.T
        if ops.bd is not None:
            out = out + ops.bd
        P = ops.mlp_post.jacobian(out)
    return _Factor(ops.Wd, x.shape[0], alphas=alphas, Bs=Bs, R=R, P=P)


def _isolated_attn_factor(adapter, ops: LayerOps, x: Tensor) -> _Factor:
    """Attention sub-layer on one-token sequences ``x (N, d)``: value-output path only."""
    H, KV, hd = adapter.n_heads, adapter.n_kv_heads, adapter.head_dim
    M = ops.value_output(H, KV, hd)
    R = ops.attn_in.jacobian(x) if ops.attn_in is not None else None
    P = None
    if ops.attn_post is not None:
        n = ops.attn_in(x) if ops.attn_in is not None else x
        a = n @ M.T
        if ops.bv is not None:
            bv = torch.repeat_interleave(ops.bv.reshape(KV, hd), H // KV, dim=0).reshape(-1)
            a = a + ops.Wo @ bv
        if ops.bo is not None:
            a = a + ops.bo
        P = ops.attn_post.jacobian(a)
    return _Factor(M, x.shape[0], R=R, P=P)


def _rope(adapter, layer: int, T: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor] | None:
    """The model's (cos, sin) for positions 0 .. T-1, cast to ``dtype``; None without RoPE."""
    if adapter._rope_module() is None or adapter._rotary_fn is None:
        return None
    like = torch.empty(0, dtype=dtype, device=device)
    cos, sin = adapter._position_embeddings(layer, T, like)
    return cos.to(dtype), sin.to(dtype)


def _qk_jacobian(norm, raw: Tensor, W: Tensor, heads: int, hd: int, per_head: bool) -> Tensor:
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


class _Chunk:
    """Keys and values of every position of a batch of chunks, computed once per (layer, batch)."""

    def __init__(self, adapter, layer: int, ops: LayerOps, h: Tensor) -> None:
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
            _, self.k = adapter._rotate(self.k[:1, :1], self.k, cos, sin)  # (the query slot gets a dummy)
        self.allowed = adapter._allowed(layer, T, h.device)  # (T, T)


def _rotation(adapter, cos: Tensor, sin: Tensor, hd: int) -> Tensor:
    """RoPE as matrices ``R (N, hd, hd)`` from per-token ``cos, sin (N, rot)`` (apply to the identity)."""
    N = cos.shape[0]
    eye = torch.eye(hd, dtype=cos.dtype, device=cos.device).expand(N, 1, hd, hd)
    c = cos[:, None, :].expand(N, hd, cos.shape[-1])
    s = sin[:, None, :].expand(N, hd, sin.shape[-1])
    rows, _ = adapter._rotate(eye, eye, c, s)  # row j = (R e_j)^T
    return rows[:, 0].transpose(-1, -2)


def _in_context_attn_factor(adapter, layer: int, ops: LayerOps, ctx: _Chunk, h: Tensor, b: Tensor, t: Tensor) -> _Factor:
    """Attention at tokens ``(b, t)`` of the chunks behind ``ctx``; ``h (N, d)`` their residuals."""
    H, KV, hd = adapter.n_heads, adapter.n_kv_heads, adapter.head_dim
    rep = H // KV
    N = h.shape[0]
    scale = adapter._scaling(layer)
    cap = adapter._softcap(layer)
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
    return _Factor(ops.Wo, N, A=A, R=R_pre, P=P)


def _factors(
    adapter, residuals: Tensor, layer: int, kind: str, mode: str, positions, dtype: torch.dtype
) -> Iterator[_Factor]:
    """Yield the factored Jacobians of the selected tokens, ``_TOKEN_CHUNK`` tokens at a time, batch-major."""
    _check_kind(kind)
    _check_mode(mode)
    _check_dtype(dtype)
    adapter._check_layer(layer)
    r = _check_residuals(adapter, residuals)
    B, T, _ = r.shape
    pos = _positions(positions, T)
    dev = adapter.device
    ops = layer_ops(adapter, layer, dtype)
    b_idx = torch.arange(B, device=dev).repeat_interleave(len(pos))
    t_idx = torch.tensor(pos, device=dev).repeat(B)
    in_context = mode == "in_context" and kind == "attn"
    with torch.no_grad():
        if in_context:
            h = _check_finite(r[:, : max(pos) + 1].to(device=dev, dtype=dtype))
            ctx = _Chunk(adapter, layer, ops, h)
        else:
            h = _check_finite(r[:, pos].to(device=dev, dtype=dtype))
        for s in range(0, b_idx.numel(), _TOKEN_CHUNK):
            b, t = b_idx[s : s + _TOKEN_CHUNK], t_idx[s : s + _TOKEN_CHUNK]
            if in_context:
                yield _in_context_attn_factor(adapter, layer, ops, ctx, h[b, t], b, t)
                continue
            x = h.reshape(-1, h.shape[-1])[s : s + _TOKEN_CHUNK]
            if kind == "attn":
                yield _isolated_attn_factor(adapter, ops, x)
            else:
                yield _mlp_factor(ops, x)


# ---------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------


def sublayer_jacobians(
    adapter,
    residuals: Tensor,
    layer: int,
    kind: str,
    mode: str = "isolated",
    positions: str | int | Sequence[int] = "last",
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Jacobians ``J = I + U`` of sub-layer ``kind`` of ``layer`` at the selected tokens: (N, d, d).

    Parameters
    ----------
    adapter : Adapter
    residuals : Tensor (B, T, d)
        The states the sub-layer reads, ``adapter.residual_states(ids)[input_state(adapter,
        layer, kind)]`` (for ``in_context`` attention, every position up to the selected ones
        is used as context).
    layer : int
    kind : {"attn", "mlp"}
    mode : {"isolated", "in_context"}
        See the module docstring. The MLP operator is the same in both modes.
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
        Bad kind, mode, positions, dtype, layer or residual shape / non-finite values.
    """
    chunks = [f.dense() for f in _factors(adapter, residuals, layer, kind, mode, positions, dtype)]
    return torch.cat(chunks, dim=0)


def sublayer_jacobian_sum(
    adapter,
    residuals: Tensor,
    layer: int,
    kind: str,
    mode: str = "isolated",
    positions: str | int | Sequence[int] = "last",
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, int]:
    """``(sum_n J_n (d, d), N)`` over the selected tokens, as :func:`sublayer_jacobians` would give.

    Faster than summing the stack: the constant left factor (``Wo``, ``Wd``) is applied once
    to the summed token factors (exact up to float rounding; see ``_Factor.total``).
    """
    total = None
    count = 0
    for f in _factors(adapter, residuals, layer, kind, mode, positions, dtype):
        s = f.total()
        total = s if total is None else total + s
        count += f.n
    assert total is not None
    total.diagonal().add_(float(count))
    return total, count


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
        self._sum: dict[tuple[int, str], Tensor] = {}
        self._count: dict[tuple[int, str], int] = {}

    def add(self, layer: int, kind: str, jacobians: Tensor) -> None:
        """Add a stack of operators ``(N, d, d)`` (or one ``(d, d)``)."""
        J = torch.as_tensor(jacobians)
        if J.ndim == 2:
            J = J.unsqueeze(0)
        if J.ndim != 3 or J.shape[-1] != J.shape[-2]:
            raise InputError(f"jacobians have shape {tuple(J.shape)}; pass (N, d, d) or (d, d).")
        self.add_sum(layer, kind, J.to(torch.float64).sum(0), J.shape[0])

    def add_sum(self, layer: int, kind: str, total: Tensor, count: int) -> None:
        """Add a precomputed sum of ``count`` operators."""
        total = torch.as_tensor(total).to(torch.float64)
        key = (int(layer), _check_kind(kind))
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

    def keys(self) -> list[tuple[int, str]]:
        return sorted(self._sum, key=lambda k: (k[0], KINDS.index(k[1])))

    def count(self, layer: int, kind: str) -> int:
        return self._count.get((int(layer), kind), 0)

    def mean(self) -> dict[tuple[int, str], np.ndarray]:
        """``{(layer, kind): sum / count}`` as float64 numpy arrays, in layer order."""
        return {k: (self._sum[k] / self._count[k]).cpu().numpy() for k in self.keys()}


def mean_operators(
    adapter,
    input_ids: Tensor,
    mode: str = "isolated",
    positions: str | int | Sequence[int] = "last",
    batch_size: int = 8,
    progress: bool = False,
    layers: Iterable[int] | None = None,
    dtype: torch.dtype = torch.float64,
    accumulator: MeanAccumulator | None = None,
    label: str = "",
) -> dict[tuple[int, str], np.ndarray]:
    """Mean operators ``J̄ = (1/N) sum J`` of every layer's ``attn`` and ``mlp`` over chunks.

    One forward pass per batch of chunks gives the residual states; then, per layer, the
    engines sum the operators of the selected positions (:func:`sublayer_jacobian_sum`).

    Parameters
    ----------
    adapter : Adapter
    input_ids : Tensor (N, T)
        Token chunks (BOS already prepended where wanted).
    mode, positions, dtype
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
        Names the model in the progress bar (``jacobians <label> (<mode>)``), e.g. ``step-0 null``.

    Returns
    -------
    dict ``{(layer, kind): ndarray (d, d)}`` in float64, layers in order, ``attn`` before ``mlp``.

    Raises
    ------
    InputError
        Bad ids, mode, positions, batch size or layers.
    """
    _check_mode(mode)
    _check_dtype(dtype)
    ids = torch.as_tensor(input_ids)
    if ids.ndim == 1:
        ids = ids.unsqueeze(0)
    if ids.ndim != 2 or ids.shape[0] == 0:
        raise InputError(f"input_ids has shape {tuple(ids.shape)}; pass token chunks (N, T).")
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"batch_size {batch_size!r} must be a positive integer.")
    _positions(positions, ids.shape[1])
    wanted = list(range(adapter.n_layers)) if layers is None else [adapter._check_layer(int(x)) for x in layers]
    acc = MeanAccumulator() if accumulator is None else accumulator
    starts = range(0, ids.shape[0], int(batch_size))
    bar = tqdm(total=len(starts) * len(wanted), desc=f"jacobians {label} ({mode})" if label else f"jacobians ({mode})", unit="layer", disable=not progress)
    try:
        for s in starts:
            states = adapter.residual_states(ids[s : s + int(batch_size)])
            for layer in wanted:
                for kind in KINDS:
                    total, count = sublayer_jacobian_sum(
                        adapter, states[input_state(adapter, layer, kind)], layer, kind, mode, positions, dtype
                    )
                    acc.add_sum(layer, kind, total, count)
                bar.update(1)
            del states
    finally:
        bar.close()
    out = acc.mean()
    return {k: out[k] for k in out if k[0] in set(wanted)} if layers is not None else out
