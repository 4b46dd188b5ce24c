"""The clamp stage (METHODS A7): detection of a planted massive activation, the clamp that
undoes it, the chain verdict on synthetic tables, and a model without massive activations."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens import workflow
from depthlens.attention.patterns import sink_mass
from depthlens.config import RunConfig
from depthlens.context import Execution
from depthlens.errors import InputError
from depthlens.interventions import clamp as cl
from depthlens.interventions import clamp_stage
from depthlens.interventions.options import ClampOptions
from depthlens.models import build_random
from depthlens.models.loading import wrap_model
from depthlens.runs import RunMode
from depthlens.schema import SCHEMA

DIM, VALUE, FORCED_LAYER, N_LAYERS = 5, 1.0e4, 1, 4
CHUNKS, SEQ_LEN, CLAMP_CHUNKS = 4, 16, 2


# ----------------------------------------------------------------------------- planted model
def _dim_free_model():
    """A tiny random llama whose residual dimension DIM is exactly 0 everywhere: no embedding,
    output projection or down projection writes into it."""
    model = build_random("llama", {"num_hidden_layers": N_LAYERS}, seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, DIM] = 0.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[DIM, :] = 0.0
            layer.mlp.down_proj.weight[DIM, :] = 0.0
    return model


def _force(model) -> torch.utils.hooks.RemovableHandle:
    """Add VALUE to h[:, 0, DIM] at the input of layer FORCED_LAYER (a massive activation from there on)."""
    def hook(module, args, kwargs):
        h = (args[0] if args else kwargs["hidden_states"]).clone()
        h[:, 0, DIM] += VALUE
        if args:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    return model.model.layers[FORCED_LAYER].register_forward_pre_hook(hook, with_kwargs=True)


def _run(loaded, text: Path, out: Path, run_mode: RunMode = RunMode.NEW, **options) -> Path:
    config = RunConfig(model="random:llama", text=str(text), chunks=CHUNKS, seq_len=SEQ_LEN, batch_size=2,
                       clamp_chunks=CLAMP_CHUNKS, clamp_null_samples=1, **options)
    return workflow.run(config, out, run_mode, stages=("clamp",), execution=Execution(quiet=True, jobs=1),
                        loaded=loaded)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, text_file: Path):
    """The stage on the forced model, and the unforced model's sink masses on the clamp chunks."""
    model = _dim_free_model()
    loaded = wrap_model(model, name="planted")
    ids = workflow.prepare(RunConfig(model="random:llama", text=str(text_file), chunks=CHUNKS, seq_len=SEQ_LEN),
                           loaded).token_ids[:CLAMP_CHUNKS]
    with torch.inference_mode():
        clean = {layer: sink_mass(p.numpy()) for layer, p in loaded.adapter.attention_probs(ids)}
    handle = _force(model)
    try:
        root = _run(loaded, text_file, tmp_path_factory.mktemp("planted") / "run", control_seeds=1)
        with torch.inference_mode():
            forced = {layer: sink_mass(p.numpy()) for layer, p in loaded.adapter.attention_probs(ids)}
        first = {name: pd.read_parquet(root / "tables" / f"{name}.parquet") for name in ("massive", "clamp", "clamp_heads")}
        first["interventions"] = (root / "interventions.json").read_text()
        for key in ("massive00001", "arm_massive_-1_dose_0.5", "arm_control_0_mean_nan"):
            (root / "units" / "clamp" / f"{key}.done").unlink()
        _run(loaded, text_file, root, control_seeds=1, run_mode=RunMode.RESUME)
    finally:
        handle.remove()
    return root, clean, forced, first


def test_resumed_run_equals_the_first(planted) -> None:
    root, _, _, first = planted
    for name in ("massive", "clamp", "clamp_heads"):
        pd.testing.assert_frame_equal(pd.read_parquet(root / "tables" / f"{name}.parquet"), first[name])
    assert (root / "interventions.json").read_text() == first["interventions"]


def test_planted_massive_activation_is_detected_exactly(planted) -> None:
    root, _, _, _ = planted
    massive = pd.read_parquet(root / "tables" / "massive.parquet")
    got = set(massive[["chunk", "layer", "boundary", "position", "dim"]].itertuples(index=False, name=None))
    boundaries = [(layer, kind) for layer in range(FORCED_LAYER, N_LAYERS) for kind in ("pre_attn", "pre_mlp")]
    boundaries.append((N_LAYERS, "final"))
    assert got == {(c, layer, kind, 0, DIM) for c in range(CHUNKS) for layer, kind in boundaries}
    assert np.all(massive["value"] == VALUE) and np.all(massive["ratio"] >= 1000.0)
    chain = json.loads((root / "interventions.json").read_text())["clamp_chain"]
    assert chain["tested"] is True and chain["all_dims"] == [DIM] and chain["from_layer"] == FORCED_LAYER
    assert chain["n_chunks"] == CLAMP_CHUNKS and chain["detection_chunks"] == CHUNKS
    assert set(chain["conditions"]) == {"monotone", "predicts", "control_inert"}
    assert chain["dims"] == ([DIM] if chain["supported"] else [])
    assert len(chain["control_dims"]) == 1 and DIM not in chain["control_dims"][0]


