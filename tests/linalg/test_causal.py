"""Perron deflation, validation and exact depth products (METHODS A2, A6)."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from depthlens.errors import InputError
from depthlens.linalg.causal import (
    chain_operator,
    check_causal_stochastic,
    deflate,
    depth_product,
    eig_gap,
    eig_predictions,
    flag_nonsimple_perron,
    mean_operator,
    perron_projector,
    rollout_operator,
)

from ._make import causal_softmax


def _P(n: int) -> np.ndarray:
    """Independent construction of 1 e_1ᵀ."""
    return np.outer(np.ones(n), np.eye(n)[0])


def _prev_token(n: int) -> np.ndarray:
    A = np.eye(n, k=-1)
    A[0, 0] = 1.0
    return A


def _heads(rng: np.random.Generator, L: int, H: int, n: int) -> np.ndarray:
    return np.array([[causal_softmax(n, rng, sink=2.0 * h, prev=h, scale=1.5) for h in range(H)] for _ in range(L)])


# --- the Perron projector -------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 32])
def test_perron_projector(n: int, rng: np.random.Generator) -> None:
    P = perron_projector(n)
    np.testing.assert_array_equal(P, _P(n))
    np.testing.assert_array_equal(P @ P, P)
    A = causal_softmax(n, rng, sink=1.0)
    np.testing.assert_allclose(A @ P, P, atol=1e-14)
    np.testing.assert_allclose(P @ A, P, atol=1e-14)
    assert np.linalg.norm(P, 2) == pytest.approx(np.sqrt(n), rel=1e-14)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_perron_projector_rejects_bad_size(n: object) -> None:
    with pytest.raises(InputError, match="positive integer"):
        perron_projector(n)  # type: ignore[arg-type]


# --- deflation --------------------------------------------------------------------------


def test_deflated_structure(rng: np.random.Generator) -> None:
    n = 9
    A = causal_softmax(n, rng, sink=1.0, prev=1.0)
    B = deflate(A)
    P = _P(n)
    np.testing.assert_allclose(P @ B, 0, atol=1e-14)
    np.testing.assert_allclose(B @ P, 0, atol=1e-14)
    assert np.all(np.triu(B, 1) == 0)
    np.testing.assert_array_equal(B[0], 0)
    np.testing.assert_array_equal(B[:, 0], A[:, 0] - 1)
    np.testing.assert_allclose(B.sum(axis=1), 0, atol=1e-14)
    for k in range(1, 5):
        np.testing.assert_allclose(
            np.linalg.matrix_power(B, k), np.linalg.matrix_power(A, k) - P, atol=1e-14
        )


def test_deflated_eigenvalues_are_self_weights(rng: np.random.Generator) -> None:
    A = causal_softmax(12, rng, scale=2.0)
    got = np.sort(np.linalg.eigvals(deflate(A)).real)
    want = np.sort(np.concatenate([[0.0], np.diag(A)[1:]]))
    np.testing.assert_allclose(got, want, atol=1e-13)


def test_resolvent_identity(rng: np.random.Generator) -> None:
    n = 8
    A = causal_softmax(n, rng, sink=0.5)
    B = deflate(A)
    I = np.eye(n)
    for z in 1.5 * rng.standard_normal(5) + 1.5j * rng.standard_normal(5):
        lhs = np.linalg.inv(z * I - B)
        rhs = np.linalg.inv(z * I - A) - _P(n) / (z * (z - 1))
        np.testing.assert_allclose(lhs, rhs, atol=1e-10)


@pytest.mark.parametrize("n", [4, 10, 33])
def test_previous_token_closed_form(n: int) -> None:
    # B^k has the n − k − 1 rows e_{i−k} − e_1, so ‖B^k‖² = λ_max(I + 11ᵀ) = n − k for
    # k ≤ n − 2, and B^{n−1} = 0 (A^{n−1} = P).
    B = deflate(_prev_token(n))
    for k in range(1, n - 1):
        assert np.linalg.norm(np.linalg.matrix_power(B, k), 2) == pytest.approx(np.sqrt(n - k), rel=1e-12)
    np.testing.assert_array_equal(np.linalg.matrix_power(B, n - 1), 0)


def test_pure_sink_deflates_to_zero() -> None:
    np.testing.assert_array_equal(deflate(_P(6)), 0)


def test_deflate_is_batched(rng: np.random.Generator) -> None:
    A = np.array([[causal_softmax(5, rng) for _ in range(3)] for _ in range(2)])
    B = deflate(A)
    assert B.shape == (2, 3, 5, 5)
    np.testing.assert_array_equal(B[1, 2], deflate(A[1, 2]))


# --- validation -------------------------------------------------------------------------


def test_check_accepts_and_returns_float64(rng: np.random.Generator) -> None:
    A = causal_softmax(6, rng).astype(np.float32)
    out = check_causal_stochastic(A, atol=1e-6)
    assert out.dtype == np.float64


def test_check_names_first_bad_row_and_batch(rng: np.random.Generator) -> None:
    A = np.array([[causal_softmax(6, rng) for _ in range(3)] for _ in range(2)])
    A[1, 2, 4, 1] += 0.01  # row 4 no longer sums to one
    A[1, 2, 5, 1] += 0.01  # a later bad row is not the one named
    with pytest.raises(InputError, match=r"A\[1, 2\] row 4 \(0-based\) sums to .* not 1"):
        check_causal_stochastic(A)


def test_check_refuses_bidirectional(rng: np.random.Generator) -> None:
    logits = rng.standard_normal((5, 5))
    A = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    with pytest.raises(InputError, match=r"row 0 .*above the diagonal at column \d.*bidirectional"):
        deflate(A)


def test_check_refuses_softmax_off_by_one(rng: np.random.Generator) -> None:
    logits = np.where(np.tril(np.ones((5, 5), dtype=bool)), rng.standard_normal((5, 5)), -np.inf)
    A = np.exp(logits) / (1.0 + np.exp(logits).sum(axis=1, keepdims=True))
    with pytest.raises(InputError, match="row 0 .*sums to .*do not sum to one"):
        depth_product([A, A])


def test_check_refuses_negative_weights() -> None:
    A = _prev_token(4)
    A[2, :3] = [0.5, -0.2, 0.7]
    with pytest.raises(InputError, match=r"row 2 .*negative weight -0.2 at column 1"):
        check_causal_stochastic(A)


def test_check_refuses_non_square_and_complex() -> None:
    with pytest.raises(InputError, match="square"):
        check_causal_stochastic(np.ones((2, 3)))
    with pytest.raises(InputError, match="complex"):
        check_causal_stochastic(_P(3).astype(complex))


def test_flag_nonsimple_perron(rng: np.random.Generator) -> None:
    stack = np.array([causal_softmax(5, rng), np.eye(5), _prev_token(5)])
    np.testing.assert_array_equal(flag_nonsimple_perron(stack), [False, True, False])
    almost = causal_softmax(5, rng, scale=0.0)
    almost[3] = 0.0
    almost[3, 0], almost[3, 3] = 1e-13, 1.0 - 1e-13
    assert not flag_nonsimple_perron(almost)
    assert flag_nonsimple_perron(almost, atol=1e-12)


# --- operator builders ------------------------------------------------------------------


def test_builders(rng: np.random.Generator) -> None:
    heads = _heads(rng, L=3, H=4, n=6)
    np.testing.assert_allclose(mean_operator(heads), heads.sum(axis=1) / 4, rtol=1e-15)
    A = heads[0, 0]
    np.testing.assert_array_equal(rollout_operator(A), (A + np.eye(6)) / 2)
    chain = chain_operator(heads, [2, 0, 3])
    np.testing.assert_array_equal(chain, heads[[0, 1, 2], [2, 0, 3]])
    with pytest.raises(InputError, match="head index"):
        chain_operator(heads, [0, 4, 0])
    with pytest.raises(InputError, match="one per layer"):
        chain_operator(heads, [0, 1])
    with pytest.raises(InputError, match="heads axis"):
        mean_operator(A)


# --- depth products ---------------------------------------------------------------------


def _operators(rng: np.random.Generator, L: int, n: int) -> dict[str, np.ndarray]:
    heads = _heads(rng, L=L, H=3, n=n)
    mean = mean_operator(heads)
    return {"mean": mean, "rollout": rollout_operator(mean), "chain": chain_operator(heads, [1] * L)}


@pytest.mark.parametrize("kind", ["mean", "rollout", "chain"])
def test_depth_factorisation(kind: str, rng: np.random.Generator) -> None:
    n, L = 8, 5
    ops = _operators(rng, L, n)[kind]
    res = depth_product(list(ops))
    P = _P(n)
    want_prod = reduce(lambda acc, A: A @ acc, ops[1:], ops[0])
    np.testing.assert_allclose(res.product, want_prod, atol=1e-14)
    np.testing.assert_allclose(res.product - P, res.deviation, atol=1e-12)
    Bs = [A - P for A in ops]
    for b in range(L):
        D_b = reduce(lambda acc, B: B @ acc, Bs[1 : b + 1], Bs[0])
        assert res.profile[b] == pytest.approx(np.linalg.norm(D_b, 2), rel=1e-12)
    np.testing.assert_allclose(res.row_norms, [np.linalg.norm(r) for r in res.deviation], rtol=1e-14)
    assert res.norm == res.profile[-1]


def test_depth_product_later_layers_on_the_left(rng: np.random.Generator) -> None:
    A1, A2 = causal_softmax(5, rng, sink=1.0), causal_softmax(5, rng, prev=2.0)
    np.testing.assert_allclose(depth_product([A1, A2]).product, A2 @ A1, atol=1e-15)
    assert not np.allclose(A2 @ A1, A1 @ A2)


def test_depth_product_batched(rng: np.random.Generator) -> None:
    ops = np.array([[causal_softmax(6, rng) for _ in range(2)] for _ in range(3)])  # (L=3, chunks=2, n, n)
    res = depth_product(ops)
    assert res.deviation.shape == (2, 6, 6) and res.profile.shape == (3, 2) and res.row_norms.shape == (2, 6)
    np.testing.assert_allclose(res.deviation[1], depth_product(ops[:, 1]).deviation, rtol=1e-15)


def test_depth_product_resolves_deviations_below_rounding(rng: np.random.Generator) -> None:
    # Strong sink heads: D is ~1e-40 while the product's entries are O(1).
    ops = [causal_softmax(6, rng, sink=6.0) for _ in range(12)]
    res = depth_product(ops)
    assert 0 < res.norm < 1e-20
    Bs = [A - _P(6) for A in ops]
    np.testing.assert_allclose(res.deviation, reduce(lambda acc, B: B @ acc, Bs[1:], Bs[0]), rtol=1e-10)


def test_depth_product_refuses_single_matrix(rng: np.random.Generator) -> None:
    with pytest.raises(InputError, match=r"\(L, \.\.\., n, n\)"):
        depth_product(causal_softmax(4, rng))


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 10),
    L=st.integers(1, 6),
    sink=st.floats(0, 4),
    prev=st.floats(0, 4),
)
def test_factorisation_property(seed: int, n: int, L: int, sink: float, prev: float) -> None:
    rng = np.random.default_rng(seed)
    ops = np.array([causal_softmax(n, rng, sink=sink, prev=prev) for _ in range(L)])
    res = depth_product(ops)
    np.testing.assert_allclose(res.product - _P(n), res.deviation, atol=1e-12)
    pred = eig_predictions(ops)
    assert pred.e1 == pytest.approx(np.abs(np.linalg.eigvals(res.deviation)).max(), rel=1e-9, abs=1e-300)
    assert pred.e2 >= pred.e1 * (1 - 1e-12)


# --- eigenvalue predictions ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mean", "rollout", "chain"])
def test_e1_is_spectral_radius_of_deviation(kind: str, rng: np.random.Generator) -> None:
    ops = _operators(rng, 6, 9)[kind]
    pred = eig_predictions(ops)
    D = depth_product(ops).deviation
    assert pred.e1 == pytest.approx(np.abs(np.linalg.eigvals(D)).max(), rel=1e-10)
    rho_B = [np.abs(np.linalg.eigvals(A - _P(9))).max() for A in ops]
    assert pred.e2 == pytest.approx(np.prod(rho_B), rel=1e-10)


def test_eig_predictions_batched_and_trivial(rng: np.random.Generator) -> None:
    ops = np.array([[causal_softmax(5, rng) for _ in range(4)] for _ in range(3)])
    pred = eig_predictions(ops)
    assert pred.e1.shape == pred.e2.shape == (4,)
    assert pred.e1[2] == eig_predictions(ops[:, 2]).e1
    one = eig_predictions(np.ones((3, 1, 1)))
    assert one.e1 == 0 and one.e2 == 0


def test_eig_predictions_profile_matches_each_partial_product(rng: np.random.Generator) -> None:
    ops = np.array([[causal_softmax(6, rng) for _ in range(2)] for _ in range(5)])
    prof = eig_predictions(ops, profile=True)
    assert prof.e1.shape == prof.e2.shape == (5, 2)
    for b in range(5):
        part = eig_predictions(ops[: b + 1])
        np.testing.assert_allclose(prof.e1[b], part.e1, rtol=1e-14)
        np.testing.assert_allclose(prof.e2[b], part.e2, rtol=1e-14)
        D = np.linalg.multi_dot([A - _P(6) for A in ops[b::-1, 0]]) if b else ops[0, 0] - _P(6)
        assert prof.e1[b, 0] == pytest.approx(np.abs(np.linalg.eigvals(D)).max(), rel=1e-9, abs=1e-15)
    one = eig_predictions(np.ones((3, 1, 1)), profile=True)
    assert one.e1.shape == (3,) and not one.e1.any()


def test_eig_gap() -> None:
    np.testing.assert_allclose(eig_gap([1e-3, 2.0], [1e-10, 2.0]), [7.0, 0.0], atol=1e-12)
    out = eig_gap([1.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(out, [np.inf, 0.0, -np.inf])
    assert eig_gap(1e-300, 1e-310) == pytest.approx(10.0, abs=1e-9)
    with pytest.raises(InputError, match="negative or non-finite"):
        eig_gap(-1.0, 1.0)
    with pytest.raises(InputError, match="negative or non-finite"):
        eig_gap(1.0, np.nan)


def test_prev_token_chain_gap_is_infinite() -> None:
    # Exact previous-token heads: nilpotent B, E1 = E2 = 0, yet ‖D‖ = √(n − L) > 0.
    n, L = 8, 3
    ops = [_prev_token(n)] * L
    res = depth_product(ops)
    pred = eig_predictions(ops)
    assert res.norm == pytest.approx(np.sqrt(n - L), rel=1e-12)
    assert pred.e1 == 0 and eig_gap(res.norm, pred.e1) == np.inf
