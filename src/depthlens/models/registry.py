"""The registry of architecture families: one :class:`Family` record per architecture.

A *family* groups Hugging Face ``model_type`` values whose decoder layers have the same
shape of computation (norm placement, attention projections, position encoding), so one
:class:`~depthlens.models.adapter.Adapter` subclass serves all of them. Each family is
declared by the module of its adapter (``ENTRIES``, next to the adapter class); the modules
are listed once below, in :data:`BUILTIN_MODULES`, and imported on the first look-up.

============  ==========================================  ===================================
family        model_type values                           notes
============  ==========================================  ===================================
``llama``     ``llama``, ``mistral``, ``qwen2``           pre-RMSNorm, RoPE, GQA, SwiGLU
``gemma3``    ``gemma3_text`` (and multimodal ``gemma3``)  sandwich norms, q/k norms, sliding
``gpt2``      ``gpt2``                                    pre-LayerNorm, learned positions
``gpt_neox``  ``gpt_neox`` (Pythia)                       partial RoPE, parallel residual
``olmo2``     ``olmo2``                                   post-norms, q/k norms on full width
``olmo3``     ``olmo3``                                   as olmo2 plus sliding layers
``gemma4``    ``gemma4_text`` (and multimodal ``gemma4``)  per-layer shapes, shared keys and
                                                          values, per-layer inputs, three
                                                          sub-layers a layer
============  ==========================================  ===================================

Adding an architecture: write ``models/<name>.py`` with its adapter subclass and
``ENTRIES = (Family(...),)``, and add the module's name to :data:`BUILTIN_MODULES`.

Examples
--------
>>> from depthlens.models.registry import family, family_for_config
>>> import transformers
>>> family_for_config(transformers.MistralConfig()).name
'llama'
>>> family("gpt2").adapter.__name__
'GPT2Adapter'
"""

from __future__ import annotations

import dataclasses
import importlib
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ModelError

if TYPE_CHECKING:
    from .adapter import Adapter

__all__ = [
    "BUILTIN_MODULES", "TINY_COMMON", "Family", "families", "family", "family_for_config",
    "register", "text_config",
]

#: The modules (in :mod:`depthlens.models`) that declare the built-in families in their
#: ``ENTRIES``, in the order :func:`families` lists them. A new architecture adds one line.
BUILTIN_MODULES: tuple[str, ...] = (
    "llama",
    "gemma3",
    "gpt2",
    "gpt_neox",
    "olmo",
    "gemma4",
)

#: Configuration fields most tiny random models share (width 64, 2 layers, 4 heads,
#: vocabulary 256, 256 positions, BOS id 0, untied embeddings).
TINY_COMMON: Mapping[str, Any] = types.MappingProxyType({
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
})


@dataclasses.dataclass(frozen=True)
class Family:
    """One architecture family: what recognises it, builds a tiny one, and wraps it.

    Attributes
    ----------
    name : str
        The family name (``--model random:<name>``, ``Adapter.family``).
    model_types : tuple of str
        Hugging Face ``model_type`` values of the family.
    config_class : str
        Name of the ``transformers`` configuration class of tiny random models (resolved on
        use by :meth:`config_type`, so registering imports no ``transformers`` modules).
    tiny_config : mapping
        Keyword arguments of ``config_class`` for the tiny random model written in code.
    adapter : type
        The :class:`~depthlens.models.adapter.Adapter` subclass for the family's models.
    layer_pattern : tuple of str
        ``layer_types`` repeated over depth in tiny configurations (sliding-window families);
        empty when the family has no per-layer types.
    aliases : mapping
        Common field names -> the family's spelling (GPT-2: ``hidden_size`` -> ``n_embd``),
        for overrides of tiny configurations.
    wrapper_types : tuple of str
        ``model_type`` values whose configuration nests the language model's configuration
        in ``text_config`` (multimodal wrappers).
    finish_config : callable, optional
        ``f(values)`` editing the keyword arguments in place just before the configuration
        class is called (e.g. GPT-NeoX turns ``rotary_pct`` into ``rope_parameters``).
    """

    name: str
    model_types: tuple[str, ...]
    config_class: str
    tiny_config: Mapping[str, Any]
    adapter: type[Adapter]
    layer_pattern: tuple[str, ...] = ()
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    wrapper_types: tuple[str, ...] = ()
    finish_config: Callable[[dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        for name in ("tiny_config", "aliases"):  # read-only views: an entry cannot be edited
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name))))
        if not self.model_types:
            raise ModelError(f"family {self.name!r} lists no model_type.")

    def config_type(self) -> type:
        """The ``transformers`` configuration class named by :attr:`config_class`."""
        import transformers

        return getattr(transformers, self.config_class)


