"""Gemma 4 GGUF files (depthlens.models.gguf_gemma4): a tiny random Gemma 4 written as
llama.cpp's converter writes it (gguf-py's key helpers, unshifted norms, the layer scalar as
``layer_output_scale.weight``, a generated proportional ``rope_freqs``, no ``attn_v`` where
values come from the keys, no keys on shared layers) loads back as the same model: every
parameter and buffer, the configuration's per-layer settings and the logits, in memory and
layer-streamed; files the configuration cannot represent are refused in one line and leave
no cache entry."""

from __future__ import annotations

from pathlib import Path
import numpy as np
import pytest
import torch

from depthlens.errors import ModelError
from depthlens.models import build_random, load_model

from .test_gguf_convert import _copy
from .test_loading import _one_line

gguf = pytest.importorskip("gguf")

#: HF name -> GGUF name, written out from llama.cpp's tensor list for Gemma 4.
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight", "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
        "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
        "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
          "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
          "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight",
          "post_attention_layernorm.weight": "post_attention_norm.weight",
          "pre_feedforward_layernorm.weight": "ffn_norm.weight",
          "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight", "per_layer_input_gate.weight": "inp_gate.weight",
          "per_layer_projection.weight": "proj.weight", "post_per_layer_input_norm.weight": "post_norm.weight",
          "layer_scalar": "layer_output_scale.weight"}

#: 31B-shaped: no per-layer inputs, values projected on every layer, no shared layers, tied
#: embeddings, no soft-cap.
_PLAIN = {"hidden_size_per_layer_input": 0, "attention_k_eq_v": False, "num_kv_shared_layers": 0,
          "use_double_wide_mlp": False, "tie_word_embeddings": True, "final_logit_softcapping": None,
          "num_global_key_value_heads": None}


def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter and buffer drawn at random (norm weights near 1), so no value is a default."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            noise = torch.randn(value.shape, generator=gen)
            value.copy_(1 + 0.2 * noise if value.ndim == 1 else 0.3 * noise)
    return model


def _tokens(vocab: int) -> tuple[list[str], list[int]]:
    """A sentencepiece vocabulary of ``vocab`` pieces: pad, eos, bos, unk, letters, byte pieces."""
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581"] + [chr(c) for c in range(97, 123)]
    pieces += ["\u2581" + chr(c) for c in range(97, 123)]
    pieces += [f"<0x{b:02X}>" for b in range(vocab - len(pieces))]
    types = [3, 3, 3, 2] + [1] * 53 + [6] * (vocab - 57)
    return pieces, types


