"""Command line: ``depthlens STAGE --model SPEC --text SOURCE --chunks N --seq-len T --seed S
--out DIR [--resume | --overwrite] [--quiet]``, plus ``depthlens models``.

Exit status: 0 success; 2 bad input (one line, ``depthlens: error: ...``, nothing written),
or a run stopped by a full disk or read-only file system (one line; the run directory keeps
its finished units and the manifest marks the stage ``failed`` with ``error: "no space"``,
so ``--resume`` continues once space is back); 3 a run that finished with failed units or stages (one line each, naming its log; the other
units, stages and the report are done, ``--resume`` retries the failures); 130 interrupted
(Ctrl-C or SIGTERM); 1 an internal error of depthlens (one line naming the log file that
holds the traceback). No traceback is printed to the terminal.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path

# Multi-threaded OpenBLAS is several times slower than one thread on small dense problems
# (n <= 1000) on 2-core machines, and fights torch's own thread pool; one BLAS thread is the
# default unless the user chose otherwise. Must run before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from collections.abc import Sequence

from .config import DTYPES, PRESET_VALUES, PRESETS, SAVE_ARRAYS, RunConfig  # noqa: E402
from . import __version__  # noqa: E402
from .errors import DepthlensError, InputError, RunIncomplete, one_line  # noqa: E402
from .runs import Mode  # noqa: E402
from .runs.directory import disk_line  # noqa: E402
from .parallel import install_sigterm_handler  # noqa: E402
from .runs import atomic  # noqa: E402
from .runs.failures import EXIT_FAILED_UNITS  # noqa: E402

RUN_STAGES = ("capture", "attention", "jacobian", "topology")
STAGE_HELP = {
    "run": "the main job: every stage on the chosen model and text",
    "capture": "attention pattern features per head and residual summaries per boundary",
    "attention": "resolvent view of every head: Kreiss constants, transients, nulls, roles, depth products",
    "jacobian": "mean sub-layer Jacobians, their spectral geometry, cumulative funnel and Schur split",
    "topology": "activation-correlation communities, boundary nodes and their Jacobian coupling (runs jacobian first)",
}
OPTIONS = ("model", "revision", "text", "chunks", "seq_len", "seed", "batch_size", "dtype", "device",
           "trust_remote_code", "null_mode", "null_samples", "null_chunks", "extras_chunks", "certify",
           "probe_seqs", "probe_len", "jacobian_mode", "positions", "funnel_rank", "null", "revisions",
           "topk", "n_perm", "exclude_massive", "amplification", "preset", "save_arrays", "funnel_alphas")
#: The option groups each stage command lists in its help (a stage's own, and those of the
#: stages it runs first: topology runs jacobian); the others are accepted but not listed.
STAGE_GROUPS = {"run": ("attention", "jacobian", "topology"), "capture": (), "attention": ("attention",),
                "jacobian": ("jacobian",), "topology": ("jacobian", "topology")}


def _by_preset(name: str) -> str:
    """The values of option ``name`` under each preset, for help texts: ``quick 4, default 32, paper 32``."""
    return ", ".join(f"{p} {PRESET_VALUES[p][name]}" for p in PRESETS)


class _Hidden:
    """Adds options to a parser without listing them in its help."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *args: str, **kwargs: object) -> None:
        self.parser.add_argument(*args, **{**kwargs, "help": argparse.SUPPRESS})


def _group(parser: argparse.ArgumentParser, group: str, command: str) -> argparse._ArgumentGroup | _Hidden:
    """The option group ``group`` of ``command``'s parser: listed when the command runs that
    stage (:data:`STAGE_GROUPS`), else accepted but not listed, so one command line works for
    every stage and gives the same configuration (and hash) for ``--resume``."""
    if group in STAGE_GROUPS[command]:
        return parser.add_argument_group(f"{group} stage")
    return _Hidden(parser)


