"""The docstring examples of every module of ``src/depthlens`` run and print what they show.

One test per module (packages included, ``__main__`` left out: running it is the CLI), run
with :func:`doctest.testmod`, as ``pytest --doctest-modules`` on ``src/`` would.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import depthlens


def _modules() -> list[str]:
    found = pkgutil.walk_packages(depthlens.__path__, prefix="depthlens.")
    return ["depthlens"] + sorted(info.name for info in found if not info.name.endswith("__main__"))


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed (output above)"
