"""GPT-NeoX / Pythia (``model_type`` gpt_neox).

Layer ``l`` with ``use_parallel_residual`` (Pythia's default):
``h' = h + Attn(input_layernorm(h)) + mlp(post_attention_layernorm(h))`` — attention and MLP
both read the layer input ``h``. Without it the layer is sequential like GPT-2.
Attention: fused ``query_key_value`` projection laid out per head as ``[q | k | v]``, rotary
embedding on the first ``partial_rotary_factor`` of each head's dims, LayerNorm.

Parallel residual conventions (see :mod:`depthlens.models.adapter`):
the pre-MLP state of layer ``l`` is defined as ``h + Attn(ln_1(h))``;
``sublayer(l, "mlp")`` raises :class:`~depthlens.errors.ModelError` (use ``block(l)``, or
``branch(l, "mlp")`` for the MLP branch as a function of ``h``).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from .adapter import Adapter


class GPTNeoXAdapter(Adapter):
    """Adapter for ``GPTNeoXForCausalLM`` (Pythia)."""

    family = "gpt_neox"

    def _locate(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        return model.gpt_neox, model.lm_head

    def _layer_list(self) -> Sequence[nn.Module]:
        return self.backbone.layers

    def _attn(self, layer: nn.Module) -> nn.Module:
        return layer.attention

    def _out_proj(self, attn: nn.Module) -> nn.Module:
        return attn.dense

    def _final_norm(self) -> nn.Module:
        return self.backbone.final_layer_norm

    def _head_dim(self) -> int:
        return int(self._attns[0].head_size)

    def _parallel_residual(self) -> bool:
        return bool(self.config.use_parallel_residual)

    def _sliding_window(self, layer: int) -> int | None:
        return None

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.backbone.embed_in(input_ids)

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self._attns[layer]
        B, T, _ = x.shape
        qkv = a.query_key_value(x).view(B, T, -1, 3 * self.head_dim).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        cos, sin = self._position_embeddings(layer, T, x)
        q, k = self._rotate(q, k, cos, sin)
        return q, k, v

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        return self.layers[layer].input_layernorm(h)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        blk = self.layers[layer]
        return blk.mlp(blk.post_attention_layernorm(g))

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        # parallel: the MLP norm reads h, not h + attn; residual_states adds the attention output
        return None if self.parallel_residual else self.layers[layer].post_attention_layernorm
