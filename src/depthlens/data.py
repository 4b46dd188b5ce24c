"""Text sources, token chunks, prompts files, the repeated-random-token probe and its control
(§A5).

Sources are named (``"python-docs"``, the offline default; ``"wikitext-2"``, through the
``datasets`` library) or a path to a UTF-8 text file. A loaded source carries the SHA-256 of
its text so a run manifest can say exactly which text was analysed.

A *prompts file* (a ``--text`` path ending in ``.jsonl``, :func:`depthlens.config.is_prompts_file`)
holds one JSON object per line: ``{"text": "...", "positions": [3, 7]}``, ``positions``
optional. Each prompt is tokenized alone (BOS prepended as for text chunks) and is one chunk
of its own length; ``positions`` are the 0-based token positions to analyse in that tokenized
prompt, BOS included (negative ones count from the end), by default every position.
:func:`prompt_chunks` returns them as :class:`Chunks`: the ids right-padded to the longest
prompt, each chunk's length and a mask of its analysed positions. The models are causal, so
every output at a position below a prompt's length is that of the prompt alone: padding only
adds positions after it, which the stages trim away (a padded position never enters a number).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import DataError, InputError, one_line

__all__ = ["DEFAULT_SOURCE", "PROMPT_KEYS", "SOURCES", "Chunks", "Prompt", "PromptsSource", "TextSource", "as_chunks",
           "chunks", "control_random_tokens", "load_prompts", "load_text", "prompt_chunks", "prompt_ids",
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


def prompt_ids(text: str, tokenizer: Any) -> np.ndarray:
    """The token ids of one prompt as a run feeds it to a model: ``text`` tokenized alone,
    without special tokens, BOS first where the tokenizer has one. Raises ``DataError`` for
    fewer than 2 tokens (BOS included)."""
    ids = _token_ids(text, tokenizer)
    if tokenizer.bos_token_id is not None:
        ids = np.concatenate([np.array([tokenizer.bos_token_id], dtype=np.int64), ids])
    if ids.size < 2:
        raise DataError(f"the prompt {text!r} gives {ids.size} token(s); a prompt needs 2 tokens or more: lengthen it.")
    return ids


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


# ----------------------------------------------------------------------------- chunks of any length
@dataclass(frozen=True, eq=False)
class Chunks:
    """The token chunks of a run, each of its own length, right-padded to a common one.

    Text chunks (:func:`chunks`) all have the full length and every position analysed; the
    prompts of a prompts file (:func:`prompt_chunks`) have their own lengths and analysed
    positions. The models are causal, so a chunk's outputs at positions below its length do
    not depend on what pads it: a stage trims every per-chunk array to ``lengths[i]`` and
    averages over positions only where ``analysed`` says so.

    Attributes
    ----------
    ids : LongTensor, shape (N, T)
        Token ids; row i is chunk i's tokens then padding (any valid id) up to ``T``, the
        longest chunk's length.
    lengths : ndarray of int64, shape (N,)
        Each chunk's length (its BOS included), 2 … T.
    analysed : ndarray of bool, shape (N, T)
        The positions to analyse: a subset of each chunk's ``0 … lengths[i] − 1``.
    source : str
        The prompts file (for messages); ``""`` for text chunks.
    lines : tuple of int
        Each prompt's line in its file (1-based); empty for text chunks.
    """

    ids: torch.Tensor
    lengths: np.ndarray
    analysed: np.ndarray
    source: str = ""
    lines: tuple[int, ...] = ()

    @classmethod
    def of(cls, ids: torch.Tensor) -> Chunks:
        """Chunks of equal length ``ids.shape[1]`` with every position analysed (text chunks)."""
        ids = torch.as_tensor(ids)
        if ids.ndim != 2:
            raise InputError(f"token ids have shape {tuple(ids.shape)}; pass chunks as (N, T).")
        n, T = ids.shape
        return cls(ids, np.full(n, T, dtype=np.int64), np.ones((n, T), dtype=bool))

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, T)``, as the padded ids."""
        return tuple(self.ids.shape)  # type: ignore[return-value]

    @property
    def prompts(self) -> bool:
        """Whether the chunks are the prompts of a prompts file."""
        return bool(self.lines)

    @property
    def ragged(self) -> bool:
        """Whether some chunk is shorter than ``T`` or some position is not analysed (else every
        stage runs exactly as on text chunks)."""
        return bool((self.lengths != self.ids.shape[1]).any() or not self.analysed.all())

    def take(self, index: slice | Sequence[int] | np.ndarray) -> Chunks:
        """The chunks ``index`` (a slice or chunk indices), their ids cut to the longest of them:
        a batch is never longer than its longest chunk."""
        picked = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        lengths = self.lengths[picked]
        width = int(lengths.max()) if lengths.size else 0
        rows = torch.from_numpy(picked)
        lines = tuple(self.lines[i] for i in picked) if self.lines else ()
        return Chunks(self.ids[rows, :width], lengths, self.analysed[picked, :width], self.source, lines)

    def positions(self, i: int) -> np.ndarray:
        """The analysed positions of chunk ``i``, ascending (int64)."""
        return np.flatnonzero(self.analysed[i, : self.lengths[i]])

    def rows(self, i: int) -> np.ndarray | None:
        """Chunk ``i``'s analysed positions as a bool mask over its ``lengths[i]`` positions, or
        None when every position is analysed (the row reductions then run unmasked)."""
        mask = self.analysed[i, : self.lengths[i]]
        return None if mask.all() else mask.copy()

    def predicted(self) -> np.ndarray:
        """``(N, T − 1)`` bool: whether the next-token prediction at position ``t`` (of token
        ``t + 1``) counts in a loss: ``t`` analysed and ``t + 1`` inside the chunk."""
        T = self.ids.shape[1]
        inside = np.arange(1, T)[None, :] < self.lengths[:, None]
        return self.analysed[:, :-1] & inside

    def name(self, i: int) -> str:
        """How messages name chunk ``i``: ``prompt 3 (line 4 of FILE)`` or ``chunk 3``."""
        return f"prompt {i} (line {self.lines[i]} of {self.source})" if self.lines else f"chunk {i}"


