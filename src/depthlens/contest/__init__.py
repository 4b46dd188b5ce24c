"""The feature-family contest (§A7): which family of per-head features predicts what
a head does, cross-validated across layers. :mod:`.features` and :mod:`.cv` take arrays and
tables; :mod:`depthlens.stages.contest` runs them over a model."""

from .options import CONTEST_TARGETS, ContestOptions

__all__ = ["CONTEST_TARGETS", "ContestOptions"]
