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

from torch import nn

from .llama import LlamaAdapter
from .registry import TINY_COMMON, Family


class Gemma3Adapter(LlamaAdapter):
    """Adapter for ``Gemma3ForCausalLM`` (and the text part of ``Gemma3ForConditionalGeneration``)."""

    norm_names = {
        "attn_in": "input_layernorm",
        "attn_post": "post_attention_layernorm",
        "mlp_in": "pre_feedforward_layernorm",
        "mlp_post": "post_feedforward_layernorm",
    }
    qk_norm = "head"
    norm_offset = 1.0

    def _locate(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        backbone = model.model
        if hasattr(backbone, "language_model"):  # multimodal wrapper
            backbone = backbone.language_model
        return backbone, model.lm_head

    def logit_softcap(self) -> float | None:
        # Gemma3ForCausalLM soft-caps its logits; the multimodal wrapper's forward does not
        if hasattr(self.model.model, "language_model"):
            return None
        return super().logit_softcap()


ENTRIES = (
    Family(
        name="gemma3",
        model_types=("gemma3_text", "gemma3"),
        config_class="Gemma3TextConfig",
        tiny_config={
            **TINY_COMMON,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "intermediate_size": 128,
            "sliding_window": 4,
            "final_logit_softcapping": 30.0,
            "rms_norm_eps": 1e-6,
        },
        adapter=Gemma3Adapter,
        layer_pattern=("sliding_attention", "full_attention"),
        wrapper_types=("gemma3",),
    ),
)
