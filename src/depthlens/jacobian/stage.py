"""The ``jacobian`` stage over models (METHODS B1–B4, B6): mean sub-layer operators per
checkpoint and mode, their spectral metrics and eigenvalues, and the cumulative funnel with
the Schur split.

Checkpoints: the loaded model (``trained``), its step-0 null (``init``: same architecture and
config, fresh initial weights under the run seed) and any extra hub revisions. Units:
``ops_<checkpoint>_<mode>`` (mean operators saved to ``arrays/`` plus their metrics and
eigenvalues) and ``funnel_<checkpoint>`` (cumulative eranks for every α, direction and
truncation, on the ``isolated`` operators, or the first mode run).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from safetensors.numpy import load_file

from ..errors import InputError
from ..parallel import executor
from ..runs import RunDirectory
from . import engines
from .cumulative import ALPHAS, DIRECTIONS, schur_funnel
from .metrics import metrics_and_eigenvalues

STAGE = "jacobian"
MODES = ("isolated", "in_context")


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
        products are always computed too.
    null : {"init", "none"}
        Also analyse the step-0 null of the model.
    revisions : tuple of str
        Extra hub revisions of the same model to analyse.
    seed : int
        The run seed; the step-0 initialisation uses :attr:`init_seed`, spawned from it.
    """

    modes: tuple[str, ...] = MODES
    positions: str = "last"
    funnel_rank: int = 512
    null: str = "init"
    revisions: tuple[str, ...] = ()
    seed: int = 0

    @property
    def init_seed(self) -> int:
        """Seed of the step-0 null, spawned from the run seed (so a ``random:`` model and its
        null never share weights)."""
        return int(np.random.SeedSequence([self.seed, 0x1A17]).generate_state(1)[0])

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise InputError(f"jacobian mode {bad[0] if bad else '(none)'!r} is unknown; use isolated, in_context or both.")
        if self.positions not in ("last", "all"):
            raise InputError(f"positions {self.positions!r} is unknown; use last or all.")
        if self.null not in ("init", "none"):
            raise InputError(f"null {self.null!r} is unknown; use init or none.")
        if self.funnel_rank < 1:
            raise InputError(f"funnel_rank {self.funnel_rank} must be at least 1.")


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
    for name, get in checkpoints(loaded, opts, load_revision):
        model = None
        ops_by_mode = {}
        for mode in opts.modes:
            key = f"ops_{name}_{mode}"
            array_name = f"jacobians_{name}_{mode}"
            if not run_dir.has_unit(STAGE, key):
                with run_dir.failures.unit(STAGE, key):
                    model = model or get()
                    ops = engines.mean_operators(model.adapter, token_ids, mode=mode, positions=opts.positions,
                                                 batch_size=batch_size, progress=not quiet)
                    run_dir.write_arrays(array_name, {f"{l}.{k}": J for (l, k), J in ops.items()}, checkpoint=name,
                                         mode=mode, positions=opts.positions, n_chunks=str(token_ids.shape[0]))
                    op_table, eigen_rows = metrics_and_eigenvalues(ops, progress=not quiet, pool=pool)
                    run_dir.write_unit(STAGE, key, {"metrics": op_table, "eigen": eigen_rows})
            if not run_dir.has_unit(STAGE, key):
                continue
            loaded_arrays = load_file(str(run_dir.root / "arrays" / f"{array_name}.safetensors"))
            ops_by_mode[mode] = {(int(k.split(".")[0]), k.split(".")[1]): v for k, v in loaded_arrays.items()}
            for table, sink in (("metrics", metrics), ("eigen", eigen)):
                t = run_dir.read_units(STAGE, [key], table)
                t.insert(0, "checkpoint", name)
                t.insert(1, "mode", mode)
                sink.append(t)
        key = f"funnel_{name}"
        funnel_mode = "isolated" if "isolated" in opts.modes else opts.modes[0]
        if funnel_mode not in ops_by_mode:
            continue  # its operators failed (recorded above); the funnel needs them
        if not run_dir.has_unit(STAGE, key):
            with run_dir.failures.unit(STAGE, key):
                ops = operator_list(ops_by_mode[funnel_mode])
                ranks = (None,) if opts.funnel_rank >= ops[0].shape[0] else (None, opts.funnel_rank)
                table = schur_funnel(ops, alphas=ALPHAS, directions=DIRECTIONS, ranks=ranks, progress=not quiet, pool=pool)
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
