"""The compiled refinement of the Kreiss value search on the real axis: the same points and
values as SciPy's bounded Brent over the same kernel, and the hand-over to it where a point
does not converge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from depthlens.linalg import kreiss_search
from depthlens.linalg._brent import refine
from depthlens.linalg.causal import deflate, random_causal_attention
from depthlens.linalg.kreiss_search import Objective
from depthlens.linalg.sigma import triangular_form


def _refined(tf, lo: float, hi: float) -> Objective:
    obj = Objective(tf, "numba")
    obj.refine_axis(lo, hi)
    return obj


@pytest.mark.parametrize("n, sink, prev", [(8, 1.0, 2.0), (32, 3.0, 0.5), (64, 0.2, 4.0), (96, 2.0, 1.0)])
def test_compiled_brent_is_scipys_step_for_step(monkeypatch: pytest.MonkeyPatch, n: int, sink: float,
                                                prev: float) -> None:
    """Every evaluated point, its ratio and the best point equal SciPy's path bit for bit, on
    both sides of the maximiser and from a bracket that ends at it."""
    rng = np.random.default_rng(n)
    tf = triangular_form(deflate(random_causal_attention(n, rng, sink=sink, prev=prev)))
    brackets = [(math.log(1e-3), math.log(2.0 * tf.norm_upper + 1.0)), (-3.0, 0.5), (-1.0, -0.2)]
    compiled = [_refined(tf, lo, hi) for lo, hi in brackets]
    monkeypatch.setattr(kreiss_search, "refine", lambda *args: None)  # SciPy's loop, the same kernel
    for (lo, hi), fast in zip(brackets, compiled):
        slow = _refined(tf, lo, hi)
        assert fast.n_evals == slow.n_evals > 5
        assert fast.best == slow.best and fast.best_z == slow.best_z


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # SciPy's parabola through an infinite ratio
def test_a_point_the_kernel_cannot_take_goes_to_scipys_path() -> None:
    """Brent's first point placed on an eigenvalue (inverse iteration refuses it): the compiled
    search hands over, and the Python path's dense fallback evaluates it; the ratio there is
    infinite, as σ_min = 0."""
    lo, hi = -2.0, 1.0
    r = 1.0 + math.exp(lo + 0.5 * (3.0 - math.sqrt(5.0)) * (hi - lo))
    L = np.diag([0.3, r, 0.5])
    L[1, 0], L[2, 1] = 0.7, -0.4
    tf = triangular_form(L)
    assert refine(tf, lo, hi) is None
    obj = _refined(tf, lo, hi)
    assert obj.n_evals >= 1 and obj.best == math.inf and obj.best_z == complex(r, 0.0)
