"""The gemma4 family on tiny random E2B/E4B-shaped models: its attention matrices against the
model's own eager attention (shared-key layers included), its per-layer shapes, loading from
a folder (in memory and layer-streamed), and the one-line refusals of what it does not serve.

Integration tier: models are built in code, no download.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import depthlens
from depthlens.errors import ModelError
from depthlens.jacobian import mean_operators
from depthlens.models import adapter_for, build_random, load_model, random_config
from depthlens.models.float64 import Float64Mode, double_copy
from depthlens.models.random_models import random_tokenizer
from depthlens.workflow import prepare

B, T = 2, 16


def _perturbed(model: torch.nn.Module, seed: int = 7) -> torch.nn.Module:
    """Non-trivial norm weights and layer scalars, so every norm and scalar is exercised."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.5 + float(torch.rand(1, generator=gen)))
    return model


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return _perturbed(build_random("gemma4", seed=1))


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


def test_tiny_config_has_every_feature_of_the_seed_shape() -> None:
    cfg = random_config("gemma4")
    assert cfg.layer_types == ["sliding_attention", "full_attention"] * 3
    assert cfg.kv_sharing_modes == [None, None, "store", "store", "reuse", "reuse"]
    assert cfg.hidden_size_per_layer_input > 0 and cfg.attention_k_eq_v and cfg.use_double_wide_mlp
    assert cfg.final_logit_softcapping == 30.0


def test_per_layer_shapes_and_key_sources(model) -> None:
    ad = adapter_for(model)
    assert ad.family == "gemma4" and ad.n_layers == 6 and ad.n_heads == 4 and ad.d_model == 64
    assert [ad.layer_head_dim(i) for i in range(6)] == [16, 32] * 3
    assert [ad.layer_kv_heads(i) for i in range(6)] == [2, 1] * 3
    assert (ad.head_dim, ad.n_kv_heads) == (16, 2)  # layer 0's
    assert [ad.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 2, 3]  # each shared layer reads the last of its type
    assert ad.sliding_windows == [4, None] * 3
    assert ad.logit_softcap() == 30.0


def test_attention_matches_eager_output_attentions(model) -> None:
    """Float32 eager attention (Hugging Face soft-maxes in float32, so a float64 model's own
    matrices are float32-accurate too); the adapter's are recomputed in float64."""
    ad = adapter_for(model)
    ids = _ids()
    with torch.no_grad():
        ref = model(ids, output_attentions=True).attentions
    seen = []
    for layer, A in ad.attention_probs(ids):
        assert A.dtype == torch.float64 and A.shape == (B, 4, T, T)
        assert torch.allclose(A, ref[layer].double(), rtol=0, atol=1e-5), (layer, (A - ref[layer].double()).abs().max())
        assert torch.allclose(A.sum(-1), torch.ones(B, 4, T, dtype=torch.float64), rtol=0, atol=1e-12)
        seen.append(layer)
    assert seen == list(range(6))
    # shared layers alone, in any order: their keys come from layers not asked for
    for layer, A in ad.attention_probs(ids, [5, 4]):
        assert torch.allclose(A, ref[layer].double(), rtol=0, atol=1e-5)
    # a shared layer's keys are its source's: with the source's key projection changed, so are they
    weight = model.model.layers[3].self_attn.k_proj.weight
    kept = weight.detach().clone()
    with torch.no_grad():
        weight.add_(0.5 * torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)))
    try:
        changed = dict(ad.attention_probs(ids, [5]))[5]
    finally:
        with torch.no_grad():
            weight.copy_(kept)
    assert not torch.allclose(changed, ref[5].double(), rtol=0, atol=1e-3)


