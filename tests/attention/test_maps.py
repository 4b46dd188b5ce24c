"""The chosen heads' attention matrices: which heads (``--heads`` or the top routing and sink
head), their saved matrices against a recomputation, and ``--heads`` outside the config hash."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from depthlens.attention.patterns import prev_weight, sink_mass
from depthlens.attention.picks import chosen_heads, parse_head, top_heads
from depthlens.config import RunConfig
from depthlens.errors import InputError

HEADS = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "prev_token_score": [0.1, 0.9, 0.2, 0.3],
                      "induction_score": [0.0, 0.1, 0.95, 0.0], "sink_mass": [0.2, 0.1, 0.3, 0.8]})


def test_top_heads_and_chosen_heads() -> None:
    assert top_heads(HEADS) == {"routing": (1, 0), "sink": (1, 1)}
    assert chosen_heads(HEADS) == {(1, 0): "routing", (1, 1): "sink"}
    assert chosen_heads(HEADS, ("0.1", " 1.1", "0.1")) == {(0, 1): "--heads", (1, 1): "--heads"}
    same = HEADS.assign(sink_mass=[0.2, 0.1, 0.99, 0.0])  # one head is both: drawn once
    assert chosen_heads(same) == {(1, 0): "routing"}


@pytest.mark.parametrize("text", ["3", "a.b", "1.2.3", "-1.0", ""])
def test_parse_head_refuses_other_text(text: str) -> None:
    with pytest.raises(InputError, match="LAYER.HEAD"):
        parse_head(text)


def test_chosen_heads_refuses_a_head_the_model_lacks() -> None:
    with pytest.raises(InputError, match="layers 0–1 and heads 0–1"):
        chosen_heads(HEADS, ("2.0",))


def test_heads_option_is_outside_the_config_hash() -> None:
    """Which heads are drawn changes no table: a run resumes with another --heads."""
    assert RunConfig(heads=("0.1",)).hash() == RunConfig().hash()
    assert RunConfig(heads=("0.1",)).to_dict()["attention"]["heads"] == ["0.1"]


def test_saved_maps_are_the_heads_matrices(head_run) -> None:
    """The default picks' matrices, each the head's median-chunk matrix as Run.head recomputes it."""
    arrays = head_run.arrays("attention_maps")
    meta = head_run._tables.arrays("attention_maps")[1]
    heads = head_run.table("heads")
    picks = chosen_heads(heads[heads["checkpoint"] == "trained"])
    assert meta["heads"] == ",".join(f"{layer}.{head}" for layer, head in picks)
    assert meta["picked"] == ",".join(picks.values()) and list(arrays) == meta["heads"].split(",")
    for (layer, head), chunk in zip(picks, meta["chunks"].split(",")):
        view = head_run.head(layer, head)
        A = arrays[f"{layer}.{head}"]
        assert A.dtype == np.float64 and int(chunk) == view.chunk
        np.testing.assert_allclose(A, view.A, rtol=0, atol=1e-12)
        np.testing.assert_allclose(A.sum(axis=1), 1.0, atol=1e-9)
        assert np.all(np.triu(A, 1) == 0)  # causal


def test_saved_maps_agree_with_the_capture_tables(head_run) -> None:
    """The pattern features of each saved matrix, computed directly, are the capture stage's
    attention_patterns row of that head and chunk (two forward passes, the same numbers)."""
    from depthlens.report.pattern_figures import attention_maps

    patterns = head_run.table("attention_patterns").set_index(["layer", "head", "chunk"])
    maps = attention_maps(head_run._tables)
    assert maps
    for m in maps:
        row = patterns.loc[(m["layer"], m["head"], m["chunk"])]
        assert float(sink_mass(m["A"])) == pytest.approx(row["sink_mass"], abs=1e-9) == m["sink_mass"]
        assert float(prev_weight(m["A"])) == pytest.approx(row["prev_weight"], abs=1e-9) == m["prev_weight"]
