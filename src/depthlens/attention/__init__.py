"""Per-head attention operators: pattern features, resolvent features, nulls, roles, depth
products (§A1–A6). :mod:`.features`, :mod:`.roles`, :mod:`.depth` and :mod:`.patterns`
take attention matrices as arrays; :mod:`depthlens.stages.attention` runs them over a model."""

from .options import AttentionOptions, RoleThresholds

__all__ = ["AttentionOptions", "RoleThresholds"]
