"""Layering of the numerical core: ``depthlens.linalg`` stands on numpy, scipy and numba alone,
and every one of its modules says what it exports."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys

import pytest

import depthlens.linalg

#: Packages that importing the numerical core must not load.
FORBIDDEN = (
    "torch",
    "depthlens.models",
    "depthlens.attention",
    "depthlens.jacobian",
    "depthlens.topology",
    "depthlens.report",
)

MODULES = ["depthlens.linalg"] + [
    f"depthlens.linalg.{info.name}" for info in pkgutil.iter_modules(depthlens.linalg.__path__)
]


def test_linalg_imports_no_torch_and_no_model_side() -> None:
    code = "import depthlens.linalg, sys; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = ast.literal_eval(out)
    offending = [m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert not offending, f"import depthlens.linalg loaded {offending}"


@pytest.mark.parametrize("name", MODULES)
def test_module_declares_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list) and exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names {missing}, which it does not define"
