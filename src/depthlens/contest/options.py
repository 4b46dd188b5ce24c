"""Options of the ``contest`` stage (docs/methods.md#a7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..options import check_distinct, check_fields

__all__ = ["CONTEST_TARGETS", "ContestOptions", "ContestTarget"]

ContestTarget = Literal["persistence", "routing", "criticality"]
#: The contest's targets (docs/methods.md#a7): depth persistence, routing identity (the probe role),
#: ablation criticality (the ablate stage's mean-ablation ΔCE).
CONTEST_TARGETS: tuple[ContestTarget, ...] = ("persistence", "routing", "criticality")


@dataclass(frozen=True)
class ContestOptions:
    """Parameters of the contest stage.

    Parameters
    ----------
    contest_targets : tuple of str
        comma-separated targets, distinct, of persistence (depth persistence of the head's
        deviation), routing (routing role from the probe) and criticality (mean-ablation ΔCE;
        runs the ablate stage first)
    contest_folds : int
        folds of the grouped K-fold by layer (a layer is never split)
    contest_boot : int
        layer-cluster bootstrap resamples for the confidence intervals (each refits the
        grouped cross-validation of every feature set)
    contest_perm : int
        permutations within layers for the p-values (of the labels for the single families
        and all, of the dropped family's features for all-X)
    contest_chunks : int
        chunks (the first ones) from which the pattern, eigenvalue and norm features, the
        induction mass and the depth persistence are computed (medians over them)
    seed : int
        the run's seed (folds, bootstrap, permutations)
    """

    contest_targets: tuple[ContestTarget, ...] = CONTEST_TARGETS
    contest_folds: int = field(default=5, metadata={"min": 2})
    contest_boot: int = field(default=1000, metadata={"min": 1})
    contest_perm: int = field(default=1000, metadata={"min": 1})
    contest_chunks: int = field(default=8, metadata={"min": 1})
    seed: int = field(default=0, metadata={"derived": "seed"})

    def __post_init__(self) -> None:
        check_fields(self)
        check_distinct(self, "contest_targets", CONTEST_TARGETS)
