"""``depthlens census`` on 2 cores: the ``induction`` preset's checkpoints through the attention
and jacobian stages with default options, against the same stages run by hand per checkpoint.

1. Trains the preset's series (``depthlens train --preset induction``, about 13 checkpoints)
   unless ``DEPTHLENS_BENCH_SERIES`` names one already trained.
2. The census: ``run_census`` with ``--census-stages attention,jacobian`` and every other
   option at its default. Target: under 15 minutes.
3. The naive method, measured in the same run on the first ``NAIVE`` checkpoints: one
   ``depthlens attention`` and one ``depthlens jacobian`` process per checkpoint (each loads
   the model and the text itself), as a census is run without this command. The ratio compares
   seconds per checkpoint.

Wall times move with the machine's load; the load average is printed with each measurement.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from depthlens.census.options import CensusOptions
from depthlens.census.runner import run_census
from depthlens.config import RunConfig
from depthlens.stages.context import Execution
from depthlens.models import series_checkpoints
from depthlens.runs import RunMode
from depthlens.training import resolve, train

STAGES, NAIVE, TARGET_MIN = ("attention", "jacobian"), 2, 15.0
DEPTHLENS = str(Path(sys.executable).with_name("depthlens"))


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-census-"))
    series = os.environ.get("DEPTHLENS_BENCH_SERIES")
    if series is None:
        series = str(work / "ckpts")
        start = time.perf_counter()
        train(resolve("induction"), series, RunMode.NEW, quiet=True, preset="induction")
        print(f"trained the induction preset in {time.perf_counter() - start:.0f} s ({_load()})")
    names = [name for name, _ in series_checkpoints(Path(series))]
    start = time.perf_counter()
    run_census(RunConfig(model=series), CensusOptions(census_stages=STAGES), work / "census",
               execution=Execution(quiet=True, jobs=2))
    census = time.perf_counter() - start
    print(f"census of {len(names)} checkpoints through {', '.join(STAGES)}: {census:.0f} s = {census / 60:.1f} min "
          f"({census / len(names):.1f} s per checkpoint; target < {TARGET_MIN:g} min: "
          f"{'met' if census / 60 < TARGET_MIN else 'missed'}; {_load()})")
    start = time.perf_counter()
    for name in names[:NAIVE]:
        for stage in STAGES:
            subprocess.run([DEPTHLENS, stage, "--model", series, "--revision", name, "--null", "none", "--quiet",
                            "--out", str(work / "naive" / name / stage)], check=True, stdout=subprocess.DEVNULL)
    naive = (time.perf_counter() - start) / NAIVE
    print(f"naive, one process per stage and checkpoint: {naive:.1f} s per checkpoint; census "
          f"{naive / (census / len(names)):.2f}x faster per checkpoint ({_load()})")


if __name__ == "__main__":
    main()
