"""Options of the ``topology`` stage (docs/methods.md#b5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import InputError
from ..options import check_fields

__all__ = ["TopologyOptions"]



@dataclass(frozen=True)
class TopologyOptions:
    """Parameters of the topology stage.

    Parameters
    ----------
    topk : int
        strongest |r| neighbours kept per unit before symmetrising
    skip_positions : int
        leading positions of every chunk left out of the correlations
    exclude_massive : bool
        drop massive-activation dimensions (the docs/methods.md#a7 rule) from the graphs
    boundary_quantile : float
        participation-coefficient quantile, in (0, 1), above which a unit is a boundary node
    amplification : {"column", "row", "diagonal"}
        Jacobian amplification per unit
    n_perm : int
        label permutations per boundary
    q_level : float
        FDR level of the headline count of significant layers
    jacobian_mode : {"isolated", "in_context"}
        which mean operators give the amplification: the jacobian stage's funnel mode
    seed : int
        seed of Leiden and of the permutations: the run's seed
    """

    topk: int = field(default=20, metadata={"min": 1})
    skip_positions: int = field(default=4, metadata={"min": 0})
    exclude_massive: bool = False
    boundary_quantile: float = 0.75
    amplification: Literal["column", "row", "diagonal"] = "column"
    n_perm: int = field(default=1000, metadata={"min": 1})
    q_level: float = 0.05
    jacobian_mode: Literal["isolated", "isolated_observed", "in_context"] = field(default="isolated",
                                                             metadata={"derived": "jacobian.funnel_mode"})
    seed: int = field(default=0, metadata={"derived": "seed"})

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("boundary_quantile", "q_level"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise InputError(f"--{name.replace('_', '-')} {getattr(self, name)} must lie in (0, 1).")
