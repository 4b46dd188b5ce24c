"""Cached copies of decoder layers' weights for the Jacobian engines.

The engines never call the Hugging Face modules: they evaluate the sub-layers from the
:class:`~depthlens.models.weights.LayerWeights` each adapter extracts
(:meth:`~depthlens.models.adapter.Adapter.layer_weights`). Copies are cached per adapter
(weakly, so they die with the adapter) and per dtype.
"""

from __future__ import annotations

import weakref

import torch

from ..models.adapter import Adapter
from ..models.weights import LayerWeights

__all__ = ["clear_cache", "layer_ops"]

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layer_ops(adapter: Adapter, layer: int, dtype: torch.dtype = torch.float64) -> LayerWeights:
    """The cached :class:`~depthlens.models.weights.LayerWeights` of ``layer`` in ``dtype`` on the adapter's device.

    Memory: about ``itemsize x (parameters of the layer)`` per cached layer (float64 copies of
    all of SmolLM2-135M's layers take ~0.9 GB). A layer-streamed model
    (:mod:`depthlens.models.streaming`) keeps one cached layer, as it keeps one layer of
    weights. :func:`clear_cache` drops them.
    """
    per = _CACHE.setdefault(adapter, {})
    key = (layer, dtype)
    ops = per.get(key)
    if ops is None:
        if adapter.streamer is not None:
            per.clear()
        ops = adapter.layer_weights(layer, dtype)
        per[key] = ops
    return ops


def clear_cache(adapter: Adapter | None = None) -> None:
    """Forget cached weight copies (of one adapter, or of all)."""
    if adapter is None:
        _CACHE.clear()
    else:
        _CACHE.pop(adapter, None)
