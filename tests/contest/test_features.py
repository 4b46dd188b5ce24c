"""The contest's per-head features against brute-force float64 loops, and the depth
persistence against direct products and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

from depthlens.contest.features import DIAG_QUANTILES, head_features, induction_mass, persistence
from depthlens.errors import InputError


def _causal(rng: np.random.Generator, shape: tuple[int, ...], n: int, scale: float = 2.0) -> np.ndarray:
    """Random causal row-stochastic matrices: softmax of random scores over a causal mask."""
    scores = rng.normal(scale=scale, size=(*shape, n, n))
    scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    A = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return A / A.sum(axis=-1, keepdims=True)


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile, written out."""
    v = sorted(values)
    pos = q / 100 * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def _brute(A: np.ndarray) -> dict[str, float]:
    n = A.shape[0]
    B = A.copy()
    B[:, 0] -= 1.0
    s = np.linalg.svd(B, compute_uv=False)
    fro = math.sqrt(sum(B[i, j] ** 2 for i in range(n) for j in range(n)))
    out = {
        "mean_distance": sum(sum(A[i, j] * (i - j) for j in range(i + 1)) for i in range(n)) / n,
        "max_weight": sum(max(A[i, : i + 1]) for i in range(1, n)) / (n - 1),
        "fro_B": fro,
        "sigma2_B": s[1],
        "stable_rank_B": fro**2 / s[0] ** 2,
    }
    diag = [A[i, i] for i in range(1, n)]
    out.update({f"diag_q{q}": _percentile(diag, q) for q in DIAG_QUANTILES})
    return out


@pytest.mark.parametrize("n", [2, 3, 9])
def test_head_features_match_brute_force(rng: np.random.Generator, n: int) -> None:
    A = _causal(rng, (2, 3), n)
    got = head_features(A)
    for idx in np.ndindex(2, 3):
        for name, value in _brute(A[idx]).items():
            assert got[name][idx] == pytest.approx(value, rel=1e-12, abs=1e-14), (name, idx)


def test_head_features_closed_forms() -> None:
    n = 5
    sink = np.zeros((n, n))
    sink[:, 0] = 1.0
    prev = np.eye(n, k=-1)
    prev[0, 0] = 1.0
    f = head_features(np.stack([sink, prev]))
    assert f["mean_distance"].tolist() == [pytest.approx((0 + 1 + 2 + 3 + 4) / n), pytest.approx((n - 1) / n)]
    assert f["max_weight"].tolist() == [1.0, 1.0]
    assert f["diag_q50"].tolist() == [0.0, 0.0]
    assert f["fro_B"][0] == 0.0 and np.isnan(f["stable_rank_B"][0])  # B = 0 for the pure sink
    # previous-token head: B has n − 2 ones below the diagonal (rows ≥ 3) and −1 in the first column of those rows
    assert f["fro_B"][1] == pytest.approx(math.sqrt(2 * (n - 2)))


def _brute_induction(A: np.ndarray, tokens: list[int]) -> float:
    """Mean over queries i with an earlier occurrence j ≤ i − 3 of their token of the weight on
    the positions j + 1 after those occurrences, written out."""
    masses = []
    for i in range(len(tokens)):
        after = {j + 1 for j in range(i - 2) if tokens[j] == tokens[i]}
        if after:
            masses.append(sum(A[i, k] for k in after))
    return sum(masses) / len(masses) if masses else math.nan


def test_induction_mass_matches_brute_force(rng: np.random.Generator) -> None:
    tokens = rng.integers(0, 3, size=11)
    A = _causal(rng, (2, 3), 11)
    got = induction_mass(A, tokens)
    for idx in np.ndindex(2, 3):
        assert got[idx] == pytest.approx(_brute_induction(A[idx], tokens.tolist()), rel=1e-12)
    # no repeats far enough back: NaN (a repeated token and a token two back do not count)
    assert np.isnan(induction_mass(A, [0, 1, 1, 2, 4, 2, 5, 6, 7, 8, 9])).all()
    with pytest.raises(InputError):
        induction_mass(A, tokens[:5])


