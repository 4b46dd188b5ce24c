"""OpenMP waiting: the clamp stage on the embedded model with torch's OpenMP threads waiting
passively (the command line's default) against OpenMP's own default (they spin between parallel
regions), which a process gets when torch is loaded before the command line sets its default.

The stage overlaps torch in the main process (the clamped forward passes, two threads) with
worker processes (the heads' Kreiss searches) on the same cores, where spinning threads take
CPU time the workers need (about a fifth of it on 2 cores). ``--rounds`` runs of each,
alternating (:mod:`_alternate`); the ``clamp_heads`` tables of the last runs must be the same
bit for bit (waiting changes no arithmetic).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _alternate import Variant, alternate  # noqa: E402

#: The stage's command line: the default options (about a minute and a half a run on 2 cores).
ARGS = ["clamp", "--quiet", "--overwrite"]
#: Passive waiting (the default) and spinning (torch loaded before the command line).
VARIANTS = {"passive": Variant(drop=("OMP_WAIT_POLICY",)),
            "spinning": Variant(start="import torch; from depthlens.cli import main", drop=("OMP_WAIT_POLICY",))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    print(alternate(VARIANTS, ARGS, parser.parse_args(argv).rounds, "clamp_heads"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
