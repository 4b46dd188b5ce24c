"""Head roles from the repeated-random-token probe and natural-text sink mass (§A5).

The probe is ``[BOS, r, r]`` with ``r`` of length ``m``: position 0 is BOS, the first copy
occupies positions ``1..m`` and the second copy ``m+1..2m`` (0-based). At a second-copy
query ``p`` the previous token sits at ``p − 1``, the same token's first occurrence at
``p − m`` (duplicate) and the token that followed it at ``p − m + 1`` (induction).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import InputError
from .options import RoleThresholds


def probe_scores(A: np.ndarray, length: int) -> dict[str, np.ndarray]:
    """Previous-token, duplicate and induction scores of probe attention matrices.

    Parameters
    ----------
    A : ndarray, shape (..., 2m + 1, 2m + 1)
        Attention matrices of the probe (any leading axes, e.g. sequences × heads).
    length : int
        ``m``, the length of the random block.

    Returns
    -------
    dict of arrays, each of shape ``(...)``
        ``prev_token_score`` mean of ``A[p, p−1]``, ``duplicate_score`` mean of ``A[p, p−m]``,
        ``induction_score`` mean of ``A[p, p−m+1]`` over second-copy queries ``p``, averaged
        over every leading axis given except the last one removed by the caller (exact means).

    Raises
    ------
    InputError
        If the matrix size is not ``2 * length + 1``.
    """
    arr = np.asarray(A, dtype=np.float64)
    n = 2 * length + 1
    if arr.ndim < 2 or arr.shape[-2:] != (n, n):
        raise InputError(f"probe attention has shape {arr.shape}; expected (..., {n}, {n}) for block length {length}.")
    p = np.arange(length + 1, n)
    return {
        "prev_token_score": arr[..., p, p - 1].mean(axis=-1),
        "duplicate_score": arr[..., p, p - length].mean(axis=-1),
        "induction_score": arr[..., p, p - length + 1].mean(axis=-1),
    }


def assign_roles(
    prev_token_score: np.ndarray,
    induction_score: np.ndarray,
    sink_mass: np.ndarray,
    thresholds: RoleThresholds = RoleThresholds(),
) -> np.ndarray:
    """Role of each head: ``routing`` if the previous-token or induction score reaches the
    routing threshold; else ``sink`` if its natural-text sink mass reaches the sink
    threshold; else ``other``."""
    prev = np.asarray(prev_token_score, dtype=np.float64)
    ind = np.asarray(induction_score, dtype=np.float64)
    sink = np.asarray(sink_mass, dtype=np.float64)
    routing = (prev >= thresholds.routing) | (ind >= thresholds.routing)
    return np.where(routing, "routing", np.where(sink >= thresholds.sink, "sink", "other"))


def role_overlap(roles: np.ndarray, excess: np.ndarray) -> pd.DataFrame:
    """Cross-table of rule-based roles against the data-driven split by the sign of ``Δ_TR``.

    Returns counts with rows = roles and columns ``positive`` / ``negative`` / ``zero``.
    """
    sign = np.where(np.asarray(excess) > 0, "positive", np.where(np.asarray(excess) < 0, "negative", "zero"))
    table = pd.crosstab(pd.Series(roles, name="role"), pd.Series(sign, name="excess_sign"))
    return table.reindex(columns=["positive", "negative", "zero"], fill_value=0)
