"""Layer-streamed models: decoder layers whose weights are in memory only while they are used.

A streamed model is built as a *skeleton*: the Hugging Face module tree of its configuration
with every parameter on torch's ``meta`` device (no storage) and every buffer real (rotary
frequencies and the like are computed as usual; persistent buffers that the source holds, such
as Gemma 4's layer scalars, are read from it). The parameters outside the decoder layers
(embeddings, final norm, LM head) are then filled once; a decoder layer's parameters are
filled from a :class:`LayerSource` when something first touches that layer (a forward pass
through any of its modules, or :meth:`~depthlens.models.adapter.Adapter.layer_weights`) and
put back on ``meta`` when another layer is filled. At most one decoder layer is resident, so
peak weight memory is the parameters outside the layers plus one layer (about 0.9 GB for a
layer of Llama-3.1-8B's shape in float32), whatever the depth.

Streaming changes no number: a layer is filled with exactly the tensors an in-memory model of
the same source holds (the tests compare every stage's tables bit for bit).

Sources
    :class:`LayerwiseInit` generates each layer deterministically from the run seed and the
    layer index with the model class's own initialisation (``random:<family>:init=layerwise``
    specs; in memory or streamed, the same weights). :class:`SafetensorsLayers` reads a saved
    folder's ``*.safetensors`` files through memory maps, one tensor at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelError
from .finite import check_finite_weights

__all__ = ["LayerSource", "LayerwiseInit", "SafetensorsLayers", "Streamer", "materialize_all", "move_buffers",
           "skeleton"]

#: ``(owner module, attribute name)`` of one parameter; tied parameters have several.
Slot = tuple[nn.Module, str]


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers is moved to ``meta`` at once (its
    storage is dropped before any initialisation touches it); buffers stay where they are made."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def skeleton(config: Any) -> nn.Module:
    """The causal LM of ``config`` with every parameter on ``meta`` (float32, eager attention,
    eval mode); buffers are real.

    Raises
    ------
    ModelError
        When transformers cannot build the configuration.
    """
    from transformers import AutoModelForCausalLM

    try:
        with _parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - any failure to build: one line
        reason = " ".join(str(exc).split())
        raise ModelError(f"cannot build {type(config).__name__} for streaming ({type(exc).__name__}: {reason}).") from exc
    return model.eval()


def move_buffers(model: nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    """Move a skeleton's buffers to ``device`` and cast the floating ones to ``dtype``, as
    ``model.to(device=device, dtype=dtype)`` would (which cannot run on ``meta`` parameters)."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.to(device=device, dtype=dtype if buf.is_floating_point() else buf.dtype)


def _slots(module: nn.Module) -> dict[int, tuple[nn.Parameter, list[Slot]]]:
    """Every parameter under ``module`` once (by identity), with every place that holds it."""
    out: dict[int, tuple[nn.Parameter, list[Slot]]] = {}
    for owner in module.modules():
        for name, param in owner._parameters.items():
            if param is not None:
                out.setdefault(id(param), (param, []))[1].append((owner, name))
    return out


def _qualified(model: nn.Module) -> dict[tuple[int, str], str]:
    """The state-dict name of every parameter slot of ``model``, keyed by ``(id(owner module),
    attribute)``: modules outlive the parameters a streamer swaps in and out, so their ids stay
    valid (a tied parameter keeps the name of its first slot)."""
    names: dict[tuple[int, str], str] = {}
    first: dict[int, str] = {}
    for prefix, owner in model.named_modules(remove_duplicate=False):
        for attr, param in owner._parameters.items():
            if param is not None:
                full = f"{prefix}.{attr}" if prefix else attr
                names.setdefault((id(owner), attr), first.setdefault(id(param), full))
    return names


def _name(names: dict[tuple[int, str], str], slots: list[Slot]) -> str:
    """The state-dict name of the parameter held in ``slots``."""
    owner, attr = slots[0]
    return names[(id(owner), attr)]


