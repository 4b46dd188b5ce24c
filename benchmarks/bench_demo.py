"""``make demo`` end to end after install: the main job on the embedded default model, timed
as a whole and per stage (the run prints each stage's wall time from its manifest), against its
target.
Runs the same command as ``make demo`` (``depthlens run``, the default configuration) into a
temporary folder that is deleted afterwards, with the BLAS thread setting of the Makefile.
About 20 minutes on 2 CPU cores; ``--preset quick`` times the quick preset against its
2-minute target instead.
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

#: Wall-clock target of each preset on 2 cores, seconds.
TARGETS_S = {"default": 600.0, "quick": 120.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(TARGETS_S), default="default")
    preset = parser.parse_args(argv).preset
    target = TARGETS_S[preset]
    exe = Path(sys.executable).with_name("depthlens")
    folder = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    out = folder / "demo"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    try:
        start = time.perf_counter()
        done = subprocess.run([str(exe), "run", "--preset", preset, "--out", str(out), "--quiet"], env=env, check=False)
        total = time.perf_counter() - start
        stages = json.loads((out / "manifest.json").read_text()).get("stages", {}) if (out / "manifest.json").is_file() \
            else {}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    staged = sum(r.get("seconds") or 0.0 for r in stages.values())
    print(f"stages {staged:.1f} s; loading, claims and report {total - staged:.1f} s")
    print(f"{preset} run end to end: {total:.1f} s = {total / 60:.1f} min (exit {done.returncode}, load average "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}); {total / target:.2f}x the {target / 60:.0f}-minute target")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
