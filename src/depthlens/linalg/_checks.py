"""Input validation shared by the numerical core: square, finite, float64/complex128."""

from __future__ import annotations

import numpy as np

from ..errors import InputError

__all__ = ["as_square"]


def as_square(M: object, name: str = "M", *, batched: bool = False) -> np.ndarray:
    """Return ``M`` as a finite float64 (or complex128) array of square matrices.

    Parameters
    ----------
    M : array_like
        One matrix ``(n, n)`` or, with ``batched=True``, a batch ``(..., n, n)``.
    name : str
        How the argument is called in error messages.
    batched : bool
        Accept leading batch axes.

    Raises
    ------
    InputError
        If ``M`` is not numeric, not square, empty, or holds NaN or infinity.
    """
    try:
        arr = np.asarray(M)
    except Exception as exc:  # pragma: no cover - numpy raises many types here
        raise InputError(f"{name} cannot be read as an array ({exc}); pass a numeric (n, n) array.") from exc
    if arr.dtype.kind not in "biufc":
        raise InputError(f"{name} has dtype {arr.dtype}; pass a numeric (n, n) array.")
    if arr.ndim < 2 or (arr.ndim != 2 and not batched):
        want = "(..., n, n)" if batched else "(n, n)"
        raise InputError(f"{name} has shape {arr.shape}; expected a square matrix {want}.")
    if arr.shape[-1] != arr.shape[-2] or arr.shape[-1] == 0:
        raise InputError(f"{name} has shape {arr.shape}; expected a non-empty square matrix.")
    arr = arr.astype(np.complex128 if arr.dtype.kind == "c" else np.float64, copy=False)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise InputError(f"{name} has a non-finite entry at index {tuple(int(i) for i in bad)}; pass finite values.")
    return arr
