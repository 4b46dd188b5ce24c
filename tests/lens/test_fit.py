"""The native transport fit against a brute force: ``torch.func.jacrev`` of the whole network
after layer ℓ (as a function of ``h_ℓ`` at every position), summed as the estimator defines,
on tiny random models of three families."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.errors import InputError
from depthlens.lens import TransportSums, prompt_transport, valid_positions
from depthlens.models import load_model
from depthlens.models.adapter import adapter_for
from depthlens.models.float64 import Float64Mode, double_copy


def _reference(adapter, ids: torch.Tensor, layer: int, V: np.ndarray) -> np.ndarray:
    """``(1/|V|) Σ_{t∈V} Σ_{t′} ∂h_final,t′/∂h_ℓ,t`` from the full Jacobian of the rest of the network."""
    with Float64Mode():
        h = adapter.embed(ids).to(torch.float64)
        for k in range(layer + 1):
            h = adapter.block(k)(h)

        def rest(x: torch.Tensor) -> torch.Tensor:
            for k in range(layer + 1, adapter.n_layers):
                x = adapter.block(k)(x)
            return x[0].sum(dim=0)

        full = torch.func.jacrev(rest)(h.detach())  # (d, 1, T, d)
    return (full[:, 0, torch.as_tensor(V)].sum(dim=1) / len(V)).numpy()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
def test_prompt_transport_equals_the_full_jacobian_of_the_rest(family: str) -> None:
    model = load_model(f"random:{family}:num_hidden_layers=3" if family != "gpt2" else "random:gpt2:n_layer=3").model
    adapter = adapter_for(double_copy(model).eval())
    ids = torch.randint(0, adapter.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    got = prompt_transport(adapter, ids, skip_first=3, skip_last=1, batch=7)  # 7 does not divide d = 64
    V = valid_positions(12, 3, 1)
    assert sorted(got) == [0, 1, 2]
    for layer in range(3):
        ref = _reference(adapter, ids, layer, V)
        np.testing.assert_allclose(got[layer], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(got[2], np.eye(adapter.d_model), atol=1e-15)  # the last block's output is h_final
    assert np.abs(got[0] - np.eye(adapter.d_model)).max() > 1e-3  # and the others are not the identity


def test_sums_over_prompts_are_the_mean_of_the_prompts() -> None:
    model = load_model("random:llama").model
    sums = TransportSums.for_model(model, layers=[0], skip_first=16, skip_last=1)
    prompts = [torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(s)) for s in (0, 1)]
    for ids in prompts:
        sums.add(ids)
    each = [prompt_transport(sums.adapter, ids, [0])[0] for ids in prompts]
    np.testing.assert_allclose(sums.mean()[0], (each[0] + each[1]) / 2, rtol=0, atol=1e-14)
    assert sums.n_done == 2 and next(model.parameters()).dtype == torch.float32  # the model itself is left alone


def test_a_prompt_too_short_for_the_skipped_positions_is_refused() -> None:
    with pytest.raises(InputError, match="at least 18 tokens"):
        valid_positions(17)
    assert valid_positions(18).tolist() == [16]


def _rest_of_hf_model(model: torch.nn.Module, ids: torch.Tensor, layer: int):
    """``x ↦ Σ_{t′} h_final,t′`` through the model's own forward pass with layer ``layer``'s
    output replaced by ``x`` (so keys and values that later layers share, and per-layer
    inputs, are recomputed as the model does), and layer ``layer``'s observed output."""
    layers = adapter_for(model).layers

    def run(x: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        seen: dict[str, torch.Tensor] = {}

        def replace(module, args, output):
            seen["h"] = output[0] if isinstance(output, tuple) else output
            return output if x is None else x

        def last(module, args, output):
            seen["final"] = output[0] if isinstance(output, tuple) else output

        handles = [layers[layer].register_forward_hook(replace), layers[-1].register_forward_hook(last)]
        try:
            with Float64Mode():
                model(input_ids=ids, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return seen["final"][0].sum(dim=0), seen["h"]

    return (lambda x: run(x)[0]), run(None)[1].detach()


def test_gemma4_transport_follows_shared_keys_and_per_layer_inputs() -> None:
    """On Gemma 4 (layers 4 and 5 attend with the keys and values of layers 2 and 3) the fit
    equals the full Jacobian of the model's own forward pass from ``h_ℓ`` (which recomputes
    the shared keys from it), and central finite differences of that pass."""
    model = double_copy(load_model("random:gemma4").model).eval()
    adapter = adapter_for(model)
    ids = torch.randint(0, adapter.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    V = valid_positions(10, 2, 1)
    got = prompt_transport(adapter, ids, skip_first=2, skip_last=1, batch=9)
    for layer in (0, 1, 3, 4):
        rest, h = _rest_of_hf_model(model, ids, layer)
        full = torch.autograd.functional.jacobian(rest, h)  # (d, 1, T, d)
        ref = (full[:, 0, torch.as_tensor(V)].sum(dim=1) / len(V)).numpy()
        np.testing.assert_allclose(got[layer], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
        eps, fd = 1e-6, np.empty_like(ref)
        for j in range(adapter.d_model):
            step = torch.zeros_like(h)
            step[0, torch.as_tensor(V), j] = eps
            with torch.no_grad():
                fd[:, j] = ((rest(h + step) - rest(h - step)) / (2 * eps * len(V))).numpy()
        np.testing.assert_allclose(got[layer], fd, rtol=0, atol=1e-6 * np.abs(ref).max())
    np.testing.assert_allclose(got[5], np.eye(adapter.d_model), atol=1e-15)
