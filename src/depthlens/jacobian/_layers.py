"""Float64 (or float32) copies of one decoder layer's weights, in one shape for every family.

The Jacobian engines never call the Hugging Face modules: they read the weights once per
(adapter, layer, dtype), cast them, and evaluate the sub-layers from these copies. A
:class:`LayerOps` says, for one layer, which norm sits where (pre-norm, post-norm, q/k norms,
per head or over the full projection), the projection matrices in ``(out, in)`` form, the
MLP's shape (gated or not) and its activation. Copies are cached per adapter (weakly, so they
die with the adapter) and per dtype.

Norms
    ``rms``: ``y = g * x / r`` with ``r = sqrt(mean(x**2) + eps)`` (Llama, OLMo, and Gemma 3
    with ``g = 1 + weight``); ``ln``: ``y = g * (x - mean(x)) / s + b`` with
    ``s = sqrt(var(x) + eps)``, biased variance (``nn.LayerNorm``). Both are evaluated in the
    engine dtype (Hugging Face RMSNorms upcast to float32 only; here float64 stays float64).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import ModelError

__all__ = ["LayerOps", "Norm", "layer_ops"]


@dataclasses.dataclass
class Norm:
    """A normalisation over the last axis: ``kind`` ``"rms"`` or ``"ln"``, gain, optional bias, eps."""

    kind: str
    gain: Tensor
    bias: Tensor | None
    eps: float

    @property
    def size(self) -> int:
        return int(self.gain.shape[0])

    def stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``(scale (...), xhat (..., m))``: ``r`` (or ``s``) and the normalised ``x / r`` (``(x - mu) / s``)."""
        if self.kind == "rms":
            scale = torch.sqrt(x.pow(2).mean(-1) + self.eps)
            return scale, x / scale[..., None]
        c = x - x.mean(-1, keepdim=True)
        scale = torch.sqrt(c.pow(2).mean(-1) + self.eps)
        return scale, c / scale[..., None]

    def __call__(self, x: Tensor) -> Tensor:
        _, xhat = self.stats(x)
        y = xhat * self.gain
        return y if self.bias is None else y + self.bias

    def jacobian(self, x: Tensor) -> NormJacobian:
        """The structured Jacobian of the norm at ``x (..., m)``."""
        scale, xhat = self.stats(x)
        if self.kind == "rms":
            vecs = xhat[..., None, :]
        else:
            ones = torch.ones_like(xhat)
            vecs = torch.stack([ones, xhat], dim=-2)
        return NormJacobian(self.gain, scale, vecs)


@dataclasses.dataclass
class NormJacobian:
    """``J = diag(g) (I - sum_k v_k v_k^T / m) / s``, batched over leading axes.

    RMSNorm: one vector ``v = x / r`` (``s = r``); LayerNorm: ``v = 1`` and ``v = (x - mu) / s``
    (orthogonal, since the centred vector sums to zero). Derivation: for RMSNorm,
    ``dr/dx = x / (m r)``, so ``d(x/r)/dx = I/r - x x^T / (m r^3)``; for LayerNorm the centring
    ``C = I - 11^T/m`` and ``ds/dx = c^T / (m s)`` give ``(C - c c^T/(m s^2)) / s``. ``eps``
    sits inside ``r`` and ``s``, so these forms are exact with it.
    """

    gain: Tensor  # (m,)
    scale: Tensor  # (...,)
    vecs: Tensor  # (..., c, m)

    @property
    def m(self) -> int:
        return int(self.gain.shape[0])

    def right(self, X: Tensor) -> Tensor:
        """``X @ J`` for ``X (..., a, m)`` (leading axes broadcast with the Jacobian's)."""
        gs = self.gain / self.scale[..., None]  # (..., m)
        Xg = X * gs[..., None, :]
        same = Xg.dim() == 3 and self.vecs.dim() == 3 and Xg.shape[0] == self.vecs.shape[0]
        if same and X.stride(0) == 0:  # one matrix broadcast over tokens: one product for all
            y = torch.einsum("am,ncm->nac", X[0], self.vecs * gs[:, None, :])
        else:
            y = Xg @ self.vecs.transpose(-1, -2)  # (..., a, c)
        if same:
            return Xg.baddbmm_(y, self.vecs, alpha=-1.0 / self.m)
        return Xg.sub_(y @ self.vecs / self.m)

    def left(self, Y: Tensor) -> Tensor:
        """``J @ Y`` for ``Y (..., m, b)``."""
        z = self.vecs @ Y  # (..., c, b)
        vt = self.vecs.transpose(-1, -2)
        if Y.dim() == 3 and vt.dim() == 3 and Y.shape[0] == vt.shape[0]:
            out = torch.baddbmm(Y, vt, z, alpha=-1.0 / self.m)
        else:
            out = Y - vt @ z / self.m
        return out.mul_((self.gain / self.scale[..., None])[..., :, None])

    def dense(self) -> Tensor:
        """The Jacobian as a dense ``(..., m, m)`` tensor."""
        eye = torch.eye(self.m, dtype=self.gain.dtype, device=self.gain.device)
        return self.left(eye.expand(*self.scale.shape, self.m, self.m))


