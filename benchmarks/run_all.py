"""Run every benchmark in this folder (``make bench``); each prints ratios against the
naive method measured in the same run. ``python benchmarks/run_all.py NAME ...`` runs a subset
(``NAME`` as in ``bench_NAME.py``). Each script runs in its own process, so the thread
settings it makes before importing numpy take effect and memory does not accumulate.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    failed = []
    for script in scripts:
        print(f"\n=== {script.stem} ===", flush=True)
        start = time.perf_counter()
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.stem)
        print(f"--- {script.stem}: {time.perf_counter() - start:.1f} s", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
