"""Run orchestration: validate every input, then open the run directory and run stages.

All checks that can fail on bad input (model spec, text source, chunk count, context length)
run before the run directory is created, so a refused run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from . import data
from . import stages as stages_registry
from .config import RunConfig
from .executors import Execution
from .stages.context import StageContext, with_identity
from .environment import environment_block
from .executors import check_execution
from .errors import InputError, RunError, RunIncomplete, StorageError
from .models import LoadedModel, load_model
from .models.loading import check_spec, series_checkpoints
from .models.random_models import random_spec
from .models.finite import check_finite_weights
from .models.hooks import SHARED_BYTES
from .executors.local import kept_workers
from .report import default_claims_path, load_claims, render_report
from .report.claims import CLAIMS_COPY
from .runs import RunDirectory, RunMode, atomic, check_target, read_manifest
from .runs.failures import fatal

PACKAGES = ("depthlens", "numpy", "scipy", "torch", "transformers", "pandas", "pyarrow", "numba")


@dataclass
class Prepared:
    """A validated configuration with its model and token chunks, ready to run.

    ``chunks`` are the run's chunks (:class:`depthlens.data.Chunks`: with a prompts file, each
    prompt's length and analysed positions); ``token_ids`` their padded ids. ``text_sha256`` is
    the SHA-256 of the text, or of a prompts file's bytes."""

    config: RunConfig
    loaded: LoadedModel
    chunks: data.Chunks
    text_sha256: str

    @property
    def token_ids(self) -> torch.Tensor:
        """The chunks' token ids ``(N, T)`` (right-padded with a prompts file)."""
        return self.chunks.ids

    def manifest(self, command: Sequence[str] = ()) -> dict:
        """The manifest of a new run (config, hashes, versions, seed, and the numerical
        environment: BLAS/LAPACK libraries and kernels, threads, CPU, as ``depthlens doctor``
        prints them, so two runs can be compared). With a prompts file ``data`` also holds
        ``kind: "prompts"``, each prompt's ``lengths``, ``lines`` and ``analysed`` (its number of
        analysed positions), and ``tokens_sha256`` then covers the lengths and positions too.
        ``command`` is the command line that started the run (empty: ``sys.argv``)."""
        return {
            "config": self.config.to_dict(),
            "config_hash": self.config.hash(),
            "seed": self.config.seed,
            "model": self.loaded.provenance,
            "data": _data_record(self.config.text, self.text_sha256, self.chunks),
            **provenance(command),
        }


def provenance(command: Sequence[str] = ()) -> dict:
    """What every manifest (a run's, a census's, a sweep's) records of the software and the
    machine behind its numbers: ``versions`` (:func:`package_versions`), ``source``
    (:func:`source_version`), ``command`` (the command line, ``command`` or else ``sys.argv``,
    and the working folder), ``python`` and ``environment`` (BLAS/LAPACK libraries and kernels,
    threads, CPU, as ``depthlens doctor`` prints them)."""
    return {"versions": package_versions(), "source": source_version(),
            "command": {"argv": list(command) or list(sys.argv), "cwd": os.getcwd()},
            "python": platform.python_version(), "environment": environment_block()}


def _data_record(text: str, sha256: str, chunks: data.Chunks) -> dict:
    """The manifest's ``data``: the source, its hash, a hash of the tokens and their shape (and
    with a prompts file, each prompt's length, line and number of analysed positions)."""
    digest = hashlib.sha256(chunks.ids.numpy().tobytes())
    record: dict = {"source": text, "text_sha256": sha256}
    if chunks.prompts:
        digest.update(chunks.lengths.astype(np.int64).tobytes())
        digest.update(np.packbits(chunks.analysed).tobytes())
        record.update(kind="prompts", n_prompts=len(chunks), lengths=chunks.lengths.tolist(), lines=list(chunks.lines),
                      analysed=chunks.analysed.sum(axis=1).tolist())
    return {**record, "tokens_sha256": digest.hexdigest(), "shape": list(chunks.shape)}