@dataclasses.dataclass
class LayerOps:
    """One decoder layer in the engine dtype. Matrices are ``(out, in)``; biases may be None.

    Attention: ``n = attn_in(h)`` (identity when None); ``q = Wq n + bq`` (``H*hd``),
    ``k = Wk n + bk``, ``v = Wv n + bv`` (``KV*hd``); q/k norms over each head (``qk_per_head``)
    or the full projection; RoPE at the token's position; output ``a = Wo o + bo``; what the
    residual receives is ``attn_post(a)``. MLP: ``n = mlp_in(g)``, gated
    ``z = act(Wg n + bg) * (Wu n + bu)`` or plain ``z = act(Wi n + bi)`` (``Wi`` stored as
    ``Wg``, ``Wu`` None), ``out = Wd z + bd``, residual receives ``mlp_post(out)``.
    """

    attn_in: Norm | None
    Wq: Tensor
    bq: Tensor | None
    Wk: Tensor
    bk: Tensor | None
    Wv: Tensor
    bv: Tensor | None
    q_norm: Norm | None
    k_norm: Norm | None
    qk_per_head: bool
    Wo: Tensor
    bo: Tensor | None
    attn_post: Norm | None
    mlp_in: Norm | None
    Wg: Tensor
    bg: Tensor | None
    Wu: Tensor | None
    bu: Tensor | None
    act: Callable[[Tensor], Tensor]
    Wd: Tensor
    bd: Tensor | None
    mlp_post: Norm | None
    _M: Tensor | None = None  # Wo E Wv, built on first use

    def value_output(self, n_heads: int, n_kv_heads: int, head_dim: int) -> Tensor:
        """``Wo E Wv`` (d, d): the one-token attention map, each query head reading its KV group."""
        if self._M is None:
            rep = n_heads // n_kv_heads
            Wv = self.Wv.reshape(n_kv_heads, head_dim, -1)
            Wv_exp = torch.repeat_interleave(Wv, rep, dim=0).reshape(n_heads * head_dim, -1)
            self._M = self.Wo @ Wv_exp
        return self._M


# ---------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cast(t: Tensor | None, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    return None if t is None else t.detach().to(device=device, dtype=dtype).clone()


def _linear(mod: nn.Module, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor | None]:
    """``(W (out, in), b)`` of an ``nn.Linear`` or a transformers ``Conv1D`` (which stores ``(in, out)``)."""
    if isinstance(mod, nn.Linear):
        return _cast(mod.weight, dtype, device), _cast(mod.bias, dtype, device)  # type: ignore[return-value]
    if type(mod).__name__ == "Conv1D":
        return _cast(mod.weight.t(), dtype, device), _cast(mod.bias, dtype, device)  # type: ignore[return-value]
    raise ModelError(f"unexpected projection module {type(mod).__name__}; the layer layout is not supported.")


def _norm(mod: nn.Module | None, dtype: torch.dtype, device: torch.device, offset: float = 0.0) -> Norm | None:
    if mod is None:
        return None
    if isinstance(mod, nn.LayerNorm):
        n = int(mod.normalized_shape[-1])
        gain = _cast(mod.weight, dtype, device) if mod.weight is not None else torch.ones(n, dtype=dtype, device=device)
        return Norm("ln", gain, _cast(mod.bias, dtype, device), float(mod.eps))
    if "RMSNorm" in type(mod).__name__:
        eps = getattr(mod, "variance_epsilon", None)
        if eps is None:
            eps = getattr(mod, "eps")
        gain = _cast(mod.weight, dtype, device) + offset
        return Norm("rms", gain, None, float(eps))
    raise ModelError(f"unexpected norm module {type(mod).__name__}; the layer layout is not supported.")


