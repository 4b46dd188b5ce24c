"""Head roles on planted probe patterns."""

from __future__ import annotations

import numpy as np
import pytest

from depthlens.attention.roles import RoleThresholds, assign_roles, probe_scores, role_overlap
from depthlens.errors import InputError


def _planted(m: int, kind: str) -> np.ndarray:
    n = 2 * m + 1
    A = np.zeros((n, n))
    for i in range(n):
        if kind == "prev" and i > 0:
            A[i, i - 1] = 1.0
        elif kind == "induction" and i > m:
            A[i, i - m + 1] = 1.0
        elif kind == "duplicate" and i > m:
            A[i, i - m] = 1.0
        else:
            A[i, 0] = 1.0
    return A


@pytest.mark.parametrize("kind,key", [("prev", "prev_token_score"), ("induction", "induction_score"), ("duplicate", "duplicate_score")])
def test_planted_scores_are_exact(kind: str, key: str) -> None:
    scores = probe_scores(_planted(8, kind), 8)
    for name, value in scores.items():
        assert float(value) == (1.0 if name == key else 0.0)


def test_uniform_scores_closed_form() -> None:
    m = 5
    n = 2 * m + 1
    A = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    expected = np.mean([1.0 / (p + 1) for p in range(m + 1, n)])
    for value in probe_scores(A, m).values():
        assert float(value) == pytest.approx(expected, rel=1e-14)


def test_roles_and_overlap() -> None:
    roles = assign_roles(np.array([0.9, 0.0, 0.1, 0.29]), np.array([0.0, 0.5, 0.0, 0.0]), np.array([0.9, 0.9, 0.7, 0.2]))
    assert roles.tolist() == ["routing", "routing", "sink", "other"]
    strict = assign_roles(np.array([0.9]), np.array([0.0]), np.array([0.0]), RoleThresholds(routing=0.95))
    assert strict.tolist() == ["other"]
    table = role_overlap(roles, np.array([1.0, 2.0, -1.0, 0.0]))
    assert table.loc["routing", "positive"] == 2 and table.loc["sink", "negative"] == 1 and table.loc["other", "zero"] == 1


def test_probe_shape_error() -> None:
    with pytest.raises(InputError, match="block length 4"):
        probe_scores(np.zeros((8, 8)), 4)
