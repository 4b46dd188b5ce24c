"""GGUF files (embedded or local): check the header, dequantise once, cache as safetensors.

GGUF files are dequantised to float32 one tensor at a time with transformers' GGUF steps
(:func:`_write_weights`; memory holds one tensor, so models larger than memory convert too)
and the result is cached as safetensors, keyed by the GGUF file's sha256, so later loads
read the cache (and ``--stream-layers`` reads it one decoder layer at a time). The cache lives in ``$DEPTHLENS_CACHE``,
else ``$XDG_CACHE_HOME/depthlens``, else ``~/.cache/depthlens`` (``cache_dir=`` overrides
all three; see :func:`cache_root`)::

    <cache>/gguf/<sha256 of the .gguf file>/
        config.json  generation_config.json  model.safetensors
        tokenizer.json  tokenizer_config.json  ...
        depthlens.json          # written last: source file, sha256, versions

An entry is built in a temporary sibling folder and renamed into place in one step, so a
half-written entry is never read; a process that loses a race to write the same entry
discards its own copy and uses the winner's.

A model split into shards (``NAME-00001-of-00004.gguf`` …, as llama.cpp's ``gguf-split`` and
gguf-py's writer name them; the first holds the metadata) is loaded from any of its shards:
all of them are converted together into one cache entry, keyed by the sha256 of their sha256s
(:func:`gguf_shards`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..cache import cache_root
from ..errors import ModelError, one_line
from ..runs.atomic import create_safetensors, flush
from .hashing import combined_sha256, hash_files
from .pretrained import Checkpoint, model_from_folder, quiet_transformers, versions
from .tokenizer import tokenizer_from

__all__ = ["cache_root", "gguf_model_name", "gguf_shards", "load_gguf"]

_CACHE_FORMAT = 2
#: GGUF architectures whose expert tensors transformers merges across several file tensors.
_MERGED_ARCHITECTURES = frozenset({"qwen2moe", "qwen3moe", "gpt-oss", "gpt_oss", "minimax-m2"})
_MARKER = "depthlens.json"
#: Text a converted tokenizer must encode: letters, digits, punctuation and a character few
#: vocabularies hold as a piece.
_PROBE_TEXT = "The 3 quick brown foxes, 42 € and \u2603."
#: A shard's file name: ``<stem>-<number>-of-<count>.gguf`` (gguf-py's ``SHARD_NAME_FORMAT``).
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$")


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


def gguf_shards(path: Path) -> list[Path]:
    """The files of the GGUF model ``path`` belongs to: ``[path]``, or every shard of a split
    model (``path`` named ``NAME-000NN-of-000MM.gguf``), first to last.

    Raises
    ------
    ModelError
        A shard number outside its count, or a missing shard (named in the message).
    """
    match = _SHARD.match(path.name)
    if match is None:
        return [path]
    number, count = int(match["number"]), int(match["count"])
    if not 1 <= number <= count:
        raise ModelError(f"{path} is named shard {number} of {count}, which cannot be; check the file name.")
    shards = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [shard for shard in shards if not shard.is_file()]
    if missing:
        raise ModelError(f"GGUF shard {missing[0]} is missing ({len(missing)} of the {count} shards of this model); "
                         f"put every shard in {path.parent}.")
    return shards


def gguf_model_name(path: Path) -> str:
    """The model's short name: the file's stem, without the shard suffix of a split model."""
    match = _SHARD.match(path.name)
    return match["stem"] if match else path.stem


@contextlib.contextmanager
def _whole_model_reader(shards: list[Path]) -> Iterator[Callable[[Path], Any]]:
    """While active, ``gguf.GGUFReader`` is built once per file, and the reader of the first
    shard lists the tensors of every shard: transformers reads a GGUF configuration from the
    file's metadata (in the first shard) and from which tensors it holds (an ``output.weight``
    means an untied LM head). Parsing the metadata (a tokenizer's vocabulary of tens of
    thousands of strings) takes seconds, and a conversion reads it three times (tokenizer,
    configuration, weights). Yields the shared reader of one file with its own tensors only."""
    import gguf

    original = gguf.GGUFReader

    @functools.lru_cache(maxsize=None)
    def own(path: str) -> Any:
        return original(path)

    @functools.lru_cache(maxsize=None)
    def whole(path: str) -> Any:
        found = own(path)
        if len(shards) > 1 and Path(path) == shards[0]:
            found = copy.copy(found)
            found.tensors = [tensor for shard in shards for tensor in own(str(shard)).tensors]
        return found

    def reader(path: Any, *args: Any, **kwargs: Any) -> Any:
        return whole(str(path)) if not args and not kwargs else original(path, *args, **kwargs)

    gguf.GGUFReader = reader
    try:
        yield lambda path: own(str(path))
    finally:
        gguf.GGUFReader = original


def _convert_gguf(shards: list[Path], target: Path, sha: str, trust_remote_code: bool) -> None:
    """Dequantise the GGUF file (or its ``shards``, first to last) tensor by tensor and write a
    complete cache entry at ``target``."""
    path = shards[0]
    fname = path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{sha[:16]}-", dir=target.parent))
    try:
        with _whole_model_reader(shards) as read:
            try:
                with quiet_transformers():
                    tokenizer, config = _gguf_tokenizer_and_config(path, trust_remote_code)
            except ModelError:
                raise
            except Exception as exc:
                raise ModelError(
                    f"cannot read GGUF file {path} ({one_line(exc)}); "
                    "the file may be truncated or of an architecture transformers cannot dequantise."
                ) from None
            _write_weights(shards, config, tmp / "model.safetensors", read)
        config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        with quiet_transformers():
            _check_saved_tokenizer(tmp, path)
        marker = {
            "format": _CACHE_FORMAT,
            "source": str(path),
            "gguf_file": fname,
            "shards": [shard.name for shard in shards],
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


def _gguf_tokenizer_and_config(path: Path, trust_remote_code: bool) -> tuple[Any, Any]:
    """The tokenizer and model configuration of the GGUF file ``path`` (the first shard), read by
    transformers' GGUF reader; for Gemma 4, which that reader carries only in part, the
    configuration is depthlens's own (:func:`~depthlens.models.gguf_gemma4.gemma4_config`) and the
    tokenizer is built from the file as a Gemma tokenizer (transformers' tokenizer lookup would
    read the partial configuration).

    Raises
    ------
    ModelError
        A Gemma 4 file its configuration cannot be read from.
    """
    import gguf
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import read_field

    folder, fname = str(path.parent), path.name
    reader = gguf.GGUFReader(str(path))  # the whole model's, inside _whole_model_reader
    if read_field(reader, "general.architecture")[0] == "gemma4":
        from .gguf_gemma4 import gemma4_config

        config = gemma4_config(reader, path)
        tokenizer = tokenizer_from(folder, gguf_file=fname, local_files_only=True, tokenizer_type="gemma")
    else:
        tokenizer = tokenizer_from(folder, gguf_file=fname, local_files_only=True)
        config = AutoConfig.from_pretrained(folder, gguf_file=fname, local_files_only=True,
                                            trust_remote_code=trust_remote_code)
    return tokenizer, config


def _check_saved_tokenizer(folder: Path, path: Path) -> None:
    """Refuse, in one line, a converted tokenizer that, saved to ``folder`` and read back as
    every later load reads it, cannot encode text (``path``: the GGUF file, for the message): a
    vocabulary whose file names no unknown token fails only when text meets a piece it lacks."""
    try:
        tokenizer_from(str(folder), local_files_only=True)(_PROBE_TEXT, add_special_tokens=False)
    except Exception as exc:
        raise ModelError(f"the tokenizer of {path} cannot encode text ({one_line(exc)}); its tokenizer metadata is "
                         "incomplete (e.g. no tokenizer.ggml.unknown_token_id): convert the model again with a current "
                         "llama.cpp.") from None


@contextlib.contextmanager
def _cached_name_maps() -> Iterator[None]:
    """While active, ``gguf.get_tensor_name_map`` (a pure function of the architecture and the
    depth) is memoised: transformers' ``get_gguf_hf_weights_map`` rebuilds it for every
    submodule, which costs seconds per conversion and grows with depth."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _write_weights(shards: list[Path], config: Any, out: Path, read: Callable[[Path], Any] | None = None) -> None:
    """Write the float32 parameters of ``config``'s causal LM, dequantised from the GGUF file
    (the files ``shards`` of one model, the metadata in the first), as one safetensors file
    ``out``, one tensor at a time.

    Each tensor goes through transformers' own GGUF steps (``gguf.dequantize``, the
    architecture's tensor processor, e.g. the inverse of llama.cpp's q/k permutation, and its
    name map), so the values are those transformers' whole-model GGUF load gives, bit for bit;
    but only one dequantised tensor is in memory at a time (the file is memory-mapped), so a
    model larger than memory converts too. The header is laid out first from the model's
    parameters and persistent buffers (the tied LM head left out, as ``save_pretrained`` does)
    and every tensor is written at its offset as it is read.

    ``read`` gives the ``gguf.GGUFReader`` of one file (its own tensors); default a new one.

    Raises
    ------
    ModelError
        An architecture whose GGUF tensors transformers merges across tensors (mixtures of
        experts), a tensor of the wrong shape, or a parameter or buffer the file does not hold.
    """
    import numpy as np
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          read_field)

    from .streaming import skeleton

    read = read or (lambda shard: GGUFReader(str(shard)))
    path = shards[0]
    reader = read(path)
    architecture = read_field(reader, "general.architecture")[0]
    if architecture in _MERGED_ARCHITECTURES:
        raise ModelError(f"{path} is a {architecture} GGUF file, whose expert tensors depthlens cannot convert; "
                         "pass the model's safetensors folder instead.")
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    model = skeleton(config)
    with _cached_name_maps():
        names = get_gguf_hf_weights_map(model, processor)
    # llama.cpp's converter names a tensor without a suffix (Gemma 4's layer_scalar) NAME.weight
    names.update({f"{key}.weight": name for key, name in names.items() if not key.endswith((".weight", ".bias"))})
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied ones once
    shapes.update({name: tuple(b.shape) for name, b in model.state_dict().items()  # and the persistent buffers
                   if name not in parameters})
    layout = create_safetensors(out, shapes, np.float32, {"format": "pt"})
    written: set[str] = set()
    for shard in shards:
        for tensor in read(shard).tensors:
            _write_tensor(tensor, shard, processor, names, layout, shapes, written)
    flush(layout)
    del layout
    missing = [name for name in shapes if name not in written]
    if missing:
        where = path if len(shards) == 1 else f"{path} and its {len(shards) - 1} other shards"
        raise ModelError(f"{where} hold{'s' if len(shards) == 1 else ''} no tensor for {missing[0]}"
                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                         + "; the file is incomplete or of an architecture depthlens cannot convert.")


