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
import atexit
import contextlib
import functools
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

# Multi-threaded OpenBLAS is several times slower than one thread on small dense problems
# (n <= 1000) on 2-core machines, and fights torch's own thread pool; one BLAS thread is the
# default unless the user chose otherwise. Must run before numpy is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# torch's OpenMP threads spin between parallel regions unless told to sleep, and a run overlaps
# them with worker processes on the same cores: with passive waiting the clamp stage on 2 cores
# takes about a fifth less CPU and wall time (benchmarks/bench_wait_policy.py), the demo 12 % less CPU.
# Read when torch loads its OpenMP runtime; a value the user set wins. Changes no number.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch serves its tensors of 2 MiB or more from transparent huge pages when asked (read when
# torch loads): the model's weights take 512 times fewer TLB entries and a fresh activation 512
# times fewer page faults. The ablate stage on 2 cores took about 0.9 of its wall and CPU time
# (benchmarks/bench_hugepages.py). Where the kernel's huge pages are "never" it does nothing; a
# value the user set wins. Changes no number.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
from collections.abc import Sequence

from .config import (  # noqa: E402
    OPTION_CHOICES,
    PRESET_VALUES,
    PRESETS,
    RunConfig,
    RunOptions,
    config_file_spelling,
    file_options,
    read_toml,
)
from . import __version__  # noqa: E402
from .allocator import keep_freed_memory  # noqa: E402
from .errors import DepthlensError, InputError, RunIncomplete, one_line  # noqa: E402
from .options import CommandParser, Spelling, add_flags, flag_values, flags_restated  # noqa: E402
from .stages import STAGES, run_stages, with_requirements  # noqa: E402

if TYPE_CHECKING:
    from .executors import Execution
    from .runs import RunMode

RUN_HELP = "the main job: every stage on the chosen model and text"
CENSUS_HELP = ("the chosen stages over every checkpoint of a series (a folder written by depthlens train, or a hub "
               "id with --revisions), with the training-dynamics claims and report")
SWEEP_HELP = ("every cell of a sweep file (models x revisions x texts x seeds) as an ordinary run, then one "
              "cross-model report of them")


def _defaults() -> dict[str, object]:
    """Every option's default (the ``default`` preset), for help texts."""
    return _defaults_of(tuple(STAGES))


@functools.cache
def _defaults_of(stages: tuple[str, ...]) -> dict[str, object]:  # keyed by the registry as it stands
    return dict(RunConfig().items())


def _shown(value: object) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) if isinstance(value, tuple) else str(value)


def _by_preset(name: str) -> str:
    """The values of option ``name`` under each preset, for help texts: ``quick 4, default 32,
    paper 32`` (``default N`` alone when no preset changes it; nothing for a switch or an
    option that is unset by default)."""
    defaults = _defaults()
    values = {p: PRESET_VALUES[p].get(name, defaults[name]) for p in PRESETS}
    if values["default"] in (None, ()) or isinstance(values["default"], bool):
        return ""
    if all(v == values["default"] for v in values.values()):
        return f"default {_shown(values['default'])}"
    return ", ".join(f"{p} {_shown(v)}" for p, v in values.items())


