"""The Jacobian-lens artifact: a ``torch.save`` dict, as TransformerLens writes and reads it.

Keys of the reference format:

- ``J``: source layer (int) → ``(d, d)`` tensor (float16 in the published lenses);
- ``n_prompts`` (int), ``source_layers`` (list of int, the keys of ``J`` in order),
  ``d_model`` (int), and optionally ``metadata`` (a dict of plain values). A fit's metadata
  holds TransformerLens's provenance keys (:data:`PROVENANCE_KEYS`, :func:`fit_metadata`):
  its ``JacobianLens.validate_model`` compares ``model_name`` and ``model_revision`` with the
  model it reads with, and refuses source layers outside ``0 .. L − 2``.

A fit checkpoint holds ``jacobian_sum`` (layer → the sum over prompts) and ``n_done`` (the
prompts summed) instead of ``J``; its transport is ``jacobian_sum / n_done``.

Files are read with ``torch.load(weights_only=True)`` only (no code in a file runs) and memory
mapped, so analysing a lens holds one matrix at a time in float64
(:meth:`Transport.matrix`).
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..runs.atomic import atomic_path

__all__ = ["PROVENANCE_KEYS", "Transport", "fit_metadata", "read_transport", "write_transport"]

#: The provenance keys of a fitted lens's ``metadata``, as TransformerLens's
#: ``JacobianLens.fit`` writes them.
PROVENANCE_KEYS: tuple[str, ...] = (
    "model_name", "model_revision", "transformer_lens_version", "model_system", "estimator", "processing",
    "hook_convention", "corpus", "n_prompts", "fit_dtype", "target_layer", "dim_batch", "max_seq_len",
    "skip_first_positions", "transformer_lens_fit")


def fit_metadata(*, model_name: str, model_revision: str | None, corpus: str, n_prompts: int, n_layers: int,
                 max_seq_len: int, skip_first: int, skip_last: int, version: str) -> dict[str, Any]:
    """The ``metadata`` of a lens that depthlens fitted: every key of :data:`PROVENANCE_KEYS`
    with what holds for a depthlens fit, then depthlens's own keys.

    ``model_name`` is the model as loaded (a hub id, a path or a ``random:`` spec): the name a
    TransformerLens bridge must be booted with for its check to pass. ``model_revision`` is the
    hub commit the weights came from, or None (no check). The fit is TransformerLens's estimator
    (``estimator="jacobian_lens"``, block outputs ``blocks.{layer}.hook_out``, raw Hugging Face
    weights, the final block as target) computed in float64 (``fit_dtype``);
    ``transformer_lens_fit`` is False and ``transformer_lens_version`` None, so that
    TransformerLens's ``merge`` never mixes it with a lens it fitted itself. ``dim_batch`` is
    None: the directions per backward pass follow a memory budget and change no number.

    Examples
    --------
    >>> meta = fit_metadata(model_name="org/m", model_revision=None, corpus="wikitext-2", n_prompts=4,
    ...                     n_layers=30, max_seq_len=128, skip_first=16, skip_last=1, version="1.0")
    >>> [k for k in PROVENANCE_KEYS if k not in meta], meta["target_layer"]
    ([], 29)
    """
    return {
        "model_name": model_name, "model_revision": model_revision, "transformer_lens_version": None,
        "model_system": "transformers", "estimator": "jacobian_lens",
        "processing": {"compatibility_mode": False, "weight_basis": "raw_huggingface"},
        "hook_convention": "blocks.{layer}.hook_out", "corpus": corpus, "n_prompts": int(n_prompts),
        "fit_dtype": "float64", "target_layer": int(n_layers) - 1, "dim_batch": None, "max_seq_len": int(max_seq_len),
        "skip_first_positions": int(skip_first), "transformer_lens_fit": False,
        "skip_last_positions": int(skip_last), "fitted_by": f"depthlens {version}",
    }


def _check_plain(value: Any, where: str) -> None:
    """Refuse a metadata value that ``torch.load(weights_only=True)`` could not read back."""
    if value is None or type(value) in (bool, int, float, str):
        return
    if type(value) in (list, tuple):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise InputError(f"{where} has the key {key!r}; metadata keys must be strings.")
            _check_plain(item, f"{where}.{key}")
        return
    raise InputError(f"{where} is a {type(value).__name__}; metadata holds None, bool, int, float, str, lists and "
                     "dicts of them.")


@dataclass(frozen=True, eq=False)
class Transport:
    """A set of transport matrices, one per source layer, read lazily from an artifact.

    Attributes
    ----------
    path : Path
        The artifact.
    source_layers : tuple of int
        The layers with a matrix, in the artifact's order.
    d_model : int
        The width ``d`` of every matrix.
    n_prompts : int
        The prompts averaged over (``n_done`` of a fit checkpoint).
    metadata : dict
        The artifact's ``metadata`` (empty when it has none).
    dtype : str
        The stored dtype of the matrices (``float16`` in the published lenses).
    """

    path: Path
    source_layers: tuple[int, ...]
    d_model: int
    n_prompts: int
    metadata: dict = field(default_factory=dict)
    dtype: str = "float16"
    _matrices: Mapping[int, torch.Tensor] = field(default_factory=dict, repr=False)
    _scale: float = 1.0

    def matrix(self, layer: int) -> np.ndarray:
        """``J_layer`` as a float64 ``(d, d)`` array (exact: every stored value is a float64)."""
        if layer not in self._matrices:
            raise InputError(f"{self.path} has no transport of layer {layer}; its source layers are "
                             f"{list(self.source_layers)}.")
        out = self._matrices[layer].to("cpu", torch.float64).numpy()
        return out / self._scale if self._scale != 1.0 else out

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(layer, J_layer)`` in source-layer order, one float64 matrix alive at a time."""
        for layer in self.source_layers:
            yield layer, self.matrix(layer)


