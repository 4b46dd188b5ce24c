"""One decoder layer's weights in one shape for every family, cast to an arithmetic dtype.

The Jacobian engines never call the Hugging Face modules: each adapter reads a layer's
weights once (:meth:`~depthlens.models.adapter.Adapter.layer_weights`), casts them, and the
engines evaluate the sub-layers from these copies. A :class:`LayerWeights` says, for one
layer, which norm sits where (pre-norm, post-norm, q/k norms, per head or over the full
projection), the projection matrices in ``(out, in)`` form, the MLP's shape (gated or not)
and its activation. :class:`WeightReader` turns Hugging Face projection and norm modules
into these pieces.

Norms
    ``rms``: ``y = g * x / r`` with ``r = sqrt(mean(x**2) + eps)`` (Llama, OLMo, and Gemma 3
    with ``g = 1 + weight``); ``ln``: ``y = g * (x - mean(x)) / s + b`` with
    ``s = sqrt(var(x) + eps)``, biased variance (``nn.LayerNorm``). Both are evaluated in the
    engine dtype (Hugging Face RMSNorms upcast to float32 only; here float64 stays float64).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor, nn

from ..errors import ModelError

__all__ = ["LayerWeights", "Norm", "NormJacobian", "PerLayerInput", "WeightReader"]


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

    def jacobian_products(self, products: tuple[Tensor, ...], mats: tuple[Tensor, ...]) -> tuple[Tensor, ...] | None:
        """``(g * V_n) @ M^T`` (N, c, K) for every ``M`` of ``mats``, ``V_n`` the vectors of
        :meth:`jacobian` in its order, from ``products`` ``n @ M^T`` (N, K) of the normed
        residuals ``n`` (what a forward pass forms): without a bias ``g * xhat`` is ``n``
        itself, and LayerNorm's constant vector gives ``g @ M^T``. None for a norm with a bias."""
        if self.bias is not None:
            return None
        if self.kind == "rms":
            return tuple(p[:, None, :] for p in products)
        return tuple(torch.stack([(self.gain @ M.T).expand_as(p), p], dim=1) for p, M in zip(products, mats, strict=True))


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
class PerLayerInput:
    """A per-layer-input update (Gemma 4): the residual ``r`` receives
    ``post(Wp (act(Wg r) * p))``, with ``p`` the layer's per-layer input at the token
    (``Wg`` (dp, d), ``Wp`` (d, dp))."""

    Wg: Tensor
    Wp: Tensor
    post: Norm
    act: Callable[[Tensor], Tensor]


@dataclasses.dataclass
class LayerWeights:
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
    v_norm: Norm | None = None
    ple: PerLayerInput | None = None
    out_scale: float = 1.0
    kv_shared: bool = False
    _M: Tensor | None = None  # Wo E Wv, built on first use

    def value_output(self, n_heads: int, n_kv_heads: int, head_dim: int) -> Tensor:
        """``Wo E Wv`` (d, d): the one-token attention map, each query head reading its KV group."""
        if self._M is None:
            rep = n_heads // n_kv_heads
            Wv = self.Wv.reshape(n_kv_heads, head_dim, -1)
            Wv_exp = torch.repeat_interleave(Wv, rep, dim=0).reshape(n_heads * head_dim, -1)
            self._M = self.Wo @ Wv_exp
        return self._M


@dataclasses.dataclass(frozen=True)
class WeightReader:
    """Detached copies of Hugging Face weights in ``dtype`` on ``device``."""

    dtype: torch.dtype
    device: torch.device

    def tensor(self, t: Tensor | None) -> Tensor | None:
        """A detached copy of ``t`` (None stays None)."""
        return None if t is None else t.detach().to(device=self.device, dtype=self.dtype).clone()

    def linear(self, mod: nn.Module) -> tuple[Tensor, Tensor | None]:
        """``(W (out, in), b)`` of an ``nn.Linear`` or a transformers ``Conv1D`` (which stores ``(in, out)``).

        Raises
        ------
        ModelError
            For any other module.
        """
        if isinstance(mod, nn.Linear):
            return self.tensor(mod.weight), self.tensor(mod.bias)  # type: ignore[return-value]
        if type(mod).__name__ == "Conv1D":
            return self.tensor(mod.weight.t()), self.tensor(mod.bias)  # type: ignore[return-value]
        raise ModelError(f"unexpected projection module {type(mod).__name__}; the layer layout is not supported.")

    @staticmethod
    def activation(mod: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """The model's activation as the engines call it: a module's ``forward``, which runs
        without the module's hooks (a layer-streamed model's hooks would load the layer back
        whenever an engine that reads another layer's weights, e.g. a shared key source, has
        released it)."""
        return mod.forward if isinstance(mod, nn.Module) else mod

    def norm(self, mod: nn.Module | None, offset: float = 0.0) -> Norm | None:
        """The :class:`Norm` of an ``nn.LayerNorm`` or an RMSNorm module (None stays None).

        ``offset`` is added to an RMSNorm's weight (Gemma 3 scales by ``1 + weight``).

        Raises
        ------
        ModelError
            For any other module.
        """
        if mod is None:
            return None
        if isinstance(mod, nn.LayerNorm):
            n = int(mod.normalized_shape[-1])
            if mod.weight is None:
                gain = torch.ones(n, dtype=self.dtype, device=self.device)
            else:
                gain = self.tensor(mod.weight)
            return Norm("ln", gain, self.tensor(mod.bias), float(mod.eps))
        if "RMSNorm" in type(mod).__name__:
            eps = getattr(mod, "variance_epsilon", None)
            if eps is None:
                eps = getattr(mod, "eps")
            gain = self.tensor(mod.weight) + offset
            return Norm("rms", gain, None, float(eps))
        raise ModelError(f"unexpected norm module {type(mod).__name__}; the layer layout is not supported.")
