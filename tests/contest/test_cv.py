"""The contest's statistics on synthetic heads (30 layers × 9 heads): the right family wins,
noise is calibrated (intervals and the conditional drop test), folds keep layers whole, and every
vectorised shortcut equals the plain computation it replaces."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from depthlens.contest import cv
from depthlens.stats import bh_qvalues

L, H = 30, 9
SIZES = {"P": 4, "E": 3, "S": 5, "R": 8}
GROUPS = np.repeat(np.arange(L), H)


def _heads(rng: np.random.Generator) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """Features per head with a layer effect (heads of a layer resemble each other) and a few NaNs."""
    families = {f: [f"{f.lower()}{i}" for i in range(k)] for f, k in SIZES.items()}
    cols = [c for cs in families.values() for c in cs]
    X = rng.normal(size=(L * H, len(cols))) + 0.5 * rng.normal(size=(L, len(cols)))[GROUPS]
    X[rng.random(X.shape) < 0.01] = np.nan
    return pd.DataFrame(X, columns=cols), families


def _contest(X, families, y, metric="spearman", n_perm=100, n_boot=200, seed=0, groups=GROUPS):
    return cv.with_qvalues(cv.contest_target(X, families, y, groups, metric, folds=5, n_boot=n_boot, n_perm=n_perm,
                                             seed=seed, tag=(3,))).set_index("features")


@pytest.mark.parametrize("metric", ["spearman", "auroc"])
def test_signal_family_wins_and_is_required(rng: np.random.Generator, metric: str) -> None:
    X, families = _heads(rng)
    signal = X[families["E"]].fillna(0).to_numpy() @ np.array([1.0, -0.7, 0.5])
    y = signal + 0.5 * rng.normal(size=signal.size)
    if metric == "auroc":
        y = (y > np.quantile(y, 0.7)).astype(float)
    table = _contest(X, families, y, metric)
    singles = table.loc[list(SIZES), "score"]
    assert singles.idxmax() == "E" and singles["E"] > (0.8 if metric == "auroc" else 0.6)
    assert table.loc["all-E", "required"] and table.loc["all-E", "delta_lo"] > 0
    assert table.loc["all", "score_lo"] <= table.loc["all", "score"] <= table.loc["all", "score_hi"]
    assert table.loc["E", "p"] == pytest.approx(1 / 101) and table.loc["E", "q"] <= 0.05
    assert (table["r2"].isna() if metric == "auroc" else table.loc["E", "r2"] > 0.3).all()
    assert table["delta"].notna().sum() == 4 and (table["n_heads"] == L * H).all() and (table["n_folds"] == 5).all()


def test_noise_is_calibrated() -> None:
    """A pure-noise target: in at least 90% of 20 seeds no family is required at q ≤ 0.05."""
    hits = 0
    for seed in range(20):
        rng = np.random.default_rng([99, seed])
        X, families = _heads(rng)
        table = _contest(X, families, rng.normal(size=L * H), n_perm=50, n_boot=50, seed=seed)
        hits += bool(table["required"].any())
    assert hits <= 2


def test_a_useless_family_is_not_required_beside_an_informative_one() -> None:
    """The target is built from E: the other families add nothing, and in at least 90% of 20
    seeds none of them is required."""
    hits = 0
    for seed in range(20):
        rng = np.random.default_rng([98, seed])
        X, families = _heads(rng)
        signal = X[families["E"]].fillna(0).to_numpy() @ np.array([1.0, -0.7, 0.5])
        table = _contest(X, families, signal + rng.normal(size=signal.size), n_perm=100, n_boot=50, seed=seed)
        assert table.loc["all-E", "required"]  # p = 1/101 for E, all and all-E: q ≤ 0.05
        hits += bool(table.loc[["all-P", "all-S", "all-R"], "required"].any())
    assert hits <= 2


def _drop_r(rng: np.random.Generator, signal: float, seed: int) -> pd.Series:
    """The ``all-R`` row of a contest of R (4 features) against the other families (12) on
    30 layers × 9 heads, features and target with layer effects; the target carries ``signal``
    times a combination of R."""
    X = pd.DataFrame(rng.normal(size=(L * H, 16)) + 0.5 * rng.normal(size=(L, 16))[GROUPS],
                     columns=[f"x{i}" for i in range(16)])
    families = {"O": list(X.columns[:12]), "R": list(X.columns[12:])}
    y = signal * X[families["R"]].to_numpy() @ np.array([1.0, -0.5, 0.5, 0.0]) + rng.normal(size=L * H)
    y += 0.5 * rng.normal(size=L)[GROUPS]
    return _contest(X, families, y, n_perm=49, n_boot=100, seed=seed).loc["all-R"]


def test_drop_interval_and_conditional_test_are_calibrated_under_noise() -> None:
    """R adds nothing (pure noise): over 40 seeds the 95% interval of delta excludes 0 in at
    most 2 (5%), and the conditional p-value is about uniform (at most 4 of 40 at p ≤ 0.05)."""
    rows = pd.DataFrame([_drop_r(np.random.default_rng([97, seed]), 0.0, seed) for seed in range(40)])
    excluded = (rows["delta_lo"] > 0) | (rows["delta_hi"] < 0)
    assert excluded.sum() <= 2 and not rows["required"].any()
    assert (rows["p"] <= 0.05).sum() <= 4 and 0.3 <= (rows["p"] <= 0.5).mean() <= 0.7


def test_a_planted_family_is_required() -> None:
    for seed in range(3):
        row = _drop_r(np.random.default_rng([96, seed]), 0.5, seed)
        assert row["required"] and row["delta_lo"] > 0 and row["p"] == pytest.approx(1 / 50)


def test_folds_never_split_a_layer(rng: np.random.Generator) -> None:
    groups = rng.permutation(np.repeat(np.arange(7), rng.integers(1, 12, size=7)))
    for n_folds in (2, 5, 7, 20):
        fold = cv.grouped_folds(groups, n_folds)
        assert np.array_equal(np.unique(fold), np.arange(min(n_folds, 7)))  # every head held out exactly once
        for layer in range(7):
            assert np.unique(fold[groups == layer]).size == 1
    with pytest.raises(cv.InputError):
        cv.grouped_folds(np.zeros(5), 3)


def test_resample_folds_keep_copies_together_and_balance(rng: np.random.Generator) -> None:
    counts = cv.layer_bootstrap_counts(L, 200, rng)
    assert np.array_equal(counts.sum(axis=1), np.full(200, L))  # as many layers as there are
    fold = cv.assign_folds(counts * H, 5)
    assert np.array_equal(fold < 0, counts == 0)  # undrawn layers are in no fold, copies in one
    load = np.stack([((fold == k) * counts * H).sum(axis=1) for k in range(5)], axis=1)
    assert (load.max(axis=1) - load.min(axis=1) <= (counts.max(axis=1) * H)).all()  # greedy: within one group


def test_permutations_stay_within_layers(rng: np.random.Generator) -> None:
    groups = rng.permutation(np.repeat(np.arange(5), [1, 2, 3, 4, 9]))
    perm = cv.within_group_permutations(groups, 200, rng)
    assert np.array_equal(np.sort(perm, axis=1), np.broadcast_to(np.arange(groups.size), perm.shape))
    assert np.array_equal(groups[perm], np.broadcast_to(groups, perm.shape))
    assert len({tuple(p) for p in perm}) > 150  # they do move heads


def test_pvalues_never_zero(rng: np.random.Generator) -> None:
    X, families = _heads(rng)
    y = X["r0"].fillna(0).to_numpy()  # predicted almost perfectly by R
    table = _contest(X, families, y, n_perm=20, n_boot=20)
    assert (table["p"] > 0).all() and table.loc["R", "p"] == pytest.approx(1 / 21)
    np.testing.assert_array_equal(table["q"].to_numpy(), bh_qvalues(table["p"].to_numpy()))


@pytest.mark.parametrize("metric", ["spearman", "auroc"])
def test_multi_output_fit_equals_refitting_each_permutation(rng: np.random.Generator, metric: str) -> None:
    X, families = _heads(rng)
    Xs = X[families["S"] + families["R"]].to_numpy()
    y = X["s0"].fillna(0).to_numpy() + rng.normal(size=L * H)
    if metric == "auroc":
        y = (y > 0).astype(float)
    perm = cv.within_group_permutations(GROUPS, 30, rng)
    Y = np.column_stack([y, y[perm].T])
    fold = cv.grouped_folds(GROUPS, 5)
    together = cv.oof_predictions(Xs, Y, fold)[0]
    scores = cv.score_columns(together, Y, metric)
    for k in range(Y.shape[1]):
        alone = np.empty(y.size)
        for f in range(5):  # a plain loop: a fresh pipeline per permutation and fold
            alone[fold == f] = cv.make_model().fit(Xs[fold != f], Y[fold != f, k]).predict(Xs[fold == f])
        np.testing.assert_allclose(together[:, k], alone, rtol=0, atol=1e-10)
        plain = roc_auc_score(Y[:, k], alone) if metric == "auroc" else spearmanr(alone, Y[:, k]).statistic
        assert scores[k] == pytest.approx(plain, abs=1e-10)


@pytest.mark.parametrize("metric", ["spearman", "auroc"])
def test_weighted_bootstrap_equals_expanded_resamples(rng: np.random.Generator, metric: str) -> None:
    groups = np.repeat(np.arange(8), 5)
    pred = np.round(rng.normal(size=groups.size), 1)  # ties in the predictions
    y = (rng.random(groups.size) < 0.4).astype(float) if metric == "auroc" else np.round(rng.normal(size=groups.size), 1)
    weights = cv.layer_bootstrap_counts(8, 50, rng)[:, groups]
    per_resample = pred + np.round(rng.normal(size=(50, groups.size)), 1)  # refitted predictions differ per resample
    for preds in (pred, per_resample):
        got = cv.bootstrap_scores(preds, y, weights, metric)
        for b in range(50):
            idx = np.repeat(np.arange(groups.size), weights[b].astype(int))
            p = np.broadcast_to(preds, weights.shape)[b, idx]
            if metric == "auroc":
                expect = roc_auc_score(y[idx], p) if 0 < y[idx].sum() < idx.size else np.nan
            else:
                expect = spearmanr(p, y[idx]).statistic
            assert got[b] == pytest.approx(expect, abs=1e-12, nan_ok=True)


@pytest.mark.filterwarnings("ignore:Skipping features without any observed values")
def test_bootstrap_refit_equals_the_pipeline_on_expanded_resamples(rng: np.random.Generator) -> None:
    """Each weighted resample's cross-validation equals the plain pipeline fitted on the expanded
    heads (a layer drawn c times as c copies, all in that layer's fold), NaNs imputed inside."""
    X, families = _heads(rng)
    Xs = X[families["R"] + families["S"]].to_numpy(copy=True)
    Xs[GROUPS != 0, 0] = np.nan  # only layer 0 has this value: training folds without it drop the column
    y = rng.normal(size=L * H)
    counts = cv.layer_bootstrap_counts(L, 12, rng)
    weights, fold = counts[:, GROUPS], cv.assign_folds(counts * H, 5)[:, GROUPS]
    got = cv.oof_predictions(Xs, y, fold, weights)[:, :, 0]
    for b in range(12):
        idx = np.repeat(np.arange(L * H), weights[b].astype(int))
        for f in range(5):
            train, test = idx[fold[b, idx] != f], np.flatnonzero(fold[b] == f)
            expect = cv.make_model().fit(Xs[train], y[train]).predict(Xs[test])
            np.testing.assert_allclose(got[b, test], expect, rtol=0, atol=1e-10)
        assert np.isnan(got[b, weights[b] == 0]).all()


def test_feature_permutation_equals_refitting_on_permuted_columns(rng: np.random.Generator) -> None:
    X, families = _heads(rng)
    cols = families["P"] + families["R"]
    Xs = X[cols].to_numpy()
    y = rng.normal(size=L * H)
    fold = cv.grouped_folds(GROUPS, 5)
    perm = cv.within_group_permutations(GROUPS, 6, rng)
    where = [cols.index(c) for c in families["R"]]
    got = cv.oof_predictions(Xs, y, fold, permute=(perm, where))[:, :, 0]
    for b in range(6):
        shuffled = Xs.copy()
        shuffled[:, where] = Xs[perm[b]][:, where]
        expect = np.empty(L * H)
        for f in range(5):
            expect[fold == f] = cv.make_model().fit(shuffled[fold != f], y[fold != f]).predict(shuffled[fold == f])
        np.testing.assert_allclose(got[b], expect, rtol=0, atol=1e-10)


def test_clean_features_drops_absent_and_empty_columns() -> None:
    table = pd.DataFrame({"a": [1.0, np.inf, 2.0], "b": [np.nan, -np.inf, np.nan], "c": [1, 2, 3]})
    X, kept, dropped = cv.clean_features(table, {"F": ["a", "b"], "G": ["c", "d"]})
    assert kept == {"F": ("a",), "G": ("c",)} and dropped == {"b": "all NaN", "d": "absent"}
    assert np.isnan(X["a"][1]) and list(X.columns) == ["a", "c"]


def test_empty_family_gives_nan_rows(rng: np.random.Generator) -> None:
    X, families = _heads(rng)
    families["E"] = []
    table = _contest(X, families, rng.normal(size=L * H), n_perm=10, n_boot=10)
    assert np.isnan(table.loc["E", "score"]) and np.isnan(table.loc["E", "p"])
    assert table.loc["all-E", "delta"] == 0.0 and not table.loc["all-E", "required"]
