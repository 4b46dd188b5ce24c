"""Huge pages for torch's tensors: the ablate stage on the embedded model with torch serving
every tensor of 2 MiB or more from transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``, the
command line's default) against torch's own default (4 KiB pages).

The stage is float32 GEMMs over the model's weights (the language-model head alone is 113 MB
on SmolLM2) and over activations of tens of MB: with 2 MiB pages the weights take 512 times
fewer TLB entries and a fresh tensor 512 times fewer page faults. Where the kernel's
transparent huge pages are ``never``, the request does nothing. ``--rounds`` runs of each,
alternating (:mod:`_alternate`); the ``ablation`` tables of the last runs must be the same bit
for bit (where memory lives changes no arithmetic).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _alternate import Variant, alternate  # noqa: E402

#: The stage's command line: the default options (about three minutes a run on 2 cores).
ARGS = ["ablate", "--quiet", "--overwrite"]
#: Huge pages (the default) and torch's own default.
VARIANTS = {"huge": Variant(drop=("THP_MEM_ALLOC_ENABLE",)), "4KiB": Variant(set={"THP_MEM_ALLOC_ENABLE": "0"})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"transparent huge pages: {thp.read_text().strip() if thp.is_file() else 'not available'}")
    print(alternate(VARIANTS, ARGS, parser.parse_args(argv).rounds, "ablation"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
