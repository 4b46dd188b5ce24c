"""The jacobian stage's mean operators of a run: computed into their float64 file, read back
from it, or computed again; the checkpoints they belong to; the layer operators and the
orders the funnel multiplies them in. The topology stage reads the same operators through
this module (:func:`operators`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..data import Chunks, as_chunks
from ..executors.local import READ_AHEAD_BYTES, read_ahead
from ..models.adapter import SUBLAYERS
from ..runs import RunDirectory, atomic
from . import engines
from .bootstrap import funnel_bootstrap, mean_of_chunks, skip_reason
from .options import JacobianOptions

__all__ = ["LAYER", "PRIVATE", "STAGE", "boot_table", "bootstrapped", "checkpoints", "chunk_positions", "compute",
           "delete_private_copies", "label", "layer_operator", "operator_list", "operators", "saved_operators",
           "sublayer_keys_backward", "with_layer_operators"]

#: The stage that computes the operators (its units folder holds the unit-private copies).
STAGE = "jacobian"
#: The ``sublayer`` key of the layer operators (:func:`with_layer_operators`).
LAYER = "layer"
#: Suffix of the unit-private float64 copy of a unit's mean operators (``units/jacobian/
#: ops_<checkpoint>_<mode>.operators.safetensors``), kept while the run needs them when
#: ``save_arrays`` is not float64, and deleted at the end of a run without failures.
PRIVATE = ".operators.safetensors"

def chunk_positions(chunks: torch.Tensor | Chunks, positions: str) -> list[list[int]] | None:
    """Each chunk's positions for the engines: None for chunks of equal length with every
    position analysed (``positions`` then applies as it is), else per chunk its last analysed
    position (``last``) or all of them (``all``)."""
    chunks = as_chunks(chunks)
    if not chunks.ragged:
        return None
    own = [chunks.positions(c).tolist() for c in range(len(chunks))]
    return [pos[-1:] for pos in own] if positions == "last" else own


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
    """The sub-layer operators in depth order: (0, attn), (0, mlp), (1, attn), ...; layer
    operators (``(l, "layer")``) are left out."""
    return [ops[k] for k in sorted((k for k in ops if k[1] in SUBLAYERS), key=lambda k: (k[0], SUBLAYERS.index(k[1])))]


def with_layer_operators(ops: dict[tuple[int, str], np.ndarray], parallel_residual: bool) -> dict[tuple[int, str], np.ndarray]:
    """``ops`` with the layer operator ``(l, "layer")`` after each layer's sub-layers: the
    product of its mean sub-layer operators in order, ``J̄_mlp @ J̄_attn`` (and ``J̄_ple @ J̄_mlp
    @ J̄_attn`` where a layer has three, its output scalar inside ``J̄_ple``: the steps the
    funnel multiplies), or ``J̄_attn + J̄_mlp − I`` on parallel-residual models, the layer's
    own Jacobian there (:mod:`depthlens.jacobian.engines`); float64, exact to rounding."""
    out: dict[tuple[int, str], np.ndarray] = {}
    for layer in sorted({k[0] for k in ops}):
        subs = [ops[(layer, kind)] for kind in SUBLAYERS if (layer, kind) in ops]
        out.update({(layer, kind): ops[(layer, kind)] for kind in SUBLAYERS if (layer, kind) in ops})
        out[(layer, LAYER)] = layer_operator(subs, parallel_residual)
    return out


def layer_operator(subs: Sequence[np.ndarray], parallel_residual: bool) -> np.ndarray:
    """One layer's operator from its mean sub-layer operators in order (see :func:`with_layer_operators`)."""
    if parallel_residual:
        attn, mlp = subs
        return attn + mlp - np.eye(attn.shape[0])
    out = subs[0]
    for J in subs[1:]:
        out = J @ out
    return out


def label(name: str) -> str:
    """How progress bars name a checkpoint: ``trained model``, ``step-0 null`` or ``revision R``."""
    return {"trained": "trained model", "init": "step-0 null"}.get(name, f"revision {name}")


def _paths(run_dir: RunDirectory, name: str, mode: str) -> tuple[Path, Path]:
    """The saved array of checkpoint ``name`` and ``mode``, and its unit-private float64 copy."""
    return (run_dir.root / "arrays" / f"jacobians_{name}_{mode}.safetensors",
            run_dir.root / "units" / STAGE / f"ops_{name}_{mode}{PRIVATE}")


