"""``make demo`` end to end after install: the main job on the embedded default model, timed
as a whole and per stage (the run prints each stage's wall time from its manifest), against its
target.
Runs the same command as ``make demo`` (``depthlens run``, the default configuration) into a
temporary folder that is deleted afterwards, with the BLAS thread setting of the Makefile.
About 13 minutes on 2 CPU cores; ``--preset quick`` times the quick preset against its
2-minute target instead. Run options after ``--`` go to ``depthlens run`` as given (e.g.
``-- --heldout-chunks 2 --probe-seqs 64``), to time other sample sizes against the same
targets; the run prints its verdicts, so two size sets compare claim by claim.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Wall-clock target of each preset on 2 cores, seconds.
TARGETS_S = {"default": 600.0, "quick": 120.0}
#: CPU-time target (user + system, every process of the run) of the default preset, seconds.
CPU_TARGET_S = 1200.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(TARGETS_S), default="default")
    parser.add_argument("options", nargs="*", metavar="-- RUN_OPTION",
                        help="options for depthlens run after --, e.g. -- --heldout-chunks 2")
    args = parser.parse_args(argv)
    preset, options = args.preset, list(args.options)
    target = TARGETS_S[preset]
    exe = Path(sys.executable).with_name("depthlens")
    folder = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    out = folder / "demo"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([str(exe), "run", "--preset", preset, *options, "--out", str(out), "--quiet"], env=env,
                              check=False)
        total = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stages = json.loads((out / "manifest.json").read_text()).get("stages", {}) if (out / "manifest.json").is_file() \
            else {}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    staged = sum(r.get("seconds") or 0.0 for r in stages.values())
    print(f"stages {staged:.1f} s; loading, claims and report {total - staged:.1f} s")
    named = f"{preset} run" + (f" with {' '.join(options)}" if options else "")
    print(f"{named} end to end: {total:.1f} s = {total / 60:.1f} min (exit {done.returncode}, load average "
          f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}); {total / target:.2f}x the {target / 60:.0f}-minute target")
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    cpu = user + system
    print(f"CPU time: {cpu:.0f} s ({user:.0f} user + {system:.0f} system, {cpu / total:.0%} of wall time)"
          + (f"; {cpu / CPU_TARGET_S:.2f}x the {CPU_TARGET_S:.0f}-CPU-second target" if preset == "default" else ""))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
