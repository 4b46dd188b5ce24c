"""Residual summaries against direct computations."""

from __future__ import annotations

import numpy as np
import pytest

from depthlens.errors import InputError
from depthlens.residual import boundary_names, massive_mask, summarise_boundaries


def test_boundary_names() -> None:
    assert boundary_names(2) == [(0, "pre_attn"), (0, "pre_mlp"), (1, "pre_attn"), (1, "pre_mlp"), (2, "final")]
    assert boundary_names(1, ("pre_attn", "pre_mlp", "pre_ple")) == [(0, "pre_attn"), (0, "pre_mlp"), (0, "pre_ple"),
                                                                     (1, "final")]


def test_three_boundaries_a_layer(rng: np.random.Generator) -> None:
    states = rng.normal(size=(7, 3, 5))  # 2 layers of 3 boundaries and the final state
    table = summarise_boundaries(states, boundaries=("pre_attn", "pre_mlp", "pre_ple"))
    assert list(zip(table["layer"], table["boundary"])) == [(0, "pre_attn"), (0, "pre_mlp"), (0, "pre_ple"),
                                                            (1, "pre_attn"), (1, "pre_mlp"), (1, "pre_ple"), (2, "final")]
    np.testing.assert_allclose(table["rms"], np.sqrt((states**2).mean(axis=(1, 2))), rtol=1e-13)
    with pytest.raises(InputError, match=r"expected \(3L \+ 1, T, d\)"):
        summarise_boundaries(states[:6], boundaries=("pre_attn", "pre_mlp", "pre_ple"))


def test_summary_matches_direct(rng: np.random.Generator) -> None:
    states = rng.normal(size=(5, 7, 11))
    states[3, 0, 4] = 5000.0  # one massive entry: >= 100 and >= 1000x the median
    states[1, 2, 3] = 150.0  # large but below 1000x median? median ~0.67 -> 150 < 670
    table = summarise_boundaries(states)
    assert list(table["boundary"]) == ["pre_attn", "pre_mlp", "pre_attn", "pre_mlp", "final"]
    for b in range(5):
        h = states[b]
        row = table.iloc[b]
        assert row["rms"] == pytest.approx(np.linalg.norm(h) / np.sqrt(h.size), rel=1e-13)
        assert row["max_abs"] == np.abs(h).max()
        assert h[row["max_pos"], row["max_dim"]] in (row["max_abs"], -row["max_abs"])
    assert table["n_massive"].tolist() == [0, 0, 0, 1, 0]
    assert (int(table.iloc[3]["max_pos"]), int(table.iloc[3]["max_dim"])) == (0, 4)


def test_massive_mask_thresholds() -> None:
    h = np.full((4, 4), 0.1)
    h[0, 0] = 99.0  # >= 1000 x median but below 100
    h[1, 1] = 100.0
    mask = massive_mask(h)
    assert mask.sum() == 1 and mask[1, 1]


def test_rejects_bad_shape() -> None:
    with pytest.raises(InputError):
        summarise_boundaries(np.zeros((4, 3, 2)))
