"""The Python API: :func:`analyse` a model, get a :class:`Run` whose tables are DataFrames.

Example (a random-weight model of a family written in code, a tiny text)::

    import depthlens
    run = depthlens.analyse("random:llama", text="notes.txt", stages=["attention"], preset="quick")
    run.heads                     # the heads table, a pandas DataFrame
    run.arrays("pseudospectra")   # loaded on first use
    run.verdicts                  # the pre-registered claims and their verdicts
    run.head(1, 2)                # one head on its median chunk, recomputed: A, B, pseudospectrum, transient
    run.report()                  # report.html, as `depthlens report` renders it

An already-loaded ``transformers`` model works the same way (``depthlens.analyse(model,
tokenizer)``); it is analysed in place (eval mode, no gradients, eager attention).

Bad input raises the command line's one-line errors, worded with the keyword arguments where
the command line names its flags (``chunks=0 must be at least 1``, ``pass
if_exists="overwrite"``: :func:`_keyword`).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .census.options import CensusOptions
from .config import OPTION_CHOICES, PRESETS, RunConfig, RunOptions
from .executors import Execution
from .errors import InputError, RunError, RunIncomplete
from .options import flags_restated, option_fields
from .runs.tables import RunTables
from .runs import RunMode, read_manifest
from .schema import SCHEMA, SUMMARIES
from .stages import STAGES, run_stages

if TYPE_CHECKING:
    from .attention.head_view import HeadView

__all__ = ["Run", "analyse", "census", "open_run", "sweep"]

_IF_EXISTS = {"resume": RunMode.RESUME, "overwrite": RunMode.OVERWRITE, "error": RunMode.NEW}


def _run_mode(if_exists: str) -> RunMode:
    """The run mode of ``if_exists``; an unknown value is refused in one line."""
    if if_exists not in _IF_EXISTS:
        raise InputError(f"if_exists={if_exists!r} is unknown; use one of {', '.join(_IF_EXISTS)}.")
    return _IF_EXISTS[if_exists]


@contextlib.contextmanager
def _target(out: str | Path | None, prefix: str, if_exists: str, quiet: bool, jobs: int, executor: str,
            slurm_params: str) -> Iterator[tuple[Path, RunMode, Execution]]:
    """What a run, census or sweep of the API needs from the keywords they share: the folder it
    writes into (``out``, else a new temporary folder named ``prefix…``, removed again when the
    work fails before it holds a run: anything but :class:`~depthlens.errors.RunIncomplete`),
    the run mode of ``if_exists`` and the :class:`~depthlens.executors.Execution`."""
    mode = _run_mode(if_exists)
    execution = Execution(quiet=quiet, jobs=jobs, executor=executor, slurm_params=slurm_params)
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root, mode, execution
    except Exception as exc:
        if out is None and not isinstance(exc, RunIncomplete):
            shutil.rmtree(root, ignore_errors=True)
        raise


def _kind(annotation: Any) -> type:
    """``bool`` for a switch, ``tuple`` for a list, ``object`` for any other value."""
    if annotation is bool:
        return bool
    return tuple if typing.get_origin(annotation) in (tuple, list) else object


#: The keyword arguments of the functions below that the command line has as flags, by kind
#: (:func:`_kind`): every option, then the settings of the run itself.
_KEYWORDS: dict[str, type] = {
    **{f.name: _kind(f.annotation) for cls in (RunOptions, *(stage.options for stage in STAGES.values()), CensusOptions)
       for f in option_fields(cls) if f.is_flag},
    "out": object, "jobs": object, "executor": object, "slurm_params": object, "preset": object, "claims": object,
    "quiet": bool, "delete_cache": bool,
}
#: The run-directory switches, values of ``if_exists``.
_SWITCHES = {"resume": 'if_exists="resume"', "overwrite": 'if_exists="overwrite"'}
#: Keywords named otherwise than their flag.
_RENAMED = {"census_stages": "stages"}
#: The words after a flag that are its value (:func:`depthlens.options.restate_flags`): the
#: options' choices and the executor's kinds.
_CHOICES = {**OPTION_CHOICES, "executor": ("local", "ray", "slurm"), "preset": PRESETS}


def _keyword(name: str, value: str | None) -> str | None:
    """How the Python API names what a flag names (:data:`depthlens.options.Spelling`):
    ``chunks=8`` for ``--chunks 8``, ``revisions=('step1', 'step2')`` for ``--revisions
    step1,step2``, ``stream_layers=True`` for ``--stream-layers``, ``if_exists="overwrite"`` for
    ``--overwrite``; a flag the API has no keyword for stays."""
    if name in _SWITCHES:
        return _SWITCHES[name]
    kind = _KEYWORDS.get(name)
    if kind is None:
        return None
    keyword = _RENAMED.get(name, name)
    if kind is bool:
        return f"{keyword}=True"
    if value is None:
        return f"{keyword}="
    if value[0] in "'\"":
        return f"{keyword}={value}"
    if kind is tuple:
        items = [_literal(item) for item in value.split(",")]
        return f"{keyword}=({', '.join(items)}{',' if len(items) == 1 else ''})"
    return f"{keyword}={_literal(value)}"


def _literal(text: str) -> str:
    """``text`` as a Python literal: a number as it is, anything else quoted."""
    try:
        float(text)
    except ValueError:
        return repr(text)
    return text


#: The errors of the API's functions name its keyword arguments, not the command line's flags.
_API_ERRORS = flags_restated(_keyword, _CHOICES)


@_API_ERRORS
def analyse(
    model: Any = "smollm2-135m",
    tokenizer: Any = None,
    *,
    text: str = "python-docs",
    stages: Sequence[str] | None = None,
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
    stages : sequence of str, optional
        Stages to run (those they need run first); default those of ``depthlens run``
        (:func:`depthlens.stages.run_stages`: every stage but ``lens``).
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

    _run_mode(if_exists)  # refused before a model loads
    loaded = None
    if not isinstance(model, (str, Path)):
        from .models.in_memory import wrap_model

        loaded = wrap_model(model, tokenizer)
        model = loaded.name
    config = RunConfig(preset=preset, model=str(model), text=str(text), **options)
    with _target(out, "depthlens-", if_exists, quiet, jobs, executor, slurm_params) as (root, mode, execution):
        path = run_workflow(config, root, run_mode=mode, stages=tuple(run_stages() if stages is None else stages), execution=execution, claims=claims,
                            loaded=loaded)
    run = Run(path)
    run._loaded = loaded  # an in-memory model, for run.head (a spec is loaded again from the manifest)
    return run


@_API_ERRORS
def census(
    model: str | Path,
    *,
    text: str = "python-docs",
    revisions: Sequence[str] = (),
    compare: Sequence[str] = (),
    replicates: Sequence[str] = (),
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
    replicates : sequence of str
        Series of ``model``'s configuration trained with other seeds, pooled with it by the
        census claims (C1's layers, C3's boundaries).
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

    config = RunConfig(preset=preset, model=str(model), text=str(text), revisions=tuple(revisions), **options)
    census_options = CensusOptions(census_stages=tuple(stages), compare=tuple(map(str, compare)),
                                   replicates=tuple(map(str, replicates)))
    with _target(out, "depthlens-census-", if_exists, quiet, jobs, executor, slurm_params) as (root, mode, execution):
        path = run_census(config, census_options, root, run_mode=mode, execution=execution, delete_cache=delete_cache,
                          claims=claims)
    return Run(path)


@_API_ERRORS
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

    with _target(out, "depthlens-sweep-", if_exists, quiet, jobs, executor, slurm_params) as (root, mode, execution):
        found = run_sweep(path, root, run_mode=mode, execution=execution, claims=claims)
    return Run(found)


@_API_ERRORS
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
        self._loaded: Any = None  # the in-memory model an analyse() call analysed, if any
        self._prepared: Any = None  # the model and chunks of head(), prepared on its first call

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

    def to_csv(self, folder: str | Path, *, overwrite: bool = False) -> list[Path]:
        """Write every table as ``FOLDER/NAME.csv`` and return the paths, as ``depthlens tables
        RUN --csv FOLDER`` (:func:`depthlens.runs.export.export_csv`; ``overwrite`` replaces an
        earlier export, a folder of CSV files alone)."""
        from .runs.export import export_csv

        return export_csv(self.path, folder, overwrite=overwrite, flag="overwrite=True")

    def report(self, claims: str | Path | None = None) -> Path:
        """Render ``report.html`` from the tables (as ``depthlens report``) and return its path."""
        from .report import render_report

        return render_report(self.path, claims_path=claims)

    def head(self, layer: int, head: int, chunk: int | None = None, *, kmax: int | None = None) -> "HeadView":
        """One head's operators on one chunk, recomputed on demand in float64 from the run's
        model and text: the attention matrix ``A``, the deflated operator ``B = A − P``, its
        eigenvalues, ``σ_min(zI − B)`` on the grid of the report's pseudospectra, the transient
        ``‖B^k‖`` with its peak, the Kreiss constant with its bounds, every §A3 quantity,
        and the run's ``head_chunks`` and ``heads`` rows of that head when present
        (:class:`~depthlens.attention.head_view.HeadView`).

        The model and the chunks are prepared as the run prepared them (its configuration, the
        model loaded again from its spec, or the in-memory model ``analyse`` was given) on the
        first call and kept for the next ones; the matrix comes from the forward pass of the
        chunk's batch of ``--batch-size`` chunks, as in the attention stage, so the view's
        ``values`` are the run's ``head_chunks`` row of the trained model (same configuration).

        Parameters
        ----------
        layer, head : int
            0-based, as in the tables.
        chunk : int, optional
            The text chunk (or prompt), 0-based; default the head's median chunk (the one the
            stage certified and the report's head explorer shows), or 0 without the tables.
        kmax : int, optional
            Last power of the transient (default ``max(n, 2·peak_k)``).

        Returns
        -------
        HeadView

        Raises
        ------
        InputError
            ``layer``, ``head`` or ``chunk`` out of range (one line with the valid range), or
            the run's text or model cannot be read as the run read them.
        RunError
            The run analysed an in-memory model that this ``Run`` does not hold (one opened from
            its folder), or its text or model changed since the run (their SHA-256 differ).

        Examples
        --------
        >>> run = depthlens.open_run("runs/demo")          # doctest: +SKIP
        >>> view = run.head(3, 1)                          # doctest: +SKIP
        >>> view.kreiss_B, view.peak_B, view.peak_k        # doctest: +SKIP
        >>> view.pseudospectrum.sigma.shape                # doctest: +SKIP
        (121, 121)
        """
        import torch

        from .attention.head_view import head_view

        manifest = self.manifest
        heads = self._tables.trained("heads")
        rows = self._tables.trained("head_chunks")
        if heads is not None and len(heads):  # before the model loads; checked again against the model below
            _check_index("layer", layer, int(heads["layer"].max()) + 1, "the run's model")
            _check_index("head", head, int(heads["head"].max()) + 1, "each layer of the run's model")
        shape = (manifest.get("data") or {}).get("shape")
        if chunk is not None:
            _check_index("chunk", chunk, int(shape[0]) if shape else self.config.chunks, "the run's text")
        prepared = self._prepare_head()
        chunks = prepared.chunks
        adapter = prepared.loaded.adapter
        _check_index("layer", layer, adapter.n_layers, "the run's model")
        _check_index("head", head, adapter.n_heads, "each layer of the run's model")
        if chunk is None:
            chunk = _median_chunk(heads, rows, layer, head)
        _check_index("chunk", chunk, len(chunks), "the run's text")
        layer, head, chunk = int(layer), int(head), int(chunk)
        size = self.config.batch_size
        start = chunk - chunk % size  # the chunk's batch in the heads phase: the same forward pass
        with torch.inference_mode():
            probs = next(adapter.attention_probs(chunks.take(slice(start, start + size)).ids, layers=[layer]))[1]
        n = int(chunks.lengths[chunk])
        A = np.ascontiguousarray(probs[chunk - start, head, :n, :n].cpu().numpy(), dtype=np.float64)
        return head_view(A, self.config.options("attention"), layer=layer, head=head, chunk=chunk, kmax=kmax,
                         rows=chunks.rows(chunk), chunk_row=_row(rows, layer=layer, head=head, chunk=chunk),
                         head_row=_row(heads, layer=layer, head=head))

    def readout(self, prompt: str, layer: int | None = None, *, top_k: int = 5, model: str | None = None
                ) -> pd.DataFrame:
        """A prompt's top next-token predictions at ``layer`` (default: every source layer and the
        last) through the run's Jacobian lens, beside the logit lens
        (:func:`depthlens.workflow.lens_readout`; ``model``: the spec a run made from a lens file
        alone reads through). Raises ``RunError`` without a lens (or a model for such a run),
        ``InputError`` for a layer the lens lacks.

        Examples
        --------
        >>> depthlens.open_run("runs/lens").readout("The capital of France is", top_k=3)  # doctest: +SKIP
        """
        from .workflow import lens_readout

        lens_from = "lens_from" in self.manifest
        return lens_readout(self.path, prompt, layer=layer, top_k=top_k, model=model,
                            loaded=None if lens_from else self._prepare_head().loaded)

    def _prepare_head(self) -> Any:
        """The run's model and chunks for :meth:`head`, prepared once (as the run prepared them)."""
        if self._prepared is not None:
            return self._prepared
        from .workflow import prepare

        manifest = self.manifest
        recorded = manifest.get("model") or {}
        if recorded.get("source") == "memory" and self._loaded is None:
            raise RunError(f"the run in {self.path} analysed a model in memory ({recorded.get('spec')}); "
                           "run.head needs it: call depthlens.analyse(model, ..., out=THIS_FOLDER) again, which "
                           "resumes the finished run and returns a Run that holds the model.")
        prepared = prepare(self.config, self._loaded)
        data = manifest.get("data") or {}
        for what, theirs, mine in (("text", data.get("text_sha256"), prepared.text_sha256),
                                   ("model", recorded.get("sha256"), prepared.loaded.provenance.get("sha256"))):
            if theirs and mine and theirs != mine:
                raise RunError(f"the {what} of the run in {self.path} changed since the run (SHA-256 {mine[:12]}…, "
                               f"the run's {theirs[:12]}…); run.head would not recompute the run's heads.")
        self._prepared = prepared
        return prepared


