"""The ``clamp`` stage: massive activations and the clamp chain (docs/methods.md#a7).

Phases, each in resumable units:

1. ``massive{batch}``: one unit per batch of ``batch_size`` chunks, over every chunk of the
   run: every massive entry of every boundary (table ``massive``).
2. The clamped dimensions and their emergence layers (:func:`~.clamp.choose_dims`): massive
   at position 0 of a layer input in at least half of the chunks. Massive entries at other
   positions are reported but not clamped. Without such a dimension the stage writes the
   ``massive`` table, empty ``clamp`` / ``clamp_heads`` / ``clamp_dims`` tables and
   ``interventions.json`` with ``tested: false`` and stops there.
3. ``arm_{target}_{seed or dim}_{arm}_{alpha}``: one unit per clamp, on the first
   ``clamp_chunks`` chunks (targets: :func:`~.clamp.clamp_targets`). Each dim is clamped at
   position 0 from its own emergence layer on (one ``adapter.clamp`` per dim, nested):
   ``dose`` α sets it to α × its clean value at each layer input (per chunk), ``mean`` to its
   mean over ordinary positions ``1 .. T−1`` of the clamp chunks at that layer input. Doses 0
   (the zero arm) and 1 (the unclamped model, computed without hooks) always run. With two or
   more massive dims, each one ``alone`` and each one ``left_out`` get the zero arm only (with
   one, those rows are copies of the massive zero arm and of the unclamped model). The control
   (``control_seeds`` seeds) moves as many random ordinary dims (never massive anywhere) by
   the massive dims' own changes (:func:`~.clamp.control_values`); its α = 1 rows are the
   unclamped model's. With ``control_curves`` ``first`` (the default) only the first seed gets
   every dose and the mean arm, the others the zero arm alone (what the verdict reads).
   Measures: cross-entropy with the clamp active, and per head of layers ≥ ``from_layer`` the
   sink mass and, for the doses 0 and 1 and the mean arm, TR1 and Δ_TR
   against ``clamp_null_samples`` spec nulls (Kreiss searches in the worker pool; medians
   over the clamp chunks).
4. The verdict (:func:`~depthlens.interventions.clamp_verdict.chain_verdict`) goes to ``interventions.json``.

Cost: the chain runs ``A + 1`` arm units for the massive clamp (``A`` doses counting 0 and 1,
and the mean arm) and ``A`` per control seed (its α = 1 is the unclamped model's, not run
again), ``3 + 2·seeds`` of them with reserves (the Kreiss searches, most of the time); with
``control_curves`` ``first`` each seed after the first runs its zero arm alone (one unit, with
reserves). The per-dimension tests add ``2·n`` units, all with reserves, for ``n ≥ 2`` massive
dims (none for one).

Memory: one batch's residual states (``(2L+1)·B·T·d`` float64) in phase 1; in phase 3 the
attention matrices of at most :data:`MAX_PENDING` + 1 arms wait for the workers.

Prompts (a prompts file, each prompt a chunk of its own length): detection reads every real
position of each prompt (the clamp acts at position 0 whatever is analysed) and the mean arm
averages over positions ``1 .. length − 1``; the measures are the prompt's own: sink mass over
its analysed rows of its trimmed attention, TR1 and Δ_TR of the trimmed matrix, cross-entropy
over its predictions at analysed positions.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..attention.patterns import sink_mass
from ..data import Chunks, as_chunks
from ..errors import InputError, RunError, require_at_least
from ..executors.local import executor
from ..interventions import clamp as cl
from ..interventions import clamp_verdict
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig

STAGE = "clamp"
#: Smallest chunk the stage handles: attention matrices (n, n) with n ≥ 2 and one ordinary position.
MIN_SEQ_LEN = 2
#: Arms whose Kreiss tasks may wait in the pool while the next arm's forward passes run.
MAX_PENDING = 2


def check(config: RunConfig) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads).
    ``clamp_chunks`` above ``chunks`` simply means every chunk (as ``null_chunks`` does).

    Raises
    ------
    InputError
        ``--seq-len`` below 2.
    """
    require_at_least("--seq-len", config.seq_len, MIN_SEQ_LEN, STAGE)


