"""The clamp stage (METHODS A7): detection of planted massive activations, the clamp that
undoes them, each dimension alone and left out, the chain verdict on synthetic tables, and the
chain not tested without a control or without massive activations."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from depthlens import workflow
from depthlens.attention.patterns import sink_mass
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.errors import InputError
from depthlens.interventions import clamp as cl
from depthlens.interventions import clamp_verdict as cv
from depthlens.stages import clamp as clamp_stage
from depthlens.interventions.options import ClampOptions
from depthlens.models import build_random
from depthlens.models.in_memory import wrap_model
from depthlens.report.claims import evaluate, load_claims
from depthlens.runs import RunMode
from depthlens.schema import SCHEMA

N_LAYERS, CHUNKS, SEQ_LEN, CLAMP_CHUNKS = 4, 4, 16, 2
#: Planted massive activations: dim → (value added at position 0, layer whose input gets it).
PLANTED = {5: (1.0e4, 1), 9: (-8.0e3, 2)}
#: The dim forced in the single-dim run, and the first forced layer (the clamp's from_layer).
DIM, FORCED_LAYER = 5, min(layer for _, layer in PLANTED.values())


# ----------------------------------------------------------------------------- planted model
def _dim_free_model():
    """A tiny random llama whose residual dimensions PLANTED are exactly 0 everywhere: no
    embedding, output projection or down projection writes into them."""
    model = build_random("llama", {"num_hidden_layers": N_LAYERS}, seed=0)
    dims = list(PLANTED)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, dims] = 0.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[dims, :] = 0.0
            layer.mlp.down_proj.weight[dims, :] = 0.0
    return model


def _force(model, planted: dict[int, tuple[float, int]]) -> list[torch.utils.hooks.RemovableHandle]:
    """Add each planted value to h[:, 0, dim] at the input of its layer (a massive activation from there on)."""
    def make(dim: int, value: float):
        def hook(module, args, kwargs):
            h = (args[0] if args else kwargs["hidden_states"]).clone()
            h[:, 0, dim] += value
            if args:
                return (h, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": h}

        return hook

    return [model.model.layers[layer].register_forward_pre_hook(make(dim, value), with_kwargs=True)
            for dim, (value, layer) in planted.items()]


def _run(loaded, text: Path, out: Path, run_mode: RunMode = RunMode.NEW, **options) -> Path:
    config = RunConfig(model="random:llama", text=str(text), chunks=CHUNKS, seq_len=SEQ_LEN, batch_size=2,
                       clamp_chunks=CLAMP_CHUNKS, clamp_null_samples=1, **options)
    return workflow.run(config, out, run_mode, stages=("clamp",), execution=Execution(quiet=True, jobs=1),
                        loaded=loaded)


def _tables(root: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_parquet(root / "tables" / f"{name}.parquet")
            for name in ("massive", "clamp", "clamp_heads", "clamp_dims")}


def _chain(root: Path) -> dict:
    return json.loads((root / "interventions.json").read_text())["clamp_chain"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory, text_file: Path):
    """The stage on the model with both dims forced, resumed after deleting some units, and
    the unforced model's sink masses on the clamp chunks."""
    model = _dim_free_model()
    loaded = wrap_model(model, name="planted")
    ids = workflow.prepare(RunConfig(model="random:llama", text=str(text_file), chunks=CHUNKS, seq_len=SEQ_LEN),
                           loaded).token_ids[:CLAMP_CHUNKS]
    with torch.inference_mode():
        clean = {layer: sink_mass(p.numpy()) for layer, p in loaded.adapter.attention_probs(ids)}
    handles = _force(model, PLANTED)
    try:
        root = _run(loaded, text_file, tmp_path_factory.mktemp("planted") / "run", control_seeds=1)
        with torch.inference_mode():
            forced = {layer: sink_mass(p.numpy()) for layer, p in loaded.adapter.attention_probs(ids)}
        first = {**_tables(root), "interventions": (root / "interventions.json").read_text()}
        for key in ("massive00001", "arm_massive_-1_dose_0.5", "arm_control_0_mean_nan", "arm_alone_9_dose_0"):
            (root / "units" / "clamp" / f"{key}.done").unlink()
        _run(loaded, text_file, root, control_seeds=1, run_mode=RunMode.RESUME)
    finally:
        for handle in handles:
            handle.remove()
    return root, clean, forced, first


