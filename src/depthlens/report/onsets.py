"""Formation and consolidation onsets over a checkpoint series, and their calibrated lag.

Paper A dates the resolvent organisation "to a consolidation phase after circuit formation".
Operationally, per head of the final checkpoint's role groups, both onsets are found by the
**same** rule on a continuous series:

- **formation onset**: the step (change point) of the head's role score (previous-token or
  induction score, or sink mass);
- **consolidation onset**: the step of its signed excess reserve ``sign · Δ_TR`` (positive
  for routing heads, negative for sink heads).

The step of a series is the least-squares single change point (:func:`step_onsets`). No rule
of this kind is unbiased on its own: threshold rules ("from which q ≤ 0.05 holds to the end")
delay the noisier series (with a true lag of 0 they gave one-sided p down to 1e-10), and the
least-squares step drifts towards the middle of the series, more so for the noisier one. So
the lag is **calibrated against a null with the same rule**: per head, both series are redrawn
:data:`NULL_DRAWS` times from the step model fitted to them (their own levels and noise), with
one common onset (the formation onset: a true lag of 0), and the same rule gives each draw's
lag; ``expected_lag`` is their mean, the bias of the rule for that head.

Heads of one layer share their residual stream and are not independent, so the claim's test
is over layers (:func:`layer_lag_test`): each head's lag is placed in its own null distribution
(a randomised probability integral transform, uniform under the null), each layer contributes
its heads' mean, and a one-sided sign-flip test over layers asks whether those are positive.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import pandas as pd

__all__ = ["EXACT_FLIPS", "FLIP_DRAWS", "GROUPS", "NULL_DRAWS", "head_onsets", "layer_lag_test", "sign_flip_p", "step_fit",
           "step_onset", "step_onsets"]

#: Head groups: the score that forms them, and the sign of Δ_TR that consolidates them.
GROUPS: dict[str, tuple[str, float]] = {
    "previous-token": ("prev_token_score", 1.0),
    "induction": ("induction_score", 1.0),
    "sink": ("sink_mass", -1.0),
}


#: Redraws per head of the null with a common onset (the lag's calibration).
NULL_DRAWS = 200


def step_onsets(x: np.ndarray) -> np.ndarray:
    """Least-squares single change point along the last axis of ``x`` (finite values): per
    series the ``k`` in ``1 … T−1`` whose split into ``x[:k]`` and ``x[k:]``, each at its mean,
    leaves the smallest residual sum of squares (the first such ``k`` on ties), or −1 when the
    series is constant, shorter than 2, or the level after the step is not above the level
    before (no onset). Exact arithmetic on prefix sums: ``SSE(k) = Σx² − S_k²/k − (S − S_k)²/(T − k)``.

    Examples
    --------
    >>> step_onsets(np.array([[0.1, 0.0, 0.2, 1.0, 0.9, 1.1], [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]]))
    array([ 3, -1])
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    if n < 2:
        return np.full(x.shape[:-1], -1)
    k = np.arange(1, n)
    head = np.cumsum(x, axis=-1)[..., :-1]
    total = x.sum(axis=-1, keepdims=True)
    best = np.argmax(head**2 / k + (total - head) ** 2 / (n - k), axis=-1)
    at = np.take_along_axis(head, best[..., None], axis=-1)[..., 0]
    before, after = at / k[best], (total[..., 0] - at) / (n - k[best])
    return np.where((after > before) & (np.ptp(x, axis=-1) > 0), k[best], -1)


def step_onset(values: np.ndarray) -> int | None:
    """:func:`step_onsets` of one series after dropping NaN entries (the index counts the
    finite entries), None for no onset.

    Examples
    --------
    >>> step_onset(np.array([0.1, 0.0, 0.2, 1.0, 0.9, 1.1]))
    3
    >>> step_onset(np.array([1.0, 1.0, 0.0])) is None
    True
    """
    x = np.asarray(values, dtype=np.float64)
    k = int(step_onsets(x[np.isfinite(x)]))
    return None if k < 0 else k


def step_fit(x: np.ndarray, onset: int) -> tuple[float, float, float]:
    """``(before, after, sd)`` of the step model at ``onset``: the two levels (means) and the
    residual standard deviation (``T − 2`` degrees of freedom; 0 for ``T ≤ 2``)."""
    x = np.asarray(x, dtype=np.float64)
    before, after = float(x[:onset].mean()), float(x[onset:].mean())
    resid = np.concatenate([x[:onset] - before, x[onset:] - after])
    return before, after, float(np.sqrt((resid**2).sum() / (x.size - 2))) if x.size > 2 else 0.0


