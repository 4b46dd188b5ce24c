"""Architecture families that depthlens understands, and tiny random models written in code.

A *family* groups Hugging Face ``model_type`` values whose decoder layers have the same
shape of computation (norm placement, attention projections, position encoding), so one
:class:`~depthlens.models.adapter.Adapter` subclass serves all of them.

============  ==========================================  ===================================
family        model_type values                           notes
============  ==========================================  ===================================
``llama``     ``llama``, ``mistral``, ``qwen2``           pre-RMSNorm, RoPE, GQA, SwiGLU
``gemma3``    ``gemma3_text`` (and multimodal ``gemma3``)  sandwich norms, q/k norms, sliding
``gpt2``      ``gpt2``                                    pre-LayerNorm, learned positions
``gpt_neox``  ``gpt_neox`` (Pythia)                       partial RoPE, parallel residual
``olmo2``     ``olmo2``                                   post-norms, q/k norms on full width
``olmo3``     ``olmo3``                                   as olmo2 plus sliding layers
============  ==========================================  ===================================

Examples
--------
>>> from depthlens.models.families import build_random, family_of
>>> model = build_random("llama", "num_hidden_layers=3", seed=0)
>>> family_of(model.config)
'llama'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import ModelError

FAMILIES: tuple[str, ...] = ("llama", "gemma3", "gpt2", "gpt_neox", "olmo2", "olmo3")

#: ``model_type`` -> family.
MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "olmo2": "olmo2",
    "olmo3": "olmo3",
}

_SUPPORTED = ", ".join(f"{f} ({'/'.join(t for t, g in MODEL_TYPES.items() if g == f)})" for f in FAMILIES)


def text_config(config: Any) -> Any:
    """The configuration of the language model inside ``config`` (itself for text-only models)."""
    inner = getattr(config, "text_config", None)
    if inner is not None and getattr(config, "model_type", None) in ("gemma3",):
        return inner
    return config


def family_of(config: Any) -> str:
    """Map a transformers configuration to a depthlens family name.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The model's configuration (``model.config``).

    Returns
    -------
    str
        One of :data:`FAMILIES`.

    Raises
    ------
    ModelError
        If the model is bidirectional (an encoder, an encoder-decoder, or a decoder configured
        with bidirectional attention): depthlens needs a causal language model. If the
        ``model_type`` belongs to no supported family.
    """
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise ModelError(
            f"the configuration {type(config).__name__} has no model_type; pass a Hugging Face causal LM config."
        )
    family = MODEL_TYPES.get(model_type)
    if family is not None:
        if getattr(text_config(config), "use_bidirectional_attention", False):
            raise ModelError(
                f"model_type {model_type!r} is configured with bidirectional attention "
                "(use_bidirectional_attention=True); depthlens needs a causal LM."
            )
        return family
    if _is_bidirectional(config):
        raise ModelError(
            f"model_type {model_type!r} is a bidirectional (encoder or encoder-decoder) model; "
            f"depthlens needs a causal LM, one of the families {_SUPPORTED}."
        )
    raise ModelError(f"model_type {model_type!r} is not supported; supported families: {_SUPPORTED}.")


def _is_bidirectional(config: Any) -> bool:
    if getattr(config, "is_encoder_decoder", False):
        return True
    try:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        )
    except Exception:  # pragma: no cover - transformers layout changed
        return bool(getattr(config, "is_decoder", True) is False)
    model_type = config.model_type
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES or not getattr(config, "is_decoder", False)
    # e.g. BERT: has a causal-LM head class but is an encoder unless configured as a decoder
    return model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False)


# ---------------------------------------------------------------------------------------
# tiny random configurations
# ---------------------------------------------------------------------------------------

_COMMON: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": None,
    "tie_word_embeddings": False,
}

_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-6},
    "gemma3": {
        **_COMMON,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "query_pre_attn_scalar": 16,
        "intermediate_size": 128,
        "sliding_window": 4,
        "final_logit_softcapping": 30.0,
        "rms_norm_eps": 1e-6,
    },
    "gpt2": {
        "vocab_size": 256,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 256,
        "n_inner": 128,
        "initializer_range": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "tie_word_embeddings": True,
    },
    "gpt_neox": {
        **_COMMON,
        "intermediate_size": 128,
        "use_parallel_residual": True,
        "tie_word_embeddings": False,
        "rotary_pct": 0.25,
    },
    "olmo2": {**_COMMON, "num_key_value_heads": 2, "intermediate_size": 128, "rms_norm_eps": 1e-6},
    "olmo3": {
        **_COMMON,
        "num_hidden_layers": 3,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "rms_norm_eps": 1e-6,
        "sliding_window": 4,
    },
}

#: layer-type pattern repeated over depth for families with sliding-window layers
_LAYER_PATTERN: dict[str, tuple[str, ...]] = {
    "gemma3": ("sliding_attention", "full_attention"),
    "olmo3": ("sliding_attention", "sliding_attention", "full_attention"),
}

#: override aliases (GPT-2 spells its sizes differently)
_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "max_position_embeddings": "n_positions",
        "intermediate_size": "n_inner",
    },
}


def _config_class(family: str) -> type:
    import transformers as tf

    return {
        "llama": tf.LlamaConfig,
        "gemma3": tf.Gemma3TextConfig,
        "gpt2": tf.GPT2Config,
        "gpt_neox": tf.GPTNeoXConfig,
        "olmo2": tf.Olmo2Config,
        "olmo3": tf.Olmo3Config,
    }[family]


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ModelError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}.")
    return family


def parse_overrides(overrides: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """Parse ``"hidden_size=128,num_hidden_layers=4"`` (or pass a mapping through).

    Values are read as int, float, bool (``true``/``false``), ``none``, or else kept as text.

    Raises
    ------
    ModelError
        If an item is not ``key=value``.
    """
    if overrides is None:
        return {}
    if isinstance(overrides, Mapping):
        return dict(overrides)
    if not isinstance(overrides, str):
        raise ModelError(f"overrides must be a dict or a 'key=value,...' string, not {type(overrides).__name__}.")
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in overrides.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise ModelError(f"override {item!r} is not key=value; write e.g. 'hidden_size=128,num_hidden_layers=4'.")
        out[key] = _parse_value(raw)
    return out


def _parse_value(raw: str) -> Any:
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


#: Size fields of a random configuration (common names) that must be positive integers.
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "intermediate_size", "max_position_embeddings", "head_dim")


def _check_sizes(family: str, values: dict[str, Any], aliases: Mapping[str, str]) -> None:
    """Refuse sizes that would fail later (a string, zero layers, heads that do not divide the
    width or the key/value heads), with one line naming the ``--model`` override."""
    def get(name: str) -> Any:
        return values.get(aliases.get(name, name))

    for name in _SIZES:
        value = get(name)
        if aliases.get(name, name) not in values or (value is None and name in ("num_key_value_heads", "head_dim")):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"--model random:{family} override {name}={value!r} is invalid; "
                             f"write a positive integer, e.g. random:{family}:{name}={_DEFAULTS['llama'].get(name, 64)}.")
    width, heads, kv = get("hidden_size"), get("num_attention_heads"), get("num_key_value_heads")
    if width % heads:
        raise ModelError(f"--model random:{family}: hidden_size={width} is not a multiple of num_attention_heads={heads}; "
                         "change one of them (e.g. hidden_size=64,num_attention_heads=4).")
    if kv is not None and heads % kv:
        raise ModelError(f"--model random:{family}: num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={kv}; change one of them (e.g. num_attention_heads=4,num_key_value_heads=2).")


def random_config(family: str, overrides: Mapping[str, Any] | str | None = None) -> Any:
    """A tiny configuration of ``family`` written in code (no download).

    Defaults: width 64, 2 layers (3 for gemma3/olmo3, whose layers alternate sliding-window
    and full attention with window 4), 4 query heads, 2 key/value heads where the family
    has grouped-query attention, vocabulary 256, 256 positions, eager attention, BOS id 0.
    gpt_neox uses the parallel residual and a partial rotary embedding (25 %); gemma3 sets
    final logit soft-capping so it is exercised.

    Parameters
    ----------
    family : str
        One of :data:`FAMILIES`.
    overrides : dict or str, optional
        Configuration fields to change, as a mapping or ``"key=value,key=value"``. The
        common names ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
        ``max_position_embeddings`` and ``intermediate_size`` work for gpt2 too.

    Raises
    ------
    ModelError
        For an unknown family, an unknown configuration key (named in the message) or values
        the configuration class rejects.
    """
    _check_family(family)
    cls = _config_class(family)
    values = dict(_DEFAULTS[family])
    aliases = _ALIASES.get(family, {})
    reference = cls()
    for key, value in parse_overrides(overrides).items():
        key = aliases.get(key, key)
        if key not in values and not hasattr(reference, key):
            raise ModelError(
                f"override {key!r} is not a field of {cls.__name__}; check the spelling (e.g. hidden_size=128)."
            )
        values[key] = value
    _check_sizes(family, values, aliases)
    pattern = _LAYER_PATTERN.get(family)
    if pattern is not None and "layer_types" not in values:
        n = int(values["num_hidden_layers"])
        values["layer_types"] = [pattern[i % len(pattern)] for i in range(n)]
    if family == "gpt_neox":
        pct = values.pop("rotary_pct")
        values.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": pct})
    try:
        config = cls(**values, attn_implementation="eager")
    except Exception as exc:  # noqa: BLE001 - ValueError, TypeError, huggingface_hub's StrictDataclassError, ...
        reason = " ".join(str(exc).split())
        raise ModelError(f"{cls.__name__} rejects the overrides of --model random:{family} ({reason}); "
                         "change them.") from exc
    config._attn_implementation = "eager"
    return config


def build_random(
    family: str, overrides: Mapping[str, Any] | str | None = None, seed: int = 0
) -> torch.nn.Module:
    """A randomly initialised causal LM of ``family``: float32, eager attention, eval mode.

    The same ``seed`` gives bit-identical weights; the global torch RNG state is left as it was.

    Raises
    ------
    ModelError
        As :func:`random_config`, or when the configuration cannot be instantiated.
    """
    from transformers import AutoModelForCausalLM

    config = random_config(family, overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        except Exception as exc:  # noqa: BLE001 - any failure of these overrides: one line
            reason = " ".join(str(exc).split())
            raise ModelError(f"cannot build a random {family} model ({type(exc).__name__}: {reason}); "
                             f"change the overrides of --model random:{family}.") from exc
    return model.float().eval()