def test_attention_matches_eager_in_float64(model) -> None:
    """A float64 copy under Float64Mode (norms and softmax kept in float64): the adapter's
    queries and keys follow the model's arithmetic to float64 rounding, not just float32's."""
    m64 = double_copy(model).eval()
    ad = adapter_for(m64)
    ids = _ids(4)
    with Float64Mode(), torch.no_grad():
        ref = m64(ids, output_attentions=True).attentions
        got = dict(ad.attention_probs(ids))
    for layer in range(6):
        assert torch.allclose(got[layer], ref[layer], rtol=0, atol=1e-13), (layer, (got[layer] - ref[layer]).abs().max())
    # values (the source layer's for a shared layer; from the key projection on full layers):
    # the matrices times them are the heads' outputs the model feeds its output projection
    with Float64Mode(), torch.no_grad():
        inputs = ad.attention_inputs(ids)
        for layer in range(6):
            v = ad.qkv(ad.kv_source(layer), inputs[ad.kv_source(layer)])[2]
            v = torch.repeat_interleave(v, 4 // ad.layer_kv_heads(layer), dim=1)
            heads = (got[layer] @ v).transpose(1, 2)
            assert torch.allclose(heads, ad.head_outputs(ids, layer), rtol=0, atol=1e-12), layer


def test_apply_rope_is_the_rotation_qkv_applies(model) -> None:
    ad = adapter_for(model)
    x = ad.attention_inputs(_ids(5), [1])[1]
    a = model.model.layers[1].self_attn
    shape = (B, T, -1, ad.layer_head_dim(1))
    q = a.q_norm(a.q_proj(x).view(shape)).transpose(1, 2)
    k = a.k_norm(a.k_proj(x).view(shape)).transpose(1, 2)
    rq, rk = ad.apply_rope(q, k, *ad.rope_cos_sin(1, T, x))
    want_q, want_k, _ = ad.qkv(1, x)
    assert torch.equal(rq, want_q) and torch.equal(rk, want_k) and not torch.equal(rq, q)


def test_sliding_windows_are_respected(model) -> None:
    ad = adapter_for(model)
    for layer, A in ad.attention_probs(_ids(1)):
        i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
        if ad.sliding_windows[layer] is not None:
            assert (A[..., i - j >= 4] == 0).all()
            assert (A[..., (i - j < 4) & (j <= i)] > 0).all()


def test_residual_states_at_three_boundaries_chain_into_each_layer(model) -> None:
    """``pre_attn``, ``pre_mlp`` and ``pre_ple`` of every layer, in float64: each is the one
    before plus that update, written out from the layer's modules (attention from the
    adapter's matrices and values), and the per-layer-input update times the layer scalar
    gives the next layer's input."""
    m64 = double_copy(model).eval()
    ad = adapter_for(m64)
    assert ad.boundaries == ("pre_attn", "pre_mlp", "pre_ple")
    ids = _ids(2)
    with Float64Mode(), torch.no_grad():
        hidden = m64(ids, output_hidden_states=True).hidden_states
        states = ad.residual_states(ids)
        assert states.shape == (3 * 6 + 1, B, T, 64)
        embeds = m64.model.embed_tokens(ids)
        per_layer = m64.model.project_per_layer_inputs(embeds, m64.model.get_per_layer_inputs(ids, embeds))
        inputs, probs = ad.attention_inputs(ids), dict(ad.attention_probs(ids))
        for index in range(6):
            layer, (h, g, r) = m64.model.layers[index], states[3 * index: 3 * index + 3]
            assert torch.equal(h, hidden[index])
            source = ad.kv_source(index)
            v = torch.repeat_interleave(ad.qkv(source, inputs[source])[2], 4 // ad.layer_kv_heads(index), dim=1)
            heads = (probs[index] @ v).transpose(1, 2).reshape(B, T, -1)
            torch.testing.assert_close(g, h + layer.post_attention_layernorm(layer.self_attn.o_proj(heads)),
                                       rtol=0, atol=1e-12)
            mlp = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(g)))
            torch.testing.assert_close(r, g + mlp, rtol=0, atol=1e-12)
            gate = layer.act_fn(layer.per_layer_input_gate(r)) * per_layer[:, :, index]
            update = layer.post_per_layer_input_norm(layer.per_layer_projection(gate))
            torch.testing.assert_close(states[3 * index + 3], layer.layer_scalar * (r + update), rtol=0, atol=1e-12)
        torch.testing.assert_close(ad.final_norm(states[-1]), hidden[-1], rtol=0, atol=1e-12)


def test_sub_layer_maps_are_refused_in_one_line(model) -> None:
    ad = adapter_for(model)
    for call in (lambda: ad.sublayer(0, "attn"), lambda: ad.branch(1, "mlp"), lambda: ad.block(2),
                 lambda: ad.composed_logits(_ids())):
        with pytest.raises(ModelError) as excinfo:
            call()
        message = str(excinfo.value)
        assert "\n" not in message and "per-layer-input" in message and "every depthlens stage runs on it" in message


def test_mixture_of_experts_and_all_shared_configs_are_refused() -> None:
    moe = build_random("gemma4", "enable_moe_block=true,num_experts=2,top_k_experts=1,moe_intermediate_size=16")
    with pytest.raises(ModelError, match="enable_moe_block=True"):
        adapter_for(moe)
    shared = build_random("gemma4", "num_hidden_layers=2,num_kv_shared_layers=2")
    with pytest.raises(ModelError, match="every layer of this gemma4 model reads shared keys"):
        adapter_for(shared)


