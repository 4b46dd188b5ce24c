"""``make demo`` end to end after install: the main job on the embedded default model, timed
as a whole and per stage (each stage's ``seconds`` in the run's manifest), against the
10-minute target. Runs the same command as ``make demo`` (``depthlens run``, the default
configuration) into a temporary folder that is deleted afterwards, with the BLAS thread
setting of the Makefile. About 18 minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 600.0


def main() -> int:
    exe = Path(sys.executable).with_name("depthlens")
    folder = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    out = folder / "demo"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    try:
        start = time.perf_counter()
        done = subprocess.run([str(exe), "run", "--out", str(out), "--quiet"], env=env, check=False)
        total = time.perf_counter() - start
        stages = json.loads((out / "manifest.json").read_text()).get("stages", {}) if (out / "manifest.json").is_file() \
            else {}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'stage':<12} {'status':<8} {'seconds':>8}")
    for name, record in stages.items():
        seconds = record.get("seconds")
        print(f"{name:<12} {record.get('status', '?'):<8} {seconds if seconds is not None else float('nan'):>8.1f}")
    staged = sum(r.get("seconds") or 0.0 for r in stages.values())
    print(f"stages {staged:.1f} s; loading, claims and report {total - staged:.1f} s")
    print(f"demo end to end: {total:.1f} s = {total / 60:.1f} min (exit {done.returncode}); "
          f"{total / TARGET_S:.2f}x the {TARGET_S / 60:.0f}-minute target")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