class _Hidden:
    """Adds options to a parser without listing them in its help."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *args: str, **kwargs: object) -> None:
        self.parser.add_argument(*args, **{**kwargs, "help": argparse.SUPPRESS})


def _stage_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    """The parser of ``depthlens NAME`` (a stage, ``run`` or ``census``): the run's options,
    then every stage's (listed in the help for the stages this command runs, accepted but not
    listed for the others, so one command line works for every stage and gives the same
    configuration and hash for ``--resume``). Flags, help texts and defaults come from the
    options dataclasses."""
    summary = {"run": RUN_HELP, "census": CENSUS_HELP}.get(name) or STAGES[name].help
    p = sub.add_parser(name, help=summary, description=summary)
    p.add_argument("--config", metavar="FILE", help="TOML file with run options; flags override it")
    p.add_argument("--preset", choices=PRESETS,
                   help="sizes of the run: quick (smoke run), default, paper (the protocol of docs/methods.md); "
                        "explicit flags and --config values override it (default: default)")
    add_flags(p, RunOptions, _by_preset)
    listed = list(run_stages()) if name in ("run", "census") else with_requirements([name])
    for stage in STAGES.values():
        group = p.add_argument_group(f"{stage.name} stage") if stage.name in listed else _Hidden(p)
        add_flags(group, stage.options, _by_preset)
    p.add_argument("--claims", metavar="FILE", help="pre-registered claims TOML (default: the packaged claims, each "
                                                    "defined in docs/methods.md#claims)")
    if name == "lens":
        p.add_argument("--from", dest="lens_from", metavar="FILE",
                       help="analyse this Jacobian-lens artifact (.pt) alone, with no model: the transport table of "
                            "its matrices (the run's other options are not used)")
        p.add_argument("--readout", metavar="PROMPT",
                       help="read PROMPT through the lens at every layer, beside the logit lens (with --from: "
                            "through --model); the readout table and figure of the report")
        p.add_argument("--readout-top-k", type=int, default=5, metavar="K", help="predictions kept per layer and "
                       "position (default 5)")
    _add_directory_flags(p, "run", "runs/default")
    return p


def _add_directory_flags(p: argparse.ArgumentParser, kind: str, out: str) -> None:
    """Where the tasks run (:func:`add_execution_flags`), then ``--out`` (default ``out``),
    ``--resume`` or ``--overwrite`` of the ``kind`` directory there, and ``--quiet``."""
    add_execution_flags(p)
    p.add_argument("--out", default=out, help=f"{kind} directory (default {out})")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--resume", action="store_true", help=f"continue the {kind} in --out where it stopped")
    group.add_argument("--overwrite", action="store_true", help=f"replace the {kind} in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_execution_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--jobs``, ``--executor`` and ``--slurm-params`` (where the numerical tasks run,
    :mod:`depthlens.executors`) to ``parser``; :func:`execution_from_args` reads them."""
    parser.add_argument("--jobs", type=int, default=2,
                        help="worker processes for the numerics (default 2); with --executor ray, the CPUs of its "
                             "private Ray instance; not used by a Ray cluster or SLURM")
    parser.add_argument("--executor", default="local", metavar="SPEC",
                        help="where the numerical tasks run (the tables do not depend on it): local (--jobs worker "
                             "processes here), ray (a private Ray instance with --jobs CPUs), ray=HOST:PORT or "
                             "ray=auto (a running Ray cluster; its nodes need depthlens installed), slurm (SLURM job "
                             "arrays through submitit, job files in RUN/logs/slurm on a shared file system), "
                             "slurm=local (the same jobs as local processes) (default local)")
    parser.add_argument("--slurm-params", default="", metavar="KEY=VALUE,...",
                        help="settings of the SLURM jobs, submitit's names of sbatch options, e.g. "
                             "partition=cpu,time=60,mem_gb=4,cpus_per_task=1,array_parallelism=32,block=64 "
                             "(time in minutes, default 60; block: tasks per array task, default 64)")


def execution_from_args(args: argparse.Namespace) -> Execution:
    """The :class:`~depthlens.executors.Execution` of a command's ``--quiet``, ``--jobs``,
    ``--executor`` and ``--slurm-params`` (checked by the run, census or sweep before any
    model loads: :func:`depthlens.executors.check_execution`), with the command line that
    :func:`main` parsed."""
    from .executors import Execution

    return Execution(quiet=args.quiet, jobs=args.jobs, executor=args.executor, slurm_params=args.slurm_params,
                     command=tuple(getattr(args, "command_line", ())))


def _census_parser(sub: argparse._SubParsersAction) -> None:
    """``depthlens census``: a run's options, every stage's, the census's own, and
    ``--delete-cache``."""
    from .census.options import CensusOptions

    p = _stage_parser(sub, "census")
    add_flags(p.add_argument_group("census"), CensusOptions)
    p.add_argument("--delete-cache", action="store_true",
                   help="remove each hub revision from the local Hugging Face cache once it is analysed")


