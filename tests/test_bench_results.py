"""``benchmarks/RESULTS.md``'s writer (``benchmarks/_results.py``): a run of some benchmarks
replaces their sections and keeps the others; no benchmark is run here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_results", ROOT / "benchmarks" / "_results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_results"] = module
    spec.loader.exec_module(module)
    return module


def _section(results: ModuleType, name: str, output: str, seconds: float = 1.0, status: int = 0) -> object:
    return results.Section(name, "2000-01-01 00:00 UTC", "cpu: Test CPU (x86_64) cores 2\nopenblas 0.3 threads 1",
                           seconds, status, output)


def test_a_subset_replaces_its_sections_and_keeps_the_others(results, tmp_path):
    path = tmp_path / "RESULTS.md"
    results.write_results([_section(results, "quick", "quick: 70 s"), _section(results, "startup", "help 0.2 s"),
                           _section(results, "norms", "ratio 9x")], path)
    first = path.read_text()
    assert list(results.parse_sections(first)) == ["norms", "quick", "startup"]  # name order
    results.write_results([_section(results, "startup", "help 0.1 s", seconds=2.5),
                           _section(results, "sigma", "ratio 120x", status=1)], path)
    second = results.parse_sections(path.read_text())
    assert list(second) == ["norms", "quick", "sigma", "startup"]
    old = results.parse_sections(first)
    assert second["norms"] == old["norms"] and second["quick"] == old["quick"]  # kept byte for byte
    assert "help 0.1 s" in second["startup"] and "help 0.2 s" not in second["startup"]
    assert "wall 2.5 s, exit status 0" in second["startup"] and "exit status 1" in second["sigma"]
    assert "cpu: Test CPU (x86_64) cores 2" in second["sigma"] and "2000-01-01 00:00 UTC" in second["sigma"]
    text = path.read_text()
    assert text.startswith("# Benchmark results") and text.count("# Benchmark results") == 1
    assert "| [`bench_startup`](#bench_startup) | 2000-01-01 00:00 UTC | 2.5 s | 0 |" in text
    assert "| [`bench_sigma`](#bench_sigma) | 2000-01-01 00:00 UTC | 1.0 s | 1 |" in text
    assert results.merge(text, []) == text  # merging nothing changes nothing
    assert not list(tmp_path.glob(".*.tmp"))


def test_output_is_kept_as_a_terminal_shows_it(results):
    raw = "start\r\n 10%|#  \r 100%|####|\n\x1b[1mbold\x1b[0m\n```inner fence```\n"
    assert results.clean_output(raw) == "start\n 100%|####|\nbold\n```inner fence```"
    block = results.render_section(_section(results, "x", results.clean_output(raw)))
    assert "````text\nstart" in block  # a fence longer than the output's own
    assert results.parse_sections(block)["x"] == block
    assert "(no output)" in results.render_section(_section(results, "y", ""))


def test_run_all_refuses_an_unknown_name(results, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
        assert spec is not None and spec.loader is not None
        run_all = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_all)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert run_all.main(["no_such_benchmark", "--no-results"]) == 2
    assert "unknown benchmark no_such_benchmark" in capsys.readouterr().err