def test_clamp_to_the_mean_restores_the_unforced_sink_mass(planted) -> None:
    root, clean, forced, _ = planted
    heads = pd.read_parquet(root / "tables" / "clamp_heads.parquet")
    massive = heads[heads["target"] == "massive"]
    assert sorted(massive["layer"].unique()) == list(range(FORCED_LAYER, N_LAYERS))  # layers below are left out
    expected = {(layer, h): float(np.median(clean[layer][:, h])) for layer in clean for h in range(clean[layer].shape[1])}
    before = {(layer, h): float(np.median(forced[layer][:, h])) for layer in forced for h in range(forced[layer].shape[1])}
    for arm, alpha in (("mean", None), ("dose", 0.0)):  # the dim is 0 in the unforced model: both arms undo the force
        rows = massive[(massive["arm"] == arm) & (massive["alpha"].isna() if alpha is None else massive["alpha"] == alpha)]
        assert len(rows) == (N_LAYERS - FORCED_LAYER) * 4
        for r in rows.itertuples():
            assert abs(r.sink_mass - expected[(r.layer, r.head)]) < 1e-12
            assert math.isfinite(r.TR1) and math.isfinite(r.delta_TR1) and r.failure is None
    ref = massive[(massive["arm"] == "dose") & (massive["alpha"] == 1.0)]
    moved = max(abs(r.sink_mass - expected[(r.layer, r.head)]) for r in ref.itertuples())
    assert moved > 1e-3  # the force did change the attention
    assert all(abs(r.sink_mass - before[(r.layer, r.head)]) < 1e-12 for r in ref.itertuples())
    middle = massive[(massive["arm"] == "dose") & (massive["alpha"] == 0.5)]
    assert middle["TR1"].isna().all() and middle["delta_TR1"].isna().all()


def test_planted_tables_follow_the_schema(planted) -> None:
    root, _, _, _ = planted
    summary = pd.read_parquet(root / "tables" / "clamp.parquet")
    assert list(summary.columns) == list(SCHEMA["clamp"].columns)
    # massive: doses 0, .25, .5, .75, 1 and mean; control seed 0 the same
    assert len(summary) == 12 and set(summary["target"]) == {"massive", "control"}
    ref = summary[(summary["arm"] == "dose") & (summary["alpha"] == 1.0)]
    assert (ref["delta_ce"] == 0.0).all() and (summary["from_layer"] == FORCED_LAYER).all()
    assert summary.loc[summary["target"] == "massive", "dims"].eq(str(DIM)).all()
    assert (summary["n_heads"] == (N_LAYERS - FORCED_LAYER) * 4).all() and (summary["n_chunks"] == CLAMP_CHUNKS).all()
    zero = summary[(summary["target"] == "massive") & (summary["alpha"] == 0.0)]
    assert float(zero["delta_ce"].iloc[0]) != 0.0


def test_no_massive_activation_is_not_tested(tmp_path: Path, text_file: Path) -> None:
    loaded = wrap_model(build_random("llama", seed=0), name="plain")
    root = _run(loaded, text_file, tmp_path / "run")
    chain = json.loads((root / "interventions.json").read_text())["clamp_chain"]
    assert chain["tested"] is False and "massive" in chain["reason"] and "\n" not in chain["reason"]
    for name in ("clamp", "clamp_heads"):
        table = pd.read_parquet(root / "tables" / f"{name}.parquet")
        assert table.empty and list(table.columns) == list(SCHEMA[name].columns)
    assert pd.read_parquet(root / "tables" / "massive.parquet").empty
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["stages"]["clamp"]["status"] == "done"