def check_context(config: RunConfig, plan: Sequence[str], context: int | None, name: str) -> None:
    """Refuse inputs longer than the context of the model ``name`` (``context`` tokens; None:
    unbounded): the chunks (``--seq-len``; a prompts file's prompts are checked once tokenized,
    :func:`check_prompts`) and whatever a stage of ``plan`` feeds the model (its module's
    optional ``check_context(config, context, name)``, e.g. the attention stage's induction
    probe).

    Raises
    ------
    InputError
        Naming the flag and the largest value that fits.
    """
    if context is None:
        return
    if not config.prompts and config.seq_len > context:
        raise InputError(f"--seq-len {config.seq_len} exceeds the context of {name} ({context} tokens); pass "
                         f"--seq-len {context} or less.")
    for stage in plan:
        check = getattr(stages_registry.get(stage).load(), "check_context", None)
        if check is not None:
            check(config, context, name)


def prepare(config: RunConfig, loaded: LoadedModel | None = None, plan: Sequence[str] = ()) -> Prepared:
    """Load the model (unless ``loaded`` is given: an in-memory model, see
    :func:`depthlens.models.wrap_model`) and the text chunks of ``config``, checking each on
    the way (the stages of ``plan`` against the model's context, :func:`check_context`, and
    against the model, their module's optional ``check_model(config, adapter)``).

    Raises
    ------
    DepthlensError
        Unknown model spec, unreadable or short text, inputs beyond the model's context, and
        the other one-line errors of the loaders.
    """
    if loaded is None:
        loaded = load_model(config.model, revision=config.revision, dtype=config.dtype, device=config.device,
                            trust_remote_code=config.trust_remote_code, seed=config.seed,
                            stream_layers=config.stream_layers)
    check_finite_weights(loaded.model, loaded.name)
    check_context(config, plan, loaded.adapter.max_seq_len, loaded.name)
    for stage in plan:
        check = getattr(stages_registry.get(stage).load(), "check_model", None)
        if check is not None:
            check(config, loaded.adapter)
    if config.prompts:
        prompts = data.load_prompts(config.text)
        chunks = data.prompt_chunks(prompts, loaded.tokenizer, config.chunks)
        check_prompts(config, plan, chunks, loaded.adapter.max_seq_len, loaded.name)
        return Prepared(config, loaded, chunks, prompts.sha256)
    source = data.load_text(config.text)
    ids = data.chunks(source, loaded.tokenizer, config.chunks, config.seq_len, seed=config.seed)
    return Prepared(config, loaded, data.Chunks.of(ids), source.sha256)


def check_prompts(config: RunConfig, plan: Sequence[str], chunks: data.Chunks, context: int | None, name: str) -> None:
    """Refuse the prompts of a prompts file that the model or a stage of ``plan`` cannot take
    (before anything is written): a prompt longer than the context of the model ``name``
    (``context`` tokens; None: unbounded), and whatever a stage's optional
    ``check_chunks(config, chunks)`` refuses (e.g. too few prompts for the ablate stage).

    Raises
    ------
    InputError
        One line naming the prompt's line and what to do.
    """
    if context is not None and int(chunks.lengths.max()) > context:
        i = int(np.argmax(chunks.lengths))
        raise InputError(f"{chunks.name(i)} is {int(chunks.lengths[i])} tokens long (BOS included), beyond the "
                         f"context of {name} ({context} tokens); shorten it or leave it out.")
    for stage in plan:
        check = getattr(stages_registry.get(stage).load(), "check_chunks", None)
        if check is not None:
            check(config, chunks)


