"""The contest's statistics (METHODS A7): grouped cross-validation by layer, a refitting
layer-cluster bootstrap, within-layer permutations, Benjamini–Hochberg. Pure functions of arrays
and tables.

One target at a time (:func:`contest_target`): for every feature set (each family, ``all`` and
``all-X``) the model ``median imputation → standardisation → ridge (α = 1)`` (:func:`make_model`)
is fitted on the training folds of a grouped K-fold by layer (a layer is never split; the imputer
and the scaler are fitted inside the folds) and scored on the out-of-fold predictions: AUROC for
the binary routing target, Spearman ρ for the others.

Families of equal size. Every family of :data:`FEATURE_FAMILIES` has the same number of features (4),
a fixed choice declared here before any contest was run, so that neither a family's score nor
the drop ``all − all−X`` rewards a family for having more columns (more chances to match the
target, and, for ``all−X``, more columns removed). We chose equal sizes over keeping every
column with a penalty tuned by inner cross-validation because a tuned penalty depends on the
labels, so it would have to be re-tuned for every permutation and every bootstrap refit (an inner
grouped CV inside each of them), and because it equalises the cost of noise columns only
approximately. Kept, per family, are its defining quantities: P the attention mass on the three
positions a head can route to (first token ``sink_mass``, previous token ``prev_weight``, the token
after an earlier occurrence of the query's token ``induction_mass``) and its spread
(``row_entropy``); E and S unchanged; R the resolvent quantities proper (``TR1``, ``TR2``, ``peak_k``,
``psr_B@0.01``). Left out: ``mean_distance`` and ``max_weight`` (P: a distance moment and a second
concentration measure beside ``row_entropy``), ``delta_TR1`` and ``z_TR1`` (R: ``TR1`` re-centred and
re-scaled by its null, the same head quantity twice more) and ``num_radius_B`` and
``henrici_B_rel`` (numerical range and non-normality, not the resolvent). A column that is absent
or all NaN in a run is dropped (:func:`clean_features`), and then that family is smaller.

Tests:

- ``p`` of a single family and of ``all``: labels permuted within layers (the global null "this
  set predicts nothing").
- ``p`` of ``all-X``: the conditional test of "X adds nothing given the other families". The
  columns of X are permuted among the heads of each layer (labels and the other families kept),
  the ``all`` model refitted, and ``delta = score(all) − score(all−X)`` compared with the null
  drops ``score(all with X permuted) − score(all−X)``. The permutation breaks any within-layer
  dependence of X on the other families too, so the test is exact when X is exchangeable within
  layers given them, approximate otherwise.
- Intervals: the layer-cluster bootstrap refits. Each resample draws as many layers as there are,
  with replacement, and re-runs the whole grouped cross-validation on the resampled heads: a
  layer drawn c times enters as c copies that stay together in one fold (never one copy in
  training and another held out), with the folds assigned to the resample's layers by the rule of
  :func:`assign_folds`. ``delta``'s interval is paired (both models on the same resamples).

Structure that makes it fast (and exact):

- **Copies as integer weights.** A resample is a vector of integer weights per head (how often
  its layer was drawn). The median imputer, the scaler and the ridge of the expanded resample are
  the weighted ones, in closed form: expanded-sample medians from cumulative weights, weighted
  means and variances, and the ridge normal equations ``(ZᵀWZ + αI) β = ZᵀW(y − ȳ)``. Ranks of the
  resample are weighted mid-ranks, Spearman ρ their weighted Pearson correlation and AUROC the
  weighted Mann–Whitney statistic. Every resample of a chunk is one batched array operation per
  fold; each equals the plain pipeline on the expanded data to rounding (tested).
- **Every label permutation at once.** Permuting labels within layers moves no head between
  folds, and the imputer and scaler depend on the features only, so the cross-validation of
  ``n_perm`` permuted label vectors is one multi-output ridge per fold (``Y`` of ``1 + n_perm``
  columns, the observed labels first). It is why the routing target also uses a ridge (a linear
  probability model scored by AUROC) rather than a logistic regression.
- **Every feature permutation at once.** Permuting a family's columns within layers leaves each
  training fold's multiset of values, hence its medians, means and scales, unchanged, so the
  standardised design of a fold is computed once and only its rows of X are permuted; each
  permutation's ridge is one batched solve.

Randomness comes from :class:`numpy.random.SeedSequence` ``[seed, *tag, 0]`` (label permutations),
``[seed, *tag, 1]`` (bootstrap) and ``[seed, *tag, 2]`` (feature permutations); the folds are
deterministic (:func:`assign_folds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from sklearn.impute import SimpleImputer
from sklearn.linear_model import Ridge
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from ..errors import InputError
from ..schema import IDENTITY, SCHEMA
from ..stats import bh_qvalues

__all__ = [
    "ALPHA",
    "CI_LEVEL",
    "COLUMNS",
    "FEATURE_FAMILIES",
    "assign_folds",
    "bootstrap_scores",
    "clean_features",
    "contest_target",
    "feature_sets",
    "fold_design",
    "grouped_folds",
    "layer_bootstrap_counts",
    "make_model",
    "oof_predictions",
    "score_columns",
    "weighted_midranks",
    "with_qvalues",
    "within_group_permutations",
]

#: The feature families (METHODS A7), four features each (see the module docstring for the
#: choice): pattern, eigenvalue, norm (singular value), resolvent.
FEATURE_FAMILIES: dict[str, tuple[str, ...]] = {
    "P": ("sink_mass", "prev_weight", "induction_mass", "row_entropy"),
    "E": ("rho_B", "diag_q25", "diag_q50", "diag_q75"),
    "S": ("norm_B", "fro_B", "sigma2_B", "stable_rank_B"),
    "R": ("TR1", "TR2", "peak_k", "psr_B@0.01"),
}
#: Ridge penalty (on the standardised features, sum-of-squares loss as in :class:`~sklearn.linear_model.Ridge`).
ALPHA = 1.0
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
#: Float64 entries of one batch of standardised designs (resamples × heads × features): 32 MB.
_BATCH_ENTRIES = 4_000_000


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


def clean_features(table: pd.DataFrame, families: Mapping[str, Sequence[str]] = FEATURE_FAMILIES
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
def _codes(groups: np.ndarray) -> np.ndarray:
    return np.unique(np.asarray(groups), return_inverse=True)[1].ravel()


def assign_folds(sizes: np.ndarray, n_folds: int) -> np.ndarray:
    """Fold of every group in every row of ``sizes`` (B, G), the heads a group brings (0: not in
    that sample): groups from the largest down (ties by index) each go to the fold with the fewest
    heads so far (ties to the lowest fold). Shape (B, G), ``-1`` for groups of size 0. Folds used:
    ``min(n_folds, groups present)``. Deterministic; vectorised over the rows."""
    sizes = np.asarray(sizes, dtype=np.float64)
    n_rows, n_groups = sizes.shape
    order = np.argsort(-sizes, axis=1, kind="stable")
    load = np.zeros((n_rows, int(n_folds)))
    out = np.full((n_rows, n_groups), -1, dtype=np.int64)
    rows = np.arange(n_rows)
    for step in range(n_groups):
        group = order[:, step]
        size = sizes[rows, group]
        fold = np.argmin(load, axis=1)
        live = size > 0
        out[rows[live], group[live]] = fold[live]
        load[rows, fold] += np.where(live, size, 0.0)
    return out


def grouped_folds(groups: np.ndarray, n_folds: int) -> np.ndarray:
    """Test fold of every head (n,) of a grouped K-fold with ``min(n_folds, groups)`` folds
    (:func:`assign_folds`): every group (layer) lies wholly in one fold.

    Raises
    ------
    InputError
        With fewer than two groups (no held-out layer to predict).
    """
    codes = _codes(groups)
    sizes = np.bincount(codes)
    if sizes.size < 2:
        raise InputError(f"the contest needs heads of at least 2 layers to cross-validate by layer; got {sizes.size}.")
    return assign_folds(sizes[None, :], n_folds)[0, codes]


def within_group_permutations(groups: np.ndarray, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """``n_perm`` random permutations that move indices only within their group: row k maps
    position i to the index whose label it takes (``y[perm[k]]`` is the k-th permuted label
    vector). Shape ``(n_perm, n)``."""
    codes = _codes(groups)
    base = np.argsort(codes, kind="stable")  # positions sorted by group
    keys = codes[base][None, :] + rng.random((n_perm, codes.size))  # group blocks stay put
    out = np.empty((n_perm, codes.size), dtype=np.int64)
    out[:, base] = base[np.argsort(keys, axis=1, kind="stable")]
    return out


def layer_bootstrap_counts(n_groups: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Layer-cluster bootstrap: how often each of ``n_groups`` groups is drawn in each of
    ``n_boot`` resamples of ``n_groups`` draws with replacement. Shape ``(n_boot, n_groups)``,
    float64 (a head's weight is its group's count)."""
    draws = rng.integers(0, n_groups, size=(n_boot, n_groups))
    flat = (draws + n_groups * np.arange(n_boot)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n_groups).reshape(n_boot, n_groups).astype(np.float64)


