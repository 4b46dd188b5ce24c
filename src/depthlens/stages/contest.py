"""The ``contest`` stage (docs/methods.md#a7): which per-head feature family predicts what a head does.

Two phases, each in resumable units:

1. ``features<k>``: one batch of the first ``contest_chunks`` chunks (``batch_size`` chunks a
   unit). Every layer's attention of the batch is held at once (the depth persistence runs over
   depth: ``L·H·n²`` float64 per chunk, 35 MB for SmolLM2 at n = 128); each chunk's pattern,
   eigenvalue and norm features, its induction mass (from the chunk's token ids) and its
   persistence (:mod:`depthlens.contest.features`) are computed by the workers. A prompt's
   matrices (a prompts file) are trimmed to its length; its row averages (``mean_distance``,
   ``max_weight``, ``induction_mass``) are over its analysed positions. The per-head table ``contest_features`` is the median over chunks
   (of logs for the scale quantities ``fro_B`` and ``sigma2_B``, docs/methods.md#a3).
2. ``cv_<target>``: the contest of one target (:func:`depthlens.contest.cv.contest_target`)
   over the features of ``heads`` (attention stage) and ``contest_features``. The table
   ``contest`` gets BH q-values over all its rows.

Targets: ``persistence`` (``contest_features``), ``routing`` (``heads.role == "routing"``),
``criticality`` (``ablation`` of the ablate stage, method ``mean``). A missing source table is
refused before any work (:func:`check_sources`); a routing target with one class is skipped with
a warning line (no rows). Feature columns that are absent or all NaN are dropped with a warning
line naming them. Messages go to the ``depthlens.stages.contest`` logger.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..contest import cv
from ..contest.features import (
    HEAD_FEATURES,
    SCALE_FEATURES,
    head_features,
    induction_mass,
    persistence,
)
from ..contest.options import CONTEST_TARGETS, ContestOptions
from ..data import Chunks, as_chunks
from ..errors import InputError, require_at_least
from ..executors.local import executor
from ..runs import RunDirectory
from ..schema import trained_rows
from ..stats import log_median
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["STAGE", "aggregate_features", "check", "check_sources", "chunk_features", "contest_table", "run"]

STAGE = "contest"
#: Smallest chunk the stage handles: the features need (n, n) attention with n >= 2.
MIN_SEQ_LEN = 2
#: Seed tag of the contest's random streams: ``SeedSequence([seed, SEED_TAG, target index, purpose])``.
SEED_TAG = 7
#: Per-head columns of ``contest_features`` (the per-chunk units add ``chunk``).
FEATURE_COLUMNS = (*HEAD_FEATURES, "induction_mass", "persistence")
#: Where each target comes from: (table, stage that writes it).
SOURCES = {"persistence": ("heads", "attention"), "routing": ("heads", "attention"), "criticality": ("ablation", "ablate")}
METRIC = {"persistence": "spearman", "routing": "auroc", "criticality": "spearman"}

_log = logging.getLogger(__name__)


def check(config: RunConfig) -> None:
    """Refuse sizes and options the stage cannot work with (before the model loads).
    ``contest_chunks`` above ``chunks`` simply means every chunk.

    Raises
    ------
    InputError
        ``--seq-len`` below 2, or the criticality target without the mean ablation.
    """
    require_at_least("--seq-len", config.seq_len, MIN_SEQ_LEN, STAGE)
    if "criticality" in config.options(STAGE).contest_targets and "mean" not in config.options("ablate").ablation_methods:
        raise InputError("the contest target criticality is the mean-ablation ΔCE; add mean to --ablation-methods "
                         "or drop criticality from --contest-targets.")


def check_sources(run_dir: RunDirectory, targets: tuple[str, ...]) -> None:
    """Refuse targets whose source table the run does not have (before any work).

    Raises
    ------
    InputError
        One line naming the missing table, the stage that writes it and the target to drop.
    """
    for target in ("persistence", *targets):  # the features always come from heads
        table, stage = SOURCES[target]
        if not (run_dir.root / "tables" / f"{table}.parquet").is_file():
            if stage == "attention":
                raise InputError(f"the contest needs tables/{table}.parquet of the {stage} stage, which {run_dir.root} "
                                 f"does not have; run the {stage} stage first.")
            raise InputError(f"the contest target {target} needs tables/{table}.parquet of the {stage} stage, which "
                             f"{run_dir.root} does not have; run the {stage} stage first or drop {target} from "
                             "--contest-targets.")


def run(context: StageContext) -> None:
    """Check the sources, compute the features (skipping finished units), run the contest of
    every target and write ``contest_features`` and ``contest``."""
    opts: ContestOptions = context.options
    run_dir = context.run_dir
    check_sources(run_dir, opts.contest_targets)
    n_layers = context.loaded.adapter.n_layers
    if n_layers < 2:
        raise InputError(f"the contest cross-validates by layer and {context.loaded.name} has {n_layers} layer; "
                         "use a model with at least 2 layers.")
    ablation = None
    if "criticality" in opts.contest_targets:
        ablation = run_dir.read_table("ablation")
        if not (ablation["method"] == "mean").any():
            raise InputError("tables/ablation.parquet has no mean-ablation rows; rerun the ablate stage with mean in "
                             "--ablation-methods or drop criticality from --contest-targets.")
    heads = trained_rows(run_dir.read_table("heads"))  # the model as loaded, whose features are computed here
    n_chunks = min(opts.contest_chunks, len(context.chunks))
    with executor(context.execution, context.run_dir.root) as pool, torch.inference_mode():
        chunks = _features_phase(run_dir, context.loaded.adapter, context.chunks.take(slice(0, n_chunks)), pool,
                                 context.config.batch_size, context.execution.quiet)
    features = aggregate_features(chunks)
    context.write_table("contest_features", features)
    context.write_table("contest", contest_table(heads, features, ablation, opts, run_dir))


# ----------------------------------------------------------------------------- features
def chunk_features(A: np.ndarray, tokens: np.ndarray, chunk: int, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Every head's features and persistence in one chunk: ``A`` is (L, H, n, n), every layer's
    attention of the chunk, ``tokens`` (n,) its token ids, ``rows`` its analysed positions (a
    bool mask of the n; default every one). One row per (layer, head) with ``chunk`` and
    :data:`FEATURE_COLUMNS`."""
    n_layers, n_heads = A.shape[:2]
    values = head_features(A, rows)
    table = pd.DataFrame({"layer": np.repeat(np.arange(n_layers), n_heads), "head": np.tile(np.arange(n_heads), n_layers),
                          "chunk": chunk})
    for name in HEAD_FEATURES:
        table[name] = values[name].reshape(-1)
    table["induction_mass"] = induction_mass(A, tokens, rows).reshape(-1)
    table["persistence"] = persistence(A).reshape(-1)
    return table