def _check_index(name: str, value: Any, count: int, what: str) -> None:
    """Refuse ``value`` unless it is an integer in ``0 … count − 1``, in one line."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < count:
        raise InputError(f"{name}={value!r} is out of range: {what} has {name}s 0 to {count - 1}; "
                         f"pass an integer 0 <= {name} < {count}.")


def _median_chunk(heads: pd.DataFrame | None, rows: pd.DataFrame | None, layer: int, head: int) -> int:
    """The head's median chunk: its certified chunk in ``heads``, else the lower median of TR1
    over its ``head_chunks`` rows, else 0."""
    if heads is not None and "certified_chunk" in heads:
        found = heads.loc[(heads["layer"] == layer) & (heads["head"] == head), "certified_chunk"].dropna()
        if len(found):
            return int(found.iloc[0])
    if rows is not None and {"TR1", "chunk"} <= set(rows.columns):
        from .attention.analysis import median_chunks

        mine = median_chunks(rows[(rows["layer"] == layer) & (rows["head"] == head)].dropna(subset=["TR1"]))
        if len(mine):
            return int(mine["chunk"].iloc[0])
    return 0


def _row(table: pd.DataFrame | None, **keys: int) -> dict[str, Any] | None:
    """The first row of ``table`` with the ``keys`` as a dict, or None."""
    if table is None or not set(keys) <= set(table.columns):
        return None
    mask = np.ones(len(table), dtype=bool)
    for key, value in keys.items():
        mask &= (table[key] == value).to_numpy()
    found = table[mask]
    return None if found.empty else found.iloc[0].to_dict()
