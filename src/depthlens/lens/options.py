"""Options of the ``lens`` stage (Jacobian-lens transport matrices)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import InputError
from ..options import check_fields

__all__ = ["LensOptions"]


@dataclass(frozen=True)
class LensOptions:
    """Parameters of the lens stage.

    Parameters
    ----------
    lens_chunks : int
        chunks (prompts) the transport is averaged over, the first ones of the run (above
        --chunks: every chunk); each costs d backward passes through the model in float64
    lens_layers : tuple of int
        source layers to fit, 0 .. L-2 (default: all of them)
    lens_skip_first : int
        leading positions of every chunk left out of the sources and targets (16 in the
        reference estimator)
    lens_skip_last : int
        trailing positions of every chunk left out of the sources and targets (1 in the
        reference estimator)
    lens_dtype : {"float16", "float32", "float64"}
        precision of the matrices in the exported artifact arrays/lens.pt (float16, as the
        published lenses); the table is computed from the float64 fit
    """

    lens_chunks: int = field(default=4, metadata={"min": 1})
    lens_layers: tuple[int, ...] = ()
    lens_skip_first: int = field(default=16, metadata={"min": 0})
    lens_skip_last: int = field(default=1, metadata={"min": 0})
    lens_dtype: Literal["float16", "float32", "float64"] = "float16"

    def __post_init__(self) -> None:
        check_fields(self)
        if any(layer < 0 for layer in self.lens_layers):
            shown = ",".join(map(str, self.lens_layers))
            raise InputError(f"--lens-layers {shown} is invalid; pass source layers >= 0, e.g. 0,4,8.")
        object.__setattr__(self, "lens_layers", tuple(sorted(set(self.lens_layers))))
