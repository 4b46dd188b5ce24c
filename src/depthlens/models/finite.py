"""Refuse models whose weights hold NaN or infinity before any analysis runs on them."""

from __future__ import annotations

import re

import torch

from ..errors import ModelError

_LAYER = re.compile(r"\.(\d+)\.")


def check_finite_weights(model: torch.nn.Module, name: str) -> None:
    """Raise if any parameter or buffer of ``model`` holds NaN or infinity (``meta`` tensors,
    the released layers of a streamed model, are skipped: each layer is checked when it is filled).

    Every operator and attention matrix of such a model would be non-finite, so the run is
    refused up front (one pass over the weights, about 0.2 s for 135M parameters) instead of
    failing in every unit later.

    Raises
    ------
    ModelError
        Naming the first offending decoder layer (or the parameter, outside the layers).
    """
    for pname, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.is_floating_point() and not tensor.is_meta and not bool(torch.isfinite(tensor).all()):
            layer = _LAYER.search(pname)
            where = f"layer {layer.group(1)} ({pname})" if layer else pname
            raise ModelError(f"model {name} has NaN or infinite weights, first in {where}; "
                             "the checkpoint is damaged: pass another --model or --revision.")
