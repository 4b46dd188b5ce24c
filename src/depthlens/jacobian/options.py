"""Options of the ``jacobian`` stage (METHODS B1–B4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..errors import InputError
from ..linalg.schur import SCHUR_ORDERS, SchurOrder
from ..options import check_distinct, check_fields
from .cumulative import ALPHAS

__all__ = ["ALPHAS", "JACOBIAN_MODES", "JacobianMode", "JacobianOptions"]

JacobianMode = Literal["isolated", "isolated_observed", "in_context"]
#: The Jacobian modes of METHODS B1, in the order a run computes them.
JACOBIAN_MODES: tuple[JacobianMode, ...] = ("isolated", "isolated_observed", "in_context")
#: What ``--jacobian-mode both`` runs (the default).
_BOTH: tuple[JacobianMode, ...] = ("isolated", "in_context")


@dataclass(frozen=True)
class JacobianOptions:
    """Parameters of the jacobian stage.

    Parameters
    ----------
    jacobian_mode : {"isolated", "isolated_observed", "in_context", "both", "all"}
        Jacobian mode of the mean operators (METHODS B1): isolated (the paper's: the observed
        pre-attention residual through the whole block as a one-token sequence, the MLP at
        the block-internal state x + Attn(x)), isolated_observed (each sub-layer one-token at
        its own observed residual), in_context; both = isolated and in_context; all = the three
    positions : {"last", "all"}
        token positions averaged per chunk
    funnel_rank : int
        truncation rank of the cumulative products (capped at d), 0 for the exact products only
    funnel_alphas : tuple of float
        comma-separated α in [0, 1] of the funnel's Schur split (METHODS B4); 1 alone: no split
    schur_orders : tuple of str
        comma-separated eigenvalue orders of the Schur split (METHODS B4), distinct, of lapack
        (LAPACK's own, as scipy.linalg.schur(J, output="complex") returns it: the claims'
        protocol), canonical (descending modulus), outside_first (|λ| > 1 first),
        inside_first (|λ| ≤ 1 first); the first gets every α, the others α = 0 only, and
        α = 1 (order-free) is computed once, labelled with the first
    null : {"init", "none"}
        also analyse the step-0 null (the same architecture at initialisation)
    save_arrays : {"float64", "float32", "none"}
        dtype of the saved mean Jacobians in arrays/, or none; the tables are the same
        whichever, since the metrics, the funnel and the topology stage always use float64
        operators
    seed : int
        the run's seed; the step-0 initialisation uses init_seed, spawned from it
    revisions : tuple of str
        the run's extra hub revisions of --model (--revisions), a checkpoint each
    """

    jacobian_mode: Literal["isolated", "isolated_observed", "in_context", "both", "all"] = "both"
    positions: Literal["last", "all"] = "last"
    funnel_rank: int = field(default=512, metadata={"min": 0})
    funnel_alphas: tuple[float, ...] = ALPHAS
    schur_orders: tuple[SchurOrder, ...] = SCHUR_ORDERS
    null: Literal["init", "none"] = "init"
    save_arrays: Literal["float64", "float32", "none"] = "float64"
    seed: int = field(default=0, metadata={"derived": "seed"})
    revisions: tuple[str, ...] = field(default=(), metadata={"derived": "revisions"})

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "funnel_alphas", tuple(float(a) for a in self.funnel_alphas))
        if not self.funnel_alphas or not all(0.0 <= a <= 1.0 for a in self.funnel_alphas):
            shown = ",".join(f"{a:g}" for a in self.funnel_alphas) or "(none)"
            raise InputError(f"--funnel-alphas {shown} is invalid; pass numbers in [0, 1], e.g. 0,0.5,1.")
        check_distinct(self, "schur_orders", SCHUR_ORDERS)

    @property
    def modes(self) -> tuple[JacobianMode, ...]:
        """The Jacobian modes this run computes, in :data:`JACOBIAN_MODES` order."""
        return {"both": _BOTH, "all": JACOBIAN_MODES}.get(self.jacobian_mode, (self.jacobian_mode,))  # type: ignore[arg-type]

    @property
    def funnel_mode(self) -> JacobianMode:
        """The mode whose operators give the funnel and the topology amplification:
        ``isolated`` when it runs, else the first mode."""
        return "isolated" if "isolated" in self.modes else self.modes[0]

    @property
    def init_seed(self) -> int:
        """Seed of the step-0 null, spawned from the run seed (so a ``random:`` model and its
        null never share weights)."""
        return int(np.random.SeedSequence([self.seed, 0x1A17]).generate_state(1)[0])
