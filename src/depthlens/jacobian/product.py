"""The running product of a cumulative curve (:mod:`depthlens.jacobian.cumulative`): a d × k
factor scaled by powers of two, its singular values taken only at the steps that are measured,
held in memory or parked in a file between steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..linalg import guarded
from ..linalg.ranks import erank, erank_sigma, participation_ratio

__all__ = ["RunningProduct"]

_OVERFLOW = "a cumulative product step overflowed; divide the operators by a common scale first."
_ZERO = "a cumulative product is exactly zero, so no effective rank is defined; check the operators."
_LN2 = math.log(2.0)


class RunningProduct:
    """Running product as a factor F (d × k, k ≤ r) with ``C = 2^E F W``, W orthonormal rows.

    After every step F is divided by the power of two ``2^e`` with ``max |F_ij|`` in [1/2, 1)
    (``e`` from the largest entry, no singular value needed), which is exact in floating
    point, and ``e`` is added to the integer ``E``. So F holds the same bits whether or not a
    step's singular values were computed: a curve measured only at its two ends
    (:func:`~depthlens.jacobian.cumulative.cumulative_ends`, the ``full_curves`` of
    :func:`~depthlens.jacobian.cumulative.schur_funnel`) reports there the very
    values of the curve measured at every depth.

    ``device`` None keeps F in NumPy and decomposes with LAPACK (:mod:`depthlens.linalg.guarded`);
    a torch device keeps it there (products and SVDs in torch, :func:`~depthlens.linalg.guarded.
    svd_torch`), the same arithmetic to rounding.

    :meth:`park` moves F out of memory into a file until the next :meth:`push` reads it back,
    the same bits, so a parked product computes the very numbers of one held in memory.
    """

    def __init__(self, rank: int, device: str | None = None) -> None:
        self.rank = rank
        self.device = device
        self.factor: Any = None
        self.exponent = 0
        self.parked: Path | None = None

    def park(self, path: Path) -> None:
        """Write the factor to the ``.npy`` file ``path`` (overwritten; through the host from a
        device) and drop it from memory until the next :meth:`push` reads it back; the file
        stays (the caller's to delete).

        Raises
        ------
        InputError
            If the product has no factor to park (no step yet, or parked already).
        """
        if self.factor is None:
            raise InputError("the running product has no factor in memory to park; push an operator first.")
        np.save(path, self.factor if self.device is None else self.factor.cpu().numpy())
        self.factor, self.parked = None, path

    def push(self, J: np.ndarray, measure: bool = True) -> tuple[float, float, float, float] | None:
        """Multiply J in on the left (reading a parked factor back first); return erank,
        erank_sigma, participation_ratio and ln‖C‖₂, or None with ``measure`` False (no singular
        values, except where the step truncates)."""
        if self.parked is not None:
            path, self.parked = self.parked, None
            self.factor = np.load(path) if self.device is None else _on_device(np.load(path), self.device)
        if self.device is not None:
            J = _on_device(np.asarray(J), self.device)
        with np.errstate(over="ignore", invalid="ignore"):
            prod = J if self.factor is None else J @ self.factor
        owned = prod is not J  # a new array, scaled in place below
        sv = None
        if prod.shape[1] > self.rank:
            if not math.isfinite(_peak(prod)):
                raise InputError(_OVERFLOW)
            left, sv, _ = _thin_svd(prod)
            prod, owned = left[:, : self.rank] * sv[: self.rank], True
            sv = sv[: self.rank]
        peak = _peak(prod)
        if not math.isfinite(peak):
            raise InputError(_OVERFLOW)
        if peak == 0:
            raise InputError(_ZERO)
        if sv is None and measure:
            sv = _svdvals(prod)
        shift = math.frexp(peak)[1]
        self.factor = _scaled(prod, -shift, owned)
        log_scale = self.exponent * _LN2  # ln of the scale of prod: C = 2^E prod
        self.exponent += shift
        if sv is None:
            return None
        sv = np.asarray(sv.cpu() if self.device is not None else sv, dtype=np.float64)
        if not np.isfinite(sv[0]):
            raise InputError(_OVERFLOW)
        if sv[0] == 0:
            raise InputError(_ZERO)
        return float(erank(sv)), float(erank_sigma(sv)), float(participation_ratio(sv)), log_scale + float(np.log(sv[0]))


def _on_device(x: np.ndarray, device: str) -> Any:
    """A torch tensor on ``device`` with the entries of ``x`` (a copy)."""
    import torch

    return torch.tensor(x, device=device)


def _peak(x: Any) -> float:
    """``max |x|``, NaN or infinite where an entry is not finite. A real NumPy array takes two
    reductions and no temporary (a NaN makes both NaN; ``max |x| = max(max x, −min x)`` exactly)."""
    if isinstance(x, np.ndarray) and x.dtype.kind != "c":
        return max(float(x.max()), -float(x.min()))
    return float(abs(x).max())


def _scaled(x: Any, shift: int, owned: bool) -> Any:
    """``x · 2^shift`` (exact while the result is normal), in place where ``x`` is the
    accumulator's own; a shift beyond a float's exponent range is applied in two halves."""
    for part in (shift,) if abs(shift) < 1000 else (shift // 2, shift - shift // 2):
        factor = math.ldexp(1.0, part)
        if not owned:
            x, owned = x * factor, True
        elif isinstance(x, np.ndarray):
            np.multiply(x, factor, out=x)
        else:
            x.mul_(factor)
    return x


def _thin_svd(x: Any) -> Any:
    return guarded.svd(x, full_matrices=False) if isinstance(x, np.ndarray) else guarded.svd_torch(x)


def _svdvals(x: Any) -> Any:
    return guarded.svdvals(x) if isinstance(x, np.ndarray) else guarded.svd_torch(x, compute_uv=False)
