"""The ``attention`` stage over a model: runs the phases of
:mod:`depthlens.attention.analysis` as resumable units and writes ``heads.parquet``,
``head_chunks.parquet``, ``head_probe.parquet``, ``depth.parquet`` and ``attention.json``.

Checkpoints: the model as loaded (``trained``) and every extra hub revision of ``--revisions``,
each analysed alone by the same phases, one at a time (a revision is loaded when one of its
units has work to do, and released before the next). The tables hold every checkpoint's rows
(key ``checkpoint``); ``attention.json``, the pseudospectra arrays, the head explorer's
(``arrays/head_spectra.safetensors``, :func:`_explorer_phase`) and the chosen heads' attention
matrices (``arrays/attention_maps.safetensors``, :func:`_maps_phase`) are about the trained model.
Units: ``probe``, ``headsNNNNN``, ``certifyNNNNN``, ``induction`` and ``depthNNNNN`` for the
trained model, the same keys behind the prefix of :func:`unit_prefix` for a revision.

Forward passes: one per batch of ``--batch-size`` consecutive chunks in the heads phase; its
queries and keys are kept (up to :data:`CAPTURE_BUDGET` bytes, :class:`_Batches`) and the
certify, depth, pseudospectra and explorer phases form their matrices from them, so every phase
reads a chunk's matrices exactly as the heads phase's rows were computed (a batch beyond the
budget, or one a resumed run did not compute, is passed again, whole, with the same numbers).

Memory: besides the kept queries and keys, the attention matrices of one layer for one batch
of chunks are the most held at a time (each layer's matrices go to the worker pool and are
released before the next layer), except in the depth phase, whose products need every layer of
a chunk: there one batch's matrices of all layers are held (``L·H·n²`` float64 per chunk, 35 MB
for SmolLM2 at n = 128). The certify and explorer phases queue one matrix per head (its median
chunk) for the workers.

Prompts (a prompts file, :class:`depthlens.data.Chunks`): every matrix is trimmed to its
prompt's length, so it is the prompt's own operator (causal and row-stochastic); the A3 row
features (``sink_mass``, ``prev_weight``, ``row_entropy``) average over the prompt's analysed
positions, the operator quantities, nulls, certified brackets, depth products and
pseudospectra are those of the whole trimmed matrix. The probe and its control are the
stage's own sequences, as without prompts.
"""

from __future__ import annotations

import gc
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import data
from ..attention import analysis as an
from ..attention import head_view as hv
from ..attention.head_view import PSEUDO_GRID, PSEUDO_TOL
from ..attention.options import AttentionOptions
from ..attention.picks import chosen_heads, parse_head, top_heads
from ..attention.roles import assign_roles, probe_scores, role_overlap
from ..errors import InputError, require_at_least
from ..executors import Execution
from ..executors.local import AheadExecutor, executor, ordered_map
from ..linalg.causal import deflate
from ..linalg.pseudospectra import pseudospectrum
from ..runs import RunDirectory
from ..schema import TRAINED
from ..stats import aggregate_induction
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

PROBE_BATCH = 16
#: Matrices submitted to the workers and not yet finished, at most: the next layer's go out while
#: the last ones of this layer finish (no idle worker at a layer's end), and the matrices in
#: flight stay bounded (256 of 128 × 128 float64: 34 MB).
MAX_PENDING = 256
#: Bytes of the chunks' queries and keys the stage keeps after the heads phase for the later
#: phases (:class:`_Batches`; 377 MB for SmolLM2-135M's 32 chunks of 128 tokens); batches
#: beyond it are computed again.
CAPTURE_BUDGET = 1 << 30
# PSEUDO_GRID (the saved pseudospectra's axis) and PSEUDO_TOL (their σ_min tolerance) live in
# :mod:`depthlens.attention.head_view`, beside the head explorer's grid taken from them.
#: Smallest sizes the stage handles: attention matrices (n, n) with n >= 2 (the deflated
#: operator B is then at least 1 x 1), and a probe block of at least one token.
MIN_SEQ_LEN = 2
MIN_PROBE_LEN = 1
#: The array file of the chosen heads' attention matrices (:func:`_maps_phase`).
MAPS = "attention_maps"
#: Longest part of a revision's name kept in its unit keys (the hash tells revisions apart).
SLUG_LEN = 64


