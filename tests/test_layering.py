"""Layering of the package: what importing each layer loads, and what each package (and
every module of the numerical core) exports. ``depthlens.models`` has its own test
(``tests/models/test_registry.py``), as has the report (``tests/report/test_html.py``)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import depthlens
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
    light = {"depthlens.models", "depthlens.models.methods"}  # the lazy package and the ablation methods' names
    assert [m for m in loaded if m not in light and any(m == h or m.startswith(h + ".") for h in heavy)] == []


def test_an_export_named_like_its_submodule_stays_the_export() -> None:
    """``depthlens.linalg.kreiss`` is both a submodule and the function it exports: once the
    submodule is imported, the lazy package must still hand out the function (the import
    system sets the package attribute to the module)."""
    code = ("import types, depthlens.linalg.kreiss; from depthlens.linalg import kreiss; import depthlens.linalg as la; "
            "print(isinstance(kreiss, types.FunctionType) and la.kreiss is kreiss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


# The package import graph --------------------------------------------------------------
#: Every package and top-level module of depthlens, by layer (lowest first). A module may
#: import from its own layer or below, and no two packages import each other, lazily or not
#: (imports under ``if TYPE_CHECKING:`` are for annotations and do not count). A new package or
#: top-level module gets a place here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "lazy", "interrupts", "drivers", "options", "environment", "allocator", "cache", "stats", "residual",
     "linalg"),
    ("schema",),
    ("runs",),
    ("executors", "models", "data", "revisions"),
    ("attention", "jacobian", "topology", "interventions", "contest", "lens"),
    ("report",),
    ("stages", "config"),
    ("workflow", "collection", "census", "sweep", "training"),
    ("api", "cli", "doctor", "precompile", "__main__", ""),
)
SRC = Path(depthlens.__file__).parent


def _node(module: str) -> str:
    """The graph node of a module: its package below ``depthlens`` or its top-level module."""
    parts = module.split(".")[1:]
    return parts[0] if parts else ""


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements under ``if TYPE_CHECKING:``."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for n in ast.walk(stmt)}


def import_edges() -> dict[tuple[str, str], list[str]]:
    """``{(node, imported node): [module importing it, ...]}`` over every module of the package."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = ["depthlens", *path.relative_to(SRC).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        base = module.split(".") if is_package else module.split(".")[:-1]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_only(tree)
        for node in ast.walk(tree):
            if node in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = ".".join([*base[:len(base) - node.level + 1], *([node.module] if node.module else [])]) \
                    if node.level else (node.module or "")
                # ``from . import x`` names submodules: the edge goes to each of them
                targets = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == "depthlens" and _node(target) != _node(module):
                    edges.setdefault((_node(module), _node(target)), []).append(module)
    return edges


def test_every_package_has_a_layer() -> None:
    placed = [name for layer in LAYERS for name in layer]
    nodes = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()} | {""}
    assert sorted(nodes - set(placed)) == [] and sorted(set(placed) - nodes) == []
    assert len(placed) == len(set(placed))


def test_no_package_imports_upward_or_in_a_circle() -> None:
    """``depthlens`` imports down its layers only: no package imports one above it, none
    imports another that imports it back (directly or around a circle)."""
    layer = {name: k for k, layer in enumerate(LAYERS) for name in layer}
    edges = import_edges()
    upward = [f"{a or 'depthlens'} -> {b} ({', '.join(sorted(set(m)))})" for (a, b), m in sorted(edges.items())
              if layer.get(b, -1) > layer.get(a, len(LAYERS))]
    assert upward == []
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    circles = []
    for start in graph:  # a depth-first search from each node for a path back to it
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    circles.append(" -> ".join(p or "depthlens" for p in (*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert circles == []


def test_no_stage_imports_another() -> None:
    """What two stages share lives in a module both import, never in one of the stages."""
    from depthlens.stages import STAGES

    stage_modules = {s.module for s in STAGES.values()}
    found = []
    for name in stage_modules:
        tree = ast.parse(Path(importlib.util.find_spec(name).origin).read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {f"depthlens.stages.{n.module}" for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
        found += [f"{name} imports {other}" for other in stage_modules - {name} if other in imported]
    assert found == []


#: Source files over the 600-line limit that are declarative data, and why.
DECLARATIVE = {"schema.py": "the declarations of every table, column, summary and array file"}


def test_no_source_file_over_600_lines() -> None:
    lengths = {str(p.relative_to(SRC)): len(p.read_text(encoding="utf-8").splitlines()) for p in SRC.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > 600 and name not in DECLARATIVE} == {}


def test_dir_and_tab_completion_offer_the_public_api() -> None:
    """``dir(depthlens)`` is ``__all__`` (no helper the package imports, such as ``sys``), loads
    nothing, and completing ``depthlens.`` offers every public name."""
    code = ("import depthlens, rlcompleter, sys\n"
            "names = dir(depthlens)\n"
            "loaded = sorted(m for m in ('torch', 'depthlens.api') if m in sys.modules)\n"
            "complete = rlcompleter.Completer({'depthlens': depthlens}).complete\n"
            "found = []\n"
            "while (match := complete('depthlens.', len(found))) is not None:\n"
            "    found.append(match.removeprefix('depthlens.').rstrip('('))\n"
            "print([names, loaded, sorted(found), sorted(depthlens.__all__)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, loaded, found, exported = ast.literal_eval(out.strip().splitlines()[-1])
    assert names == exported and loaded == []
    assert found == [n for n in exported if not n.startswith("_")]
    assert {"analyse", "open_run", "Run"} <= set(found)
    assert not {"Any", "sys", "types"} & set(names)
