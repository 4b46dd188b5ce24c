"""The same checks over every stage in the registry (:data:`depthlens.stages.STAGES`), in the
manner of scikit-learn's ``parametrize_with_checks``: a stage gets all of them by being
registered. On a tiny random Llama:

- every table the stage writes is declared for it in :mod:`depthlens.schema`, in its form;
- two worker processes give the tables of one, bit for bit;
- a run interrupted at the stage's second unit (Ctrl-C) and resumed gives the tables of an
  uninterrupted run, bit for bit;
- a bad value of one of its options (or a chunk too short for it) exits 2 with one line and
  writes nothing;
- ``depthlens STAGE --help`` lists its own options and those of the stages it runs first,
  no other stage's.

A stage registered from outside (:func:`depthlens.stages.register`, here the toy stage of
``toy_stage.py``) passes the same checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch

from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.data import as_chunks
from depthlens.errors import InputError
from depthlens.executors import Execution
from depthlens.options import flag_name, option_fields
from depthlens.runs import RunDirectory, RunMode, read_manifest
from depthlens.schema import SCHEMA
from depthlens.stages import STAGES, register, with_requirements
from depthlens.workflow import prepare, run

from . import toy_stage

pytestmark = pytest.mark.full_leg

TEXT = " ".join(f"Line {i} of a text about subject {i % 11}, with detail {i % 3}." for i in range(300))
#: The tiny run every check uses (every stage can run at these sizes; the lens keeps 13 of 16 positions).
SIZES = {"model": "random:llama", "chunks": 4, "seq_len": 16, "batch_size": 2, "preset": "quick", "seed": 0,
         "lens_skip_first": 2}


def _config(text: Path) -> RunConfig:
    return RunConfig(text=str(text), **SIZES)


def _tables(root: Path, stage: str) -> dict[str, pd.DataFrame]:
    """The tables of ``root`` that ``stage`` writes."""
    return {p.stem: pd.read_parquet(p) for p in sorted((root / "tables").glob("*.parquet"))
            if SCHEMA.get(p.stem) is not None and SCHEMA[p.stem].stage == stage}


def _assert_same_tables(got: dict[str, pd.DataFrame], expected: dict[str, pd.DataFrame]) -> None:
    assert sorted(got) == sorted(expected)
    for name in expected:
        pd.testing.assert_frame_equal(got[name], expected[name], check_exact=True, obj=name)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("conformance") / "text.txt"
    path.write_text(TEXT)
    return path


def _runs(folder: Path, text: Path, stages: tuple[str, ...]) -> tuple[Path, Path]:
    """``stages`` run uninterrupted on one process and on two worker processes."""
    one, two = folder / "one", folder / "two"
    run(_config(text), one, stages=stages, execution=Execution(quiet=True, jobs=1))
    run(_config(text), two, stages=stages, execution=Execution(quiet=True, jobs=2))
    return one, two


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, text: Path) -> tuple[Path, Path]:
    """Every registered stage, on one process and on two."""
    return _runs(tmp_path_factory.mktemp("reference"), text, tuple(STAGES))


def check_tables_declared(stage: str, one: Path) -> None:
    """Every table the stage writes is declared for it, with its columns in declared order."""
    tables = _tables(one, stage)
    assert tables, f"the {stage} stage wrote no table"
    for name, table in tables.items():
        assert list(table.columns) == [c for c in SCHEMA[name].columns if c in table.columns], name
    assert [p.stem for p in (one / "tables").glob("*.parquet") if p.stem not in SCHEMA] == []


def check_two_workers(stage: str, one: Path, two: Path) -> None:
    """Two worker processes give the tables of one, bit for bit."""
    _assert_same_tables(_tables(two, stage), _tables(one, stage))


@contextlib.contextmanager
def _interrupt_at_unit(stage: str, k: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Ctrl-C as ``stage`` stores its ``k``-th unit; yields the keys it stored before that."""
    stored: list[str] = []
    write = RunDirectory.write_unit

    def interrupted(self: RunDirectory, unit_stage: str, key: str, tables: dict) -> None:
        if unit_stage == stage:
            if len(stored) + 1 == k:
                raise KeyboardInterrupt
            stored.append(key)
        write(self, unit_stage, key, tables)

    with monkeypatch.context() as patch:
        patch.setattr(RunDirectory, "write_unit", interrupted)
        yield stored


