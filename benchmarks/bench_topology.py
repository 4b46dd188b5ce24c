"""Topology coupling (docs/methods.md#b5) per residual boundary at SmolLM2 width (d = 576, 64 × 128
observations): streaming correlation, top-k graph, resolution profile + signed Leiden,
participation, 1000-permutation coupling test. Prints seconds per boundary, the projection
to 60 boundaries, the vectorised permutation test against a naive loop measured in the same
run, and a d = 4096 projection from the measured scaling in d. Leiden runs are timed twice in
the same run: as shipped (moves scan the neighbours' communities, exact for γ > 0) and with
every move scanning all communities (``ALL_COMMS``, the previous implementation; same
partitions), and the d = 4096 projection is printed for both with their ratio. The streamed
correlation and the top-k graph are likewise timed against their previous implementations
(``_dense_update``: a dense ``XᵀX`` and outer-product update of the whole co-moment matrix;
``_sort_topk``: a full stable sort per row), with the rounding difference of the correlations
and the identity of the edges checked, and the d = 4096 projection is printed before and after
them. ``--direct-4096`` also measures d = 4096 itself, both implementations of each piece.

Then the real stage: ``depthlens.stages.topology.run`` on SmolLM2 over 64 chunks × 128 tokens,
all 60 boundaries with communities and 1000 permutations each (target < 3 min on 2 cores);
the isolated mean operators and their metrics it reads are computed first, untimed
(``--synthetic-only`` skips it)."""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import leidenalg as la
import numpy as np
from scipy import stats

