"""Float64 end to end through Hugging Face modules, for references computed in float64.

Hugging Face RMSNorms and the eager softmax upcast to float32 even inside a float64 model,
which would limit a reference to float32 accuracy. :class:`Float64Mode` keeps float64 tensors
float64 through those casts, and :func:`double_copy` makes the float64 model to run under it.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["Float64Mode", "double_copy"]


class Float64Mode(TorchFunctionMode):
    """Inside, ``.float()``, ``.to(float32)`` and ``dtype=float32`` leave float64 tensors float64."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float64:
            if func is torch.Tensor.float:
                return args[0]
            if func is torch.Tensor.to:
                args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kwargs.get("dtype") is torch.float32:
                kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


def double_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``model`` whose rotary ``*inv_freq`` buffers stay float32 (as the
    model computes its RoPE angles)."""
    m = copy.deepcopy(model).double()
    for mod in m.modules():
        for name, buf in list(mod.named_buffers(recurse=False)):
            if name.endswith("inv_freq"):
                setattr(mod, name, buf.float())
    return m
