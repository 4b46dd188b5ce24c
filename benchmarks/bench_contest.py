"""The feature-family contest (docs/methods.md#a7) at SmolLM2 size: a synthetic heads table of 30 layers
× 9 heads with the real families (P, E, S, R, 4 features each) and 3 targets (persistence,
routing, criticality), 5 grouped folds, 1000 refitted layer-cluster bootstrap resamples and 1000
within-layer permutations (of the labels for a family and ``all``, of the dropped family's columns
for ``all-X``) for every feature set (9 per target), as :func:`depthlens.contest.cv.contest_target`
runs them for the stage. Prints the total seconds (target < 2 min on 2 cores) against the naive
method measured in the same run: scikit-learn's pipeline (:func:`~depthlens.contest.cv.make_model`)
fitted afresh per fold for the observed labels, every label permutation, every feature
permutation (``all`` refitted with X's columns permuted within layers) and every bootstrap
resample (the resample's rows expanded, a layer drawn c times as c copies in one fold, the whole
grouped cross-validation refitted and scored on the expanded rows), timed on a sample of
permutations and resamples of every (target, feature set) and extrapolated. The same sampled
permutations and resamples (the contest's own random streams) are also computed the fast way
and the largest score difference printed, to show both compute the same thing (predictions agree
to ~1e-14; a score may differ by ~1e-6 where scikit-learn predicts the copies of one head a unit
in the last place apart, which breaks their tie in the ranks of the expanded resample).

Then the stage's own features per chunk at SmolLM2 size (30 × 9 heads, n = 128): the pattern,
eigenvalue and norm features, the induction mass and the depth persistence with suffix products
formed once per chunk, against the persistence recomputed per head (its product of the layers
above multiplied out), on one chunk. BLAS runs on one thread, as in the stage's workers."""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

from depthlens.contest import cv  # noqa: E402
from depthlens.contest.features import persistence  # noqa: E402
from depthlens.stages.contest import CONTEST_TARGETS, METRIC, SEED_TAG, chunk_features  # noqa: E402
from depthlens.linalg.causal import random_causal_attention  # noqa: E402

L, H, N = 30, 9, 128
FOLDS, N_BOOT, N_PERM, CHUNKS = 5, 1000, 1000, 8
SAMPLE_PERM, SAMPLE_BOOT = 10, 50
GROUPS = np.repeat(np.arange(L), H)


def heads_table(rng: np.random.Generator) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Features with a layer effect, a few NaNs, and the three targets."""
    cols = [c for fam in cv.FEATURE_FAMILIES.values() for c in fam]
    X = rng.normal(size=(L * H, len(cols))) + 0.7 * rng.normal(size=(L, len(cols)))[GROUPS]
    X[rng.random(X.shape) < 0.01] = np.nan
    table = pd.DataFrame(X, columns=cols)
    z = table.fillna(0)
    targets = {
        "persistence": z[list(cv.FEATURE_FAMILIES["S"])].sum(axis=1).to_numpy() + rng.normal(size=L * H),
        "routing": (z[list(cv.FEATURE_FAMILIES["R"][:3])].sum(axis=1) + rng.normal(size=L * H) > 2.0).astype(float).to_numpy(),
        "criticality": np.exp(0.5 * z["sink_mass"].to_numpy() + 0.5 * rng.normal(size=L * H)),
    }
    return table, targets


def vectorised(table: pd.DataFrame, targets: dict[str, np.ndarray]) -> tuple[float, pd.DataFrame]:
    start = time.perf_counter()
    X, families, _ = cv.clean_features(table)
    parts = []
    for target in CONTEST_TARGETS:
        rows = cv.contest_target(X, families, targets[target], GROUPS, METRIC[target], folds=FOLDS, n_boot=N_BOOT,
                                 n_perm=N_PERM, seed=0, tag=(SEED_TAG, CONTEST_TARGETS.index(target)))
        rows.insert(0, "target", target)
        parts.append(rows)
    out = cv.with_qvalues(pd.concat(parts, ignore_index=True))
    return time.perf_counter() - start, out


def _score(metric: str, y: np.ndarray, pred: np.ndarray) -> float:
    return roc_auc_score(y, pred) if metric == "auroc" else spearmanr(pred, y).statistic


def _naive_cv(X: np.ndarray, y: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Out-of-fold predictions with a fresh :func:`cv.make_model` pipeline fitted per fold."""
    pred = np.empty(y.size)
    for k in range(int(fold.max()) + 1):
        test = fold == k
        pred[test] = cv.make_model().fit(X[~test], y[~test]).predict(X[test])
    return pred


