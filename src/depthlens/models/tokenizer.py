"""Tokenizers: the byte-level tokenizer of random models, built in code, and the tokenizer of a
saved checkpoint (folder, hub id or GGUF file) read through transformers.

Examples
--------
>>> tok = byte_tokenizer(300, bos_token_id=0, eos_token_id=1)
>>> ids = tok("hé").input_ids
>>> len(ids), tok.decode(ids)
(3, 'hé')
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ModelError

__all__ = ["byte_tokenizer", "random_tokenizer", "tokenizer_from"]

# bytes that never occur in UTF-8 text; they are the first to go when the vocabulary is small
_NON_UTF8 = tuple([0xC0, 0xC1, *range(0xF5, 0x100)])


def byte_tokenizer(
    vocab_size: int,
    bos_token_id: int | None = 0,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """A byte-level tokenizer with exactly ``vocab_size`` entries, built in code.

    Every UTF-8 byte of the text is one token. Special tokens sit at the ids the model's
    configuration names (``<|bos|>``, ``<|eos|>``, ``<|pad|>``; one ``<|endoftext|>``
    when BOS and EOS share an id); the 256 byte values fill the free ids in byte order, the
    13 values that never occur in UTF-8 text last, and ``<|unused_k|>`` fills what is left.
    Like SmolLM2's tokenizer it adds no BOS by itself. Built with the ``tokenizers`` library
    and wrapped in ``PreTrainedTokenizerFast``, so it saves and loads like any other.

    Parameters
    ----------
    vocab_size : int
        Must leave room for the specials plus the 243 bytes of UTF-8 text.
    bos_token_id, eos_token_id, pad_token_id : int or None
        Ids of the special tokens (``None``: no such token; BOS may not be ``None``).

    Raises
    ------
    ModelError
        If the vocabulary is too small or an id is out of range.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    if bos_token_id is None:
        raise ModelError("the byte tokenizer needs a BOS id; set bos_token_id in the configuration.")
    specials: dict[int, str] = {}
    if bos_token_id == eos_token_id:
        specials[bos_token_id] = "<|endoftext|>"
    else:
        specials[bos_token_id] = "<|bos|>"
        if eos_token_id is not None:
            specials[eos_token_id] = "<|eos|>"
    if pad_token_id is not None and pad_token_id not in specials:
        specials[pad_token_id] = "<|pad|>"
    for tid in specials:
        if not 0 <= int(tid) < vocab_size:
            raise ModelError(
                f"special token id {tid} is outside the vocabulary of {vocab_size}; fix the configuration's token ids."
            )
    needed = len(specials) + 256 - len(_NON_UTF8)
    if vocab_size < needed:
        raise ModelError(
            f"vocab_size {vocab_size} is too small for the byte-level tokenizer of random models; "
            f"use vocab_size={needed} or more (e.g. random:<family>:vocab_size=256)."
        )
    b2u = bytes_to_unicode()
    order = [b for b in range(256) if b not in _NON_UTF8] + list(_NON_UTF8)
    free = (i for i in range(vocab_size) if i not in specials)
    vocab: dict[str, int] = {text: int(tid) for tid, text in specials.items()}
    for byte in order:
        tid = next(free, None)
        if tid is None:
            break
        vocab[b2u[byte]] = tid
    for k, tid in enumerate(free):
        vocab[f"<|unused_{k}|>"] = tid
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    kwargs = {"bos_token": specials[bos_token_id]}
    if eos_token_id is not None:
        kwargs["eos_token"] = specials[eos_token_id]
    if pad_token_id is not None:
        kwargs["pad_token"] = specials[pad_token_id]
    tok = PreTrainedTokenizerFast(tokenizer_object=core, **kwargs)
    tok.model_max_length = 1 << 30
    return tok


def random_tokenizer(model: torch.nn.Module) -> Any:
    """The byte-level tokenizer of a random model, at the special-token ids of its configuration.

    Ids outside the vocabulary count as absent. When the configuration names no usable BOS,
    the first id that is neither EOS nor PAD becomes BOS and is written back into the
    model's configuration (and generation configuration), so the adapter finds it.
    """
    from .families import text_config

    cfg = text_config(model.config)
    vocab = int(cfg.vocab_size)

    def valid(tid: Any) -> int | None:
        if isinstance(tid, (list, tuple)):
            tid = tid[0] if tid else None
        return int(tid) if tid is not None and 0 <= int(tid) < vocab else None

    bos, eos, pad = valid(cfg.bos_token_id), valid(cfg.eos_token_id), valid(getattr(cfg, "pad_token_id", None))
    if bos is None:  # the configuration names no usable BOS: take the first free id and record it
        bos = next(i for i in range(vocab) if i not in (eos, pad))
        for c in {id(cfg): cfg, id(model.config): model.config}.values():
            c.bos_token_id = bos
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.bos_token_id = bos
    return byte_tokenizer(vocab, bos, eos, pad)


def tokenizer_from(where: str, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(where, **kwargs)``: a folder, hub id, or GGUF folder with
    ``gguf_file=``."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(where, **kwargs)
