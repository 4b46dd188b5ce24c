"""The token stream of a series and the batch of every step.

The text is tokenized once, without special tokens; its last ``--heldout`` fraction is held
out (never trained on). The batch of step s is a pure function of (seed, s): a resumed series
sees exactly the batches an uninterrupted one sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data import load_text
from ..errors import DataError
from .build import start_token
from .options import TrainOptions

__all__ = ["TokenStream"]


@dataclass(frozen=True)
class TokenStream:
    """A tokenized text split into its training and held-out parts.

    Attributes
    ----------
    train, heldout : ndarray of int64
        The token ids before and after the split (the held-out part is the last
        ``ceil(heldout · n)`` ids).
    start : int
        The id every sequence starts with (:func:`~depthlens.training.build.start_token`).
    ordinary : ndarray of int64
        The ids a repeated block draws from: every id of the tokenizer but its special ones
        (the induction probe's set).
    text_sha256 : str
        SHA-256 of the text.
    """

    train: np.ndarray
    heldout: np.ndarray
    start: int
    ordinary: np.ndarray
    text_sha256: str

    @classmethod
    def build(cls, options: TrainOptions, tokenizer: Any) -> TokenStream:
        """Tokenize ``options.text`` with ``tokenizer`` and split it.

        Raises
        ------
        DataError
            A missing, unreadable or empty text, or one too short for a training and a
            held-out sequence of ``--seq-len`` tokens.
        """
        source = load_text(options.text)
        ids = np.asarray(tokenizer(source.text, add_special_tokens=False, verbose=False,
                                   return_attention_mask=False)["input_ids"], dtype=np.int64)
        width = options.seq_len - 1
        n_held = int(np.ceil(options.heldout * ids.size))
        if n_held < width or ids.size - n_held < width:
            raise DataError(f"--text {source.name} has {ids.size} tokens: the held-out {n_held} and the training "
                            f"{ids.size - n_held} must each fill a sequence of {width} tokens after the start token; "
                            "pass a longer --text, a shorter --seq-len or another --heldout.")
        specials = np.asarray(tokenizer.all_special_ids, dtype=np.int64)
        ordinary = np.setdiff1d(np.arange(len(tokenizer), dtype=np.int64), specials)
        return cls(ids[: ids.size - n_held], ids[ids.size - n_held:], start_token(tokenizer), ordinary, source.sha256)

    def batch(self, options: TrainOptions, step: int) -> torch.Tensor:
        """The batch of optimiser step ``step``: ``(batch_size, seq_len)`` int64 ids, each row
        the start token then ``seq_len − 1`` tokens.

        Drawn from ``numpy.random.default_rng([seed, step])`` alone. The first
        ``round(repeat_fraction · batch_size)`` rows are repeated blocks: a block length m
        uniform in ``repeat_min..repeat_max``, m uniform draws from :attr:`ordinary`, tiled
        to the row's end. The other rows are windows of the training part at uniform random
        offsets.
        """
        rng = np.random.default_rng([options.seed, step])
        width = options.seq_len - 1
        n_rep = int(np.floor(options.repeat_fraction * options.batch_size + 0.5))
        offsets = rng.integers(0, self.train.size - width + 1, size=options.batch_size - n_rep)
        rows = [np.resize(self.ordinary[rng.integers(0, self.ordinary.size, size=int(m))], width)
                for m in rng.integers(options.repeat_min, options.repeat_max + 1, size=n_rep)]
        body = np.concatenate([np.asarray(rows, dtype=np.int64).reshape(n_rep, width),
                               self.train[offsets[:, None] + np.arange(width)]])
        return torch.from_numpy(np.concatenate([np.full((options.batch_size, 1), self.start, np.int64), body], 1))

    def heldout_batch(self, options: TrainOptions) -> torch.Tensor:
        """The held-out sequences: the first ``eval_seqs`` consecutive windows of
        ``seq_len − 1`` held-out tokens (fewer when the split holds fewer), each after the
        start token; ``(n, seq_len)`` int64."""
        width = options.seq_len - 1
        n = min(options.eval_seqs, self.heldout.size // width)
        windows = self.heldout[: n * width].reshape(n, width)
        return torch.from_numpy(np.concatenate([np.full((n, 1), self.start, np.int64), windows], 1))