def naive(table: pd.DataFrame, targets: dict[str, np.ndarray]) -> tuple[float, float, float, float]:
    """Seconds of the naive permutations and bootstrap (the observed fit of every set measured,
    the permutations and resamples extrapolated from samples), the seconds the samples took, and
    the largest |naive − fast| score over the samples."""
    X, families, _ = cv.clean_features(table)
    sets = cv.feature_sets(families)
    Xall = X[list(sets["all"])].to_numpy(dtype=np.float64)
    fold = cv.grouped_folds(GROUPS, FOLDS)
    sizes = np.bincount(GROUPS)
    perm_s = boot_s = measured = err = 0.0
    for target in CONTEST_TARGETS:
        y, metric = targets[target], METRIC[target]
        # the contest's own streams (cv.contest_target), first samples of each
        streams = [np.random.default_rng(np.random.SeedSequence([0, SEED_TAG, CONTEST_TARGETS.index(target), s]))
                   for s in range(3)]
        label_perm = cv.within_group_permutations(GROUPS, N_PERM, streams[0])[:SAMPLE_PERM]
        counts = cv.layer_bootstrap_counts(L, N_BOOT, streams[1])[:SAMPLE_BOOT]
        feature_perm = cv.within_group_permutations(GROUPS, N_PERM, streams[2])[:SAMPLE_PERM]
        for name, cols in sets.items():
            Xs = X[list(cols)].to_numpy(dtype=np.float64)
            labelled = name in families or name == "all"
            where = [] if labelled else [sets["all"].index(c) for c in families[name.removeprefix("all-")]]
            start = time.perf_counter()
            _score(metric, y, _naive_cv(Xs, y, fold))  # the observed fit
            observed = time.perf_counter()
            naive_perm = np.empty(SAMPLE_PERM)
            for k in range(SAMPLE_PERM):
                if labelled:  # labels permuted within layers, the set refitted
                    yk = y[label_perm[k]]
                    naive_perm[k] = _score(metric, yk, _naive_cv(Xs, yk, fold))
                else:  # X's columns permuted within layers, ``all`` refitted
                    Xp = Xall.copy()
                    Xp[:, where] = Xall[feature_perm[k]][:, where]
                    naive_perm[k] = _score(metric, y, _naive_cv(Xp, y, fold))
            mid = time.perf_counter()
            naive_boot = np.empty(SAMPLE_BOOT)
            for b in range(SAMPLE_BOOT):  # the expanded resample, its grouped CV refitted
                idx = np.repeat(np.arange(y.size), counts[b][GROUPS].astype(int))
                ye = y[idx]
                naive_boot[b] = _score(metric, ye, _naive_cv(Xs[idx], ye, cv.grouped_folds(GROUPS[idx], FOLDS)))
            end = time.perf_counter()
            perm_s += (observed - start) + (mid - observed) * N_PERM / SAMPLE_PERM
            boot_s += (end - mid) * N_BOOT / SAMPLE_BOOT
            measured += end - start
            # the same samples the fast way
            if labelled:
                Y = y[label_perm].T
                fast_perm = cv.score_columns(cv.oof_predictions(Xs, Y, fold)[0], Y, metric)
            else:
                pred = cv.oof_predictions(Xall, y, fold, permute=(feature_perm, where))[:, :, 0]
                fast_perm = cv.score_columns(pred.T, np.broadcast_to(y[:, None], pred.T.shape), metric)
            weights = counts[:, GROUPS]
            boot_fold = cv.assign_folds(counts * sizes, FOLDS)[:, GROUPS]
            fast_boot = cv.bootstrap_scores(cv.oof_predictions(Xs, y, boot_fold, weights)[:, :, 0], y, weights, metric)
            err = max(err, float(np.max(np.abs(naive_perm - fast_perm))), float(np.max(np.abs(naive_boot - fast_boot))))
    return perm_s, boot_s, measured, err


