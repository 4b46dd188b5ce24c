"""Architecture families by name, and tiny random models written in code.

Everything here is derived from the registry (:mod:`depthlens.models.registry`), where each
architecture's module declares its :class:`~depthlens.models.registry.Family`: the names
(:data:`FAMILIES`), the mapping of a configuration to its family (:func:`family_of`) and the
tiny configurations (:func:`random_config`, :func:`build_random`).

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
from . import registry
from .registry import family_for_config, text_config

__all__ = ["BLOCK_MAP_FAMILIES", "FAMILIES", "build_random", "family_of", "parse_overrides", "random_config", "text_config"]

#: The registered family names, in registry order.
FAMILIES: tuple[str, ...] = tuple(entry.name for entry in registry.families())

#: The families whose layers are maps of the residual alone, so that their adapters give
#: sub-layer and layer maps (:attr:`~depthlens.models.adapter.Adapter.block_maps`; not Gemma 4).
BLOCK_MAP_FAMILIES: tuple[str, ...] = tuple(entry.name for entry in registry.families() if entry.adapter.block_maps)


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
        As :func:`~depthlens.models.registry.family_for_config`: bidirectional models, and
        ``model_type`` values of no registered family.
    """
    return family_for_config(config).name


# ---------------------------------------------------------------------------------------
# tiny random configurations
# ---------------------------------------------------------------------------------------


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


def _check_sizes(family: str, values: dict[str, Any], defaults: Mapping[str, Any], aliases: Mapping[str, str]) -> None:
    """Refuse sizes that would fail later (a string, zero layers, heads that do not divide the
    width or the key/value heads), with one line naming the ``--model`` override."""
    def get(name: str) -> Any:
        return values.get(aliases.get(name, name))

    for name in _SIZES:
        value = get(name)
        if aliases.get(name, name) not in values or (value is None and name in ("num_key_value_heads", "head_dim")):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            example = defaults.get(aliases.get(name, name), 64)
            raise ModelError(f"--model random:{family} override {name}={value!r} is invalid; "
                             f"write a positive integer, e.g. random:{family}:{name}={example}.")
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
        One of :data:`FAMILIES`; its :class:`~depthlens.models.registry.Family` entry holds
        the defaults (``tiny_config``).
    overrides : dict or str, optional
        Configuration fields to change, as a mapping or ``"key=value,key=value"``. The
        common names ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
        ``max_position_embeddings`` and ``intermediate_size`` work for gpt2 too (the
        family's ``aliases``).

    Raises
    ------
    ModelError
        For an unknown family, an unknown configuration key (named in the message) or values
        the configuration class rejects.
    """
    entry = registry.family(family)
    cls = entry.config_type()
    values = dict(entry.tiny_config)
    aliases = entry.aliases
    reference = cls()
    for key, value in parse_overrides(overrides).items():
        key = aliases.get(key, key)
        if key not in values and not hasattr(reference, key):
            raise ModelError(
                f"override {key!r} is not a field of {cls.__name__}; check the spelling (e.g. hidden_size=128)."
            )
        values[key] = value
    _check_sizes(family, values, entry.tiny_config, aliases)
    if entry.layer_pattern and "layer_types" not in values:
        n = int(values["num_hidden_layers"])
        values["layer_types"] = [entry.layer_pattern[i % len(entry.layer_pattern)] for i in range(n)]
    if entry.finish_config is not None:
        entry.finish_config(values)
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
