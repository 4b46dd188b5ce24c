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

Every stage runs on this family. The residual stream has three boundaries a layer
(``pre_attn``, ``pre_mlp`` and ``pre_ple``, before the per-layer-input update) and three
sub-layer operators (``attn``, ``mlp``, ``ple``; the last includes ``layer_scalar``, so that
it maps its boundary to the next layer's input). A layer's updates depend on its per-layer
inputs (:meth:`Gemma4Adapter.per_layer_inputs`) and, on a shared layer, on an earlier
layer's keys and values, so they are not functions of the residual alone: the stages that
pass through layers (ablate, contest, lens, clamp) run the model's own forward pass
(``block_maps`` is False), and the Jacobian engines take the per-layer inputs and the key
source's residuals besides the residual (:func:`depthlens.jacobian.sublayer.state_reads`).
The sub-layer and layer maps themselves (:meth:`~depthlens.models.adapter.Adapter.branch`,
``block``) are refused in one line. A mixture-of-experts block (``enable_moe_block``) is
refused.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

import torch
from torch import Tensor, nn

from ..errors import ModelError
from .adapter import Sublayer
from .gemma3 import Gemma3Adapter
from .registry import TINY_COMMON, Family, text_config
from .weights import LayerWeights, Norm, PerLayerInput, WeightReader

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
        return ("pre_ple",) if self.per_layer_width else ()

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

    # ------------------------------------------------------------------ weights and per-layer inputs

    @property
    def per_layer_width(self) -> int:
        return int(self.config.hidden_size_per_layer_input or 0)

    def per_layer_inputs(self, input_ids: Tensor) -> Tensor | None:
        if not self.per_layer_width:
            return None
        ids = self.checked_ids(input_ids)
        with torch.no_grad():
            embeds = self.backbone.embed_tokens(ids)
            return self.backbone.project_per_layer_inputs(embeds, self.backbone.get_per_layer_inputs(ids, embeds))

    def _layer_weights(self, layer: int, read: WeightReader) -> LayerWeights:
        a, mlp, block = self._attns[layer], self.layers[layer].mlp, self.layers[layer]
        (Wq, bq), (Wo, bo) = read.linear(a.q_proj), read.linear(a.o_proj)
        (Wg, bg), (Wu, bu), (Wd, bd) = (read.linear(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
        norm = read.norm
        shared = self.kv_source(layer) != layer
        if shared:  # keys and values are the source layer's (read by the engines from its weights)
            Wk = Wv = torch.empty(0, self.d_model, dtype=read.dtype, device=read.device)
            bk = bv = k_norm = v_norm = None
        else:
            Wk, bk = read.linear(a.k_proj)
            # attention_k_eq_v: values from the key projection
            Wv, bv = (Wk, bk) if a.v_proj is None else read.linear(a.v_proj)
            k_norm = norm(a.k_norm)
            hd = self.layer_head_dim(layer)
            v_norm = Norm("rms", torch.ones(hd, dtype=read.dtype, device=read.device), None,
                          float(a.v_norm.variance_epsilon))
        ple = None
        if self.per_layer_width:
            ple = PerLayerInput(Wg=read.linear(block.per_layer_input_gate)[0],
                                Wp=read.linear(block.per_layer_projection)[0],
                                post=norm(block.post_per_layer_input_norm), act=read.activation(block.act_fn))
        return LayerWeights(
            attn_in=norm(block.input_layernorm), Wq=Wq, bq=bq, Wk=Wk, bk=bk, Wv=Wv, bv=bv,
            q_norm=norm(a.q_norm), k_norm=k_norm, qk_per_head=True, Wo=Wo, bo=bo,
            attn_post=norm(block.post_attention_layernorm), mlp_in=norm(block.pre_feedforward_layernorm),
            Wg=Wg, bg=bg, Wu=Wu, bu=bu, act=read.activation(mlp.act_fn), Wd=Wd, bd=bd,
            mlp_post=norm(block.post_feedforward_layernorm), v_norm=v_norm, ple=ple,
            out_scale=float(block.layer_scalar.reshape(-1)[0]), kv_shared=shared,
        )

    # ------------------------------------------------------------------ not served

    def _unsupported(self, what: str) -> NoReturn:
        raise ModelError(f"gemma4 {what}: a Gemma 4 layer adds a per-layer-input update and may read an earlier "
                         "layer's keys and values, so its sub-layers are not maps of the residual alone; every "
                         "depthlens stage runs on it through the model's forward pass and the Jacobian engines.")

    def branch(self, layer: int, kind: Sublayer) -> Callable[[Tensor], Tensor]:
        self._unsupported("sub-layer maps")

    def block(self, layer: int) -> Callable[[Tensor], Tensor]:
        self._unsupported("layer maps")

    def _mlp_branch(self, layer: int, g: Tensor) -> Tensor:
        self._unsupported("sub-layer maps")


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
    ),
)
