"""The quick preset end to end on the embedded model (``depthlens run --preset quick``), per
stage, against its 2-minute target on 2 cores: :mod:`bench_demo` with ``--preset quick``."""

from __future__ import annotations

import sys

from bench_demo import main

if __name__ == "__main__":
    sys.exit(main(["--preset", "quick"]))