def naive_persistence(A: np.ndarray) -> np.ndarray:
    """Persistence with every head's product of the layers above multiplied out anew."""
    B = A.copy()
    B[..., 0] -= 1.0
    Bbar = B.mean(axis=1)
    out = np.empty(A.shape[:2])
    for layer in range(A.shape[0]):
        for head in range(A.shape[1]):
            num, den = B[layer, head], Bbar[layer]
            for k in range(layer + 1, A.shape[0]):
                num, den = Bbar[k] @ num, Bbar[k] @ den
            out[layer, head] = np.log(np.linalg.norm(num, 2)) - np.log(np.linalg.norm(den, 2))
    return out


def features_per_chunk() -> None:
    rng = np.random.default_rng(0)
    kinds = [{"sink": 4.0, "scale": 1.5}, {"prev": 4.0, "scale": 1.5}, {"sink": 3.0, "prev": 3.0, "scale": 1.5},
             {"scale": 2.0}]
    A = np.stack([np.stack([random_causal_attention(N, rng, **kinds[(l + h) % 4]) for h in range(H)])
                  for l in range(L)])
    tokens = rng.integers(0, 32, size=N)  # a small vocabulary, so tokens repeat (induction mass)
    start = time.perf_counter()
    chunk_features(A, tokens, 0)
    t_all = time.perf_counter() - start
    start = time.perf_counter()
    fast = persistence(A)
    t_fast = time.perf_counter() - start
    start = time.perf_counter()
    slow = naive_persistence(A)
    t_slow = time.perf_counter() - start
    finite = np.isfinite(slow)
    err = float(np.max(np.abs(fast[finite] - slow[finite]))) if finite.any() else float("nan")
    print(f"features per chunk ({L} x {H} heads, n = {N}): all features {t_all:.2f} s "
          f"(x {CHUNKS} contest chunks = {t_all * CHUNKS:.1f} s on one worker); persistence with suffix products "
          f"{t_fast:.2f} s vs per-head products {t_slow:.2f} s -> {t_slow / t_fast:.1f}x faster "
          f"(max |difference| {err:.1e} nats over {int(finite.sum())} heads where the plain products do not underflow)")


def main() -> None:
    table, targets = heads_table(np.random.default_rng(0))
    seconds, out = vectorised(table, targets)
    print(f"contest: {L} layers x {H} heads, {len(CONTEST_TARGETS)} targets x 9 feature sets, {FOLDS} folds, "
          f"{N_BOOT} bootstrap resamples, {N_PERM} permutations: {seconds:.1f} s (target < 120 s)")
    print(out[["target", "features", "metric", "score", "score_lo", "score_hi", "p", "q", "delta", "required"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    perm_s, boot_s, measured, err = naive(table, targets)
    total = perm_s + boot_s
    print(f"naive (measured on {SAMPLE_PERM} permutations and {SAMPLE_BOOT} resamples of every target and set, "
          f"{measured:.1f} s, extrapolated): permutations {perm_s:.0f} s + bootstrap {boot_s:.0f} s = {total:.0f} s "
          f"= {total / 60:.1f} min (max |naive - fast| score on the samples {err:.1e})")
    print(f"vectorised {seconds:.1f} s vs naive {total:.0f} s -> {total / seconds:.0f}x faster")
    features_per_chunk()


if __name__ == "__main__":
    main()