def bootstrapped(opts: JacobianOptions, mode: str) -> bool:
    """Whether ``mode``'s mean operators are summed chunk by chunk with the funnel bootstrap:
    the funnel's mode, with ``--funnel-boot`` above 0."""
    return mode == opts.funnel_mode and opts.funnel_boot > 0


def boot_rank(opts: JacobianOptions, d: int) -> int | None:
    """The truncation of the bootstrapped funnel: the funnel's (``--funnel-rank``, capped at d;
    None for the exact products when it is 0 or at least d), so it matches the curve the
    claims read."""
    return opts.funnel_rank if 0 < opts.funnel_rank < d else None


def sublayer_keys_backward(n_layers: int, sublayers: Sequence[str] = ("attn", "mlp")) -> list[tuple[int, str]]:
    """The sub-layers (``sublayers`` of each layer, e.g. :attr:`Adapter.sublayers
    <depthlens.models.adapter.Adapter.sublayers>`) from the last one down: the order of the backward product."""
    return [(layer, kind) for layer in reversed(range(n_layers)) for kind in reversed(tuple(sublayers))]


def boot_table(sums, weights: np.ndarray, n_steps: int, d: int, opts: JacobianOptions, device: str | None,
          threads: int, out: dict | None = None) -> pd.DataFrame:
    """The bootstrapped funnel ends of per-chunk sums of ``n_steps`` sub-layers in backward
    order (:func:`~depthlens.jacobian.bootstrap.funnel_bootstrap`'s table), with the truncation
    used (column ``truncation`` first). Over fewer chunks than
    :data:`~depthlens.jacobian.bootstrap.MIN_CHUNKS` (the columns of ``weights``) the
    replicates are skipped (:func:`~depthlens.jacobian.bootstrap.skip_reason` says why): the
    table holds replicate 0 alone, the point estimate, which tells a skipped bootstrap from one
    that ran (replicates 1 … R) and from none at all (no table).

    Where one sub-layer's sums (``C × d²`` float64, C chunks) take at most
    :data:`~depthlens.executors.local.READ_AHEAD_BYTES`, the next sub-layer's are computed (:func:`~depthlens.executors.local.read_ahead`)
    while the replicates multiply the current one in: the same numbers, bit for bit, since
    the sums are computed under the same process-wide BLAS thread limit either way.
    """
    n_chunks = np.shape(weights)[-1]
    if skip_reason(n_chunks) is not None:
        weights = np.asarray(weights)[:0]
    if n_chunks * d * d * 8 <= READ_AHEAD_BYTES:
        sums = read_ahead(sums)
    rank = boot_rank(opts, d)
    table = funnel_bootstrap(sums, weights, n_steps, rank, "backward", out=out, device=device, threads=threads)
    table.insert(0, "truncation", d if rank is None else rank)
    return table


