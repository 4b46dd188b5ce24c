"""Whether the Hugging Face hub can be used, decided at once (no 28 s of client retries).

The hub is *offline* when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``,
``HF_DATASETS_OFFLINE`` for data sets) is set to a true value, or when one quick TCP
connection to the hub endpoint (``HF_ENDPOINT``, default ``https://huggingface.co``; the
HTTPS proxy instead when one is set) fails within :data:`PROBE_TIMEOUT` seconds. Offline, the
loaders use the local cache only (``local_files_only=True``) and refuse what is not cached
with one complete line.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
from urllib.parse import urlsplit

from ..errors import one_line

#: Seconds the connectivity probe waits for a TCP connection.
PROBE_TIMEOUT = 3.0
_TRUE = ("1", "on", "yes", "true")
_PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def offline_flag(*names: str) -> str | None:
    """The first of ``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE`` and ``names`` that is set to a
    true value (``1``, ``on``, ``yes``, ``true``), as ``NAME=value``; None when none is."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *names):
        value = os.environ.get(name, "")
        if value.strip().lower() in _TRUE:
            return f"{name}={value.strip()}"
    constants = sys.modules.get("huggingface_hub.constants")  # read from the environment at its import
    if getattr(constants, "HF_HUB_OFFLINE", False) is True:
        return "HF_HUB_OFFLINE=1"
    return None


def _target() -> tuple[str, int]:
    """Host and port the probe connects to: the HTTPS proxy if one is set, else the endpoint."""
    for name in _PROXIES:
        if os.environ.get(name):
            url = urlsplit(os.environ[name] if "://" in os.environ[name] else "http://" + os.environ[name])
            return url.hostname or "", url.port or 80
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "", url.port or (80 if url.scheme == "http" else 443)


@functools.lru_cache(maxsize=8)
def _probe(host: str, port: int) -> str | None:
    """None when a TCP connection to ``host:port`` opens within :data:`PROBE_TIMEOUT`, else why not."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return None
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, (TimeoutError, socket.timeout)):
            why = f"no answer within {PROBE_TIMEOUT:g} s"
        return f"{host}:{port} cannot be reached ({' '.join(str(why).split())})"


def offline_reason(*flags: str) -> str | None:
    """Why the hub cannot be used now (``HF_HUB_OFFLINE=1 is set``, ``huggingface.co:443
    cannot be reached (...)``), or None when it can. The probe's answer is kept for the
    process (per endpoint), so a run probes once."""
    flag = offline_flag(*flags)
    if flag is not None:
        return f"{flag} is set, which forbids downloads from the hub"
    host, port = _target()
    return _probe(host, port) if host else None


def not_cached(what: str, reason: str, alternative: str) -> str:
    """The one line of an offline request for something that is not cached: ``what`` (e.g.
    ``--model 'org/name'``) is not in the local cache, ``reason``, and how to proceed (the
    download, or ``alternative``, e.g. ``pass --model a local folder or .gguf file``)."""
    if "forbids" in reason:
        fix = f"unset {reason.split('=')[0]} where the network is available to download it once, or {alternative}"
    else:
        fix = f"connect to the network (or set HTTPS_PROXY) to download it once, or {alternative}"
    return f"{what} is not in the local Hugging Face cache and {reason}; {fix}."


def summary(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` of ``exc`` on one line, cut to the leading whole sentences that fit
    in ``limit`` characters (at least the first one), so a message never ends mid-sentence."""
    text = one_line(exc, limit=None)  # cut below, at a sentence
    out = ""
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if out and len(out) + 1 + len(sentence) > limit:
            break
        out = f"{out} {sentence}".strip()
    return out.rstrip(".")
