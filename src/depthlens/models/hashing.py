"""The sha256 fingerprints of a loaded model's provenance: of a weights file, of several files
at once, and of a model configuration.

Examples
--------
>>> combined_sha256({"model.safetensors": "ab12"})
'ab12'
>>> len(combined_sha256({"a.bin": "00", "b.bin": "11"}))
64
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["combined_sha256", "config_sha256", "hash_files", "sha256_file"]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The sha256 of a file, read in chunks of ``chunk`` bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def hash_files(paths: list[Path]) -> dict[str, str]:
    """``{file name: sha256}`` of ``paths``."""
    return {p.name: sha256_file(p) for p in paths}


def combined_sha256(files: dict[str, str]) -> str:
    """One sha256 for the files of :func:`hash_files`: the file's own for a single file, else
    the sha256 of the sorted ``"name digest"`` lines."""
    if len(files) == 1:
        return next(iter(files.values()))
    text = "\n".join(f"{name} {digest}" for name, digest in sorted(files.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def config_sha256(config: Any) -> str:
    """The sha256 of a transformers configuration: its full JSON (defaults included) with
    ``transformers_version`` and ``_name_or_path`` (the folder it was read from) dropped and
    keys sorted, so it depends neither on the version nor on where the model lies."""
    data = json.loads(config.to_json_string(use_diff=False))
    data.pop("transformers_version", None)
    data.pop("_name_or_path", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