# ----------------------------------------------------------------------------- models
def make_model() -> Pipeline:
    """``SimpleImputer(median) → StandardScaler → Ridge(alpha=ALPHA)``: the model of every
    target, which :func:`oof_predictions` computes in closed form (the reference it is tested
    against)."""
    return Pipeline([("impute", SimpleImputer(strategy="median")), ("scale", StandardScaler()),
                     ("ridge", Ridge(alpha=ALPHA))])


def _weighted_medians(X: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Median of every column of ``X`` (n, p) over its non-NaN entries, entry i counted
    ``w[b, i]`` times, for every row of ``w`` (B, n): :func:`numpy.median` of the expanded
    column (the mean of the two middle values for an even count). (B, p); NaN without values,
    and 0 for a column without NaN (nothing to impute, so the value is never used)."""
    out = np.zeros((w.shape[0], X.shape[1]))
    for j in np.flatnonzero(np.isnan(X).any(axis=0)):
        out[:, j] = np.nan
        ok = np.flatnonzero(~np.isnan(X[:, j]))
        if ok.size == 0:
            continue
        order = ok[np.argsort(X[ok, j], kind="stable")]
        values = X[order, j]
        cum = np.cumsum(w[:, order], axis=1)
        total = cum[:, -1]
        has = total > 0
        lo = (cum <= np.floor((total - 1) / 2)[:, None]).sum(axis=1)  # expanded positions ⌊(T−1)/2⌋, ⌊T/2⌋
        hi = (cum <= np.floor(total / 2)[:, None]).sum(axis=1)
        out[has, j] = (values[lo[has]] + values[hi[has]]) / 2
    return out


def fold_design(X: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The standardised design of every head for each training weighting: ``X`` (n, p) imputed
    by the weighted training medians and standardised by the weighted training mean and
    population standard deviation, for every row of the training weights ``w`` (B, n) (a head's
    copies in the training set; 0 outside it). What :func:`make_model`'s imputer and scaler,
    fitted on the expanded training rows, make of every row. Shape (B, n, p).

    As in scikit-learn, a column without a training value is left out (here: set to 0, so its
    ridge coefficient is 0) and a constant column is not scaled.
    """
    X = np.asarray(X, dtype=np.float64)
    median = _weighted_medians(X, w)
    Z = np.where(np.isnan(X)[None], median[:, None, :], X[None])
    total = w.sum(axis=1)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.einsum("bn,bnp->bp", w, Z) / total
        Z -= mean[:, None, :]
        var = np.einsum("bn,bnp->bp", w, Z * Z) / total
        eps = np.finfo(np.float64).eps
        constant = var <= total * eps * var + (total * mean * eps) ** 2  # sklearn's _is_constant_feature
        Z /= np.where(constant, 1.0, np.sqrt(var))[:, None, :]
    return np.where(np.isnan(median)[:, None, :], 0.0, Z)


def _ridge(Z: np.ndarray, w: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Predictions for every row of ``Z`` (B, n, p) of the weighted ridge with intercept fitted on
    the training weights ``w`` (B, n) to every column of ``Y`` (n, m): ``ȳ + Z β`` with ``ȳ`` the
    weighted mean and ``(ZᵀWZ + αI) β = ZᵀW(Y − ȳ)``. (The training columns of Z have weighted
    mean 0 by construction.) Shape (B, n, m)."""
    ybar = (w @ Y) / w.sum(axis=1)[:, None]
    Zw = Z * w[:, :, None]
    gram = Zw.transpose(0, 2, 1) @ Z
    gram[:, np.arange(Z.shape[2]), np.arange(Z.shape[2])] += ALPHA
    beta = np.linalg.solve(gram, Zw.transpose(0, 2, 1) @ (Y[None] - ybar[:, None, :]))
    return ybar[:, None, :] + Z @ beta


def oof_predictions(X: np.ndarray, Y: np.ndarray, fold: np.ndarray, weights: np.ndarray | None = None,
                    permute: tuple[np.ndarray, Sequence[int]] | None = None) -> np.ndarray:
    """Out-of-fold predictions of :func:`make_model` for every column of ``Y``, in every
    resample, in closed form (each equals the pipeline fitted on the expanded training rows to
    rounding).

    Parameters
    ----------
    X : array (n, p)
        Features per head, NaN allowed (p ≥ 1).
    Y : array (n,) or (n, m)
        Labels; every column is fitted with the same folds (one multi-output solve per fold).
    fold : int array (n,) or (B, n)
        Test fold of each head in each resample; ``-1`` for a head not in it.
    weights : array (B, n), optional
        Copies of each head in each resample (default: one each).
    permute : (perm, cols), optional
        Resample b takes the design columns ``cols`` of rows ``perm[b]`` (``perm`` (B, n), within
        layers, so no fold's imputation or scaling changes); ``weights`` must then be ``None``.

    Returns
    -------
    numpy.ndarray (B, n, m)
        NaN for heads not in a resample, and for every head of a resample of a single layer
        (B = 1 for a plain cross-validation).
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    fold = np.atleast_2d(fold)
    n_res = max(fold.shape[0], 1 if weights is None else weights.shape[0], 1 if permute is None else len(permute[0]))
    fold = np.broadcast_to(fold, (n_res, X.shape[0]))
    weights = np.ones(fold.shape) if weights is None else np.broadcast_to(weights, fold.shape)
    out = np.full((n_res, *Y.shape), np.nan)
    step = max(1, _BATCH_ENTRIES // (X.shape[0] * max(X.shape[1], Y.shape[1])))
    for start in range(0, n_res, step):
        part = slice(start, start + step)
        for k in range(int(fold[part].max()) + 1):
            train = weights[part] * ((fold[part] != k) & (fold[part] >= 0))
            fit = np.flatnonzero(train.sum(axis=1) > 0)  # a resample of one layer has nothing to train on
            if fit.size == 0:
                continue
            test = fold[part][fit] == k
            train = train[fit]
            if permute is None:
                Z = fold_design(X, train)
            else:
                perm, cols = permute
                base = fold_design(X, train[:1])[0]
                Z = np.repeat(base[None], fit.size, axis=0)
                Z[:, :, cols] = base[:, cols][perm[part][fit]]
            rows, heads = np.nonzero(test)
            out[start + fit[rows], heads] = _ridge(Z, train, Y)[rows, heads]
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
    """Mid-ranks of ``values`` ((n,) shared, or (B, n) one row per sample) in the sample where
    value i occurs ``weights[b, i]`` times, for every row b of ``weights`` (B, n): what
    :func:`scipy.stats.rankdata` gives each copy in the expanded sample (ties and copies share
    their mean rank). Shape (B, n); entries of zero weight get a rank but count for nothing."""
    weights = np.asarray(weights, dtype=np.float64)
    values = np.broadcast_to(np.asarray(values, dtype=np.float64), weights.shape)
    order = np.argsort(values, axis=1, kind="stable")
    v = np.take_along_axis(values, order, axis=1)
    w = np.take_along_axis(weights, order, axis=1)
    cum = np.cumsum(w, axis=1)
    new = np.ones(v.shape, dtype=bool)
    new[:, 1:] = v[:, 1:] != v[:, :-1]
    last = np.ones(v.shape, dtype=bool)
    last[:, :-1] = new[:, 1:]
    before = np.maximum.accumulate(np.where(new, cum - w, -np.inf), axis=1)  # weight below the tie group
    through = np.minimum.accumulate(np.where(last, cum, np.inf)[:, ::-1], axis=1)[:, ::-1]  # ... and in it
    out = np.empty(v.shape)
    np.put_along_axis(out, order, before + (through - before + 1) / 2, axis=1)
    return out


def bootstrap_scores(pred: np.ndarray, labels: np.ndarray, weights: np.ndarray, metric: str) -> np.ndarray:
    """The metric of ``pred`` ((n,), or (B, n) one row per resample) against ``labels`` (n,) in
    every weighted resample (rows of ``weights``, (B, n)): exactly the score of the expanded
    resample, without forming it. NaN for a resample where it is undefined."""
    weights = np.asarray(weights, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    rp = weighted_midranks(np.where(weights > 0, pred, 0.0), weights)  # heads left out count for nothing
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


def _pvalue(null: np.ndarray, observed: float) -> float:
    """``(1 + #{null ≥ observed − TIE}) / (1 + len(null))``; a NaN null value counts as reaching."""
    if not np.isfinite(observed):
        return np.nan
    return (1 + int((~(null < observed - TIE)).sum())) / (1 + null.size)


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
        Folds of the grouped K-fold (at most the number of layers), bootstrap resamples (each
        refits every set's cross-validation), permutations (of the labels for the single sets
        and ``all``, of the dropped family's columns for ``all-X``).
    seed, tag : int, sequence of int
        Randomness from ``SeedSequence([seed, *tag, s])``, s = 0 label permutations, 1 bootstrap,
        2 feature permutations.

    Returns
    -------
    DataFrame
        ``score`` and ``r2`` from the out-of-fold predictions (``r2`` NaN for ``auroc``);
        ``score_lo``/``score_hi`` the 95% percentile interval over the refitted layer-cluster
        resamples. For a family and ``all``, ``p = (1 + #{perm score ≥ score}) / (1 + n_perm)``
        over within-layer label permutations. For ``all-X``: ``delta = score(all) − score(all−X)``,
        its paired interval over the same resamples, ``p`` the conditional test of the drop
        (X's columns permuted within layers, ``all`` refitted: see the module docstring; NaN
        when X is empty), and ``required = delta_lo > 0`` before :func:`with_qvalues` also asks
        for its q-value. A NaN permuted score counts as reaching the observed one.

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
    fold = grouped_folds(groups, folds)
    codes = _codes(groups)
    streams = [np.random.default_rng(np.random.SeedSequence([seed, *tag, s])) for s in range(3)]
    label_perm = within_group_permutations(groups, n_perm, streams[0])
    counts = layer_bootstrap_counts(int(codes.max()) + 1, n_boot, streams[1])
    boot_weights = counts[:, codes]
    boot_fold = assign_folds(counts * np.bincount(codes), folds)[:, codes]
    feature_perm = within_group_permutations(groups, n_perm, streams[2])
    Y = np.column_stack([y, y[label_perm].T])
    sets = feature_sets(families)
    rows, boots, scores = {}, {}, {}
    for name, cols in sets.items():
        row = {"features": name, "metric": metric, "score": np.nan, "score_lo": np.nan, "score_hi": np.nan,
               "r2": np.nan, "p": np.nan, "delta": np.nan, "delta_lo": np.nan, "delta_hi": np.nan, "required": False,
               "n_heads": int(y.size), "n_folds": int(fold.max()) + 1}
        boot = np.full(n_boot, np.nan)
        if cols:
            Xs = X[list(cols)].to_numpy(dtype=np.float64)
            labelled = name in families or name == "all"
            pred = oof_predictions(Xs, Y if labelled else y, fold)[0]
            s = score_columns(pred, Y[:, : pred.shape[1]], metric)
            row["score"] = float(s[0])
            if labelled:
                row["p"] = _pvalue(s[1:], row["score"])
            if metric == "spearman":
                ss = float(((y - y.mean()) ** 2).sum())
                row["r2"] = 1 - float(((y - pred[:, 0]) ** 2).sum()) / ss if ss > 0 else np.nan
            boot = bootstrap_scores(oof_predictions(Xs, y, boot_fold, boot_weights)[:, :, 0], y, boot_weights, metric)
            row["score_lo"], row["score_hi"] = _interval(boot)
        rows[name], boots[name], scores[name] = row, boot, row["score"]
    for family, cols in families.items():
        row = rows[f"all-{family}"]
        row["delta"] = delta = scores["all"] - scores[f"all-{family}"]
        row["delta_lo"], row["delta_hi"] = _interval(boots["all"] - boots[f"all-{family}"])
        row["required"] = bool(row["delta_lo"] > 0)
        if cols and np.isfinite(delta):
            where = [sets["all"].index(c) for c in cols]
            pred = oof_predictions(X[list(sets["all"])].to_numpy(dtype=np.float64), y, fold,
                                   permute=(feature_perm, where))[:, :, 0]
            null = score_columns(pred.T, np.broadcast_to(y[:, None], pred.T.shape), metric)
            row["p"] = _pvalue(null - scores[f"all-{family}"], delta)
    return pd.DataFrame(list(rows.values()), columns=list(COLUMNS))


def with_qvalues(table: pd.DataFrame, q_level: float = Q_LEVEL) -> pd.DataFrame:
    """``table`` with ``q``: Benjamini–Hochberg over every row's ``p`` (NaN p stays NaN); an
    ``all-X`` row stays ``required`` only when its drop is also significant, ``q ≤ q_level``."""
    out = table.copy()
    out["q"] = bh_qvalues(out["p"].to_numpy(dtype=np.float64)) if len(out) else np.array([], dtype=np.float64)
    out["required"] = out["required"].astype(bool) & (out["q"].to_numpy(dtype=np.float64) <= q_level)
    return out
