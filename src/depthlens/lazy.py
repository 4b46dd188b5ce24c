"""Packages that load their modules on first use.

A package's ``__init__`` that imports every module makes importing any one of them (its light
``options`` module, say) load them all: the stages' numerics, torch. :func:`lazy_exports`
gives a package the module-level ``__getattr__`` and ``__dir__`` (PEP 562) that import an
exported name's module only when the name is first read.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose public names live in its submodules.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    exports : mapping of str to str
        Public name -> the submodule (relative, e.g. ``".cumulative"``) that defines it.

    Examples
    --------
    >>> get, names = lazy_exports("depthlens", {"InputError": ".errors"})
    >>> get("InputError").__name__, names()
    ('InputError', ['InputError'])
    """
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module, package), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    holder = sys.modules.get(package)
    if holder is not None and type(holder) is types.ModuleType:
        holder.__class__ = _ExportsFirst
    return __getattr__, __dir__


class _ExportsFirst(types.ModuleType):
    """A package whose exported names win over its submodules of the same name: importing
    the submodule ``kreiss`` sets the package attribute ``kreiss`` to that module, which would
    hide the exported function :func:`kreiss` from the lazy ``__getattr__``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}"
                and name in getattr(self, "__all__", ())):
            return  # the submodule stays in sys.modules; the exported name resolves lazily
        super().__setattr__(name, value)