def _extract(adapter, layer: int, dtype: torch.dtype, device: torch.device) -> LayerOps:
    fam = adapter.family
    blk = adapter.layers[layer]
    a = adapter.attn_module(layer)
    H, KV, hd = adapter.n_heads, adapter.n_kv_heads, adapter.head_dim
    lin = lambda m: _linear(m, dtype, device)  # noqa: E731
    if fam in ("llama", "gemma3", "olmo2", "olmo3"):
        Wq, bq = lin(a.q_proj)
        Wk, bk = lin(a.k_proj)
        Wv, bv = lin(a.v_proj)
        Wo, bo = lin(a.o_proj)
        mlp = blk.mlp
        Wg, bg = lin(mlp.gate_proj)
        Wu, bu = lin(mlp.up_proj)
        Wd, bd = lin(mlp.down_proj)
        act = mlp.act_fn
    elif fam == "gpt2":
        W, b = lin(a.c_attn)
        d = adapter.d_model
        Wq, Wk, Wv = W[:d], W[d : 2 * d], W[2 * d :]
        bq, bk, bv = (None, None, None) if b is None else (b[:d], b[d : 2 * d], b[2 * d :])
        Wo, bo = lin(a.c_proj)
        Wg, bg = lin(blk.mlp.c_fc)
        Wu, bu = None, None
        Wd, bd = lin(blk.mlp.c_proj)
        act = blk.mlp.act
    elif fam == "gpt_neox":
        W, b = lin(a.query_key_value)
        W3 = W.reshape(H, 3, hd, -1)
        Wq, Wk, Wv = (W3[:, i].reshape(H * hd, -1).contiguous() for i in range(3))
        if b is None:
            bq = bk = bv = None
        else:
            b3 = b.reshape(H, 3, hd)
            bq, bk, bv = (b3[:, i].reshape(-1).contiguous() for i in range(3))
        Wo, bo = lin(a.dense)
        Wg, bg = lin(blk.mlp.dense_h_to_4h)
        Wu, bu = None, None
        Wd, bd = lin(blk.mlp.dense_4h_to_h)
        act = blk.mlp.act
    else:  # pragma: no cover - adapter_for admits no other family
        raise ModelError(f"no Jacobian engine for family {fam!r}.")

    nrm = lambda m: _norm(m, dtype, device, 1.0 if fam == "gemma3" else 0.0)  # noqa: E731
    q_norm = k_norm = None
    per_head = True
    if fam == "llama":
        attn_in, attn_post = nrm(blk.input_layernorm), None
        mlp_in, mlp_post = nrm(blk.post_attention_layernorm), None
    elif fam == "gemma3":
        attn_in, attn_post = nrm(blk.input_layernorm), nrm(blk.post_attention_layernorm)
        mlp_in, mlp_post = nrm(blk.pre_feedforward_layernorm), nrm(blk.post_feedforward_layernorm)
        q_norm, k_norm = nrm(a.q_norm), nrm(a.k_norm)
    elif fam in ("olmo2", "olmo3"):
        attn_in, attn_post = None, nrm(blk.post_attention_layernorm)
        mlp_in, mlp_post = None, nrm(blk.post_feedforward_layernorm)
        q_norm, k_norm = nrm(a.q_norm), nrm(a.k_norm)
        per_head = False
    elif fam == "gpt2":
        attn_in, attn_post = nrm(blk.ln_1), None
        mlp_in, mlp_post = nrm(blk.ln_2), None
    else:  # gpt_neox
        attn_in, attn_post = nrm(blk.input_layernorm), None
        mlp_in, mlp_post = nrm(blk.post_attention_layernorm), None
    for norm, size, what in ((q_norm, hd if per_head else H * hd, "q"), (k_norm, hd if per_head else KV * hd, "k")):
        if norm is not None and norm.size != size:
            raise ModelError(f"{fam} layer {layer}: {what} norm has width {norm.size}, expected {size}.")
    return LayerOps(
        attn_in=attn_in, Wq=Wq, bq=bq, Wk=Wk, bk=bk, Wv=Wv, bv=bv, q_norm=q_norm, k_norm=k_norm,
        qk_per_head=per_head, Wo=Wo, bo=bo, attn_post=attn_post, mlp_in=mlp_in, Wg=Wg, bg=bg, Wu=Wu,
        bu=bu, act=act, Wd=Wd, bd=bd, mlp_post=mlp_post,
    )


def layer_ops(adapter, layer: int, dtype: torch.dtype = torch.float64) -> LayerOps:
    """The cached :class:`LayerOps` of ``layer`` in ``dtype`` on the adapter's device.

    Memory: about ``itemsize x (parameters of the layer)`` per cached layer (float64 copies of
    all of SmolLM2-135M's layers take ~0.9 GB). :func:`clear_cache` drops them.
    """
    per = _CACHE.setdefault(adapter, {})
    key = (layer, dtype)
    ops = per.get(key)
    if ops is None:
        with torch.no_grad():
            ops = _extract(adapter, layer, dtype, adapter.device)
        per[key] = ops
    return ops


def clear_cache(adapter=None) -> None:
    """Forget cached weight copies (of one adapter, or of all)."""
    if adapter is None:
        _CACHE.clear()
    else:
        _CACHE.pop(adapter, None)
