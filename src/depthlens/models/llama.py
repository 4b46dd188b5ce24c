"""Llama-like decoders: Llama, SmolLM2, Mistral, Qwen2 (``model_type`` llama / mistral / qwen2).

Layer ``l``: ``g = h + o_proj(Attn(input_layernorm(h)))``,
``h' = g + mlp(post_attention_layernorm(g))``; RMSNorm, RoPE on q and k, grouped-query
attention, optional q/k/v biases (Qwen2), optional sliding windows (Mistral: every layer;
Qwen2: the layers its ``layer_types`` mark as sliding).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from .adapter import Adapter


class LlamaAdapter(Adapter):
    """Adapter for ``LlamaForCausalLM``, ``MistralForCausalLM`` and ``Qwen2ForCausalLM``."""

    family = "llama"

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

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self._attns[layer]
        B, T, _ = x.shape
        shape = (B, T, -1, self.head_dim)
        q = a.q_proj(x).view(shape).transpose(1, 2)
        k = a.k_proj(x).view(shape).transpose(1, 2)
        v = a.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = self._position_embeddings(layer, T, x)
        q, k = self._rotate(q, k, cos, sin)
        return q, k, v

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        return self.layers[layer].input_layernorm(h)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        blk = self.layers[layer]
        return blk.mlp(blk.post_attention_layernorm(g))

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        return self.layers[layer].post_attention_layernorm