def as_chunks(token_ids: torch.Tensor | Chunks) -> Chunks:
    """``token_ids`` as :class:`Chunks` (a tensor: equal lengths, every position analysed)."""
    return token_ids if isinstance(token_ids, Chunks) else Chunks.of(token_ids)


#: The keys of a prompts file's objects.
PROMPT_KEYS = ("text", "positions")
_PROMPT_HINT = 'write one JSON object per line, e.g. {"text": "When Mary and John went", "positions": [3, -1]}'


@dataclass(frozen=True)
class Prompt:
    """One line of a prompts file: its ``text``, the ``positions`` given (None: every one) and
    its ``line`` number (1-based)."""

    text: str
    positions: tuple[int, ...] | None
    line: int


@dataclass(frozen=True)
class PromptsSource:
    """A parsed prompts file.

    Attributes
    ----------
    name : str
        The path as given.
    prompts : tuple of Prompt
        In file order (blank lines skipped).
    sha256 : str
        Hex SHA-256 of the file's bytes (what ``sha256sum FILE`` prints), for the manifest.
    """

    name: str
    prompts: tuple[Prompt, ...]
    sha256: str


def _prompt(name: str, number: int, line: str) -> Prompt:
    """One parsed line of a prompts file (one-line :class:`DataError` for anything else)."""
    where = f"prompts file {name} line {number}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where} is not JSON ({exc.msg} at column {exc.colno}); {_PROMPT_HINT}.") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where} is a JSON {type(obj).__name__}, not an object; {_PROMPT_HINT}.")
    unknown = [k for k in obj if k not in PROMPT_KEYS]
    if unknown:
        raise DataError(f"{where} has the key {unknown[0]!r}; the keys are text and positions (optional); "
                        f"{_PROMPT_HINT}.")
    if "text" not in obj:
        raise DataError(f'{where} has no "text"; {_PROMPT_HINT}.')
    text = obj["text"]
    if not isinstance(text, str) or not text.strip():
        shown = "empty" if isinstance(text, str) else f"a JSON {type(text).__name__}"
        raise DataError(f'{where}: "text" is {shown}; give the prompt as a non-empty string.')
    positions = obj.get("positions")
    if positions is None:
        return Prompt(text, None, number)
    if not isinstance(positions, list) or not positions:
        raise DataError(f'{where}: "positions" is {json.dumps(positions)[:40]}; give a non-empty list of token '
                        'positions (0 is BOS; -1 the last token) or leave it out for every position.')
    bad = next((p for p in positions if isinstance(p, bool) or not isinstance(p, int)), None)
    if bad is not None:
        raise DataError(f'{where}: "positions" holds {json.dumps(bad)[:40]}, which is no integer; give token '
                        "positions as integers (0 is BOS; -1 the last token).")
    return Prompt(text, tuple(positions), number)


