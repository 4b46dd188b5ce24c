"""The orders of a Schur form's diagonal that depthlens offers (§B4), without numpy:
the stages' options name them before any numerics load (:mod:`.schur` explains each)."""

from __future__ import annotations

from typing import Literal

__all__ = ["SCHUR_ORDERS", "SchurOrder"]

SchurOrder = Literal["lapack", "canonical", "outside_first", "inside_first"]
#: LAPACK's own order first, then the basis-covariant ones.
SCHUR_ORDERS: tuple[SchurOrder, ...] = ("lapack", "canonical", "outside_first", "inside_first")