def _features_phase(run_dir: RunDirectory, adapter, token_ids: torch.Tensor | Chunks, pool, batch_size: int,
                    quiet: bool) -> pd.DataFrame:
    token_ids = as_chunks(token_ids)
    starts = list(range(0, len(token_ids), batch_size))
    keys = [f"features{s // batch_size:05d}" for s in starts]
    todo = run_dir.pending(STAGE, zip(keys, starts))
    bar = tqdm(total=len(keys), initial=len(keys) - len(todo), desc="contest features", unit="unit", disable=quiet)
    for key, start in todo:
        with run_dir.failures.unit(STAGE, key):
            batch = token_ids.take(slice(start, start + batch_size))
            probs = np.stack([p.cpu().numpy() for _, p in adapter.attention_probs(batch.ids)], axis=1)  # (B, L, H, n, n)
            ids = batch.ids.cpu().numpy()
            if batch.ragged:  # each chunk's own matrices and tokens, its analysed rows
                n = [int(length) for length in batch.lengths]
                futures = [pool.submit(chunk_features, np.ascontiguousarray(probs[i, ..., : n[i], : n[i]]), ids[i, : n[i]],
                                       start + i, batch.rows(i)) for i in range(probs.shape[0])]
            else:
                futures = [pool.submit(chunk_features, probs[i], ids[i], start + i) for i in range(probs.shape[0])]
            del probs
            run_dir.write_unit(STAGE, key, {"rows": pd.concat([f.result() for f in futures], ignore_index=True)})
        bar.update()
    bar.close()
    return run_dir.read_units(STAGE, run_dir.finished(STAGE, keys, required=True), "rows")