def _write(model: torch.nn.Module, path: Path, fault: str | None = None) -> Path:
    """``model`` as a Gemma 4 GGUF file the way llama.cpp's converter writes it (float32),
    with one ``fault`` planted."""
    cfg = model.config
    n, shared = cfg.num_hidden_layers, cfg.num_kv_shared_layers
    sliding = [t == "sliding_attention" for t in cfg.layer_types]
    layers = [cfg.per_layer_config[i] for i in range(n)]
    full_cfg = layers[cfg.layer_types.index("full_attention")]
    swa_dim = layers[cfg.layer_types.index("sliding_attention")].head_dim
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_block_count(n)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_head_count(cfg.num_attention_heads)
    if cfg.use_double_wide_mlp:
        w.add_feed_forward_length([cfg.intermediate_size * (2 if i >= n - shared else 1) for i in range(n)])
    else:
        w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count_kv([layer.num_key_value_heads for layer in layers])
    w.add_key_length(full_cfg.head_dim)
    w.add_value_length(full_cfg.head_dim)
    w.add_key_length_swa(swa_dim)
    w.add_value_length_swa(swa_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(cfg.sliding_window)
    w.add_sliding_window_pattern(sliding)
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
    w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    w.add_rope_dimension_count(full_cfg.head_dim)
    w.add_rope_dimension_count_swa(swa_dim // (2 if fault == "partial_sliding" else 1))
    if cfg.final_logit_softcapping:
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    tokens, types = _tokens(cfg.vocab_size)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_pad_token_id(0)
    if fault != "no_unknown_token":
        w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    state = model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight")
    for name, value in state.items():
        if name.startswith("model.layers."):
            layer, rest = name[len("model.layers."):].split(".", 1)
            gguf_name = f"blk.{layer}.{_LAYER[rest]}"
        else:
            gguf_name = _TOP[name]
        w.add_tensor(gguf_name, np.ascontiguousarray(value.numpy()))
    prf = cfg.rope_parameters["full_attention"]["partial_rotary_factor"]
    n_rot = int(full_cfg.head_dim * prf / 2)
    factors = [1.0] * n_rot + [1e30] * (full_cfg.head_dim // 2 - n_rot)
    if fault == "scaled_rope":
        factors[0] = 4.0
    w.add_tensor("rope_freqs.weight", np.asarray(factors, dtype=np.float32))
    if fault == "experts":
        w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, cfg.hidden_size), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("overrides", [{}, _PLAIN], ids=["e2b-shaped", "31b-shaped"])
def test_a_converted_gemma4_file_is_the_model_it_was_written_from(tmp_path, overrides):
    model = _randomised(build_random("gemma4", overrides, seed=1))
    path = _write(model, tmp_path / "tiny-gemma4.gguf")
    loaded = load_model(path, cache_dir=tmp_path / "cache")
    ours, theirs = loaded.model.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    assert [k for k in theirs if not torch.equal(ours[k], theirs[k])] == []
    got, want = loaded.model.config, model.config
    for key in ("layer_types", "num_kv_shared_layers", "attention_k_eq_v", "use_double_wide_mlp",
                "hidden_size_per_layer_input", "vocab_size_per_layer_input", "sliding_window",
                "final_logit_softcapping", "tie_word_embeddings", "rms_norm_eps", "intermediate_size"):
        assert getattr(got, key) == getattr(want, key), key
    assert got.kv_sharing_modes == want.kv_sharing_modes
    for i in range(want.num_hidden_layers):
        for attr in ("head_dim", "num_key_value_heads"):
            assert getattr(got.per_layer_config[i], attr) == getattr(want.per_layer_config[i], attr), (i, attr)
    for kind in ("sliding_attention", "full_attention"):
        for key, value in want.rope_parameters[kind].items():
            assert got.rope_parameters[kind][key] == pytest.approx(value), (kind, key)
    ids = torch.randint(0, want.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids).logits
    assert torch.allclose(loaded.adapter.logits(ids), reference, rtol=1e-5, atol=1e-5)
    assert loaded.tokenizer("ab cd \u20ac").input_ids  # the file's gemma4 tokenizer loads
    streamed = load_model(path, cache_dir=tmp_path / "cache", stream_layers=True)
    assert streamed.provenance["cached"] and torch.equal(streamed.adapter.logits(ids), loaded.adapter.logits(ids))


@pytest.mark.parametrize("fault, words", [
    ("experts", "enable_moe_block"),
    ("scaled_rope", "rope_freqs"),
    ("partial_sliding", "rope.dimension_count_swa"),
    ("no_unknown_token", "tokenizer.ggml.unknown_token_id"),
])
def test_gemma4_files_the_configuration_cannot_represent(tmp_path, fault, words):
    model = build_random("gemma4", seed=1)
    path = _write(model, tmp_path / "bad.gguf", fault=fault)
    with pytest.raises(ModelError) as excinfo:
        load_model(path, cache_dir=tmp_path / "cache")
    message = _one_line(excinfo)
    assert words in message and str(path) in message
    assert not list((tmp_path / "cache").rglob("model.safetensors"))  # nothing half-written left behind


@pytest.mark.parametrize("key", ["gemma4.attention.key_length_swa", "gemma4.rope.freq_base_swa"])
def test_a_gemma4_file_without_a_required_key(tmp_path, key):
    """A key llama.cpp's converter always writes, missing: named in one line."""
    source = _write(build_random("gemma4", seed=1), tmp_path / "full.gguf")
    path = _copy(source, tmp_path / "nokey.gguf", drop=(key,))
    with pytest.raises(ModelError) as excinfo:
        load_model(path, cache_dir=tmp_path / "cache")
    assert key in _one_line(excinfo)