def compute(run_dir: RunDirectory, name: str, mode: str, adapter, token_ids: torch.Tensor | Chunks, opts: JacobianOptions,
             *, batch_size: int, quiet: bool, label_suffix: str = "", copy: bool = True,
             weights: np.ndarray | None = None, device: str | None = None, threads: int = 1
             ) -> tuple[dict[tuple[int, str], np.ndarray], pd.DataFrame | None]:
    """Compute the mean operators and the layer operators of checkpoint ``name`` and ``mode``
    straight into their float64 file (``arrays/`` when ``save_arrays`` is float64, else the
    unit-private copy), one operator in memory at a time, then (with ``copy``) write the
    float32 ``arrays/`` copy when ``save_arrays`` asks for it; returns read-only memory maps
    of the float64 file, in layer order, and the funnel bootstrap (:func:`bootstrapped`
    modes with ``weights``, else None). The numbers are those of
    :func:`engines.mean_operators` (in a bootstrapped mode: the mean of
    :func:`engines.chunk_operator_sums`, whatever ``weights``) and :func:`with_layer_operators`
    held in memory, bit for bit."""
    subs = adapter.sublayers
    d, keys = adapter.d_model, [(layer, kind) for layer in range(adapter.n_layers) for kind in (*subs, LAYER)]
    shapes = {f"{l}.{k}": (d, d) for l, k in keys}
    own = chunk_positions(token_ids, opts.positions)
    token_ids = as_chunks(token_ids).ids
    meta = {"checkpoint": name, "jacobian_mode": mode, "positions": opts.positions, "n_chunks": str(token_ids.shape[0])}
    public, private = _paths(run_dir, name, mode)
    path = public if opts.save_arrays == "float64" else private
    if path == public:
        writer = run_dir.array_writer(public.stem, shapes, np.float64, **meta)
    else:
        writer = atomic.safetensors_writer(private, shapes, np.float64,
                                           {"config_hash": str(run_dir.manifest["config_hash"]), **meta})
    boot = None
    with writer as store:
        ops = {(l, k): store[f"{l}.{k}"] for l, k in keys}
        sub = {k: v for k, v in ops.items() if k[1] != LAYER}
        if bootstrapped(opts, mode):
            sums = engines.chunk_operator_sums(adapter, token_ids, sublayer_keys_backward(adapter.n_layers, subs), mode,
                                               opts.positions, batch_size, progress=not quiet,
                                               label=label(name) + label_suffix, chunk_positions=own)
            if weights is None:  # the operators alone
                for key, S, counts in sums:
                    sub[key][...] = mean_of_chunks(S, counts)
            else:
                boot = boot_table(sums, weights, len(subs) * adapter.n_layers, d, opts, device, threads, out=sub)
        else:
            engines.mean_operators(adapter, token_ids, jacobian_mode=mode, positions=opts.positions,
                                   batch_size=batch_size, progress=not quiet, label=label(name) + label_suffix, out=sub,
                                   chunk_positions=own)
        for layer in range(adapter.n_layers):
            ops[(layer, LAYER)][...] = layer_operator([ops[(layer, k)] for k in subs], adapter.parallel_residual)
    # the engines' float64 layer copies (1.75 GB a layer at d = 4096) are not needed while the
    # workers analyse the operators; the next computation copies the layers again
    engines.clear_cache(adapter)
    found = _mapped(path)
    if copy and opts.save_arrays == "float32":
        with run_dir.array_writer(public.stem, shapes, np.float32, **meta) as rounded:
            for (l, k), J in found.items():
                rounded[f"{l}.{k}"][...] = J
    return found, boot


def saved_operators(run_dir: RunDirectory, name: str, mode: str) -> dict[tuple[int, str], np.ndarray] | None:
    """The float64 mean operators of checkpoint ``name`` and ``mode`` that the run holds, as
    read-only memory maps in layer order (``attn``, ``mlp``, any ``ple``, ``layer``): the float64
    ``arrays/`` file, else the unit-private copy; None when there is neither (the array is
    float32 or absent and the copy was deleted at the end of an earlier session)."""
    for path in _paths(run_dir, name, mode):
        if path.is_file():
            found = _mapped(path)
            if found and all(a.dtype == np.float64 for a in found.values()):
                return found
    return None


def _mapped(path: Path) -> dict[tuple[int, str], np.ndarray]:
    """Read-only memory maps of an operator file, keyed ``(layer, kind)`` in layer order."""
    found = {(int(k.split(".")[0]), k.split(".")[1]): v for k, v in atomic.map_safetensors(path).items()}
    order = (*SUBLAYERS, LAYER)
    return {k: found[k] for k in sorted(found, key=lambda k: (k[0], order.index(k[1])))}


def operators(run_dir: RunDirectory, name: str, mode: str, get: Callable, token_ids: torch.Tensor | Chunks,
              opts: JacobianOptions, *, batch_size: int, quiet: bool) -> dict[tuple[int, str], np.ndarray]:
    """The float64 mean operators (with the layer operators) of a finished ``ops_<name>_<mode>``
    unit: as saved (:func:`saved_operators`), or computed again from the checkpoint (``get()``)
    the same way, which gives the same numbers. Never a reduced-precision copy."""
    found = saved_operators(run_dir, name, mode)
    if found is None:  # into the unit-private copy (deleted again when the run ends)
        found, _ = compute(run_dir, name, mode, get().adapter, token_ids, replace(opts, save_arrays="none"),
                            batch_size=batch_size, quiet=quiet, label_suffix=", recomputed", copy=False)
    return found


def delete_private_copies(run_dir: RunDirectory) -> None:
    """Delete the unit-private float64 operator copies (end of a run without failures); a
    later session that needs them computes them again (:func:`operators`)."""
    folder = run_dir.root / "units" / STAGE
    for path in sorted(folder.glob(f"*{PRIVATE}")) if folder.is_dir() else ():
        path.unlink(missing_ok=True)
