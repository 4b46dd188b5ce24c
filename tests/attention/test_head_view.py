"""One head's operators (:mod:`depthlens.attention.head_view`) on synthetic matrices: closed
forms of METHODS A2, the A3 quantities of the stage, and the explorer's sampled arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from depthlens.attention.features import matrix_features
from depthlens.attention.head_view import (
    EXPLORER_GRID,
    EXPLORER_POWERS,
    PSEUDO_GRID,
    default_kmax,
    explorer_arrays,
    head_view,
)
from depthlens.attention.options import AttentionOptions
from depthlens.errors import InputError
from depthlens.linalg.causal import random_causal_attention

OPTS = AttentionOptions()


def previous_token(n: int) -> np.ndarray:
    A = np.zeros((n, n))
    A[0, 0] = 1.0
    A[np.arange(1, n), np.arange(n - 1)] = 1.0
    return A


def test_previous_token_head_closed_forms() -> None:
    """An exact previous-token head: B nilpotent, ``‖B^k‖ = √(n − k)`` (METHODS A2)."""
    n = 12
    view = head_view(previous_token(n), OPTS, layer=2, head=1, chunk=0)
    assert (view.layer, view.head, view.chunk, view.n) == (2, 1, 0, n)
    assert np.array_equal(view.eigenvalues, np.zeros(n))
    k = np.arange(1, n - 1)
    np.testing.assert_allclose(view.transient[k], np.sqrt(n - k), rtol=1e-13)
    assert view.transient[0] == 1.0 and np.all(view.transient[n - 1:] == 0.0)
    assert view.peak_k == 1 and view.peak_B == pytest.approx(math.sqrt(n - 1), rel=1e-13) and view.peak_certified
    assert len(view.powers) == default_kmax(n, 1) + 1 == n + 1
    assert view.kreiss_B_lo <= view.kreiss_B * (1 + 1e-9) and view.kreiss_B <= view.kreiss_B_hi * (1 + 1e-9)
    assert view.kreiss_B_certified and view.TR1 == pytest.approx(math.log(view.kreiss_B))
    assert "kreiss_B=" in repr(view) and "array" not in repr(view)


def test_sink_head_has_a_zero_operator() -> None:
    n = 8
    A = np.zeros((n, n))
    A[:, 0] = 1.0  # A = P
    view = head_view(A, OPTS, layer=0, head=0, chunk=3)
    assert not view.B.any() and np.array_equal(view.transient, np.r_[1.0, np.zeros(n)])
    X, Y = np.meshgrid(view.pseudospectrum.x, view.pseudospectrum.y)
    np.testing.assert_allclose(view.pseudospectrum.sigma, np.abs(X + 1j * Y), rtol=1e-12, atol=1e-14)


def test_view_is_the_stages_quantities_and_independent_constructions() -> None:
    rng = np.random.default_rng(7)
    A = random_causal_attention(24, rng, sink=1.0, prev=2.0)
    view = head_view(A, OPTS, layer=0, head=0, chunk=0, kmax=40)
    assert view.values == matrix_features(A, extras=True, certify=(OPTS.rtol, OPTS.certify_evals))
    P = np.zeros_like(A)
    P[:, 0] = 1.0
    assert np.array_equal(view.B, A - P)
    X = np.eye(24)
    for k in range(41):  # explicit powers
        assert view.transient[k] == pytest.approx(np.linalg.norm(X, 2), rel=1e-11)
        X = view.B @ X
    grid = view.pseudospectrum
    assert np.array_equal(grid.x, PSEUDO_GRID) and grid.sigma.shape == (121, 121)
    for i, j in ((0, 0), (40, 70), (61, 75), (100, 20)):
        z = grid.x[j] + 1j * grid.y[i]
        dense = np.linalg.svd(z * np.eye(24) - view.B, compute_uv=False)[-1]
        assert grid.sigma[i, j] == pytest.approx(dense, rel=1e-7)


def test_explorer_arrays_sample_the_view() -> None:
    rng = np.random.default_rng(3)
    A = random_causal_attention(20, rng, sink=0.5)
    found = explorer_arrays(A)
    view = head_view(A, OPTS, layer=0, head=0, chunk=0, kmax=int(EXPLORER_POWERS[-1]))
    np.testing.assert_array_equal(found["transient"], view.transient[EXPLORER_POWERS])  # the same products
    np.testing.assert_allclose(found["sigma"], view.pseudospectrum.sigma[::3, ::3], rtol=1e-7)
    assert found["sigma"].shape == (EXPLORER_GRID.size,) * 2 == (41, 41)
    np.testing.assert_array_equal(found["eig"], np.diagonal(A) - np.r_[1.0, np.zeros(19)])
    assert EXPLORER_POWERS[0] == 1 and EXPLORER_POWERS[-1] == 128 and np.all(np.diff(EXPLORER_POWERS) > 0)


def test_bad_input() -> None:
    with pytest.raises(InputError):
        head_view(np.ones((3, 3)), OPTS, layer=0, head=0, chunk=0)  # not causal
    with pytest.raises(InputError, match="kmax=0"):
        head_view(previous_token(4), OPTS, layer=0, head=0, chunk=0, kmax=0)
    with pytest.raises(InputError):
        explorer_arrays(np.eye(3) * 0.5)  # rows do not sum to one
    assert default_kmax(128, 3) == 128 and default_kmax(16, 40) == 80 and default_kmax(4, 1000) == 180
