"""``depthlens census``: the chosen stages over every checkpoint of a series, one checkpoint at
a time, each an ordinary run directory under ``OUT/checkpoints/SERIES/CHECKPOINT``.

Layout of a census directory (itself a depthlens run directory: manifest, index, ``--resume``
and ``--overwrite`` as for a run)::

    OUT/manifest.json            the census configuration, its series and checkpoints
    OUT/checkpoints/S/C/         one run per checkpoint (every table of its stages)
    OUT/tables/census.parquet    one row per checkpoint: status, loss, funnel, coupling counts
    OUT/tables/census_heads.parquet  one row per (checkpoint, head): roles, scores, TR, Δ_TR, q
    OUT/report.html              census claims (C1–C3), figures, the series comparison

A checkpoint that cannot be loaded or analysed is recorded (``status`` ``failed`` with its
one-line error, the traceback in ``logs/census.log``), announced in one line, and skipped; the
census goes on, and ends with :class:`~depthlens.errors.RunIncomplete` naming every failed or
incomplete checkpoint once the tables and the report are written (exit 3 on the command line). A finished checkpoint is a unit of the census: ``--resume`` skips it, and
resumes a checkpoint's own run where it stopped.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch

from ..collection import Member, close_collection, open_collection, visit
from ..config import RunConfig
from ..executors import Execution
from ..data import Chunks, as_chunks
from ..errors import DepthlensError, InputError
from ..models import LoadedModel, load_model
from ..models.finite import check_finite_weights
from ..models.local import declared_context
from ..runs.tables import RunTables
from ..runs import RunDirectory, RunMode
from ..runs.directory import read_manifest
from .options import CensusOptions
from ..revisions import Checkpoint, label_of, resolve_series
from ..report.census_tables import Point, census_tables

__all__ = ["STAGE", "census_hash", "mean_loss", "run_census"]

STAGE = "census"
KIND = "census"


def mean_loss(loaded: LoadedModel, token_ids: torch.Tensor | Chunks, batch_size: int) -> float:
    """Mean next-token cross-entropy of ``loaded`` on ``token_ids`` (nats per predicted token):
    the model's own logits, ``log_softmax`` in float64, every position but the last of every
    chunk predicting the next token (exact to float64 rounding of the logits given). Prompts of
    their own lengths (:class:`~depthlens.data.Chunks`) count their predictions at analysed
    positions inside them only."""
    chunks = as_chunks(token_ids)
    if chunks.ragged:
        return _prompts_loss(loaded, chunks, batch_size)
    token_ids = chunks.ids
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, token_ids.shape[0], batch_size):
            ids = token_ids[start : start + batch_size]
            logp = torch.log_softmax(loaded.adapter.logits(ids)[:, :-1].to(torch.float64), dim=-1)
            picked = logp.gather(-1, ids[:, 1:].unsqueeze(-1).to(logp.device)).squeeze(-1)
            total -= float(picked.sum())
            count += picked.numel()
    return total / count if count else math.nan


def _prompts_loss(loaded: LoadedModel, chunks: Chunks, batch_size: int) -> float:
    """:func:`mean_loss` over the counted predictions of prompts (:meth:`Chunks.predicted`)."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(chunks), batch_size):
            batch = chunks.take(slice(start, start + batch_size))
            logits = loaded.adapter.logits(batch.ids)
            for b, counted in enumerate(batch.predicted()):
                t = torch.from_numpy(np.flatnonzero(counted))
                logp = torch.log_softmax(logits[b, t.to(logits.device)].to(torch.float64), dim=-1)
                total -= float(logp.gather(-1, batch.ids[b, t + 1, None].to(logp.device)).sum())
                count += int(t.numel())
    return total / count if count else math.nan


def norm_kind(loaded: LoadedModel) -> str:
    """``RMSNorm`` or ``LayerNorm``: the kind of normalisation the model's layers use (from
    its modules' class names), else the first norm class found, or ``unknown``."""
    names = [type(m).__name__ for m in loaded.model.modules() if type(m).__name__.lower().endswith("norm")]
    for kind in ("RMSNorm", "LayerNorm"):
        if any(name.endswith(kind) for name in names):
            return kind
    return names[0] if names else "unknown"