def null_lags(score: np.ndarray, reserve: np.ndarray, formation: int, rng: np.random.Generator,
              draws: int = NULL_DRAWS) -> np.ndarray:
    """The lags :func:`step_onsets` gives under a true lag of 0: both series redrawn ``draws``
    times from the step model of the null hypothesis, each fitted at the common onset
    ``formation`` (:func:`step_fit`: its levels and residual noise ``N(0, sd)``); NaN for a
    draw where either rule finds no onset. Monte Carlo."""
    k = np.arange(score.size)
    planted = []
    for x in (score, reserve):
        before, after, sd = step_fit(x, formation)
        planted.append(before + (after - before) * (k >= formation) + sd * rng.standard_normal((draws, k.size)))
    f, c = step_onsets(planted[0]), step_onsets(planted[1])
    return np.where((f >= 0) & (c >= 0), c - f, np.nan).astype(np.float64)


def _group(final: Mapping[str, float], routing: float, sink: float) -> str | None:
    """The group of a head from its final-checkpoint row: the larger routing score when one
    reaches ``routing``, else ``sink`` when its sink mass reaches ``sink``."""
    prev, ind = float(final["prev_token_score"]), float(final["induction_score"])
    if max(prev, ind) >= routing:
        return "previous-token" if prev >= ind else "induction"
    if float(final["sink_mass"]) >= sink:
        return "sink"
    return None


def _entropy(replicate: int, layer: int, head: int) -> list[int]:
    """Seed entropy of a head's null draws (:func:`null_lags`): its layer and index, and its
    replicate beyond the first series (so a single series draws as it did before replicates)."""
    return [int(layer), int(head), *([int(replicate)] if replicate else [])]


def head_onsets(heads: pd.DataFrame, *, routing: float = 0.3, sink: float = 0.5) -> pd.DataFrame:
    """Onsets of every grouped head of one series, or of replicate series of one configuration
    (:func:`step_onset` of its role score and of its signed excess reserve) and the lag the
    rule gives under a common onset (:func:`null_lags`, seeded per head by its replicate, layer
    and index, so deterministic).

    Parameters
    ----------
    heads : DataFrame
        One row per (checkpoint, layer, head) with ``order`` (the checkpoint's index in
        training order), ``step``, ``prev_token_score``, ``induction_score``, ``sink_mass`` and
        ``delta_TR1``; with replicates, also ``replicate`` (their series share the orders and
        steps; without the column every row is replicate 0).
    routing, sink : float
        Role thresholds (the attention stage's defaults), which set the groups at the last
        checkpoint only.

    Returns
    -------
    DataFrame
        One row per head in a group at the last checkpoint: ``replicate``, ``layer``, ``head``, ``group``,
        ``formation_order``/``formation_step`` and ``consolidation_order``/
        ``consolidation_step`` (NaN when the series has no rising step), ``lag`` (in
        checkpoints; NaN unless both onsets exist), ``null_lags`` (the rule's lags under a true
        lag of 0, :func:`null_lags`; None with a NaN ``lag``) and ``expected_lag`` (their mean).
    """
    cols = ["replicate", "layer", "head", "group", "formation_order", "formation_step", "consolidation_order",
            "consolidation_step", "lag", "expected_lag", "null_lags"]
    if heads.empty:
        return pd.DataFrame(columns=cols)
    if "replicate" not in heads.columns:
        heads = heads.assign(replicate=0)
    ids = ["replicate", "layer", "head"]
    orders = np.sort(heads["order"].unique())
    steps = heads.drop_duplicates("order").set_index("order")["step"].reindex(orders).to_numpy(dtype=float)
    keys = heads[ids].drop_duplicates().sort_values(ids).reset_index(drop=True)
    row = pd.Series(np.arange(len(keys)), index=pd.MultiIndex.from_frame(keys)).reindex(
        pd.MultiIndex.from_frame(heads[ids])).to_numpy()
    col = np.searchsorted(orders, heads["order"].to_numpy())
    wide = {}
    for name in ("prev_token_score", "induction_score", "sink_mass", "delta_TR1"):
        grid = np.full((len(keys), orders.size), np.nan)
        grid[row, col] = pd.to_numeric(heads[name], errors="coerce").to_numpy(dtype=float)
        wide[name] = grid
    rows = []
    for i, (replicate, layer, head) in enumerate(keys.itertuples(index=False)):
        series = {name: grid[i] for name, grid in wide.items()}
        final = {col: v[-1] for col, v in series.items()}
        if np.isnan(final["sink_mass"]):
            continue
        group = _group(final, routing, sink)
        if group is None:
            continue
        score, sign = GROUPS[group]
        at = np.flatnonzero(np.isfinite(series[score]) & np.isfinite(series["delta_TR1"]))
        x, r = series[score][at], sign * series["delta_TR1"][at]
        f, c = step_onset(x), step_onset(r)
        null = None if f is None or c is None else null_lags(
            x, r, f, np.random.default_rng(np.random.SeedSequence(_entropy(replicate, layer, head))))
        rows.append({"replicate": int(replicate), "layer": int(layer), "head": int(head), "group": group,
                     "formation_order": np.nan if f is None else float(orders[at[f]]),
                     "formation_step": np.nan if f is None else float(steps[at[f]]),
                     "consolidation_order": np.nan if c is None else float(orders[at[c]]),
                     "consolidation_step": np.nan if c is None else float(steps[at[c]]),
                     "lag": np.nan if null is None else float(c - f),
                     "expected_lag": np.nan if null is None or np.isnan(null).all() else float(np.nanmean(null)),
                     "null_lags": null})
    return pd.DataFrame(rows, columns=cols)


