"""Power norms, the transient peak, and the Kreiss–Spijker inequalities."""

from __future__ import annotations

import math

import numpy as np
import pytest

from depthlens.errors import InputError
from depthlens.linalg import kreiss, peak_transient, power_norms, spijker_check

from ._make import causal_softmax


def prev_token(n: int) -> np.ndarray:
    A = np.zeros((n, n))
    A[0, 0] = 1.0
    A[np.arange(1, n), np.arange(n - 1)] = 1.0
    return A


@pytest.mark.parametrize("n", [5, 16, 40])
def test_previous_token_deflated_norms(n: int) -> None:
    B = prev_token(n)
    B[:, 0] -= 1.0
    a = power_norms(B, n + 2)
    k = np.arange(1, n - 1)
    np.testing.assert_allclose(a[k], np.sqrt(n - k), rtol=1e-13)
    assert a[0] == 1.0 and np.all(a[n - 1 :] == 0.0)
    tr = peak_transient(B)
    assert tr.certificate == "nilpotent" and tr.argmax == 1 and tr.kmax == n - 1
    assert tr.peak == pytest.approx(math.sqrt(n - 1), rel=1e-13)


def test_power_norms_match_dense(rng: np.random.Generator) -> None:
    M = rng.standard_normal((12, 12)) / 4
    a = power_norms(M, 6)
    ref = [np.linalg.norm(np.linalg.matrix_power(M, k), 2) for k in range(7)]
    np.testing.assert_allclose(a, ref, rtol=1e-12)


def test_contraction_certificate(rng: np.random.Generator) -> None:
    A = causal_softmax(24, rng, sink=1.0)
    B = A.copy()
    B[:, 0] -= 1.0
    tr = peak_transient(B)
    assert tr.certified and tr.certificate == "contraction"
    longer = power_norms(B, 4 * tr.kmax)
    assert longer[1:].max() <= tr.peak * (1 + 1e-12)
    assert tr.norms[tr.kmax] < 1.0


def test_rho_above_one_and_explicit_kmax() -> None:
    assert math.isinf(peak_transient(np.diag([1.5, 0.2])).peak)
    tr = peak_transient(np.eye(3), kmax=5)
    assert not tr.certified and tr.peak == pytest.approx(1.0) and tr.norms.size == 6


@pytest.mark.parametrize("seed", range(4))
def test_spijker_holds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 10
    M = rng.standard_normal((n, n))
    M *= 0.9 / np.max(np.abs(np.linalg.eigvals(M)))
    K = kreiss(M, upper=False).value
    chk = spijker_check(K, M)
    assert chk.holds and chk.certified
    assert K <= chk.sup_power * (1 + 1e-10) <= math.e * n * K * (1 + 1e-10)


def test_bad_input() -> None:
    with pytest.raises(InputError):
        power_norms(np.ones((2, 3)), 2)
    with pytest.raises(InputError):
        power_norms(np.eye(2), -1)
    with pytest.raises(InputError):
        peak_transient(np.array([[np.inf]]))
    with pytest.raises(InputError):
        spijker_check(-1.0, np.eye(2))


def test_iter_power_norms_exact_first(rng: np.random.Generator) -> None:
    """Powers ``k ≤ exact_first`` are exact without consulting ``exact_if`` (the same numbers as
    :func:`power_norms`); later ones follow ``exact_if`` and bound the dense norm from above."""
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.transients import iter_power_norms

    B = deflate(causal_softmax(16, rng, sink=1.0, prev=3.0))
    asked: list[int] = []

    def exact_if(k: int, bound: float) -> bool:
        asked.append(k)
        return k % 2 == 0

    it = iter_power_norms(B, exact_if, 4)
    got = np.array([next(it) for _ in range(8)])
    assert asked == [5, 6, 7, 8]
    np.testing.assert_array_equal(got[:4], power_norms(B, 4)[1:])
    np.testing.assert_array_equal(got[[5, 7]], power_norms(B, 8)[[6, 8]])
    dense = np.array([np.linalg.norm(np.linalg.matrix_power(B, k), 2) for k in range(1, 9)])
    np.testing.assert_allclose(got[:4], dense[:4], rtol=1e-12)
    assert np.all(got >= dense * (1 - 1e-12))
    assert got[4] > dense[4] * (1 + 1e-9)  # a cheap bound, not the exact norm