def test_head_features_refuse_non_stochastic() -> None:
    with pytest.raises(InputError):
        head_features(np.ones((4, 4)))


def _direct_persistence(A: np.ndarray) -> np.ndarray:
    """log ‖B̄_{L−1} ⋯ B̄_{l+1} B_{l,h}‖ − log ‖B̄_{L−1} ⋯ B̄_{l+1} B̄_l‖, each product multiplied out."""
    L, H, n = A.shape[:3]
    B = A.copy()
    B[..., 0] -= 1.0
    Bbar = B.mean(axis=1)
    out = np.empty((L, H))
    for l in range(L):
        prefix = np.eye(n)
        for k in range(L - 1, l, -1):
            prefix = prefix @ Bbar[k]
        den = np.linalg.norm(prefix @ Bbar[l], 2)
        for h in range(H):
            out[l, h] = math.log(np.linalg.norm(prefix @ B[l, h], 2)) - math.log(den)
    return out


@pytest.mark.parametrize("shape", [(1, 3, 6), (4, 3, 6), (5, 2, 12)])
def test_persistence_matches_direct_products(rng: np.random.Generator, shape: tuple[int, int, int]) -> None:
    L, H, n = shape
    A = _causal(rng, (L, H), n)
    np.testing.assert_allclose(persistence(A), _direct_persistence(A), rtol=0, atol=1e-10)


def test_persistence_closed_forms(rng: np.random.Generator) -> None:
    n, H = 6, 3
    A = _causal(rng, (4, H), n)
    # last layer: no layers above, S = I
    B = A[-1].copy()
    B[..., 0] -= 1.0
    top = np.log(np.linalg.norm(B, 2, axis=(-2, -1))) - np.log(np.linalg.norm(B.mean(axis=0), 2))
    np.testing.assert_allclose(persistence(A)[-1], top, atol=1e-12)
    # identical heads: each is its layer's mean
    same = A.copy()
    same[1] = same[1, 0]
    assert np.all(np.abs(persistence(same)[1]) < 1e-12)
    # an exact sink head (B = 0) beside others: nothing of it survives
    sink = np.zeros((n, n))
    sink[:, 0] = 1.0
    one = A.copy()
    one[2, 1] = sink
    got = persistence(one)
    assert got[2, 1] == -np.inf and np.all(np.isfinite(np.delete(got, 1, axis=1)))
    # a layer of exact sinks: B̄ = 0 there, so that layer and every layer below are 0/0
    allsink = A.copy()
    allsink[2] = sink
    got = persistence(allsink)
    assert np.all(np.isnan(got[:3])) and np.all(np.isfinite(got[3]))


def test_persistence_survives_underflow(rng: np.random.Generator) -> None:
    """Heads (1 − ε_h) P + ε_h C share one deviation C − P up to ε_h, so persistence is exactly
    log ε_h − log ε̄ at every depth; with ε ~ 1e-3 over 150 layers the plain products underflow
    (≈ 1e-450), the rescaled suffix products do not."""
    L, H, n = 150, 3, 5
    C = _causal(rng, (), n)
    P = np.zeros((n, n))
    P[:, 0] = 1.0
    eps = np.array([0.5e-3, 1e-3, 2e-3])
    A = np.broadcast_to((1 - eps[:, None, None]) * P + eps[:, None, None] * C, (L, H, n, n)).copy()
    expect = np.log(eps) - np.log(eps.mean())
    np.testing.assert_allclose(persistence(A), np.broadcast_to(expect, (L, H)), atol=1e-8)
    prefix = np.eye(n)
    with np.errstate(under="ignore"):
        for _ in range(L - 1):
            prefix = prefix @ (eps.mean() * (C - P))
    assert np.linalg.norm(prefix) == 0.0  # the plain product of the layers above layer 0 underflows


def test_persistence_refuses_wrong_shape(rng: np.random.Generator) -> None:
    with pytest.raises(InputError):
        persistence(_causal(rng, (3,), 4))