def _sweep_parser(sub: argparse._SubParsersAction) -> None:
    """``depthlens sweep SWEEP.toml``: the sweep file, where its cells run, and the run-directory
    switches."""
    p = sub.add_parser("sweep", help=SWEEP_HELP, description=SWEEP_HELP)
    p.add_argument("sweep_file", metavar="SWEEP.toml",
                   help="run options shared by every cell (as --config reads them) and a [sweep] table: models, "
                        "revisions, texts, seeds, stages, claims")
    p.add_argument("--claims", metavar="FILE", help="pre-registered claims TOML for every cell (default: the sweep "
                                                    "file's [sweep] claims, else the packaged claims)")
    _add_directory_flags(p, "sweep", "runs/sweep")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``depthlens`` command."""
    parser = CommandParser(prog="depthlens", description="Transformers as dynamical systems over depth.",
                           epilog="Every quantity and claim is defined in docs/methods.md (also written "
                                  "beside each report, RUN/docs/methods.md).")
    parser.add_argument("--version", action="version", version=f"depthlens {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in ("run", *STAGES):
        _stage_parser(sub, name)
    _census_parser(sub)
    _sweep_parser(sub)
    from .training.cli import add_parser as add_train_parser

    add_train_parser(sub)
    sub.add_parser("models", help="list the embedded models and supported architecture families")
    sub.add_parser("doctor", help="check this machine: BLAS/LAPACK kernels and threads, compiled kernels against references")
    rep = sub.add_parser("report", help="re-render report.html of a run from its tables (no recomputation)")
    rep.add_argument("run_dir", metavar="RUN_DIR")
    rep.add_argument("--claims", metavar="FILE",
                     help="re-score against this claims TOML (default: the run's registered copy RUN/claims.toml); "
                          "verdicts are marked re-scored when its hash differs from the registered one")
    tab = sub.add_parser("tables", help="list a run's tables (rows, columns, what a row is), or export them as CSV")
    tab.add_argument("run_dir", metavar="RUN", help="a run directory (of depthlens run, a stage, census or sweep)")
    tab.add_argument("--csv", metavar="DIR", help="write every table as DIR/NAME.csv (DIR: absent or empty)")
    tab.add_argument("--overwrite", action="store_true", help="replace an earlier CSV export in --csv DIR")
    cmp = sub.add_parser("compare", help="one cross-model report of several runs (claims per model, profiles)")
    cmp.add_argument("run_dirs", metavar="RUN_DIR", nargs="+")
    cmp.add_argument("--out", required=True, metavar="DIR",
                     help="folder of compare.html and compare.json (absent, empty or a previous comparison)")
    cmp.add_argument("--labels", metavar="A,B,...",
                     help="comma-separated label per run (default: model name and revision, made unique)")
    return parser


def _models() -> None:
    from .models import FAMILIES, embedded_models

    print("embedded models:")
    for info in embedded_models():
        print(f"  {info['name']:<16} {info['description']}")
    print("supported families (hub ids, folders, .gguf files, random:<family>):")
    print("  " + ", ".join(FAMILIES))


def _run_mode(args: argparse.Namespace) -> RunMode:
    """The run mode of ``--resume`` / ``--overwrite`` (neither: a new run)."""
    from .runs import RunMode

    return RunMode.RESUME if args.resume else RunMode.OVERWRITE if args.overwrite else RunMode.NEW


def _print_end(root: Path, *, report: bool, timings: bool, verdicts: bool = True) -> None:
    """What a command prints when its run ends: with ``report`` (and ``verdicts``) the
    verdicts, with ``timings`` each stage's status and wall time (from the manifest), with
    ``report`` where the report is, and last the disk use."""
    from .runs.directory import disk_line, read_manifest, timing_lines

    if report and verdicts:
        _print_verdicts(root)
    if timings:
        for line in timing_lines(read_manifest(root), order=tuple(STAGES)):
            print(line)
    if report:
        print(f"report: {root / 'report.html'}")
    print(disk_line(root))
    if report and verdicts:
        _print_smoke_run(root)


def _print_smoke_run(root: Path) -> None:
    """For a run of ``--preset quick``, a last line saying that its verdicts are no measurements."""
    from .runs.directory import read_manifest

    with contextlib.suppress(DepthlensError):
        if (read_manifest(root).get("config") or {}).get("preset") == "quick":
            print("smoke run (--preset quick): its verdicts at these sizes are not measurements; "
                  "use --preset default or paper to measure")


def _print_verdicts(root: Path) -> None:
    """The claims' verdicts at a glance (:func:`depthlens.report.verdict_text.verdict_lines`), when
    the run has them."""
    from .report.verdict_text import verdict_lines

    lines = verdict_lines(root)
    if lines:
        print("verdicts (value [95% interval], test; details in report.html):")
        print("\n".join(f"  {line}" for line in lines))


def _silence_libraries() -> None:
    """``--quiet``: no progress bars from transformers or the hub client either."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _config(args: argparse.Namespace) -> tuple[RunConfig, Spelling]:
    """The run configuration of ``--config``, ``--preset`` and the option flags of ``args``,
    and how messages name the options that the config file gave and no flag overrides
    (:func:`depthlens.config.config_file_spelling`: ``config key chunks = 4``, not ``--chunks 4``)."""
    options = flag_values(args, [RunOptions, *(s.options for s in STAGES.values())])
    values = read_toml(Path(args.config)) if args.config is not None else {}
    flagged = {name for name, value in options.items() if value is not None}
    return (RunConfig.from_mapping(values, preset=args.preset, **options),
            config_file_spelling(file_options(values) - flagged))


