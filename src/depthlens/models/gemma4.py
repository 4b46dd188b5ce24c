"""Gemma 4 text decoders (``model_type`` gemma4_text, or the language model of multimodal gemma4).

Layer ``l`` (all RMSNorm scaled by ``weight``, not ``1 + weight`` as in Gemma 3):
``g = h + post_attention_layernorm(o_proj(Attn(input_layernorm(h))))``,
``r = g + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(g)))``, then, with
per-layer inputs (``hidden_size_per_layer_input`` > 0),
``r = r + post_per_layer_input_norm(per_layer_projection(act(per_layer_input_gate(r)) * p_l))``
where ``p_l`` is the layer's per-layer input (a token embedding of its own plus a projection
of the input embeddings), and the layer's output is ``layer_scalar * r``.

Attention: per-head RMSNorm on queries and keys and a scale-free RMSNorm on values, scores
scaled by 1 (the norms set the scale); layers differ in shape: full-attention layers have
their own head width (``global_head_dim``) and key/value heads, and, with
``attention_k_eq_v``, take their values from the key projection; sliding-window and full
layers have their own rotary embedding (partial on full layers). The last
``num_kv_shared_layers`` layers compute no keys or values: each attends with those of the
last earlier layer of its type (:meth:`Gemma4Adapter.kv_source`).

What depthlens serves on this family: the capture stage (pattern features, and the residual
stream at three boundaries a layer: ``pre_attn``, ``pre_mlp`` and ``pre_ple``, before the
per-layer-input update), the attention stage (every layer's float64 attention matrices,
shared-key layers included, equal to the model's eager attention), the ablate stage and the
contest (head ablations through the model's own forward pass: ``block_maps`` is False), and
the lens stage (transport through the model's own forward pass, shared keys and per-layer
inputs included: :meth:`~depthlens.models.adapter.Adapter.layer_offsets`). The sub-layer maps
are refused in one line: a layer's update depends on its per-layer input and, for a shared
layer, on an earlier layer's keys, so it is not a function of the residual alone; and the
Jacobian, topology and clamp engines know two boundaries a layer, not three. A
mixture-of-experts block (``enable_moe_block``) is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

from torch import Tensor, nn

from ..errors import ModelError
from .adapter import Sublayer
from .gemma3 import Gemma3Adapter
from .registry import TINY_COMMON, Family, text_config
from .weights import LayerWeights, WeightReader

#: What the family's adapter serves (:attr:`~depthlens.models.registry.Family.stages`).
STAGES = ("capture", "attention", "ablate", "contest", "lens")


class Gemma4Adapter(Gemma3Adapter):
    """Adapter for ``Gemma4ForCausalLM`` (and the text part of ``Gemma4ForConditionalGeneration``)."""

    norm_offset = 0.0
    block_maps = False

    def __init__(self, model: nn.Module) -> None:
        cfg = text_config(model.config)
        if getattr(cfg, "enable_moe_block", False):
            raise ModelError("this gemma4 model has a mixture-of-experts block (enable_moe_block=True); depthlens "
                             "reads the dense Gemma 4 models only (e.g. E2B, E4B, 31B).")
        modes = list(cfg.kv_sharing_modes)
        if modes and all(mode == "reuse" for mode in modes):
            raise ModelError(f"every layer of this gemma4 model reads shared keys and values (num_kv_shared_layers="
                             f"{cfg.num_kv_shared_layers} of {cfg.num_hidden_layers}), so none computes them; "
                             "depthlens needs a model whose first layers do.")
        super().__init__(model)
        types = list(cfg.layer_types)
        first_shared = modes.index("reuse") if "reuse" in modes else len(modes)
        self._sources = [i if modes[i] != "reuse" else max(j for j in range(first_shared) if types[j] == types[i])
                         for i in range(self.n_layers)]
        self._rotate = sys.modules[type(self._attns[0]).__module__].apply_rotary_pos_emb

    def _extra_boundaries(self) -> tuple[str, ...]:
        return ("pre_ple",) if self.config.hidden_size_per_layer_input else ()

    def _extra_boundary_module(self, layer: int, boundary: str) -> nn.Module:
        if boundary != "pre_ple":
            return super()._extra_boundary_module(layer, boundary)
        return self.layers[layer].per_layer_input_gate  # reads the residual after the MLP update

    # ------------------------------------------------------------------ per-layer shapes
    # n_kv_heads and head_dim are layer 0's (a sliding layer's); layers differ

    def _n_kv_heads(self) -> int:
        return self.n_heads // int(self._attns[0].num_key_value_groups)

    def layer_head_dim(self, layer: int) -> int:
        return int(self._attns[self.check_layer(layer)].head_dim)

    def layer_kv_heads(self, layer: int) -> int:
        return self.n_heads // int(self._attns[self.check_layer(layer)].num_key_value_groups)

    def kv_source(self, layer: int) -> int:
        return self._sources[self.check_layer(layer)]

    # ------------------------------------------------------------------ attention

    def qkv(self, layer: int, x: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
        a = self._attns[layer]
        B, T, _ = x.shape
        shape = (B, T, -1, int(a.head_dim))
        cos, sin = self.rope_cos_sin(layer, T, x)
        q = self._rotate(a.q_norm(a.q_proj(x).view(shape)), cos, sin, unsqueeze_dim=2).transpose(1, 2)
        if self.kv_source(layer) != layer:
            return q, None, None
        k = a.k_proj(x).view(shape)
        v = k if a.v_proj is None else a.v_proj(x).view(shape)  # attention_k_eq_v: values from the keys
        k = self._rotate(a.k_norm(k), cos, sin, unsqueeze_dim=2).transpose(1, 2)
        return q, k, a.v_norm(v).transpose(1, 2)

    def logit_softcap(self) -> float | None:
        # both Gemma4ForCausalLM and the multimodal wrapper soft-cap their logits (Gemma 3's wrapper does not)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return None if cap is None else float(cap)

    def apply_rope(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    # ------------------------------------------------------------------ not served

    def _unsupported(self, what: str) -> NoReturn:
        raise ModelError(f"gemma4 {what}: a Gemma 4 layer adds a per-layer-input update and may read an earlier "
                         "layer's keys and values, so its sub-layers are not maps of the residual alone; depthlens "
                         f"serves the {', '.join(STAGES)} stages on this family.")

    def branch(self, layer: int, kind: Sublayer) -> Callable[[Tensor], Tensor]:
        self._unsupported("sub-layer maps")

    def block(self, layer: int) -> Callable[[Tensor], Tensor]:
        self._unsupported("layer maps")

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        self._unsupported("sub-layer maps")

    def _layer_weights(self, layer: int, read: WeightReader) -> LayerWeights:
        self._unsupported("layer weights")


def _finish_config(values: dict[str, Any]) -> None:
    """Tiny configurations of any depth: the last layer full (as Gemma 4 requires), and unless
    set, the last two layers reading shared keys and values where at least four layers
    compute their own (fewer: none shared), so every layer type keeps a producer."""
    values["layer_types"] = [*values["layer_types"][:-1], "full_attention"]
    values.setdefault("num_kv_shared_layers", max(0, min(2, int(values["num_hidden_layers"]) - 4)))


ENTRIES = (
    Family(
        name="gemma4",
        model_types=("gemma4_text", "gemma4"),
        config_class="Gemma4TextConfig",
        tiny_config={
            **TINY_COMMON,
            # E2B/E4B-shaped: sliding and full layers of different head widths and key/value
            # heads, the last two layers reading shared keys and values (one of each type:
            # _finish_config), per-layer inputs, double-wide MLPs on the shared layers, values from the keys on
            # full layers, and a final logit soft-cap
            "num_hidden_layers": 6,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "global_head_dim": 32,
            "num_global_key_value_heads": 1,
            "intermediate_size": 128,
            "sliding_window": 4,
            "vocab_size_per_layer_input": 256,
            "hidden_size_per_layer_input": 8,
            "attention_k_eq_v": True,
            "use_double_wide_mlp": True,
            "final_logit_softcapping": 30.0,
            "rms_norm_eps": 1e-6,
        },
        adapter=Gemma4Adapter,
        layer_pattern=("sliding_attention", "full_attention"),
        wrapper_types=("gemma4",),
        finish_config=_finish_config,
        stages=STAGES,
    ),
)
