"""The clamp stage on SmolLM2 (32 chunks × 128 tokens; every arm: doses 0, .25, .5, .75, 1 and
mean, on 4 clamp chunks; 3 control seeds; 2 spec nulls per matrix), 2 worker processes: wall
time (target < 4 min on 2 cores) against a naive variant measured on a sample in the same run
(every dose of every target recomputed with its own reference, at every layer, with every
head's Kreiss constant and nulls, in place of the clamped layers only, the reference once and
the reserves only for the arms zero, reference and mean). Then SmolLM2's massive dimensions
(layer, position, dim), the emergence layer and the chain's verdict with its three conditions
and each massive dimension's alone / left-out tests.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json  # noqa: E402
import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from depthlens.config import RunConfig  # noqa: E402
from depthlens.interventions import clamp as cl  # noqa: E402
from depthlens.workflow import Execution, prepare, run  # noqa: E402

JOBS = 2
#: Matrices timed for the naive variant's per-matrix cost.
SAMPLE = 60


def _peak_rss_gib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 2**20


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children (the workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _phase_seconds(units: Path, start: float) -> dict[str, float]:
    """Seconds to the last detection unit (model load included) and from there to the last arm."""
    detect = max(f.stat().st_mtime for f in units.glob("massive*.done"))
    arms = max((f.stat().st_mtime for f in units.glob("arm_*.done")), default=detect)
    return {"detect": detect - start, "arms": arms - detect}


def naive_seconds(config: RunConfig, n_dims: int) -> tuple[float, dict]:
    """The naive variant's time for the arms, extrapolated from a sample measured here: one
    forward pass for the logits and one for every layer's attention per arm and batch, and
    ``(1 + null_samples)`` Kreiss searches for every (layer, head, chunk) of every arm (with
    each of ``n_dims ≥ 2`` massive dims alone and left out), spread over ``JOBS`` workers."""
    prepared = prepare(config)
    adapter = prepared.loaded.adapter
    opts = config.options("clamp")
    ids = prepared.token_ids[: opts.clamp_chunks]
    with torch.inference_mode():
        start = time.perf_counter()
        for s in range(0, ids.shape[0], config.batch_size):
            adapter.logits(ids[s : s + config.batch_size])
            mats = [p.numpy() for _, p in adapter.attention_probs(ids[s : s + config.batch_size])]
        forward = time.perf_counter() - start
    rng = np.random.default_rng(0)
    picks = [(int(rng.integers(len(mats))), int(rng.integers(mats[0].shape[0])), int(rng.integers(mats[0].shape[1])))
             for _ in range(SAMPLE)]
    start = time.perf_counter()
    for layer, b, h in picks:
        cl.reserve_task(mats[layer][b, h], layer, h, b, opts.clamp_null_samples, opts.seed)
    per_matrix = (time.perf_counter() - start) / SAMPLE
    n_arms = (1 + opts.control_seeds) * (len(cl.arm_alphas(opts.clamp_alphas)) + 1) + (2 * n_dims if n_dims > 1 else 0)
    matrices = adapter.n_layers * adapter.n_heads * ids.shape[0]
    total = n_arms * (forward + matrices * per_matrix / JOBS)
    return total, {"arms": n_arms, "forward_s": forward, "matrix_ms": 1e3 * per_matrix, "matrices_per_arm": matrices}


def main() -> None:
    config = RunConfig()  # SmolLM2, python-docs, 32 x 128; clamp defaults: 4 chunks, 3 control seeds, 2 nulls
    opts = config.options("clamp")
    load0 = os.getloadavg()[0]  # other processes on the machine slow the wall time down
    with tempfile.TemporaryDirectory() as tmp:
        start, epoch, cpu0 = time.perf_counter(), time.time(), _cpu_seconds()
        root = run(config, Path(tmp) / "run", stages=("clamp",), execution=Execution(quiet=True, jobs=JOBS))
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu0
        phases = _phase_seconds(root / "units" / "clamp", epoch)
        massive = pd.read_parquet(root / "tables" / "massive.parquet")
        summary = pd.read_parquet(root / "tables" / "clamp.parquet")
        heads = pd.read_parquet(root / "tables" / "clamp_heads.parquet")
        chain = json.loads((root / "interventions.json").read_text())["clamp_chain"]
    naive_arms, info = naive_seconds(config, len(chain.get("all_dims", [])))
    naive = phases["detect"] + naive_arms
    print(f"bench_clamp: clamp stage on SmolLM2, {config.chunks} chunks x {config.seq_len} tokens, clamp on "
          f"{opts.clamp_chunks} chunks, doses {','.join(f'{a:g}' for a in cl.arm_alphas(opts.clamp_alphas))} + mean, "
          f"{opts.control_seeds} control seeds, {opts.clamp_null_samples} spec nulls, {JOBS} workers")
    print(f"  wall time {wall:.1f} s (target < 240), CPU {cpu:.0f} s (= {cpu / JOBS:.0f} s on {JOBS} free cores), "
          f"peak memory {_peak_rss_gib():.2f} GiB; detection (with model load) {phases['detect']:.1f} s, arms "
          f"{phases['arms']:.1f} s; {len(heads)} head rows; load average before/after {load0:.1f}/{os.getloadavg()[0]:.1f}")
    print(f"  naive (every layer and every head's Kreiss constant for every arm, reference per target): "
          f"{info['arms']} arms x ({info['forward_s']:.2f} s forward + {info['matrices_per_arm']} matrices x "
          f"{info['matrix_ms']:.1f} ms / {JOBS} workers) = {naive:.0f} s extrapolated; stage {naive / wall:.1f}x faster")
    at0 = massive[massive["position"] == 0]
    print(f"  massive entries: {len(massive)} over {massive['chunk'].nunique()} chunks; "
          f"{len(at0)} at position 0, {len(massive) - len(at0)} elsewhere")
    grouped = massive.groupby(["position", "dim"]).agg(layers=("layer", lambda s: f"{s.min()}-{s.max()}"),
                                                         chunks=("chunk", "nunique"), entries=("value", "size"),
                                                         max_abs=("value", lambda v: float(np.abs(v).max())))
    for (position, dim), row in grouped.sort_values("entries", ascending=False).head(12).iterrows():
        print(f"    position {position} dim {dim}: layers {row['layers']}, {row['chunks']} chunks, "
              f"{row['entries']} entries, max |h| {row['max_abs']:.0f}")
    if "conditions" not in chain:
        print(f"  chain not tested: {chain.get('reason')}")
        return
    print(f"  clamped dims {chain['all_dims']} (emergence layers {chain['emergence_layers']}), from_layer "
          f"{chain['from_layer']}, control dims {chain['control_dims']}")
    cols = ["target", "seed", "arm", "alpha", "ce", "delta_ce", "sink_mass", "TR1", "delta_TR1"]
    print(summary[cols].to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    c = chain["conditions"]
    m, p, k = c["monotone"], c["predicts"], c["control_inert"]
    print(f"  verdict: tested={chain['tested']}, supported={chain['supported']} ({chain.get('reason')}); "
          f"dims carrying it {chain['dims']}")
    print(f"    monotone: held={m['held']}, sink-mass curve {[round(x, 4) for x in m['sink_mass']]}, "
          f"frac rho>0 {m['frac_positive']}, sign-test p {m['p']:.2g} over {m['n_heads']} heads")
    print(f"    predicts: held={p['held']}, rho {p['rho']}, within-layer permutation p {p['p']} "
          f"({p['n_perm']} permutations, {p['n_heads']} heads in {p['n_layers']} layers)")
    for r in chain["per_dim"]:
        arms = "; ".join(f"{a}: monotone {r[a]['monotone']['held']}, predicts {r[a]['predicts']['held']} "
                         f"(rho {r[a]['predicts']['rho']}), dCE {r[a]['delta_ce']}" for a in ("alone", "left_out"))
        print(f"    dim {r['dim']}: carries={r['carries']} ({arms})")
    print(f"    control_inert: held={k['held']}, massive zero-arm |d sink| {k['massive']['sink_mass']}, "
          f"|d delta_TR1| {k['massive']['delta_TR1']}; seeds " + "; ".join(
              f"{s['seed']}: ratios {s['sink_mass_ratio']}, {s['delta_TR1_ratio']}" for s in k["seeds"]))


if __name__ == "__main__":
    main()