def check_chunks(config: RunConfig, chunks: Chunks) -> None:
    """Refuse clamp prompts (the first ``clamp_chunks`` of a prompts file) without a single
    analysed position that predicts a next token: the arms' cross-entropy would have no term
    (checked once they are tokenized, before anything is written).

    Raises
    ------
    InputError
        Naming ``--clamp-chunks`` and the prompts file.
    """
    n = config.options(STAGE).clamp_chunks
    if not chunks.take(slice(0, n)).predicted().any():
        raise InputError(f"the clamp stage measures the loss at analysed positions that predict a next token, and the "
                         f"first {min(n, len(chunks))} prompt(s) of {chunks.source} (--clamp-chunks {n}) have none; "
                         "add a position before a prompt's last token, or raise --clamp-chunks.")


def run(context: StageContext) -> None:
    """Run every phase (skipping finished units), write ``massive``, ``clamp``,
    ``clamp_heads``, ``clamp_dims`` and ``interventions.json``."""
    adapter, run_dir = context.loaded.adapter, context.run_dir
    opts, batch_size, quiet = context.options, context.config.batch_size, context.execution.quiet
    with torch.inference_mode():
        massive, n_detect = _detect_phase(context)
        context.write_table("massive", massive)
        plan = cl.choose_dims(massive, n_detect)
        if plan is None:
            reason = (f"no residual dimension is massive at the first token of a layer input in at least half of "
                      f"the {n_detect} chunks ({len(massive)} massive entries in all)")
            _write_untested(context, reason, "a model with massive activations")
            return
        ids = context.chunks.take(slice(0, opts.clamp_chunks))
        targets, control_reason = cl.clamp_targets(plan, cl.ordinary_dims(massive, adapter.d_model),
                                                   opts.control_seeds, opts.seed)
        units = _units(targets, opts.clamp_alphas, opts.control_curves)
        with executor(context.execution, context.run_dir.root) as pool:
            done = _arm_phase(context, pool, ids, plan, [u for u in units if u.source is None], batch_size, quiet)
    if not done:
        raise RunError(f"every arm unit of the {STAGE} stage failed; see its log.")
    heads, ce = _tables(run_dir, units, done)
    chain_rows = heads["target"].isin(CHAIN_TARGETS).to_numpy()
    context.write_table("clamp_heads", heads.loc[chain_rows, cl.HEAD_COLUMNS])
    context.write_table("clamp_dims", heads.loc[~chain_rows, cl.DIM_COLUMNS])
    dims = {(t.name, t.seed): t.dims for t in targets if t.name in CHAIN_TARGETS}
    context.write_table("clamp", cl.clamp_summary(heads[chain_rows], ce[ce["target"].isin(CHAIN_TARGETS)], dims,
                                                  plan.from_layer, len(ids)))
    missing = [u.key for u in units if u.source is None and u.key not in done]
    if missing:
        _write_untested(context, f"{len(missing)} clamp units failed (first: {missing[0]}); see logs/{STAGE}.log "
                                 "and rerun with --resume", "--resume", tables=False)
        return
    verdict = clamp_verdict.chain_verdict(heads[chain_rows], heads[~chain_rows], plan.dims, opts.seed, control_reason,
                               _delta_ce(ce))
    chain = {**verdict, "needs": _needs(verdict, opts.control_seeds), "emergence_layers": list(plan.emergence), "from_layer": plan.from_layer,
             "n_chunks": len(ids), "detection_chunks": n_detect, "alphas": list(cl.arm_alphas(opts.clamp_alphas)),
             "control_dims": [list(t.dims) for t in targets if t.name == "control"]}
    run_dir.write_json("interventions", clamp_verdict.json_safe({"clamp_chain": chain}))
    if not verdict["tested"] and not quiet:
        print(f"clamp: chain not tested: {verdict['reason']}.")


