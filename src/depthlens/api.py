"""The Python API: :func:`analyse` a model, get a :class:`Run` whose tables are DataFrames.

Example (a random-weight model of a family written in code, a tiny text)::

    import depthlens
    run = depthlens.analyse("random:llama", text="notes.txt", stages=["attention"], preset="quick")
    run.heads                     # the heads table, a pandas DataFrame
    run.arrays("pseudospectra")   # loaded on first use
    run.verdicts                  # the pre-registered claims and their verdicts
    run.report()                  # report.html, as `depthlens report` renders it

An already-loaded ``transformers`` model works the same way (``depthlens.analyse(model,
tokenizer)``); it is analysed in place (eval mode, no gradients, eager attention).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .config import RunConfig
from .context import Execution
from .errors import InputError, RunError, RunIncomplete
from .report.tables import RunTables
from .runs import RunMode, read_manifest
from .schema import SCHEMA, SUMMARIES
from .stages import STAGES

__all__ = ["Run", "analyse", "census", "open_run", "sweep"]

_IF_EXISTS = {"resume": RunMode.RESUME, "overwrite": RunMode.OVERWRITE, "error": RunMode.NEW}


def analyse(
    model: Any = "smollm2-135m",
    tokenizer: Any = None,
    *,
    text: str = "python-docs",
    stages: Sequence[str] = tuple(STAGES),
    out: str | Path | None = None,
    if_exists: str = "resume",
    preset: str = "default",
    claims: str | Path | None = None,
    jobs: int = 2,
    executor: str = "local",
    slurm_params: str = "",
    quiet: bool = True,
    **options: Any,
) -> "Run":
    """Run ``stages`` on ``model`` and return the :class:`Run`.

    Parameters
    ----------
    model : str or transformers model
        A model spec as ``depthlens --model`` takes it (``smollm2-135m``, a hub id, a folder,
        a ``.gguf`` file, ``random:<family>``), or a loaded ``*ForCausalLM`` of a supported
        family (:func:`depthlens.models.wrap_model`).
    tokenizer : transformers tokenizer, optional
        The tokenizer of an in-memory ``model``; without one a byte-level tokenizer serves
        (as for random models). Ignored for a spec.
    text : str
        ``python-docs``, ``wikitext-2`` or a text file path.
    stages : sequence of str
        Stages to run (those they need run first); default every stage.
    out : str or Path, optional
        The run directory. Without one a new temporary folder is used (``run.path``; it is
        not removed).
    if_exists : {"resume", "overwrite", "error"}
        What to do when ``out`` holds a run: continue it from its last finished unit (its
        configuration must be the same), replace it, or refuse.
    preset : {"quick", "default", "paper"}
        Sizes of the run, as ``--preset``.
    claims : str or Path, optional
        A claims TOML file (default: the packaged one).
    jobs : int
        Worker processes for the numerics (CPUs of a private Ray instance with ``executor="ray"``).
    executor : str
        Where the numerical tasks run, as ``--executor``: ``local``, ``ray``,
        ``ray=HOST:PORT``, ``ray=auto``, ``slurm``, ``slurm=local``
        (:mod:`depthlens.executors`); the tables do not depend on it.
    slurm_params : str
        Settings of the SLURM jobs, as ``--slurm-params`` (``"partition=cpu,time=60,block=64"``).
    quiet : bool
        No progress bars.
    **options
        Any option by name, as the flags name them (``chunks=8``, ``null_samples=4``,
        ``seq_len=64``, ...), see :class:`depthlens.config.RunConfig`.

    Returns
    -------
    Run

    Raises
    ------
    DepthlensError
        Bad input, one line (nothing is written); a run whose units failed raises
        :class:`~depthlens.errors.RunIncomplete` after the others finished.
    """
    from .workflow import run as run_workflow

    if if_exists not in _IF_EXISTS:
        raise InputError(f"if_exists={if_exists!r} is unknown; use one of {', '.join(_IF_EXISTS)}.")
    loaded = None
    if not isinstance(model, (str, Path)):
        from .models.loading import wrap_model

        loaded = wrap_model(model, tokenizer)
        model = loaded.name
    config = RunConfig(preset=preset, model=str(model), text=str(text), **options)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="depthlens-"))
    try:
        path = run_workflow(config, root, run_mode=_IF_EXISTS[if_exists], stages=tuple(stages),
                            execution=Execution(quiet=quiet, jobs=jobs, executor=executor, slurm_params=slurm_params),
                            claims=claims, loaded=loaded)
    except Exception as exc:
        if out is None and not isinstance(exc, RunIncomplete):  # our temporary folder holds no run: remove it
            shutil.rmtree(root, ignore_errors=True)
        raise
    return Run(path)


def census(
    model: str | Path,
    *,
    text: str = "python-docs",
    revisions: Sequence[str] = (),
    compare: Sequence[str] = (),
    stages: Sequence[str] = ("attention", "jacobian", "topology"),
    out: str | Path | None = None,
    if_exists: str = "resume",
    preset: str = "default",
    claims: str | Path | None = None,
    delete_cache: bool = False,
    jobs: int = 2,
    executor: str = "local",
    slurm_params: str = "",
    quiet: bool = True,
    **options: Any,
) -> "Run":
    """Run ``stages`` on every checkpoint of the series ``model`` and return the census as a
    :class:`Run` (``run.census``, ``run.census_heads``, ``run.verdicts``, ``run.report()``).

    Parameters
    ----------
    model : str or Path
        A folder written by ``depthlens train`` (``step-N`` checkpoints) or a hub id.
    revisions : sequence of str
        The checkpoints: names, ranges ``step{0..143000..1000}`` or ``@FILE`` (a hub id needs
        them; a folder takes them to pick some of its checkpoints).
    compare : sequence of str
        Further series censused beside ``model`` (e.g. a LayerNorm family against an RMSNorm one).
    stages, out, if_exists, preset, claims, jobs, executor, slurm_params, quiet, **options
        As for :func:`analyse`; each checkpoint's run is ``OUT/checkpoints/SERIES/CHECKPOINT``.
    delete_cache : bool
        Remove each hub revision from the local cache once analysed.

    Raises
    ------
    DepthlensError
        Bad input, one line, before anything is written.
    """
    from .census.options import CensusOptions
    from .census.runner import run_census

    if if_exists not in _IF_EXISTS:
        raise InputError(f"if_exists={if_exists!r} is unknown; use one of {', '.join(_IF_EXISTS)}.")
    config = RunConfig(preset=preset, model=str(model), text=str(text), revisions=tuple(revisions), **options)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="depthlens-census-"))
    path = run_census(config, CensusOptions(census_stages=tuple(stages), compare=tuple(map(str, compare))), root,
                      run_mode=_IF_EXISTS[if_exists],
                      execution=Execution(quiet=quiet, jobs=jobs, executor=executor, slurm_params=slurm_params),
                      delete_cache=delete_cache, claims=claims)
    return Run(path)


def sweep(
    path: str | Path,
    *,
    out: str | Path | None = None,
    if_exists: str = "resume",
    claims: str | Path | None = None,
    jobs: int = 2,
    executor: str = "local",
    slurm_params: str = "",
    quiet: bool = True,
) -> "Run":
    """Run every cell of the sweep file ``path`` (models × revisions × texts × seeds, each an
    ordinary run under ``OUT/cells/LABEL``) and its cross-model report
    (``OUT/compare/compare.html``); return the sweep directory as a :class:`Run`
    (``run.sweep``: one row per cell with its status; ``open_run(run.path / row.run_dir)``
    opens a cell).

    Parameters
    ----------
    path : str or Path
        The sweep file (:mod:`depthlens.sweep.spec`).
    out, if_exists, jobs, executor, slurm_params, quiet
        As for :func:`analyse`.
    claims : str or Path, optional
        A claims file for every cell instead of the sweep file's ``claims``.

    Raises
    ------
    DepthlensError
        Bad input, one line, before anything is written (a cell that fails later is recorded
        in ``run.sweep`` and the others finish).
    """
    from .sweep import run_sweep

    if if_exists not in _IF_EXISTS:
        raise InputError(f"if_exists={if_exists!r} is unknown; use one of {', '.join(_IF_EXISTS)}.")
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="depthlens-sweep-"))
    execution = Execution(quiet=quiet, jobs=jobs, executor=executor, slurm_params=slurm_params)
    return Run(run_sweep(path, root, run_mode=_IF_EXISTS[if_exists], execution=execution, claims=claims))


def open_run(path: str | Path) -> "Run":
    """The :class:`Run` in the run directory ``path`` (written by the CLI or :func:`analyse`).

    Raises
    ------
    RunError
        When ``path`` is not a run directory.
    """
    read_manifest(path)  # one line when it is not a run
    return Run(Path(path))


class Run:
    """A finished (or partly finished) run, read lazily: each table is read on first use.

    Every table of :data:`depthlens.schema.SCHEMA` is an attribute (``run.heads``,
    ``run.operators``, ...); the JSON summaries come from :meth:`summary` and the array files
    from :meth:`arrays`. A table the run does not have raises :class:`AttributeError` with the
    reason (its stage did not run, failed, ...).

    Parameters
    ----------
    path : Path
        The run directory.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._tables = RunTables(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, tables={self.tables})"

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.tables})

    def __getattr__(self, name: str) -> pd.DataFrame:
        if name.startswith("_") or name not in SCHEMA:
            raise AttributeError(name)
        return self.table(name)

    @property
    def tables(self) -> list[str]:
        """The tables this run holds, in schema order."""
        return [name for name in SCHEMA if (self.path / SCHEMA[name].file).is_file()]

    def table(self, name: str) -> pd.DataFrame:
        """``tables/NAME.parquet`` as a DataFrame (a copy; the run caches the file's contents).

        Raises
        ------
        AttributeError
            For a table the run does not hold, with the reason.
        """
        if name not in SCHEMA:
            raise AttributeError(f"{name!r} is no table of depthlens; tables: {', '.join(SCHEMA)}")
        df = self._tables.table(name)
        if df is None:
            raise AttributeError(f"the run in {self.path} has no {name} table: {self._tables.why_missing(name)}")
        return df

    def summary(self, name: str) -> dict[str, Any]:
        """The JSON summary ``NAME.json`` (``attention``, ``topology``, ...).

        Raises
        ------
        RunError
            For a summary the run does not hold, with the reason.
        """
        found = self._tables.json(name) if name in SUMMARIES else None
        if found is None:
            why = self._tables.why_missing(f"{name}.json") if name in SUMMARIES else "no such summary"
            raise RunError(f"the run in {self.path} has no {name}.json: {why}")
        return found

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """The arrays of ``arrays/NAME.safetensors`` (``pseudospectra``,
        ``jacobians_trained_isolated``, ...), read on first use."""
        found = self._tables.arrays(name)
        if found is None:
            raise RunError(f"the run in {self.path} has no arrays/{name}.safetensors: "
                           f"{self._tables.why_missing(f'arrays/{name}')}")
        return found[0]

    @property
    def manifest(self) -> dict[str, Any]:
        """The run's manifest: configuration, model and data provenance, stage status."""
        return self._tables.manifest

    @property
    def config(self) -> RunConfig:
        """The run's configuration."""
        return RunConfig(**(self.manifest.get("config") or {}))  # sections as RunConfig takes them

    @property
    def verdicts(self) -> pd.DataFrame:
        """Every claim of the run's registered claims file with its statistic, value, sample
        sizes and verdict (scored now from the tables; nothing is recomputed)."""
        from .report.claims import evaluate, load_claims, run_claims_path

        results = evaluate(load_claims(run_claims_path(self.path)), self._tables)
        return pd.DataFrame(results)

    @property
    def health(self) -> pd.DataFrame:
        """The numerical-health checks of the run (:mod:`depthlens.report.health`): name,
        value, ok (True, False or None when it could not be made) and how to read it."""
        from .report.health import health_table, numerical_health

        return health_table(numerical_health(self._tables))

    def report(self, claims: str | Path | None = None) -> Path:
        """Render ``report.html`` from the tables (as ``depthlens report``) and return its path."""
        from .report import render_report

        return render_report(self.path, claims_path=claims)
