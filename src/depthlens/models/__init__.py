"""Models: loading (``loading``) and one :class:`Adapter` per architecture family."""

from .adapter import Adapter, adapter_for
from .families import FAMILIES, build_random, family_of, random_config
from .loading import LoadedModel, embedded_models, init_like, load_model, supported_families

__all__ = [
    "FAMILIES",
    "Adapter",
    "LoadedModel",
    "adapter_for",
    "build_random",
    "embedded_models",
    "family_of",
    "init_like",
    "load_model",
    "random_config",
    "supported_families",
]
