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
                architecture: str = "llama", split: int = 0) -> tuple[Path, object, dict[str, torch.Tensor]]:
    """A GGUF file of a random two-layer llama (float32 tensors, q/k permuted as llama.cpp
    writes them), its config and the state dict it was written from; with ``split``, shards of
    at most that many tensors (``tiny-00001-of-0000N.gguf`` …, the LM head in the last) as
    gguf-py writes them, and the first shard's path."""
    config = random_config("llama", {"num_hidden_layers": 2, "tie_word_embeddings": False})
    g = torch.Generator().manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), architecture, split_max_tensors=split)
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    shapes = {"model.embed_tokens.weight": (config.vocab_size, config.hidden_size), "model.norm.weight": (config.hidden_size,)}
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
    shapes["lm_head.weight"] = (config.vocab_size, config.hidden_size)
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
    return (path.with_name("tiny-00001-of-" + f"{len(writer.tensors):05d}.gguf") if split else path), config, state


def test_tensor_by_tensor_conversion_undoes_the_permutation(tmp_path):
    path, config, state = _tiny_llama(tmp_path)
    out = tmp_path / "model.safetensors"
    gguf_module._write_weights([path], config, out)
    written = load_file(str(out))
    assert written.keys() == state.keys()
    for name, value in state.items():
        assert torch.equal(written[name], value), name


def test_a_split_model_converts_from_all_its_shards(tmp_path):
    """Shards as gguf-py writes them (metadata in the first, the LM head in the last): found
    from any shard, converted together to the single file's weights, and read with the
    tensors of every shard (transformers decides an untied LM head from the tensor list); a
    missing shard is named in one line."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    first, config, state = _tiny_llama(tmp_path, split=5)
    shards = gguf_module.gguf_shards(first.with_name(first.name.replace("-00001-", "-00002-")))
    assert len(shards) == 5 and shards[0] == first and gguf_module.gguf_model_name(shards[2]) == "tiny"
    out = tmp_path / "model.safetensors"
    gguf_module._write_weights(shards, config, out)
    written = load_file(str(out))
    assert written.keys() == state.keys() and all(torch.equal(written[k], v) for k, v in state.items())
    assert load_gguf_checkpoint(str(first))["config"]["tie_word_embeddings"]  # the first shard alone misleads
    with gguf_module._whole_model_reader(shards):
        assert not load_gguf_checkpoint(str(first))["config"]["tie_word_embeddings"]

    shards[2].unlink()
    with pytest.raises(ModelError) as excinfo:
        load_model(first)
    assert str(shards[2]) in _one_line(excinfo) and "missing" in _one_line(excinfo)


def test_a_conversion_parses_each_file_once(tmp_path, monkeypatch):
    """Tokenizer, configuration and weights share one reader per file (parsing a vocabulary's
    metadata takes seconds): the conversion of a split model builds exactly one
    ``GGUFReader`` per shard, and the shared reader gives the first shard's own tensors to the
    weights and every shard's to transformers."""
    first, config, state = _tiny_llama(tmp_path, split=3)
    shards = gguf_module.gguf_shards(first)
    built: list[str] = []
    original = gguf.GGUFReader

    class Counting(original):
        def __init__(self, path, *args, **kwargs):
            built.append(str(path))
            super().__init__(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    with gguf_module._whole_model_reader(shards) as read:
        assert gguf.GGUFReader(str(first)) is gguf.GGUFReader(str(first))
        assert len(gguf.GGUFReader(str(first)).tensors) == sum(len(read(s).tensors) for s in shards)
        assert len(read(first).tensors) < len(gguf.GGUFReader(str(first)).tensors)
    assert sorted(built) == sorted(map(str, shards)) and gguf.GGUFReader is Counting
    built.clear()
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    out = tmp_path / "model.safetensors"
    with gguf_module._whole_model_reader(shards) as read:  # as _convert_gguf: configuration, then weights
        assert not load_gguf_checkpoint(str(first))["config"]["tie_word_embeddings"]
        gguf_module._write_weights(shards, config, out, read)
    assert sorted(built) == sorted(map(str, shards))
    written = load_file(str(out))
    assert written.keys() == state.keys() and all(torch.equal(written[k], v) for k, v in state.items())


@pytest.mark.parametrize("fault, words", [("drop", "model.layers.1.mlp.up_proj.weight"),
                                          ("bad_shape", "blk.0.attn_norm.weight"),
                                          ("architecture", "qwen2moe")])
def test_files_that_do_not_hold_the_model(tmp_path, fault, words):
    kwargs = {"drop": {"drop": "model.layers.1.mlp.up_proj.weight"},
              "bad_shape": {"bad_shape": "model.layers.0.input_layernorm.weight"},
              "architecture": {"architecture": "qwen2moe"}}[fault]
    path, config, _ = _tiny_llama(tmp_path, **kwargs)
    with pytest.raises(ModelError) as excinfo:
        gguf_module._write_weights([path], config, tmp_path / "model.safetensors")
    message = _one_line(excinfo)
    assert words in message and str(path) in message


def _copy(source: Path, dest: Path, per_shard: int = 0, drop: tuple[str, ...] = ()) -> Path:
    """``source`` written again (every metadata field but those named in ``drop``, tensors byte
    for byte), with ``per_shard`` as shards of at most that many tensors (every metadata field
    in the first, as gguf-py splits a model); the file, or the first shard."""
    reader = gguf.GGUFReader(str(source))
    dest.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(dest), reader.fields["general.architecture"].contents(), split_max_tensors=per_shard)
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name not in ("general.architecture", *drop):
            array = field.types[0] == gguf.GGUFValueType.ARRAY
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=field.types[-1] if array else None)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest.with_name(f"{dest.stem}-00001-of-{len(writer.tensors):05d}.gguf") if per_shard else dest


@pytest.mark.real
def test_embedded_conversion_equals_transformers_gguf_load(tmp_path):
    """Every parameter of the converted SmolLM2 equals transformers' whole-model GGUF load,
    and the streamed model gives the in-memory logits and residual states bit for bit; so
    does the same file split into shards, streamed from their conversion."""
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
    first = _copy(source, tmp_path / "split" / "smollm2.gguf", per_shard=100)
    sharded = load_model(first, cache_dir=tmp_path, stream_layers=True)
    assert sharded.name == "smollm2" and len(sharded.provenance["files"]) == 3 and sharded.provenance["cached"] is False
    assert sharded.provenance["config_sha256"] == converted.provenance["config_sha256"]
    assert torch.equal(sharded.adapter.logits(ids), converted.adapter.logits(ids))
