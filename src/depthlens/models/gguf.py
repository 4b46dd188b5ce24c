"""GGUF files (embedded or local): check the header, dequantise once, cache as safetensors.

GGUF files are dequantised to float32 by transformers' GGUF support (about 20 s for
SmolLM2-135M on two cores) and the result is cached as safetensors, keyed by the GGUF
file's sha256, so later loads take about a second. The cache lives in ``$DEPTHLENS_CACHE``,
else ``$XDG_CACHE_HOME/depthlens``, else ``~/.cache/depthlens`` (``cache_dir=`` overrides
all three; see :func:`cache_root`)::

    <cache>/gguf/<sha256 of the .gguf file>/
        config.json  generation_config.json  model.safetensors
        tokenizer.json  tokenizer_config.json  ...
        depthlens.json          # written last: source file, sha256, versions

An entry is built in a temporary sibling folder and renamed into place in one step, so a
half-written entry is never read; a process that loses a race to write the same entry
discards its own copy and uses the winner's.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import torch

from ..errors import ModelError, one_line
from .hashing import sha256_file
from .pretrained import Checkpoint, model_from_folder, quiet_transformers, versions
from .tokenizer import tokenizer_from

__all__ = ["cache_root", "load_gguf"]

_CACHE_FORMAT = 1
_MARKER = "depthlens.json"


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


def _check_gguf_header(path: Path) -> None:
    """Refuse, in one line, a file that cannot be read or does not start with a GGUF v1-3 header."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as exc:
        raise ModelError(f"cannot read GGUF file {path} ({one_line(exc)}); check its permissions.") from None
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
            with quiet_transformers():
                tokenizer = tokenizer_from(folder, gguf_file=fname, local_files_only=True)
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
                f"cannot read GGUF file {path} ({one_line(exc)}); "
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
            **versions(),
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
    """Whether ``entry`` holds a finished cache entry of the current format (its marker file)."""
    marker = entry / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == _CACHE_FORMAT
    except (OSError, ValueError):
        return False


def load_gguf(
    path: Path,
    *,
    spec: str,
    name: str,
    source: str,
    dtype: torch.dtype,
    trust_remote_code: bool,
    cache_dir: str | os.PathLike | None,
) -> Checkpoint:
    """Load a GGUF file through its cache entry, converting it first when the entry is missing.

    Parameters
    ----------
    path : Path
        The ``.gguf`` file.
    spec, name, source : str
        The model spec as given, the short name for tables, and ``"embedded"`` or ``"gguf"``.
    dtype : torch.dtype
        The dtype the cached float32 weights are read in.
    trust_remote_code : bool
        Passed to transformers.
    cache_dir : path-like, optional
        Overrides :func:`cache_root`.

    Returns
    -------
    Checkpoint
        ``provenance`` records the file, its sha256, the cache entry and whether it was cached.

    Raises
    ------
    ModelError
        Missing file, no GGUF header, unsupported version, failed conversion, unreadable cache.
    """
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
        with quiet_transformers():
            model = model_from_folder(entry, dtype, trust_remote_code, use_safetensors=True)
            tokenizer = tokenizer_from(str(entry), local_files_only=True)
    except Exception as exc:
        raise ModelError(
            f"the converted cache {entry} cannot be read ({one_line(exc)}); delete that folder and load again."
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
    return Checkpoint(model, tokenizer, name, provenance)