def test_vision_only_bidirectional_attention_is_causal_for_text() -> None:
    assert adapter_for(build_random("gemma4", "use_bidirectional_attention=vision")).family == "gemma4"
    with pytest.raises(ModelError, match="bidirectional"):
        adapter_for(build_random("gemma4", "use_bidirectional_attention=all"))


def _saved(tmp_path: Path) -> Path:
    loaded = load_model("random:gemma4", seed=4)
    _perturbed(loaded.model)
    folder = tmp_path / "gemma4"
    loaded.model.save_pretrained(folder)
    random_tokenizer(loaded.model).save_pretrained(folder)
    return folder


def test_safetensors_folder_loads_and_streams_to_the_same_matrices(tmp_path) -> None:
    folder = _saved(tmp_path)
    memory = load_model(str(folder))
    streamed = load_model(str(folder), stream_layers=True)
    assert memory.family == "gemma4" and streamed.adapter.streamer is not None
    ids = _ids(3)
    with torch.no_grad():
        ref = memory.model(ids, output_attentions=True).attentions
    got_memory = dict(memory.adapter.attention_probs(ids))
    got_streamed = dict(streamed.adapter.attention_probs(ids))
    for layer in range(6):
        assert torch.allclose(got_memory[layer], ref[layer].double(), rtol=0, atol=1e-5)
        assert torch.equal(got_streamed[layer], got_memory[layer])
    for mode in ("isolated", "in_context"):  # the Jacobian engines read the shared layers' sources too
        want = mean_operators(memory.adapter, ids, mode, positions="all")
        got = mean_operators(streamed.adapter, ids, mode, positions="all")
        assert list(got) == list(want) == [(layer, kind) for layer in range(6) for kind in ("attn", "mlp", "ple")]
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_a_streamed_gemma4_runs_the_jacobian_stage_as_in_memory(tmp_path) -> None:
    """Shared layers read their key source's weights, so a layer-streamed model releases the
    layer an engine is working on: the trained model's operators and bootstrap (per-chunk sums)
    equal the in-memory run's, and the step-0 nulls, whose layers are filled by initialisation
    as they load (drawn layer by layer, so not the in-memory draw), run too."""
    folder = _saved(tmp_path)
    options = dict(preset="quick", stages=["jacobian"], chunks=2, seq_len=16, jacobian_mode="both", null="init",
                   funnel_boot=2, init_seeds=2, save_arrays="float64")
    memory = depthlens.analyse(str(folder), out=tmp_path / "memory", **options)
    streamed = depthlens.analyse(str(folder), out=tmp_path / "streamed", stream_layers=True, **options)
    assert streamed.manifest["stages"]["jacobian"]["status"] == "done"
    for name in ("operators", "funnel_boot"):
        want, got = (run.table(name) for run in (memory, streamed))
        assert len(got) == len(want) > 0 and set(got["checkpoint"]) == {"trained", "init"}
        want, got = (t[t["checkpoint"] == "trained"] for t in (want, got))
        for column in ("erank", "spectral_radius", "erank_full_depth"):
            if column in want:
                np.testing.assert_allclose(got[column], want[column], rtol=1e-9, atol=0)
    null = streamed.table("funnel_boot")
    assert sorted(set(null.loc[null["checkpoint"] == "init", "init_seed"])) == [0.0, 1.0]


