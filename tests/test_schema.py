"""The output schema: the committed ``docs/`` pages are what :mod:`depthlens.schema`
generates, and every table, summary and array file a real (tiny) run writes matches its
declaration there (identity and key columns, every column described, in the report's
glossaries too)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from depthlens.cli import main
from depthlens.report.docs import pages
from depthlens.schema import (ARRAYS, COLUMNS, IDENTITY, SCHEMA, PRODUCERS, SUMMARIES, TABLES, SchemaError, check_table,
                              describe, producer, stage_of)
from depthlens.stages import STAGES, run_stages
from depthlens.report.docs import main as columns_main

DOCS = Path(__file__).resolve().parents[1] / "docs"
SMALL = ["--chunks", "3", "--seq-len", "24", "--null-samples", "2", "--null-chunks", "2", "--extras-chunks", "1",
         "--probe-seqs", "4", "--probe-len", "8", "--n-perm", "50", "--heldout-chunks", "1", "--ablation-boot", "50",
         "--clamp-chunks", "2", "--control-seeds", "1", "--clamp-null-samples", "1", "--contest-chunks", "2",
         "--contest-boot", "50", "--contest-perm", "50", "--jobs", "1", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> Path:
    """Every stage of a tiny random Llama on simple sentences (about 20 s)."""
    out = tmp_path_factory.mktemp("columns") / "run"
    assert main(["run", "--model", "random:llama", "--text", str(text_file), *SMALL, "--out", str(out)]) == 0
    return out


def test_committed_docs_equal_the_generated_pages():
    expected = pages()
    assert set(expected) == {"README.md", "methods.md", *(f"{stage}.md" for stage in PRODUCERS)}
    committed = {p.name for p in DOCS.glob("*.md")}
    assert committed == set(expected), "regenerate with: python -m depthlens.report.docs docs/"
    for name, text in expected.items():
        assert (DOCS / name).read_text(encoding="utf-8") == text, (
            f"docs/{name} is stale; regenerate with: python -m depthlens.report.docs docs/")


def test_generator_command_writes_the_pages(tmp_path, capsys):
    assert columns_main([str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(pages())
    assert columns_main(["--help"]) == 2


def test_schema_is_one_place_per_fact():
    # every stage has its outputs declared, and so have the commands beside the stages (train, census)
    assert set(PRODUCERS) == set(STAGES) | {"train", "census", "sweep"}
    for name, table in SCHEMA.items():
        assert list(table.columns)[:len(IDENTITY)] == list(IDENTITY), name
        assert set(table.keys) <= set(table.columns) and set(table.optional) <= set(table.columns), name
        assert producer(name) == stage_of(name) == table.stage
    assert producer("attention.json") == "attention" and producer("arrays/jacobians_init_isolated") == "jacobian"
    assert producer("interventions.json") == "clamp" and producer("nothing") is None


def test_check_table_refuses_what_differs_from_the_declaration():
    good = pd.DataFrame({"model": ["m"], "revision": [""], "text": ["t"], "checkpoint": ["trained"], "layer": [0],
                         "head": [1], "prev_token_score": [0.1]})
    check_table("head_probe", good)
    with pytest.raises(SchemaError, match="identity columns"):
        check_table("head_probe", good.drop(columns="text"))
    with pytest.raises(SchemaError, match="missing key columns \\['head'\\]"):
        check_table("head_probe", good.drop(columns="head"))
    with pytest.raises(SchemaError, match="undeclared columns \\['extra'\\]"):
        check_table("head_probe", good.assign(extra=1))
    with pytest.raises(SchemaError, match="not declared"):
        check_table("no_such_table", good)


def test_description_is_well_formed():
    assert list(COLUMNS) == list(PRODUCERS)
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
    staged = {name for name in TABLES if stage_of(name) in run_stages()}
    assert {p.stem for p in written} == staged  # every table of every stage, and no other
    missing = [f"{p.stem}.{c}" for p in written for c in pd.read_parquet(p).columns if describe(p.stem, c) is None]
    assert missing == [], "describe these in src/depthlens/schema.py, then regenerate docs/"
    text = json.loads((run / "manifest.json").read_text())["config"]["text"]
    for p in written:  # identity first, every key, no undeclared column, and every declared column
        table = pd.read_parquet(p)
        check_table(p.stem, table)
        assert list(table.columns) == [c for c in SCHEMA[p.stem].columns if c in table.columns]
        assert set(SCHEMA[p.stem].columns) - set(table.columns) <= set(SCHEMA[p.stem].optional), p.stem
        # a random model has no massive activation and no routing head
        if p.stem not in ("massive", "clamp", "clamp_heads", "clamp_dims", "induction_seqs"):
            assert set(table["text"]) == {text} and set(table["model"]) == {"random:llama"}, p.stem
    for summary in SUMMARIES.values():
        assert (run / summary.file).is_file() == (summary.stage in STAGES), summary.name
    arrays = {p.stem for p in (run / "arrays").glob("*.safetensors")}
    assert {producer(f"arrays/{a}") for a in arrays} == {a.stage for a in ARRAYS.values() if a.stage in run_stages()}
    report = (run / "report.html").read_text(encoding="utf-8")
    assert "<i>not described</i>" not in report
    for p in written:
        assert f'id="table-{p.stem}"' in report and f'href="docs/{stage_of(p.stem)}.md#{p.stem}"' in report
    assert (run / "docs" / "attention.md").read_text(encoding="utf-8") == pages()["attention.md"]
