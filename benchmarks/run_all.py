"""Run every benchmark in this folder (``make bench``); each prints ratios against the
naive method measured in the same run. ``python benchmarks/run_all.py NAME ...`` runs a subset
(``NAME`` as in ``bench_NAME.py``)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    sys.path.insert(0, str(HERE))
    for script in scripts:
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        assert spec.loader is not None
        spec.loader.exec_module(module)
        print(f"\n=== {script.stem} ===", flush=True)
        start = time.perf_counter()
        module.main()
        print(f"--- {script.stem}: {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
