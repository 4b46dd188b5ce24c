"""depthlens: a trained transformer language model as a dynamical system over depth.

The Python API (:mod:`depthlens.api`) is imported on first use, so ``import depthlens`` stays
light::

    import depthlens
    run = depthlens.analyse("random:llama", preset="quick", stages=["attention"])
    run.heads  # a pandas DataFrame
"""

import sys as _sys
import types as _types

__version__ = "0.1.0"

__all__ = ["Run", "RunConfig", "__version__", "analyse", "census", "open_run", "sweep"]
_API = ("Run", "analyse", "census", "open_run", "sweep")


class _Package(_types.ModuleType):
    """This package's module type. ``census`` and ``sweep`` name both an API function and a
    subpackage; importing a subpackage binds it to the parent's attribute, which would hide
    the function. The binding is dropped here, so ``depthlens.census`` stays the function
    (the subpackages are imported by their full names, through ``sys.modules``)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _API and isinstance(value, _types.ModuleType):
            return
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> object:
    if name in _API:
        from . import api

        return getattr(api, name)
    if name == "RunConfig":
        from .config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'depthlens' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (``__all__``): what ``dir(depthlens)`` and tab completion list."""
    return sorted(__all__)
