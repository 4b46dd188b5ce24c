"""GPT-2 (``model_type`` gpt2).

Layer ``l``: ``g = h + c_proj(Attn(ln_1(h)))``, ``h' = g + mlp(ln_2(g))``; LayerNorm, learned
absolute position embeddings added to the token embeddings (``embed``), fused ``c_attn``
(Conv1D) projection, scores scaled by ``head_dim ** -0.5`` (and ``1 / (layer + 1)`` when
``scale_attn_by_inverse_layer_idx``). Tied input/output embeddings.

BOS: GPT-2 has no dedicated BOS token; its configuration names ``<|endoftext|>`` (50256) as
``bos_token_id``, which :meth:`Adapter.prepend_bos` uses. The adapter never adds it itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .adapter import Adapter
from .registry import Family
from .weights import LayerWeights, WeightReader


class GPT2Adapter(Adapter):
    """Adapter for ``GPT2LMHeadModel``."""

    def _locate(self, model: nn.Module) -> tuple[nn.Module, nn.Module]:
        if getattr(model.config, "add_cross_attention", False):
            raise AttributeError("cross-attention GPT-2 blocks are not supported")
        return model.transformer, model.lm_head

    def _layer_list(self) -> Sequence[nn.Module]:
        return self.backbone.h

    def _attn(self, layer: nn.Module) -> nn.Module:
        return layer.attn

    def _out_proj(self, attn: nn.Module) -> nn.Module:
        return attn.c_proj

    def _final_norm(self) -> nn.Module:
        return self.backbone.ln_f

    def embed(self, input_ids: Tensor) -> Tensor:
        T = input_ids.shape[-1]
        pos = torch.arange(T, device=input_ids.device).unsqueeze(0)
        return self.backbone.wte(input_ids) + self.backbone.wpe(pos)

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        a = self._attns[layer]
        B, T, _ = x.shape
        q, k, v = a.c_attn(x).split(a.split_size, dim=2)
        shape = (B, T, -1, self.head_dim)
        return tuple(t.view(shape).transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]

    def _attn_input(self, layer: int, h: Tensor) -> Tensor:
        return self.layers[layer].ln_1(h)

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        blk = self.layers[layer]
        return blk.mlp(blk.ln_2(g))

    def _pre_mlp_module(self, layer: int) -> nn.Module | None:
        return self.layers[layer].ln_2

    def _sliding_window(self, layer: int) -> int | None:
        return None

    def _layer_weights(self, layer: int, read: WeightReader) -> LayerWeights:
        blk, a = self.layers[layer], self._attns[layer]
        W, b = read.linear(a.c_attn)  # fused [q | k | v] rows
        d = self.d_model
        Wo, bo = read.linear(a.c_proj)
        Wi, bi = read.linear(blk.mlp.c_fc)
        Wd, bd = read.linear(blk.mlp.c_proj)
        return LayerWeights(
            attn_in=read.norm(blk.ln_1), Wq=W[:d], bq=None if b is None else b[:d], Wk=W[d : 2 * d],
            bk=None if b is None else b[d : 2 * d], Wv=W[2 * d :], bv=None if b is None else b[2 * d :],
            q_norm=None, k_norm=None, qk_per_head=True, Wo=Wo, bo=bo, attn_post=None, mlp_in=read.norm(blk.ln_2),
            Wg=Wi, bg=bi, Wu=None, bu=None, act=read.activation(blk.mlp.act), Wd=Wd, bd=bd, mlp_post=None,
        )


ENTRIES = (
    Family(
        name="gpt2",
        model_types=("gpt2",),
        config_class="GPT2Config",
        tiny_config={
            "vocab_size": 256,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 256,
            "n_inner": 128,
            "initializer_range": 0.1,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "tie_word_embeddings": True,
        },
        adapter=GPT2Adapter,
        aliases={
            "hidden_size": "n_embd",
            "num_hidden_layers": "n_layer",
            "num_attention_heads": "n_head",
            "max_position_embeddings": "n_positions",
            "intermediate_size": "n_inner",
        },
    ),
)
