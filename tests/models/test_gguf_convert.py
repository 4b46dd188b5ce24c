"""GGUF conversion one tensor at a time (depthlens.models.gguf): the weights transformers'
whole-model GGUF load gives, bit for bit; llama.cpp's q/k permutation undone; one-line errors
for files that do not hold the model; and GGUF models streamed one layer at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from depthlens.errors import ModelError
from depthlens.models import gguf as gguf_module
from depthlens.models import load_model
from depthlens.models.families import random_config

from .test_loading import _one_line

gguf = pytest.importorskip("gguf")

#: HF name -> GGUF name of a llama layer's tensors (llama.cpp's standard names).
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``convert_hf_to_gguf`` permutation of a q or k projection (rotary halves
    interleaved), written out here independently of transformers' inverse."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tiny_llama(tmp_path: Path, *, drop: str | None = None, bad_shape: str | None = None,
                architecture: str = "llama") -> tuple[Path, object, dict[str, torch.Tensor]]:
    """A GGUF file of a random two-layer llama (float32 tensors, q/k permuted as llama.cpp
    writes them), its config and the state dict it was written from."""
    config = random_config("llama", {"num_hidden_layers": 2, "tie_word_embeddings": False})
    g = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), architecture)
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    shapes = {"model.embed_tokens.weight": (config.vocab_size, config.hidden_size), "model.norm.weight": (config.hidden_size,),
              "lm_head.weight": (config.vocab_size, config.hidden_size)}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    hd = config.hidden_size // heads
    for layer in range(config.num_hidden_layers):
        for hf, short in _LAYER.items():
            name = f"model.layers.{layer}.{hf}.weight"
            names[name] = f"blk.{layer}.{short}.weight"
            out = {"q_proj": heads * hd, "k_proj": kv * hd, "v_proj": kv * hd, "gate_proj": config.intermediate_size,
                   "up_proj": config.intermediate_size}.get(hf.split(".")[-1], config.hidden_size)
            into = config.intermediate_size if hf == "mlp.down_proj" else config.hidden_size
            shapes[name] = (config.hidden_size,) if "layernorm" in hf else (out, into)
    for name, shape in shapes.items():
        state[name] = torch.randn(shape, generator=g)
        if name == drop:
            continue
        value = state[name].numpy()
        if name == bad_shape:
            value = value[:-1]
        if ".q_proj." in name or ".k_proj." in name:
            value = _llama_cpp_permute(value, heads if ".q_proj." in name else kv)
        writer.add_tensor(names[name], np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, config, state


def test_tensor_by_tensor_conversion_undoes_the_permutation(tmp_path):
    path, config, state = _tiny_llama(tmp_path)
    out = tmp_path / "model.safetensors"
    gguf_module._write_weights(path, config, out)
    written = load_file(str(out))
    assert written.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(written[name], value), name


@pytest.mark.parametrize("fault, words", [("drop", "model.layers.1.mlp.up_proj.weight"),
                                          ("bad_shape", "blk.0.attn_norm.weight"),
                                          ("architecture", "qwen2moe")])
def test_files_that_do_not_hold_the_model(tmp_path, fault, words):
    kwargs = {"drop": {"drop": "model.layers.1.mlp.up_proj.weight"},
              "bad_shape": {"bad_shape": "model.layers.0.input_layernorm.weight"},
              "architecture": {"architecture": "qwen2moe"}}[fault]
    path, config, _ = _tiny_llama(tmp_path, **kwargs)
    with pytest.raises(ModelError) as excinfo:
        gguf_module._write_weights(path, config, tmp_path / "model.safetensors")
    message = _one_line(excinfo)
    assert words in message and str(path) in message


@pytest.mark.real
def test_embedded_conversion_equals_transformers_gguf_load(tmp_path):
    """Every parameter of the converted SmolLM2 equals transformers' whole-model GGUF load,
    and the streamed model gives the in-memory logits and residual states bit for bit."""
    from transformers import AutoModelForCausalLM, GgufConfig

    from depthlens.models.loading import DEFAULT_MODEL, _embedded_file

    source = _embedded_file(DEFAULT_MODEL)
    if source is None:
        pytest.skip(f"{DEFAULT_MODEL} is not installed")
    converted = load_model(DEFAULT_MODEL, cache_dir=tmp_path)
    assert converted.provenance["cached"] is False
    reference = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
    ours, theirs = dict(converted.model.named_parameters()), dict(reference.named_parameters())
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    streamed = load_model(DEFAULT_MODEL, cache_dir=tmp_path, stream_layers=True)
    assert streamed.provenance["streamed"] and streamed.provenance["cached"] is True
    assert streamed.provenance["config_sha256"] == converted.provenance["config_sha256"]
    ids = torch.randint(0, 49152, (2, 16), generator=torch.Generator().manual_seed(1))
    assert torch.equal(streamed.adapter.logits(ids), converted.adapter.logits(ids))
    assert torch.equal(streamed.adapter.residual_states(ids), converted.adapter.residual_states(ids))
    assert sum(1 for layer in streamed.adapter.layers if any(not p.is_meta for p in layer.parameters())) == 1