_ENTRIES: dict[str, Family] = {}
_BY_MODEL_TYPE: dict[str, Family] = {}
_loaded = False


def _load_builtin() -> None:
    """Register the entries of :data:`BUILTIN_MODULES` once, in order."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        for entry in importlib.import_module(f"{__package__}.{module}").ENTRIES:
            _add(entry)


def _add(entry: Family) -> None:
    if entry.name in _ENTRIES:
        raise ModelError(f"family {entry.name!r} is registered twice.")
    taken = [t for t in entry.model_types if t in _BY_MODEL_TYPE]
    if taken:
        raise ModelError(f"model_type {taken[0]!r} of family {entry.name!r} already belongs to "
                         f"family {_BY_MODEL_TYPE[taken[0]].name!r}.")
    _ENTRIES[entry.name] = entry
    for model_type in entry.model_types:
        _BY_MODEL_TYPE[model_type] = entry


def register(entry: Family) -> Family:
    """Add ``entry`` to the registry (after the built-in families) and return it.

    Raises
    ------
    ModelError
        If its name or one of its model types is registered already.
    """
    _load_builtin()
    _add(entry)
    return entry


def families() -> tuple[Family, ...]:
    """Every registered family, built-in ones first in :data:`BUILTIN_MODULES` order."""
    _load_builtin()
    return tuple(_ENTRIES.values())


def _supported() -> str:
    """``llama (llama/mistral/qwen2), gemma3 (...), ...``: the families and their model types."""
    return ", ".join(f"{e.name} ({'/'.join(e.model_types)})" for e in families())


def family(name: str) -> Family:
    """The :class:`Family` called ``name``.

    Raises
    ------
    ModelError
        If no family has that name (the message lists the registered ones).
    """
    _load_builtin()
    entry = _ENTRIES.get(name)
    if entry is None:
        raise ModelError(f"unknown family {name!r}; choose one of {', '.join(_ENTRIES)}.")
    return entry


def text_config(config: Any) -> Any:
    """The configuration of the language model inside ``config`` (itself for text-only models)."""
    _load_builtin()
    inner = getattr(config, "text_config", None)
    entry = _BY_MODEL_TYPE.get(getattr(config, "model_type", None))
    if inner is not None and entry is not None and config.model_type in entry.wrapper_types:
        return inner
    return config


def family_for_config(config: Any) -> Family:
    """The :class:`Family` of a transformers configuration (``model.config``).

    Raises
    ------
    ModelError
        If the configuration has no ``model_type``; if the model is bidirectional (an
        encoder, an encoder-decoder, or a decoder configured with bidirectional attention):
        depthlens needs a causal language model; if the ``model_type`` belongs to no
        registered family (the message names the supported ones).
    """
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise ModelError(
            f"the configuration {type(config).__name__} has no model_type; pass a Hugging Face causal LM config."
        )
    _load_builtin()
    entry = _BY_MODEL_TYPE.get(model_type)
    if entry is not None:
        bidirectional = getattr(text_config(config), "use_bidirectional_attention", False)
        if bidirectional is True or bidirectional == "all":  # Gemma 4's "vision" keeps text causal
            raise ModelError(
                f"model_type {model_type!r} is configured with bidirectional attention "
                f"(use_bidirectional_attention={bidirectional!r}); depthlens needs a causal LM."
            )
        return entry
    if _is_bidirectional(config):
        raise ModelError(
            f"model_type {model_type!r} is a bidirectional (encoder or encoder-decoder) model; "
            f"depthlens needs a causal LM, one of the families {_supported()}."
        )
    raise ModelError(f"model_type {model_type!r} is not supported; supported families: {_supported()}.")


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
