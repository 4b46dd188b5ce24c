"""Text sources, chunking and the induction probe, with tokenizers built in code."""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import PreTrainedTokenizerFast

from depthlens.data import TextSource, chunks, control_random_tokens, load_text, repeated_random_tokens
from depthlens.errors import DataError, InputError

TEXT = "".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog.\n\n" for i in range(40))
TEXT_SOURCE = TextSource.from_text("inline", TEXT)


def _byte_tokenizer(bos: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer with no merges: one token per byte, decode gives the text back."""
    vocab = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = {"bos_token": "<s>"} if bos else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", model_max_length=16, **special)


def _word_tokenizer(text: str) -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(sorted(set(text.split())))}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="[UNK]")


@pytest.fixture
def byte_tok() -> PreTrainedTokenizerFast:
    return _byte_tokenizer()


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


# --- sources ---------------------------------------------------------------------------------


def test_python_docs_offline() -> None:
    from pydoc_data.topics import topics

    src = load_text()
    assert src.name == "python-docs"
    assert src.text == "\n\n".join(topics[k] for k in sorted(topics))
    assert src.sha256 == hashlib.sha256(src.text.encode("utf-8")).hexdigest()
    assert load_text(src) is src


def test_file_source(text_file: Path) -> None:
    src = load_text(text_file)
    assert src.text == TEXT and src.name == str(text_file)
    assert src.sha256 == hashlib.sha256(TEXT.encode()).hexdigest()
    assert load_text(str(text_file)) == src


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "does not exist"), ("", "empty or only whitespace"), (" \n\t\n", "empty or only whitespace"), (b"\xff\xfe", "not valid UTF-8")],
)
def test_file_errors(tmp_path: Path, content: str | bytes | None, match: str) -> None:
    path = tmp_path / "t.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=match):
        load_text(path)


def test_directory_and_bad_type(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a regular file"):
        load_text(tmp_path)
    with pytest.raises(InputError, match="file path"):
        load_text(3)  # type: ignore[arg-type]


def test_wikitext_without_datasets_says_pass_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(DataError, match="datasets library.*pass a UTF-8 text file path instead"):
        load_text("wikitext-2")


def test_wikitext_download_failure_says_pass_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    class Offline:
        @staticmethod
        def load_dataset(*args: object, **kwargs: object) -> None:
            raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", Offline)
    with pytest.raises(DataError, match="ConnectionError: no network.*pass a UTF-8 text file path"):
        load_text("wikitext-2")


# --- chunks ----------------------------------------------------------------------------------


def test_chunks_shape_bos_and_contiguity(text_file: Path, byte_tok: PreTrainedTokenizerFast) -> None:
    out = chunks(text_file, byte_tok, n_chunks=5, seq_len=33)
    assert out.shape == (5, 33) and out.dtype == torch.int64
    assert torch.all(out[:, 0] == byte_tok.bos_token_id)
    assert not torch.any(out[:, 1:] == byte_tok.bos_token_id)
    # Consecutive windows of 32 bytes: decoding them in order gives the start of the text.
    assert "".join(byte_tok.decode(row[1:].tolist()) for row in out) == TEXT[: 5 * 32]


def test_chunks_without_bos_use_full_windows(text_file: Path) -> None:
    tok = _byte_tokenizer(bos=False)
    out = chunks(text_file, tok, n_chunks=3, seq_len=10)
    assert out.shape == (3, 10)
    assert tok.decode(out.flatten().tolist()) == TEXT[:30]


def test_chunks_seeded_selection(byte_tok: PreTrainedTokenizerFast) -> None:
    letters = np.random.default_rng(0).choice(list("abcdefghij \n"), size=2000)
    src = TextSource.from_text("random", "".join(letters))  # every 19-byte window is unique
    width = 19
    every = chunks(src, byte_tok, 2000 // width, width + 1)
    a = chunks(src, byte_tok, 6, width + 1, seed=3)
    assert torch.equal(a, chunks(src, byte_tok, 6, width + 1, seed=3))
    assert not torch.equal(a, chunks(src, byte_tok, 6, width + 1, seed=4))
    idx = [int(np.flatnonzero((every == row).all(dim=1).numpy())[0]) for row in a]
    assert idx == sorted(set(idx))  # distinct windows of the full tiling, in text order


def test_chunks_too_short_says_how_many(text_file: Path, byte_tok: PreTrainedTokenizerFast) -> None:
    n_tokens = len(TEXT.encode())
    can = n_tokens // 99
    with pytest.raises(DataError, match=rf"has {n_tokens} tokens, enough for {can} chunks of 100 tokens, not 1000; lower --chunks or --seq-len"):
        chunks(text_file, byte_tok, 1000, 100)
    assert chunks(text_file, byte_tok, can, 100).shape == (can, 100)


@pytest.mark.parametrize(("kwargs", "match"), [({"n_chunks": 0}, "n_chunks"), ({"seq_len": 1}, "seq_len"), ({"seed": 1.5}, "seed")])
def test_chunks_validate_arguments(byte_tok: PreTrainedTokenizerFast, kwargs: dict, match: str) -> None:
    args = {"n_chunks": 2, "seq_len": 8, "seed": None, **kwargs}
    with pytest.raises(InputError, match=match):
        chunks(TEXT_SOURCE, byte_tok, **args)


def test_chunks_do_not_warn_about_length(byte_tok: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        chunks(TEXT_SOURCE, byte_tok, 2, 8)  # the text is far longer than model_max_length=16
    assert "maximum sequence length" not in caplog.text


@pytest.mark.shared
def test_chunks_real_wikitext(wikitext_path: Path) -> None:
    src = load_text(wikitext_path)
    tok = _word_tokenizer(src.text)
    out = chunks(src, tok, n_chunks=16, seq_len=128, seed=0)
    assert out.shape == (16, 128)
    assert torch.all(out[:, 0] == tok.bos_token_id)
    assert not torch.any(out[:, 1:] == tok.unk_token_id)
    words = src.text.split()
    first = chunks(src, tok, 1, 11)[0, 1:].tolist()
    assert tok.convert_ids_to_tokens(first) == words[:10]


# --- the induction probe ---------------------------------------------------------------------------


def test_probe_structure(byte_tok: PreTrainedTokenizerFast) -> None:
    out = repeated_random_tokens(byte_tok, n_seqs=8, length=20, seed=1)
    assert out.shape == (8, 41) and out.dtype == torch.int64
    assert torch.all(out[:, 0] == byte_tok.bos_token_id)
    assert torch.equal(out[:, 1:21], out[:, 21:])
    assert not np.isin(out[:, 1:].numpy(), byte_tok.all_special_ids).any()
    assert out[:, 1:].max() < len(byte_tok)
    assert len(torch.unique(out[:, 1:21])) > 100  # random, not constant


def test_probe_determinism_and_defaults(byte_tok: PreTrainedTokenizerFast) -> None:
    a = repeated_random_tokens(byte_tok)
    assert a.shape == (128, 129)
    assert torch.equal(a, repeated_random_tokens(byte_tok, seed=0))
    assert not torch.equal(a, repeated_random_tokens(byte_tok, seed=1))


def test_probe_without_bos_starts_with_eos() -> None:
    tok = _byte_tokenizer(bos=False)
    out = repeated_random_tokens(tok, n_seqs=2, length=3)
    assert torch.all(out[:, 0] == tok.eos_token_id)


def test_probe_validates(byte_tok: PreTrainedTokenizerFast) -> None:
    with pytest.raises(InputError, match="length"):
        repeated_random_tokens(byte_tok, length=0)
    with pytest.raises(InputError, match="seed"):
        control_random_tokens(byte_tok, seed=-1)


def test_control_keeps_the_probe_block_and_draws_the_next_one(byte_tok: PreTrainedTokenizerFast) -> None:
    """``[BOS, r, r′]``: ``r`` is the probe's block, ``r′`` the second draw of the probe's
    seeded stream (by hand: two draws of ordinary-token indices from ``default_rng(seed)``)."""
    probe = repeated_random_tokens(byte_tok, n_seqs=6, length=20, seed=4)
    control = control_random_tokens(byte_tok, n_seqs=6, length=20, seed=4)
    assert control.shape == probe.shape == (6, 41) and control.dtype == torch.int64
    assert torch.equal(control[:, :21], probe[:, :21])
    rng = np.random.default_rng(4)
    ordinary = np.setdiff1d(np.arange(len(byte_tok)), byte_tok.all_special_ids)
    first, second = (ordinary[rng.integers(0, ordinary.size, size=(6, 20))] for _ in range(2))
    np.testing.assert_array_equal(probe[:, 1:21].numpy(), first)
    np.testing.assert_array_equal(control[:, 21:].numpy(), second)
    assert (control[:, 21:] != control[:, 1:21]).float().mean() > 0.9  # no repeat to copy
    assert not np.isin(control[:, 1:].numpy(), byte_tok.all_special_ids).any()
    assert torch.equal(control, control_random_tokens(byte_tok, n_seqs=6, length=20, seed=4))
