"""Per-matrix attention features: the certified reserve records an exhausted budget in its
flag without repeating the linalg warning for every head."""

from __future__ import annotations

import warnings

import numpy as np

from depthlens.attention.features import certified_reserve
from depthlens.linalg.causal import random_causal_attention


def test_certified_reserve_flags_budget_without_warning() -> None:
    A = random_causal_attention(32, np.random.default_rng(0), sink=1.0, prev=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning (CertificationBudgetWarning included) fails
        row = certified_reserve(A, 1e-3, 1)
    assert row["kreiss_B_certified"] == 0.0 and row["kreiss_B_lo"] <= row["kreiss_B_hi"]


def test_matrix_features_certify_shares_the_search() -> None:
    """Certifying inside matrix_features gives the bracket of certified_reserve around the very
    search value and power bound the row reports, and it contains a dense brute-force K(B)."""
    from depthlens.attention.features import matrix_features
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.reference import kreiss_bruteforce

    A = random_causal_attention(14, np.random.default_rng(3), sink=1.0, prev=2.0)
    plain = matrix_features(A, extras=False)
    row = matrix_features(A, extras=False, certify=(1e-3, 10_000))
    shared = [k for k in plain if k != "kreiss_B_upper"]  # the bound is computed with certify or extras only
    assert {k: row[k] for k in shared} == {k: plain[k] for k in shared}  # same search
    assert row["kreiss_B_upper"] == matrix_features(A, extras=True)["kreiss_B_upper"]  # same power bound
    bracket = certified_reserve(A, 1e-3, 10_000)
    assert {k: row[k] for k in bracket} == bracket
    assert row["kreiss_B_certified"] == 1.0 and row["kreiss_B_hi"] <= row["kreiss_B_upper"]
    assert row["kreiss_B_lo"] * (1 - 1e-3) <= row["kreiss_B"] <= row["kreiss_B_hi"]
    ref, _ = kreiss_bruteforce(deflate(A), n_t=30, n_theta=36)
    assert row["kreiss_B_lo"] <= ref * (1 + 1e-9) and ref <= row["kreiss_B_hi"]


def test_certified_reserve_brackets_bruteforce_on_self_and_uniform_heads() -> None:
    """The real-axis branch and bound behind certified_reserve (deflated causal stochastic
    matrices are sign-similar to nonnegative ones) brackets the brute-force supremum over the
    whole exterior |z| > 1, also for a self-attending head (ρ(B) near 1) and a uniform one (K
    near 1, a far radius well beyond ‖B‖)."""
    from depthlens.linalg.reference import kreiss_bruteforce

    n = 12
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((n, n)) + 6.0 * np.eye(n)
    A_self = np.tril(np.exp(logits))
    A_self /= A_self.sum(1, keepdims=True)
    A_unif = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    for A in (A_self, A_unif):
        row = certified_reserve(A, 1e-3, 10_000)
        B = A.copy()
        B[:, 0] -= 1.0
        ref, _ = kreiss_bruteforce(B, n_t=30, n_theta=36)
        assert row["kreiss_B_certified"] == 1.0
        assert row["kreiss_B_lo"] <= ref * (1 + 1e-9) and ref <= row["kreiss_B_hi"]
        assert row["kreiss_B_hi"] <= row["kreiss_B_lo"] * (1 + 1e-3) * (1 + 1e-12)


def test_matrix_features_bound_only_with_extras_and_the_peak_without_it() -> None:
    """Without ``extras`` the power-norm bound is not computed (``kreiss_B_upper`` NaN), and
    every other value is bit for bit the one with it: the transient peak then scans its own
    powers instead of the bound's. The peak matches the largest dense 2-norm of the powers,
    also for a head whose ρ(B) is within 1e-6 of 1 (no certificate within the scan)."""
    from depthlens.attention.features import EPSILONS, matrix_features
    from depthlens.linalg.causal import deflate

    rng = np.random.default_rng(11)
    slow = np.tril(np.full((24, 24), 1e-6 / 23)) + np.eye(24) * (1 - 1e-6)
    slow[np.arange(1, 24), 0] += 1e-6 / 23
    slow[0, 0] = 1.0
    slow /= slow.sum(1, keepdims=True)
    mats = [random_causal_attention(n, rng, sink=s, prev=p) for n, s, p in
            ((12, 1.0, 2.0), (40, 3.0, 0.5), (64, 0.2, 4.0))] + [slow]
    extra_only = {f"psr_B@{e:g}" for e in EPSILONS} | {f"TR4@{e:g}" for e in EPSILONS} | {
        "num_abscissa_B", "num_radius_B", "kreiss_B_upper"}
    for A in mats:
        plain, full = matrix_features(A, extras=False), matrix_features(A, extras=True)
        assert np.isnan(plain["kreiss_B_upper"]) and full["kreiss_B_upper"] >= full["kreiss_B"]
        assert {k: v for k, v in plain.items() if k not in extra_only} == {
            k: v for k, v in full.items() if k not in extra_only}
        B = deflate(A)
        k = int(plain["peak_k"])
        dense = [np.linalg.norm(np.linalg.matrix_power(B, j), 2) for j in range(1, k + 200)]
        assert abs(plain["peak_B"] - max(dense)) <= 1e-12 * max(dense)
        assert abs(dense[k - 1] - plain["peak_B"]) <= 1e-12 * plain["peak_B"]
