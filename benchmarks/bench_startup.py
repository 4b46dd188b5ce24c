"""Start-up time of the command line: ``depthlens --help``, ``depthlens run --help`` and
``depthlens --version`` (median of 7 starts each), against the naive start that loads the
analysis (torch, pandas, every stage) before reading the arguments, as the CLI once did,
measured in the same run. Target: ``depthlens --help`` ≤ 0.5 s on 2 cores.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

REPEATS = 7
COMMANDS = {"--help": ["--help"], "run --help": ["run", "--help"], "--version": ["--version"]}
#: The naive start: the analysis loads before the arguments are read.
NAIVE = "import depthlens.workflow, depthlens.cli, sys; sys.argv = ['depthlens', *sys.argv[1:]]; depthlens.cli.main()"
LIGHT = "import depthlens.cli, sys; sys.argv = ['depthlens', *sys.argv[1:]]; depthlens.cli.main()"


def seconds(code: str, args: list[str]) -> float:
    """Median wall time of ``python -c code ARGS`` over :data:`REPEATS` starts."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    print(f"{'command':<14} {'depthlens s':>12} {'naive s':>9} {'ratio':>7}")
    for name, args in COMMANDS.items():
        light, naive = seconds(LIGHT, args), seconds(NAIVE, args)
        print(f"{name:<14} {light:>12.3f} {naive:>9.3f} {naive / light:>6.1f}x")


if __name__ == "__main__":
    main()
