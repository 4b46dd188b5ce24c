"""The Schur funnel (docs/methods.md §B3, §B4) at SmolLM2 width against the previous implementation, same run.

The demo's funnel: 60 sub-layer operators of d = 576, ``--funnel-rank 512`` (exact and rank-512
curves), α ∈ {0, 0.25, 0.5, 0.75, 1}, every Schur order, both directions; ``--operators N``
takes the first N (both implementations scale linearly in N, so the ratio holds). Operators: the
float64 mean operators of a run (``--arrays``, e.g. ``RUN/arrays/jacobians_trained_isolated.
safetensors`` of ``depthlens jacobian --model smollm2-135m --save-arrays float64``), else
random near-identity operators (I plus a small perturbation plus a few expanding directions,
fixed seed).

The previous implementation is ``git show REV:src/depthlens/jacobian/cumulative.py``
(``--rev``, default HEAD), saved as a module the workers can import (its Schur forms come
from the current :func:`depthlens.linalg.schur.schur_form`, which for one order computes what
it computed before, at the same cost). Both run alternately, ``--repeat`` times, first in this
process on one BLAS thread, timed in CPU seconds (what the work costs, steady on a machine
shared with other jobs) with the time split over its parts (singular values, Schur
decompositions and reorderings, normal parts, products), then on ``--jobs`` worker processes
in wall-clock seconds (``--jobs 1`` skips this). The script prints every time, the best of
each implementation, their ratio, and whether the two tables are equal bit for bit (else the
largest relative difference per rank column).

``python benchmarks/bench_funnel.py [--arrays FILE] [--operators 60] [--jobs 2] [--repeat 1]``
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Executor
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from depthlens.jacobian import cumulative
from depthlens.jacobian.store import operator_list
from depthlens.linalg.schur import SCHUR_ORDERS
from depthlens.executors.local import executor

D, L, RANK = 576, 60, 512
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
REPO = Path(__file__).resolve().parents[1]
#: Parts of the time: (label, file the function is in, function, its own time only).
PARTS = (("singular values (LAPACK gesdd)", "_linalg.py", "svd", False),
         ("Schur decompositions (gees)", "_decomp_schur.py", "schur", False),
         ("canonical reordering (trexc)", "schur.py", "_canonical_order", False),
         ("outside/inside reordering (trsen)", "schur.py", "_leading", False),
         ("normal parts QΛQ*", "schur.py", "normal_part", False),
         ("products and scaling", ".py", "push", True))


def random_operators(n: int = L, seed: int = 0) -> list[np.ndarray]:
    """``n`` near-identity ``I + 0.1 G/√d + Σ_k s_k u_k v_kᵀ`` with four expanding directions (s_k in [1, 3])."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        u, v = rng.standard_normal((2, D, 4)) / np.sqrt(D)
        out.append(np.eye(D) + 0.1 * rng.standard_normal((D, D)) / np.sqrt(D) + (u * rng.uniform(1.0, 3.0, 4)) @ v.T)
    return out


def saved_operators(path: Path) -> list[np.ndarray]:
    from safetensors.numpy import load_file

    arrays = load_file(str(path))
    return operator_list({(int(k.split(".")[0]), k.split(".")[1]): v for k, v in arrays.items()})


