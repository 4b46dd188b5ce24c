"""Alternating runs of one ``depthlens`` command under two process set-ups (shared by the
benchmarks of the command line's process defaults: ``bench_wait_policy.py``,
``bench_hugepages.py``).

Each variant names the Python statements that start the command line (what is imported first)
and the environment variables it drops or sets. The runs alternate (``A B``, then ``B A``, …),
each prints its wall and CPU time (user + system, every process of the run), and the ratios
compare the sums of the first variant's runs to the second's. A process default that only
decides where memory lives or how idle threads wait changes no arithmetic: the last run of each
variant must give the same table, bit for bit, and the benchmark fails otherwise.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class Variant:
    """How one variant starts the command line: ``start`` (statements that import its
    ``main``), the environment variables it removes and those it sets."""

    start: str = "from depthlens.cli import main"
    drop: tuple[str, ...] = ()
    set: dict[str, str] = field(default_factory=dict)


def _run(variant: Variant, args: list[str], out: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in variant.drop} | variant.set
    code = f"import sys; {variant.start}; sys.exit(main({[*args, '--out', str(out)]!r}))"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def alternate(variants: dict[str, Variant], args: list[str], rounds: int, table: str) -> str:
    """Run ``depthlens ARGS --out DIR`` ``rounds`` times under each of the two ``variants``,
    alternating; check that the last runs wrote the same ``tables/TABLE.parquet`` bit for bit
    and return the summary line (first variant over second: wall, CPU)."""
    (a, _), (b, _) = variants.items()
    folder = Path(tempfile.mkdtemp(prefix="bench-alternate-"))
    totals = {name: [0.0, 0.0] for name in variants}
    try:
        for k in range(rounds):
            for name in (list(variants) if k % 2 == 0 else list(reversed(variants))):
                wall, cpu = _run(variants[name], args, folder / name)
                totals[name][0] += wall
                totals[name][1] += cpu
                print(f"round {k + 1} {name:9s} {wall:7.1f} s wall {cpu:7.1f} CPU-s", flush=True)
        frames = [pd.read_parquet(folder / name / "tables" / f"{table}.parquet") for name in variants]
        pd.testing.assert_frame_equal(*frames, check_exact=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    (aw, ac), (bw, bc) = totals[a], totals[b]
    return (f"{a} / {b}: wall {aw:.1f} / {bw:.1f} s = {aw / bw:.2f}, CPU {ac:.1f} / {bc:.1f} s = {ac / bc:.2f}; "
            f"{table} tables identical")