def _check_early(args: argparse.Namespace, config: RunConfig) -> None:
    """The checks of a stage command that need neither a model nor torch: the executor
    (``--jobs``, ``--executor``) and ``--out``, refused before the analysis loads."""
    from .executors import check_execution

    check_execution(execution_from_args(args))
    from .runs import check_target  # pandas, not torch

    check_target(args.out, _run_mode(args), config.hash(), {"config": config.to_dict()})


def _stage(args: argparse.Namespace) -> None:
    readout = getattr(args, "readout", None)
    if readout is not None and (args.readout_top_k < 1 or not readout.strip()):
        raise InputError("--readout needs a prompt of some text" if not readout.strip() else
                         f"--readout-top-k {args.readout_top_k} is invalid; pass 1 or more.")
    if getattr(args, "lens_from", None):  # a lens artifact alone: no model, no chunks
        from .workflow import analyse_transport_file

        if args.quiet:
            _silence_libraries()
        root = analyse_transport_file(args.lens_from, args.out, _run_mode(args), execution_from_args(args))
        if readout is not None:
            _readout(root, readout, args.readout_top_k, _config(args)[0].model)
        _print_transport(root)
        print(f"run directory: {root}")
        _print_end(root, report=readout is not None, timings=True, verdicts=False)
        return
    config, spelling = _config(args)
    stages = run_stages() if args.command == "run" else (args.command,)
    with flags_restated(spelling, OPTION_CHOICES):
        _check_early(args, config)
        run_mode = _run_mode(args)
        if args.quiet:
            _silence_libraries()
        from .workflow import run

        root = run(config, args.out, run_mode=run_mode, stages=stages, execution=execution_from_args(args),
                   claims=args.claims, report=args.command in ("run", "lens"))
        if readout is not None:
            _readout(root, readout, args.readout_top_k, None)
    if args.command == "lens":
        _print_transport(root)
    print(f"run directory: {root}")
    _print_end(root, report=args.command in ("run", "lens"), timings=True, verdicts=args.command != "lens")


def _print_transport(root: Path) -> None:
    """The transport funnel of a lens run: erank of each source layer's transport, and the
    erank of the product of mean Jacobians over the same layers where the run has one."""
    from .report.statistics import NotTested, TooLittleData
    from .report.statistics.residual import transport_against_product
    from .runs.tables import RunTables

    tables = RunTables(root)
    transport = tables.table("transport")
    if transport is None:
        return
    try:
        product = transport_against_product(tables).set_index("layer")["erank_product"]
    except (NotTested, TooLittleData):
        product = None
    print("transport erank by source layer" + (" (product of mean Jacobians beside it):" if product is not None
                                                else ":"))
    for layer, erank in zip(transport["layer"], transport["erank"]):
        beside = f"   product {product[layer]:8.2f}" if product is not None and layer in product.index else ""
        print(f"  layer {int(layer):>3}: {erank:8.2f}{beside}")


def _readout(root: Path, prompt: str, top_k: int, model: str | None) -> None:
    """Write the readout of ``prompt`` into the lens run ``root``, print its last position's
    top prediction per layer, and render the report again."""
    import pandas as pd

    from .report import render_report
    from .workflow import record_readout

    table = pd.read_parquet(record_readout(root, prompt, top_k=top_k, model=model))
    last = table[(table["position"] == table["position"].max()) & (table["rank"] == 0)]
    print(f"readout of the last position ({last['input_token'].iloc[0]!r}), top prediction by layer:")
    wide = last.pivot(index="layer", columns="lens", values="prediction")
    for layer, row in wide.iterrows():
        print(f"  layer {layer:>3}: lens {row['jacobian']!r:<16} logit lens {row['logit']!r}")
    render_report(root)


def _census(args: argparse.Namespace) -> None:
    from .census.options import CensusOptions
    from .census.runner import run_census

    if args.quiet:
        _silence_libraries()
    census_values = {k: v for k, v in flag_values(args, [CensusOptions]).items() if v is not None}
    config, spelling = _config(args)
    census = CensusOptions(**census_values)
    run_mode = _run_mode(args)
    with flags_restated(spelling, OPTION_CHOICES):
        root = run_census(config, census, args.out, run_mode=run_mode, execution=execution_from_args(args),
                          delete_cache=args.delete_cache, claims=args.claims)
    print(f"census directory: {root}")
    _print_end(root, report=True, timings=False)


def _sweep(args: argparse.Namespace) -> None:
    from .runs.directory import disk_line
    from .sweep import run_sweep

    if args.quiet:
        _silence_libraries()
    run_mode = _run_mode(args)
    root = run_sweep(args.sweep_file, args.out, run_mode=run_mode, execution=execution_from_args(args),
                     claims=args.claims)
    print(f"sweep directory: {root}")
    print(f"report: {root / 'compare' / 'compare.html'}")
    print(disk_line(root))


