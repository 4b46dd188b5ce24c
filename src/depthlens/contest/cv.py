"""The contest's statistics (METHODS A7): grouped cross-validation by layer, layer-cluster
bootstrap, within-layer permutations, Benjamini–Hochberg. Pure functions of arrays and tables.

One target at a time (:func:`contest_target`): for every feature set (each family, ``all`` and
``all-X``) a pipeline ``SimpleImputer(median) → StandardScaler → Ridge(alpha=1)`` is fitted on
the training folds of a grouped K-fold by layer (a layer is never split, and the imputer and the
scaler are fitted inside the folds), and scored on the out-of-fold predictions: AUROC for the
binary routing target, Spearman ρ for the others.

Structure that makes it fast (and exact):

- **Every permutation at once.** Permuting the labels within layers moves no head between
  folds, and the imputer and scaler depend on the features only, so the whole cross-validation
  of ``n_perm`` permuted label vectors is one multi-output ridge per fold, ``fit(X, Y)`` with
  ``Y`` of ``1 + n_perm`` columns (the observed labels first): one Cholesky factorisation per
  fold instead of ``1 + n_perm``. It is why the binary routing target also uses a ridge (a
  linear probability model scored by AUROC) rather than a logistic regression, whose fits
  cannot be shared across label vectors. Each column equals a separate single-output fit to
  rounding (tested to 1e-10).
- **Every bootstrap resample without re-sorting.** A layer-cluster resample is a vector of
  integer weights per head (how often its layer was drawn). Ranks of the resampled sample are
  the weighted mid-ranks of the original order (sorted once per feature set), and Spearman ρ is
  the weighted Pearson correlation of those ranks, AUROC the weighted Mann–Whitney statistic:
  exactly the values of the expanded resample, for all resamples as one array operation.
  Resamples reuse the out-of-fold predictions (no refit), and every feature set of a target sees
  the same resamples, so ``delta = score(all) − score(all−X)`` is paired.

Randomness comes from :class:`numpy.random.SeedSequence` ``[seed, *tag, 0]`` (permutations) and
``[seed, *tag, 1]`` (bootstrap); the folds are deterministic (:class:`~sklearn.model_selection.GroupKFold`
without shuffling).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from sklearn.impute import SimpleImputer
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import Pipeline
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

from ..errors import InputError
from ..stats import bh_qvalues
from ..schema import IDENTITY, SCHEMA

__all__ = [
    "CI_LEVEL",
    "COLUMNS",
    "FAMILIES",
    "bootstrap_scores",
    "clean_features",
    "contest_target",
    "feature_sets",
    "grouped_folds",
    "layer_bootstrap_weights",
    "make_model",
    "oof_predictions",
    "score_columns",
    "weighted_midranks",
    "with_qvalues",
    "within_group_permutations",
]

#: The feature families (METHODS A7): pattern, eigenvalue, norm (singular value), resolvent.
FAMILIES: dict[str, tuple[str, ...]] = {
    "P": ("sink_mass", "row_entropy", "mean_distance", "max_weight"),
    "E": ("rho_B", "diag_q25", "diag_q50", "diag_q75"),
    "S": ("norm_B", "fro_B", "sigma2_B", "stable_rank_B"),
    "R": ("TR1", "TR2", "peak_k", "psr_B@0.01", "num_radius_B", "henrici_B_rel", "delta_TR1", "z_TR1"),
}
#: Level of the percentile bootstrap intervals.
CI_LEVEL = 0.95
#: Columns of the rows :func:`contest_target` returns: the ``contest`` table's less ``target`` and
#: ``q``, which the stage adds.
COLUMNS = tuple(c for c in SCHEMA["contest"].columns if c not in (*IDENTITY, "target", "q"))
#: A permuted score counts as reaching the observed one when it is at least ``observed − TIE``:
#: the observed column and a permutation that leaves the labels unchanged differ by rounding only.
TIE = 1e-12
#: FDR level at which an ``all-X`` drop must be significant for X to be ``required``.
Q_LEVEL = 0.05
METRICS = ("auroc", "spearman")


# ----------------------------------------------------------------------------- feature sets
def feature_sets(families: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The contest's feature sets: each family, ``all`` (every family) and ``all-X`` for each
    family X, in that order (9 sets for 4 families).

    Examples
    --------
    >>> list(feature_sets({"P": ["a"], "E": ["b", "c"]}).items())
    [('P', ('a',)), ('E', ('b', 'c')), ('all', ('a', 'b', 'c')), ('all-P', ('b', 'c')), ('all-E', ('a',))]
    """
    sets = {name: tuple(cols) for name, cols in families.items()}
    sets["all"] = tuple(c for cols in families.values() for c in cols)
    for name in families:
        sets[f"all-{name}"] = tuple(c for other, cols in families.items() if other != name for c in cols)
    return sets


