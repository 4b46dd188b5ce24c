"""Models: loading (``loading``), the family registry (``registry``) and one :class:`Adapter` per architecture family."""

from .adapter import Adapter, adapter_for
from .families import FAMILIES, build_random, family_of, random_config
from .loading import LoadedModel, embedded_models, init_like, load_model, series_checkpoints, supported_families
from .registry import Family, family, family_for_config

__all__ = [
    "FAMILIES",
    "Adapter",
    "Family",
    "LoadedModel",
    "adapter_for",
    "build_random",
    "embedded_models",
    "family",
    "family_for_config",
    "family_of",
    "init_like",
    "load_model",
    "random_config",
    "series_checkpoints",
    "supported_families",
]
