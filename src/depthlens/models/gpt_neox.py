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
from typing import Any

from torch import Tensor, nn

from .adapter import Adapter
from .registry import TINY_COMMON, Family
from .weights import LayerWeights, WeightReader


class GPTNeoXAdapter(Adapter):
    """Adapter for ``GPTNeoXForCausalLM`` (Pythia)."""

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
        cos, sin = self.rope_cos_sin(layer, T, x)
        q, k = self.apply_rope(q, k, cos, sin)
        return q, k, v

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        return self.layers[layer].input_layernorm(h)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        blk = self.layers[layer]
        return blk.mlp(blk.post_attention_layernorm(g))

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        # parallel: the MLP norm reads h, not h + attn; residual_states adds the attention output
        return None if self.parallel_residual else self.layers[layer].post_attention_layernorm

    def _layer_weights(self, layer: int, read: WeightReader) -> LayerWeights:
        blk, a = self.layers[layer], self._attns[layer]
        H, hd = self.n_heads, self.head_dim
        W, b = read.linear(a.query_key_value)  # rows laid out per head as [q | k | v]
        W3 = W.reshape(H, 3, hd, -1)
        Wq, Wk, Wv = (W3[:, i].reshape(H * hd, -1).contiguous() for i in range(3))
        if b is None:
            bq = bk = bv = None
        else:
            b3 = b.reshape(H, 3, hd)
            bq, bk, bv = (b3[:, i].reshape(-1).contiguous() for i in range(3))
        Wo, bo = read.linear(a.dense)
        Wi, bi = read.linear(blk.mlp.dense_h_to_4h)
        Wd, bd = read.linear(blk.mlp.dense_4h_to_h)
        return LayerWeights(
            attn_in=read.norm(blk.input_layernorm), Wq=Wq, bq=bq, Wk=Wk, bk=bk, Wv=Wv, bv=bv, q_norm=None,
            k_norm=None, qk_per_head=True, Wo=Wo, bo=bo, attn_post=None, mlp_in=read.norm(blk.post_attention_layernorm),
            Wg=Wi, bg=bi, Wu=None, bu=None, act=read.activation(blk.mlp.act), Wd=Wd, bd=bd, mlp_post=None,
        )


def _rotary_pct(values: dict[str, Any]) -> None:
    """Turn ``rotary_pct`` (the partial rotary fraction of tiny configurations) into ``rope_parameters``."""
    pct = values.pop("rotary_pct")
    values.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": pct})


ENTRIES = (
    Family(
        name="gpt_neox",
        model_types=("gpt_neox",),
        config_class="GPTNeoXConfig",
        tiny_config={
            **TINY_COMMON,
            "intermediate_size": 128,
            "use_parallel_residual": True,
            "tie_word_embeddings": False,
            "rotary_pct": 0.25,
        },
        adapter=GPTNeoXAdapter,
        finish_config=_rotary_pct,
    ),
)
