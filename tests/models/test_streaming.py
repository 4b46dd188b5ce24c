"""Layer-streamed models (depthlens.models.streaming): the same numbers as the model held in
memory, one decoder layer resident at a time, and one-line errors for sources that cannot
stream or shards that do not match."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from depthlens.errors import DepthlensError, ModelError
from depthlens.models import init_like, load_model
from depthlens.models.streaming import LayerwiseInit
from depthlens.models.tokenizer import random_tokenizer

from .test_loading import _one_line

LAYERWISE = "random:llama:init=layerwise,num_hidden_layers=3"


def _resident_layers(loaded) -> list[int]:
    """The decoder layers whose parameters are not on ``meta`` (read from the modules)."""
    return [i for i, layer in enumerate(loaded.adapter.layers) if any(not p.is_meta for p in layer.parameters())]


def _same_everything(a, b, ids: torch.Tensor) -> None:
    """Logits, residual states, attention probabilities and every layer's float64 weights of
    two models, bit for bit."""
    assert torch.equal(a.adapter.logits(ids), b.adapter.logits(ids))
    assert torch.equal(a.adapter.residual_states(ids), b.adapter.residual_states(ids))
    pa, pb = dict(a.adapter.attention_probs(ids)), dict(b.adapter.attention_probs(ids))
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    for layer in range(a.adapter.n_layers):
        wa, wb = a.adapter.layer_weights(layer), b.adapter.layer_weights(layer)
        for field in ("Wq", "Wk", "Wv", "Wo", "Wd"):
            assert torch.equal(getattr(wa, field), getattr(wb, field)), (layer, field)


def test_layerwise_streamed_equals_in_memory_and_keeps_one_layer():
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    memory = load_model(LAYERWISE, seed=3)
    streamed = load_model(LAYERWISE, seed=3, stream_layers=True)
    assert memory.adapter.streamer is None and streamed.provenance["streamed"]
    assert _resident_layers(streamed) == []  # nothing loaded before it is used
    _same_everything(memory, streamed, ids)
    assert len(_resident_layers(streamed)) == 1
    streamer = streamed.adapter.streamer
    before = streamer.loads
    dict(streamed.adapter.attention_probs(ids))
    assert streamer.loads - before == 3  # one forward pass, each layer filled once
    # the parameters outside the layers are real, the released layers hold no storage
    assert not streamed.model.get_input_embeddings().weight.is_meta
    assert sum(p.numel() for p in streamed.model.parameters() if not p.is_meta) < \
        sum(p.numel() for p in memory.model.parameters())


def test_layerwise_layers_do_not_depend_on_depth_or_order():
    """Layer i of a layerwise model is drawn from its own seed: the same in a 2- and a 3-layer
    model, and in a streamed model whose layers were filled in any order."""
    two = load_model("random:llama:init=layerwise,num_hidden_layers=2", seed=5)
    three = load_model("random:llama:init=layerwise,num_hidden_layers=3", seed=5, stream_layers=True)
    for layer in (1, 0):  # backwards on purpose
        assert torch.equal(two.adapter.layer_weights(layer).Wq, three.adapter.layer_weights(layer).Wq)
    other = load_model("random:llama:init=layerwise,num_hidden_layers=2", seed=6)
    assert not torch.equal(two.adapter.layer_weights(0).Wq, other.adapter.layer_weights(0).Wq)
    assert LayerwiseInit(5).part_seed(0) != LayerwiseInit(5).part_seed(1) != LayerwiseInit(5).part_seed(None)


def test_layerwise_init_is_the_class_initialisation():
    """Norms 1, projections normal with the configuration's initializer_range (checked on the
    sample: mean within 4 standard errors of 0, standard deviation within 3 %)."""
    loaded = load_model("random:llama:init=layerwise,hidden_size=128,num_attention_heads=4,num_hidden_layers=1", seed=1)
    std = loaded.model.config.initializer_range
    layer = loaded.adapter.layers[0]
    assert torch.equal(layer.input_layernorm.weight, torch.ones(128))
    w = layer.mlp.up_proj.weight.double()
    assert abs(w.mean().item()) < 4 * std / w.numel() ** 0.5
    assert abs(w.std().item() / std - 1) < 0.03


def test_init_like_of_a_streamed_model_is_streamed_and_layerwise():
    memory = load_model(LAYERWISE, seed=3)
    streamed = load_model(LAYERWISE, seed=3, stream_layers=True)
    null_m, null_s = init_like(memory, seed=7), init_like(streamed, seed=7)
    assert null_s.adapter.streamer is not None and null_m.adapter.streamer is None
    assert null_s.provenance["init"] == null_m.provenance["init"] and "layerwise" in null_m.provenance["init"]
    ids = torch.randint(0, 256, (1, 9))
    assert torch.equal(null_m.adapter.logits(ids), null_s.adapter.logits(ids))
    assert not torch.equal(null_m.adapter.logits(ids), memory.adapter.logits(ids))


def _saved(tmp_path: Path, spec: str, seed: int = 0) -> tuple[Path, object]:
    loaded = load_model(spec, seed=seed)
    folder = tmp_path / "saved"
    loaded.model.save_pretrained(folder)
    random_tokenizer(loaded.model).save_pretrained(folder)
    return folder, loaded


@pytest.mark.parametrize("spec", ["random:llama:num_hidden_layers=3", "random:gpt2:n_layer=2",
                                  "random:gpt_neox:num_hidden_layers=2"])
def test_safetensors_folder_streams_to_the_same_numbers(tmp_path, spec):
    folder, _ = _saved(tmp_path, spec)
    memory = load_model(folder)
    streamed = load_model(folder, stream_layers=True)
    assert streamed.adapter.streamer is not None and streamed.provenance["sha256"] == memory.provenance["sha256"]
    _same_everything(memory, streamed, torch.randint(0, 256, (2, 10)))
    assert len(_resident_layers(streamed)) == 1


def test_streamed_model_in_another_dtype(tmp_path):
    folder, _ = _saved(tmp_path, "random:llama:num_hidden_layers=2")
    memory = load_model(folder, dtype="float64")
    streamed = load_model(folder, dtype="float64", stream_layers=True)
    ids = torch.randint(0, 256, (1, 8))
    assert streamed.adapter.dtype == torch.float64
    assert torch.equal(memory.adapter.logits(ids), streamed.adapter.logits(ids))


def test_a_missing_tensor_names_the_layer_and_the_file(tmp_path):
    folder, _ = _saved(tmp_path, "random:llama:num_hidden_layers=3")
    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    streamed = load_model(folder, stream_layers=True)  # layers 0 and 1 still work
    streamed.adapter.layer_weights(1)
    with pytest.raises(ModelError) as excinfo:
        streamed.adapter.logits(torch.randint(0, 256, (1, 4)))
    message = _one_line(excinfo)
    assert "layer 2" in message and "model.layers.2.mlp.up_proj.weight" in message and str(path) in message
    assert _resident_layers(streamed) == [] and streamed.adapter.streamer.resident is None  # nothing half-filled


def test_a_missing_shard_names_the_layer_and_the_shard(tmp_path):
    """A sharded checkpoint (save_pretrained with a small max_shard_size) missing one shard:
    the layers in the other shards work, the first layer in the missing one names it."""
    loaded = load_model("random:llama:num_hidden_layers=3")
    folder = tmp_path / "sharded"
    loaded.model.save_pretrained(folder, max_shard_size="100KB")
    random_tokenizer(loaded.model).save_pretrained(folder)
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    shards = {}
    for key, name in weight_map.items():
        shards.setdefault(name, set()).add(key)
    # a shard that holds only tensors of layer 2
    shard = next(name for name, keys in shards.items() if all(k.startswith("model.layers.2.") for k in keys))
    intact = load_model(folder, stream_layers=True)
    assert torch.equal(intact.adapter.logits(torch.arange(6)[None]), loaded.adapter.logits(torch.arange(6)[None]))
    (folder / shard).unlink()
    streamed = load_model(folder, stream_layers=True)
    streamed.adapter.layer_weights(0)
    with pytest.raises(ModelError) as excinfo:
        streamed.adapter.layer_weights(2)
    message = _one_line(excinfo)
    assert "layer 2" in message and shard in message and "missing" in message


def test_a_tensor_of_the_wrong_shape_names_the_layer_and_the_file(tmp_path):
    folder, _ = _saved(tmp_path, "random:llama:num_hidden_layers=2")
    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    tensors["model.layers.1.self_attn.q_proj.weight"] = tensors["model.layers.1.self_attn.q_proj.weight"][:, :8].contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ModelError) as excinfo:
        load_model(folder, stream_layers=True).adapter.layer_weights(1)
    message = _one_line(excinfo)
    assert "layer 1" in message and str(path) in message and "(64, 8)" in message


def test_non_finite_weights_of_a_streamed_layer_are_refused(tmp_path):
    folder, _ = _saved(tmp_path, "random:llama:num_hidden_layers=2")
    (path,) = folder.glob("*.safetensors")
    tensors = load_file(path)
    tensors["model.layers.1.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ModelError) as excinfo:
        load_model(folder, stream_layers=True).adapter.layer_weights(1)
    assert "layer 1" in _one_line(excinfo)


def test_sources_that_cannot_stream(tmp_path):
    for spec, words in (("random:llama", "init=layerwise"), ("random:llama:init=bogus", "init=bogus")):
        with pytest.raises(DepthlensError) as excinfo:
            load_model(spec, stream_layers=spec != "random:llama:init=bogus")
        assert words in _one_line(excinfo)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ModelError) as excinfo:
        load_model(gguf, stream_layers=True)
    assert "GGUF file" in _one_line(excinfo)
    folder, loaded = _saved(tmp_path, "random:llama:num_hidden_layers=2")
    for path in folder.glob("*.safetensors"):
        path.unlink()
    torch.save(loaded.model.state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(ModelError) as excinfo:
        load_model(folder, stream_layers=True)
    assert "safetensors" in _one_line(excinfo)


def test_a_hub_id_streams_from_its_snapshot_in_the_hf_cache(tmp_path, monkeypatch):
    """Offline, a hub id at a revision streams from the snapshot the Hugging Face cache holds
    (laid out as huggingface_hub lays it out): the in-memory numbers, one layer resident, the
    commit recorded; a snapshot with only a .bin pickle is refused in one line."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    repo, commit = tmp_path / "hf" / "models--depthlens-tests--tiny", "fade" * 10
    snapshot = repo / "snapshots" / commit
    snapshot.parent.mkdir(parents=True)
    folder, loaded = _saved(tmp_path, "random:llama:num_hidden_layers=3")
    folder.rename(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "step1000").write_text(commit)
    memory = load_model("depthlens-tests/tiny", revision="step1000")
    streamed = load_model("depthlens-tests/tiny", revision="step1000", stream_layers=True)
    assert streamed.adapter.streamer is not None and streamed.name == "depthlens-tests/tiny"
    prov = streamed.provenance
    assert prov["source"] == "hub" and prov["revision"] == "step1000" and prov["commit"] == commit
    assert prov["streamed"] and prov["sha256"] == memory.provenance["sha256"]
    _same_everything(memory, streamed, torch.randint(0, 256, (2, 10)))
    assert len(_resident_layers(streamed)) == 1

    (snapshot / "model.safetensors").unlink()
    torch.save(loaded.model.state_dict(), snapshot / "pytorch_model.bin")
    with pytest.raises(ModelError) as excinfo:
        load_model("depthlens-tests/tiny", revision="step1000", stream_layers=True)
    message = _one_line(excinfo)
    assert "*.safetensors" in message and "depthlens-tests/tiny" in message and "step1000" in message


def test_a_streamed_run_writes_the_same_tables(tmp_path):
    """Attention and jacobian (quick, with the step-0 null) of the layerwise model, in memory
    and streamed: every table equal, bit for bit."""
    import depthlens

    options = {"stages": ["attention", "jacobian"], "preset": "quick", "chunks": 2, "seq_len": 12, "jobs": 1,
               "quiet": True, "null_samples": 2, "null": "init"}
    memory = depthlens.analyse(LAYERWISE, out=tmp_path / "memory", **options)
    streamed = depthlens.analyse(LAYERWISE, out=tmp_path / "streamed", stream_layers=True, **options)
    names = sorted(p.name for p in (memory.path / "tables").glob("*.parquet"))
    assert names == sorted(p.name for p in (streamed.path / "tables").glob("*.parquet")) and len(names) >= 6
    for name in names:
        pd.testing.assert_frame_equal(pd.read_parquet(memory.path / "tables" / name),
                                      pd.read_parquet(streamed.path / "tables" / name), check_exact=True)
    manifest = (streamed.path / "manifest.json").read_text()
    assert '"stream_layers": true' in manifest and '"streamed": true' in manifest
