"""Causal interventions on a model (§A7): head ablation criticality (:mod:`.ablation`,
run by the ``ablate`` stage, :mod:`depthlens.stages.ablate`) and the massive-activation clamp
chain (:mod:`.clamp`, run by the ``clamp`` stage, :mod:`depthlens.stages.clamp`)."""

from .options import AblateOptions, ClampOptions

__all__ = ["AblateOptions", "ClampOptions"]