def _needs(verdict: dict, control_seeds: int) -> str | None:
    """What would test a chain that ``verdict`` (:func:`clamp_verdict.chain_verdict`) left
    untested: control seeds where only the control was missing them, else a model with more heads
    (the other conditions' tests lack heads, which no option adds); None for a tested chain."""
    untested = [name for name, c in verdict["conditions"].items() if c["held"] is None]
    if not untested:
        return None
    return "--control-seeds 1 or more" if untested == ["control_inert"] and control_seeds == 0 else \
        "a model with more heads in its clamped layers"


def _write_untested(context: StageContext, reason: str, needs: str, tables: bool = True) -> None:
    """Write empty ``clamp`` / ``clamp_heads`` / ``clamp_dims`` tables (with ``tables``) and ``interventions.json``
    saying the chain was not tested, why, and what would test it (``needs``); say so on one line unless quiet."""
    if tables:
        for name, columns in (("clamp_heads", cl.HEAD_COLUMNS), ("clamp_dims", cl.DIM_COLUMNS),
                              ("clamp", cl.CLAMP_COLUMNS)):
            context.write_table(name, pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in columns}))
    context.run_dir.write_json("interventions", {"clamp_chain": {"tested": False, "reason": reason, "needs": needs}})
    if not context.execution.quiet:
        print(f"clamp: chain not tested: {reason}.")


def _dtype(column: str) -> str:
    if column in ("target", "arm", "dims", "failure"):
        return "object"
    return "int64" if column in ("layer", "head", "seed", "dim", "from_layer", "n_heads", "n_chunks") else "float64"


# ----------------------------------------------------------------------------- detection
def _detect_phase(context: StageContext) -> tuple[pd.DataFrame, int]:
    """Massive entries of every chunk, one unit per batch; returns the table and the number
    of chunks it covers (those of the finished units)."""
    run_dir, ids, batch_size = context.run_dir, context.chunks, context.config.batch_size
    starts = list(range(0, len(ids), batch_size))
    keys = [f"massive{s // batch_size:05d}" for s in starts]
    todo = run_dir.pending(STAGE, zip(keys, starts))
    bar = tqdm(total=len(keys), initial=len(keys) - len(todo), desc=f"{STAGE} detect", unit="batch",
               disable=context.execution.quiet)
    for key, start in todo:
        with run_dir.failures.unit(STAGE, key):
            batch = ids.take(slice(start, start + batch_size))
            states = context.loaded.adapter.residual_states(batch.ids)
            table = cl.massive_entries(states.to(torch.float64).cpu().numpy(), start,
                                       batch.lengths if batch.ragged else None, context.loaded.adapter.boundaries)
            run_dir.write_unit(STAGE, key, {"rows": table})
        bar.update()
    bar.close()
    finished = set(run_dir.finished(STAGE, keys, required=True))
    done = [(k, s) for k, s in zip(keys, starts) if k in finished]
    n_chunks = sum(min(batch_size, len(ids) - s) for _, s in done)
    table = run_dir.read_units(STAGE, [k for k, _ in done], "rows")
    return (table if len(table) else cl.empty_massive()), n_chunks


# ----------------------------------------------------------------------------- arms
#: Row order of the targets in the tables.
TARGET_ORDER = {"massive": 0, "alone": 1, "left_out": 2, "control": 3}
#: The targets of ``clamp_heads`` and ``clamp`` (the others go to ``clamp_dims``).
CHAIN_TARGETS = ("massive", "control")


@dataclass(frozen=True)
class _Unit:
    """One clamp: ``target``'s ``arm`` at dose ``alpha``. ``source`` is the key of the unit
    whose clamp is exactly the same (then this one is not run, its rows are copies)."""

    target: cl.Target
    arm: str
    alpha: float
    source: str | None = None

    @property
    def key(self) -> str:
        alpha = "nan" if math.isnan(self.alpha) else f"{self.alpha:g}"
        return f"arm_{self.target.label}_{self.arm}_{alpha}"

    @property
    def reserve(self) -> bool:
        return cl.has_reserve(self.arm, self.alpha)

    @property
    def reference(self) -> bool:
        """α = 1: the unclamped model, whatever the target (the control's shift is then 0)."""
        return self.arm == "dose" and self.alpha == 1.0

    @property
    def labels(self) -> dict[str, object]:
        """The unit's key columns in the tables."""
        t = self.target
        return {"target": t.name, "seed": t.seed, "dim": t.dim, "arm": self.arm, "alpha": self.alpha}