def check(config: RunConfig) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads).

    ``null_chunks`` and ``extras_chunks`` above ``chunks`` simply mean every chunk.

    Raises
    ------
    InputError
        Naming the flag (``--seq-len``, ``--probe-len``) and its minimum, or a ``--heads``
        item that is not ``LAYER.HEAD``.
    """
    require_at_least("--seq-len", config.seq_len, MIN_SEQ_LEN, an.STAGE)
    require_at_least("--probe-len", config.options(an.STAGE).probe_len, MIN_PROBE_LEN, an.STAGE)
    for text in config.options(an.STAGE).heads:
        parse_head(text)



def check_context(config: RunConfig, context: int, name: str) -> None:
    """Refuse an induction probe longer than the model's context (checked once the context of
    ``name`` is known, before anything is written): ``[BOS, r, r]`` has ``1 + 2·probe_len``
    positions.

    Raises
    ------
    InputError
        Naming ``--probe-len`` and the largest value that fits.
    """
    probe_len = config.options(an.STAGE).probe_len
    if 1 + 2 * probe_len > context:
        raise InputError(f"--probe-len {probe_len} makes the induction probe [BOS, r, r] {1 + 2 * probe_len} tokens "
                         f"long, beyond the context of {name} ({context} tokens); pass --probe-len "
                         f"{(context - 1) // 2} or less.")


def unit_prefix(checkpoint: str) -> str:
    """The prefix of a checkpoint's unit keys: none for ``trained`` (the keys of a run without
    revisions), ``rev-<name>-<hash>_`` for a revision, where ``<name>`` is the revision's name
    with every character other than a letter, digit, ``.``, ``_`` or ``-`` replaced by ``_``
    (at most :data:`SLUG_LEN` of them) and ``<hash>`` the first 8 hex digits of its SHA-256, so
    keys stay file names and two revisions never share one.

    Examples
    --------
    >>> unit_prefix("trained")
    ''
    >>> unit_prefix("refs/pr/1")
    'rev-refs_pr_1-da766fe4_'
    """
    if checkpoint == TRAINED:
        return ""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", checkpoint)[:SLUG_LEN]
    return f"rev-{slug}-{hashlib.sha256(checkpoint.encode()).hexdigest()[:8]}_"


class _OnDemand:
    """A checkpoint's model loaded by ``load()`` the first time one of its attributes is read
    (outside inference mode, as a model is loaded anywhere else), so a resumed run whose units
    of the checkpoint all finished never loads it.

    Parameters
    ----------
    load : callable
        ``() -> LoadedModel``.
    """

    def __init__(self, load: Callable[[], Any]) -> None:
        self._load = load
        self._loaded: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._loaded is None:
            with torch.inference_mode(False):
                self._loaded = self._load()
        return getattr(self._loaded, name)


class _Batches:
    """The chunks' queries and keys, one forward pass per batch of ``batch_size`` consecutive
    chunks (chunk ``c`` in the batch starting at ``c - c % batch_size``), kept in memory while
    their total stays within ``budget`` bytes, for the phases that read a chunk's matrices
    again after the heads phase (certify, depth, pseudospectra, explorer). A batch not kept is
    computed again, the same batch, so every phase and a resumed run see the same matrices, bit
    for bit, as the heads phase's rows.

    Parameters
    ----------
    loaded : LoadedModel or _OnDemand
        The checkpoint's model (read only when a batch is computed).
    token_ids : Chunks
    batch_size : int
    budget : int
        Bytes of captures kept (default :data:`CAPTURE_BUDGET`).
    """

    def __init__(self, loaded: Any, token_ids: data.Chunks, batch_size: int, budget: int | None = None) -> None:
        self.loaded, self.token_ids, self.batch_size = loaded, token_ids, batch_size
        self.budget = CAPTURE_BUDGET if budget is None else budget
        self.kept: dict[int, dict[int, Any]] = {}
        self.used = 0

    def captures(self, start: int, layers: list[int] | None = None) -> dict[int, Any]:
        """The captures of the batch at ``start`` for ``layers`` (default all): kept ones, or
        one forward pass (kept when it captured every layer and fits the budget)."""
        if start in self.kept:
            return self.kept[start]
        ids = self.token_ids.take(slice(start, start + self.batch_size)).ids
        found = self.loaded.adapter.qk_captures(ids, layers)
        size = sum(t.nbytes for pair in found.values() for t in pair if t is not None)
        if layers is None and self.used + size <= self.budget:
            self.kept[start], self.used = found, self.used + size
        return found

    def groups(self, chunks: Iterable[int]) -> list[tuple[int, list[int]]]:
        """``chunks`` (ascending) by the batch that holds them: ``(start, chunks)``."""
        out: dict[int, list[int]] = {}
        for c in sorted({int(c) for c in chunks}):
            out.setdefault(c - c % self.batch_size, []).append(c)
        return list(out.items())

    def matrices(self, start: int, layers: list[int] | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(layer, A)`` of the batch at ``start``, A (B, H, T, T) float64, one layer at a time."""
        captured = self.captures(start, layers)
        return ((layer, p.cpu().numpy()) for layer, p in self.loaded.adapter.probs_from_captures(captured, layers))

    def matrix(self, A: np.ndarray, start: int, chunk: int, head: int) -> np.ndarray:
        """Chunk ``chunk``'s matrix of ``head`` in its batch's ``A``, trimmed to its own length."""
        n = int(self.token_ids.lengths[chunk])
        return A[chunk - start, head, :n, :n].copy()