class LayerSource(ABC):
    """Where a streamed model's parameters come from.

    :meth:`fill` gives real values to the ``meta`` parameters of one part of the model: a
    decoder layer (``layer`` its index) or everything outside the decoder layers (``layer`` None).
    """

    @abstractmethod
    def fill(self, model: nn.Module, part: nn.Module, layer: int | None, names: dict[tuple[int, str], str]) -> None:
        """Replace every ``meta`` parameter under ``part`` by a float32 or checkpoint-dtype
        tensor on the CPU, in place (the streamer casts and moves it).

        Parameters
        ----------
        model : nn.Module
            The whole skeleton (for its configuration and initialisation).
        part : nn.Module
            A decoder layer, or the whole model for the parameters outside the layers.
        layer : int or None
            The layer's index; None for the parameters outside the layers.
        names : dict
            ``(id(owner module), attribute) -> state-dict name`` (:func:`_qualified` of the skeleton).
        """

    @abstractmethod
    def describe(self, layer: int | None) -> str:
        """Where ``layer``'s weights come from, for error messages (a file, a generator)."""

    def load_buffers(self, model: nn.Module) -> None:
        """Give the skeleton's persistent buffers the values the source holds for them (e.g.
        Gemma 4's ``layer_scalar``), in place; the others keep the values the model class
        made. Buffers are small and stay resident. The default holds none."""


def _replace(slots: list[Slot], value: nn.Parameter) -> None:
    for owner, name in slots:
        owner._parameters[name] = value


def _meta_params(part: nn.Module, skip: Iterable[nn.Module] = ()) -> dict[int, tuple[nn.Parameter, list[Slot]]]:
    """The ``meta`` parameters under ``part`` that are not under a module of ``skip``."""
    skipped = {id(p) for m in skip for p in m.parameters()}
    return {k: v for k, v in _slots(part).items() if v[0].is_meta and k not in skipped}


class LayerwiseInit(LayerSource):
    """Weights generated by the model class's own initialisation (``_init_weights``: normal
    projections and embeddings, unit norms, zero biases), one part at a time, under a seed
    derived from ``seed`` and the layer index (so layer 7 is the same whether or not layers 0 to
    6 were made first). Generated on the CPU in float32, so every device gets the same numbers.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def part_seed(self, layer: int | None) -> int:
        """The torch seed of one part: the first 8 bytes of SHA-256 of ``seed`` and the part."""
        key = f"depthlens-layerwise:{self.seed}:{'rest' if layer is None else layer}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1

    def fill(self, model: nn.Module, part: nn.Module, layer: int | None, names: dict[tuple[int, str], str]) -> None:
        for param, slots in _meta_params(part, _layer_modules(model) if layer is None else ()).values():
            _replace(slots, nn.Parameter(torch.empty(param.shape, dtype=torch.float32), requires_grad=False))
        init = getattr(model, "_init_weights")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.part_seed(layer))
            for module in _owned_modules(model, part, layer):
                init(module)

    def describe(self, layer: int | None) -> str:
        return f"the layerwise initialisation under seed {self.seed}"


def _layer_modules(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of ``model`` (through its adapter's family layout)."""
    from .adapter import adapter_for

    return list(adapter_for(model).layers)


def _owned_modules(model: nn.Module, part: nn.Module, layer: int | None) -> list[nn.Module]:
    """The modules of ``part``; for the part outside the layers, those not inside a layer."""
    if layer is not None:
        return list(part.modules())
    inside = {id(m) for lay in _layer_modules(model) for m in lay.modules()}
    return [m for m in model.modules() if id(m) not in inside]


def _renamings(model: nn.Module) -> list[tuple[re.Pattern, str]]:
    """The plain key renamings (regex, replacement) transformers applies to ``model``'s
    checkpoints when it loads them; none where the installed transformers has no such table.
    Conversions that merge or split tensors are not renamings and are left out (a checkpoint
    that needs them reports its first missing tensor)."""
    try:
        from transformers.conversion_mapping import WeightRenaming, get_model_conversion_mapping

        rules = get_model_conversion_mapping(model)
    except Exception:  # noqa: BLE001 - older transformers: checkpoints use the state-dict names
        return []
    return [(re.compile(src), dst) for rule in rules if type(rule) is WeightRenaming
            for src, dst in zip(rule.source_patterns, rule.target_patterns)]


