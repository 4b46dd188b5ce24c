"""The family registry, and the layering rules around :mod:`depthlens.models` (DESIGN.md).

Every registered family round-trips (tiny config -> random model -> family -> adapter class);
unknown family names and model types are refused in one line naming the supported ones, never
given a default; only ``models/`` names Hugging Face attributes; ``models/`` imports no stage
package.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

import depthlens
from depthlens.errors import ModelError
from depthlens.models import FAMILIES, Adapter, adapter_for, build_random, family_of, random_config
from depthlens.models.registry import Family, families, family, family_for_config, register, text_config

SRC = Path(depthlens.__file__).parent


def test_registry_lists_the_builtin_families_in_order() -> None:
    assert FAMILIES == ("llama", "gemma3", "gpt2", "gpt_neox", "olmo2", "olmo3", "gemma4")
    assert tuple(entry.name for entry in families()) == FAMILIES
    model_types = [t for entry in families() for t in entry.model_types]
    assert len(model_types) == len(set(model_types))
    assert all(isinstance(entry, Family) and issubclass(entry.adapter, Adapter) for entry in families())


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_round_trips(name: str) -> None:
    entry = family(name)
    config = random_config(name)
    assert type(config) is entry.config_type() and config.model_type in entry.model_types
    model = build_random(name, seed=0)
    assert family_for_config(model.config) is entry and family_of(model.config) == name
    ad = adapter_for(model)
    assert type(ad) is entry.adapter and ad.family == name
    assert (ad.d_model, ad.n_heads, ad.vocab_size) == (64, 4, 256)


def test_entries_are_read_only() -> None:
    entry = family("llama")
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        entry.tiny_config["hidden_size"] = 128  # type: ignore[index]


def test_unknown_family_and_model_type_are_one_line_errors() -> None:
    with pytest.raises(ModelError, match="unknown family 'bert'; choose one of llama, gemma3, gpt2") as by_name:
        family("bert")
    supported = r"supported families: llama \(llama/mistral/qwen2\), gemma3 \(gemma3_text/gemma3\)"
    with pytest.raises(ModelError, match=r"model_type 'falcon' is not supported; " + supported) as by_type:
        family_for_config(transformers.FalconConfig())
    for err in (by_name, by_type):
        assert "\n" not in str(err.value)
        assert all(name in str(err.value) for name in FAMILIES)


def test_adapter_for_an_unknown_model_type_raises_instead_of_defaulting() -> None:
    """A model an adapter could wrap (a Llama layout) is still refused when its type is not registered."""
    model = build_random("olmo2")
    model.config.model_type = "olmo_custom"
    with pytest.raises(ModelError, match="olmo_custom") as err:
        adapter_for(model)
    assert "\n" not in str(err.value) and "olmo2 (olmo2)" in str(err.value)


def test_register_refuses_a_name_or_model_type_twice() -> None:
    llama = family("llama")
    with pytest.raises(ModelError, match="registered twice"):
        register(llama)
    with pytest.raises(ModelError, match="'mistral' of family 'llama_copy' already belongs to family 'llama'"):
        register(dataclasses.replace(llama, name="llama_copy", model_types=("mistral",)))
    assert tuple(entry.name for entry in families()) == FAMILIES


def test_text_config_unwraps_only_multimodal_wrappers() -> None:
    text = transformers.LlamaConfig()
    assert text_config(text) is text
    wrapper = transformers.Gemma3Config()
    assert text_config(wrapper) is wrapper.text_config


# ---------------------------------------------------------------------------- layering

#: Hugging Face module attributes, configuration fields and functions that only ``models/``
#: may name: attention, MLP and norm modules of the supported families, embeddings, rotary
#: embedding, layer lists, HF configuration fields read through ``.config``.
HF_NAMES = re.compile(
    r"\.(self_attn|mlp|q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|act_fn|c_attn|c_proj|c_fc"
    r"|query_key_value|dense_h_to_4h|dense_4h_to_h|ln_1|ln_2|ln_f|input_layernorm|post_attention_layernorm"
    r"|pre_feedforward_layernorm|post_feedforward_layernorm|final_layer_norm|rotary_emb|embed_tokens|embed_in"
    r"|wte|wpe|lm_head|scaling|language_model|backbone|inv_freq)\b"
    r"|\.layers\[|apply_rotary_pos_emb"
    r"|\.config\.(vocab_size|hidden_size|num_\w+|model_type|\w+_token_id|max_position_embeddings|rope_\w+"
    r"|sliding_window|layer_types|head_dim|intermediate_size|n_embd|n_head|n_layer)\b"
)
#: A private member of an adapter, reached from outside ``models/``.
PRIVATE_ADAPTER = re.compile(r"\b(adapter|ad|ad64)\._[a-z]")


def _python_files(inside_models: bool) -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if (p.relative_to(SRC).parts[0] == "models") == inside_models]


def _matches(pattern: re.Pattern, paths: list[Path]) -> list[str]:
    return [f"{p.relative_to(SRC)}:{no}: {line.strip()}"
            for p in paths for no, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]


def test_only_models_names_hugging_face_attributes() -> None:
    assert _matches(HF_NAMES, _python_files(inside_models=False)) == []
    assert _matches(PRIVATE_ADAPTER, _python_files(inside_models=False)) == []
    # the pattern is not vacuous: every family module and the weight reader match it
    found = {line.split(":")[0] for line in _matches(HF_NAMES, _python_files(inside_models=True))}
    assert {"models/llama.py", "models/gpt2.py", "models/gpt_neox.py", "models/adapter.py"} <= found


STAGES = ("depthlens.attention", "depthlens.jacobian", "depthlens.topology", "depthlens.interventions",
          "depthlens.contest", "depthlens.lens", "depthlens.report", "depthlens.workflow", "depthlens.stages")


def test_models_imports_no_stage_package() -> None:
    code = ("import importlib, pkgutil, sys, depthlens.models as m\n"
            "for info in pkgutil.iter_modules(m.__path__):\n"
            "    importlib.import_module(f'depthlens.models.{info.name}')\n"
            "print(sorted(sys.modules))")
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    modules = ast.literal_eval(out)
    assert "depthlens.models.registry" in modules
    assert [m for m in modules if any(m == s or m.startswith(s + ".") for s in STAGES)] == []