def _report(args: argparse.Namespace) -> None:
    from .report import render_report
    from .runs.directory import check_run_directory

    check_run_directory(args.run_dir)  # refused before anything is written: a file, or a folder of another tool
    page = render_report(args.run_dir, claims_path=args.claims)
    _print_verdicts(Path(args.run_dir))
    print(f"report: {page}")
    _print_smoke_run(Path(args.run_dir))


def _tables(args: argparse.Namespace) -> None:
    """``depthlens tables RUN``: each table's name, rows, columns and description; with
    ``--csv DIR`` every table written as ``DIR/NAME.csv``."""
    from .runs.export import export_csv, run_tables

    if args.csv is not None:
        paths = export_csv(args.run_dir, args.csv, overwrite=args.overwrite)
        print(f"{len(paths)} tables written as CSV to {Path(args.csv)}")
        return
    if args.overwrite:
        raise InputError("--overwrite applies to --csv DIR only; add --csv DIR or drop --overwrite.")
    infos = run_tables(args.run_dir)
    if not infos:
        print(f"the run in {args.run_dir} has no tables")
        return
    width = max(len("table"), *(len(i.name) for i in infos))
    print(f"{'table':<{width}}  {'rows':>9}  {'columns':>7}  description")
    for info in infos:
        print(f"{info.name:<{width}}  {info.rows:>9}  {info.columns:>7}  {info.description}".rstrip())


def _compare(args: argparse.Namespace) -> None:
    from .report.compare import render_comparison

    labels = None if args.labels is None else args.labels.split(",")
    print(f"report: {render_comparison(args.run_dirs, args.out, labels=labels)}")


def _interrupted(args: argparse.Namespace) -> str:
    """The one line of an interrupted command: it advises ``--resume`` only where the command
    takes it and its ``--out`` holds a folder to continue (one with a manifest)."""
    out = getattr(args, "out", None)
    if hasattr(args, "resume") and out and (Path(out) / "manifest.json").is_file():
        return "depthlens: interrupted; continue with --resume"
    return "depthlens: interrupted"


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
    from .runs import atomic

    atomic.record(log)
    with log.open("a") as fh:
        fh.write("".join(traceback.format_exception(exc)))
    return log


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``depthlens`` console script; returns the exit status (module notes).

    A stop that left a forward pass running in a thread (:func:`depthlens.executors.local.abandoned_call_running`)
    ends the process here with that status once the exit functions have run (multiprocessing's
    clean-up included) and the output is flushed: the interpreter's finalisation would abort it
    (exit 134).
    """
    args = build_parser().parse_args(argv)  # --help and --version end here, before numpy, pandas or torch load
    args.command_line = ("depthlens", *(sys.argv[1:] if argv is None else argv))
    keep_freed_memory()  # freed arrays are reused instead of faulted in again (allocator.py)
    from .executors.local import abandoned_call_running, install_sigterm_handler

    previous = install_sigterm_handler()  # SIGTERM (timeout, SLURM, OOM killers) stops like Ctrl-C
    try:
        status = _command(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if abandoned_call_running():
        end_process(status)
    return status


def end_process(status: int) -> NoReturn:
    """End this process now with exit status ``status``, once the exit functions have run
    (multiprocessing's and Ray's clean-up included) and the output is flushed; the
    interpreter's finalisation is skipped."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _command(args: argparse.Namespace) -> int:
    """Run the command of ``args`` and return its exit status, printing its one-line errors."""
    try:
        if args.command == "models":
            _models()
        elif args.command == "doctor":
            from .doctor import run_doctor

            return run_doctor()
        elif args.command == "report":
            _report(args)
        elif args.command == "compare":
            _compare(args)
        elif args.command == "tables":
            _tables(args)
        elif args.command == "census":
            _census(args)
        elif args.command == "sweep":
            _sweep(args)
        elif args.command == "train":
            from .training.cli import main as train_main

            train_main(args)
        else:
            _stage(args)
    except RunIncomplete as exc:
        for failure in exc.failures:
            print(f"depthlens: error: {failure.line()}", file=sys.stderr)
        root = Path(exc.root)
        _print_end(root, report=(root / "report.html").is_file(), timings=args.command in STAGES or args.command == "run")
        from .runs.failures import EXIT_FAILED_UNITS

        return EXIT_FAILED_UNITS
    except DepthlensError as exc:
        print(f"depthlens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: the traceback goes to a log, the terminal gets one line
        log = _internal_error(args, exc)
        print(f"depthlens: internal error: {one_line(exc)}; details in {log}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