def _stage_parser(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help=STAGE_HELP[name], description=STAGE_HELP[name])
    p.add_argument("--config", metavar="FILE", help="TOML file with run options; flags override it")
    p.add_argument("--preset", choices=PRESETS,
                   help="sizes of the run: quick (smoke run), default, paper (METHODS.md protocol); "
                        "explicit flags and --config values override it (default: default)")
    p.add_argument("--model", help="smollm2-135m (default), hub id, folder, .gguf file or random:<family>[:k=v,...]")
    p.add_argument("--revision", help="hub revision (checkpoint) of --model")
    p.add_argument("--text", help="python-docs (default), wikitext-2 or a text file path")
    p.add_argument("--chunks", type=int, help=f"number of text chunks ({_by_preset('chunks')})")
    p.add_argument("--seq-len", type=int, dest="seq_len", help=f"tokens per chunk including BOS ({_by_preset('seq_len')})")
    p.add_argument("--seed", type=int, help="the run's seed (default 0)")
    p.add_argument("--batch-size", type=int, dest="batch_size", help="chunks per forward pass (default 4)")
    p.add_argument("--dtype", choices=DTYPES, help="model weight dtype (default float32)")
    p.add_argument("--device", help="torch device (default cpu)")
    p.add_argument("--trust-remote-code", action="store_true", default=None, help="allow a hub model's own code to run")
    a = _group(p, "attention", name)
    a.add_argument("--null-mode", dest="null_mode", choices=("spec", "sink", "full"), help="shuffle null (default spec)")
    a.add_argument("--null-samples", dest="null_samples", type=int,
                   help=f"null samples per matrix ({_by_preset('null_samples')})")
    a.add_argument("--null-chunks", dest="null_chunks", type=int, help=f"chunks that get nulls ({_by_preset('null_chunks')})")
    a.add_argument("--extras-chunks", dest="extras_chunks", type=int,
                   help=f"chunks that get pseudospectral radii and numerical range ({_by_preset('extras_chunks')})")
    a.add_argument("--certify", choices=("median", "all", "none"),
                   help=f"certified Kreiss brackets ({_by_preset('certify')})")
    a.add_argument("--probe-seqs", dest="probe_seqs", type=int,
                   help=f"repeated-token probe sequences ({_by_preset('probe_seqs')})")
    a.add_argument("--probe-len", dest="probe_len", type=int,
                   help=f"repeated-token block length ({_by_preset('probe_len')})")
    j = _group(p, "jacobian", name)
    j.add_argument("--jacobian-mode", dest="jacobian_mode", choices=("isolated", "in_context", "both"),
                   help=f"Jacobian mode ({_by_preset('jacobian_mode')})")
    j.add_argument("--positions", choices=("last", "all"), help="token positions per chunk (default last)")
    j.add_argument("--funnel-rank", dest="funnel_rank", type=int,
                   help=f"truncation rank of cumulative products, 0 for exact products only ({_by_preset('funnel_rank')})")
    j.add_argument("--funnel-alphas", dest="funnel_alphas",
                   help=f"comma-separated α of the funnel's Schur split ({_by_preset('funnel_alphas')})")
    j.add_argument("--null", choices=("init", "none"), help="also analyse the step-0 null (default init)")
    j.add_argument("--revisions", help="comma-separated extra hub revisions of --model to analyse")
    j.add_argument("--save-arrays", dest="save_arrays", choices=SAVE_ARRAYS,
                   help="dtype of the saved mean Jacobians in arrays/, or none; the tables are the same "
                        f"({_by_preset('save_arrays')})")
    t = _group(p, "topology", name)
    t.add_argument("--topk", type=int, help="strongest |r| neighbours per unit (default 20)")
    t.add_argument("--n-perm", dest="n_perm", type=int, help=f"label permutations per boundary ({_by_preset('n_perm')})")
    t.add_argument("--exclude-massive", dest="exclude_massive", action="store_true", default=None,
                   help="drop massive-activation dimensions from the graphs")
    t.add_argument("--amplification", choices=("column", "row", "diagonal"), help="Jacobian amplification (default column)")
    p.add_argument("--claims", metavar="FILE", help="pre-registered claims TOML (default: the packaged claims)")
    p.add_argument("--jobs", type=int, default=2, help="worker processes for the numerics (default 2)")
    p.add_argument("--out", default="runs/default", help="run directory (default runs/default)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help="continue the run in --out where it stopped")
    group.add_argument("--overwrite", action="store_true", help="replace the run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``depthlens`` command."""
    parser = argparse.ArgumentParser(prog="depthlens", description="Transformers as dynamical systems over depth.")
    parser.add_argument("--version", action="version", version=f"depthlens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in ("run", *RUN_STAGES):
        _stage_parser(sub, name)
    sub.add_parser("models", help="list the embedded models and supported architecture families")
    sub.add_parser("doctor", help="check this machine: BLAS/LAPACK kernels and threads, compiled kernels against references")
    rep = sub.add_parser("report", help="re-render report.html of a run from its tables (no recomputation)")
    rep.add_argument("run_dir", metavar="RUN_DIR")
    rep.add_argument("--claims", metavar="FILE",
                     help="re-score against this claims TOML (default: the run's registered copy RUN/claims.toml); "
                          "verdicts are marked re-scored when its hash differs from the registered one")
    return parser


def _models() -> None:
    from .models import FAMILIES, embedded_models

    print("embedded models:")
    for info in embedded_models():
        print(f"  {info['name']:<16} {info['description']}")
    print("supported families (hub ids, folders, .gguf files, random:<family>):")
    print("  " + ", ".join(FAMILIES))


def _silence_libraries() -> None:
    """``--quiet``: no progress bars from transformers or the hub client either."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _stage(args: argparse.Namespace) -> None:
    from .workflow import Execution, run

    if args.quiet:
        _silence_libraries()

    options = {k: getattr(args, k) for k in OPTIONS}
    config = RunConfig.from_sources(args.config, **options)
    mode = Mode.RESUME if args.resume else Mode.OVERWRITE if args.overwrite else Mode.NEW
    stages = RUN_STAGES if args.command == "run" else (args.command,)
    if args.jobs < 1:
        raise InputError(f"--jobs {args.jobs} is invalid; pass a positive number of worker processes.")
    root = run(config, args.out, mode=mode, stages=stages, execution=Execution(quiet=args.quiet, jobs=args.jobs),
               claims=args.claims, report=args.command == "run")
    print(f"run directory: {root}")
    if args.command == "run":
        print(f"report: {root / 'report.html'}")
    print(disk_line(root))


def _report(args: argparse.Namespace) -> None:
    from .report import render_report
    from .runs import read_manifest

    read_manifest(args.run_dir)  # one line when RUN_DIR is not a run
    print(f"report: {render_report(args.run_dir, claims_path=args.claims)}")


def _internal_error(args: argparse.Namespace, exc: Exception) -> Path:
    """Write the traceback of a bug to the run's ``logs/depthlens.log`` (or a temporary file
    when there is no run directory yet) and return its path."""
    out = getattr(args, "out", None)
    if out and Path(out).is_dir():
        log = Path(out) / "logs" / "depthlens.log"
        log.parent.mkdir(exist_ok=True)
    else:
        fd, name = tempfile.mkstemp(prefix="depthlens-error-", suffix=".log")
        os.close(fd)
        log = Path(name)
    atomic.record(log)
    with log.open("a") as fh:
        fh.write("".join(traceback.format_exception(exc)))
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``depthlens`` console script; returns the exit status (module notes)."""
    args = build_parser().parse_args(argv)
    previous = install_sigterm_handler()  # SIGTERM (timeout, SLURM, OOM killers) stops like Ctrl-C
    try:
        if args.command == "models":
            _models()
        elif args.command == "doctor":
            from .doctor import run_doctor

            return run_doctor()
        elif args.command == "report":
            _report(args)
        else:
            _stage(args)
    except RunIncomplete as exc:
        for failure in exc.failures:
            print(f"depthlens: error: {failure.line()}", file=sys.stderr)
        if (Path(exc.root) / "report.html").is_file():
            print(f"report: {Path(exc.root) / 'report.html'}")
        print(disk_line(exc.root))
        return EXIT_FAILED_UNITS
    except DepthlensError as exc:
        print(f"depthlens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("depthlens: interrupted; continue with --resume", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: the traceback goes to a log, the terminal gets one line
        log = _internal_error(args, exc)
        print(f"depthlens: internal error: {one_line(exc)}; details in {log}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