def run(context: StageContext) -> None:
    """Run every phase on the trained model, then on each revision of ``--revisions`` (skipping
    finished units; a revision that fails is recorded and the others go on) and write the
    stage's tables, every checkpoint's rows with its ``checkpoint`` and ``revision``, and
    ``attention.json``: the trained model's summary, with ``revisions`` holding each analysed
    revision's (the same keys, without ``options``)."""
    sizes = {"batch_size": context.config.batch_size, "execution": context.execution}
    tables, summary = analyse(context.run_dir, context.loaded, context.chunks, context.options, **sizes)
    parts = {name: [_labelled(context, TRAINED, table)] for name, table in tables.items()}
    summaries = {}
    for rev in context.config.revisions:
        result = _revision(context, rev, sizes)
        gc.collect()  # the revision's model holds reference cycles: free it before the next one loads
        if result is not None:
            for name, table in result[0].items():
                parts[name].append(_labelled(context, rev, table))
            summaries[rev] = {k: v for k, v in result[1].items() if k != "options"}
    for name, frames in parts.items():
        context.write_table(name, pd.concat(frames, ignore_index=True))
    if summaries:
        summary["revisions"] = summaries
    context.run_dir.write_json("attention", summary)


def _labelled(context: StageContext, checkpoint: str, table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the ``checkpoint`` and the ``revision`` of its weights in every row."""
    return table.assign(checkpoint=checkpoint, revision=context.revision_of(checkpoint))


def _revision(context: StageContext, rev: str, sizes: dict[str, Any]) -> tuple[dict[str, pd.DataFrame], dict] | None:
    """:func:`analyse` of revision ``rev``, loaded on demand; None when it failed (recorded as
    the unit named by its prefix)."""
    with context.run_dir.failures.unit(an.STAGE, unit_prefix(rev).rstrip("_")):
        model = _OnDemand(lambda: context.load_revision(rev))
        return analyse(context.run_dir, model, context.chunks, context.options, checkpoint=rev, **sizes)
    return None


def analyse(run_dir: RunDirectory, loaded, token_ids: torch.Tensor | data.Chunks, opts: AttentionOptions, *,
            batch_size: int, execution: Execution, checkpoint: str = TRAINED) -> tuple[dict[str, pd.DataFrame], dict]:
    """Run every phase of ``checkpoint`` on the model ``loaded`` (skipping finished units; the
    pseudospectra and head explorer arrays for the trained model only) and return the tables
    ``heads``, ``head_chunks``, ``head_probe``, ``induction_seqs``, ``depth`` and the JSON
    summary. ``loaded`` is read only where a unit has work to do (an :class:`_OnDemand` then
    loads); the numerical tasks go to the executor of ``execution``
    (:func:`depthlens.executors.local.executor`). ``token_ids`` are
    the chunks (:class:`depthlens.data.Chunks`, or a tensor of equal-length chunks): every
    matrix is that of its chunk alone, trimmed to the chunk's length, and the row features
    average over its analysed positions."""
    quiet = execution.quiet
    token_ids = data.as_chunks(token_ids)
    with executor(execution, run_dir.root) as pool, torch.inference_mode():
        probe = _probe_phase(run_dir, loaded, opts, pool, quiet, checkpoint)
        batches = _Batches(loaded, token_ids, batch_size)
        chunks = _heads_phase(run_dir, batches, opts, pool, quiet, checkpoint)
        heads = an.aggregate_heads(chunks).merge(probe, on=["layer", "head"], how="left")
        heads["role"] = assign_roles(heads["prev_token_score"], heads["induction_score"], heads["sink_mass"], opts.thresholds)
        heads["excess_sign"] = np.sign(heads["delta_TR1"]).map({1.0: "positive", -1.0: "negative", 0.0: "zero"})
        certified = _certify_phase(run_dir, batches, chunks, opts, pool, quiet, checkpoint)
        # a head's bracket is its certified chunk's (with --certify all, not a median over chunks)
        heads = heads.drop(columns=[c for c in certified.columns if c not in ("layer", "head") and c in heads])
        heads = heads.merge(certified, on=["layer", "head"], how="left")
        heads["kreiss_B_in_bracket"] = an.bracket_check(heads, chunks, opts.rtol)
        seqs = _induction_phase(run_dir, loaded, heads, opts, pool, quiet, checkpoint)
        heads = heads.merge(aggregate_induction(seqs), on=["layer", "head"], how="left")
        depth = _depth_phase(run_dir, batches, an.chain_heads(heads), opts, pool, quiet, checkpoint)
        if checkpoint == TRAINED:
            _pseudospectra_phase(run_dir, batches, heads, chunks)
            _explorer_phase(run_dir, batches, chunks, pool, quiet)
            _maps_phase(run_dir, batches, heads, chunks, opts.heads)
        del batches  # the kept captures
    summary = an.summarise(heads, depth)
    summary["role_overlap"] = role_overlap(heads["role"].to_numpy(), heads["delta_TR1"].to_numpy()).to_dict()
    summary["numerical_health"] = an.numerical_health(heads)
    summary["options"] = an.options_record(opts)
    return {"heads": heads, "head_chunks": chunks, "head_probe": probe, "induction_seqs": seqs, "depth": depth}, summary



def _bar(total: int, done: int, desc: str, quiet: bool) -> tqdm:
    return tqdm(total=total, initial=done, desc=desc, unit="unit", disable=quiet)


def _desc(phase: str, checkpoint: str) -> str:
    """A phase's progress bar: ``attention heads``, ``attention heads (revision R)``."""
    return f"attention {phase}" if checkpoint == TRAINED else f"attention {phase} (revision {checkpoint})"


# ----------------------------------------------------------------------------- phases
def _probe_phase(run_dir, loaded, opts, pool, quiet, checkpoint) -> pd.DataFrame:
    def compute() -> dict[str, pd.DataFrame]:
        adapter = loaded.adapter
        ids = data.repeated_random_tokens(loaded.tokenizer, opts.probe_seqs, opts.probe_len, seed=opts.seed)
        sums: dict[tuple[int, str], np.ndarray] = {}
        bar = tqdm(total=ids.shape[0], desc=_desc("probe", checkpoint), unit="seq", disable=quiet)
        for start in range(0, ids.shape[0], PROBE_BATCH):
            batch = ids[start : start + PROBE_BATCH]
            for layer, probs in adapter.attention_probs(batch):
                for name, value in probe_scores(probs.cpu().numpy(), opts.probe_len).items():
                    sums[(layer, name)] = sums.get((layer, name), 0.0) + value.sum(axis=0)
            bar.update(batch.shape[0])
        bar.close()
        rows = []
        for layer in range(adapter.n_layers):
            for head in range(adapter.n_heads):
                rows.append({"layer": layer, "head": head,
                             **{name: float(sums[(layer, name)][head] / ids.shape[0])
                                for name in ("prev_token_score", "duplicate_score", "induction_score")}})
        return {"probe": pd.DataFrame(rows)}

    return run_dir.unit(an.STAGE, f"{unit_prefix(checkpoint)}probe", compute)["probe"]


def _heads_phase(run_dir, batches: _Batches, opts, pool, quiet, checkpoint) -> pd.DataFrame:
    token_ids, batch_size = batches.token_ids, batches.batch_size
    starts = list(range(0, len(token_ids), batch_size))
    keys = [f"{unit_prefix(checkpoint)}heads{s // batch_size:05d}" for s in starts]
    todo = run_dir.pending(an.STAGE, zip(keys, starts))
    bar = _bar(len(keys), len(keys) - len(todo), _desc("heads", checkpoint), quiet)
    ragged = token_ids.ragged

    def task(A: np.ndarray, layer: int, b: int, h: int, start: int) -> tuple:
        """One matrix's task: with chunks of their own lengths, trimmed to its chunk's length and
        with the chunk's analysed rows."""
        c = start + b
        common = (layer, h, c, opts, c < opts.null_chunks, c < opts.extras_chunks, opts.certify == "all")
        if not ragged:
            return (A[b, h], *common)
        n = int(token_ids.lengths[c])
        return (np.ascontiguousarray(A[b, h, :n, :n]), *common, token_ids.rows(c))

    # the next unit's forward pass runs in a thread while the workers take this unit's matrices
    # (torch releases the GIL; no other thread runs the model during this phase); a stop does
    # not wait for it
    with AheadExecutor() as ahead:
        following = ahead.submit(batches.matrices, todo[0][1]) if todo else None
        for i, (key, start) in enumerate(todo):
            following, current = (ahead.submit(batches.matrices, todo[i + 1][1]) if i + 1 < len(todo) else None,
                                  following)
            with run_dir.failures.unit(an.STAGE, key):
                tasks = (task(A, layer, b, h, start)
                         for layer, A in current.result() for b in range(A.shape[0]) for h in range(A.shape[1]))
                rows = ordered_map(pool, an.head_chunk_row, tasks, max_pending=MAX_PENDING)
                run_dir.write_unit(an.STAGE, key, {"rows": pd.DataFrame(rows)})
            bar.update()
    bar.close()
    return run_dir.read_units(an.STAGE, run_dir.finished(an.STAGE, keys, required=True), "rows")


def _median_matrices(batches: _Batches, targets: pd.DataFrame, start: int,
                     group: list[int]) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """``(layer, head, chunk, A)`` for every row of ``targets`` (``layer``, ``head``, ``chunk``)
    whose chunk is in ``group`` (chunks of the batch at ``start``): the head's float64 matrix on
    that chunk, trimmed to the chunk's own length (a prompt's), from its batch's captures."""
    wanted = targets[targets["chunk"].isin(group)]
    for layer, A in batches.matrices(start, sorted(int(x) for x in wanted["layer"].unique())):
        for head, chunk in wanted.loc[wanted["layer"] == layer, ["head", "chunk"]].itertuples(index=False):
            yield int(layer), int(head), int(chunk), batches.matrix(A, start, int(chunk), int(head))


def _certify_phase(run_dir, batches: _Batches, chunks, opts, pool, quiet, checkpoint) -> pd.DataFrame:
    """Certified brackets of every head's median chunk. The target chunks are read by the batch
    that holds them (one unit each); every bracket is submitted as soon as its matrix is
    read, so the workers stay busy across batches and slow brackets do not stall a batch."""
    cols = ["kreiss_B_lo", "kreiss_B_hi", "kreiss_B_certified"]
    if opts.certify == "none":
        return pd.DataFrame(columns=["layer", "head", *cols])
    targets = an.median_chunks(chunks)
    if opts.certify == "all":
        merged = targets.merge(chunks[["layer", "head", "chunk", *cols]], on=["layer", "head", "chunk"])
        return merged.rename(columns={"chunk": "certified_chunk"})
    groups = batches.groups(targets["chunk"])
    keys = [f"{unit_prefix(checkpoint)}certify{g:05d}" for g in range(len(groups))]
    todo = run_dir.pending(an.STAGE, zip(keys, groups))
    bar = _bar(len(targets), len(targets) - sum(int(targets["chunk"].isin(g).sum()) for _, (_, g) in todo),
               _desc("certify", checkpoint), quiet)
    pending: list[tuple[str, list]] = []

    def flush(block: bool) -> None:
        while pending and (block or all(f.done() for f in pending[0][1])):
            key, futures = pending.pop(0)
            run_dir.write_unit(an.STAGE, key, {"rows": pd.DataFrame([f.result() for f in futures])})

    for key, (start, group) in todo:
        futures = []
        for layer, head, chunk, matrix in _median_matrices(batches, targets, start, group):
            future = pool.submit(an.certify_row, matrix, layer, head, chunk, opts)
            future.add_done_callback(lambda _: bar.update())  # as each bracket ends (inline: at once)
            futures.append(future)
        pending.append((key, futures))
        flush(block=False)
    flush(block=True)
    bar.close()
    out = run_dir.read_units(an.STAGE, keys, "rows")
    return out.rename(columns={"chunk": "certified_chunk", "failure": "certify_failure"})


def _induction_phase(run_dir, loaded, heads, opts, pool, quiet, checkpoint) -> pd.DataFrame:
    """Excess reserves of every routing head on the first ``ratio_seqs`` probe sequences and
    on their length-matched controls ``[BOS, r, r′]`` (each batch of ``PROBE_BATCH`` holds
    probe and control sequences alike): the ``induction_seqs`` table, one row per head and
    sequence (aggregated per head by :func:`~depthlens.stats.aggregate_induction`)."""
    routing = heads[heads["role"] == "routing"]

    def compute() -> dict[str, pd.DataFrame]:
        rows = []
        if len(routing):
            args = (loaded.tokenizer, opts.probe_seqs, opts.probe_len)
            probe = data.repeated_random_tokens(*args, seed=opts.seed)[: opts.ratio_seqs]
            control = data.control_random_tokens(*args, seed=opts.seed)[: opts.ratio_seqs]
            layers = sorted(routing["layer"].unique())
            bar = tqdm(total=probe.shape[0], desc=_desc("induction", checkpoint), unit="seq", disable=quiet)
            for start in range(0, probe.shape[0], PROBE_BATCH // 2):
                seqs = range(start, min(start + PROBE_BATCH // 2, probe.shape[0]))
                batch = torch.cat([probe[seqs.start : seqs.stop], control[seqs.start : seqs.stop]])

                def tasks(batch: torch.Tensor = batch, seqs: range = seqs) -> Iterator[tuple]:
                    for layer, probs in loaded.adapter.attention_probs(batch, layers=layers):
                        A = probs.cpu().numpy()
                        yield from ((A[i, h], A[len(seqs) + i, h], layer, int(h), s, opts.probe_len, opts)
                                    for h in routing.loc[routing["layer"] == layer, "head"] for i, s in enumerate(seqs))

                rows.extend(ordered_map(pool, an.induction_row, tasks(), max_pending=MAX_PENDING))
                bar.update(len(seqs))
            bar.close()
        return {"rows": pd.DataFrame(rows, columns=["layer", "head", "seq", *an.INDUCTION, "failure"])}

    return run_dir.unit(an.STAGE, f"{unit_prefix(checkpoint)}induction", compute)["rows"]


def _pseudospectra_phase(run_dir, batches: _Batches, heads, chunks) -> None:
    """σ_min(zI − B), to ``PSEUDO_TOL`` relative, on a grid for the top routing head (largest
    previous-token or induction score) and the top sink head (largest sink mass), each on its
    median chunk, saved to ``arrays/pseudospectra.safetensors`` for the report's contours."""
    path = run_dir.root / "arrays" / "pseudospectra.safetensors"
    if path.is_file():
        return
    medians = an.median_chunks(chunks).set_index(["layer", "head"])["chunk"]
    arrays, meta = {}, {}
    for role, (layer, head) in top_heads(heads).items():
        chunk = int(medians.loc[(layer, head)])
        start = chunk - chunk % batches.batch_size
        B = deflate(batches.matrix(next(batches.matrices(start, [layer]))[1], start, chunk, head))  # its own length
        grid = pseudospectrum(B, PSEUDO_GRID, PSEUDO_GRID, tol=PSEUDO_TOL)
        arrays.update({f"{role}.x": grid.x, f"{role}.y": grid.y, f"{role}.sigma": grid.sigma,
                       f"{role}.eig": np.diagonal(B).copy()})
        meta.update({f"{role}.layer": layer, f"{role}.head": head, f"{role}.chunk": chunk})
    run_dir.write_arrays("pseudospectra", arrays, **meta)


def _maps_phase(run_dir, batches: _Batches, heads: pd.DataFrame, chunks: pd.DataFrame, wanted: tuple[str, ...]) -> None:
    """The attention matrix A (float64, trimmed to its chunk's length) of each head of ``wanted``
    (``--heads``; default the top routing head, largest previous-token or induction score, and
    the top sink head, largest sink mass), each on its median chunk, saved to
    ``arrays/attention_maps.safetensors`` under the key ``LAYER.HEAD`` with the metadata
    ``heads`` (the keys in order), ``chunks`` and ``picked`` (``--heads`` or the roles that
    picked them). Kept when the file already holds these heads, written again otherwise.

    Raises
    ------
    InputError
        A ``--heads`` item outside the model's layers and heads.
    """
    picks = chosen_heads(heads, wanted)
    label = ",".join(f"{layer}.{head}" for layer, head in picks)
    if (run_dir.root / "arrays" / f"{MAPS}.safetensors").is_file() and run_dir.read_arrays(MAPS)[1].get("heads") == label:
        return
    medians = an.median_chunks(chunks).set_index(["layer", "head"])["chunk"]
    targets = pd.DataFrame([(layer, head, int(medians.loc[(layer, head)])) for layer, head in picks],
                           columns=["layer", "head", "chunk"])
    found: dict[str, np.ndarray] = {}
    for start, group in batches.groups(sorted(set(targets["chunk"]))):
        for layer, head, _, matrix in _median_matrices(batches, targets, start, group):
            found[f"{layer}.{head}"] = np.ascontiguousarray(matrix, dtype=np.float64)
    arrays = {f"{layer}.{head}": found[f"{layer}.{head}"] for layer, head in picks}
    run_dir.write_arrays(MAPS, arrays, heads=label, chunks=",".join(str(c) for c in targets["chunk"]),
                         picked="--heads" if wanted else ",".join(picks.values()))



def _explorer_phase(run_dir, batches: _Batches, chunks, pool, quiet) -> None:
    """The head explorer's data (:func:`~depthlens.attention.head_view.explorer_arrays`) of
    every head's median chunk, saved to ``arrays/head_spectra.safetensors``: ``sigma`` (L, H,
    g, g) = σ_min(zI − B) on the grid ``x``, ``y`` (every third point of the pseudospectra's),
    ``transient`` (L, H, K) = ``‖B^k‖`` at ``powers`` (K), ``eig`` (L, H, n) = the eigenvalues
    of B (NaN-padded past a shorter prompt), ``chunk`` (L, H); NaN (chunk −1) for a head
    without a value. One file, written at the end (an interrupted phase starts again). The
    chunks are read by the batch that holds them; every head's matrix goes to the workers as
    soon as it is read (about 0.13 CPU-seconds per head at n = 128: 34 s for SmolLM2-135M)."""
    path = run_dir.root / "arrays" / f"{hv.EXPLORER_ARRAYS}.safetensors"
    if path.is_file():
        return
    targets = an.median_chunks(chunks)
    bar = tqdm(total=len(targets), desc=_desc("explorer", TRAINED), unit="head", disable=quiet)
    futures: dict[tuple[int, int], tuple[int, Any]] = {}
    for start, group in batches.groups(targets["chunk"]):
        for layer, head, chunk, matrix in _median_matrices(batches, targets, start, group):
            future = pool.submit(hv.explorer_arrays, matrix)
            future.add_done_callback(lambda _: bar.update())
            futures[(layer, head)] = (chunk, future)
    results = {key: (chunk, future.result()) for key, (chunk, future) in futures.items()}
    bar.close()
    shape = (batches.loaded.adapter.n_layers, batches.loaded.adapter.n_heads)
    g, k = hv.EXPLORER_GRID.size, hv.EXPLORER_POWERS.size
    n = max((r["eig"].size for _, r in results.values() if r is not None), default=0)
    arrays = {"x": hv.EXPLORER_GRID.copy(), "y": hv.EXPLORER_GRID.copy(), "powers": hv.EXPLORER_POWERS.copy(),
              "sigma": np.full((*shape, g, g), np.nan), "transient": np.full((*shape, k), np.nan),
              "eig": np.full((*shape, n), np.nan), "chunk": np.full(shape, -1, dtype=np.int64)}
    for (layer, head), (chunk, r) in results.items():
        arrays["chunk"][layer, head] = chunk
        if r is not None:
            arrays["sigma"][layer, head] = r["sigma"]
            arrays["transient"][layer, head] = r["transient"]
            arrays["eig"][layer, head, : r["eig"].size] = r["eig"]
    run_dir.write_arrays(hv.EXPLORER_ARRAYS, arrays, sigma_tol=f"{hv.PSEUDO_TOL:g}", heads="median chunk (TR1)")


def _depth_phase(run_dir, batches: _Batches, chains, opts, pool, quiet, checkpoint) -> pd.DataFrame:
    """Depth products per chunk, computed by the workers from every layer's matrices of one
    batch (the one phase that holds all layers at once: the product runs over depth). The
    next batch's matrices are formed while the workers compute the previous batch's products."""
    token_ids = batches.token_ids
    keys = [f"{unit_prefix(checkpoint)}depth{c:05d}" for c in range(len(token_ids))]
    todo = [c for c, k in enumerate(keys) if not run_dir.has_unit(an.STAGE, k)]
    bar = _bar(len(keys), len(keys) - len(todo), _desc("depth", checkpoint), quiet)

    def finish(group: list[int], futures: list) -> None:
        for chunk, future in zip(group, futures):
            with run_dir.failures.unit(an.STAGE, keys[chunk]):
                run_dir.write_unit(an.STAGE, keys[chunk], {"rows": future.result()})
            bar.update()

    previous: tuple[list[int], list] | None = None
    for start, group in batches.groups(todo):
        probs = np.stack([A for _, A in batches.matrices(start)], axis=1)  # (B, L, H, T, T)
        n = [int(token_ids.lengths[c]) for c in group]  # each chunk's products over its own length
        futures = [pool.submit(an.depth_chunk_rows, np.ascontiguousarray(probs[c - start, ..., : n[i], : n[i]]), chains,
                               c, opts, c < opts.null_chunks)
                   for i, c in enumerate(group)]
        del probs
        if previous is not None:
            finish(*previous)
        previous = (group, futures)
    if previous is not None:
        finish(*previous)
    bar.close()
    return run_dir.read_units(an.STAGE, run_dir.finished(an.STAGE, keys, required=True), "rows")