def run(
    config: RunConfig,
    out: str | Path,
    run_mode: RunMode = RunMode.NEW,
    stages: Sequence[str] = ("capture",),
    execution: Execution = Execution(),
    claims: str | Path | None = None,
    report: bool = False,
    loaded: LoadedModel | None = None,
) -> Path:
    """Run ``stages`` of ``config`` into the run directory ``out`` and return its path.

    Each stage works in resumable units; with ``run_mode=RunMode.RESUME`` finished units are
    skipped and the final tables equal those of an uninterrupted run, whatever ``jobs``.
    The claims file (``claims``, default: the packaged one) is validated before any work,
    then registered before any analysis runs: its sha256 and absolute source path go in the
    manifest (``claims``) and its bytes are copied to ``RUN/claims.toml`` (atomically, listed
    in the run index), which ``depthlens report RUN`` scores against from any folder. A
    resumed run keeps its registration; a different ``claims`` then re-scores (flagged in the
    report). With ``report=True`` the claims get their verdicts and ``report.html`` is
    rendered at the end. ``loaded`` is a model already in memory (``config.model`` then
    names it and is not loaded).

    Failures are isolated: a unit that raises is logged to ``logs/<stage>.log`` and the other
    units go on; a stage that raises, or has failed units, is marked ``failed`` in the
    manifest, and a stage that needs its output is marked ``skipped``; the remaining stages
    run and the report is rendered. ``--resume`` retries what failed. A full disk or a
    read-only file system is not isolated: it stops the run at once (no report), the stage is
    marked ``failed`` with ``error: "no space"`` (or the other reason) when the manifest can
    still be written, and ``--resume`` continues once space is back.

    The whole plan (every stage to run, those it needs, and their options) is checked by
    :func:`check_plan` before the model loads, and so is ``execution``
    (:func:`depthlens.executors.check_execution`: the executor's spec and packages, that a Ray
    cluster answers, that SLURM is there).

    Raises
    ------
    StorageError
        The run directory could not be written (full disk, read-only file system).
    RunIncomplete
        After everything else ran (and the report was rendered), if any unit or stage
        failed; it lists them and names their logs.
    DepthlensError
        Bad input found before the run directory was opened (nothing is written then).
    """
    # before the model loads; a model loaded from a spec (a census checkpoint) is checked as that spec
    plan = check_plan(config, stages, in_memory=loaded is not None and loaded.provenance.get("source") == "memory")
    check_execution(execution)  # the executor spec, its packages, a Ray address, sbatch
    claims_bytes, claims_record = claims_registration(claims)  # a malformed file is refused before any work
    check_target(out, run_mode, config.hash(), {"config": config.to_dict()})  # fail fast, before the model loads
    prepared = prepare(config, loaded, plan)
    manifest = prepared.manifest(execution.command)
    manifest["claims"] = claims_record
    run_dir = RunDirectory.open(out, run_mode, manifest)
    register_claims(run_dir, claims_bytes)
    # the run's registered claims copy unless another file was passed (then flagged if it differs)
    render = functools.partial(render_report, run_dir.root, claims_path=claims) if report else None
    # the stages share one pool of worker processes, and the forward passes over the run's chunks
    # (not a layer-streamed model's: its point is to hold little; its jacobian stage still shares
    # a checkpoint's passes between Jacobian modes)
    shared = (contextlib.nullcontext() if config.stream_layers
              else prepared.loaded.adapter.shared_passes(SHARED_BYTES, prepared.token_ids))
    try:
        with kept_workers(), shared:
            for stage in plan:
                _run_stage(run_dir, stage, prepared, execution)
    except (StorageError, KeyboardInterrupt):
        raise  # a full disk: no report, it could not be written; Ctrl-C: no wait (depthlens report RUN renders it)
    except BaseException:
        if render is not None:  # stopped: the report of what finished
            render()
        raise
    conclude(run_dir, render)  # private copies (e.g. float64 operators) stay for --resume
    for stage in plan:
        finish = getattr(stages_registry.get(stage).load(), "finish", None)
        if finish is not None:
            finish(run_dir)
    return run_dir.root


