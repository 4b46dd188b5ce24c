"""Layering of the package: what importing each layer loads, and what each package (and
every module of the numerical core) exports. ``depthlens.models`` has its own test
(``tests/models/test_registry.py``), as has the report (``tests/report/test_html.py``)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys

import pytest

import depthlens.linalg

PACKAGES = ["depthlens", "depthlens.attention", "depthlens.contest", "depthlens.interventions", "depthlens.jacobian",
            "depthlens.linalg", "depthlens.models", "depthlens.report", "depthlens.runs", "depthlens.topology"]
#: Every module of the numerical core declares its exports too.
LINALG_MODULES = [f"depthlens.linalg.{info.name}" for info in pkgutil.iter_modules(depthlens.linalg.__path__)]


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}; import sys; print(sorted(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


@pytest.mark.parametrize("name", PACKAGES + LINALG_MODULES)
def test_package_declares_what_it_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list) and exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    assert all(getattr(module, n, None) is not None for n in exported), name


def test_linalg_loads_no_torch_and_no_model_side() -> None:
    """The numerical core stands on numpy, scipy and numba alone."""
    forbidden = ("torch", "depthlens.models", "depthlens.attention", "depthlens.jacobian", "depthlens.topology",
                 "depthlens.report")
    loaded = _loaded("import depthlens.linalg")
    assert [m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)] == []


def test_import_depthlens_is_light() -> None:
    """``import depthlens`` loads neither torch nor any stage: the API loads on first use."""
    loaded = _loaded("import depthlens")
    heavy = [m for m in loaded if m == "torch" or m.startswith(("depthlens.api", "depthlens.workflow",
                                                               "depthlens.attention", "depthlens.jacobian"))]
    assert heavy == []


def test_schema_and_options_stand_alone() -> None:
    """The output schema and the option machinery import no model, stage or torch code, so
    the report and the tests' synthetic runs read them without the analysis."""
    loaded = _loaded("import depthlens.schema, depthlens.options")
    assert [m for m in loaded if m == "torch" or m.startswith(("depthlens.models", "depthlens.attention",
                                                               "depthlens.jacobian", "depthlens.topology"))] == []


def test_the_command_line_reads_its_arguments_before_the_analysis_loads() -> None:
    """``depthlens --help`` (and every option table) loads no torch, pandas, scipy or numba,
    nor any stage's numerics: it took 4.5–7 s when the configuration imported them
    (``benchmarks/bench_startup.py`` measures the start)."""
    loaded = _loaded("import depthlens.cli, depthlens.config; depthlens.cli.build_parser()")
    heavy = ("torch", "pandas", "scipy", "numba", "igraph", "leidenalg", "sklearn", "depthlens.models",
             "depthlens.linalg.schur", "depthlens.jacobian.cumulative", "depthlens.topology.communities",
             "depthlens.attention.roles", "depthlens.runs.directory", "depthlens.workflow")
    assert [m for m in loaded if any(m == h or m.startswith(h + ".") for h in heavy)] == []


def test_an_export_named_like_its_submodule_stays_the_export() -> None:
    """``depthlens.linalg.kreiss`` is both a submodule and the function it exports: once the
    submodule is imported, the lazy package must still hand out the function (the import
    system sets the package attribute to the module)."""
    code = ("import types, depthlens.linalg.kreiss; from depthlens.linalg import kreiss; import depthlens.linalg as la; "
            "print(isinstance(kreiss, types.FunctionType) and la.kreiss is kreiss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
