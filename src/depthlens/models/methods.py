"""The ablation methods the adapters implement (§A7), importable without torch: the
ablate stage's options validate against them before any model loads."""

from __future__ import annotations

from typing import Literal

__all__ = ["ABLATION_METHODS", "AblationMethod"]

AblationMethod = Literal["zero", "mean", "resample"]
#: The ways a head is ablated (§A7): its output set to zero, to its mean over the mean
#: chunks, or to its output on another chunk.
ABLATION_METHODS: tuple[AblationMethod, ...] = ("zero", "mean", "resample")