from depthlens.topology import (
    Edges,
    RunningMoments,
    amplification,
    boundary_nodes,
    choose_plateau,
    communities,
    participation_coefficient,
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


def _stream(X: np.ndarray, update: Callable[[RunningMoments, np.ndarray], None] = RunningMoments.update) -> np.ndarray:
    """Correlation of X streamed in N_BATCHES batches through ``update`` (default: as shipped)."""
    rm = RunningMoments(X.shape[1])
    for b in range(N_BATCHES):
        update(rm, X[b * BATCH : (b + 1) * BATCH])
    return rm.correlation()


def _dense_update(rm: RunningMoments, X: np.ndarray) -> None:
    """The previous ``RunningMoments.update``: ``M += X_cᵀ X_c + δ δᵀ c`` on the whole matrix,
    through ``d × d`` temporaries (same input checks and state)."""
    arr = np.asarray(X, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("batch holds NaN or infinity")
    if rm._n == 0:
        rm._shift = arr.mean(axis=0)
    n_b = arr.shape[0]
    shifted = arr - rm._shift
    m_b = shifted.mean(axis=0)
    centred = shifted - m_b
    n = rm._n + n_b
    delta = m_b - rm._mean
    rm._comoment += centred.T @ centred + np.outer(delta, delta) * (rm._n * n_b / n)
    rm._mean += delta * (n_b / n)
    rm._n = n
    np.minimum(rm._min, arr.min(axis=0), out=rm._min)
    np.maximum(rm._max, arr.max(axis=0), out=rm._max)


def _sort_topk(R: np.ndarray, k: int) -> Edges:
    """The previous ``topk_graph``: a stable ``argsort`` of every row and a dense keep mask."""
    if not np.allclose(R, R.T, rtol=0.0, atol=1e-10):
        raise ValueError("R is not symmetric")
    d = R.shape[0]
    kk = min(k, d - 1)
    strength = np.abs(R)
    np.fill_diagonal(strength, -np.inf)
    nominated = np.argsort(-strength, axis=1, kind="stable")[:, :kk]
    keep = np.zeros((d, d), dtype=bool)
    keep[np.repeat(np.arange(d), kk), nominated.ravel()] = True
    keep |= keep.T
    keep &= R != 0.0
    i, j = np.nonzero(np.triu(keep, k=1))
    return Edges(i=i.astype(np.int64), j=j.astype(np.int64), weight=R[i, j].copy())


def _compare_previous(d: int, X: np.ndarray, R: np.ndarray, R_old: np.ndarray, edges: Edges, edges_old: Edges) -> None:
    """Print how far the streamed correlations lie from each other and from ``numpy.corrcoef``;
    assert identical top-k edges (from ``R``) and the documented 1e-12 tolerance."""
    ref = np.corrcoef(X, rowvar=False)
    diffs = [float(np.max(np.abs(a - b))) for a, b in ((R, R_old), (R, ref), (R_old, ref))]
    assert max(diffs) <= 1e-12 and all(np.array_equal(getattr(edges, f), getattr(edges_old, f)) for f in ("i", "j", "weight"))
    print(f"  d={d}: max |r| difference dsyrk vs dense update {diffs[0]:.1e}, vs numpy.corrcoef {diffs[1]:.1e} "
          f"(dense {diffs[2]:.1e}); top-k edges of partition vs sort identical ({len(edges)} edges)", flush=True)


def _naive_pvalue(values: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> float:
    n1, n0 = labels.sum(), (~labels).sum()

    def dev(lab: np.ndarray) -> float:
        return abs(stats.mannwhitneyu(values[lab], values[~lab]).statistic - n1 * n0 / 2)

    observed = dev(labels)
    return (1 + sum(dev(rng.permutation(labels)) >= observed for _ in range(N_PERM))) / (1 + N_PERM)


def _all_comms() -> mock._patch:
    """Context in which every Leiden move scans all communities (the previous implementation)."""
    return mock.patch.object(communities, "_consider_comms", lambda resolution: la.ALL_COMMS)


def _stages(d: int, rng: np.random.Generator, full: bool) -> dict[str, float]:
    """Seconds per stage at width d; ``full`` runs the default profile and the naive loop.

    Keys ending in ``_all_comms`` time the same Leiden runs with ``ALL_COMMS`` scans; the
    profiles are checked to be identical.
    """
    X = _activations(rng, d)
    t = {}
    t["correlation"], R = _timed(lambda: _stream(X), 2)
    t["correlation_previous"], R_old = _timed(lambda: _stream(X, _dense_update), 2)
    t["topk_graph"], edges = _timed(lambda: topk_graph(R, 20), 3)
    t["topk_graph_previous"], edges_old = _timed(lambda: _sort_topk(R, 20), 3)
    _compare_previous(d, X, R, R_old, edges, edges_old)
    t["profile_8_runs"], prof8 = _timed(lambda: resolution_profile(edges, d, seed=0, max_evals=8), 2)
    with _all_comms():
        t["profile_8_runs_all_comms"], prof8_old = _timed(lambda: resolution_profile(edges, d, seed=0, max_evals=8), 2)
    assert prof8.table.equals(prof8_old.table) and np.array_equal(prof8.memberships, prof8_old.memberships)
    if full:
        t["profile+leiden"], prof = _timed(lambda: resolution_profile(edges, d, seed=0))
        with _all_comms():
            t["profile+leiden_all_comms"], prof_old = _timed(lambda: resolution_profile(edges, d, seed=0))
        assert prof.table.equals(prof_old.table) and np.array_equal(prof.memberships, prof_old.memberships)
        plateau = choose_plateau(prof)
        print(f"  d={d}: default profile {len(prof.table)} Leiden runs, plateau gamma={plateau.gamma:.4g},"
              f" {plateau.n_communities} communities", flush=True)
        membership = plateau.membership
    else:
        membership = signed_leiden(edges, d, 0.01, seed=0)[0]
    t["participation"], pc = _timed(lambda: participation_coefficient(edges, d, membership), 3)
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
    from depthlens.stages import topology as stage
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


def _projection(timings: dict[int, dict[str, float]], leiden: str,
                pieces: str) -> tuple[float, float, dict[str, float]]:
    """d = 4096 projection from the log-log slope over the measured d: (stage s, profile s, per stage s).

    ``leiden`` is ``""`` for the shipped Leiden runs or ``"_all_comms"`` for ALL_COMMS scans;
    ``pieces`` is ``""`` for the shipped correlation and top-k graph or ``"_previous"`` for
    their previous implementations.
    The stage profiles γ once, then runs Leiden once per boundary (as one run of the 8-run
    profile); the default profile is scaled from d = 576 like the 8-run profile.
    """
    ds = sorted(timings)
    t576 = timings[576]
    projected = {}
    for name in ("correlation" + pieces, "topk_graph" + pieces, "profile_8_runs" + leiden, "participation",
                 "permutations"):
        slope = np.polyfit(np.log(ds), np.log([timings[d][name] for d in ds]), 1)[0]
        projected[name] = t576[name] * (4096 / 576) ** slope
    runs8 = projected.pop("profile_8_runs" + leiden)
    profile = t576["profile+leiden" + leiden] * runs8 / t576["profile_8_runs" + leiden]
    stage = profile + N_BOUNDARIES * (runs8 / 8 + sum(projected.values()))
    return stage, profile, projected | {"profile_8_runs" + leiden: runs8}


def direct_4096() -> None:
    """Measure d = 4096 once: correlation and top-k graph (shipped and previous), the default
    profile, and one Leiden run at the plateau γ with neighbour scans and with ALL_COMMS scans
    (the ALL_COMMS profile would take about ten minutes; the projection above estimates it)."""
    d = 4096
    X = _activations(np.random.default_rng(0), d)
    t = {}
    t["correlation"], R = _timed(lambda: _stream(X))
    t["correlation_previous"], R_old = _timed(lambda: _stream(X, _dense_update))
    t["topk_graph"], edges = _timed(lambda: topk_graph(R, 20))
    t["topk_graph_previous"], edges_old = _timed(lambda: _sort_topk(R, 20))
    _compare_previous(d, X, R, R_old, edges, edges_old)
    t["profile"], prof = _timed(lambda: resolution_profile(edges, d, seed=0))
    gamma = choose_plateau(prof).gamma
    t["leiden"], (membership, _) = _timed(lambda: signed_leiden(edges, d, gamma, seed=0))
    with _all_comms():
        t["leiden_all_comms"], (membership_old, _) = _timed(lambda: signed_leiden(edges, d, gamma, seed=0))
    assert np.array_equal(membership, membership_old)
    print(f"measured d=4096, {N_BATCHES}x{BATCH} observations, seconds:")
    for name, sec in t.items():
        print(f"  {name:26s} {sec:8.2f}")
    for pieces, what in (("", "as shipped"), ("_previous", "previous correlation and top-k graph")):
        per_boundary = t["correlation" + pieces] + t["topk_graph" + pieces] + t["leiden"]
        stage = t["profile"] + N_BOUNDARIES * per_boundary
        print(f"  the stage, {what}, ≈ profile {t['profile']:.0f} s + {N_BOUNDARIES} x {per_boundary:.1f} s "
              f"≈ {stage / 60:.1f} min (participation and permutations are negligible)")
    print(f"  correlation {t['correlation_previous'] / t['correlation']:.1f}x, top-k graph "
          f"{t['topk_graph_previous'] / t['topk_graph']:.1f}x faster than before; Leiden at gamma={gamma:.4g}: "
          f"{t['leiden_all_comms'] / t['leiden']:.1f}x faster than ALL_COMMS, same partition")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic-only", action="store_true", help="skip the real SmolLM2 stage")
    parser.add_argument("--direct-4096", action="store_true", help="also measure d = 4096 directly (about 3 min)")
    args = parser.parse_args()
    if not args.synthetic_only:
        real_stage()
    rng = np.random.default_rng(0)
    ds = [288, 576, 1152]
    timings = {d: _stages(d, rng, full=d == 576) for d in ds}
    t576 = timings[576]
    per_boundary = sum(v for k, v in t576.items() if k not in ("naive_permutations", "profile+leiden_all_comms")
                       and not k.startswith("profile_8") and not k.endswith("_previous"))
    print(f"d=576, {N_BATCHES}x{BATCH} observations, k=20, {N_PERM} permutations; seconds per boundary:")
    for name, sec in t576.items():
        print(f"  {name:26s} {sec:8.3f}")
    print(f"  {'total':26s} {per_boundary:8.3f}  (with a full resolution profile at every boundary)")
    one_run = t576["profile_8_runs"] / 8
    rest = sum(t576[k] for k in ("correlation", "topk_graph", "participation", "permutations"))
    stage = t576["profile+leiden"] + N_BOUNDARIES * (one_run + rest)
    print(f"  the stage profiles gamma once per checkpoint: profile {t576['profile+leiden']:.1f} s + {N_BOUNDARIES} x "
          f"(one Leiden run {one_run:.2f} s + {rest:.2f} s) ≈ {stage / 60:.1f} min; per-boundary profiles would take "
          f"{per_boundary * N_BOUNDARIES / 60:.1f} min")
    ratio = t576["naive_permutations"] / t576["permutations"]
    print(f"permutation test: vectorised {t576['permutations']:.4f} s vs naive loop {t576['naive_permutations']:.2f} s"
          f" -> {ratio:.0f}x faster")
    for d in ds:
        t = timings[d]
        print(f"d={d}: correlation (dsyrk) {t['correlation']:.3f} s vs dense update {t['correlation_previous']:.3f} s "
              f"-> {t['correlation_previous'] / t['correlation']:.1f}x; top-k graph (partition) {t['topk_graph']:.3f} s "
              f"vs sort {t['topk_graph_previous']:.3f} s -> {t['topk_graph_previous'] / t['topk_graph']:.1f}x")
    for d in ds:
        t = timings[d]
        print(f"Leiden, 8-run profile at d={d}: neighbour scans {t['profile_8_runs']:.2f} s vs ALL_COMMS "
              f"{t['profile_8_runs_all_comms']:.2f} s -> {t['profile_8_runs_all_comms'] / t['profile_8_runs']:.1f}x "
              f"(identical profiles)")
    print("projection to d = 4096 (log-log slope over d = 288, 576, 1152), seconds:")
    new, new_profile, parts = _projection(timings, "", "")
    prev, _, prev_parts = _projection(timings, "", "_previous")
    old, old_profile, old_parts = _projection(timings, "_all_comms", "_previous")
    for name, sec in (parts | prev_parts | old_parts).items():
        print(f"  {name:26s} 576: {t576[name]:8.3f}  4096: {sec:9.2f}")
    print(f"  default profile 4096: {new_profile:.1f} s (ALL_COMMS {old_profile:.1f} s)")
    print(f"projected d=4096: the stage (one profile, then one Leiden run per boundary, {N_BOUNDARIES} boundaries) "
          f"≈ {new / 60:.1f} min; with the previous correlation and top-k graph ≈ {prev / 60:.1f} min -> "
          f"{prev / new:.1f}x faster; with those and ALL_COMMS scans ≈ {old / 60:.1f} min -> {old / new:.1f}x")
    if args.direct_4096:
        direct_4096()


if __name__ == "__main__":
    main()