def _aggregate(col: str, values: np.ndarray) -> float:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return np.nan
    if col in SCALE_FEATURES and np.all(v > 0):
        return log_median(v)
    return float(np.median(v))


def aggregate_features(chunks: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, head): the median over chunks (NaN dropped) of every feature, of
    logs for :data:`~depthlens.contest.features.SCALE_FEATURES` (plain when a value is ≤ 0)."""
    groups = chunks.groupby(["layer", "head"], sort=True)
    out = groups.size().reset_index()[["layer", "head"]]
    for col in FEATURE_COLUMNS:
        out[col] = groups[col].apply(lambda g, c=col: _aggregate(c, g.to_numpy(dtype=np.float64))).to_numpy()
    return out


# ----------------------------------------------------------------------------- contest
def _targets(heads: pd.DataFrame, features: pd.DataFrame, ablation: pd.DataFrame | None) -> pd.DataFrame:
    keys = ["layer", "head"]
    table = heads[keys].copy()
    table["routing"] = (heads["role"] == "routing").astype(np.float64).where(heads["role"].notna())
    table = table.merge(features[[*keys, "persistence"]], on=keys, how="left")
    if ablation is not None:
        mean = ablation.loc[ablation["method"] == "mean", [*keys, "criticality"]]
        table = table.merge(mean, on=keys, how="left")
    for col in ("persistence", "criticality"):
        if col in table:
            values = table[col].to_numpy(dtype=np.float64, copy=True)
            values[np.isinf(values)] = np.nan
            table[col] = values
    return table


def contest_table(heads: pd.DataFrame, features: pd.DataFrame, ablation: pd.DataFrame | None, opts: ContestOptions,
                  run_dir: RunDirectory | None = None) -> pd.DataFrame:
    """The ``contest`` table: :func:`~depthlens.contest.cv.contest_target` for every target of
    ``opts`` on the families of :data:`~depthlens.contest.cv.FEATURE_FAMILIES` (columns of ``heads`` and
    ``features``), with the target and BH q-values over every row. With ``run_dir`` each
    target is a resumable unit ``cv_<target>``."""
    keys = ["layer", "head"]
    heads = heads.sort_values(keys).reset_index(drop=True)
    own = [c for c in features.columns if c not in heads.columns or c in keys]
    table = heads.merge(features[own], on=keys, how="left")
    X, families, dropped = cv.clean_features(table)
    if dropped:
        _log.warning("contest: feature columns dropped: %s.",
                     ", ".join(f"{col} ({why})" for col, why in dropped.items()))
    targets = _targets(heads, features, ablation)
    parts = []
    for target in opts.contest_targets:
        key = f"cv_{target}"
        if run_dir is not None and run_dir.has_unit(STAGE, key):
            parts.append(run_dir.read_units(STAGE, [key], "rows"))
            continue
        y = targets[target].to_numpy(dtype=np.float64)
        known = ~np.isnan(y)
        if target == "routing" and np.unique(y[known]).size < 2:
            _log.warning("contest: target routing skipped: every head has %s (one class, no AUROC).",
                         "the routing role" if known.any() and y[known][0] == 1 else "a role other than routing")
            continue
        n_layers = np.unique(targets.loc[known, "layer"]).size
        if n_layers < 2:
            _log.warning("contest: target %s skipped: heads of %d layer(s) have it; cross-validation by layer needs 2.",
                         target, n_layers)
            continue
        rows = cv.contest_target(X, families, y, targets["layer"].to_numpy(), METRIC[target], folds=opts.contest_folds,
                                 n_boot=opts.contest_boot, n_perm=opts.contest_perm, seed=opts.seed,
                                 tag=(SEED_TAG, CONTEST_TARGETS.index(target)))
        rows.insert(0, "target", target)
        if run_dir is not None:
            run_dir.write_unit(STAGE, key, {"rows": rows})
        parts.append(rows)
    columns = ["target", *cv.COLUMNS]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return cv.with_qvalues(out)

