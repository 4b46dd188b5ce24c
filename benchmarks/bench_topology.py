"""Topology coupling (METHODS B5) per residual boundary at SmolLM2 width (d = 576, 64 × 128
observations): streaming correlation, top-k graph, resolution profile + signed Leiden,
participation, 1000-permutation coupling test. Prints seconds per boundary, the projection
to 60 boundaries, the vectorised permutation test against a naive loop measured in the same
run, and a d = 4096 projection from the measured scaling in d.

Then the real stage: ``depthlens.topology.stage.run`` on SmolLM2 over 64 chunks × 128 tokens,
all 60 boundaries with communities and 1000 permutations each (target < 3 min on 2 cores);
the isolated mean operators and their metrics it reads are computed first, untimed."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats

from depthlens.topology import (
    RunningMoments,
    amplification,
    boundary_nodes,
    choose_plateau,
    participation,
    permutation_pvalue,
    resolution_profile,
    signed_leiden,
    topk_graph,
)

N_BATCHES, BATCH, N_BOUNDARIES, N_PERM = 64, 128, 60, 1000


def _timed(fn: Callable[[], object], repeat: int = 1) -> tuple[float, object]:
    """Best of ``repeat`` wall-clock times, and the result."""
    best = np.inf
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _activations(rng: np.random.Generator, d: int) -> np.ndarray:
    """Residual-like data: d/48 latent groups with signed loadings, 4 global factors, noise."""
    n = N_BATCHES * BATCH
    group = np.arange(d) * max(1, d // 48) // d
    load = rng.uniform(0.3, 1.5, size=d) * rng.choice([-1.0, 1.0], size=d)
    X = rng.normal(size=(n, group.max() + 1))[:, group] * load
    return X + rng.normal(size=(n, 4)) @ rng.normal(scale=0.3, size=(4, d)) + rng.normal(size=(n, d))


def _stream(X: np.ndarray) -> np.ndarray:
    rm = RunningMoments(X.shape[1])
    for b in range(N_BATCHES):
        rm.update(X[b * BATCH : (b + 1) * BATCH])
    return rm.correlation()


def _naive_pvalue(values: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> float:
    n1, n0 = labels.sum(), (~labels).sum()

    def dev(lab: np.ndarray) -> float:
        return abs(stats.mannwhitneyu(values[lab], values[~lab]).statistic - n1 * n0 / 2)

    observed = dev(labels)
    return (1 + sum(dev(rng.permutation(labels)) >= observed for _ in range(N_PERM))) / (1 + N_PERM)


def _stages(d: int, rng: np.random.Generator, full: bool) -> dict[str, float]:
    """Seconds per stage at width d; ``full`` runs the default profile and the naive loop."""
    X = _activations(rng, d)
    t = {}
    t["correlation"], R = _timed(lambda: _stream(X), 2)
    t["topk_graph"], edges = _timed(lambda: topk_graph(R, 20), 3)
    t["profile_8_runs"], _ = _timed(lambda: resolution_profile(edges, d, seed=0, max_evals=8))
    if full:
        t["profile+leiden"], prof = _timed(lambda: resolution_profile(edges, d, seed=0))
        plateau = choose_plateau(prof)
        print(f"  d={d}: default profile {len(prof.table)} Leiden runs, plateau gamma={plateau.gamma:.4g},"
              f" {plateau.n_communities} communities", flush=True)
        membership = plateau.membership
    else:
        membership = signed_leiden(edges, d, 0.01, seed=0)[0]
    t["participation"], pc = _timed(lambda: participation(edges, d, membership), 3)
    amp = amplification(np.eye(d) + rng.normal(scale=d**-0.5, size=(d, d)))
    labels = boundary_nodes(pc)
    t["permutations"], _ = _timed(lambda: permutation_pvalue(amp, labels, N_PERM, np.random.default_rng(0)), 3)
    if full:
        t["naive_permutations"], _ = _timed(lambda: _naive_pvalue(amp, labels, np.random.default_rng(0)))
    return t


def real_stage() -> None:
    """Time the topology stage on SmolLM2 (64 chunks × 128 tokens, the trained checkpoint)."""
    from depthlens.config import RunConfig
    from depthlens.jacobian import engines, metrics_table
    from depthlens.runs import RunDirectory
    from depthlens.runs.directory import RunMode
    from depthlens.topology import stage
    from depthlens.workflow import prepare

    cfg = RunConfig(chunks=64)
    prepared = prepare(cfg)
    ops = engines.mean_operators(prepared.loaded.adapter, prepared.token_ids, jacobian_mode="isolated", batch_size=16)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = RunDirectory.open(Path(tmp) / "run", RunMode.NEW, prepared.manifest())
        run_dir.write_arrays("jacobians_trained_isolated", {f"{l}.{k}": J for (l, k), J in ops.items()})
        table = metrics_table(ops)
        table.insert(0, "checkpoint", "trained")
        table.insert(1, "jacobian_mode", "isolated")
        run_dir.write_table("operators", table)
        start = time.perf_counter()
        tables = stage.analyse_checkpoints(run_dir, [("trained", lambda: prepared.loaded)], prepared.token_ids,
                                           cfg.options("topology"), batch_size=cfg.batch_size, quiet=True)
        wall = time.perf_counter() - start
        coupling = tables["coupling"]
    print(f"real stage: SmolLM2, {cfg.chunks} chunks x {cfg.seq_len} tokens, {len(coupling)} boundaries, "
          f"{cfg.n_perm} permutations each: {wall:.1f} s = {wall / 60:.2f} min (target < 3 min); "
          f"{int(coupling['significant'].sum())} FDR-significant boundaries")


def main() -> None:
    real_stage()
    rng = np.random.default_rng(0)
    ds = [288, 576, 1152]
    timings = {d: _stages(d, rng, full=d == 576) for d in ds}
    t576 = timings[576]
    per_boundary = sum(v for k, v in t576.items() if k not in ("profile_8_runs", "naive_permutations"))
    print(f"d=576, {N_BATCHES}x{BATCH} observations, k=20, {N_PERM} permutations; seconds per boundary:")
    for name, sec in t576.items():
        print(f"  {name:20s} {sec:8.3f}")
    print(f"  {'total':20s} {per_boundary:8.3f}  (with a full resolution profile at every boundary)")
    one_run = t576["profile_8_runs"] / 8
    rest = sum(t576[k] for k in ("correlation", "topk_graph", "participation", "permutations"))
    stage = t576["profile+leiden"] + N_BOUNDARIES * (one_run + rest)
    print(f"  the stage profiles gamma once per checkpoint: profile {t576['profile+leiden']:.1f} s + {N_BOUNDARIES} x "
          f"(one Leiden run {one_run:.2f} s + {rest:.2f} s) ≈ {stage / 60:.1f} min; per-boundary profiles would take "
          f"{per_boundary * N_BOUNDARIES / 60:.1f} min")
    ratio = t576["naive_permutations"] / t576["permutations"]
    print(f"permutation test: vectorised {t576['permutations']:.4f} s vs naive loop {t576['naive_permutations']:.2f} s"
          f" -> {ratio:.0f}x faster")
    print("scaling in d (log-log slope over d = 288, 576, 1152) and projection to d = 4096:")
    logd = np.log(ds)
    projected = {}
    for name in ("correlation", "topk_graph", "profile_8_runs", "participation", "permutations"):
        slope = np.polyfit(logd, np.log([timings[d][name] for d in ds]), 1)[0]
        projected[name] = t576[name] * (4096 / 576) ** slope
        print(f"  {name:20s} slope {slope:5.2f}  576: {t576[name]:8.3f} s  4096: {projected[name]:9.2f} s")
    profile_4096 = t576["profile+leiden"] * projected["profile_8_runs"] / t576["profile_8_runs"]
    total_4096 = profile_4096 + sum(v for k, v in projected.items() if k != "profile_8_runs")
    print(f"  default profile (same number of Leiden runs, scaled like the 8-run profile) 4096: {profile_4096:.1f} s")
    rest_4096 = sum(v for k, v in projected.items() if k != "profile_8_runs")
    stage_4096 = profile_4096 + N_BOUNDARIES * (projected["profile_8_runs"] / 8 + rest_4096)
    print(f"projected d=4096: the stage (one profile, then one Leiden run per boundary) ≈ {stage_4096 / 60:.0f} min for "
          f"{N_BOUNDARIES} boundaries; with a profile at every boundary ≈ {total_4096 * N_BOUNDARIES / 3600:.1f} h")


if __name__ == "__main__":
    main()
