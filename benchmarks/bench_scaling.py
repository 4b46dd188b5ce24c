"""How each stage's time grows with the model width and with the number of chunks: the growth
of the cost as a number (the fitted log-log slope per stage).

Width: ``depthlens run`` (every stage of the main job, then claims and report) on layerwise
random Llamas of ``--layers`` layers, streamed (``--stream-layers``), at each width of
``--widths`` (default 576, 1024, 2048, 4096; 64-wide heads, a third as many key-value heads
or fewer, d_ff = 3.5 d), with the quick preset's sizes (``--chunks`` chunks of ``--seq-len``
tokens). Chunks: the same command at the first width for each count of ``--chunk-counts``.
A first, untimed run at the first width and chunk count takes the one-off costs (numba's kernel
compilation into its cache, cold file caches), which made a fresh tree's first run 18 s slower
than the same run later.
Each run is a child process on ``--jobs`` workers, its folder deleted afterwards; each stage's
wall time comes from the run's ``manifest.json``. The script prints every time, then per stage
the least-squares slope of log(seconds) against log(width) and against log(chunks): a slope of
3 is a stage whose cost is cubic in d (dense decompositions), 1 linear. The naive method is
the same fit's assumption that every stage is linear in both (slope 1), printed beside.

About 17 minutes on 2 cores at the default widths with 2 layers (the 4096-wide run takes 9.5 of
them, half of it the jacobian stage's decompositions of 4096 × 4096 operators); ``--widths
576,1024`` is a 3-minute check.

``python benchmarks/bench_scaling.py [--widths 576,1024,2048,4096] [--chunk-counts 2,8,32]
[--layers 2] [--chunks 2] [--seq-len 32] [--jobs 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def model_spec(width: int, layers: int) -> str:
    """A layerwise random Llama of width ``width``: 64-wide heads, as many key-value heads as the
    largest divisor of the head count that is at most a third of it (3 of 9 at 576, as SmolLM2)."""
    heads = max(1, width // 64)
    kv = max(k for k in range(1, heads + 1) if heads % k == 0 and 3 * k <= max(heads, 3))
    return (f"random:llama:init=layerwise,hidden_size={width},num_hidden_layers={layers},num_attention_heads={heads},"
            f"num_key_value_heads={kv},intermediate_size={int(3.5 * width)}")


def stage_seconds(spec: str, chunks: int, seq_len: int, jobs: int) -> tuple[float, dict[str, float]]:
    """Wall seconds of ``depthlens run`` on ``spec`` (quick preset, streamed) and each stage's."""
    exe = Path(sys.executable).with_name("depthlens")
    folder = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    try:
        start = time.perf_counter()
        done = subprocess.run([str(exe), "run", "--model", spec, "--stream-layers", "--preset", "quick",
                               "--chunks", str(chunks), "--seq-len", str(seq_len), "--jobs", str(jobs),
                               "--out", str(folder / "run"), "--quiet"], env=env, check=False,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        total = time.perf_counter() - start
        manifest = folder / "run" / "manifest.json"
        stages = json.loads(manifest.read_text()).get("stages", {}) if manifest.is_file() else {}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        print(f"  (exit {done.returncode}: {last}; stages that did not finish have no time)")
    return total, {name: float(r["seconds"]) for name, r in stages.items() if r.get("seconds")}


def slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y against log x (NaN with fewer than two points)."""
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def sweep(label: str, values: list[int], run) -> dict[str, dict[int, float]]:
    """Per stage, seconds by value of the swept size (``run(value)`` gives the stage times)."""
    times: dict[str, dict[int, float]] = {}
    for value in values:
        total, stages = run(value)
        print(f"{label} {value:5d}: {total:7.1f} s end to end; "
              + ", ".join(f"{name} {s:.1f}" for name, s in stages.items()), flush=True)
        for name, s in {**stages, "run": total}.items():
            times.setdefault(name, {})[value] = s
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="576,1024,2048,4096")
    parser.add_argument("--chunk-counts", default="2,8,32")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    counts = [int(c) for c in args.chunk_counts.split(",")]
    print(f"layerwise random Llamas, {args.layers} layers, streamed, quick preset, {args.jobs} workers")
    # a first run pays one-off costs (numba compiling its kernels into the source tree's cache, cold
    # file caches) that would inflate the smallest size and flatten every slope: run once, untimed
    stage_seconds(model_spec(widths[0], args.layers), counts[0], args.seq_len, args.jobs)
    by_width = sweep("d", widths, lambda w: stage_seconds(model_spec(w, args.layers), args.chunks, args.seq_len,
                                                           args.jobs))
    by_chunks = sweep("chunks", counts, lambda c: stage_seconds(model_spec(widths[0], args.layers), c, args.seq_len,
                                                                args.jobs))
    print(f"\n{'stage':10s} {'slope in d':>10s} {'slope in chunks':>16s}   (naive: 1 and 1)")
    for name in dict.fromkeys([*by_width, *by_chunks]):
        w, c = by_width.get(name, {}), by_chunks.get(name, {})
        print(f"{name:10s} {slope(list(w), list(w.values())):10.2f} {slope(list(c), list(c.values())):16.2f}")


if __name__ == "__main__":
    main()
