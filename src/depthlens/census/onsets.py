"""Formation and consolidation onsets over a checkpoint series, and their paired lag.

Seed 1 dates the resolvent organisation "to a consolidation phase after circuit formation".
Operationally, per head of the final checkpoint's role groups:

- **formation onset**: the first checkpoint from which the head's role score reaches its
  role threshold at every later checkpoint (previous-token or induction score ≥ the routing
  threshold, sink mass ≥ the sink threshold);
- **consolidation onset**: the first checkpoint from which its excess reserve Δ_TR is
  significant (BH q ≤ the FDR level) with its role's sign (positive for routing heads,
  negative for sink heads) at every later checkpoint.

A "sustained" onset (holding from there to the end) ignores one-off crossings that later
checkpoints undo. The lag of a head is the number of checkpoints from its formation onset to
its consolidation onset (checkpoint order: log-spaced steps for ``depthlens train``); the
claim's statistic is the one-sided exact sign-test p-value that lags are positive, over the
heads with both onsets (zero lags dropped). Everything here is exact arithmetic on the
tables' values.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as _st

__all__ = ["GROUPS", "head_onsets", "lag_test", "sustained_onset"]

#: Head groups: the score that forms them, and the sign of Δ_TR that consolidates them.
GROUPS: dict[str, tuple[str, float]] = {
    "previous-token": ("prev_token_score", 1.0),
    "induction": ("induction_score", 1.0),
    "sink": ("sink_mass", -1.0),
}


def sustained_onset(flags: np.ndarray) -> int | None:
    """Index of the first entry from which ``flags`` holds to the end, or None when the last
    entry is False (or there is none).

    Examples
    --------
    >>> sustained_onset(np.array([False, True, False, True, True]))
    3
    >>> sustained_onset(np.array([True, False])) is None
    True
    """
    flags = np.asarray(flags, dtype=bool)
    if flags.size == 0 or not flags[-1]:
        return None
    failing = np.flatnonzero(~flags)
    return int(failing[-1] + 1) if failing.size else 0


def _group(final: pd.Series, routing: float, sink: float) -> str | None:
    """The group of a head from its final-checkpoint row: the larger routing score when one
    reaches ``routing``, else ``sink`` when its sink mass reaches ``sink``."""
    prev, ind = float(final["prev_token_score"]), float(final["induction_score"])
    if max(prev, ind) >= routing:
        return "previous-token" if prev >= ind else "induction"
    if float(final["sink_mass"]) >= sink:
        return "sink"
    return None


def head_onsets(heads: pd.DataFrame, *, routing: float = 0.3, sink: float = 0.5, q_level: float = 0.05
                ) -> pd.DataFrame:
    """Onsets of every grouped head of one series.

    Parameters
    ----------
    heads : DataFrame
        One row per (checkpoint, layer, head) with ``order`` (the checkpoint's index in
        training order), ``step``, ``prev_token_score``, ``induction_score``, ``sink_mass``,
        ``delta_TR1`` and ``null_q``.
    routing, sink : float
        Role thresholds (the attention stage's defaults).
    q_level : float
        FDR level of a significant Δ_TR.

    Returns
    -------
    DataFrame
        One row per head in a group at the last checkpoint: ``layer``, ``head``, ``group``,
        ``formation_order``/``formation_step`` and ``consolidation_order``/
        ``consolidation_step`` (NaN when there is no sustained onset) and ``lag`` (in
        checkpoints; NaN unless both onsets exist).
    """
    cols = ["layer", "head", "group", "formation_order", "formation_step", "consolidation_order",
            "consolidation_step", "lag"]
    if heads.empty:
        return pd.DataFrame(columns=cols)
    orders = np.sort(heads["order"].unique())
    last = orders[-1]
    steps = heads.drop_duplicates("order").set_index("order")["step"]
    rows = []
    for (layer, head), rows_h in heads.groupby(["layer", "head"], sort=True):
        rows_h = rows_h.set_index("order").reindex(orders)
        if pd.isna(rows_h.loc[last, "sink_mass"]):
            continue
        group = _group(rows_h.loc[last], routing, sink)
        if group is None:
            continue
        score, sign = GROUPS[group]
        threshold = sink if group == "sink" else routing
        formed = (rows_h[score] >= threshold).to_numpy()
        q = rows_h["null_q"].to_numpy(dtype=float)
        consolidated = (q <= q_level) & (np.sign(rows_h["delta_TR1"].to_numpy(dtype=float)) == sign)
        f, c = sustained_onset(formed), sustained_onset(consolidated)
        rows.append({"layer": int(layer), "head": int(head), "group": group,
                     "formation_order": np.nan if f is None else float(orders[f]),
                     "formation_step": np.nan if f is None else float(steps.loc[orders[f]]),
                     "consolidation_order": np.nan if c is None else float(orders[c]),
                     "consolidation_step": np.nan if c is None else float(steps.loc[orders[c]]),
                     "lag": np.nan if f is None or c is None else float(c - f)})
    return pd.DataFrame(rows, columns=cols)


def lag_test(lags: np.ndarray) -> tuple[int, float, float]:
    """``(n, median lag, p)`` over the finite non-zero ``lags``: ``p`` is the one-sided exact
    sign-test p-value that lags are positive (consolidation after formation), 1.0 when no lag
    is left. A p near 0 says consolidation follows formation; near 1, that it precedes it.

    Examples
    --------
    >>> n, median, p = lag_test(np.array([1, 2, 1, 3, 2, 0, np.nan]))
    >>> n, median, round(p, 4)
    (5, 2.0, 0.0312)
    """
    arr = np.asarray(lags, dtype=np.float64)
    arr = arr[np.isfinite(arr) & (arr != 0.0)]
    if arr.size == 0:
        return 0, float("nan"), 1.0
    p = float(_st.binomtest(int((arr > 0).sum()), arr.size, 0.5, alternative="greater").pvalue)
    return int(arr.size), float(np.median(arr)), p