def load_prompts(path: str | os.PathLike[str]) -> PromptsSource:
    """Read and check a prompts file (JSON lines; see the module notes).

    Each non-blank line is an object with ``"text"`` (a non-empty string) and optionally
    ``"positions"`` (a non-empty list of integers); no other key. Positions are checked against
    the tokenized prompt by :func:`prompt_chunks`.

    Raises
    ------
    DataError
        One line naming the file and line: missing, a directory, not UTF-8, no prompts, a line
        that is not JSON or not an object, a missing or empty ``text``, an unknown key, or
        ``positions`` that are not a non-empty list of integers.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = f.write_text('{"text": "a b c"}\\n\\n{"text": "d e", "positions": [-1]}\\n')
    >>> [(p.line, p.positions) for p in load_prompts(f).prompts]
    [(1, None), (3, (-1,))]
    """
    file = Path(path).expanduser()
    if not file.exists():
        raise DataError(f"prompts file {path} does not exist; pass an existing .jsonl file ({_PROMPT_HINT}).")
    if not file.is_file():
        raise DataError(f"prompts file {path} is not a regular file; pass a .jsonl file.")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise DataError(f"prompts file {path} cannot be read ({exc.strerror}); check its permissions.") from exc
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"prompts file {path} is not valid UTF-8 ({exc.reason} at byte {exc.start}); "
                        "re-encode it as UTF-8.") from exc
    prompts = tuple(_prompt(str(path), number, line) for number, line in enumerate(content.splitlines(), 1)
                    if line.strip())
    if not prompts:
        raise DataError(f"prompts file {path} holds no prompts; {_PROMPT_HINT}.")
    return PromptsSource(str(path), prompts, hashlib.sha256(raw).hexdigest())


def prompt_chunks(source: str | os.PathLike[str] | PromptsSource, tokenizer: Any, n_chunks: int | None = None) -> Chunks:
    """The first ``n_chunks`` prompts of a prompts file as :class:`Chunks`.

    Each prompt is tokenized alone without special tokens, with BOS prepended when the
    tokenizer has one (as :func:`chunks` does for text windows); ``positions`` index that
    tokenized prompt (0 is BOS; negative ones count from the end) and are kept sorted.

    Parameters
    ----------
    source : str, path-like or PromptsSource
        As :func:`load_prompts`.
    tokenizer : transformers.PreTrainedTokenizerBase
    n_chunks : int or None
        How many prompts, from the first; None or more than the file has: all of them.

    Returns
    -------
    Chunks
        ``ids`` right-padded (with each prompt's own first token) to the longest prompt.

    Raises
    ------
    DataError
        As :func:`load_prompts`; a prompt of fewer than 2 tokens (BOS included); a position out
        of range for its prompt, or given twice.
    """
    prompts = source if isinstance(source, PromptsSource) else load_prompts(source)
    n = len(prompts.prompts) if n_chunks is None else min(_positive_int(n_chunks, "n_chunks", 1), len(prompts.prompts))
    bos = tokenizer.bos_token_id
    rows, masks = [], []
    for prompt in prompts.prompts[:n]:
        where = f"prompts file {prompts.name} line {prompt.line}"
        ids = _token_ids(prompt.text, tokenizer)
        if bos is not None:
            ids = np.concatenate([np.array([bos], dtype=np.int64), ids])
        L = int(ids.size)
        if L < 2:
            raise DataError(f"{where} gives {L} token(s){' with BOS' if bos is not None else ''}; a prompt needs 2 "
                            "tokens or more: lengthen it.")
        mask = np.ones(L, dtype=bool)
        if prompt.positions is not None:
            mask[:] = False
            for p in prompt.positions:
                if not -L <= p < L:
                    raise DataError(f"{where}: position {p} is out of range for its {L} tokens (0 … {L - 1}, BOS "
                                    "included; negative from the end); fix the position or the text.")
                if mask[p % L]:
                    raise DataError(f"{where}: position {p} names token {p % L} a second time; list each position "
                                    "once.")
                mask[p % L] = True
        rows.append(ids)
        masks.append(mask)
    T = max(r.size for r in rows)
    ids = np.stack([np.concatenate([r, np.full(T - r.size, r[0], dtype=np.int64)]) for r in rows])
    analysed = np.stack([np.concatenate([m, np.zeros(T - m.size, dtype=bool)]) for m in masks])
    lengths = np.array([r.size for r in rows], dtype=np.int64)
    return Chunks(torch.from_numpy(ids), lengths, analysed, prompts.name,
                  tuple(p.line for p in prompts.prompts[:n]))


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
    """The induction probe ``[BOS, r, r]`` with ``r`` uniform random tokens (§A5).

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