class SafetensorsLayers(LayerSource):
    """Weights read from ``*.safetensors`` files through memory maps, tensor by tensor.

    Checkpoint keys are the state-dict names, with or without the model's
    ``base_model_prefix`` (``model.layers.0...`` or ``layers.0...``), after the key renamings
    transformers applies when it loads the model (``embed_out`` -> ``lm_head`` for GPT-NeoX,
    ``LayerNorm.gamma`` -> ``LayerNorm.weight``; :func:`_renamings`).

    Parameters
    ----------
    files : sequence of Path
        The ``*.safetensors`` files (read lazily, through memory maps).
    model : nn.Module
        The skeleton the files are for (its key renamings).
    index : Path, optional
        A sharded checkpoint's ``model.safetensors.index.json``: its ``weight_map`` names the
        shard of every tensor, so a missing shard is named in the error.

    Raises
    ------
    ModelError
        An unreadable file or index; from :meth:`fill`: a tensor the files do not hold (with
        the missing shard that should hold it, when the index names one), or one of another
        shape, naming the layer and the file.
    """

    def __init__(self, files: Sequence[Path], model: nn.Module, index: Path | None = None) -> None:
        from safetensors import safe_open

        self.files = [Path(f) for f in files]
        self._shard_of: dict[str, str] = {}  # the model's key -> the shard the index names
        if index is not None:
            try:
                weight_map = json.loads(Path(index).read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ModelError(f"cannot read the shard index {index} ({type(exc).__name__}: {exc}); check the file "
                                 "or download it again.") from None
        self._where: dict[str, Path] = {}
        self._open: dict[Path, Any] = {}
        for path in self.files:
            try:
                handle = safe_open(str(path), framework="pt")
            except Exception as exc:  # noqa: BLE001 - unreadable header: one line
                raise ModelError(f"cannot read the safetensors file {path} ({' '.join(str(exc).split())}); "
                                 "check the file or download it again.") from None
            self._open[path] = handle
            for key in handle.keys():
                self._where.setdefault(key, path)
        renames = _renamings(model)

        def renamed(key: str) -> str:
            for pattern, target in renames:
                key = pattern.sub(target, key)
            return key

        self._stored: dict[str, str] = {}  # the model's key -> the file's key
        for key in self._where:
            self._stored.setdefault(renamed(key), key)
        if index is not None:
            self._shard_of = {renamed(str(key)): str(shard) for key, shard in weight_map.items()}

    def _key(self, name: str, prefix: str, table: dict[str, str] | None = None) -> str | None:
        """The file's key of the model's tensor ``name`` (or its entry in ``table``), or None
        when no file holds it."""
        table = self._stored if table is None else table
        for key in (name, name.removeprefix(f"{prefix}.") if prefix else name):
            if key in table:
                return table[key]
        return None

    def fill(self, model: nn.Module, part: nn.Module, layer: int | None, names: dict[tuple[int, str], str]) -> None:
        prefix = getattr(model, "base_model_prefix", "")
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        pending = _meta_params(part, _layer_modules(model) if layer is None else ())
        for param, slots in pending.values():
            name = _name(names, slots)
            key = self._key(name, prefix)
            if key is None:
                if layer is None and tied and name.endswith("lm_head.weight"):
                    continue  # tied to the embeddings below
                shard = self._key(name, prefix, self._shard_of)
                if shard is not None:
                    folder = self.files[0].parent if self.files else "the folder"
                    raise ModelError(f"{self._part(layer)}: tensor {name} is in the shard {shard}, which is missing "
                                     f"from {folder}; download that file again.")
                raise ModelError(f"{self._part(layer)}: tensor {name} is in none of {self._listing()}; the checkpoint "
                                 "does not match its config.json (use the files saved with it).")
            path = self._where[key]
            value = self._open[path].get_tensor(key)
            if tuple(value.shape) != tuple(param.shape):
                raise ModelError(f"{self._part(layer)}: tensor {key} in {path} has shape {tuple(value.shape)}, "
                                 f"the model expects {tuple(param.shape)}; the file does not match config.json.")
            _replace(slots, nn.Parameter(value, requires_grad=False))
        if layer is None and tied:
            model.lm_head.weight = model.get_input_embeddings().weight

    def load_buffers(self, model: nn.Module) -> None:
        prefix = getattr(model, "base_model_prefix", "")
        for owner_name, owner in model.named_modules():
            for attr, buf in owner._buffers.items():
                if buf is None or attr in owner._non_persistent_buffers_set:
                    continue
                key = self._key(f"{owner_name}.{attr}" if owner_name else attr, prefix)
                if key is None:
                    continue
                value = self._open[self._where[key]].get_tensor(key)
                if tuple(value.shape) != tuple(buf.shape):
                    raise ModelError(f"buffer {key} in {self._where[key]} has shape {tuple(value.shape)}, the model "
                                     f"expects {tuple(buf.shape)}; the file does not match config.json.")
                owner._buffers[attr] = value.to(device=buf.device, dtype=buf.dtype)

    def _part(self, layer: int | None) -> str:
        return "the weights outside the decoder layers" if layer is None else f"layer {layer}"

    def _listing(self) -> str:
        shown = ", ".join(str(p) for p in self.files[:3])
        return shown + (f" and {len(self.files) - 3} more" if len(self.files) > 3 else "")

    def describe(self, layer: int | None) -> str:
        return self._listing()


class Streamer:
    """Keeps at most one decoder layer of a skeleton resident (see the module docstring).

    Built by the loaders (``load_model(..., stream_layers=True)``) after the adapter; it fills
    the parameters outside the layers at once and installs forward pre-hooks on every module
    of every decoder layer that make that layer resident first.

    Parameters
    ----------
    model : nn.Module
        A :func:`skeleton`.
    layers : sequence of nn.Module
        Its decoder layers, in order (the adapter's ``layers``).
    source : LayerSource
    dtype, device
        What each filled parameter is cast to and moved to.
    name : str
        The model's name, for the non-finite-weights error.

    Attributes
    ----------
    resident : int or None
        The layer whose weights are in memory now.
    resident_dtype : torch.dtype
        The dtype it was filled in.
    loads : int
        How many times a layer was filled (a cost counter for benchmarks and tests).
    """

    def __init__(self, model: nn.Module, layers: Sequence[nn.Module], source: LayerSource, dtype: torch.dtype,
                 device: torch.device, name: str) -> None:
        self.model, self.layers, self.source = model, list(layers), source
        self.dtype, self.device, self.name = dtype, device, name
        self.resident: int | None = None
        self.resident_dtype = dtype
        self.loads = 0
        self._names = _qualified(model)
        source.load_buffers(model)
        self._fill(model, None, dtype)
        self._handles = [m.register_forward_pre_hook(self._hook(i)) for i, lay in enumerate(self.layers)
                         for m in lay.modules()]

    def _hook(self, layer: int) -> Any:
        def hook(module: nn.Module, args: tuple) -> None:
            self.ensure(layer)

        return hook

    def _fill(self, part: nn.Module, layer: int | None, dtype: torch.dtype) -> None:
        self.source.fill(self.model, part, layer, self._names)
        left = _meta_params(part, self.layers if layer is None else ())
        if left:
            first = _name(self._names, next(iter(left.values()))[1])
            raise ModelError(f"{self.source.describe(layer)} left {first} unset; the source does not cover the model.")
        for value, slots in _slots(part).values():
            if not value.is_meta and (value.dtype != dtype or value.device != self.device):
                _replace(slots, nn.Parameter(value.detach().to(device=self.device, dtype=dtype), requires_grad=False))
        check_finite_weights(part, self.name if layer is None else f"{self.name} (layer {layer})")

    def ensure(self, layer: int, dtype: torch.dtype | None = None) -> None:
        """Make ``layer`` resident (releasing the one that was).

        ``dtype`` (default :attr:`dtype`) is what its parameters are cast to; ``None`` keeps a
        resident layer in whatever dtype it was filled in (what a forward pass through it asks).
        A float64 layer (a lens fit's) is filled from the source, never from a rounded copy.
        """
        if self.resident == layer and dtype in (None, self.resident_dtype):
            return
        if self.resident is not None:
            self.release()
        self.resident, self.resident_dtype = layer, dtype or self.dtype
        try:
            self._fill(self.layers[layer], layer, self.resident_dtype)
        except BaseException:
            self.release()  # a failed fill leaves nothing of the layer behind
            raise
        self.loads += 1

    def release(self) -> None:
        """Put the resident layer's parameters back on ``meta``."""
        if self.resident is None:
            return
        for param, slots in _slots(self.layers[self.resident]).values():
            _replace(slots, nn.Parameter(torch.empty(param.shape, dtype=self.dtype, device="meta"),
                                         requires_grad=False))
        self.resident, self.resident_dtype = None, self.dtype


def materialize_all(model: nn.Module, source: LayerSource) -> nn.Module:
    """Fill every parameter of a :func:`skeleton` from ``source`` (the in-memory model of a
    streamable source: the same tensors a :class:`Streamer` fills one layer at a time)."""
    names = _qualified(model)
    source.fill(model, model, None, names)
    for i, layer in enumerate(_layer_modules(model)):
        source.fill(model, layer, i, names)
    left = [_name(names, slots) for p, slots in _slots(model).values() if p.is_meta]
    if left:
        raise ModelError(f"{source.describe(None)} left {left[0]} unset; the source does not cover the model.")
    return model
