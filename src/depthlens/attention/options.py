"""Options of the ``attention`` stage (docs/methods.md §A2–§A6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..options import check_fields

__all__ = ["AttentionOptions", "RoleThresholds"]


@dataclass(frozen=True)
class RoleThresholds:
    """Thresholds of the role rules (parameters, recorded with every table)."""

    routing: float = 0.3
    sink: float = 0.5


@dataclass(frozen=True)
class AttentionOptions:
    """Parameters of the attention stage (recorded in the manifest through the config).

    Parameters
    ----------
    null_mode : {"spec", "sink", "full"}
        shuffle null (docs/methods.md#a4); spec keeps the spectrum exactly
    null_samples : int
        null samples per matrix (S; docs/methods.md#a4)
    null_chunks : int
        chunks (the first ones) that get nulls and null depth products
    extras_chunks : int
        chunks (the first ones) that get pseudospectral radii, the numerical range and the
        power-norm upper bound on K(B)
    certify : {"median", "all", "none"}
        which matrices get a certified Kreiss bracket: each head's median chunk, all, or none
    rtol : float
        relative width of the certified Kreiss brackets
    certify_evals : int
        budget of σ_min evaluations per certified bracket; a bracket that needs more is
        reported wider and flagged uncertified (kreiss_B_certified = 0)
    probe_seqs : int
        repeated-random-token probe sequences (docs/methods.md#a5)
    probe_len : int
        length of the repeated random block of the probe (docs/methods.md#a5)
    ratio_seqs : int
        probe sequences (the first ones) on which the excess reserve of each routing head is
        measured for the induction-engagement ratios (docs/methods.md#a5): the probe, its first copy
        and the length-matched control [BOS, r, r'], each against its own matched null
        (3 (1 + null_samples) Kreiss searches per head and sequence)
    thresholds : RoleThresholds
        role rules (a ``[attention.thresholds]`` table in a config file)
    heads : tuple of str
        heads whose attention the report draws, as LAYER.HEAD (default: the top routing and
        sink head)
    seed : int
        seed of nulls and probe: the run's seed
    """

    null_mode: Literal["spec", "sink", "full"] = "spec"
    null_samples: int = field(default=8, metadata={"min": 1})
    null_chunks: int = field(default=10, metadata={"min": 0})
    extras_chunks: int = field(default=1, metadata={"min": 0})
    certify: Literal["median", "all", "none"] = "median"
    rtol: float = field(default=1e-3, metadata={"min": 0.0})
    certify_evals: int = field(default=10000, metadata={"min": 1})
    probe_seqs: int = field(default=128, metadata={"min": 1})
    probe_len: int = field(default=64, metadata={"min": 1})
    ratio_seqs: int = field(default=16, metadata={"min": 1})
    thresholds: RoleThresholds = field(default_factory=RoleThresholds)
    heads: tuple[str, ...] = field(default=(), metadata={"hash": False})
    seed: int = field(default=0, metadata={"derived": "seed"})

    def __post_init__(self) -> None:
        check_fields(self)