# ----------------------------------------------------------------------------- pure functions
def test_choose_dims_needs_half_the_chunks() -> None:
    rows = [(c, 2, "pre_attn", 0, 7) for c in range(2)] + [(c, 3, "pre_attn", 0, 7) for c in range(4)]
    rows += [(0, 1, "pre_attn", 0, 9)]  # one chunk of four: not clamped
    rows += [(c, 1, "pre_attn", 3, 11) for c in range(4)]  # not the first token
    rows += [(c, 1, "pre_mlp", 0, 12) for c in range(4)]  # not a layer input
    massive = pd.DataFrame(rows, columns=["chunk", "layer", "boundary", "position", "dim"])
    plan = cl.choose_dims(massive, 4)
    assert plan == cl.ClampPlan(dims=(7,), emergence=(2,), from_layer=2, n_chunks=4)
    assert cl.choose_dims(massive, 5).emergence == (3,)  # 2 of 5 chunks is less than half
    assert cl.choose_dims(massive[massive["dim"] != 7], 4) is None
    assert list(cl.ordinary_dims(massive, 14)) == [0, 1, 2, 3, 4, 5, 6, 8, 10, 13]
    dims = cl.control_dims(cl.ordinary_dims(massive, 14), 3, seed=0, s=1)
    assert len(set(dims)) == 3 and not set(dims) & {7, 9, 11, 12}
    assert dims == cl.control_dims(cl.ordinary_dims(massive, 14), 3, seed=0, s=1) != cl.control_dims(
        cl.ordinary_dims(massive, 14), 3, seed=0, s=2)


def test_clamp_values_are_per_layer_clean_values() -> None:
    states = np.arange(5 * 2 * 3 * 4, dtype=np.float64).reshape(5, 2, 3, 4)  # L = 2
    first, sums, count = cl.layer_inputs_summary(states)
    assert first.shape == (3, 2, 4) and np.array_equal(first[1], states[2, :, 0, :])
    assert count == 4 and np.allclose(sums / count, states[0::2, :, 1:, :].mean(axis=(1, 2)))
    values = cl.dose_values(first, 1, 0.5, from_layer=1)
    assert sorted(values) == [1, 2] and np.array_equal(values[2].ravel(), 0.5 * states[4, :, 0, 1])
    assert cl.mean_values(sums / count, 3, 2) == {2: float(sums[2, 3] / count)}
    assert cl.arm_alphas((0.5,)) == (0.0, 0.5, 1.0)
    assert cl.has_reserve("mean", math.nan) and cl.has_reserve("dose", 0.0) and not cl.has_reserve("dose", 0.25)


