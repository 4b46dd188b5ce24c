"""``Adapter.shared_passes``: forward passes kept and answered inside a block, against the
same passes run outside one (bit for bit), counted through the passes that actually run."""

from __future__ import annotations

import pytest
import torch

from depthlens.models import FAMILIES, adapter_for, build_random
from depthlens.models.hooks import SHARED_BYTES

B, T = 2, 12


@pytest.fixture(scope="module")
def ad():
    return adapter_for(build_random("llama", seed=3))


@pytest.fixture
def counted(ad, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The forward passes that run, by kind: ``states`` (residual states) and ``qk`` (query/key captures)."""
    runs: list[str] = []
    states, captures = type(ad)._residual_states, type(ad)._attention_captures
    monkeypatch.setattr(type(ad), "_residual_states", lambda self, x: runs.append("states") or states(self, x))
    monkeypatch.setattr(type(ad), "_attention_captures",
                        lambda self, *a, **k: runs.append("qk") or captures(self, *a, **k))
    return runs


def _ids(seed: int, n: int = B) -> torch.Tensor:
    return torch.randint(1, 200, (n, T), generator=torch.Generator().manual_seed(seed))


def _qk_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (x is None and y is None) or torch.equal(x, y) for k in a for x, y in zip(a[k], b[k], strict=True))


def test_a_second_request_is_a_copy_of_the_first_pass(ad, counted: list[str]) -> None:
    ids = _ids(0)
    alone_states, alone_qk = ad.residual_states(ids), ad.qk_captures(ids)
    alone_probs = [p for _, p in ad.attention_probs(ids)]
    counted.clear()
    with ad.shared_passes():
        first = ad.residual_states(ids)
        first.add_(1.0)  # a caller writing into what it got changes nothing kept
        again = ad.residual_states(ids.clone())
        qk = ad.qk_captures(ids)
        probs = [p for _, p in ad.attention_probs(ids)]  # every layer: the same captures
        part = ad.qk_captures(ids, [0])  # other layers: another pass
    assert counted == ["states", "qk", "qk"]
    assert torch.equal(again, alone_states) and again.data_ptr() != first.data_ptr()
    assert _qk_equal(qk, alone_qk) and all(torch.equal(p, q) for p, q in zip(probs, alone_probs, strict=True))
    assert _qk_equal(part, ad.qk_captures(ids, [0]))
    counted.clear()
    ad.residual_states(ids)
    assert counted == ["states"]  # nothing outlives the block


def test_other_ids_budget_and_rows_decide_what_is_kept(ad, counted: list[str]) -> None:
    ids, other = _ids(1), _ids(2)
    with ad.shared_passes():
        ad.residual_states(ids)
        ad.residual_states(other)
        ad.residual_states(ids[:1])  # a sub-batch is other ids
        ad.residual_states(other)
    assert counted == ["states"] * 3
    counted.clear()
    with ad.shared_passes(0):
        ad.residual_states(ids)
        ad.residual_states(ids)
    size = ad.residual_states(ids).numel() * 4
    with ad.shared_passes(size):  # room for one batch
        for x in (ids, other, ids, other):
            ad.residual_states(x)
    assert counted == ["states"] * 2 + ["states"] + ["states", "states", "states"]
    counted.clear()
    with ad.shared_passes(SHARED_BYTES, rows=torch.cat([ids, other[:1]])):
        for x in (ids, other, ids, other, other[:1], other[:1]):
            ad.residual_states(x)
    assert counted == ["states", "states", "states", "states"]  # other is not two rows of rows


def test_blocks_nest_into_the_outermost(ad, counted: list[str]) -> None:
    ids = _ids(3)
    with ad.shared_passes():
        with ad.shared_passes(0):  # the outer block: its budget and what it keeps
            ad.residual_states(ids)
        ad.residual_states(ids)
    assert counted == ["states"]


def test_passes_under_interventions_are_neither_kept_nor_answered(ad, counted: list[str]) -> None:
    ids = _ids(4)
    clean = ad.residual_states(ids)
    L = ad.n_layers
    values = {layer: 5.0 for layer in range(1, L + 1)}
    with ad.clamp(0, values, 0, from_layer=1):
        clamped = ad.residual_states(ids)
    assert not torch.equal(clamped, clean)
    counted.clear()
    with ad.shared_passes():
        got = ad.residual_states(ids)
        with ad.clamp(0, values, 0, from_layer=1):
            under = ad.residual_states(ids)  # not the clean pass kept
            under_again = ad.residual_states(ids)
        with ad.ablate_head(0, 0):
            ad.qk_captures(ids)
            ad.qk_captures(ids)
        after = ad.residual_states(ids)  # the clean pass kept before
    assert counted == ["states", "states", "states", "qk", "qk"]
    assert torch.equal(got, clean) and torch.equal(after, clean)
    assert torch.equal(under, clamped) and torch.equal(under_again, clamped)
    assert ad._active == 0


def test_an_intervention_ending_in_an_error_leaves_nothing_active(ad) -> None:
    with pytest.raises(ZeroDivisionError), ad.clamp(0, lambda layer, x: 1 / 0, 0, from_layer=0):
        ad.residual_states(_ids(5))
    assert ad._active == 0
    assert all(not layer._forward_pre_hooks for layer in ad.layers)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_pass_gives_the_states_and_captures_of_their_own_passes(family: str) -> None:
    """Every family (Gemma 4's layers that read another layer's keys included): the states and
    every layer's captures of one pass are bit for bit those of the two passes; inside a block
    each is kept as if asked for alone, whichever comes first."""
    ad = adapter_for(build_random(family, seed=2))
    ids = _ids(6)
    states, captured = ad.states_and_captures(ids)
    assert torch.equal(states, ad.residual_states(ids)) and _qk_equal(captured, ad.qk_captures(ids))
    assert any(q is not None for q, _ in captured.values())
    for first in ("one", "two"):
        with ad.shared_passes():
            if first == "one":
                ad.states_and_captures(ids)
                with _no_pass(ad):
                    got = ad.residual_states(ids), ad.qk_captures(ids)
            else:
                ad.residual_states(ids)
                ad.qk_captures(ids)
                with _no_pass(ad):
                    got = ad.states_and_captures(ids)
        assert torch.equal(got[0], states) and _qk_equal(got[1], captured)


class _no_pass:
    """Fails the test if the adapter runs a forward pass inside the block."""

    def __init__(self, ad) -> None:
        self.ad = ad

    def __enter__(self) -> None:
        self.handle = self.ad.model.register_forward_pre_hook(lambda *a: pytest.fail("a forward pass ran"))

    def __exit__(self, *exc) -> None:
        self.handle.remove()
