"""The column reference: the committed ``docs/`` pages are what :mod:`depthlens.columns`
generates, and every column of every table a real (tiny) run writes is described there and in
the report's glossaries."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from depthlens.cli import main
from depthlens.columns import COLUMNS, STAGES, TABLES, describe, pages, stage_of
from depthlens.columns import main as columns_main

DOCS = Path(__file__).resolve().parents[1] / "docs"
SMALL = ["--chunks", "3", "--seq-len", "24", "--null-samples", "2", "--null-chunks", "2", "--extras-chunks", "1",
         "--probe-seqs", "4", "--probe-len", "8", "--n-perm", "50", "--jobs", "1", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """Every stage of a tiny random Llama on simple sentences (about 20 s)."""
    out = tmp_path_factory.mktemp("columns") / "run"
    assert main(["run", "--model", "random:llama", "--text", str(text_file), *SMALL, "--out", str(out)]) == 0
    return out


def test_committed_docs_equal_the_generated_pages():
    expected = pages()
    assert set(expected) == {"README.md", *(f"{stage}.md" for stage in STAGES)}
    committed = {p.name for p in DOCS.glob("*.md")}
    assert committed == set(expected), "regenerate with: python -m depthlens.columns docs/"
    for name, text in expected.items():
        assert (DOCS / name).read_text(encoding="utf-8") == text, (
            f"docs/{name} is stale; regenerate with: python -m depthlens.columns docs/")


def test_generator_command_writes_the_pages(tmp_path, capsys):
    assert columns_main([str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(pages())
    assert columns_main(["--help"]) == 2


def test_description_is_well_formed():
    assert list(COLUMNS) == list(STAGES)
    for stage, tables in COLUMNS.items():
        for table, columns in tables.items():
            assert stage_of(table) == stage and TABLES[table]
            for name, col in columns.items():
                assert col.definition.strip() and col.unit.strip(), (table, name)
    for table, name in (("heads", "TR4@0.01"), ("head_chunks", "psr_B@0.1"), ("heads", "kreiss_B_upper"),
                        ("operators", "henrici_update_rel"), ("operators", "erank"), ("head_chunks", "failure")):
        assert describe(table, name) is not None
    assert "LAPACK" in describe("head_chunks", "failure").definition


def test_every_column_of_a_real_run_is_described(run):
    written = sorted((run / "tables").glob("*.parquet"))
    assert {p.stem for p in written} == set(TABLES)  # every table of every stage, and no other
    missing = [f"{p.stem}.{c}" for p in written for c in pd.read_parquet(p).columns if describe(p.stem, c) is None]
    assert missing == [], "describe these in src/depthlens/columns.py, then regenerate docs/"
    report = (run / "report.html").read_text(encoding="utf-8")
    assert "<i>not described</i>" not in report
    for p in written:
        assert f'id="table-{p.stem}"' in report and f'href="docs/{stage_of(p.stem)}.md#{p.stem}"' in report
    assert (run / "docs" / "attention.md").read_text(encoding="utf-8") == pages()["attention.md"]
