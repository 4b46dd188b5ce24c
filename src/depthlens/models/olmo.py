"""OLMo 2 and OLMo 3 decoders (``model_type`` olmo2 / olmo3).

Layer ``l`` (norms after each sub-layer, none before):
``g = h + post_attention_layernorm(o_proj(Attn(h)))``,
``h' = g + post_feedforward_layernorm(mlp(g))``.
Attention: RMSNorm over the full concatenated q (and k) projection before splitting into
heads, then RoPE; OLMo 3 adds sliding-window layers (``layer_types``) with per-type RoPE.
"""

from __future__ import annotations

from .llama import LlamaAdapter
from .registry import TINY_COMMON, Family


class OlmoAdapter(LlamaAdapter):
    """Adapter for ``Olmo2ForCausalLM`` and ``Olmo3ForCausalLM`` (``family`` is olmo2 or olmo3)."""

    norm_names = {
        "attn_in": None,
        "attn_post": "post_attention_layernorm",
        "mlp_in": None,
        "mlp_post": "post_feedforward_layernorm",
    }
    qk_norm = "full"


_TINY = {**TINY_COMMON, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-6}

ENTRIES = (
    Family(name="olmo2", model_types=("olmo2",), config_class="Olmo2Config", tiny_config=_TINY, adapter=OlmoAdapter),
    Family(
        name="olmo3",
        model_types=("olmo3",),
        config_class="Olmo3Config",
        tiny_config={**_TINY, "num_hidden_layers": 3, "sliding_window": 4},
        adapter=OlmoAdapter,
        layer_pattern=("sliding_attention", "sliding_attention", "full_attention"),
    ),
)