def _synthetic(n_heads: int = 24, control_seeds: int = 2, *, bend: bool = False, shuffle_rise: bool = False,
               control_moves: bool = False, seed: int = 0) -> pd.DataFrame:
    """A clamp_heads table in which the chain holds, unless one premise is broken."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.3, 0.9, n_heads)
    gain = rng.uniform(0.5, 1.5, n_heads)
    tr_ref = rng.normal(0.0, 0.1, n_heads)
    rows = []

    def add(target, s, arm, alpha, sink, dtr):
        for h in range(n_heads):
            rows.append({"layer": 1 + h // 4, "head": h % 4, "target": target, "seed": s, "arm": arm, "alpha": alpha,
                         "sink_mass": sink[h], "TR1": np.nan if np.isnan(dtr[h]) else 1.0 + dtr[h],
                         "delta_TR1": dtr[h], "failure": None})

    nan = np.full(n_heads, np.nan)
    for a in (0.0, 0.25, 0.5, 0.75, 1.0):
        shape = a if not bend else {0.0: 0.0, 0.25: 0.6, 0.5: 0.2, 0.75: 0.4, 1.0: 1.0}[a]
        sink = base * (0.2 + 0.8 * shape)
        drop = base - sink
        rise = gain * drop if not shuffle_rise else rng.permutation(gain * drop)
        add("massive", -1, "dose", a, sink, tr_ref + rise if a in (0.0, 1.0) else nan)
    sink_mean = base * 0.3
    add("massive", -1, "mean", np.nan, sink_mean, tr_ref + gain * (base - sink_mean))
    for s in range(control_seeds):
        for a in (0.0, 0.25, 0.5, 0.75, 1.0):
            wobble = rng.normal(0.0, 1e-4, n_heads) if a != 1.0 else 0.0
            sink = base + wobble if not (control_moves and s == 1) else base * (0.2 + 0.8 * a)
            dtr = tr_ref + (rng.normal(0.0, 1e-4, n_heads) if a != 1.0 else 0.0)
            add("control", s, "dose", a, sink, dtr if a in (0.0, 1.0) else nan)
        add("control", s, "mean", np.nan, base, tr_ref)
    return pd.DataFrame(rows, columns=cl.HEAD_COLUMNS)


def test_verdict_supported_on_a_clean_chain() -> None:
    verdict = cl.chain_verdict(_synthetic())
    c = verdict["conditions"]
    assert verdict["supported"] is True and verdict["reason"] is None
    assert c["monotone"]["nondecreasing"] and c["monotone"]["frac_positive"] == 1.0 and c["monotone"]["p"] < 1e-6
    assert c["predicts"]["arms"]["zero"]["rho"] > 0.5 and c["predicts"]["arms"]["zero"]["q"] < 0.05
    assert c["control_inert"]["held"] and all(s["sink_mass_ratio"] < 0.01 for s in c["control_inert"]["seeds"])
    json.dumps(cl.json_safe(verdict), allow_nan=False)


@pytest.mark.parametrize("broken, condition", [({"bend": True}, "monotone"), ({"shuffle_rise": True}, "predicts"),
                                               ({"control_moves": True}, "control_inert")])
def test_verdict_each_condition_flips_when_its_premise_breaks(broken: dict, condition: str) -> None:
    verdict = cl.chain_verdict(_synthetic(**broken))
    held = {name: c["held"] for name, c in verdict["conditions"].items()}
    assert held == {name: name != condition for name in held}
    assert verdict["supported"] is False and condition in verdict["reason"]
    if condition == "predicts":
        assert verdict["conditions"]["predicts"]["arms"]["zero"]["q"] > 0.05
    if condition == "control_inert":
        seeds = verdict["conditions"]["control_inert"]["seeds"]
        assert [s["held"] for s in seeds] == [True, False]


def test_verdict_without_control_is_not_tested_on_it() -> None:
    verdict = cl.chain_verdict(_synthetic(control_seeds=0))
    inert = verdict["conditions"]["control_inert"]
    assert inert["held"] is None and "control_seeds = 0" in inert["reason"]
    assert verdict["supported"] is False and "control_inert not tested" in verdict["reason"]
    assert verdict["conditions"]["monotone"]["held"] and verdict["conditions"]["predicts"]["held"]


def test_verdict_ties_are_not_monotone_evidence() -> None:
    heads = _synthetic()
    flat = heads["target"].eq("massive") & heads["arm"].eq("dose")
    heads.loc[flat, "sink_mass"] = 0.5  # the clamp does nothing: non-decreasing, but no head's ρ is defined
    mono = cl.chain_verdict(heads)["conditions"]["monotone"]
    assert mono["nondecreasing"] and mono["n_heads"] == 0 and mono["held"] is False


# ----------------------------------------------------------------------------- checks
def test_check_refuses_sizes_naming_the_flags() -> None:
    clamp_stage.check(RunConfig(model="random:llama", chunks=4, clamp_chunks=8))  # above chunks: every chunk
    stub = SimpleNamespace(seq_len=1, chunks=4, options=lambda stage: ClampOptions())
    with pytest.raises(InputError, match="--seq-len 1"):
        clamp_stage.check(stub)
    clamp_stage.check(RunConfig(model="random:llama", chunks=4, clamp_chunks=4))
    with pytest.raises(InputError, match="--clamp-alphas"):
        RunConfig(model="random:llama", clamp_alphas=(0.0, 1.5))


def test_one_forward_pass_gives_the_adapter_captures() -> None:
    """The stage's single pass (logits and attention inputs together) equals the adapter's
    two captures, clamps active."""
    loaded = wrap_model(build_random("llama", {"num_hidden_layers": 3}, seed=0), name="small")
    ad, ids = loaded.adapter, torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), ad.clamp(3, 7.0, 0, from_layer=1):
        logits, probs = clamp_stage._logits_and_probs(ad, ids, [1, 2])
        got = dict(probs)
        assert torch.equal(logits, ad.logits(ids))
        assert all(torch.equal(got[layer], p) for layer, p in ad.attention_probs(ids, layers=[1, 2]))


def test_aggregate_heads_medians_and_failures() -> None:
    sinks = pd.DataFrame({"layer": [2] * 6, "head": [0, 1] * 3, "chunk": [0, 0, 1, 1, 2, 2],
                          "sink_mass": [0.1, 0.5, 0.2, 0.6, 0.9, 0.7]})
    reserves = pd.DataFrame({"layer": [2] * 6, "head": [0, 1] * 3, "chunk": [0, 0, 1, 1, 2, 2],
                             "TR1": [1.0, 2.0, 3.0, np.nan, 2.0, 4.0], "null_TR1": [0.5] * 6,
                             "failure": [None, None, None, "no driver converged", None, None]})
    out = cl.aggregate_heads(sinks, reserves)
    assert out["sink_mass"].tolist() == [0.2, 0.6]
    assert out.loc[0, "TR1"] == 2.0 and out.loc[0, "delta_TR1"] == 1.5 and out.loc[0, "failure"] is None
    assert math.isnan(out.loc[1, "TR1"]) and out.loc[1, "failure"] == "no driver converged"
    bare = cl.aggregate_heads(sinks, None)
    assert bare["TR1"].isna().all() and bare["failure"].isna().all()