def test_power_norms_at_equals_power_norms_at_the_sampled_powers(rng: np.random.Generator) -> None:
    """The sampled norms are exactly those of :func:`power_norms` (the same products, the same
    eigensolves); the powers in between are formed but not normed."""
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.transients import power_norms_at

    B = deflate(causal_softmax(24, rng, sink=1.0, prev=3.0))
    ks = np.array([0, 1, 2, 5, 9, 30])
    np.testing.assert_array_equal(power_norms_at(B, ks), power_norms(B, 30)[ks])
    assert power_norms_at(B, [3]).shape == (1,)
    P = prev_token(6)
    P[:, 0] -= 1.0  # nilpotent: exact zeros from k = n - 1 on
    np.testing.assert_allclose(power_norms_at(P, [0, 4, 5, 8]), [1.0, math.sqrt(2.0), 0.0, 0.0], rtol=1e-13, atol=0)
    for bad in ([2, 1], [1, 1], [-1, 2], [], [[1, 2]], [1.0, 2.0]):
        with pytest.raises(InputError, match="strictly increasing"):
            power_norms_at(B, bad)


def _svd_norm(X: np.ndarray) -> float:
    return float(np.linalg.svd(X, compute_uv=False)[0])


def test_spectral_norm_certified_path_matches_the_dense_svd(rng: np.random.Generator) -> None:
    """Deflated attention powers and other matrices with a dominant singular value take the
    power iteration (its Kato–Temple certificate closes) and agree with LAPACK's SVD."""
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.transients import _certified_top_eigenvalue, spectral_norm

    cases = []
    for sink in (0.0, 1.0, 3.0):
        B = deflate(causal_softmax(64, rng, sink=sink))
        X = B.copy()
        for _ in range(8):
            cases.append(X.copy())
            X = B @ X
    u, v = rng.standard_normal(30) + 1j * rng.standard_normal(30), rng.standard_normal(30)
    cases.append(np.outer(u, v) + 0.05 * (rng.standard_normal((30, 30)) + 1j * rng.standard_normal((30, 30))))
    cases.append(np.array([[-3.0]]))
    for X in cases:
        Y = X / np.max(np.abs(X))
        if np.linalg.norm(Y, 2) ** 2 > 0.6 * np.linalg.norm(Y) ** 2:
            assert _certified_top_eigenvalue(Y) is not None
        ref = _svd_norm(X)
        assert spectral_norm(X) == pytest.approx(ref, rel=4 * X.shape[0] * np.finfo(float).eps)


def test_spectral_norm_falls_back_without_a_dominant_singular_value(rng: np.random.Generator) -> None:
    """No dominant singular value (σ₁² ≤ ‖X‖_F²/2): no certificate, the eigensolve answers."""
    from depthlens.linalg.transients import _certified_top_eigenvalue, spectral_norm

    Q, _ = np.linalg.qr(rng.standard_normal((40, 40)))
    for X in (Q, 3.0 * np.eye(7), rng.standard_normal((50, 50)), np.diag([2.0, 2.0, 1.0])):
        assert _certified_top_eigenvalue(X / np.max(np.abs(X))) is None
        assert spectral_norm(X) == pytest.approx(_svd_norm(X), rel=1e-14)
    assert spectral_norm(np.zeros((4, 4))) == 0.0


def test_spectral_norm_certificate_is_an_upper_bound_at_every_step(rng: np.random.Generator) -> None:
    """The Kato–Temple end θ + ‖r‖²/(θ − α) bounds λ₁ from above at every iterate, not only
    the last: checked on unit vectors near and far from the top singular vector."""
    X = np.outer(rng.random(25), rng.random(25)) + 0.1 * rng.standard_normal((25, 25))
    G = X.T @ X
    lam = np.linalg.eigvalsh(G)[-1]
    trace = np.trace(G)
    top = np.linalg.svd(X)[2][0]
    for t in np.linspace(0.0, 1.0, 11):
        x = t * top + (1.0 - t) * rng.standard_normal(25)
        x /= np.linalg.norm(x)
        theta = x @ G @ x
        r2 = np.sum((G @ x - theta * x) ** 2)
        if 2 * theta > trace:
            assert theta <= lam * (1 + 1e-14) and lam <= (theta + r2 / (2 * theta - trace)) * (1 + 1e-14)
