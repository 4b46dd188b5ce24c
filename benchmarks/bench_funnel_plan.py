"""The jacobian stage's funnel units under ``--funnel-curves read`` (the default: the curves the
claims, their variants and the figures read, α ∈ {0, 0.5, 1}) against what the stage computed
before, ``--funnel-curves every`` with the paper's grid α ∈ {0, 0.25, 0.5, 0.75, 1} (what
``--preset paper`` computes), measured in the same run.

The four funnel units of a default run: the trained model and its step-0 null, each with its
isolated and in-context operators (:func:`depthlens.stages.jacobian.funnel_plan` says which
curves each computes). Operators: a run's float64 arrays (``--run RUN``: its
``arrays/jacobians_<checkpoint>_<mode>.safetensors``, e.g. of ``make demo``), else random
near-identity operators of SmolLM2's width (:func:`bench_funnel.random_operators`, one set per
unit). Each plan runs on ``--jobs`` worker processes, as the stage runs it; the script prints
the wall-clock seconds and curves of every unit, the totals and their ratio, and whether every
curve of the read plan equals the same curve of the every plan bit for bit.

``python benchmarks/bench_funnel_plan.py [--run RUN] [--operators 60] [--jobs 2]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from bench_funnel import random_operators, saved_operators

from depthlens.executors.local import executor
from depthlens.jacobian.cumulative import schur_funnel
from depthlens.jacobian.options import ALPHAS, JacobianOptions
from depthlens.stages.jacobian import funnel_plan

UNITS = (("trained", "isolated"), ("trained", "in_context"), ("init", "isolated"), ("init", "in_context"))
CURVE = ["schur_order", "schur_alpha", "direction", "truncation"]


def unit_operators(run: Path | None, n: int) -> dict[tuple[str, str], list[np.ndarray]]:
    """The operators of every unit: the run's saved ones, else random (seeded per unit)."""
    if run is None:
        return {unit: random_operators(n, seed=i) for i, unit in enumerate(UNITS)}
    return {(ck, mode): saved_operators(run / "arrays" / f"jacobians_{ck}_{mode}.safetensors")[:n] for ck, mode in UNITS}


def run_plan(name: str, opts: JacobianOptions, ops: dict[tuple[str, str], list[np.ndarray]], pool
             ) -> tuple[float, dict[tuple[str, str], pd.DataFrame]]:
    """Every unit's funnel under ``opts``: the total wall-clock seconds and the tables."""
    total, tables = 0.0, {}
    for unit, unit_ops in ops.items():
        plan = funnel_plan(opts, *unit, unit_ops[0].shape[0])
        if plan is None:
            print(f"  {name:6s} {unit[0]:8s} {unit[1]:11s} no curves")
            continue
        start = time.perf_counter()
        tables[unit] = schur_funnel(unit_ops, **plan, pool=pool)
        seconds = time.perf_counter() - start
        total += seconds
        split = tables[unit][tables[unit]["schur_alpha"] < 1.0].groupby(CURVE).ngroups
        print(f"  {name:6s} {unit[0]:8s} {unit[1]:11s} {tables[unit].groupby(CURVE).ngroups:3d} curves "
              f"({split:2d} split, complex) {seconds:7.1f} s", flush=True)
    return total, tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run folder with the float64 operators of a default run")
    parser.add_argument("--operators", type=int, default=60, help="sub-layer operators per unit (first N)")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    ops = unit_operators(args.run, args.operators)
    d = next(iter(ops.values()))[0].shape[0]
    print(f"{args.operators} operators of d = {d} per unit ({args.run or 'random near-identity'}), "
          f"{args.jobs} workers")
    every = JacobianOptions(funnel_alphas=ALPHAS, funnel_curves="every")
    read = JacobianOptions()
    with executor(args.jobs) as pool:
        before, full = run_plan("every", every, ops, pool)
        after, kept = run_plan("read", read, ops, pool)
    print(f"every (before): {before:.1f} s; read (default): {after:.1f} s; {before / after:.2f}x faster")
    equal = True
    for unit, table in kept.items():
        merged = table.merge(full[unit], on=[*CURVE, "depth"], suffixes=("", "_every"), how="left")
        equal &= bool(len(merged) == len(table) and np.array_equal(merged["erank"], merged["erank_every"]))
    print(f"every curve of read equals its every curve bit for bit: {equal}")


if __name__ == "__main__":
    main()
