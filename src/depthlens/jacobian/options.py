"""Options of the ``jacobian`` stage (docs/methods.md §B1–§B4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import InputError
from ..linalg.orders import SCHUR_ORDERS, SchurOrder
from ..options import check_distinct, check_fields

__all__ = ["ALPHAS", "DEFAULT_ALPHAS", "FUNNEL_CURVES", "JACOBIAN_MODES", "JacobianMode", "JacobianOptions",
           "init_seed_of"]

#: Scales of the non-normal part in docs/methods.md#b4 (``--funnel-alphas`` of ``--preset paper``).
ALPHAS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The default ``--funnel-alphas``: the ends the claims read (B4: α = 0 against α = 1) and the
#: midpoint the Schur-split figure draws between them.
DEFAULT_ALPHAS: tuple[float, ...] = (0.0, 0.5, 1.0)
#: The choices of ``--funnel-curves``.
FUNNEL_CURVES = ("read", "every")

JacobianMode = Literal["isolated", "isolated_observed", "in_context"]
#: The Jacobian modes of docs/methods.md#b1, in the order a run computes them.
JACOBIAN_MODES: tuple[JacobianMode, ...] = ("isolated", "isolated_observed", "in_context")
#: What ``--jacobian-mode both`` runs (the default).
_BOTH: tuple[JacobianMode, ...] = ("isolated", "in_context")


@dataclass(frozen=True)
class JacobianOptions:
    """Parameters of the jacobian stage.

    Parameters
    ----------
    jacobian_mode : {"isolated", "isolated_observed", "in_context", "both", "all"}
        Jacobian mode of the mean operators (docs/methods.md#b1): isolated (the paper's: the observed
        pre-attention residual through the whole block as a one-token sequence, the MLP at
        the block-internal state x + Attn(x)), isolated_observed (each sub-layer one-token at
        its own observed residual), in_context; both = isolated and in_context; all = the three
    positions : {"last", "all"}
        token positions averaged per chunk
    funnel_rank : int
        truncation rank of the cumulative products (capped at d), 0 for the exact products only
    funnel_exact_width : int
        largest model width d at which the funnel also computes the exact products (truncation
        d, the claims' exact variants); above it only the rank --funnel-rank curves, since an
        exact step is a d × d product and its SVD, a truncated one d × rank;
        --funnel-rank 0 computes the exact products whatever the width
    funnel_alphas : tuple of float
        comma-separated α in [0, 1] of the funnel's Schur split (docs/methods.md#b4); 1 alone: no split
    schur_orders : tuple of str
        comma-separated eigenvalue orders of the Schur split (docs/methods.md#b4), distinct, of lapack
        (LAPACK's own, as scipy.linalg.schur(J, output="complex") returns it: the claims'
        protocol), canonical (descending modulus), outside_first (|λ| > 1 first),
        inside_first (|λ| ≤ 1 first); the first gets every α, the others α = 0 only, and
        α = 1 (order-free) is computed once, labelled with the first
    funnel_curves : {"read", "every"}
        which funnel curves are computed: read = those the claims, their variants and the
        figures read (the Schur split on the trained model only, on the claims' backward curve
        and the forward curve of the least truncation, the further Schur orders on the claims'
        backward curve only, the other Jacobian mode on that curve only), each at every depth
        only where a figure draws it, else at its two ends (one step and full depth, the
        values the claims read); every = the Schur split of every checkpoint, every order in
        both directions and at every truncation, every curve at every depth (--preset paper)
    operator_metrics : {"read", "every"}
        which metrics of the operators are computed: read = every one the claims, the figures
        and the report read (the SVD's singular values suffice; the self_align_k columns are
        NaN); every = also the self-alignment of the top singular vectors (self_align_k), which
        needs the SVD's vectors (--preset paper)
    funnel_boot : int
        bootstrap replicates over chunks of the claims' funnel (backward, rank --funnel-rank, α = 1,
        the funnel's mode): per replicate the run's chunks are drawn again with replacement (from
        the run seed) and the erank after one step and at full depth recomputed from the
        resampled mean operators; the claims B2, B3 and C2 take 95% percentile intervals from
        them (at least 40 replicates; 0: none, and no interval); over a single chunk nothing is
        resampled (the funnel_boot table holds the point estimate alone, replicate 0, and there
        is no interval)
    init_seeds : int
        step-0 nulls drawn for B3, with the initialisation of run seeds seed, seed + 1, ...: the
        first is the init checkpoint; the others get the bootstrapped funnel ends alone (needs
        --funnel-boot above 0 and --null init)
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
    funnel_exact_width: int = field(default=2048, metadata={"min": 0})
    funnel_alphas: tuple[float, ...] = DEFAULT_ALPHAS
    schur_orders: tuple[SchurOrder, ...] = SCHUR_ORDERS
    funnel_curves: Literal["read", "every"] = "read"
    operator_metrics: Literal["read", "every"] = "read"
    funnel_boot: int = field(default=50, metadata={"min": 0})
    init_seeds: int = field(default=3, metadata={"min": 1})
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
        return init_seed_of(self.seed)


def init_seed_of(seed: int) -> int:
    """The torch seed of the step-0 null of a run with seed ``seed`` (:attr:`JacobianOptions.init_seed`);
    the extra nulls of ``--init-seeds`` are those of ``seed + 1``, ``seed + 2``, ...."""
    import numpy as np  # here, not at the top: the options load with the command line, before numpy

    return int(np.random.SeedSequence([int(seed), 0x1A17]).generate_state(1)[0])