def _units(targets: list[cl.Target], alphas: tuple[float, ...], control_curves: str) -> list[_Unit]:
    """One unit per (target, arm, dose): every dose and the mean arm for ``massive`` and
    ``control`` (with ``control_curves`` ``first``, the control seeds after the first get the
    zero arm and α = 1 only: the verdict reads their zero arms, the figure the first seed's
    curve), the zero arm for ``alone`` and ``left_out``. A unit that repeats another clamp
    exactly gets it as ``source``: α = 1 and clamping no dim are the unclamped model (the
    massive α = 1 unit), and a dim alone when it is the only massive dim is the massive
    clamp."""
    massive = targets[0]
    reference = _Unit(massive, "dose", 1.0).key
    out = []
    for target in targets:
        if target.name in ("alone", "left_out"):
            arms = [("dose", 0.0)]
        elif target.name == "control" and target.seed > 0 and control_curves == "first":
            arms = [("dose", 0.0), ("dose", 1.0)]
        else:
            arms = [*(("dose", a) for a in cl.arm_alphas(alphas)), ("mean", math.nan)]
        for arm, alpha in arms:
            unit = _Unit(target, arm, alpha)
            if target.name != "massive" and (unit.reference or not target.dims):
                unit = _Unit(target, arm, alpha, reference)
            elif target.name == "alone" and target.dims == massive.dims:
                unit = _Unit(target, arm, alpha, _Unit(massive, arm, alpha).key)
            out.append(unit)
    return out


@dataclass
class _Clean:
    """Clean layer inputs of the clamp chunks: ``first`` (L+1, chunks, d) the position-0
    values, ``means`` (L+1, d) the means over ordinary positions of all clamp chunks, and
    ``starts`` what layer ``from_layer − 1`` passes on to the first clamped layer, per batch
    (:meth:`~depthlens.models.interventions.Interventions.layer_output`; None where passes
    cannot start there: from layer 0, or a family whose layers are not maps of the residual)."""

    first: np.ndarray
    means: np.ndarray
    from_layer: int
    starts: list[torch.Tensor] | None


def _clean_inputs(adapter, ids: torch.Tensor | Chunks, batch_size: int, from_layer: int) -> _Clean:
    ids = as_chunks(ids)
    firsts, total, count, starts = [], 0.0, 0, []
    for start in range(0, len(ids), batch_size):
        batch = ids.take(slice(start, start + batch_size))
        states = adapter.residual_states(batch.ids)
        if adapter.block_maps and from_layer > 0:
            starts.append(adapter.layer_output(batch.ids, from_layer - 1))
        first, sums, n = cl.layer_inputs_summary(states.to(torch.float64).cpu().numpy(),
                                                 batch.lengths if batch.ragged else None, len(adapter.boundaries))
        firsts.append(first)
        total, count = total + sums, count + n
    return _Clean(np.concatenate(firsts, axis=1), total / count, from_layer, starts or None)


@contextlib.contextmanager
def _clamped(adapter, unit: _Unit, clean: _Clean, chunks: slice) -> Iterator[None]:
    """The unit's clamps on the clamp chunks ``chunks`` (one nested ``adapter.clamp`` per dim,
    at position 0 from its first clamped layer); nothing for the reference α = 1. A control dim
    follows the values of its matched massive dim through :func:`~.clamp.control_values`."""
    if unit.reference:
        yield
        return
    t, first = unit.target, clean.first[:, chunks]
    with contextlib.ExitStack() as stack:
        for i, (dim, layer) in enumerate(zip(t.dims, t.emergence)):
            source = t.matched[i] if t.matched else dim
            if unit.arm == "dose":
                values = cl.dose_values(first, source, unit.alpha, layer)
            else:
                values = cl.mean_values(clean.means, source, layer)
            if t.matched:
                values = cl.control_values(first, values, source, dim, t.signs[i])
            stack.enter_context(adapter.clamp(dim, values, 0, from_layer=layer))
        yield