def lens_readout(root: str | Path, prompt: str, *, layer: int | None = None, top_k: int = 5,
                 model: str | None = None, loaded: LoadedModel | None = None) -> pd.DataFrame:
    """The readout of ``prompt`` through the Jacobian lens of the run in ``root``
    (:func:`depthlens.lens.readout.readout`): ``prompt`` and the readout columns. What
    :meth:`depthlens.api.Run.readout` returns.

    ``loaded`` is the run's model when the caller holds it (else it is loaded as the run loaded
    it); a run made from a lens file alone (``depthlens lens --from``) reads through ``model``.

    Raises
    ------
    RunError
        ``root`` has no lens, or was made from a lens file and ``model`` is not given.
    InputError
        A layer the lens has no matrix for, or a lens of another model's width.
    """
    from .data import prompt_ids
    from .lens import read_transport
    from .lens.readout import readout

    manifest = read_manifest(root)
    source = manifest.get("lens_from")
    path = Path(source["file"]) if source else Path(root) / "arrays" / "lens.pt"
    if not path.is_file():
        raise RunError(f"the run in {root} has no Jacobian lens ({path} is missing); fit one with depthlens lens.")
    if source:
        if model is None:
            raise RunError(f"the run in {root} analysed a lens file alone; pass the model it was fitted on "
                           "(model=SPEC, or --model).")
        loaded = load_model(model)
    elif loaded is None:
        loaded = prepare(RunConfig(**(manifest.get("config") or {}))).loaded
    ids = prompt_ids(prompt, loaded.tokenizer)
    table = readout(loaded.adapter, read_transport(path), ids, layers=None if layer is None else [layer],
                    top_k=top_k, decode=lambda t: loaded.tokenizer.decode([t]))
    table.insert(0, "prompt", prompt)
    return table


def record_readout(root: str | Path, prompt: str, *, top_k: int = 5, model: str | None = None) -> Path:
    """``depthlens lens --readout PROMPT``: :func:`lens_readout` written as the run's ``readout``
    table (replacing an earlier prompt's) with the run's identity columns. Returns its path.

    Raises
    ------
    RunError, InputError
        As :func:`lens_readout`.
    """
    from .schema import conform_table

    table = lens_readout(root, prompt, top_k=top_k, model=model)
    ident = pd.read_parquet(Path(root) / "tables" / "transport.parquet")[["model", "revision", "text"]].iloc[0]
    run_dir = RunDirectory(Path(root), read_manifest(root))
    return run_dir.write_table("readout", conform_table("readout", with_identity(table, ident.to_dict())))


