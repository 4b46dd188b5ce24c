"""Text sources, token chunks, the repeated-random-token probe and its control (METHODS A5).

Sources are named (``"python-docs"``, the offline default; ``"wikitext-2"``, through the
``datasets`` library) or a path to a UTF-8 text file. A loaded source carries the SHA-256 of
its text so a run manifest can say exactly which text was analysed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DataError, InputError, one_line

__all__ = ["DEFAULT_SOURCE", "SOURCES", "TextSource", "chunks", "control_random_tokens", "load_text",
           "repeated_random_tokens"]

DEFAULT_SOURCE = "python-docs"
SOURCES = ("python-docs", "wikitext-2")
_FILE_HINT = "pass a UTF-8 text file path instead (e.g. a local copy of WikiText-2 valid.txt)"


@dataclass(frozen=True)
class TextSource:
    """A loaded text.

    Attributes
    ----------
    name : str
        The source name (``"python-docs"``, ``"wikitext-2"``) or the file path as given.
    text : str
        The whole text.
    sha256 : str
        Hex SHA-256 of ``text`` encoded as UTF-8 (provenance for the run manifest).
    """

    name: str
    text: str
    sha256: str

    @classmethod
    def from_text(cls, name: str, text: str) -> TextSource:
        """Build a source from a name and its text, computing the hash; refuses blank text."""
        if not text.strip():
            raise DataError(f"text source {name} is empty or only whitespace; pass a source with text in it.")
        return cls(name=name, text=text, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())


def _python_docs() -> str:
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:
        raise DataError(f"this Python lacks pydoc_data, which holds the python-docs corpus; {_FILE_HINT}.") from exc
    return "\n\n".join(topics[key] for key in sorted(topics))


def _wikitext_2() -> str:
    try:
        import datasets
    except ImportError as exc:
        raise DataError(
            f"wikitext-2 needs the datasets library, which is not installed (pip install 'depthlens[hub]'); {_FILE_HINT}."
        ) from exc
    from .models import hub

    # Decided at once (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE, or one quick probe), not after
    # the client's retries: offline, datasets reads its cache only.
    offline = hub.offline_reason("HF_DATASETS_OFFLINE")
    settings = getattr(datasets, "config", None)
    if offline is not None and settings is not None:
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            if hasattr(settings, name):
                setattr(settings, name, True)
    try:
        ds = datasets.load_dataset("wikitext", "wikitext-2-v1", split="validation")
    except Exception as exc:  # network, hub and cache failures surface as many exception types
        if offline is not None:
            raise DataError(hub.not_cached(f"--text wikitext-2 ({hub.summary(exc, 160)})", offline, _FILE_HINT)) from None
        raise DataError(f"could not load wikitext-2 through datasets ({one_line(exc)}); {_FILE_HINT}.") from exc
    return "".join(ds["text"])


def _read_file(path: Path) -> str:
    if not path.exists():
        raise DataError(f"text file {path} does not exist; pass an existing UTF-8 text file or one of {', '.join(SOURCES)}.")
    if not path.is_file():
        raise DataError(f"{path} is not a regular file; pass a UTF-8 text file path.")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"text file {path} is not valid UTF-8 ({exc.reason} at byte {exc.start}); re-encode it as UTF-8.") from exc
    except OSError as exc:
        raise DataError(f"text file {path} cannot be read ({exc.strerror}); check its permissions.") from exc


def load_text(source: str | os.PathLike[str] | TextSource = DEFAULT_SOURCE) -> TextSource:
    """Load a text source.

    Parameters
    ----------
    source : str, path-like or TextSource
        ``"python-docs"`` (default; the 79 ``pydoc_data`` topics that ship with CPython,
        joined in sorted key order with blank lines, about 465k characters, offline);
        ``"wikitext-2"`` (the WikiText-2 validation split, ``wikitext-2-v1``, the same
        tokenised form as the usual ``valid.txt``, through ``datasets``); or a path to a
        UTF-8 text file. Names win over files of the same name (pass ``./python-docs`` for
        the file). A TextSource is returned unchanged.

    Returns
    -------
    TextSource

    Raises
    ------
    DataError
        If ``datasets`` is missing or cannot fetch WikiText-2, or the file is missing, a
        directory, not UTF-8, unreadable, empty or only whitespace.

    Examples
    --------
    >>> load_text("python-docs").name
    'python-docs'
    """
    if isinstance(source, TextSource):
        return source
    if source == "python-docs":
        return TextSource.from_text("python-docs", _python_docs())
    if source == "wikitext-2":
        return TextSource.from_text("wikitext-2", _wikitext_2())
    if not isinstance(source, (str, os.PathLike)):
        raise InputError(f"source is a {type(source).__name__}; pass {' or '.join(SOURCES)}, a file path or a TextSource.")
    path = Path(source).expanduser()
    return TextSource.from_text(str(source), _read_file(path))


def _positive_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} is {value!r}; pass an integer ≥ {minimum}.")
    return int(value)


def _token_ids(text: str, tokenizer: Any) -> np.ndarray:
    # One call on the whole text: splitting would change tokens at the seams. verbose=False
    # silences the "longer than model_max_length" warning, which does not apply here.
    ids = tokenizer(text, add_special_tokens=False, verbose=False, return_attention_mask=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


def chunks(
    source: str | os.PathLike[str] | TextSource,
    tokenizer: Any,
    n_chunks: int,
    seq_len: int,
    seed: int | None = None,
) -> torch.Tensor:
    """Cut a text into consecutive, non-overlapping token windows.

    The whole text is tokenized once without special tokens. With a BOS token
    (``tokenizer.bos_token_id`` not None) the windows hold ``seq_len − 1`` text tokens and
    each chunk is ``[BOS, window]``; otherwise the windows hold ``seq_len`` tokens. The tail
    that does not fill a window is dropped.

    Parameters
    ----------
    source : str, path-like or TextSource
        As :func:`load_text`.
    tokenizer : transformers.PreTrainedTokenizerBase
        Called as ``tokenizer(text, add_special_tokens=False, verbose=False)``.
    n_chunks : int
        Number of chunks, ≥ 1.
    seq_len : int
        Tokens per chunk including BOS, ≥ 2.
    seed : int or None
        None takes the first ``n_chunks`` windows; an integer draws ``n_chunks`` distinct
        windows with ``numpy.random.default_rng(seed)`` and returns them in text order.

    Returns
    -------
    torch.Tensor, shape (n_chunks, seq_len), dtype int64
        Deterministic for a given source, tokenizer and seed.

    Raises
    ------
    InputError
        If n_chunks < 1, seq_len < 2 or seed is not an integer or None.
    DataError
        If the source cannot be loaded, or is too short: the message says how many chunks
        of this length it can give.

    Notes
    -----
    Cost: one tokenizer pass over the text (about a second per megabyte for fast
    tokenizers), then O(n_chunks · seq_len).
    """
    n = _positive_int(n_chunks, "n_chunks", 1)
    length = _positive_int(seq_len, "seq_len", 2)
    if seed is not None:
        _positive_int(seed, "seed", 0)
    text = load_text(source)
    ids = _token_ids(text.text, tokenizer)
    bos = tokenizer.bos_token_id
    width = length - 1 if bos is not None else length
    available = len(ids) // width
    if n > available:
        raise DataError(
            f"text source {text.name} has {len(ids)} tokens, enough for {available} chunks of {length} tokens, "
            f"not {n}; lower --chunks or --seq-len, or pass a longer --text."
        )
    windows = ids[: available * width].reshape(available, width)
    picked = np.arange(n) if seed is None else np.sort(np.random.default_rng(seed).choice(available, n, replace=False))
    out = windows[picked]
    if bos is not None:
        out = np.concatenate([np.full((n, 1), bos, dtype=np.int64), out], axis=1)
    return torch.from_numpy(np.ascontiguousarray(out))


def _random_blocks(tokenizer: Any, n_seqs: int, length: int, seed: int, blocks: int) -> tuple[int, list[np.ndarray]]:
    """The start token and ``blocks`` consecutive draws, each ``(n_seqs, length)``, of ordinary
    tokens from ``numpy.random.default_rng(seed)`` (the probe's stream: its first draw is the
    probe's block ``r``, whatever ``blocks`` is)."""
    n = _positive_int(n_seqs, "n_seqs", 1)
    m = _positive_int(length, "length", 1)
    rng = np.random.default_rng(_positive_int(seed, "seed", 0))
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise InputError("tokenizer has neither a BOS nor an EOS token to start the probe; set tokenizer.bos_token.")
    ordinary = np.setdiff1d(np.arange(len(tokenizer)), np.asarray(tokenizer.all_special_ids, dtype=np.int64))
    if ordinary.size == 0:
        raise InputError("tokenizer has no ordinary (non-special) tokens to draw the probe from.")
    return int(start), [ordinary[rng.integers(0, ordinary.size, size=(n, m))] for _ in range(blocks)]


def _sequences(start: int, blocks: list[np.ndarray]) -> torch.Tensor:
    """``[start, blocks[0], blocks[1], …]`` row by row, as an int64 tensor."""
    column = np.full((blocks[0].shape[0], 1), start, dtype=np.int64)
    return torch.from_numpy(np.concatenate([column, *blocks], axis=1))


def repeated_random_tokens(tokenizer: Any, n_seqs: int = 128, length: int = 64, seed: int = 0) -> torch.Tensor:
    """The induction probe ``[BOS, r, r]`` with ``r`` uniform random tokens (METHODS A5).

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        Supplies the vocabulary size (``len(tokenizer)``, added tokens included), the special
        token ids to avoid (``all_special_ids``) and the start token: ``bos_token_id``, or
        where a tokenizer has none, ``eos_token_id`` (GPT-2 style models start documents
        with ``<|endoftext|>``).
    n_seqs : int
        Number of sequences, ≥ 1.
    length : int
        Length of ``r``, ≥ 1; the second copy starts at position ``1 + length``.
    seed : int
        Seed of ``numpy.random.default_rng``; the same seed gives the same probe.

    Returns
    -------
    torch.Tensor, shape (n_seqs, 1 + 2·length), dtype int64
        Column 0 is the start token; ``out[:, 1:1+length]`` equals ``out[:, 1+length:]``;
        no random token is a special token.

    Raises
    ------
    InputError
        If a size or the seed is not a valid integer, or the tokenizer has neither BOS nor
        EOS, or no ordinary token.
    """
    start, (r,) = _random_blocks(tokenizer, n_seqs, length, seed, 1)
    return _sequences(start, [r, r])


def control_random_tokens(tokenizer: Any, n_seqs: int = 128, length: int = 64, seed: int = 0) -> torch.Tensor:
    """The length-matched control of the induction probe: ``[BOS, r, r′]``, where ``r`` is the
    probe's block (:func:`repeated_random_tokens` with the same arguments) and ``r′`` a fresh
    block of uniform random tokens, the next draw of the same seeded stream. Same length as
    the probe, no repeat: induction cannot engage.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        As :func:`repeated_random_tokens`.
    n_seqs : int
        Number of sequences, ≥ 1.
    length : int
        Length of ``r`` and of ``r′``, ≥ 1.
    seed : int
        Seed of ``numpy.random.default_rng``, the probe's seed.

    Returns
    -------
    torch.Tensor, shape (n_seqs, 1 + 2·length), dtype int64
        ``out[:, :1+length]`` equals the probe's; ``out[:, 1+length:]`` is ``r′``; no random
        token is a special token.

    Raises
    ------
    InputError
        As :func:`repeated_random_tokens`.
    """
    start, (r, fresh) = _random_blocks(tokenizer, n_seqs, length, seed, 2)
    return _sequences(start, [r, fresh])