def _started(adapter, unit: _Unit, clean: _Clean, batch: int) -> contextlib.AbstractContextManager:
    """Passes of batch number ``batch`` that begin at the first clamped layer with its clean
    input (:meth:`~depthlens.models.interventions.Interventions.start_at`): the layers below
    it are the same in every arm, so each arm's pass is the whole pass bit for bit in
    ``(L − from_layer)/L`` of its time. The whole pass where no clean input was kept or the
    unit clamps a dim from a lower layer."""
    if clean.starts is None or min(unit.target.emergence, default=clean.from_layer) < clean.from_layer:
        return contextlib.nullcontext()
    return adapter.start_at(clean.from_layer, clean.starts[batch])


def _next_token_nll(logits: torch.Tensor, ids: torch.Tensor, counted: np.ndarray | None = None) -> tuple[float, int]:
    """Sum over the batch of the next-token negative log-likelihoods (float64) and their count;
    with ``counted`` (B, T − 1) bool, of the counted predictions only (a prompt's analysed
    positions inside it)."""
    if counted is not None:
        total = 0.0
        for b in range(logits.shape[0]):
            t = torch.from_numpy(np.flatnonzero(counted[b]))
            logp = torch.log_softmax(logits[b, t.to(logits.device)].to(torch.float64), dim=-1)
            total += float(-logp.gather(1, ids[b, t + 1, None].to(logp.device)).sum())
        return total, int(np.sum(counted))
    total = 0.0
    for b in range(logits.shape[0]):
        logp = torch.log_softmax(logits[b, :-1].to(torch.float64), dim=-1)
        total += float(-logp.gather(1, ids[b, 1:, None].to(logp.device)).sum())
    return total, int(logits.shape[0] * (logits.shape[1] - 1))


@dataclass
class _Pending:
    unit: _Unit
    sinks: pd.DataFrame
    ce_sum: float
    n_tokens: int
    futures: list = field(default_factory=list)


