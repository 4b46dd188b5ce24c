"""Llama-like decoders: Llama, SmolLM2, Mistral, Qwen2 (``model_type`` llama / mistral / qwen2).

Layer ``l``: ``g = h + o_proj(Attn(input_layernorm(h)))``,
``h' = g + mlp(post_attention_layernorm(g))``; RMSNorm, RoPE on q and k, grouped-query
attention, optional q/k/v biases (Qwen2), optional sliding windows (Mistral: every layer;
Qwen2: the layers its ``layer_types`` marks as sliding).

:class:`LlamaAdapter` also serves the families whose layers differ from Llama's only in where
their norms sit (Gemma 3, OLMo 2/3): a subclass sets :attr:`LlamaAdapter.norm_names`,
:attr:`LlamaAdapter.qk_norm` and :attr:`LlamaAdapter.norm_offset`, and the forward maps and the
weight extraction both follow them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal

from torch import Tensor, nn

from .adapter import Adapter
from .registry import TINY_COMMON, Family
from .weights import LayerWeights, Norm, WeightReader

#: Places of a decoder layer's norms: before / after the attention and the MLP.
NormPlace = Literal["attn_in", "attn_post", "mlp_in", "mlp_post"]


class LlamaAdapter(Adapter):
    """Adapter for ``LlamaForCausalLM``, ``MistralForCausalLM`` and ``Qwen2ForCausalLM``."""

    #: The decoder layer's norm module (attribute name) at each place, None where there is none.
    norm_names: ClassVar[Mapping[NormPlace, str | None]] = {
        "attn_in": "input_layernorm",
        "attn_post": None,
        "mlp_in": "post_attention_layernorm",
        "mlp_post": None,
    }
    #: q/k norms (modules ``q_norm`` / ``k_norm`` of the attention): ``"head"`` over each head
    #: after the split, ``"full"`` over the whole projection before it, None: none.
    qk_norm: ClassVar[Literal["head", "full"] | None] = None
    #: Added to RMSNorm weights (Gemma 3 scales by ``1 + weight``).
    norm_offset: ClassVar[float] = 0.0

    def _locate(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        return model.model, model.lm_head

    def _layer_list(self) -> Sequence[nn.Module]:
        return self.backbone.layers

    def _attn(self, layer: nn.Module) -> nn.Module:
        return layer.self_attn

    def _out_proj(self, attn: nn.Module) -> nn.Module:
        return attn.o_proj

    def _final_norm(self) -> nn.Module:
        return self.backbone.norm

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.backbone.embed_tokens(input_ids)

    def _norm(self, layer: int, place: NormPlace) -> nn.Module | None:
        """The norm module of ``layer`` at ``place`` (see :attr:`norm_names`)."""
        name = self.norm_names[place]
        return None if name is None else getattr(self.layers[layer], name)

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self._attns[layer]
        B, T, _ = x.shape
        shape = (B, T, -1, self.head_dim)
        q, k = a.q_proj(x), a.k_proj(x)
        if self.qk_norm == "full":
            q, k = a.q_norm(q), a.k_norm(k)
        q = q.view(shape).transpose(1, 2)
        k = k.view(shape).transpose(1, 2)
        if self.qk_norm == "head":
            q, k = a.q_norm(q), a.k_norm(k)
        v = a.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = self.rope_cos_sin(layer, T, x)
        q, k = self.apply_rope(q, k, cos, sin)
        return q, k, v

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        norm = self._norm(layer, "attn_in")
        return h if norm is None else norm(h)

    def _attn_post(self, layer: int, a: Tensor) -> Tensor:
        norm = self._norm(layer, "attn_post")
        return a if norm is None else norm(a)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        pre, post = self._norm(layer, "mlp_in"), self._norm(layer, "mlp_post")
        out = self.layers[layer].mlp(g if pre is None else pre(g))
        return out if post is None else post(out)

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        pre = self._norm(layer, "mlp_in")
        return self.layers[layer].mlp if pre is None else pre

    def _layer_weights(self, layer: int, read: WeightReader) -> LayerWeights:
        a, mlp = self._attns[layer], self.layers[layer].mlp
        Wq, bq = read.linear(a.q_proj)
        Wk, bk = read.linear(a.k_proj)
        Wv, bv = read.linear(a.v_proj)
        Wo, bo = read.linear(a.o_proj)
        Wg, bg = read.linear(mlp.gate_proj)
        Wu, bu = read.linear(mlp.up_proj)
        Wd, bd = read.linear(mlp.down_proj)

        def norm(module: nn.Module | None) -> Norm | None:
            return read.norm(module, self.norm_offset)

        qk = self.qk_norm is not None
        return LayerWeights(
            attn_in=norm(self._norm(layer, "attn_in")), Wq=Wq, bq=bq, Wk=Wk, bk=bk, Wv=Wv, bv=bv,
            q_norm=norm(a.q_norm) if qk else None, k_norm=norm(a.k_norm) if qk else None,
            qk_per_head=self.qk_norm != "full", Wo=Wo, bo=bo, attn_post=norm(self._norm(layer, "attn_post")),
            mlp_in=norm(self._norm(layer, "mlp_in")), Wg=Wg, bg=bg, Wu=Wu, bu=bu, act=read.activation(mlp.act_fn),
            Wd=Wd, bd=bd, mlp_post=norm(self._norm(layer, "mlp_post")),
        )


ENTRIES = (
    Family(
        name="llama",
        model_types=("llama", "mistral", "qwen2"),
        config_class="LlamaConfig",
        tiny_config={**TINY_COMMON, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-6},
        adapter=LlamaAdapter,
    ),
)
