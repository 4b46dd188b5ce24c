"""Shared fixtures. Test tiers (DESIGN.md): unit (synthetic arrays, no model), integration
(tiny random models built in code), real (the embedded SmolLM2, marked ``real``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
WIKITEXT = SHARED / "data" / "wikitext-2" / "valid.txt"


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator so every test is deterministic."""
    return np.random.default_rng(12345)


@pytest.fixture(scope="session")
def wikitext_path() -> Path:
    """WikiText-2 validation text from ../shared; skips when the folder is absent."""
    if not WIKITEXT.is_file():
        pytest.skip(f"{WIKITEXT} is absent (../shared is not beside this checkout)")
    return WIKITEXT


SENTENCES = " ".join(f"Sentence number {i} talks about topic {i % 7} and the weather." for i in range(400))
"""Simple English sentences, enough for small runs of tiny random models (byte-level or BPE)."""


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text file of :data:`SENTENCES` for ``--text`` (shared by the command-line tests)."""
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(SENTENCES)
    return path


#: A tiny attention run: two chunks of 16 tokens, few nulls and probe sequences, every head's
#: median chunk certified (what :meth:`depthlens.Run.head` and the report's head explorer read).
HEAD_RUN_OPTIONS = {"chunks": 2, "seq_len": 16, "probe_seqs": 4, "probe_len": 6, "null_samples": 2, "null_chunks": 1,
                    "certify": "median"}


@pytest.fixture(scope="session")
def head_run(tmp_path_factory: pytest.TempPathFactory, text_file: Path):
    """The capture and attention stages of ``random:llama`` on :data:`SENTENCES`
    (:data:`HEAD_RUN_OPTIONS`), as a :class:`depthlens.Run`; shared by the ``Run.head``,
    head-explorer and attention-map tests."""
    import depthlens

    out = tmp_path_factory.mktemp("head_run") / "run"
    return depthlens.analyse("random:llama", text=str(text_file), stages=["capture", "attention"], out=out, preset="quick",
                             jobs=1, **HEAD_RUN_OPTIONS)