def _measure(adapter, pool, unit: _Unit, clean: _Clean, ids: torch.Tensor | Chunks, from_layer: int, batch_size: int,
             opts) -> _Pending:
    """Forward passes of one arm over the clamp chunks; its Kreiss tasks go to the pool. A
    prompt's measures are its own: its attention trimmed to its length, its sink mass over its
    analysed rows, its cross-entropy over its counted predictions."""
    ids = as_chunks(ids)
    sinks, ce_sum, n_tokens, futures = [], 0.0, 0, []
    layers = list(range(from_layer, adapter.n_layers))
    for start in range(0, len(ids), batch_size):
        chunks = ids.take(slice(start, start + batch_size))
        batch, ragged = chunks.ids, chunks.ragged
        n = [int(length) for length in chunks.lengths]
        span = slice(start, start + batch.shape[0])
        with _clamped(adapter, unit, clean, span), _started(adapter, unit, clean, start // batch_size):
            logits, probs_of = adapter.logits_and_attention_probs(batch, layers)
            nll, count = _next_token_nll(logits, batch, chunks.predicted() if ragged else None)
            ce_sum, n_tokens = ce_sum + nll, n_tokens + count
            del logits
            for layer, probs in probs_of:
                A = probs.cpu().numpy()
                if ragged:
                    s = np.stack([sink_mass(A[b, :, : n[b], : n[b]], chunks.rows(b)) for b in range(A.shape[0])])
                else:
                    s = sink_mass(A)  # (B, H)
                B, H = s.shape
                sinks.append(pd.DataFrame({"layer": layer, "head": np.tile(np.arange(H), B),
                                           "chunk": np.repeat(np.arange(start, start + B), H),
                                           "sink_mass": s.reshape(-1)}))
                if unit.reserve:
                    futures += [pool.submit(cl.reserve_task, np.ascontiguousarray(A[b, h, : n[b], : n[b]]), layer, h,
                                            start + b, opts.clamp_null_samples, opts.seed)
                                for b in range(B) for h in range(H)]
    return _Pending(unit, pd.concat(sinks, ignore_index=True), ce_sum, n_tokens, futures)


def _finish(run_dir, item: _Pending) -> None:
    """Aggregate one arm's results and store its unit (measurements only: the key columns are
    added when the tables are assembled, so a unit can stand for another)."""
    reserves = pd.DataFrame([f.result() for f in item.futures]) if item.futures else None
    heads = cl.aggregate_heads(item.sinks, reserves)
    ce = pd.DataFrame([{"ce_sum": item.ce_sum, "n_tokens": item.n_tokens}])
    run_dir.write_unit(STAGE, item.unit.key, {"heads": heads, "ce": ce})


def _arm_phase(context: StageContext, pool, ids: Chunks, plan: cl.ClampPlan, units: list[_Unit],
               batch_size: int, quiet: bool) -> set[str]:
    """Run the unfinished arm units (none with a ``source``); returns the keys of the finished
    ones. Kreiss tasks of up to :data:`MAX_PENDING` arms stay in the pool while the next arm's
    forward passes run."""
    run_dir, adapter, opts = context.run_dir, context.loaded.adapter, context.options
    todo = [u for u in units if not run_dir.has_unit(STAGE, u.key)]
    bar = tqdm(total=len(units), initial=len(units) - len(todo), desc=f"{STAGE} arms", unit="arm", disable=quiet)
    clean = _clean_inputs(adapter, ids, batch_size, plan.from_layer) if todo else None
    pending: list[_Pending] = []

    def flush(keep: int) -> None:
        while len(pending) > keep or (pending and all(f.done() for f in pending[0].futures)):
            item = pending.pop(0)
            with run_dir.failures.unit(STAGE, item.unit.key):
                _finish(run_dir, item)
            bar.update()

    for unit in todo:
        with run_dir.failures.unit(STAGE, unit.key):
            pending.append(_measure(adapter, pool, unit, clean, ids, plan.from_layer, batch_size, opts))
        flush(MAX_PENDING)
    flush(0)
    bar.close()
    return {u.key for u in units if run_dir.has_unit(STAGE, u.key)}


def _tables(run_dir, units: list[_Unit], done: set[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every finished unit's head rows and cross-entropy row with its key columns (a unit with
    a ``source`` gets a copy of the source's rows), in key order."""
    heads, ce = [], []
    for unit in units:
        key = unit.source or unit.key
        if key in done:
            heads.append(run_dir.read_units(STAGE, [key], "heads").assign(**unit.labels))
            ce.append(run_dir.read_units(STAGE, [key], "ce").assign(**unit.labels))
    order = ["target", "seed", "dim", "arm", "alpha"]
    return (_sorted(pd.concat(heads, ignore_index=True), [*order, "layer", "head"]),
            _sorted(pd.concat(ce, ignore_index=True), order))


def _delta_ce(ce: pd.DataFrame) -> dict[tuple[str, int], float]:
    """``{(target, dim): ce − ce of the unclamped model}`` of the ``alone`` and ``left_out`` arms."""
    per_token = ce["ce_sum"] / ce["n_tokens"]
    ref = float(per_token[(ce["target"] == "massive") & (ce["arm"] == "dose") & (ce["alpha"] == 1.0)].iloc[0])
    rows = ce[ce["target"].isin(("alone", "left_out"))]
    return {(t, int(d)): float(v) - ref for t, d, v in zip(rows["target"], rows["dim"], per_token[rows.index])}


def _sorted(table: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Rows in key order: targets as :data:`TARGET_ORDER`, the mean arm after the doses."""
    return table.sort_values(order, key=lambda c: c.map(TARGET_ORDER) if c.name == "target" else c, kind="stable",
                             na_position="last").reset_index(drop=True)
