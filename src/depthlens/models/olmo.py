"""OLMo 2 and OLMo 3 decoders (``model_type`` olmo2 / olmo3).

Layer ``l`` (norms after each sub-layer, none before):
``g = h + post_attention_layernorm(o_proj(Attn(h)))``,
``h' = g + post_feedforward_layernorm(mlp(g))``.
Attention: RMSNorm over the full concatenated q (and k) projection before splitting into
heads, then RoPE; OLMo 3 adds sliding-window layers (``layer_types``) with per-type RoPE.
"""

from __future__ import annotations

from torch import Tensor, nn

from .llama import LlamaAdapter
from .families import family_of


class OlmoAdapter(LlamaAdapter):
    """Adapter for ``Olmo2ForCausalLM`` and ``Olmo3ForCausalLM`` (``family`` is olmo2 or olmo3)."""

    family = "olmo2"

    def __init__(self, model: nn.Module) -> None:
        self.family = family_of(model.config)
        super().__init__(model)

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self._attns[layer]
        B, T, _ = x.shape
        shape = (B, T, -1, self.head_dim)
        q = a.q_norm(a.q_proj(x)).view(shape).transpose(1, 2)
        k = a.k_norm(a.k_proj(x)).view(shape).transpose(1, 2)
        v = a.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = self._position_embeddings(layer, T, x)
        q, k = self._rotate(q, k, cos, sin)
        return q, k, v

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        return h

    def _attn_post(self, layer: int, a: Tensor) -> Tensor:
        return self.layers[layer].post_attention_layernorm(a)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        blk = self.layers[layer]
        return blk.post_feedforward_layernorm(blk.mlp(g))

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        return self.layers[layer].mlp
