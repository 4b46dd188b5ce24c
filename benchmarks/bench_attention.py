"""The default attention stage on SmolLM2 (32 chunks × 128 tokens, nulls on 8 chunks), 2 worker
processes: wall time (target < 4 min on 2 cores) against the same stage passing the chunks
through the model again in every phase (``CAPTURE_BUDGET`` 0, the way before the heads phase's
queries and keys were kept; its tables must be identical), peak memory (target < 4 GiB), time per
head-chunk for the resolvent features and for the nulls, the power-norm upper bound against
its naive reference (``bench_kreiss.naive_power_upper``, alternately in this run), the same
per-matrix features against the brute-force Kreiss reference measured in this run, and the
per-matrix scaling in n.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import resource  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import sys  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from depthlens.attention import features  # noqa: E402
from depthlens.config import RunConfig  # noqa: E402
from depthlens.linalg.causal import deflate, random_causal_attention  # noqa: E402
from depthlens.linalg.kreiss_bound import power_upper_bound  # noqa: E402
from depthlens.linalg.reference import kreiss_bruteforce  # noqa: E402
from depthlens.stages import attention as attention_stage  # noqa: E402
from depthlens.workflow import Execution, run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kreiss import cpu_pair, naive_power_upper  # noqa: E402


def _peak_rss_gib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 2**20


PHASES = ("probe", "heads", "certify", "induction", "depth")


def phase_minutes(units: Path, start: float) -> dict[str, float]:
    """Minutes each phase took, from the finish times of its units (``*.done`` files)."""
    ends = {p: max((f.stat().st_mtime for f in units.glob(f"{p}*.done")), default=None) for p in PHASES}
    out, last = {}, start
    for phase in PHASES:
        if ends[phase] is not None:
            out[phase] = (ends[phase] - last) / 60
            last = ends[phase]
    return out


def main() -> None:
    """Run the stage and print the figures."""
    config = RunConfig()  # the defaults: SmolLM2, python-docs, 32 x 128, nulls on 8 chunks
    kept = attention_stage.CAPTURE_BUDGET
    with tempfile.TemporaryDirectory() as tmp:
        start, epoch = time.perf_counter(), time.time()
        root = run(config, Path(tmp) / "run", stages=("attention",), execution=Execution(quiet=True, jobs=2))
        wall = time.perf_counter() - start
        chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet")
        phases = phase_minutes(root / "units" / "attention", epoch)
        attention_stage.CAPTURE_BUDGET = 0  # every phase passes its chunks again
        try:
            start = time.perf_counter()
            again = run(config, Path(tmp) / "again", stages=("attention",), execution=Execution(quiet=True, jobs=2))
            wall_again = time.perf_counter() - start
        finally:
            attention_stage.CAPTURE_BUDGET = kept
        same = all(pd.read_parquet(root / "tables" / f"{name}.parquet").equals(
            pd.read_parquet(again / "tables" / f"{name}.parquet")) for name in ("heads", "head_chunks", "depth"))
    n_mat = len(chunks)
    print(f"bench_attention: default stage on SmolLM2, {config.chunks} chunks x {config.seq_len} tokens, "
          f"nulls on {config.null_chunks} chunks x {config.null_samples} '{config.null_mode}' samples, 2 workers")
    print(f"  wall time {wall / 60:.2f} min (target < 4), peak memory {_peak_rss_gib():.2f} GiB (target < 4), "
          f"{n_mat} head-chunks")
    print("  phases (min, the first including model load): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    print(f"  every phase passing its chunks again (no kept queries and keys): {wall_again / 60:.2f} min; kept: "
          f"{wall_again / wall:.2f}x faster; heads, head_chunks and depth tables identical: {same}")
    rng = np.random.default_rng(0)
    A = random_causal_attention(config.seq_len, rng, sink=3.0, prev=2.0, scale=2.0)
    t = time.perf_counter()
    reps = 5
    for _ in range(reps):
        features.matrix_features(A, extras=False)
    t_feat = (time.perf_counter() - t) / reps
    t = time.perf_counter()
    features.null_reserves(A, config.null_mode, config.null_samples, rng)
    t_null = (time.perf_counter() - t) / config.null_samples
    t = time.perf_counter()
    features.matrix_features(A, extras=True)
    t_extra = time.perf_counter() - t
    t = time.perf_counter()
    ref, _ = kreiss_bruteforce(deflate(A))
    t_ref = time.perf_counter() - t
    k = features.kreiss(deflate(A), upper=False).value
    print(f"  per head-chunk (one core): features {t_feat * 1e3:.1f} ms, one null sample {t_null * 1e3:.1f} ms, "
          f"features with pseudospectral radii and numerical range {t_extra * 1e3:.0f} ms")
    print(f"  brute-force Kreiss reference {t_ref:.2f} s per matrix: features {t_ref / t_feat:.0f}x faster, "
          f"K(B) agrees to {abs(k - ref) / ref:.1e}")
    pairs = [cpu_pair(lambda: naive_power_upper(B), lambda: power_upper_bound(B))
             for B in deflate(np.stack([random_causal_attention(config.seq_len, rng, sink=s, prev=p, scale=2.0)
                                        for s in (0.0, 3.0) for p in (0.0, 2.0) for _ in range(3)]))]
    t_old, t_new = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    print(f"  power-norm upper bound (the bulk of the features) on {len(pairs)} heads, CPU, alternating: naive "
          f"{np.median(t_old) * 1e3:.1f} ms, current {np.median(t_new) * 1e3:.1f} ms (median), ratio "
          f"{np.median(t_old / t_new):.2f}x; bit-identical on {sum(p[2] == p[3].value for p in pairs)}/{len(pairs)}")
    for n in (128, 256, 512):
        A = random_causal_attention(n, rng, sink=3.0, prev=2.0, scale=2.0)
        t = time.perf_counter()
        features.matrix_features(A, extras=False)
        print(f"  scaling: n = {n}: features {1e3 * (time.perf_counter() - t):.0f} ms per head-chunk")


if __name__ == "__main__":
    main()