def check_resume(stage: str, one: Path, text: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted as it stores its second unit, then resumed: the tables of an uninterrupted run."""
    plan = tuple(with_requirements([stage], _config(text)))
    out = folder / "interrupted"
    with _interrupt_at_unit(stage, 2, monkeypatch) as stored, pytest.raises(KeyboardInterrupt):
        run(_config(text), out, stages=plan, execution=Execution(quiet=True, jobs=1))
    assert len(stored) == 1, f"the {stage} stage stored {len(stored)} unit(s) before the interrupt, not 1"
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled(), "the interrupt left torch's grad mode off"
    assert read_manifest(out)["stages"][stage]["status"] == "interrupted"
    run(_config(text), out, run_mode=RunMode.RESUME, stages=plan, execution=Execution(quiet=True, jobs=1))
    _assert_same_tables(_tables(out, stage), _tables(one, stage))


def _bad_option(stage: str) -> list[str]:
    """Flags with a value the stage refuses: its first option with a minimum, one below it, or
    (a stage without such options) a chunk of one token, shorter than any stage takes."""
    for f in option_fields(STAGES[stage].options):
        if f.is_flag and f.metadata.get("min") is not None:
            return [flag_name(f.name), str(f.metadata["min"] - 1)]
    return ["--seq-len", "1"]


def check_bad_option(stage: str, text: Path, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A value the stage refuses: exit 2, one line naming the flag, nothing written."""
    out = folder / "refused"
    bad = _bad_option(stage)
    capsys.readouterr()
    assert main([stage, "--model", "random:llama", "--text", str(text), "--chunks", "4", "--seq-len", "16", *bad,
                 "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and bad[0] in err[0], err
    assert not out.exists()


def _flags(stage: str) -> set[str]:
    return {flag_name(f.name) for f in option_fields(STAGES[stage].options) if f.is_flag}


def check_help(stage: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``depthlens STAGE --help`` lists its options and its requirements', no other stage's."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([stage, "--help"])
    assert stop.value.code == 0
    shown = set(re.findall(r"(--[a-z0-9-]+)", capsys.readouterr().out))
    own = set().union(*(_flags(s) for s in with_requirements([stage])))
    others = set().union(*(_flags(s) for s in STAGES)) - own
    assert own <= shown and shown & others == set()


@pytest.mark.parametrize("stage", list(STAGES))
def test_its_tables_are_declared_for_it(stage: str, reference: tuple[Path, Path]) -> None:
    check_tables_declared(stage, reference[0])


@pytest.mark.parametrize("stage", list(STAGES))
def test_two_workers_give_the_tables_of_one(stage: str, reference: tuple[Path, Path]) -> None:
    check_two_workers(stage, *reference)


@pytest.mark.parametrize("stage", list(STAGES))
def test_an_interrupted_and_resumed_stage_gives_the_same_tables(stage: str, reference: tuple[Path, Path], text: Path,
                                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_resume(stage, reference[0], text, tmp_path, monkeypatch)


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_bad_option_exits_2_and_writes_nothing(stage: str, text: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    check_bad_option(stage, text, tmp_path, capsys)


@pytest.mark.parametrize("stage", list(STAGES))
def test_its_help_lists_its_options_and_no_other_stages(stage: str, capsys: pytest.CaptureFixture[str]) -> None:
    check_help(stage, capsys)


@contextlib.contextmanager
def _registered_toy() -> Iterator[str]:
    """The toy stage registered with its table declared; both removed afterwards."""
    from depthlens import schema

    register(toy_stage.STAGE)
    schema.declare(toy_stage.NAME, "a test of the stage protocol", toy_stage.TABLES)
    try:
        yield toy_stage.NAME
    finally:
        del STAGES[toy_stage.NAME], schema.PRODUCERS[toy_stage.NAME], schema.COLUMNS[toy_stage.NAME]
        for name in toy_stage.TABLES:
            del schema.SCHEMA[name], schema.TABLES[name]


def test_a_registered_stage_passes_every_check(text: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with _registered_toy() as stage:
        assert list(STAGES)[-1] == stage and stage in with_requirements(list(STAGES))
        one, two = _runs(tmp_path, text, (stage,))
        table = _tables(one, stage)["toy_chunks"]
        ids = as_chunks(prepare(_config(text)).chunks).ids.numpy()  # the run's chunks, counted here
        assert table["distinct_tokens"].tolist() == [len(set(row.tolist())) for row in ids]
        check_tables_declared(stage, one)
        check_two_workers(stage, one, two)
        check_resume(stage, one, text, tmp_path, monkeypatch)
        check_bad_option(stage, text, tmp_path, capsys)
        check_help(stage, capsys)
    assert stage not in STAGES


def test_register_refuses_a_taken_name_and_an_unknown_requirement() -> None:
    with pytest.raises(InputError, match="a stage called 'attention' exists already"):
        register(dataclasses.replace(toy_stage.STAGE, name="attention"))
    with pytest.raises(InputError, match="needs the unknown stage 'nope'"):
        register(dataclasses.replace(toy_stage.STAGE, requires=("nope",)))
    assert toy_stage.NAME not in STAGES