def _refuse(path: Path, why: str) -> InputError:
    return InputError(f"{path} is not a Jacobian-lens artifact: {why}.")


def _layer_map(path: Path, value: Any, key: str) -> dict[int, torch.Tensor]:
    """``value`` (``J`` or ``jacobian_sum``) as layer → square floating tensor, all of one width."""
    if not isinstance(value, Mapping) or not value:
        raise _refuse(path, f"'{key}' is not a non-empty dict of layer -> matrix")
    out: dict[int, torch.Tensor] = {}
    for layer, matrix in value.items():
        index = int(layer) if isinstance(layer, (int, np.integer)) or (isinstance(layer, str) and layer.isdigit()) else None
        if index is None or index < 0:
            raise _refuse(path, f"'{key}' has the key {layer!r}, which is not a layer number")
        if not (isinstance(matrix, torch.Tensor) and matrix.ndim == 2 and matrix.shape[0] == matrix.shape[1]
                and matrix.is_floating_point()):
            shape = tuple(matrix.shape) if isinstance(matrix, torch.Tensor) else type(matrix).__name__
            raise _refuse(path, f"'{key}'[{layer!r}] is not a square floating-point matrix ({shape})")
        out[index] = matrix
    widths = {m.shape[0] for m in out.values()}
    if len(widths) != 1:
        raise _refuse(path, f"the matrices of '{key}' have different widths {sorted(widths)}")
    return out


