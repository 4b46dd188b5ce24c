"""Gemma 3 text decoders (``model_type`` gemma3_text, or the language model of multimodal gemma3).

Layer ``l`` ("sandwich" norms, all RMSNorm with ``1 + weight``):
``g = h + post_attention_layernorm(o_proj(Attn(input_layernorm(h))))``,
``h' = g + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(g)))``.
Attention: per-head RMSNorm on q and k before RoPE (separate RoPE bases for sliding and
full layers), scores scaled by ``query_pre_attn_scalar ** -0.5``, optional tanh
soft-capping of scores; sliding-window layers as ``layer_types`` says. Embeddings are
scaled by ``sqrt(hidden_size)`` (inside the embedding module); ``Gemma3ForCausalLM``
soft-caps its logits (``final_logit_softcapping``), the multimodal
``Gemma3ForConditionalGeneration`` does not (the adapter follows each). For the multimodal
model the adapter sees text only: ``input_ids`` without image tokens.
"""

from __future__ import annotations

from torch import Tensor, nn

from .llama import LlamaAdapter


class Gemma3Adapter(LlamaAdapter):
    """Adapter for ``Gemma3ForCausalLM`` (and the text part of ``Gemma3ForConditionalGeneration``)."""

    family = "gemma3"

    def _locate(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        backbone = model.model
        if hasattr(backbone, "language_model"):  # multimodal wrapper
            backbone = backbone.language_model
        return backbone, model.lm_head

    def _final_softcap(self) -> float | None:
        # Gemma3ForCausalLM soft-caps its logits; the multimodal wrapper's forward does not
        if hasattr(self.model.model, "language_model"):
            return None
        return super()._final_softcap()

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self._attns[layer]
        B, T, _ = x.shape
        shape = (B, T, -1, self.head_dim)
        q = a.q_norm(a.q_proj(x).view(shape).transpose(1, 2))
        k = a.k_norm(a.k_proj(x).view(shape).transpose(1, 2))
        v = a.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = self._position_embeddings(layer, T, x)
        q, k = self._rotate(q, k, cos, sin)
        return q, k, v

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        return self.layers[layer].input_layernorm(h)

    def _attn_post(self, layer: int, a: Tensor) -> Tensor:
        return self.layers[layer].post_attention_layernorm(a)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        blk = self.layers[layer]
        return blk.post_feedforward_layernorm(blk.mlp(blk.pre_feedforward_layernorm(g)))

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        return self.layers[layer].pre_feedforward_layernorm
