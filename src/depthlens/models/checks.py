"""Checks of what callers pass an adapter: token ids, layer and head indices.

:class:`Checks` is mixed into :class:`~depthlens.models.adapter.Adapter`; every refusal is one
line naming the value and what would work.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch import Tensor

from ..errors import InputError

__all__ = ["Checks"]


def _as_index(value: object) -> int | None:
    """``value`` as a Python int if it is an integer (numpy integers included, bools not)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


class Checks:
    """Argument checks of an :class:`~depthlens.models.adapter.Adapter` (a mixin of it): reads
    its ``n_layers``, ``n_heads``, ``max_seq_len``, ``vocab_size`` and ``device``."""

    n_layers: int
    n_heads: int
    max_seq_len: int
    vocab_size: int
    device: torch.device

    def checked_ids(self, input_ids: Tensor) -> Tensor:
        """``input_ids`` ((T,) or (B, T)) as a (B, T) int64 tensor on the model's device, refused
        in one line (:class:`~depthlens.errors.InputError`) when longer than the context or
        outside the vocabulary."""
        return self._ids(input_ids)

    def _ids(self, input_ids: Tensor) -> Tensor:
        ids = torch.as_tensor(input_ids)
        if ids.ndim == 1:
            ids = ids.unsqueeze(0)
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise InputError(f"input_ids has shape {tuple(ids.shape)}; pass token ids of shape (B, T) with T >= 1.")
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise InputError(f"input_ids has dtype {ids.dtype}; pass integer token ids.")
        if ids.shape[1] > self.max_seq_len:
            raise InputError(
                f"input_ids has {ids.shape[1]} positions; this model handles at most {self.max_seq_len}."
            )
        vocab = self.vocab_size
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise InputError(f"input_ids holds ids outside [0, {vocab}); check the tokenizer matches the model.")
        return ids.long().to(self.device)

    def check_layer(self, layer: int, *, allow_end: bool = False) -> int:
        """``layer`` as an int if it is a layer index (``allow_end``: or ``n_layers``, the final state).

        Raises
        ------
        InputError
            For anything else (out of range, not an integer, a bool).
        """
        top = self.n_layers if allow_end else self.n_layers - 1
        index = _as_index(layer)
        if index is None or not 0 <= index <= top:
            raise InputError(f"layer {layer!r} is out of range; this model has layers 0 .. {self.n_layers - 1}.")
        return index

    def _check_heads(self, head: int | Iterable[int]) -> list[int]:
        heads = [head] if _as_index(head) is not None else list(head)
        if not heads:
            raise InputError("no heads given; pass a head index or a non-empty list of them.")
        for i, h in enumerate(heads):
            index = _as_index(h)
            if index is None or not 0 <= index < self.n_heads:
                raise InputError(f"head {h!r} is out of range; layers have heads 0 .. {self.n_heads - 1}.")
            heads[i] = index
        if len(set(heads)) != len(heads):
            raise InputError(f"heads {heads} repeat an index; list each head once.")
        return heads
