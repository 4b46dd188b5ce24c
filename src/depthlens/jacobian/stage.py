"""The ``jacobian`` stage over models (METHODS B1–B4, B6): mean sub-layer operators per
checkpoint and mode, their spectral metrics and eigenvalues, and the cumulative funnel with
the Schur split.

Checkpoints: the loaded model (``trained``), its step-0 null (``init``: same architecture and
config, fresh initial weights under the run seed) and any extra hub revisions. Units:
``ops_<checkpoint>_<mode>`` (mean operators saved to ``arrays/`` in the dtype of
``save_arrays``, or not at all, plus their metrics and eigenvalues; with float32 or none a
unit-private float64 copy serves the funnel and the topology stage until the run ends) and ``funnel_<checkpoint>`` (cumulative eranks for every α, direction and
truncation, on the ``isolated`` operators, or the first mode run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.numpy import load_file

from ..errors import InputError, require_at_least
from ..parallel import executor
from ..runs import RunDirectory, atomic
from . import engines
from .cumulative import ALPHAS, DIRECTIONS, schur_funnel
from .metrics import metrics_and_eigenvalues

STAGE = "jacobian"
MODES = ("isolated", "in_context")
SAVE_ARRAYS = ("float64", "float32", "none")
#: Suffix of the unit-private float64 copy of a unit's mean operators (``units/jacobian/
#: ops_<checkpoint>_<mode>.operators.safetensors``), kept while the run needs them when
#: ``save_arrays`` is not float64, and deleted at the end of a run without failures.
PRIVATE = ".operators.safetensors"
#: Smallest chunk the stage handles (BOS and one token; every position has a Jacobian).
MIN_SEQ_LEN = 2


def check_sizes(chunks: int, seq_len: int, opts: JacobianOptions) -> None:
    """Refuse sizes the stage cannot work with (checked before the model loads). Any
    ``--funnel-rank`` works (it is capped at the model width).

    Raises
    ------
    InputError
        ``seq_len`` below :data:`MIN_SEQ_LEN`, naming ``--seq-len``.
    """
    require_at_least("--seq-len", seq_len, MIN_SEQ_LEN, STAGE)


@dataclass(frozen=True)
class JacobianOptions:
    """Parameters of the jacobian stage.

    Parameters
    ----------
    modes : tuple of {"isolated", "in_context"}
        Jacobian modes (METHODS B1).
    positions : {"last", "all"}
        Token positions averaged per chunk.
    funnel_rank : int
        Truncation rank of the truncated cumulative products (capped at d); the exact
        products are always computed too, and only they when it is 0 or at least d.
    null : {"init", "none"}
        Also analyse the step-0 null of the model.
    revisions : tuple of str
        Extra hub revisions of the same model to analyse.
    seed : int
        The run seed; the step-0 initialisation uses :attr:`init_seed`, spawned from it.
    alphas : tuple of float
        Scales α of the non-normal part in the Schur split of the funnel (METHODS B4), in [0, 1].
    save_arrays : {"float64", "float32", "none"}
        What ``arrays/jacobians_<checkpoint>_<mode>.safetensors`` holds: the mean operators
        in float64 or float32, or no file. The metrics, the funnel and the topology stage
        always use float64 operators (:func:`operators`), so the tables do not depend on it.
    """

    modes: tuple[str, ...] = MODES
    positions: str = "last"
    funnel_rank: int = 512
    null: str = "init"
    revisions: tuple[str, ...] = ()
    seed: int = 0
    save_arrays: str = "float64"
    alphas: tuple[float, ...] = ALPHAS

    @property
    def init_seed(self) -> int:
        """Seed of the step-0 null, spawned from the run seed (so a ``random:`` model and its
        null never share weights)."""
        return int(np.random.SeedSequence([self.seed, 0x1A17]).generate_state(1)[0])

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise InputError(f"--jacobian-mode {bad[0] if bad else '(none)'!r} is unknown; use isolated, in_context or both.")
        if self.positions not in ("last", "all"):
            raise InputError(f"--positions {self.positions!r} is unknown; use last or all.")
        if self.null not in ("init", "none"):
            raise InputError(f"--null {self.null!r} is unknown; use init or none.")
        if self.funnel_rank < 0:
            raise InputError(f"--funnel-rank {self.funnel_rank} must be at least 0 (0: exact products only).")
        if self.save_arrays not in SAVE_ARRAYS:
            raise InputError(f"--save-arrays {self.save_arrays!r} is unknown; use one of {', '.join(SAVE_ARRAYS)}.")
        if not self.alphas or not all(0.0 <= a <= 1.0 for a in self.alphas):
            shown = ",".join(f"{a:g}" for a in self.alphas) or "(none)"
            raise InputError(f"--funnel-alphas {shown} is invalid; pass numbers in [0, 1], e.g. 0,0.5,1.")


def checkpoints(loaded, opts: JacobianOptions, load: Callable) -> list[tuple[str, Callable]]:
    """``(name, loader)`` for every checkpoint: the model, its init null, its revisions.

    Loaders are called lazily so a resumed run does not reload finished checkpoints.
    """
    from ..models import init_like

    out: list[tuple[str, Callable]] = [("trained", lambda: loaded)]
    if opts.null == "init":
        out.append(("init", lambda: init_like(loaded, seed=opts.init_seed)))
    for rev in opts.revisions:
        out.append((rev, lambda rev=rev: load(rev)))
    return out


def operator_list(ops: dict[tuple[int, str], np.ndarray]) -> list[np.ndarray]:
    """The operators in depth order: (0, attn), (0, mlp), (1, attn), ..."""
    return [ops[k] for k in sorted(ops, key=lambda k: (k[0], k[1] != "attn"))]


def label(name: str) -> str:
    """How progress bars name a checkpoint: ``trained model``, ``step-0 null`` or ``revision R``."""
    return {"trained": "trained model", "init": "step-0 null"}.get(name, f"revision {name}")


def _paths(run_dir: RunDirectory, name: str, mode: str) -> tuple[Path, Path]:
    """The saved array of checkpoint ``name`` and ``mode``, and its unit-private float64 copy."""
    return (run_dir.root / "arrays" / f"jacobians_{name}_{mode}.safetensors",
            run_dir.root / "units" / STAGE / f"ops_{name}_{mode}{PRIVATE}")


def _save(run_dir: RunDirectory, name: str, mode: str, ops: dict[tuple[int, str], np.ndarray],
          opts: JacobianOptions, n_chunks: int) -> None:
    """Write the mean operators as ``opts.save_arrays`` asks, and a unit-private float64 copy
    when the saved array is not float64 (so nothing downstream reads reduced precision)."""
    arrays = {f"{l}.{k}": J for (l, k), J in ops.items()}
    meta = {"checkpoint": name, "mode": mode, "positions": opts.positions, "n_chunks": str(n_chunks)}
    public, private = _paths(run_dir, name, mode)
    if opts.save_arrays != "float64":
        atomic.write_safetensors(private, arrays, {"config_hash": str(run_dir.manifest["config_hash"]), **meta})
    if opts.save_arrays != "none":
        dtype = np.dtype(opts.save_arrays)
        run_dir.write_arrays(public.stem, {k: v.astype(dtype, copy=False) for k, v in arrays.items()}, **meta)


def saved_operators(run_dir: RunDirectory, name: str, mode: str) -> dict[tuple[int, str], np.ndarray] | None:
    """The float64 mean operators of checkpoint ``name`` and ``mode`` that the run holds: the
    float64 ``arrays/`` file, else the unit-private copy; None when there is neither (the
    array is float32 or absent and the copy was deleted at the end of an earlier session)."""
    for path in _paths(run_dir, name, mode):
        if path.is_file():
            arrays = load_file(str(path))
            if arrays and all(a.dtype == np.float64 for a in arrays.values()):
                return {(int(k.split(".")[0]), k.split(".")[1]): v for k, v in arrays.items()}
    return None


def operators(run_dir: RunDirectory, name: str, mode: str, get: Callable, token_ids: torch.Tensor,
              opts: JacobianOptions, *, batch_size: int, quiet: bool) -> dict[tuple[int, str], np.ndarray]:
    """The float64 mean operators of a finished ``ops_<name>_<mode>`` unit: as saved
    (:func:`saved_operators`), or computed again from the checkpoint (``get()``) the same way,
    which gives the same numbers. Never a reduced-precision copy."""
    found = saved_operators(run_dir, name, mode)
    if found is None:
        found = engines.mean_operators(get().adapter, token_ids, mode=mode, positions=opts.positions,
                                       batch_size=batch_size, progress=not quiet, label=f"{label(name)}, recomputed")
    return found


def discard_private(run_dir: RunDirectory) -> None:
    """Delete the unit-private float64 operator copies (end of a run without failures); a
    later session that needs them computes them again (:func:`operators`)."""
    folder = run_dir.root / "units" / STAGE
    for path in sorted(folder.glob(f"*{PRIVATE}")) if folder.is_dir() else ():
        path.unlink(missing_ok=True)


def run(run_dir: RunDirectory, loaded, token_ids: torch.Tensor, opts: JacobianOptions, *,
        batch_size: int, quiet: bool, load_revision: Callable, jobs: int = 1) -> None:
    """Run the stage (skipping finished units) and write ``operators``, ``eigenvalues`` and
    ``cumulative`` tables. The decompositions and funnel curves run on ``jobs`` worker
    processes; the Jacobians themselves in this process (torch). A unit that raises is
    recorded in ``run_dir.failures`` and the others go on; the tables hold the finished units
    (a funnel needs its checkpoint's operators)."""
    with executor(jobs) as pool:
        _run(run_dir, loaded, token_ids, opts, batch_size, quiet, load_revision, pool)


def _run(run_dir, loaded, token_ids, opts, batch_size, quiet, load_revision, pool) -> None:
    metrics, eigen, funnels = [], [], []
    funnel_mode = "isolated" if "isolated" in opts.modes else opts.modes[0]
    for name, get in checkpoints(loaded, opts, load_revision):
        model = None
        ops_by_mode = {}
        for mode in opts.modes:
            key = f"ops_{name}_{mode}"
            if not run_dir.has_unit(STAGE, key):
                with run_dir.failures.unit(STAGE, key):
                    model = model or get()
                    ops = engines.mean_operators(model.adapter, token_ids, mode=mode, positions=opts.positions,
                                                 batch_size=batch_size, progress=not quiet, label=label(name))
                    _save(run_dir, name, mode, ops, opts, token_ids.shape[0])
                    op_table, eigen_rows = metrics_and_eigenvalues(ops, progress=not quiet, pool=pool,
                                                                   label=f"{label(name)} ({mode})")
                    run_dir.write_unit(STAGE, key, {"metrics": op_table, "eigen": eigen_rows})
                    ops_by_mode[mode] = ops if mode == funnel_mode else None  # only the funnel reads them again
            if not run_dir.has_unit(STAGE, key):
                continue
            ops_by_mode.setdefault(mode, None)  # finished; its operators are fetched only if the funnel needs them
            for table, sink in (("metrics", metrics), ("eigen", eigen)):
                t = run_dir.read_units(STAGE, [key], table)
                t.insert(0, "checkpoint", name)
                t.insert(1, "mode", mode)
                sink.append(t)
        key = f"funnel_{name}"
        if funnel_mode not in ops_by_mode:
            continue  # its operators failed (recorded above); the funnel needs them
        if not run_dir.has_unit(STAGE, key):
            with run_dir.failures.unit(STAGE, key):
                found = ops_by_mode[funnel_mode]
                if found is None:
                    found = operators(run_dir, name, funnel_mode, lambda: model or get(), token_ids, opts,
                                      batch_size=batch_size, quiet=quiet)
                ops = operator_list(found)
                d = ops[0].shape[0]
                ranks = (None,) if opts.funnel_rank == 0 or opts.funnel_rank >= d else (None, opts.funnel_rank)
                table = schur_funnel(ops, alphas=opts.alphas, directions=DIRECTIONS, ranks=ranks, progress=not quiet, pool=pool,
                                     label=label(name))
                run_dir.write_unit(STAGE, key, {"funnel": table})
        if run_dir.has_unit(STAGE, key):
            t = run_dir.read_units(STAGE, [key], "funnel")
            t.insert(0, "checkpoint", name)
            t.insert(1, "mode", funnel_mode)
            funnels.append(t)
    for name, parts in (("operators", metrics), ("eigenvalues", eigen), ("cumulative", funnels)):
        if parts:
            table = pd.concat(parts, ignore_index=True)
            table.insert(0, "model", loaded.name)
            run_dir.write_table(name, table)