def _draw_key(keys: np.ndarray, lags: np.ndarray, nulls: list[np.ndarray]) -> int:
    """A 256-bit integer that identifies the values a lag test reads: sha256 of each head's
    ``(replicate, layer, head, lag, number of null draws)`` and its finite null lags, in the
    order given, as little-endian float64 (``-0.0`` written as ``0.0``), so the same on every
    machine.

    Parameters
    ----------
    keys : ndarray
        ``(n, 3)`` replicate, layer and head of each head.
    lags : ndarray
        ``(n,)`` each head's lag.
    nulls : list of ndarray
        Each head's finite null lags.

    Returns
    -------
    int
        The digest as an unsigned little-endian integer.
    """
    digest = hashlib.sha256()
    for key, lag, null in zip(keys, lags, nulls):
        digest.update((np.array([*key, lag, null.size], dtype="<f8") + 0.0).tobytes())
        digest.update((null.astype("<f8") + 0.0).tobytes())
    return int.from_bytes(digest.digest(), "little")


def layer_lag_test(onsets: pd.DataFrame, *, seed: int = 0) -> tuple[int, float, float]:
    """``(n, median, p)`` of the calibrated lag over layers (of every replicate: a layer of
    another seed's series is another independent unit).

    Each head's lag is placed in its own null distribution (its :func:`null_lags` draws, a
    true lag of 0 under the same rule) by the randomised probability integral transform
    ``u = P(L < lag) + V·P(L = lag)``: ``u`` is uniform under the null whatever the rule's bias
    and the lags' discreteness. Heads of one layer are not independent, so each layer
    contributes the mean of its heads' ``u − ½``, and ``p`` is the one-sided sign-flip test over
    layers that those means are positive (consolidation later than the rule alone gives): the
    fraction of the ``2^n`` sign patterns of the means whose mean is at least the observed one.
    Under the null each layer's mean is symmetric about 0, so ``P(p ≤ α) ≤ α`` exactly at any
    number of layers, with no normality assumed (a t-test over 6 layers is not); the smallest
    ``p`` is ``2^−n``. Exact enumeration up to :data:`EXACT_FLIPS` layers, above that
    :data:`FLIP_DRAWS` random patterns (``p = (1 + B)/(1 + draws)``, still valid); 1 with fewer
    than 2 layers. ``n``
    counts the layers, ``median`` is the median over layers of the mean of ``lag − expected_lag``.

    The ``V`` (and the random sign patterns) are the test's only random draws: with the ``n_heads`` heads that have a finite
    lag sorted by ``(replicate, layer, head)``, the k-th head's ``V`` is the k-th of the
    uniforms ``default_rng(SeedSequence([key, seed])).random(n_heads)``, where ``key`` is
    :func:`_draw_key` of those heads' replicate, layer, head, lag and finite null lags. So the
    same table and ``seed`` give the same ``p`` on every machine, and tables that differ in any
    of those values draw independent ``V``, as do the heads of one table (a ``V`` fixed per head
    position would decide alike, in every data set, the many heads whose lag equals most of
    their null draws, and bias ``p``).

    Parameters
    ----------
    onsets : DataFrame
        :func:`head_onsets` rows: ``layer``, ``head``, ``lag``, ``expected_lag``, ``null_lags``
        and optionally ``replicate`` (every row replicate 0 without it). Rows with a non-finite
        lag are left out; a head without finite null lags counts in its layer's ``median``
        term only.
    seed : int
        Run seed of the ``V`` stream.

    Returns
    -------
    tuple of (int, float, float)
        ``n`` (layers with at least one head that has finite null lags), ``median`` (NaN when
        no layer counts) and the one-sided ``p``.

    Examples
    --------
    >>> zero = np.zeros(100)
    >>> onsets = pd.DataFrame({"layer": [0, 0, 1, 2], "head": [0, 1, 0, 0], "lag": [1.0, 2.0, 1.0, -1.0],
    ...                        "expected_lag": 0.0, "null_lags": [zero] * 4})
    >>> n, median, p = layer_lag_test(onsets)
    >>> n, median, round(p, 3)
    (3, 1.0, 0.5)
    """
    ids = ["replicate", "layer", "head"]
    lag = pd.to_numeric(onsets["lag"], errors="coerce").to_numpy(dtype=float)
    paired = onsets[np.isfinite(lag)]
    if "replicate" not in paired.columns:
        paired = paired.assign(replicate=0)
    paired = paired.sort_values(ids, kind="stable")
    lags = pd.to_numeric(paired["lag"]).to_numpy(dtype=float)
    nulls = [np.asarray(v, dtype=float) for v in paired["null_lags"]]
    nulls = [v[np.isfinite(v)] for v in nulls]
    key = _draw_key(paired[ids].to_numpy(dtype=float), lags, nulls)
    v = np.random.default_rng(np.random.SeedSequence([key, int(seed)])).random(len(nulls))
    shift = np.array([np.mean(null < x - 1e-9) + w * np.mean(np.abs(null - x) <= 1e-9) - 0.5 if null.size else np.nan
                      for null, x, w in zip(nulls, lags, v)], dtype=float)
    units = pd.DataFrame({"replicate": paired["replicate"].to_numpy(), "layer": paired["layer"].to_numpy(),
                          "shift": shift, "excess": lags - pd.to_numeric(paired["expected_lag"]).to_numpy(dtype=float)})
    per_layer = units.groupby(["replicate", "layer"], sort=True)[["shift", "excess"]].mean()
    per_layer = per_layer[np.isfinite(per_layer["shift"].to_numpy(dtype=float))]
    means, excess = per_layer["shift"].to_numpy(dtype=float), per_layer["excess"].to_numpy(dtype=float)
    n = means.size
    if n < 2:
        return n, float(np.median(excess)) if n else float("nan"), 1.0
    return n, float(np.median(excess)), sign_flip_p(means, np.random.SeedSequence([key, int(seed), 1]))