@pytest.fixture(scope="module")
def single_without_control(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """The stage on the model with only DIM forced and ``--control-seeds 0``."""
    model = _dim_free_model()
    handles = _force(model, {DIM: PLANTED[DIM]})
    try:
        return _run(wrap_model(model, name="single"), text_file, tmp_path_factory.mktemp("single") / "run",
                    control_seeds=0)
    finally:
        for handle in handles:
            handle.remove()


def test_resumed_run_equals_the_first(planted) -> None:
    root, _, _, first = planted
    for name, table in _tables(root).items():
        pd.testing.assert_frame_equal(table, first[name])
    assert (root / "interventions.json").read_text() == first["interventions"]


def test_planted_massive_activations_are_detected_exactly(planted) -> None:
    root, _, _, _ = planted
    massive = pd.read_parquet(root / "tables" / "massive.parquet")
    got = set(massive[["chunk", "layer", "boundary", "position", "dim"]].itertuples(index=False, name=None))
    expected = set()
    for dim, (_, start) in PLANTED.items():
        boundaries = [(layer, kind) for layer in range(start, N_LAYERS) for kind in ("pre_attn", "pre_mlp")]
        boundaries.append((N_LAYERS, "final"))
        expected |= {(c, layer, kind, 0, dim) for c in range(CHUNKS) for layer, kind in boundaries}
    assert got == expected
    assert all(np.all(massive.loc[massive["dim"] == d, "value"] == v) for d, (v, _) in PLANTED.items())
    assert np.all(massive["ratio"] >= 1000.0)
    chain = _chain(root)
    assert chain["tested"] is True and chain["all_dims"] == sorted(PLANTED) and chain["from_layer"] == FORCED_LAYER
    assert chain["emergence_layers"] == [PLANTED[d][1] for d in sorted(PLANTED)]
    assert chain["n_chunks"] == CLAMP_CHUNKS and chain["detection_chunks"] == CHUNKS
    assert set(chain["conditions"]) == {"monotone", "predicts", "control_inert"}
    assert chain["conditions"]["predicts"]["n_perm"] == cv.N_PERM
    assert [r["dim"] for r in chain["per_dim"]] == sorted(PLANTED)
    carried = [r["dim"] for r in chain["per_dim"] if r["carries"]]
    assert chain["dims"] == (carried if chain["supported"] else [])
    assert len(chain["control_dims"]) == 1 and not set(chain["control_dims"][0]) & set(PLANTED)


def test_clamp_to_the_mean_restores_the_unforced_sink_mass(planted) -> None:
    root, clean, forced, _ = planted
    heads = pd.read_parquet(root / "tables" / "clamp_heads.parquet")
    massive = heads[heads["target"] == "massive"]
    assert sorted(massive["layer"].unique()) == list(range(FORCED_LAYER, N_LAYERS))  # layers below are left out
    expected = {(layer, h): float(np.median(clean[layer][:, h])) for layer in clean for h in range(clean[layer].shape[1])}
    before = {(layer, h): float(np.median(forced[layer][:, h])) for layer in forced for h in range(forced[layer].shape[1])}
    for arm, alpha in (("mean", None), ("dose", 0.0)):  # the dims are 0 in the unforced model: both arms undo the force
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


def test_each_dim_alone_and_left_out(planted) -> None:
    """With two dims, 5 alone is the same clamp as 9 left out (and the other way round): two
    units run separately give the same rows exactly; each moves the sink mass of the heads
    from its own emergence layer on only."""
    root, _, _, _ = planted
    dims = pd.read_parquet(root / "tables" / "clamp_dims.parquet")
    assert list(dims.columns) == list(SCHEMA["clamp_dims"].columns)
    measures = ["layer", "head", "sink_mass", "TR1", "delta_TR1"]
    for d, other in ((5, 9), (9, 5)):
        alone = dims[(dims["target"] == "alone") & (dims["dim"] == d)][measures].reset_index(drop=True)
        left_out = dims[(dims["target"] == "left_out") & (dims["dim"] == other)][measures].reset_index(drop=True)
        assert len(alone) == (N_LAYERS - FORCED_LAYER) * 4
        pd.testing.assert_frame_equal(alone, left_out)
    heads = pd.read_parquet(root / "tables" / "clamp_heads.parquet")
    ref = heads[(heads["target"] == "massive") & (heads["arm"] == "dose") & (heads["alpha"] == 1.0)]
    alone9 = dims[(dims["target"] == "alone") & (dims["dim"] == 9)]
    below = alone9["layer"] < PLANTED[9][1]  # dim 9 is clamped from layer 2: layer 1 is unchanged exactly
    ref_below = (ref["layer"] < PLANTED[9][1]).to_numpy()
    assert np.array_equal(alone9.loc[below, "sink_mass"].to_numpy(), ref.loc[ref_below, "sink_mass"].to_numpy())
    assert not np.array_equal(alone9.loc[~below, "sink_mass"].to_numpy(), ref.loc[~ref_below, "sink_mass"].to_numpy())
    per_dim = {r["dim"]: r for r in _chain(root)["per_dim"]}
    assert all(math.isfinite(per_dim[d][arm]["delta_ce"]) for d in PLANTED for arm in ("alone", "left_out"))


def test_planted_tables_follow_the_schema(planted) -> None:
    root, _, _, _ = planted
    summary = pd.read_parquet(root / "tables" / "clamp.parquet")
    assert list(summary.columns) == list(SCHEMA["clamp"].columns)
    # massive: doses 0, .25, .5, .75, 1 and mean; control seed 0 the same
    assert len(summary) == 12 and set(summary["target"]) == {"massive", "control"}
    ref = summary[(summary["arm"] == "dose") & (summary["alpha"] == 1.0)]
    assert (ref["delta_ce"] == 0.0).all() and (summary["from_layer"] == FORCED_LAYER).all()
    assert summary.loc[summary["target"] == "massive", "dims"].eq("5,9").all()
    assert (summary["n_heads"] == (N_LAYERS - FORCED_LAYER) * 4).all() and (summary["n_chunks"] == CLAMP_CHUNKS).all()
    zero = summary[(summary["target"] == "massive") & (summary["alpha"] == 0.0)]
    assert float(zero["delta_ce"].iloc[0]) != 0.0


def test_without_control_the_chain_is_not_tested(single_without_control: Path) -> None:
    """--control-seeds 0: not tested (not falsified), the reason names the option; the single
    dim's alone and left-out rows are the massive zero arm and the unclamped model exactly."""
    root = single_without_control
    chain = _chain(root)
    assert chain["tested"] is False and chain["supported"] is None and chain["dims"] == []
    assert "--control-seeds 0" in chain["reason"] and "\n" not in chain["reason"]
    assert chain["conditions"]["control_inert"]["held"] is None and chain["all_dims"] == [DIM]
    claim = next(r for r in evaluate(load_claims(), root) if r["id"] == "A7-clamp-chain")
    assert claim["verdict"] == "not tested" and "--control-seeds" in claim["reason"]
    assert chain["needs"] == claim["needs"] == "--control-seeds 1 or more"
    tables = _tables(root)
    assert set(tables["clamp"]["target"]) == {"massive"} and (tables["clamp"]["dims"] == str(DIM)).all()
    heads, dims = tables["clamp_heads"], tables["clamp_dims"]
    measures = ["layer", "head", "sink_mass", "TR1", "delta_TR1", "failure"]
    for target, alpha in (("alone", 0.0), ("left_out", 1.0)):
        rows = heads[(heads["arm"] == "dose") & (heads["alpha"] == alpha)][measures].reset_index(drop=True)
        copy = dims[(dims["target"] == target) & (dims["dim"] == DIM)][measures].reset_index(drop=True)
        pd.testing.assert_frame_equal(copy, rows)
    assert not any(p.name.startswith(("arm_alone", "arm_left_out")) for p in (root / "units" / "clamp").iterdir())


def test_no_massive_activation_is_not_tested(tmp_path: Path, text_file: Path) -> None:
    loaded = wrap_model(build_random("llama", seed=0), name="plain")
    root = _run(loaded, text_file, tmp_path / "run")
    chain = _chain(root)
    assert chain["tested"] is False and "massive" in chain["reason"] and "\n" not in chain["reason"]
    claim = next(r for r in evaluate(load_claims(), root) if r["id"] == "A7-clamp-chain")
    assert chain["needs"] == claim["needs"] == "a model with massive activations"
    for name in ("clamp", "clamp_heads", "clamp_dims"):
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
    ordinary = cl.ordinary_dims(massive, 14)
    assert list(ordinary) == [0, 1, 2, 3, 4, 5, 6, 8, 10, 13]
    dims, signs = cl.control_dims(ordinary, 3, seed=0, s=1)
    assert len(set(dims)) == 3 and not set(dims) & {7, 9, 11, 12} and set(signs) <= {-1.0, 1.0}
    assert (dims, signs) == cl.control_dims(ordinary, 3, seed=0, s=1) != cl.control_dims(ordinary, 3, seed=0, s=2)


def test_clamp_targets_pair_dims_and_name_the_missing_control() -> None:
    plan = cl.ClampPlan(dims=(3, 8), emergence=(1, 2), from_layer=1, n_chunks=4)
    ordinary = np.array([0, 1, 2, 4, 5, 6])
    targets, reason = cl.clamp_targets(plan, ordinary, control_seeds=2, seed=0)
    assert reason is None and [t.label for t in targets] == ["massive_-1", "alone_3", "left_out_3", "alone_8",
                                                             "left_out_8", "control_0", "control_1"]
    assert targets[2] == cl.Target("left_out", -1, 3, (8,), (2,))
    control = targets[5]
    assert control.matched == plan.dims and control.emergence == plan.emergence
    assert (control.dims, control.signs) == cl.control_dims(ordinary, 2, 0, 0)
    targets, reason = cl.clamp_targets(plan, ordinary, control_seeds=0, seed=0)
    assert "--control-seeds 0" in reason and all(t.name != "control" for t in targets)
    assert "ordinary" in cl.clamp_targets(plan, ordinary[:1], control_seeds=1, seed=0)[1]


def test_control_curves_first_runs_the_later_seeds_zero_arm_alone() -> None:
    """``--control-curves first`` (the default): the first control seed gets every dose and
    the mean arm, the later seeds their zero arm (what the verdict reads) beside the shared
    unclamped model; ``every`` gives each seed the first one's arms."""
    plan = cl.ClampPlan(dims=(3, 8), emergence=(1, 2), from_layer=1, n_chunks=4)
    targets, _ = cl.clamp_targets(plan, np.array([0, 1, 2, 4, 5, 6]), control_seeds=3, seed=0)

    def runs(curves: str) -> dict[int, list[str]]:
        units = clamp_stage._units(targets, (0.5,), curves)
        return {s: [u.key for u in units if u.target.name == "control" and u.target.seed == s and u.source is None]
                for s in range(3)}

    every, first = runs("every"), runs("first")
    assert every[0] == ["arm_control_0_dose_0", "arm_control_0_dose_0.5", "arm_control_0_mean_nan"]
    assert first[0] == every[0] and every[1] == [k.replace("_0_", "_1_") for k in every[0]]
    assert first[1] == ["arm_control_1_dose_0"] and first[2] == ["arm_control_2_dose_0"]
    later = [u for u in clamp_stage._units(targets, (0.5,), "first") if u.target.name == "control" and u.target.seed]
    assert [(u.arm, u.alpha, u.source) for u in later if u.target.seed == 1] == [
        ("dose", 0.0, None), ("dose", 1.0, "arm_massive_-1_dose_1")]
    assert ClampOptions().control_curves == "first" and RunConfig(preset="paper").control_curves == "every"


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
    three = np.arange(7 * 2 * 3 * 4, dtype=np.float64).reshape(7, 2, 3, 4)  # L = 2, three boundaries a layer (Gemma 4)
    first, sums, count = cl.layer_inputs_summary(three, per_layer=3)
    assert [np.array_equal(first[i], three[3 * i, :, 0, :]) for i in range(3)] == [True] * 3
    assert count == 4 and np.allclose(sums, three[[0, 3, 6], :, 1:, :].sum(axis=(1, 2)))


@pytest.mark.parametrize("alpha", [0.0, 0.5, None])
def test_control_moves_the_residual_by_the_massive_norm(alpha: float | None) -> None:
    """Layer by layer and chunk by chunk, the control's change of the position-0 residual
    has the Euclidean norm of the massive clamp's (dose α or mean arm)."""
    rng = np.random.default_rng(0)
    first = rng.normal(0.0, 1.0, (4, 3, 6))  # L = 3, 3 chunks, d = 6
    first[:, :, 1] += 2.5e4
    first[:, :, 4] -= 1.1e4
    means = rng.normal(0.0, 1.0, (4, 6))
    massive, control, signs = (1, 4), (0, 5), (1.0, -1.0)
    change_m, change_c = np.zeros((4, 3, 2)), np.zeros((4, 3, 2))
    for i, (m, c, sign) in enumerate(zip(massive, control, signs)):
        values = cl.dose_values(first, m, alpha, 1) if alpha is not None else cl.mean_values(means, m, 1)
        moved = cl.control_values(first, values, m, c, sign)
        assert sorted(moved) == [1, 2, 3]
        for layer in moved:
            change_m[layer, :, i] = np.ravel(values[layer]) - first[layer, :, m]
            change_c[layer, :, i] = moved[layer].ravel() - first[layer, :, c]
        assert np.all(np.sign(change_c[1:, :, i]) == sign)
    norm_m, norm_c = np.linalg.norm(change_m, axis=2), np.linalg.norm(change_c, axis=2)
    assert np.all(norm_m[1:] > 1e3) and np.allclose(norm_c, norm_m, rtol=1e-12, atol=0)


def test_the_control_moves_the_first_token_as_far_as_the_massive_clamp() -> None:
    """In the model's forward pass, at every clamped layer input and chunk, the control's zero
    arm changes the first token's residual (on its dims) by the Euclidean norm by which the
    massive zero arm changes it (on the massive dims active at that layer), to float32 rounding."""
    model = _dim_free_model()
    _force(model, PLANTED)
    adapter = wrap_model(model, name="planted").adapter
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    plan = cl.ClampPlan(dims=(5, 9), emergence=(1, 2), from_layer=1, n_chunks=2)
    targets, _ = cl.clamp_targets(plan, np.array([0, 1, 2, 3, 4, 6, 7, 8]), control_seeds=1, seed=0)
    with torch.inference_mode():
        clean = clamp_stage._clean_inputs(adapter, ids, 2, plan.from_layer)
        states = {"clean": adapter.residual_states(ids).double().numpy()}
        for target in (targets[0], targets[-1]):
            with clamp_stage._clamped(adapter, clamp_stage._Unit(target, "dose", 0.0), clean, slice(0, 2)):
                states[target.name] = adapter.residual_states(ids).double().numpy()
    control = targets[-1]
    for layer in range(1, N_LAYERS + 1):
        active = [i for i, e in enumerate(plan.emergence) if e <= layer]
        norms = [np.linalg.norm(states[t.name][2 * layer, :, 0][:, [t.dims[i] for i in active]]
                                - states["clean"][2 * layer, :, 0][:, [t.dims[i] for i in active]], axis=1)
                 for t in (targets[0], control)]
        assert np.all(norms[0] > 1e3) and np.allclose(norms[1], norms[0], rtol=1e-6, atol=0)


class _RecordingPool:
    """A pool that keeps what the stage submits (the attention matrices) and runs nothing."""

    def __init__(self) -> None:
        self.matrices: list[np.ndarray] = []

    def submit(self, fn, matrix: np.ndarray, *args):
        self.matrices.append(matrix)
        return SimpleNamespace(done=lambda: True)


def test_arms_start_at_the_first_clamped_layer_bit_for_bit() -> None:
    """Each arm's passes begin at the first clamped layer with its clean input and give what
    the whole forward pass gives, bit for bit: sink masses, cross-entropy and every attention
    matrix the heads' reserves get, on the forced model under every kind of arm."""
    model = _dim_free_model()
    handles = _force(model, PLANTED)
    adapter = wrap_model(model, name="planted").adapter
    ids = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(0))
    plan = cl.ClampPlan(dims=(5, 9), emergence=(1, 2), from_layer=1, n_chunks=3)
    targets, _ = cl.clamp_targets(plan, np.array([0, 1, 2, 3, 4, 6, 7, 8]), control_seeds=1, seed=0)
    opts = ClampOptions(clamp_null_samples=1)
    try:
        with torch.inference_mode():
            clean = clamp_stage._clean_inputs(adapter, ids, 2, plan.from_layer)
            whole = clamp_stage._Clean(clean.first, clean.means, clean.from_layer, None)
            for unit in clamp_stage._units(targets, (0.0, 0.5, 1.0), "every"):
                pools = (_RecordingPool(), _RecordingPool())
                got = [clamp_stage._measure(adapter, pool, unit, c, ids, plan.from_layer, 2, opts)
                       for pool, c in zip(pools, (clean, whole))]
                pd.testing.assert_frame_equal(got[0].sinks, got[1].sinks, check_exact=True)
                assert got[0].ce_sum == got[1].ce_sum and got[0].n_tokens == got[1].n_tokens
                assert len(pools[0].matrices) == len(pools[1].matrices) == (3 * (N_LAYERS - 1) * adapter.n_heads if unit.reserve else 0)
                assert all(np.array_equal(a, b) for a, b in zip(*(pool.matrices for pool in pools)))
        assert len(clean.starts) == 2 and clean.starts[0].dtype == torch.float32
    finally:
        for handle in handles:
            handle.remove()