def census_hash(config: RunConfig, options: CensusOptions) -> str:
    """A short stable hash of a census configuration (16 hex digits of SHA-256)."""
    blob = json.dumps({"run": config.to_dict(), "census": dataclasses.asdict(options)}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _series(config: RunConfig, options: CensusOptions) -> dict[str, list[Checkpoint]]:
    """Every series of the census (``--model``, ``--replicates``, then ``--compare``), resolved.

    Raises
    ------
    InputError
        ``--model`` itself in ``--replicates`` or ``--compare``, or a replicate whose
        checkpoint steps differ from ``--model``'s (the claims pool replicates checkpoint by
        checkpoint).
    """
    for flag, specs in (("--replicates", options.replicates), ("--compare", options.compare)):
        if config.model in specs:
            raise InputError(f"{flag} lists --model {config.model} itself; the census always analyses --model (it is "
                             f"replicate 0), so pass only the other series to {flag}.")
    out: dict[str, list[Checkpoint]] = {}
    for spec in (config.model, *options.replicates, *options.compare):
        local = Path(spec).expanduser().is_dir()
        own = local and spec != config.model and spec not in options.replicates
        out[spec] = resolve_series(spec, () if own else config.revisions)
    steps = [c.step for c in out[config.model]]
    for spec in options.replicates:
        if [c.step for c in out[spec]] != steps:
            raise InputError(f"--replicates {spec} has checkpoints at steps {[c.step for c in out[spec]]}, --model "
                             f"{config.model} at {steps}; pass series trained with the same options and another "
                             "--seed.")
    return out


def _replicate(spec: str, config: RunConfig, options: CensusOptions) -> int:
    """0 for ``--model``, k for the k-th of ``--replicates``, −1 for a ``--compare`` series."""
    if spec == config.model:
        return 0
    return options.replicates.index(spec) + 1 if spec in options.replicates else -1


def _folders(series: dict[str, list[Checkpoint]]) -> dict[str, str]:
    """A distinct folder name per series, from its folder or hub name."""
    names: dict[str, str] = {}
    for spec in series:
        base = label_of(Path(spec).name or spec.replace("/", "_"))
        name, k = base, 2
        while name in names.values():
            name, k = f"{base}-{k}", k + 1
        names[spec] = name
    return names


def _point_config(config: RunConfig, ckpt: Checkpoint, with_null: bool) -> RunConfig:
    """The run configuration of one checkpoint: the census's, on that checkpoint, without
    revisions, and with the step-0 null only where the series has no step-0 checkpoint."""
    values = dict(config.items())
    values.update(model=ckpt.spec, revision=ckpt.revision, revisions=(),
                  null=values["null"] if with_null else "none")
    return RunConfig(preset=config.preset, **values)


def _configs(config: RunConfig, series: dict[str, list[Checkpoint]]) -> dict[tuple[str, str], RunConfig]:
    out = {}
    for spec, ckpts in series.items():
        has_step0 = any(c.step == 0 for c in ckpts)
        for k, ckpt in enumerate(ckpts):
            out[(spec, ckpt.label)] = _point_config(config, ckpt, with_null=k == 0 and not has_step0)
    return out


def _check_local_series(series: dict[str, list[Checkpoint]], configs: dict[tuple[str, str], RunConfig],
                        plan: list[str]) -> None:
    """Refuse, before anything is written, inputs longer than the context that a local
    series' checkpoints declare (:func:`depthlens.workflow.check_context`); a hub series is
    checked as each checkpoint loads."""
    from ..workflow import check_context

    for spec, ckpts in series.items():
        for ckpt in ckpts:
            if Path(spec).expanduser().is_dir() and ckpt.revision:
                folder, name = Path(spec).expanduser() / ckpt.revision, f"{spec} {ckpt.revision}"
                check_context(configs[(spec, ckpt.label)], plan, declared_context(folder), name)


def run_census(config: RunConfig, options: CensusOptions, out: str | Path, run_mode: RunMode = RunMode.NEW,
               execution: Execution = Execution(), delete_cache: bool = False,
               claims: str | Path | None = None) -> Path:
    """Run the census of ``config.model`` (with ``options.replicates`` and ``options.compare``)
    into ``out``; return its path.

    Every input is checked before anything is written: the series resolve, every stage's
    sizes pass (:func:`depthlens.workflow.check_plan` on the first checkpoint's
    configuration), the executor is usable (:func:`depthlens.executors.check_execution`), and
    ``out`` suits ``run_mode``. Then each checkpoint runs as its own run
    (:func:`depthlens.workflow.run`, with the model loaded once for it and its loss), the
    census tables are written and the report rendered.

    Parameters
    ----------
    delete_cache : bool
        Remove each hub revision from the local Hugging Face cache once analysed (local
        series are never touched).
    claims : str or Path, optional
        The claims file (default: the packaged one), registered with the census as with a run
        (its copy ``OUT/claims.toml`` scores the census claims C1–C3).

    Raises
    ------
    DepthlensError
        Bad input, before anything is written.
    StorageError
        A full disk or read-only file system (the census stops; ``--resume`` continues).
    RunIncomplete
        After the tables and the report are written, when any checkpoint failed or is
        incomplete (one failure per checkpoint; ``--resume`` retries them).
    """
    from ..report.html import render_report
    from ..executors import check_execution
    from ..workflow import check_plan, claims_registration, register_claims

    claims_bytes, claims_record = claims_registration(claims)
    series = _series(config, options)
    configs = _configs(config, series)
    plan = check_plan(next(iter(configs.values())), options.census_stages)
    _check_local_series(series, configs, plan)
    check_execution(execution)
    folders = _folders(series)
    identity = {"config": config.to_dict(), "census": dataclasses.asdict(options)}
    manifest = {**identity, "plan": plan, "claims": claims_record,
                "series": {spec: {"folder": folders[spec], "checkpoints": [dataclasses.asdict(c) for c in ckpts]}
                           for spec, ckpts in series.items()}}
    run_dir = open_collection(KIND, out, run_mode, census_hash(config, options), manifest,
                              member_folders=_checkpoint_folders, command=execution.command, identity=identity)
    register_claims(run_dir, claims_bytes)
    points: list[Point] = []
    total = sum(len(c) for c in series.values())
    for spec, ckpts in series.items():
        for ckpt in ckpts:
            execution.say(f"census: {folders[spec]} {ckpt.label} ({len(points) + 1}/{total})")
            point = _visit(run_dir, spec, folders[spec], ckpt, configs[(spec, ckpt.label)], plan, execution,
                           delete_cache)
            points.append(dataclasses.replace(point, replicate=_replicate(spec, config, options)))
    not_done = {p.checkpoint: p.error for p in points if p.status != "done"}
    return close_collection(run_dir, STAGE, census_tables(points, config.text), not_done,
                            lambda: render_report(run_dir.root, claims_path=claims))


def _checkpoint_folders(root: Path) -> list[Path]:
    """The folders that hold the checkpoint runs of the census at ``root`` (from its
    manifest; none when it cannot be read)."""
    try:
        series = read_manifest(root).get("series") or {}
    except DepthlensError:
        return []
    return [root / "checkpoints" / str(info.get("folder", "")) for info in series.values()]


def _visit(run_dir: RunDirectory, spec: str, folder: str, ckpt: Checkpoint, config: RunConfig, plan: list[str],
           execution: Execution, delete_cache: bool) -> Point:
    """Analyse one checkpoint (or take its finished unit) and return its census point."""
    from ..workflow import prepare, run

    sub = run_dir.root / "checkpoints" / folder / ckpt.label
    point = Point(spec, ckpt.label, ckpt.spec, ckpt.revision or "", math.nan if ckpt.step is None else float(ckpt.step))

    def work(mode: RunMode, record: dict) -> None:
        loaded = None
        try:
            loaded = load_model(ckpt.spec, revision=ckpt.revision, dtype=config.dtype, device=config.device,
                                trust_remote_code=config.trust_remote_code, seed=config.seed,
                                stream_layers=config.stream_layers)
            check_finite_weights(loaded.model, f"{loaded.name}@{ckpt.revision}")
            prepared = prepare(config, loaded, plan)
            record.update(loss=mean_loss(loaded, prepared.chunks, config.batch_size), family=loaded.adapter.family,
                          norm=norm_kind(loaded))
            run(config, sub, run_mode=mode, stages=plan, execution=execution, loaded=loaded)
        finally:
            del loaded
            gc.collect()
            if delete_cache and ckpt.revision and not Path(ckpt.spec).expanduser().is_dir():
                from .cache import delete_cached_revision

                freed = delete_cached_revision(ckpt.spec, ckpt.revision)
                execution.say(f"census: removed {ckpt.spec}@{ckpt.revision} from the hub cache ({freed / 1e6:.1f} MB)")

    outcome = visit(run_dir, STAGE, Member(f"point_{folder}_{ckpt.label}", ckpt.label, f"{folder} {ckpt.label}", sub),
                    work, execution.say)
    if outcome.status == "failed":
        return dataclasses.replace(point, status="failed", error=outcome.error)
    record = outcome.record
    return dataclasses.replace(point, status=outcome.status, error=outcome.error, loss=float(record["loss"]),
                               tables=RunTables(sub), family=str(record["family"]), norm=str(record["norm"]))