#: Layers up to which :func:`sign_flip_p` enumerates every sign pattern.
EXACT_FLIPS = 16
#: Random sign patterns of :func:`sign_flip_p` above :data:`EXACT_FLIPS` layers.
FLIP_DRAWS = 20_000


def sign_flip_p(means: np.ndarray, seed: np.random.SeedSequence) -> float:
    """One-sided sign-flip p-value that ``means`` (one per unit) are centred above 0: the share of
    sign patterns ``s`` with ``mean(s·|means|) ≥ mean(means)`` (every pattern up to
    :data:`EXACT_FLIPS` units; else :data:`FLIP_DRAWS` patterns drawn from ``seed``, with the
    observed one counted, ``(1 + B)/(1 + draws)``). Exact under a null symmetric about 0.

    Examples
    --------
    >>> round(sign_flip_p(np.array([0.5, 0.5, -0.5]), np.random.SeedSequence(0)), 3)
    0.5
    >>> sign_flip_p(np.full(6, 0.2), np.random.SeedSequence(0)) == 2.0 ** -6
    True
    """
    n = means.size
    observed = means.mean() - 1e-12 * max(1.0, float(np.abs(means).max()))
    if n <= EXACT_FLIPS:
        signs = 1 - 2 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
        return float(np.mean(signs @ np.abs(means) / n >= observed))
    signs = np.where(np.random.default_rng(seed).random((FLIP_DRAWS, n)) < 0.5, -1.0, 1.0)
    return float((1 + np.count_nonzero(signs @ np.abs(means) / n >= observed)) / (1 + FLIP_DRAWS))
