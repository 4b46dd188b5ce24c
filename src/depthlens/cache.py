"""The depthlens cache folder (converted GGUF models, stored calibrations)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


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