def previous_module(rev: str, folder: Path) -> ModuleType:
    """``cumulative.py`` at ``rev`` as the importable module ``funnel_previous`` (relative
    imports made absolute); ``folder`` goes on ``sys.path``, which spawned workers inherit."""
    source = subprocess.run(["git", "show", f"{rev}:src/depthlens/jacobian/cumulative.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    (folder / "funnel_previous.py").write_text(re.sub(r"^from \.\.", "from depthlens.", source, flags=re.MULTILINE))
    sys.path.insert(0, str(folder))
    return importlib.import_module("funnel_previous")


def funnel(module: ModuleType, ops: list[np.ndarray], pool: Executor | None) -> pd.DataFrame:
    """The benchmarked funnel of ``module`` (every order, α and direction, exact and rank-512)."""
    return module.schur_funnel(ops, alphas=ALPHAS, ranks=(None, RANK), schur_orders=SCHUR_ORDERS, pool=pool)


def compare(new: pd.DataFrame, old: pd.DataFrame) -> str:
    try:
        pd.testing.assert_frame_equal(new, old, check_exact=True)
        return "tables equal bit for bit"
    except AssertionError:
        cols = ["erank", "erank_sigma", "participation_ratio", "log_norm"]
        rel = {c: float(np.max(np.abs(new[c] - old[c]) / np.maximum(np.abs(old[c]), 1e-300))) for c in cols}
        return "tables differ; largest relative difference " + ", ".join(f"{c} {v:.1e}" for c, v in rel.items())


def parts(prof: cProfile.Profile) -> dict[str, float]:
    """Seconds per part of :data:`PARTS` in a profile (cumulative, or own time for the products)."""
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, ncalls, tottime, cumtime, callers)
    return {what: sum(stats[k][2 if own else 3] for k in stats if k[0].endswith(file) and k[2] == name)
            for what, file, name, own in PARTS}


def timed_cpu(module: ModuleType, ops: list[np.ndarray]) -> tuple[float, dict[str, float], pd.DataFrame]:
    """CPU seconds of one inline funnel, its parts, and its table."""
    prof = cProfile.Profile()
    start = time.process_time()
    table = prof.runcall(funnel, module, ops, None)
    return time.process_time() - start, parts(prof), table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=Path, help="a jacobians_*_isolated.safetensors of float64 operators")
    parser.add_argument("--operators", type=int, default=L, help="use the first N operators (default: all 60)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rev", default="HEAD", help="git revision of the previous implementation")
    args = parser.parse_args()
    ops = saved_operators(args.arrays)[: args.operators] if args.arrays else random_operators(args.operators)
    print(f"{len(ops)} operators of d = {ops[0].shape[0]} ({args.arrays or 'random near-identity'}); rank {RANK}, "
          f"alphas {ALPHAS}, orders {', '.join(SCHUR_ORDERS)}")
    names = ("previous", "current")
    with tempfile.TemporaryDirectory(prefix="bench-funnel-") as tmp:
        modules = dict(zip(names, (previous_module(args.rev, Path(tmp)), cumulative), strict=True))
        cpu: dict[str, list[tuple[float, dict[str, float]]]] = {name: [] for name in names}
        tables: dict[str, pd.DataFrame] = {}
        with threadpool_limits(1):
            for i in range(args.repeat):
                for name in names:
                    seconds, split, tables[name] = timed_cpu(modules[name], ops)
                    cpu[name].append((seconds, split))
                    print(f"  one process, one thread, run {i + 1}: {name:8s} {seconds:7.1f} CPU s", flush=True)
        best = {name: min(cpu[name], key=lambda run: run[0]) for name in names}
        print(f"CPU seconds, best of {args.repeat}: previous ({args.rev}) {best['previous'][0]:.1f}, current "
              f"{best['current'][0]:.1f}: ratio {best['previous'][0] / best['current'][0]:.2f}x; "
              f"{compare(tables['current'], tables['previous'])}", flush=True)
        for what, *_ in PARTS:
            old, new = best["previous"][1][what], best["current"][1][what]
            print(f"  {what:34s} {old:6.1f} s -> {new:6.1f} s ({100 * new / best['current'][0]:4.1f} % of current)")
        if args.jobs > 1:
            wall: dict[str, list[float]] = {name: [] for name in names}
            with executor(args.jobs) as pool:
                for i in range(args.repeat):
                    for name in names:
                        start = time.perf_counter()
                        tables[name] = funnel(modules[name], ops, pool)
                        wall[name].append(time.perf_counter() - start)
                        print(f"  {args.jobs} workers, run {i + 1}: {name:8s} {wall[name][-1]:7.1f} s", flush=True)
            print(f"wall seconds on {args.jobs} workers, best of {args.repeat}: previous {min(wall['previous']):.1f}, "
                  f"current {min(wall['current']):.1f}: ratio {min(wall['previous']) / min(wall['current']):.2f}x; "
                  f"{compare(tables['current'], tables['previous'])}", flush=True)


if __name__ == "__main__":
    main()