def _write_tensor(tensor: Any, path: Path, processor: Any, names: dict[str, str], layout: dict[str, Any],
                  shapes: dict[str, tuple[int, ...]], written: set[str]) -> None:
    """Dequantise one GGUF tensor of ``path`` through transformers' steps and write the
    parameters it gives into ``layout`` (see :func:`_write_weights`)."""
    import numpy as np
    from gguf import dequantize

    parsed: dict[str, dict] = {"tensors": {}}
    result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                               tensor_key_mapping=names, parsed_parameters=parsed)
    produced = dict(parsed["tensors"])
    if result.name in names:
        produced[names[result.name]] = result.weights
    for name, value in produced.items():
        if name not in layout:
            continue  # a buffer, or the tied LM head
        data = np.asarray(value)
        if data.shape != shapes[name]:
            raise ModelError(f"{path}: tensor {tensor.name} has shape {data.shape} as {name}, the model expects "
                             f"{shapes[name]}; the file does not match its own metadata.")
        layout[name][...] = data
        written.add(name)


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
    stream_layers: bool = False,
) -> Checkpoint:
    """Load a GGUF file through its cache entry, converting it first when the entry is missing.

    Parameters
    ----------
    path : Path
        The ``.gguf`` file, or any shard of a split model (:func:`gguf_shards`).
    spec, name, source : str
        The model spec as given, the short name for tables, and ``"embedded"`` or ``"gguf"``.
    dtype : torch.dtype
        The dtype the cached float32 weights are read in.
    trust_remote_code : bool
        Passed to transformers.
    cache_dir : path-like, optional
        Overrides :func:`cache_root`.
    stream_layers : bool
        Return a skeleton whose decoder layers are read from the cache entry one at a time
        (:class:`~depthlens.models.streaming.SafetensorsLayers`) instead of the whole model.

    Returns
    -------
    Checkpoint
        ``provenance`` records the file (the first shard), the sha256 of every file and their
        combined sha256, the cache entry and whether it was cached.

    Raises
    ------
    ModelError
        Missing file or shard, no GGUF header, unsupported version, failed conversion,
        unreadable cache.
    """
    if not path.is_file():
        raise ModelError(f"GGUF file {path} does not exist; check the path.")
    shards = gguf_shards(path)
    for shard in shards:
        _check_gguf_header(shard)
    hashes = hash_files(shards)
    sha = combined_sha256(hashes)  # a single file's own sha256
    entry = cache_root(cache_dir) / "gguf" / sha
    cached = _cache_complete(entry)
    if not cached:
        if entry.exists():  # stale or foreign: move it aside, then rebuild
            shutil.rmtree(entry, ignore_errors=True)
        _convert_gguf(shards, entry, sha, trust_remote_code)
    try:
        with quiet_transformers():
            tokenizer = tokenizer_from(str(entry), local_files_only=True)
            if stream_layers:
                from transformers import AutoConfig

                from .streaming import SafetensorsLayers, skeleton

                model = skeleton(AutoConfig.from_pretrained(str(entry), trust_remote_code=trust_remote_code))
                layers = SafetensorsLayers([entry / "model.safetensors"], model)
            else:
                model, layers = model_from_folder(entry, dtype, trust_remote_code, use_safetensors=True), None
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"the converted cache {entry} cannot be read ({one_line(exc)}); delete that folder and load again."
        ) from None
    provenance = {
        "spec": spec,
        "revision": None,
        "source": source,
        "path": str(shards[0]),
        "sha256": sha,
        "files": hashes,
        "weights_format": "gguf",
        "cache": str(entry),
        "cached": cached,
    }
    return Checkpoint(model, tokenizer, name, provenance, layers)
