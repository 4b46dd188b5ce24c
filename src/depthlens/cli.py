"""Command line: ``depthlens STAGE --model SPEC --text SOURCE --chunks N --seq-len T --seed S
--out DIR [--resume | --overwrite] [--quiet]``, plus ``depthlens models``.

Every error caused by bad input prints one line (``depthlens: error: ...``) and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .config import DTYPES, RunConfig
from .errors import DepthlensError
from .runs import Mode

RUN_STAGES = ("capture",)
STAGE_HELP = {
    "run": "the main job: every stage on the chosen model and text",
    "capture": "attention pattern features per head and residual summaries per boundary",
}


def _stage_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help=STAGE_HELP[name], description=STAGE_HELP[name])
    p.add_argument("--config", metavar="FILE", help="TOML file with run options; flags override it")
    p.add_argument("--model", help="smollm2-135m (default), hub id, folder, .gguf file or random:<family>[:k=v,...]")
    p.add_argument("--revision", help="hub revision (checkpoint) of --model")
    p.add_argument("--text", help="python-docs (default), wikitext-2 or a text file path")
    p.add_argument("--chunks", type=int, help="number of text chunks (default 8)")
    p.add_argument("--seq-len", type=int, dest="seq_len", help="tokens per chunk including BOS (default 128)")
    p.add_argument("--seed", type=int, help="the run's seed (default 0)")
    p.add_argument("--batch-size", type=int, dest="batch_size", help="chunks per forward pass (default 4)")
    p.add_argument("--dtype", choices=DTYPES, help="model weight dtype (default float32)")
    p.add_argument("--device", help="torch device (default cpu)")
    p.add_argument("--trust-remote-code", action="store_true", default=None, help="allow a hub model's own code to run")
    p.add_argument("--out", default="runs/default", help="run directory (default runs/default)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    group.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``depthlens`` command."""
    parser = argparse.ArgumentParser(prog="depthlens", description="Transformers as dynamical systems over depth.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in ("run", *RUN_STAGES):
        _stage_parser(sub, name)
    sub.add_parser("models", help="list the embedded models and supported architecture families")
    return parser


def _models() -> None:
    from .models import FAMILIES, embedded_models

    print("embedded models:")
    for info in embedded_models():
        print(f"  {info['name']:<16} {info['description']}")
    print("supported families (hub ids, folders, .gguf files, random:<family>):")
    print("  " + ", ".join(FAMILIES))


def _stage(args: argparse.Namespace) -> None:
    from .workflow import run

    options = {k: getattr(args, k) for k in ("model", "revision", "text", "chunks", "seq_len", "seed",
                                              "batch_size", "dtype", "device", "trust_remote_code")}
    config = RunConfig.from_sources(args.config, **options)
    mode = Mode.RESUME if args.resume else Mode.OVERWRITE if args.overwrite else Mode.NEW
    stages = RUN_STAGES if args.command == "run" else (args.command,)
    root = run(config, args.out, mode=mode, stages=stages, quiet=args.quiet)
    print(f"run directory: {root}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``depthlens`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "models":
            _models()
        else:
            _stage(args)
    except DepthlensError as exc:
        print(f"depthlens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("depthlens: interrupted; continue with --resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
