"""The native transport fit against a brute force: ``torch.func.jacrev`` of the whole network
after layer ℓ (as a function of ``h_ℓ`` at every position), summed as the reference estimator
defines (sources and targets over the valid positions), on tiny random models of three
families; and the block-by-block fit of a layer-streamed model against the in-memory one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthlens.errors import InputError
from depthlens.lens import TransportSums, prompt_transport, source_layers, valid_positions
from depthlens.models import load_model
from depthlens.models.adapter import adapter_for
from depthlens.models.float64 import Float64Mode, double_copy


def _reference(adapter, ids: torch.Tensor, layer: int, V: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """``(1/|V|) Σ_{t∈V} Σ_{t′∈targets} ∂h_final,t′/∂h_ℓ,t`` from the full Jacobian of the rest of
    the network (every target position, and every source, differentiated separately)."""
    with Float64Mode():
        h = adapter.embed(ids).to(torch.float64)
        for k in range(layer + 1):
            h = adapter.block(k)(h)

        def rest(x: torch.Tensor) -> torch.Tensor:
            for k in range(layer + 1, adapter.n_layers):
                x = adapter.block(k)(x)
            return x[0]

        full = torch.func.jacrev(rest)(h.detach())  # (T, d, 1, T, d): every target, every source
    both = full[torch.as_tensor(targets)][:, :, 0][:, :, torch.as_tensor(V)]
    return (both.sum(dim=(0, 2)) / len(V)).numpy()


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
def test_prompt_transport_equals_the_full_jacobian_of_the_rest(family: str) -> None:
    model = load_model(f"random:{family}:num_hidden_layers=3" if family != "gpt2" else "random:gpt2:n_layer=3").model
    adapter = adapter_for(double_copy(model).eval())
    ids = torch.randint(0, adapter.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    got = prompt_transport(adapter, ids, skip_first=3, skip_last=1, batch=7)  # 7 does not divide d = 64
    V = valid_positions(12, 3, 1)
    assert sorted(got) == [0, 1]  # the last block's transport is the identity: not fitted
    for layer in range(2):
        ref = _reference(adapter, ids, layer, V, V)
        np.testing.assert_allclose(got[layer], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
        every_target = _reference(adapter, ids, layer, V, np.arange(12))  # the last position as a target too
        assert np.abs(every_target - ref).max() > 1e-3 * np.abs(ref).max()  # which the estimator leaves out
    assert np.abs(got[0] - np.eye(adapter.d_model)).max() > 1e-3  # not the identity


def test_the_reference_estimator_on_a_real_prompt_to_one_millionth() -> None:
    """SmolLM2-shaped check on a short prompt: the fit equals brute-force float64 autograd of
    the restricted sum to 1e-6 relative, at every source layer of a 4-layer Llama."""
    model = load_model("random:llama:num_hidden_layers=4").model
    adapter = adapter_for(double_copy(model).eval())
    ids = torch.randint(0, adapter.vocab_size, (1, 20), generator=torch.Generator().manual_seed(4))
    got = prompt_transport(adapter, ids, skip_first=16, skip_last=1)
    V = valid_positions(20)
    for layer in (0, 1, 2):
        ref = _reference(adapter, ids, layer, V, V)
        assert np.linalg.norm(got[layer] - ref) <= 1e-6 * np.linalg.norm(ref)


def test_source_layers_are_all_but_the_last() -> None:
    assert source_layers(4) == [0, 1, 2] and source_layers(4, [2, 0, 2]) == [0, 2]
    with pytest.raises(InputError, match=r"--lens-layers 3: source layers are 0 \.\. 2"):
        source_layers(4, [3])
    with pytest.raises(InputError, match="--lens-layers is empty"):
        source_layers(4, [])


def test_a_streamed_fit_equals_the_in_memory_fit_with_one_float64_block_at_a_time() -> None:
    """The block-by-block fit of a layer-streamed model (its layers generated from the seed)
    equals the in-memory fit of the same weights, and never holds two blocks in float64."""
    spec = "random:llama:init=layerwise,num_hidden_layers=4"
    ids = torch.randint(0, 256, (1, 14), generator=torch.Generator().manual_seed(3))
    memory = prompt_transport(adapter_for(double_copy(load_model(spec).model).eval()), ids, [0, 2], skip_first=4)
    streamed = load_model(spec, stream_layers=True).adapter
    resident: list[int] = []
    ensure = streamed.streamer.ensure

    def counting(layer: int, dtype: torch.dtype | None = None) -> None:
        ensure(layer, dtype)
        resident.append(sum(p.dtype == torch.float64 and not p.is_meta for p in streamed.model.parameters()))

    streamed.streamer.ensure = counting
    got = prompt_transport(streamed, ids, [0, 2], skip_first=4, batch=24)  # three batches of directions
    one_block = sum(p.numel() > 0 for p in streamed.layers[0].parameters())
    assert max(resident) == one_block  # one block's parameters in float64, never two
    for layer in (0, 2):
        np.testing.assert_allclose(got[layer], memory[layer], rtol=0, atol=1e-12 * np.abs(memory[layer]).max())
    assert streamed.streamer.resident is None and next(streamed.model.parameters()).dtype == torch.float32


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


def _rest_of_hf_model(model: torch.nn.Module, ids: torch.Tensor, layer: int, targets: np.ndarray):
    """``x ↦ Σ_{t′∈targets} h_final,t′`` through the model's own forward pass with layer ``layer``'s
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
        return seen["final"][0, torch.as_tensor(targets)].sum(dim=0), seen["h"]

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
        rest, h = _rest_of_hf_model(model, ids, layer, V)
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
    assert 5 not in got
