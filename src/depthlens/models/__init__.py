"""Models: loading (``loading``), the family registry (``registry``) and one :class:`Adapter` per
architecture family. Each module loads on first use of one of its names, so the light ones
(:mod:`~depthlens.models.methods`, the registry) load without torch."""

from ..lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["Adapter", "adapter_for"], ".adapter"),
    **dict.fromkeys(["BLOCK_MAP_FAMILIES", "FAMILIES", "build_random", "family_of", "random_config"], ".families"),
    **dict.fromkeys(["LoadedModel", "embedded_models", "load_model", "series_checkpoints", "supported_families"],
                    ".loading"),
    **dict.fromkeys(["init_like", "wrap_model"], ".in_memory"),
    **dict.fromkeys(["Family", "family", "family_for_config"], ".registry"),
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