def test_multimodal_gemma4_text_path() -> None:
    text = {k: v for k, v in random_config("gemma4").to_dict().items() if k not in ("model_type", "transformers_version")}
    cfg = transformers.Gemma4Config(text_config={**text, "pad_token_id": 0}, vision_config=None, audio_config=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ad = adapter_for(model)
    assert ad.family == "gemma4" and ad.n_layers == 6 and [ad.kv_source(i) for i in range(6)] == [0, 1, 2, 3, 2, 3]
    ids = torch.randint(0, 250, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, output_attentions=True).attentions
    for layer, A in ad.attention_probs(ids):
        assert torch.allclose(A, ref[layer].double(), rtol=0, atol=1e-5)


def test_every_stage_runs_on_gemma4(tmp_path) -> None:
    run = depthlens.analyse("random:gemma4", out=tmp_path / "run", preset="quick", chunks=4, seq_len=24)
    assert {name: record["status"] for name, record in run.manifest["stages"].items()} == {
        stage: "done" for stage in ("capture", "attention", "ablate", "clamp", "contest", "jacobian", "topology")}


def test_a_trained_gemma4_series_and_its_census(tmp_path) -> None:
    """Any depth trains (two layers: none shared, so every layer type computes its keys), and
    its census runs."""
    from depthlens.training import resolve, train

    assert random_config("gemma4", "num_hidden_layers=2").num_kv_shared_layers == 0
    assert random_config("gemma4", "num_hidden_layers=5").layer_types[-1] == "full_attention"
    series = train(resolve(None, family="gemma4", n_layers=2, d_model=32, n_heads=2, d_ff=64, steps=2, checkpoints=1,
                           seq_len=32), tmp_path / "series", quiet=True)
    run = depthlens.census(series, out=tmp_path / "census", preset="quick", stages=["attention", "jacobian"],
                           probe_len=8, seq_len=16, chunks=2)
    assert sorted(set(run.census_heads["checkpoint"])) == ["step-0", "step-2"]


def test_the_attention_ablate_and_contest_stages_run_on_gemma4(tmp_path) -> None:
    run = depthlens.analyse("random:gemma4", out=tmp_path / "run", preset="quick", stages=["contest"],
                            probe_seqs=2, chunks=4, seq_len=16)
    assert {name: record["status"] for name, record in run.manifest["stages"].items()} == {
        "attention": "done", "ablate": "done", "contest": "done"}
    for table in ("heads", "ablation"):
        rows = run.table(table)
        assert sorted(set(rows["layer"])) == list(range(6)) and set(rows["head"]) == set(range(4))


def test_the_lens_stage_runs_on_gemma4(tmp_path) -> None:
    from depthlens.lens.artifact import read_transport

    run = depthlens.analyse("random:gemma4", out=tmp_path / "run", preset="quick", stages=["lens"], chunks=2, seq_len=20)
    transport = run.table("transport")
    assert sorted(transport["layer"]) == list(range(5))  # source layers 0 .. L − 2
    artifact = read_transport(tmp_path / "run" / "arrays" / "lens.pt")
    assert artifact.d_model == 64 and sorted(artifact.source_layers) == list(range(5))


def test_the_capture_stage_summarises_three_boundaries_a_layer(tmp_path) -> None:
    run = depthlens.analyse("random:gemma4", out=tmp_path / "run", preset="quick", stages=["capture"], chunks=2,
                            seq_len=16)
    summary = run.table("residual_summary")
    chunk = summary[summary["chunk"] == 0]
    assert list(zip(chunk["layer"], chunk["boundary"])) == [
        *((layer, kind) for layer in range(6) for kind in ("pre_attn", "pre_mlp", "pre_ple")), (6, "final")]
    prepared = prepare(run.config)  # the run's model and chunks, made again
    states = prepared.loaded.adapter.residual_states(prepared.token_ids[:1])[:, 0].double()
    np.testing.assert_allclose(chunk["rms"], states.pow(2).mean(dim=(1, 2)).sqrt().numpy(), rtol=1e-12, atol=0)


def test_ablation_criticality_equals_the_models_own_passes() -> None:
    """Every head of every layer (shared-key layers and their sources included), mean, zero and
    resample ablation: the stage's batched passes against one forward pass per head with the
    ablation hook, cross-entropy from float64 log-softmax."""
    from depthlens.interventions import ablation as ab

    loaded = load_model("random:gemma4", seed=3)
    _perturbed(loaded.model, seed=5)
    ad = loaded.adapter
    ids = torch.randint(0, 256, (5, 12), generator=torch.Generator().manual_seed(6))
    table, _ = ab.criticality(ad, ids, ("mean", "zero", "resample"), 3, 2, n_boot=20)
    means = ab.head_means(ad, ids[:2], 2)
    assert [tuple(m.shape) for m in means] == [(4, 16), (4, 32)] * 3
    held = ids[2:]

    def nll(batch: torch.Tensor) -> torch.Tensor:
        logits = ad.logits(batch).to(torch.float64)[:, :-1]
        return -torch.log_softmax(logits, dim=-1).gather(-1, batch[:, 1:, None])[..., 0]

    clean = nll(held)
    sources = ids[torch.tensor([0, 1, 0])]
    for row in table.itertuples():
        value = {"mean": means[row.layer][row.head].float(), "zero": None,
                 "resample": ad.head_outputs(sources, row.layer)[:, :, row.head]}[row.method]
        with ad.ablate_head(row.layer, row.head, row.method, value):
            want = float((nll(held) - clean).mean())
        assert abs(row.criticality - want) < 1e-5, (row.layer, row.head, row.method, row.criticality, want)
    assert (table["criticality"].abs() > 0).all()
