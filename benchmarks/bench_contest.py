"""The feature-family contest (METHODS A7) at SmolLM2 size: a synthetic heads table of 30 layers
× 9 heads with the real families (P 4, E 4, S 4, R 8 features) and 3 targets (persistence,
routing, criticality), 5 grouped folds, 1000 layer-cluster bootstrap resamples and 1000
within-layer permutations for every feature set (9 per target). Prints the total seconds
(target < 2 min on 2 cores) against the naive method measured in the same run (a fresh
pipeline per permutation and fold, a score recomputed from the expanded sample per resample),
timed on a sample of permutations and resamples of every (target, feature set) and
extrapolated.

Then the stage's own features per chunk at SmolLM2 size (30 × 9 heads, n = 128): the pattern,
eigenvalue and norm features and the depth persistence with suffix products formed once per
chunk, against the persistence recomputed per head (its product of the layers above multiplied
out), on one chunk. BLAS runs on one thread, as in the stage's workers."""

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
from depthlens.contest.stage import CONTEST_TARGETS, METRIC, SEED_TAG, chunk_features  # noqa: E402
from depthlens.linalg.causal import random_causal_attention  # noqa: E402

L, H, N = 30, 9, 128
FOLDS, N_BOOT, N_PERM, CHUNKS = 5, 1000, 1000, 8
SAMPLE_PERM, SAMPLE_BOOT = 10, 50
GROUPS = np.repeat(np.arange(L), H)


def heads_table(rng: np.random.Generator) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Features with a layer effect, a few NaNs, and the three targets."""
    cols = [c for fam in cv.FAMILIES.values() for c in fam]
    X = rng.normal(size=(L * H, len(cols))) + 0.7 * rng.normal(size=(L, len(cols)))[GROUPS]
    X[rng.random(X.shape) < 0.01] = np.nan
    table = pd.DataFrame(X, columns=cols)
    z = table.fillna(0)
    targets = {
        "persistence": z[list(cv.FAMILIES["S"])].sum(axis=1).to_numpy() + rng.normal(size=L * H),
        "routing": (z[list(cv.FAMILIES["R"][:3])].sum(axis=1) + rng.normal(size=L * H) > 2.0).astype(float).to_numpy(),
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


def naive(table: pd.DataFrame, targets: dict[str, np.ndarray]) -> tuple[float, float, float]:
    """Seconds of the naive permutations and bootstrap, extrapolated from samples, and the
    seconds the samples took."""
    X, families, _ = cv.clean_features(table)
    folds = cv.grouped_folds(GROUPS, FOLDS)
    perm_s = boot_s = measured = 0.0
    for target in CONTEST_TARGETS:
        y, metric = targets[target], METRIC[target]
        rng = np.random.default_rng(1)
        perms = cv.within_group_permutations(GROUPS, SAMPLE_PERM, rng)
        weights = cv.layer_bootstrap_weights(GROUPS, SAMPLE_BOOT, rng).astype(int)
        for cols in cv.feature_sets(families).values():
            Xs = X[list(cols)].to_numpy()
            start = time.perf_counter()
            for k in range(SAMPLE_PERM):
                yk = y[perms[k]]
                pred = np.empty(y.size)
                for train, test in folds:
                    pred[test] = cv.make_model().fit(Xs[train], yk[train]).predict(Xs[test])
                _score(metric, yk, pred)
            mid = time.perf_counter()
            pred = cv.oof_predictions(Xs, y, folds)
            for b in range(SAMPLE_BOOT):
                idx = np.repeat(np.arange(y.size), weights[b])
                _score(metric, y[idx], pred[idx])
            end = time.perf_counter()
            perm_s += (mid - start) * (N_PERM + 1) / SAMPLE_PERM  # + the observed fit
            boot_s += (end - mid) * N_BOOT / SAMPLE_BOOT
            measured += end - start
    return perm_s, boot_s, measured


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
    start = time.perf_counter()
    chunk_features(A, 0)
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
    perm_s, boot_s, measured = naive(table, targets)
    total = perm_s + boot_s
    print(f"naive (measured on {SAMPLE_PERM} permutations and {SAMPLE_BOOT} resamples of every target and set, "
          f"{measured:.1f} s, extrapolated): permutations {perm_s:.0f} s + bootstrap {boot_s:.0f} s = {total:.0f} s "
          f"= {total / 60:.1f} min")
    print(f"vectorised {seconds:.1f} s vs naive {total:.0f} s -> {total / seconds:.0f}x faster")
    features_per_chunk()


if __name__ == "__main__":
    main()