def read_transport(path: str | Path) -> Transport:
    """Open the artifact ``path`` (the reference format or a fit checkpoint; see the module).

    Nothing but tensors and plain values is unpickled (``weights_only=True``), and the tensors
    stay memory mapped: matrices are read when :meth:`Transport.matrix` asks for them.

    Raises
    ------
    InputError
        One line: the file is missing, is not a ``torch.save`` file ``weights_only`` can read
        (e.g. one that pickles code), lacks ``J`` (or ``jacobian_sum`` and ``n_done``), or its
        ``d_model``, ``source_layers`` or ``n_prompts`` disagree with its matrices.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no Jacobian-lens artifact at {path}; pass the .pt file a lens fit wrote.")
    try:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # an old (non-zip) torch.save file cannot be memory mapped
            if "mmap" not in str(exc):
                raise
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _refuse(path, f"torch.load(weights_only=True) refused it ({first[:160]})") from None
    if not isinstance(obj, Mapping):
        raise _refuse(path, f"it holds a {type(obj).__name__}, not a dict")
    if "J" in obj:
        matrices, n_prompts, scale = _layer_map(path, obj["J"], "J"), obj.get("n_prompts"), 1.0
    elif "jacobian_sum" in obj and "n_done" in obj:
        matrices, n_prompts = _layer_map(path, obj["jacobian_sum"], "jacobian_sum"), obj["n_done"]
        if not isinstance(n_prompts, int) or n_prompts < 1:
            raise _refuse(path, f"its n_done is {n_prompts!r}, not a positive count of prompts")
        scale = float(n_prompts)
    else:
        raise _refuse(path, f"it has neither 'J' nor 'jacobian_sum' and 'n_done' (keys: {sorted(map(str, obj))})")
    d = next(iter(matrices.values())).shape[0]
    if obj.get("d_model", d) != d:
        raise _refuse(path, f"its d_model is {obj['d_model']!r} but its matrices are {d} x {d}")
    layers = tuple(matrices)
    listed = obj.get("source_layers")
    if listed is not None:
        if not isinstance(listed, (list, tuple)) or sorted(int(x) for x in listed) != sorted(layers):
            raise _refuse(path, f"its source_layers {listed!r} are not the layers of its matrices {sorted(layers)}")
        layers = tuple(int(x) for x in listed)
    if n_prompts is not None and (not isinstance(n_prompts, int) or n_prompts < 0):
        raise _refuse(path, f"its n_prompts is {n_prompts!r}, not a count")
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise _refuse(path, f"its metadata is a {type(metadata).__name__}, not a dict")
    dtypes = {str(m.dtype).removeprefix("torch.") for m in matrices.values()}
    return Transport(path, layers, int(d), int(n_prompts or 0), dict(metadata), "/".join(sorted(dtypes)),
                     matrices, scale)


def write_transport(path: str | Path, matrices: Mapping[int, np.ndarray | torch.Tensor], n_prompts: int,
                    metadata: Mapping[str, Any] | None = None, dtype: torch.dtype = torch.float16) -> Path:
    """Write ``matrices`` (source layer → ``(d, d)``) as a Jacobian-lens artifact at ``path``
    (atomically), in the reference format that TransformerLens loads.

    ``dtype`` is the stored precision (float16 by default, as the published lenses: a relative
    rounding of 2⁻¹¹ per entry; pass ``torch.float32`` or ``torch.float64`` to keep more).
    ``metadata`` holds plain values (str, int, float, bool, lists and dicts of them), which
    ``torch.load(weights_only=True)`` reads back. Returns ``path``.

    Raises
    ------
    InputError
        No matrices, a matrix that is not square, finite and of the common width, a negative
        ``n_prompts``, a value of ``float16``'s range exceeded (it would be stored as inf), or
        metadata that is not plain values.
    """
    if not matrices:
        raise InputError("write_transport needs at least one layer's matrix.")
    _check_plain(dict(metadata or {}), "metadata")
    if n_prompts < 0:
        raise InputError(f"n_prompts is {n_prompts}; pass the number of prompts averaged over (>= 0).")
    out: dict[int, torch.Tensor] = {}
    d = None
    for layer, matrix in matrices.items():
        t = torch.as_tensor(np.asarray(matrix) if not isinstance(matrix, torch.Tensor) else matrix).detach().cpu()
        if t.ndim != 2 or t.shape[0] != t.shape[1] or (d is not None and t.shape[0] != d):
            raise InputError(f"the matrix of layer {layer} has shape {tuple(t.shape)}; every matrix must be "
                             f"square and of one width.")
        if not torch.isfinite(t).all():
            raise InputError(f"the matrix of layer {layer} is not finite.")
        d = t.shape[0]
        stored = t.to(dtype)
        if not torch.isfinite(stored).all():
            raise InputError(f"the matrix of layer {layer} exceeds the range of {dtype}; pass dtype=torch.float32.")
        out[int(layer)] = stored.contiguous()
    out = dict(sorted(out.items()))
    payload = {"J": out, "n_prompts": int(n_prompts), "source_layers": list(out), "d_model": int(d),
               "metadata": dict(metadata or {})}
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    return path