def analyse_transport_file(path: str | Path, out: str | Path, run_mode: RunMode = RunMode.NEW,
                           execution: Execution = Execution()) -> Path:
    """``depthlens lens --from FILE``: the ``transport`` table of a Jacobian-lens artifact
    (a published lens, or one TransformerLens or depthlens fitted), with no model loaded, in the
    run directory ``out``. The identity columns come from the artifact's ``metadata``
    (``model``, ``revision``, ``text``; the file's path for a model it does not name).

    Raises
    ------
    InputError
        ``path`` is not an artifact :func:`depthlens.lens.read_transport` reads (nothing is
        written).
    RunError
        ``out`` does not suit ``run_mode``.
    """
    from .lens import read_transport, transport_table
    from .schema import conform_table

    lens = read_transport(path)  # refused before anything is written
    source = {"file": str(Path(path).resolve()), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
    digest = source["sha256"][:16]
    check_target(out, run_mode, digest, {"lens_from": source})
    run_dir = RunDirectory.open(out, run_mode, {"kind": "lens", "lens_from": source, "config_hash": digest,
                                                "model": {"source": "artifact", **lens.metadata},
                                                **provenance(execution.command)})
    if run_dir.manifest.get("stages", {}).get("lens", {}).get("status") != "done":
        run_dir.mark_stage("lens", "running")
        start = time.perf_counter()
        metrics, _ = transport_table(lens, progress=not execution.quiet)
        ident = {"model": str(lens.metadata.get("model_name") or lens.metadata.get("model") or source["file"]),
                 "revision": str(lens.metadata.get("revision") or ""), "text": str(lens.metadata.get("text") or "")}
        run_dir.write_table("transport", conform_table("transport", with_identity(metrics.assign(n_prompts=lens.n_prompts),
                                                                                  ident)))
        run_dir.mark_stage("lens", "done", seconds=round(time.perf_counter() - start, 3))
    conclude(run_dir, None)
    return run_dir.root


def conclude(run_dir: RunDirectory, render: Callable[[], object] | None) -> None:
    """The end that every run shares, a run of stages as a census or a sweep
    (:func:`depthlens.collection.close_collection`): once all its work was tried, render the
    report (``render``, when given), then say what did not finish.

    Raises
    ------
    RunIncomplete
        When any unit, stage or member failed (:attr:`RunDirectory.failures`), after the report.
    """
    if render is not None:
        render()
    if run_dir.failures.failures:
        raise RunIncomplete(run_dir.root, run_dir.failures.failures)


def claims_registration(claims: str | Path | None) -> tuple[bytes, dict]:
    """The bytes of the claims file ``claims`` (default: the packaged one), validated, and the
    manifest's record of it (``file``: the run's copy, ``source``, ``sha256``).

    Raises
    ------
    InputError
        A missing or malformed claims file.
    """
    path = Path(claims) if claims is not None else default_claims_path()
    load_claims(path)
    data = path.read_bytes()
    return data, {"file": CLAIMS_COPY, "source": str(path.resolve()), "sha256": hashlib.sha256(data).hexdigest()}


def register_claims(run_dir: RunDirectory, claims_bytes: bytes) -> None:
    """Copy the registered claims file into the run (``RUN/claims.toml``) unless it is there.

    A new or overwritten run registers ``claims_bytes`` (their hash is in its manifest). A
    resumed run keeps the copy it has; one from before copies existed gets a copy only when
    the bytes match the hash its manifest registered.
    """
    copy = run_dir.root / CLAIMS_COPY
    if copy.is_file():
        return
    record = run_dir.manifest.get("claims")
    if isinstance(record, dict) and record.get("sha256") == hashlib.sha256(claims_bytes).hexdigest():
        atomic.write_bytes(copy, claims_bytes)


def _run_stage(run_dir: RunDirectory, stage: str, prepared: Prepared, execution: Execution) -> None:
    """Run one stage with failure isolation and record its status in the manifest."""
    spec = stages_registry.get(stage)
    blocked = [need for need in spec.needs(prepared.config) if run_dir.manifest["stages"].get(need, {}).get("status") != "done"]
    if blocked:
        run_dir.mark_stage(stage, "skipped", reason=f"needs the {blocked[0]} stage, which did not finish")
        return
    run_dir.mark_stage(stage, "running")
    start = time.perf_counter()
    context = StageContext(stage, run_dir, prepared.config, prepared.loaded, prepared.chunks, execution,
                           _revision_loader(prepared.config))
    try:
        spec.load().run(context)
    except Exception as exc:  # noqa: BLE001 - isolated: logged with its traceback, the run goes on
        stop = fatal(exc)
        if stop is not None:  # a full disk or read-only file system stops the whole run
            raise _stopped(run_dir, stage, stop) from exc
        failure = run_dir.failures.record(stage, None, exc)
        run_dir.mark_stage(stage, "failed", error=failure.error, log=str(failure.log))
        return
    except BaseException:
        run_dir.mark_stage(stage, "interrupted")  # Ctrl-C or SIGTERM: nothing failed, --resume continues
        raise
    failed = run_dir.failures.of(stage)
    seconds = round(time.perf_counter() - start, 3)  # this session's wall time (a resumed stage: the rest only)
    if failed:
        run_dir.mark_stage(stage, "failed", error=f"{len(failed)} unit(s) failed", log=str(failed[0].log),
                           failed_units={f.unit: f.error for f in failed}, seconds=seconds)
    else:
        run_dir.mark_stage(stage, "done", seconds=seconds)


def _stopped(run_dir: RunDirectory, stage: str, error: StorageError) -> StorageError:
    """Record in the manifest that ``stage`` stopped on ``error`` (a full disk, a read-only file
    system), best effort, and return the one-line error that ends the run. Finished units stay
    and no traceback is logged (the log could not be written either); ``--resume`` continues."""
    try:
        run_dir.mark_stage(stage, "failed", error=error.reason, detail=str(error))
    except (StorageError, OSError) as exc:  # the manifest cannot be written either: say so
        return StorageError(f"{error} The manifest still says the {stage} stage is running "
                            f"(it could not be updated: {getattr(exc, 'reason', '') or exc}).",
                            error.reason, error.path)
    return error


def _revision_loader(cfg: RunConfig) -> Callable[[str], LoadedModel]:
    def load_revision(revision: str) -> LoadedModel:
        loaded = load_model(cfg.model, revision=revision, dtype=cfg.dtype, device=cfg.device,
                            trust_remote_code=cfg.trust_remote_code, seed=cfg.seed, stream_layers=cfg.stream_layers)
        check_finite_weights(loaded.model, f"{loaded.name}@{revision}")
        return loaded

    return load_revision


_KINDS = {"embedded": "an embedded model", "random": "a random model", "gguf": "a .gguf file", "local": "a local folder",
          "memory": "a model in memory"}


def check_plan(config: RunConfig, stages: Sequence[str], in_memory: bool = False) -> list[str]:
    """Check the whole plan before any model loads and return it: ``stages`` with the stages
    they need put first and the follow-ups the configuration asks for last
    (:func:`depthlens.stages.plan`: the census tables of a run with ``--revisions``). Every stage of the plan
    checks its sizes against the configuration (its module's ``check``), a ``random:`` spec and
    a prompts file are parsed, and ``--revision``/``--revisions`` are refused for a model that is neither a hub id
    nor a checkpoint series (an in-memory model, ``in_memory``, has no revisions either).

    Raises
    ------
    InputError
        One line naming the flag and the value that works, or an unknown stage.
    ModelError
        A ``random:`` spec with unknown keys or values its configuration rejects.
    DataError
        A malformed prompts file (:func:`depthlens.data.load_prompts`).
    """
    plan = stages_registry.plan(list(stages), config)
    source = "memory" if in_memory else check_spec(config.model)  # a path that is not there: refused now
    if source in _KINDS and not (source == "local" and series_checkpoints(config.model)):  # a series has revisions
        what = f"--model {config.model!r} is {_KINDS[source]}"
        if config.revision:
            raise InputError(f"--revision {config.revision!r} only applies to hub ids, and {what}; drop --revision.")
        if config.revisions:
            raise InputError(f"--revisions {','.join(config.revisions)} only applies to hub ids, and {what}; "
                             "drop --revisions (the jacobian stage analyses the step-0 null with --null init).")
    if config.revisions and not in_memory:
        _check_plain_revisions(config.revisions)
    if source == "random":
        random_spec(config.model.strip(), config.stream_layers)  # unknown keys, bad values: one line
    if config.prompts:
        data.load_prompts(config.text)  # a malformed prompts file: one line, before the model loads
    for stage in plan:
        stages_registry.get(stage).load().check(config)
    return plan


def _check_plain_revisions(revisions: Sequence[str]) -> None:
    """Refuse a range or ``@FILE`` in a run's ``--revisions``: a run takes the names as they are
    (``depthlens census`` expands them), so ``step{0..2000..1000}`` would be looked up as a
    revision name and fail only when its checkpoint loads."""
    from .revisions import expand_revisions

    if list(revisions) != expand_revisions(revisions):  # also refuses a malformed range in one line
        shown = next(r for r in revisions if r.startswith("@") or "{" in r)
        raise InputError(f"--revisions {shown!r} is a range or a file; a run takes plain comma-separated names "
                         "(e.g. --revisions step1000,step2000), and depthlens census expands ranges and @FILE.")


def source_version() -> dict[str, object]:
    """Which depthlens code ran: its version and, when it runs from a git checkout, the commit
    and whether the checkout had uncommitted changes (``dirty``); ``commit`` None elsewhere."""
    from . import __version__

    root = Path(__file__).resolve().parents[2]
    out: dict[str, object] = {"version": __version__, "commit": None, "dirty": None}
    if not (root / ".git").exists():
        return out
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return out
    return {**out, "commit": commit or None, "dirty": bool(status.strip())}


def package_versions() -> dict[str, str]:
    """The installed version of every package a run's numbers depend on (``absent`` when not installed)."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    return out
