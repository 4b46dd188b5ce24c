"""Kreiss constants: value, power-norm upper bound, certified bracket, special cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.errors import InputError
from depthlens.linalg import kreiss, power_upper_bound
from depthlens.linalg.reference import kreiss_bruteforce

from ._make import causal_softmax


def deflate(A: np.ndarray) -> np.ndarray:
    B = A.copy()
    B[:, 0] -= 1.0
    return B


def f_dense(M: np.ndarray, z: complex) -> float:
    return (abs(z) - 1.0) / np.linalg.svd(z * np.eye(M.shape[0]) - M, compute_uv=False)[-1]


@pytest.mark.parametrize("n", [8, 32, 64])
def test_causal_stochastic_is_sqrt_n(n: int, rng: np.random.Generator) -> None:
    A = causal_softmax(n, rng, sink=1.0, prev=1.0)
    r = kreiss(A, certify=True)
    assert r.value <= math.sqrt(n) * (1 + 1e-12)
    assert r.value == pytest.approx(math.sqrt(n), rel=1e-6)
    assert r.circle_limit == pytest.approx(math.sqrt(n), rel=1e-12)
    assert r.upper >= math.sqrt(n) * (1 - 1e-14)
    assert r.certified and r.lo <= math.sqrt(n) <= r.hi and r.hi / r.lo - 1 <= 1e-3


def test_identity() -> None:
    r = kreiss(np.eye(4), certify=True)
    assert r.value == pytest.approx(1.0, rel=1e-12)
    assert r.certified and r.lo <= 1.0 + 1e-12 and 1.0 <= r.hi <= 1.0 + 1e-3
    assert r.upper >= 1.0


def test_infinite_cases() -> None:
    assert math.isinf(kreiss(np.diag([1.2, 0.1])).value)
    jordan = np.array([[1.0, 0.0], [1.0, 1.0]])
    r = kreiss(jordan, certify=True)
    assert math.isinf(r.value) and math.isinf(r.hi) and "defective" in r.method


@pytest.mark.parametrize("lam", [0.0, 0.5, -0.3 + 0.4j])
def test_jordan_block_against_bruteforce(lam: complex) -> None:
    n = 4
    J = lam * np.eye(n) + np.diag(np.ones(n - 1), -1)
    r = kreiss(J, certify=True)
    ref, _ = kreiss_bruteforce(J, n_t=30, n_theta=36)
    assert r.value == pytest.approx(ref, rel=1e-6)
    assert r.value >= ref * (1 - 1e-9)
    assert r.lo <= ref * (1 + 1e-9) and ref <= r.hi and r.certified
    assert r.upper >= ref * (1 - 1e-9)
    assert f_dense(J, r.argmax) == pytest.approx(r.value, rel=1e-10)


@pytest.mark.parametrize("seed", range(3))
def test_two_by_two_against_bruteforce(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lam = rng.uniform(-0.9, 0.9, 2) + 1j * rng.uniform(-0.3, 0.3, 2) * (seed % 2)
    M = np.array([[lam[0], 0.0], [rng.uniform(1.0, 3.0), lam[1]]])
    r = kreiss(M, certify=True)
    ref, _ = kreiss_bruteforce(M, n_t=30, n_theta=36)
    assert r.value == pytest.approx(ref, rel=1e-6)
    assert r.certified and r.lo <= ref * (1 + 1e-9) and ref <= r.hi * (1 + 1e-12)


def test_deflated_head_against_bruteforce(rng: np.random.Generator) -> None:
    B = deflate(causal_softmax(12, rng, sink=2.0, prev=2.0))
    r = kreiss(B, certify=True, rtol=1e-3)
    ref, _ = kreiss_bruteforce(B, n_t=30, n_theta=36)
    assert r.value == pytest.approx(ref, rel=1e-6)
    assert r.certified and r.lo <= ref * (1 + 1e-9) <= r.hi * (1 + 1e-9)
    assert r.upper >= r.hi * (1 - 1e-12) or r.hi == r.upper


def test_engines_agree(rng: np.random.Generator) -> None:
    B = deflate(causal_softmax(10, rng, sink=1.0))
    a = kreiss(B, upper=False, engine="numba")
    b = kreiss(B, upper=False, engine="numpy")
    assert a.value == pytest.approx(b.value, rel=1e-10)


@settings(max_examples=12, deadline=None)
@given(
    n=st.integers(2, 5),
    seed=st.integers(0, 2**32 - 1),
    rho=st.floats(0.05, 0.95),
)
def test_upper_bound_never_below_bruteforce(n: int, seed: int, rho: float) -> None:
    rng = np.random.default_rng(seed)
    M = rng.standard_normal((n, n)) * rng.exponential(1.0, (n, n))
    M *= rho / max(np.max(np.abs(np.linalg.eigvals(M))), 1e-300)
    ub = power_upper_bound(M).value
    ref, _ = kreiss_bruteforce(M, n_t=16, n_theta=16, polish=False)
    assert ub >= ref * (1 - 1e-12)
    r = kreiss(M, upper=False)
    assert r.value >= ref * (1 - 1e-6)


def test_bad_input() -> None:
    with pytest.raises(InputError):
        kreiss(np.ones((2, 3)))
    with pytest.raises(InputError):
        kreiss(np.array([[np.nan]]))
    with pytest.raises(InputError):
        kreiss(np.eye(2), rtol=0.0)


def test_contraction_has_kreiss_one_exactly(rng: np.random.Generator) -> None:
    """‖M‖ < 1 gives K = 1 (supremum at infinity): the bracket is [1, 1] and brute force agrees."""
    from depthlens.linalg.reference import kreiss_bruteforce

    M = np.tril(rng.normal(size=(12, 12)))
    M *= 0.9 / np.linalg.norm(M, 2)
    res = kreiss(M, certify=True)
    assert res.certified and res.lo == res.hi == res.upper == 1.0
    assert 1.0 - 1e-5 < res.value <= 1.0
    brute, _ = kreiss_bruteforce(M, n_t=20, n_theta=20)
    assert brute <= 1.0 + 1e-12 and brute > 0.99


def test_horner_kernel_matches_numpy_polyval(rng: np.random.Generator) -> None:
    """The compiled series evaluator of the power bound against numpy's polyval."""
    from depthlens.linalg._kernels import horner

    coef = rng.uniform(0.0, 5.0, size=300)
    x = rng.uniform(0.0, 1.0, size=50)
    np.testing.assert_allclose(horner(coef, x), np.polyval(coef[::-1], x), rtol=1e-12)
    assert horner(coef[:1], x).tolist() == [coef[0]] * 50


def test_certification_budget_exhausted_warns(rng: np.random.Generator) -> None:
    """A branch and bound stopped by max_evals says so in a warning as well as in the result."""
    from depthlens.linalg import CertificationBudgetWarning

    B = deflate(causal_softmax(32, rng, sink=1.0, prev=1.0))
    with pytest.warns(CertificationBudgetWarning, match=r"max_evals=1\b.*not certified") as record:
        r = kreiss(B, certify=True, max_evals=1)
    assert len(record) == 1 and issubclass(CertificationBudgetWarning, RuntimeWarning)
    assert not r.certified and r.branch_bound.stopped == "max_evals"
    assert r.lo <= r.value * (1 + 1e-12) and r.lo <= r.hi  # still a valid (wider) bracket
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", CertificationBudgetWarning)  # within budget: no warning
        full = kreiss(B, certify=True)
        kreiss(B)  # no certification asked: never warns
    assert full.certified and full.branch_bound.stopped == "rtol"
