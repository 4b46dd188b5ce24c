"""Causal interventions on a model (METHODS A7): head ablation criticality (the ``ablate``
stage, :mod:`.ablation` and :mod:`.ablate_stage`) and the massive-activation clamp chain (the
``clamp`` stage, :mod:`.clamp` and :mod:`.clamp_stage`)."""

from .options import AblateOptions, ClampOptions

__all__ = ["AblateOptions", "ClampOptions"]
