"""OpenMP waiting: the clamp stage on the embedded model with torch's OpenMP threads waiting
passively (the command line's default) against OpenMP's own default (they spin between parallel
regions), which a process gets when torch is loaded before the command line sets its default.

The stage overlaps torch in the main process (the clamped forward passes, two threads) with
worker processes (the heads' Kreiss searches) on the same cores, where spinning threads take
CPU time the workers need (about a fifth of it on 2 cores). The runs alternate, ``--rounds`` of
each, and each prints its wall and CPU time (user + system, every process of the run); the
ratios compare the sums. The tables are the same either
way (waiting changes no arithmetic): the last run of each is compared, bit for bit.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

#: The stage's command line: the default options (about a minute and a half a run on 2 cores).
ARGS = ["clamp", "--quiet", "--overwrite"]
#: How each variant starts the command line: passive (the default) and spinning (torch first).
STARTS = {"passive": "from depthlens.cli import main",
          "spinning": "import torch; from depthlens.cli import main"}


def _run(variant: str, out: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = f"import sys; {STARTS[variant]}; sys.exit(main({[*ARGS, '--out', str(out)]!r}))"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args(argv).rounds
    folder = Path(tempfile.mkdtemp(prefix="bench-wait-"))
    totals = {variant: [0.0, 0.0] for variant in STARTS}
    try:
        for k in range(rounds):
            for variant in (STARTS if k % 2 == 0 else reversed(STARTS)):
                wall, cpu = _run(variant, folder / variant)
                totals[variant][0] += wall
                totals[variant][1] += cpu
                print(f"round {k + 1} {variant:9s} {wall:7.1f} s wall {cpu:7.1f} CPU-s", flush=True)
        tables = [pd.read_parquet(folder / variant / "tables" / "clamp_heads.parquet") for variant in STARTS]
        pd.testing.assert_frame_equal(*tables, check_exact=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    (pw, pc), (sw, sc) = totals["passive"], totals["spinning"]
    print(f"passive / spinning: wall {pw:.1f} / {sw:.1f} s = {pw / sw:.2f}, CPU {pc:.1f} / {sc:.1f} s = {pc / sc:.2f}; "
          "clamp_heads tables identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