def clean_features(table: pd.DataFrame, families: Mapping[str, Sequence[str]] = FAMILIES
                   ) -> tuple[pd.DataFrame, dict[str, tuple[str, ...]], dict[str, str]]:
    """The feature columns of ``table`` as float64 with ±inf as NaN, the families restricted to
    the columns kept, and the columns dropped with why (``absent`` or ``all NaN``). Remaining
    NaNs are left for the pipeline's median imputer."""
    kept: dict[str, tuple[str, ...]] = {}
    dropped: dict[str, str] = {}
    frame = {}
    for name, cols in families.items():
        keep = []
        for col in cols:
            if col not in table.columns:
                dropped[col] = "absent"
                continue
            values = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=np.float64, copy=True)
            values[np.isinf(values)] = np.nan
            if np.isnan(values).all():
                dropped[col] = "all NaN"
                continue
            frame[col] = values
            keep.append(col)
        kept[name] = tuple(keep)
    return pd.DataFrame(frame, index=table.index), kept, dropped


# ----------------------------------------------------------------------------- resampling
def grouped_folds(groups: np.ndarray, n_folds: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs of a grouped K-fold with ``min(n_folds, groups)`` folds: every
    group (layer) lies wholly in one test fold. Deterministic (no shuffling).

    Raises
    ------
    InputError
        With fewer than two groups (no held-out layer to predict).
    """
    groups = np.asarray(groups)
    n_groups = np.unique(groups).size
    if n_groups < 2:
        raise InputError(f"the contest needs heads of at least 2 layers to cross-validate by layer; got {n_groups}.")
    splitter = GroupKFold(n_splits=min(int(n_folds), n_groups))
    return list(splitter.split(np.zeros((groups.size, 1)), groups=groups))


def within_group_permutations(groups: np.ndarray, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """``n_perm`` random permutations that move indices only within their group: row k maps
    position i to the index whose label it takes (``y[perm[k]]`` is the k-th permuted label
    vector). Shape ``(n_perm, n)``."""
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].ravel()
    base = np.argsort(codes, kind="stable")  # positions sorted by group
    keys = codes[base][None, :] + rng.random((n_perm, codes.size))  # group blocks stay put
    out = np.empty((n_perm, codes.size), dtype=np.int64)
    out[:, base] = base[np.argsort(keys, axis=1, kind="stable")]
    return out


def layer_bootstrap_weights(groups: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Layer-cluster bootstrap as integer weights: each resample draws as many groups as there
    are, with replacement; a head's weight is how often its group was drawn. Shape
    ``(n_boot, n)``, float64."""
    codes = np.unique(np.asarray(groups), return_inverse=True)[1].ravel()
    n_groups = int(codes.max()) + 1
    draws = rng.integers(0, n_groups, size=(n_boot, n_groups))
    flat = (draws + n_groups * np.arange(n_boot)[:, None]).ravel()
    counts = np.bincount(flat, minlength=n_boot * n_groups).reshape(n_boot, n_groups)
    return counts[:, codes].astype(np.float64)


# ----------------------------------------------------------------------------- models
def make_model() -> Pipeline:
    """``SimpleImputer(median) → StandardScaler → Ridge(alpha=1.0)``, for every target."""
    return Pipeline([("impute", SimpleImputer(strategy="median")), ("scale", StandardScaler()),
                     ("ridge", Ridge(alpha=1.0))])


def oof_predictions(X: np.ndarray, Y: np.ndarray, folds: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Out-of-fold predictions of :func:`make_model` for labels ``Y`` (n,) or every column of
    ``Y`` (n, k) at once (one multi-output fit per fold)."""
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    out = np.empty(Y.shape)
    for train, test in folds:
        out[test] = make_model().fit(X[train], Y[train]).predict(X[test]).reshape(out[test].shape)
    return out


# ----------------------------------------------------------------------------- scores
def _pearson_columns(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(axis=0)
    b = b - b.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a * b).sum(axis=0) / np.sqrt((a * a).sum(axis=0) * (b * b).sum(axis=0))


def score_columns(pred: np.ndarray, labels: np.ndarray, metric: str) -> np.ndarray:
    """The metric of every column of predictions ``pred`` (n, k) against its own column of
    ``labels`` (n, k): ``auroc`` (mid-ranks, i.e. :func:`sklearn.metrics.roc_auc_score` with
    ties counted one half) or ``spearman`` (Pearson correlation of mid-ranks,
    :func:`scipy.stats.spearmanr`). NaN where undefined (one class, constant column)."""
    pred = np.asarray(pred, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    ranks = rankdata(pred, axis=0)
    if metric == "auroc":
        pos = labels > 0.5
        n1 = pos.sum(axis=0).astype(np.float64)
        n0 = labels.shape[0] - n1
        with np.errstate(divide="ignore", invalid="ignore"):
            return ((ranks * pos).sum(axis=0) - n1 * (n1 + 1) / 2) / (n1 * n0)
    if metric == "spearman":
        return _pearson_columns(ranks, rankdata(labels, axis=0))
    raise InputError(f"unknown contest metric {metric!r}; use one of {', '.join(METRICS)}.")


def weighted_midranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Mid-ranks of ``values`` (n,) in the sample where value i occurs ``weights[b, i]`` times,
    for every row b of ``weights`` (B, n): what :func:`scipy.stats.rankdata` gives each copy
    in the expanded sample (ties and copies share their mean rank). Shape (B, n); entries of
    zero weight are ranked as if they had one copy but count for nothing."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    sizes = np.diff(np.r_[starts, values.size])
    group_weight = np.add.reduceat(weights[:, order], starts, axis=1)
    mid = np.cumsum(group_weight, axis=1) - group_weight + (group_weight + 1) / 2
    out = np.empty(weights.shape)
    out[:, order] = np.repeat(mid, sizes, axis=1)
    return out


def bootstrap_scores(pred: np.ndarray, labels: np.ndarray, weights: np.ndarray, metric: str) -> np.ndarray:
    """The metric of ``pred`` against ``labels`` (both (n,)) in every weighted resample (rows of
    ``weights``, (B, n)): exactly the score of the expanded resample, without forming it.
    NaN for a resample where it is undefined."""
    weights = np.asarray(weights, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    rp = weighted_midranks(pred, weights)
    total = weights.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "auroc":
            pos = (labels > 0.5).astype(np.float64)
            w1 = weights @ pos
            w0 = total - w1
            return ((weights * rp) @ pos - w1 * (w1 + 1) / 2) / (w1 * w0)
        if metric != "spearman":
            raise InputError(f"unknown contest metric {metric!r}; use one of {', '.join(METRICS)}.")
        ry = weighted_midranks(labels, weights)
        mp = (weights * rp).sum(axis=1, keepdims=True) / total[:, None]
        my = (weights * ry).sum(axis=1, keepdims=True) / total[:, None]
        dp, dy = rp - mp, ry - my
        cov = (weights * dp * dy).sum(axis=1)
        return cov / np.sqrt((weights * dp * dp).sum(axis=1) * (weights * dy * dy).sum(axis=1))


def _interval(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return np.nan, np.nan
    half = 50 * (1 - CI_LEVEL)
    lo, hi = np.percentile(finite, [half, 100 - half])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------- the contest
def contest_target(features: pd.DataFrame, families: Mapping[str, Sequence[str]], y: np.ndarray, groups: np.ndarray,
                   metric: str, *, folds: int, n_boot: int, n_perm: int, seed: int, tag: Sequence[int] = ()
                   ) -> pd.DataFrame:
    """Every feature set's cross-validated score for one target: one row per set of
    :func:`feature_sets`, with the columns of :data:`COLUMNS`.

    Parameters
    ----------
    features : DataFrame
        One row per head, the feature columns (float, NaN allowed: imputed inside the folds);
        see :func:`clean_features`.
    families : mapping
        Family name -> its columns in ``features`` (an empty family gives NaN rows).
    y : array (n,)
        The target per head (0/1 for ``auroc``); heads with NaN are left out.
    groups : array (n,)
        The head's layer: folds, permutations and bootstrap resamples keep layers whole.
    metric : str
        ``auroc`` or ``spearman``.
    folds, n_boot, n_perm : int
        Folds of the grouped K-fold (at most the number of layers), bootstrap resamples,
        permutations.
    seed, tag : int, sequence of int
        Randomness from ``SeedSequence([seed, *tag, 0])`` (permutations) and ``[seed, *tag, 1]``
        (bootstrap).

    Returns
    -------
    DataFrame
        ``score`` and ``r2`` from the out-of-fold predictions (``r2`` NaN for ``auroc``);
        ``score_lo``/``score_hi`` the 95% percentile interval over layer-cluster resamples;
        ``p = (1 + #{perm score ≥ score}) / (1 + n_perm)`` (a NaN permuted score counts as
        reaching it); for ``all-X`` ``delta = score(all) − score(all−X)``, its interval over the
        same resamples, ``p`` the same test of ``delta`` (the drops of the same label
        permutations), and ``required = delta_lo > 0`` before :func:`with_qvalues` also asks for
        its q-value (the bootstrap reuses the out-of-fold predictions without refitting, so the
        interval alone is too narrow: under pure noise it excluded 0 for some family in 11 of
        40 seeds).

    Raises
    ------
    InputError
        For an unknown metric or fewer than two layers with a target value.
    """
    if metric not in METRICS:
        raise InputError(f"unknown contest metric {metric!r}; use one of {', '.join(METRICS)}.")
    y = np.asarray(y, dtype=np.float64)
    groups = np.asarray(groups)
    if not len(features) == y.size == groups.size:
        raise InputError(f"the contest got {len(features)} feature rows, {y.size} targets and {groups.size} layers; "
                         "pass one of each per head.")
    keep = ~np.isnan(y)
    y, groups, X = y[keep], groups[keep], features.loc[keep]
    splits = grouped_folds(groups, folds)
    perm = within_group_permutations(groups, n_perm, np.random.default_rng(np.random.SeedSequence([seed, *tag, 0])))
    weights = layer_bootstrap_weights(groups, n_boot, np.random.default_rng(np.random.SeedSequence([seed, *tag, 1])))
    Y = np.column_stack([y, y[perm].T])
    sets = feature_sets(families)
    rows, boots, scores, permuted = [], {}, {}, {}
    for name, cols in sets.items():
        row = {"features": name, "metric": metric, "score": np.nan, "score_lo": np.nan, "score_hi": np.nan,
               "r2": np.nan, "p": np.nan}
        boot = np.full(n_boot, np.nan)
        permuted[name] = np.full(n_perm, np.nan)
        if cols:
            pred = oof_predictions(X[list(cols)].to_numpy(dtype=np.float64), Y, splits)
            s = score_columns(pred, Y, metric)
            score = float(s[0])
            permuted[name] = s[1:]
            if np.isfinite(score):
                reached = int((~(s[1:] < score - TIE)).sum())
                row["p"] = (1 + reached) / (1 + n_perm)
            boot = bootstrap_scores(pred[:, 0], y, weights, metric)
            row["score"] = score
            row["score_lo"], row["score_hi"] = _interval(boot)
            if metric == "spearman":
                ss = float(((y - y.mean()) ** 2).sum())
                row["r2"] = 1 - float(((y - pred[:, 0]) ** 2).sum()) / ss if ss > 0 else np.nan
        boots[name], scores[name] = boot, row["score"]
        rows.append(row)
    for row in rows:
        name = row["features"]
        if name.startswith("all-"):
            row["delta"] = delta = scores["all"] - scores[name]
            row["delta_lo"], row["delta_hi"] = _interval(boots["all"] - boots[name])
            row["required"] = bool(row["delta_lo"] > 0)
            if np.isfinite(delta):
                reached = int((~(permuted["all"] - permuted[name] < delta - TIE)).sum())
                row["p"] = (1 + reached) / (1 + n_perm)
        else:
            row.update(delta=np.nan, delta_lo=np.nan, delta_hi=np.nan, required=False)
        row["n_heads"] = int(y.size)
        row["n_folds"] = len(splits)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def with_qvalues(table: pd.DataFrame, q_level: float = Q_LEVEL) -> pd.DataFrame:
    """``table`` with ``q``: Benjamini–Hochberg over every row's ``p`` (NaN p stays NaN); an
    ``all-X`` row stays ``required`` only when its drop is also significant, ``q ≤ q_level``."""
    out = table.copy()
    out["q"] = bh_qvalues(out["p"].to_numpy(dtype=np.float64)) if len(out) else np.array([], dtype=np.float64)
    out["required"] = out["required"].astype(bool) & (out["q"].to_numpy(dtype=np.float64) <= q_level)
    return out
