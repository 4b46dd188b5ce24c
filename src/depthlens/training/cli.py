"""``depthlens train``: its parser and its command.

``depthlens train [--preset induction] [--family F --n-layers N ...] --out DIR [--resume |
--overwrite] [--quiet]``; flags, help texts and defaults come from
:class:`~depthlens.training.options.TrainOptions`.
"""

from __future__ import annotations

import argparse
import json

from ..options import add_flags, flag_values
from .options import TrainOptions
from .presets import TRAINING_PRESETS, resolve

__all__ = ["HELP", "add_parser", "main"]

HELP = "train a small causal LM from scratch, offline, with log-spaced checkpoints (a series)"


def _preset_values(name: str) -> str:
    """``default 128, induction 160``: the default of option ``name`` and the presets' values
    of it, for its help text (nothing for an option unset by default that no preset sets)."""
    default = TrainOptions.__dataclass_fields__[name].default
    shown = [f"default {default}"] if default is not None else []
    return ", ".join(shown + [f"{preset} {values[name]}" for preset, values in TRAINING_PRESETS.items() if name in values])


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``depthlens train`` to the ``depthlens`` command's sub-parsers and return its parser."""
    p = subparsers.add_parser("train", help=HELP, description=HELP + ". Every checkpoint DIR/step-N loads with "
                              "--model DIR --revision step-N.")
    p.add_argument("--preset", choices=tuple(TRAINING_PRESETS),
                   help="named option values (induction: a 2-layer model that forms previous-token and induction "
                        "heads; census: 10 layers and 11 checkpoints, a series whose census has C2's and C3's "
                        "minimum samples; replicates: the induction preset at batch 16, whose seeds 0-4 pooled by "
                        "census --replicates have C1's, C2's and C3's); explicit flags override them (timings: "
                        "benchmarks/RESULTS.md, section bench_train)")
    add_flags(p, TrainOptions, _preset_values)
    p.add_argument("--out", default="runs/train", help="series folder (default runs/train)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue the series in --out from its last checkpoint")
    group.add_argument("--overwrite", action="store_true", help="replace the series in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(args: argparse.Namespace) -> None:
    """Run ``depthlens train`` with parsed ``args``; prints the series folder and its last
    checkpoint.

    Raises
    ------
    DepthlensError
        Bad input (one line; nothing written) or a folder that cannot be written.
    """
    from ..runs import RunMode
    from ..runs.directory import disk_line
    from .checkpoints import MANIFEST
    from .loop import train

    options = resolve(args.preset, **flag_values(args, [TrainOptions]))
    run_mode = RunMode.RESUME if args.resume else RunMode.OVERWRITE if args.overwrite else RunMode.NEW
    root = train(options, args.out, run_mode, quiet=args.quiet, preset=args.preset)
    last = json.loads((root / MANIFEST).read_text(encoding="utf-8"))["checkpoints"][-1]
    print(f"series: {root} (load a checkpoint with --model {root} --revision step-N)")
    print(f"last checkpoint: {last['revision']}, held-out loss {last['heldout_loss']:.4f} nats/token")
    print(disk_line(root))
