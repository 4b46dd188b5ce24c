"""B2's premise on a model whose every sub-layer operator is already rank-collapsed: one
residual coordinate that every sub-layer writes to with a gain of 10⁴ (as a massive coordinate
amplified by post-norm gains does), so the funnel's first step has an erank near 1 of d = 64.
The claim then says so beside its ratio, naming that coordinate; an ordinary random model's
claim carries no such note, and the eranks as fractions of d are reported for both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.models import load_model, wrap_model
from depthlens.report.claims import evaluate, load_claims, write_claims_json
from depthlens.report.verdict_text import verdict_lines
from depthlens.report.statistics.residual import top_coordinate
from depthlens.runs.atomic import map_safetensors
from depthlens.workflow import run

MASSIVE = 5


def _run(tmp_path: Path, collapsed: bool) -> Path:
    model = load_model("random:llama:num_hidden_layers=2").model
    if collapsed:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight[MASSIVE] *= 1e4
                layer.mlp.down_proj.weight[MASSIVE] *= 1e4
    config = RunConfig(model="planted", chunks=6, seq_len=16, jacobian_mode="isolated", funnel_rank=0,
                       funnel_alphas=(1.0,), funnel_boot=0, null="none")
    return run(config, tmp_path / ("collapsed" if collapsed else "plain"), stages=("jacobian",),
               execution=Execution(quiet=True, jobs=1), loaded=wrap_model(model, name="planted"))


@pytest.mark.parametrize("collapsed", [True, False])
def test_b2_says_when_every_operator_is_already_rank_collapsed(tmp_path: Path, collapsed: bool) -> None:
    out = _run(tmp_path, collapsed)
    b2, b3 = (next(r for r in evaluate(load_claims(), out, calibrate=False) if r["id"] == cid)
              for cid in ("B2-funnel-trained", "B3-funnel-learned"))
    saved = map_safetensors(out / "arrays" / "jacobians_trained_isolated.safetensors")
    first = saved["1.mlp"]  # the backward funnel's first step: the last sub-layer's mean Jacobian
    s = np.linalg.svd(first, compute_uv=False)
    p = s**2 / np.sum(s**2)
    one_step = float(np.exp(-np.sum(p * np.log(p))))
    assert b2["descriptive"]["funnel_one_step_fraction"] == pytest.approx(one_step / 64, rel=1e-9)
    assert b3["descriptive"]["funnel_one_step_fraction"] == b2["descriptive"]["funnel_one_step_fraction"]
    assert 0 < b2["descriptive"]["funnel_full_depth_fraction"] <= 1
    if not collapsed:
        assert one_step > 6.4 and b2["note"] is None
        return
    assert one_step < 6.4  # below a tenth of d
    coordinate, share = top_coordinate(first)
    assert coordinate == MASSIVE and share >= 0.9
    assert np.argmax(np.abs(np.linalg.svd(first)[0][:, 0])) == MASSIVE  # the same, by NumPy directly
    assert "every sub-layer operator is already rank-collapsed: no headroom for a funnel" in b2["note"]
    assert f"residual coordinate {MASSIVE} carries" in b2["note"]
    write_claims_json(out, [b2])
    assert any("note: every sub-layer operator" in line for line in verdict_lines(out))


def test_a_funnel_over_one_chunk_says_it_has_no_interval(tmp_path: Path) -> None:
    """One chunk is its own only resample: the stage keeps replicate 0 alone, and B2 and B3
    say why they carry no interval."""
    config = RunConfig(model="random:llama:num_hidden_layers=2", chunks=1, seq_len=16, jacobian_mode="isolated",
                       funnel_rank=0, funnel_alphas=(1.0,), funnel_boot=5, init_seeds=1)
    out = run(config, tmp_path / "run", stages=("jacobian",), execution=Execution(quiet=True, jobs=1))
    results = {r["id"]: r for r in evaluate(load_claims(), out, calibrate=False)}
    for cid in ("B2-funnel-trained", "B3-funnel-learned"):
        assert "no interval: the bootstrap resampled nothing, since 1 chunk is its only resample" in (
            results[cid]["note"] or ""), cid