def _synthetic(n_heads: int = 24, control_seeds: int = 2, *, bend: bool = False, shuffle_rise: bool = False,
               control_moves: bool = False, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """clamp_heads and clamp_dims tables (massive dims 7 and 9) in which the chain holds, unless
    one premise is broken; dim 7 alone does what all do, dim 9 alone does nothing."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.3, 0.9, n_heads)
    gain = rng.uniform(0.5, 1.5, n_heads)
    tr_ref = rng.normal(0.0, 0.1, n_heads)
    rows, dim_rows = [], []

    def add(target, s, arm, alpha, sink, dtr):
        for h in range(n_heads):
            rows.append({"layer": 1 + h // 4, "head": h % 4, "target": target, "seed": s, "arm": arm, "alpha": alpha,
                         "sink_mass": sink[h], "TR1": np.nan if np.isnan(dtr[h]) else 1.0 + dtr[h],
                         "delta_TR1": dtr[h], "failure": None})

    def add_dim(target, dim, sink, dtr):
        for h in range(n_heads):
            dim_rows.append({"layer": 1 + h // 4, "head": h % 4, "target": target, "dim": dim, "sink_mass": sink[h],
                             "TR1": 1.0 + dtr[h], "delta_TR1": dtr[h], "failure": None})

    nan = np.full(n_heads, np.nan)
    for a in (0.0, 0.25, 0.5, 0.75, 1.0):
        shape = a if not bend else {0.0: 0.0, 0.25: 0.6, 0.5: 0.2, 0.75: 0.4, 1.0: 1.0}[a]
        sink = base * (0.2 + 0.8 * shape)
        drop = base - sink
        rise = gain * drop if not shuffle_rise else rng.permutation(gain * drop)
        add("massive", -1, "dose", a, sink, tr_ref + rise if a in (0.0, 1.0) else nan)
        if a == 0.0:
            add_dim("alone", 7, sink, tr_ref + rise)
            add_dim("left_out", 9, sink, tr_ref + rise)
    add_dim("alone", 9, base, tr_ref)
    add_dim("left_out", 7, base, tr_ref)
    sink_mean = base * 0.3
    add("massive", -1, "mean", np.nan, sink_mean, tr_ref + gain * (base - sink_mean))
    for s in range(control_seeds):
        for a in (0.0, 0.25, 0.5, 0.75, 1.0):
            wobble = rng.normal(0.0, 1e-4, n_heads) if a != 1.0 else 0.0
            sink = base + wobble if not (control_moves and s == 1) else base * (0.2 + 0.8 * a)
            dtr = tr_ref + (rng.normal(0.0, 1e-4, n_heads) if a != 1.0 else 0.0)
            add("control", s, "dose", a, sink, dtr if a in (0.0, 1.0) else nan)
        add("control", s, "mean", np.nan, base, tr_ref)
    return pd.DataFrame(rows, columns=cl.HEAD_COLUMNS), pd.DataFrame(dim_rows, columns=cl.DIM_COLUMNS)


def _verdict(tables: tuple[pd.DataFrame, pd.DataFrame], control_reason: str | None = None) -> dict:
    return cv.chain_verdict(*tables, dims=(7, 9), seed=0, control_reason=control_reason)


def test_verdict_supported_on_a_clean_chain() -> None:
    verdict = _verdict(_synthetic())
    c = verdict["conditions"]
    assert verdict["tested"] is True and verdict["supported"] is True and verdict["reason"] is None
    assert c["monotone"]["nondecreasing"] and c["monotone"]["frac_positive"] == 1.0 and c["monotone"]["p"] < 1e-6
    assert c["predicts"]["rho"] > 0.5 and c["predicts"]["p"] == 1 / (cv.N_PERM + 1)
    assert c["predicts"]["n_heads"] == 24 and c["predicts"]["n_layers"] == 6
    assert c["control_inert"]["held"] and all(s["sink_mass_ratio"] < 0.01 for s in c["control_inert"]["seeds"])
    per_dim = {r["dim"]: r for r in verdict["per_dim"]}
    assert per_dim[7]["alone_carries"] and per_dim[7]["left_out_breaks"] and per_dim[7]["carries"]
    assert per_dim[9]["alone"]["monotone"]["held"] is False and per_dim[9]["left_out"]["predicts"]["held"] is True
    assert not per_dim[9]["carries"] and verdict["dims"] == [7] and verdict["all_dims"] == [7, 9]
    json.dumps(cv.json_safe(verdict), allow_nan=False)


@pytest.mark.parametrize("broken, condition", [({"bend": True}, "monotone"), ({"shuffle_rise": True}, "predicts"),
                                               ({"control_moves": True}, "control_inert")])
def test_verdict_each_condition_flips_when_its_premise_breaks(broken: dict, condition: str) -> None:
    verdict = _verdict(_synthetic(**broken))
    held = {name: c["held"] for name, c in verdict["conditions"].items()}
    assert held == {name: name != condition for name in held}
    assert verdict["tested"] is True and verdict["supported"] is False and condition in verdict["reason"]
    assert verdict["dims"] == []
    if condition == "predicts":
        assert verdict["conditions"]["predicts"]["p"] > 0.05
    if condition == "control_inert":
        seeds = verdict["conditions"]["control_inert"]["seeds"]
        assert [s["held"] for s in seeds] == [True, False]


def test_verdict_without_control_is_not_tested() -> None:
    _, reason = cl.clamp_targets(cl.ClampPlan((7, 9), (1, 1), 1, 4), np.arange(20, 30), control_seeds=0, seed=0)
    verdict = _verdict(_synthetic(control_seeds=0), reason)
    assert verdict["conditions"]["control_inert"]["held"] is None
    assert verdict["tested"] is False and verdict["supported"] is None and verdict["dims"] == []
    assert verdict["reason"] == f"control_inert not tested: {reason}" and "--control-seeds" in verdict["reason"]
    assert verdict["conditions"]["monotone"]["held"] and verdict["conditions"]["predicts"]["held"]


def test_verdict_with_too_few_heads_is_not_tested() -> None:
    """Three heads in one layer: the sign test cannot reach p < 0.05 (2 · 2⁻³) nor the
    permutation test p ≤ 0.05 (3! = 6 orders)."""
    verdict = _verdict(_synthetic(n_heads=3))
    assert verdict["tested"] is False and verdict["supported"] is None
    assert "monotone not tested" in verdict["reason"] and "predicts not tested" in verdict["reason"]
    assert verdict["conditions"]["control_inert"]["held"] is True


def test_verdict_ties_are_not_monotone_evidence() -> None:
    heads, dims = _synthetic()
    flat = heads["target"].eq("massive") & heads["arm"].eq("dose")
    heads.loc[flat, "sink_mass"] = 0.5  # the clamp does nothing: non-decreasing, but no head's ρ is defined
    mono = _verdict((heads, dims))["conditions"]["monotone"]
    assert mono["nondecreasing"] and mono["n_heads"] == 0 and mono["held"] is False


def test_rank_rhos_are_spearman_per_row_with_exact_signs() -> None:
    """Each row's ρ is scipy's Spearman; ties give an exact 0 and a constant row NaN, so the
    sign test of ``monotone`` drops them."""
    rng = np.random.default_rng(5)
    alphas = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    rows = np.vstack([rng.normal(size=(20, 5)), rng.integers(0, 3, size=(20, 5)).astype(float),
                      [[1.0, 2.0, 3.0, 2.0, 1.0], [0.5] * 5]])
    got = cv._rank_rhos(alphas, rows)
    want = [spearmanr(alphas, row)[0] if np.ptp(row) > 0 else np.nan for row in rows]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert got[-2] == 0.0 and np.isnan(got[-1])


def test_permutation_test_respects_layers() -> None:
    """Drop and rise that share only a per-layer offset: across heads Spearman ρ is large (a
    heads-independent test would call it significant), within layers they are independent."""
    rng = np.random.default_rng(1)
    index = pd.MultiIndex.from_product([range(6), range(8)], names=["layer", "head"])
    offset = np.repeat(np.arange(6.0), 8)
    drop = pd.Series(offset + rng.normal(0.0, 0.3, 48), index=index)
    rise = pd.Series(offset + rng.normal(0.0, 0.3, 48), index=index)
    test = cv.permutation_spearman(drop, rise, seed=0)
    assert test["rho"] > 0.8 and test["p"] > 0.05 and test["testable"]
    assert test == cv.permutation_spearman(drop, rise, seed=0)
    within = cv.permutation_spearman(drop, drop + rng.normal(0.0, 0.01, 48), seed=0)
    assert within["p"] == 1 / (cv.N_PERM + 1)
    assert not cv.permutation_spearman(drop.iloc[:3], rise.iloc[:3], seed=0)["testable"]  # 3! < 20


# ----------------------------------------------------------------------------- checks
def test_check_refuses_sizes_naming_the_flags() -> None:
    clamp_stage.check(RunConfig(model="random:llama", chunks=4, clamp_chunks=8))  # above chunks: every chunk
    stub = SimpleNamespace(seq_len=1, chunks=4, options=lambda stage: ClampOptions())
    with pytest.raises(InputError, match="--seq-len 1"):
        clamp_stage.check(stub)
    clamp_stage.check(RunConfig(model="random:llama", chunks=4, clamp_chunks=4))
    with pytest.raises(InputError, match="--clamp-alphas"):
        RunConfig(model="random:llama", clamp_alphas=(0.0, 1.5))


@pytest.mark.parametrize(("family", "layers"), [("llama", [1, 2]), ("gemma4", [1, 4, 5])])
def test_one_forward_pass_gives_the_adapter_captures(family, layers) -> None:
    """The stage's single pass (logits and attention inputs together) equals the adapter's
    two captures, clamps active (on Gemma 4, layers 4 and 5 read layers 2 and 3's keys)."""
    loaded = wrap_model(build_random(family, {"num_hidden_layers": 3} if family == "llama" else None, seed=0),
                        name="small")
    ad, ids = loaded.adapter, torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), ad.clamp(3, 7.0, 0, from_layer=1):
        logits, probs = ad.logits_and_attention_probs(ids, layers)
        got = dict(probs)
        assert sorted(got) == layers
        assert torch.equal(logits, ad.logits(ids))
        assert all(torch.equal(got[layer], p) for layer, p in ad.attention_probs(ids, layers=layers))


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


def test_planted_massive_activation_on_gemma4(tmp_path: Path, text_file: Path) -> None:
    """Gemma 4 (three boundaries a layer, layer scalars, shared keys): a dim forced at layer
    1's input is detected at every boundary from there on, the final one included, and
    clamping it to its mean (0 in the unforced model) gives every later layer, shared-key
    layers included, the unforced sink masses."""
    model = build_random("gemma4", seed=0)
    with torch.no_grad():  # nothing but the force writes into DIM
        model.model.embed_tokens.weight[:, DIM] = 0.0
        for layer in model.model.layers:
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj, layer.per_layer_projection):
                proj.weight[DIM, :] = 0.0
    loaded, n_layers = wrap_model(model, name="planted-gemma4"), len(model.model.layers)
    ids = workflow.prepare(RunConfig(model="random:gemma4", text=str(text_file), chunks=CHUNKS, seq_len=SEQ_LEN),
                           loaded).token_ids[:CLAMP_CHUNKS]
    with torch.inference_mode():
        clean = {layer: sink_mass(p.numpy()) for layer, p in loaded.adapter.attention_probs(ids)}
    handles = _force(model, {DIM: (1.0e4, 1)})
    try:
        root = _run(loaded, text_file, tmp_path / "run", control_seeds=1)
    finally:
        for handle in handles:
            handle.remove()
    massive = pd.read_parquet(root / "tables" / "massive.parquet")
    got = set(massive[["chunk", "layer", "boundary", "position", "dim"]].itertuples(index=False, name=None))
    kinds = ("pre_attn", "pre_mlp", "pre_ple")
    assert got == {(c, layer, kind, 0, DIM) for c in range(CHUNKS)
                   for layer, kind in [*((l, k) for l in range(1, n_layers) for k in kinds), (n_layers, "final")]}
    assert _chain(root)["emergence_layers"] == [1]
    heads = pd.read_parquet(root / "tables" / "clamp_heads.parquet")
    rows = heads[(heads["target"] == "massive") & (heads["arm"] == "mean")]
    assert sorted(rows["layer"].unique()) == list(range(1, n_layers))
    for r in rows.itertuples():
        assert abs(r.sink_mass - float(np.median(clean[r.layer][:, r.head]))) < 1e-12
