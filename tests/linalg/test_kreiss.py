"""Kreiss constants: value, power-norm upper bound, certified bracket, special cases."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.errors import InputError
from depthlens.linalg import kreiss, power_upper_bound
from depthlens.linalg.reference import kreiss_bruteforce, whole_grid_sup

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


def _exact_powers(M: np.ndarray, kmax: int) -> list[list[list[Fraction]]]:
    """``M^1 … M^kmax`` in exact rational arithmetic (the float entries are dyadic rationals)."""
    F = [[Fraction(float(x)) for x in row] for row in M]
    n = len(F)
    out = [F]
    for _ in range(kmax - 1):
        P = out[-1]
        out.append([[sum(F[i][l] * P[l][j] for l in range(n)) for j in range(n)] for i in range(n)])
    return out


def test_power_allowance_covers_rounding_of_nonnormal_powers() -> None:
    """M = [[λ, 0], [c, −λ]] has M² = λ²I exactly, but every even power is formed by cancelling
    products of size c·λ^k: the computed powers are off by about u·c·λ^k, billions of times the
    old relative allowance 4(k0+1)·n·u·‖X_k‖. The allowance γ·‖|M|^k‖ covers the true error
    (against exact rational powers) and the bound stays above the closed-form K."""
    lam, c = 0.9, 1.8 * 2.0**40
    M = np.array([[lam, 0.0], [c, -lam]])
    pb = power_upper_bound(M)
    k0 = pb.k_exact
    exact = _exact_powers(M, k0)
    u = np.finfo(np.float64).eps
    X = M.copy()
    ratio_to_old = []
    for k in range(1, k0 + 1):
        E = exact[k - 1]
        err = np.array([[float(Fraction(float(X[i, j])) - E[i][j]) for j in range(2)] for i in range(2)])
        true_norm = np.linalg.norm(np.array([[float(x) for x in row] for row in E]), 2)
        err_norm = np.linalg.norm(err, 2)
        assert err_norm <= pb.allowance[k], k
        assert true_norm <= pb.norms[k] + pb.allowance[k], k
        ratio_to_old.append(err_norm / (4.0 * (k0 + 1) * 2 * u * pb.norms[k]))
        X = M @ X
    assert max(ratio_to_old) > 1e6  # the old allowance was far too small
    # closed form: (zI − M)⁻¹ = (zI + M)/(z² − λ²); a dense grid of it is a lower bound on K
    r = 1.0 + np.geomspace(1e-3, 10.0, 400)[:, None]
    z = r * np.exp(1j * np.linspace(0.0, np.pi, 91))[None]
    Z = z[..., None, None] * np.eye(2) + M
    ref = float(((np.abs(z) - 1.0) * np.linalg.norm(Z, 2, axis=(-2, -1)) / np.abs(z**2 - lam**2)).max())
    assert ref <= pb.value <= 1.01 * ref


def test_infinite_verdicts_certified_only_when_exact() -> None:
    """A defective unit-circle eigenvalue (a numerical rank decision) and an outside eigenvalue of
    a computed Schur form are not certified; an outside diagonal entry of a triangular M is."""
    jordan = kreiss(np.array([[1.0, 0.0], [1.0, 1.0]]), certify=True)
    assert math.isinf(jordan.value) and not jordan.certified
    assert jordan.lo == 1.0 and math.isinf(jordan.hi) and "rank" in jordan.uncertified_reason
    tri = kreiss(np.array([[1.2, 0.0], [0.3, 0.1]]), certify=True)
    assert tri.certified and tri.lo == tri.hi == math.inf and tri.uncertified_reason is None
    schur = kreiss(np.array([[1.2, 0.3], [0.2, 0.1]]), certify=True)
    assert not schur.certified and "Schur" in schur.uncertified_reason and schur.lo == 1.0
    assert kreiss(np.array([[1.0, 0.0], [1.0, 1.0]])).uncertified_reason is None  # not asked


@pytest.mark.parametrize("kind", [{"sink": 2.0}, {"prev": 3.0}, {"sink": 1.0, "prev": 1.0}, {"scale": 2.0}])
def test_bracket_contains_bruteforce_for_causal_stochastic(kind: dict, rng: np.random.Generator) -> None:
    """lo ≤ K ≤ hi for deflated causal stochastic matrices against dense SVDs on a fine grid."""
    B = deflate(causal_softmax(12, rng, **kind))
    r = kreiss(B, certify=True)
    ref, _ = kreiss_bruteforce(B, n_t=40, n_theta=48)
    assert r.certified and r.uncertified_reason is None
    assert r.lo <= ref * (1 + 1e-9) and ref <= r.hi
    assert r.lo >= r.value * (1 - 1e-9)  # the certified lower end costs only its rounding margin
    assert r.branch_bound.domain == "real axis"  # the bracket above covered (1, R) only


def test_certified_ratio_is_a_lower_bound_for_any_vectors(rng: np.random.Generator) -> None:
    """The certified ratio rests only on an explicit residual: for arbitrary unit vectors and a
    wrong σ it still lies below (|z|−1)/σ_min by dense SVD, and at the computed singular
    triple it is within its rounding margin of the plain ratio."""
    from depthlens.linalg.kreiss_bound import spectrum_status
    from depthlens.linalg.kreiss_search import BranchBound, search
    from depthlens.linalg.sigma import triangular_form

    B = deflate(causal_softmax(16, rng, sink=1.0))
    tf = triangular_form(B)
    _, _, circle = spectrum_status(B, tf)
    bb = BranchBound(tf, search(tf, "numba", (5, 5), 1, circle), circle, "numba")
    z = np.array([1.3 + 0.2j, 1.5, -1.1 + 0.4j])
    dense = np.array([np.linalg.svd(zk * np.eye(16) - B, compute_uv=False)[-1] for zk in z])
    truth = (np.abs(z) - 1.0) / dense
    ev = tf.evaluate(z)
    cert = bb.certified_ratio(z, ev.sigma, ev.res_right)
    assert np.all(cert <= truth) and np.all(cert >= truth * (1 - 1e-10))
    for k, zk in enumerate(z):
        u = rng.standard_normal(16) + 1j * rng.standard_normal(16)
        v = rng.standard_normal(16) + 1j * rng.standard_normal(16)
        u, v = u / np.linalg.norm(u), v / np.linalg.norm(v)
        s = 0.5 * dense[k]
        res = np.linalg.norm((zk * np.eye(16) - B) @ v - s * u)
        assert bb.certified_ratio(np.array([zk]), np.array([s]), np.array([res]))[0] <= truth[k]


@pytest.mark.parametrize("complex_input", [False, True])
def test_bracket_of_dense_matrix_against_bruteforce(complex_input: bool, rng: np.random.Generator) -> None:
    """A non-triangular M (Schur form, numerical-range sectors over the whole circle when
    complex): lo ≤ K ≤ hi against dense SVDs on a fine grid."""
    M = rng.standard_normal((6, 6)) + (1j * rng.standard_normal((6, 6)) if complex_input else 0.0)
    M *= 0.8 / np.max(np.abs(np.linalg.eigvals(M)))
    r = kreiss(M, certify=True)
    ref, _ = kreiss_bruteforce(M, n_t=40, n_theta=48)
    assert r.certified and r.lo <= ref * (1 + 1e-9) and ref <= r.hi


def test_signature_nonnegative_and_axis_reduction(rng: np.random.Generator) -> None:
    """The exact sign test behind the real-axis reduction: deflated causal stochastic matrices
    pass (D = diag(−1, 1, …, 1)); a sign-inconsistent cycle, a negative diagonal, complex
    entries, ρ(M) > 1 and non-triangular input do not."""
    from depthlens.linalg.kreiss_search import axis_reduction, signature_nonnegative
    from depthlens.linalg.sigma import triangular_form

    B = deflate(causal_softmax(16, rng, sink=1.0, prev=1.0))
    assert signature_nonnegative(B) and axis_reduction(B, triangular_form(B))
    A = causal_softmax(16, rng)
    assert axis_reduction(A, triangular_form(A))  # nonnegative, ρ = 1
    cycle = np.array([[0.0, 0.0, 0.0], [0.5, 0.2, 0.0], [-0.5, 0.5, 0.1]])  # d1 = d0, d2 = d1, d2 = −d0
    assert not signature_nonnegative(cycle) and not axis_reduction(cycle, triangular_form(cycle))
    assert signature_nonnegative(np.array([[0.0, 0.0, 0.0], [0.5, 0.2, 0.0], [-0.5, -0.5, 0.1]]))
    assert not signature_nonnegative(np.diag([0.5, -0.1]))
    assert not signature_nonnegative(B.astype(np.complex128))
    big = np.array([[1.0 + 1e-15, 0.0], [-0.5, 0.5]])
    assert signature_nonnegative(big) and not axis_reduction(big, triangular_form(big))
    dense = np.array([[0.5, 0.1], [0.2, 0.3]])
    assert signature_nonnegative(dense) and not axis_reduction(dense, triangular_form(dense))


@pytest.mark.parametrize("seed", range(6))
def test_real_axis_dominates_for_signature_nonnegative(seed: int) -> None:
    """The reduction's inequality σ_min(zI−M) ≥ σ_min(|z|I−M) for |z| > 1, checked with dense
    SVDs at random points, for deflated causal stochastic and random sign-patterned matrices."""
    rng = np.random.default_rng(seed)
    n = 10
    B = deflate(causal_softmax(n, rng, sink=float(rng.uniform(0, 2)), prev=float(rng.uniform(0, 2))))
    d = rng.choice([-1.0, 1.0], n)
    T = np.tril(rng.uniform(0.0, 1.0, (n, n)), -1) + np.diag(rng.uniform(0.0, 1.0, n))
    for M in (B, d[:, None] * T * d[None, :]):
        z = (1.0 + rng.exponential(0.7, 200)) * np.exp(1j * rng.uniform(-math.pi, math.pi, 200))
        for zk in z:
            s = np.linalg.svd(zk * np.eye(n) - M, compute_uv=False)[-1]
            sr = np.linalg.svd(abs(zk) * np.eye(n) - M, compute_uv=False)[-1]
            assert s >= sr * (1 - 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_real_axis_bracket_contains_bruteforce_and_matches_exterior(seed: int) -> None:
    """On random deflated causal stochastic matrices the real-axis bracket contains the brute-force
    supremum over the whole exterior |z| > 1 (not only the axis), and it overlaps the bracket of
    the branch and bound over the exterior; a triangular matrix failing the sign test keeps the
    exterior branch and bound."""
    from depthlens.linalg.kreiss_bound import spectrum_status
    from depthlens.linalg.kreiss_search import BranchBound, search
    from depthlens.linalg.sigma import triangular_form

    rng = np.random.default_rng(100 + seed)
    B = deflate(causal_softmax(12, rng, sink=float(rng.uniform(0, 2)), prev=float(rng.uniform(0, 3)),
                               scale=float(rng.uniform(0.5, 2))))
    r = kreiss(B, certify=True)
    assert r.certified and r.branch_bound.domain == "real axis"
    ref, _ = kreiss_bruteforce(B, n_t=30, n_theta=36)
    assert r.lo <= ref * (1 + 1e-9) and ref <= r.hi
    tf = triangular_form(B)
    _, _, circle = spectrum_status(B, tf)
    ext = BranchBound(tf, search(tf, "numba", (11, 9), 3, circle), circle, "numba", axis=False)
    lo, hi, _, stopped = ext.run(1e-3, 50_000, 64)
    assert stopped == "rtol" and lo <= r.hi and r.lo <= hi
    C = B.copy()
    C[2, 1] = -C[2, 1] if C[2, 1] else -0.1  # B[2,0] < 0 and B[1,0] < 0: a negative (2,1) breaks the pattern
    e = kreiss(C, certify=True)
    assert e.branch_bound.domain == "exterior"
    ref_c, _ = kreiss_bruteforce(C, n_t=30, n_theta=36)
    assert e.certified and e.lo <= ref_c * (1 + 1e-9) and ref_c <= e.hi


def test_axis_search_matches_exterior_search_and_bruteforce() -> None:
    """On deflated causal stochastic matrices the value search on the positive real axis (grid in
    log(r−1), bounded Brent; what kreiss runs where the axis reduction holds) gives the value of
    the two-dimensional search over the exterior (grid in (log(|z|−1), arg z), L-BFGS-B) to 1e-12
    relative, never less by more than that, and the brute-force dense-SVD supremum to 1e-10, which
    the certified bracket contains."""
    from depthlens.linalg.kreiss_bound import spectrum_status
    from depthlens.linalg.kreiss_search import search
    from depthlens.linalg.sigma import triangular_form

    rng = np.random.default_rng(2024)
    for k in range(40):
        n = int(rng.integers(6, 48))
        B = deflate(causal_softmax(n, rng, sink=float(rng.uniform(0, 4)), prev=float(rng.uniform(0, 4)),
                                   scale=float(rng.uniform(0.3, 3))))
        r = kreiss(B, upper=False)
        assert r.method == "real-axis grid+Brent" and r.argmax.imag == 0.0
        tf = triangular_form(B)
        _, _, circle = spectrum_status(B, tf)
        ext = search(tf, "numba", (17, 14), 3, circle).best
        assert abs(r.value / ext - 1.0) <= 1e-12 and r.value >= ext * (1 - 1e-12), (k, r.value, ext)
        if k < 6:
            ref, _ = kreiss_bruteforce(B, n_t=30, n_theta=36)
            assert r.value == pytest.approx(ref, rel=1e-10)
            assert f_dense(B, r.argmax) == pytest.approx(r.value, rel=1e-12)
            c = kreiss(B, certify=True, upper=False)
            assert c.certified and c.lo <= ref * (1 + 1e-9) and ref <= c.hi and c.value == r.value


def test_signature_proposal_against_enumeration() -> None:
    """signature_nonnegative (compiled proposal, exact check) agrees with trying every D = diag(±1)
    on small random sign patterns, with zeros and disconnected parts."""
    import itertools

    from depthlens.linalg.kreiss_search import signature_nonnegative

    rng = np.random.default_rng(7)
    signs = [np.array(d) for d in itertools.product([-1.0, 1.0], repeat=5)]
    seen = set()
    for _ in range(300):
        M = rng.choice([-1.0, 0.0, 0.0, 1.0], size=(5, 5)) * rng.uniform(0.5, 2.0, (5, 5))
        M[np.diag_indices(5)] = np.abs(np.diagonal(M))
        truth = any(np.all((d[:, None] * M) * d[None, :] >= 0.0) for d in signs)
        assert signature_nonnegative(M) == truth
        seen.add(truth)
    assert seen == {True, False}


def test_real_cholesky_certificates_match_complex(rng: np.random.Generator) -> None:
    """On the real axis the σ₂ / σ_min certificates factorise in real arithmetic; the same points
    and vectors with a unit phase on v (vvᴴ unchanged, the complex path) certify the same bounds."""
    from depthlens.linalg.kreiss_bound import spectrum_status
    from depthlens.linalg.kreiss_search import BranchBound, search
    from depthlens.linalg.sigma import triangular_form

    B = deflate(causal_softmax(24, rng, sink=1.0, prev=2.0))
    tf = triangular_form(B)
    _, _, circle = spectrum_status(B, tf)
    z = np.array([1.05, 1.3, 1.6, 2.5, 4.0], dtype=np.complex128)
    ev = tf.evaluate(z, vectors=True)
    runs = []
    for V in (ev.VL, ev.VL * np.exp(0.3j)):
        bb = BranchBound(tf, search(tf, "numba", (5, 5), 1, circle), circle, "numba", axis=True)
        floor = np.zeros(z.size)
        bb.add_certificates(z, ev.sigma, ev.res_right + bb.margin(z), V, floor)
        runs.append(bb)
    real, cplx = runs
    assert real.za.size + real.zb.size == z.size and real.n_cholesky == cplx.n_cholesky
    np.testing.assert_array_equal(real.za, cplx.za)
    np.testing.assert_allclose(real.ga, cplx.ga, rtol=1e-14)
    np.testing.assert_allclose(real.gb, cplx.gb, rtol=1e-14)


@pytest.mark.parametrize("kind", [dict(sink=3.0, prev=2.0), dict(prev=6.0), dict(scale=3.0), "perron"])
def test_sup_bound_matches_whole_grid_scan_and_bruteforce(kind: object, rng: np.random.Generator) -> None:
    """The incremental sup over ``r`` gives the whole-grid scan's numbers bit for bit, lies within
    ``rtol_r`` above the largest sampled ``g(r)`` (an independent float64 evaluation of the
    truncated series), and the bound is above the brute-force ``K``."""
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.kreiss_bound import _norm_sequences, _sup_bound, spectrum_status
    from depthlens.linalg.sigma import triangular_form

    A = causal_softmax(10, rng, **(kind if isinstance(kind, dict) else dict(sink=1.0, prev=1.0)))
    M = A if kind == "perron" else deflate(A)  # A: the Perron root 1 on the circle (Π = ‖P‖ = √n)
    status, _, circle = spectrum_status(M, triangular_form(M))
    assert status == ("circle" if kind == "perron" else "inside")
    deflated, pi = (circle.deflated, float(circle.proj_norms.sum())) if circle is not None else (None, 0.0)
    fn = _norm_sequences(M, deflated, pi, 1e-3, 300)
    assert fn.tail == "geometric"
    best, r_best = _sup_bound(fn, 1e-4)
    assert (best, r_best) == whole_grid_sup(fn, 1e-4)
    r = 1.0 + np.logspace(-6, 4, 4001)
    k = np.arange(fn.a.size)
    sampled = np.array([(x - 1.0) * np.sum(fn.a * x ** (-k - 1.0)) + pi * x ** (-fn.k0 - 1.0) for x in r])
    assert sampled.max() <= best <= sampled.max() * (1.0 + 2e-4) + fn.tail_part(np.array([r_best]))[0]
    # K(A) = √n exactly (METHODS A2); the brute force overshoots it by its rounding next to z = 1
    ref = math.sqrt(10) if kind == "perron" else kreiss_bruteforce(M, n_t=30, n_theta=36)[0]
    assert power_upper_bound(M).value >= ref * (1 - 1e-12)
