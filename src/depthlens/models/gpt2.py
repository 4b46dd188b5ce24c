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


class GPT2Adapter(Adapter):
    """Adapter for ``GPT2LMHeadModel``."""

    family = "gpt2"

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
