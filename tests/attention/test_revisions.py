"""The attention stage over extra revisions (``--revisions``), on tiny random models.

A random model has no hub revisions, so each test's ``load_revision`` returns the same
architecture under another seed: every revision's rows must equal those of an attention run
on that model alone, the trained rows must not change when revisions are added, the units of
each revision resume on their own and a revision that fails leaves the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch

from depthlens import data
from depthlens.stages import attention as stage
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.stages.context import StageContext
from depthlens.models import LoadedModel, load_model
from depthlens.runs import RunDirectory, RunMode
from tests.test_determinism import assert_tables_close

TABLES = ("heads", "head_chunks", "head_probe", "depth")
pytestmark = pytest.mark.full_leg  # the full leg only: the fast tier's thread and kernel legs add nothing here
#: Revisions and the seeds of the random models standing for them; ``refs/pr/1`` checks that
#: a name that is no file name still gives file names.
SEEDS = {"step1": 1, "refs/pr/1": 2}
SMALL = {"model": "random:llama", "chunks": 3, "seq_len": 12, "batch_size": 2, "null_samples": 2, "null_chunks": 1,
         "extras_chunks": 1, "probe_seqs": 2, "probe_len": 4, "ratio_seqs": 1}
TEXT = " ".join(f"Line {i} of the text speaks of subject {i % 11} at hour {i % 6}." for i in range(200))


class Loads:
    """``load_revision`` of the tests: the random model of each revision's seed, counted."""

    def __init__(self, failing: str | None = None) -> None:
        self.count: dict[str, int] = {}
        self.failing = failing

    def __call__(self, revision: str) -> LoadedModel:
        self.count[revision] = self.count.get(revision, 0) + 1
        if revision == self.failing:
            raise OSError(f"revision {revision} is not on the hub")
        return load_model("random:llama", seed=SEEDS[revision])


@pytest.fixture(scope="module")
def token_ids(tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    text = tmp_path_factory.mktemp("text") / "text.txt"
    text.write_text(TEXT)
    return data.chunks(str(text), load_model("random:llama").tokenizer, SMALL["chunks"], SMALL["seq_len"], seed=0)


def _run(root: Path, loaded: LoadedModel, token_ids: torch.Tensor, load: Callable[[str], LoadedModel],
         mode: RunMode = RunMode.NEW, **options: object) -> RunDirectory:
    """The attention stage as the workflow runs it, into ``root``."""
    config = RunConfig(**{**SMALL, **options})
    run_dir = RunDirectory.open(root, mode, {"config_hash": config.hash()})
    context = StageContext("attention", run_dir, config, loaded, data.Chunks.of(token_ids), Execution(quiet=True, jobs=1),
                           load)
    stage.run(context)
    return run_dir


def _tables(root: Path, checkpoint: str | None = None) -> dict[str, pd.DataFrame]:
    """The stage's tables (the rows of ``checkpoint`` only, without the checkpoint and
    revision columns, when given)."""
    out = {}
    for name in TABLES:
        table = pd.read_parquet(root / "tables" / f"{name}.parquet")
        if checkpoint is not None:
            table = table[table["checkpoint"] == checkpoint].drop(columns=["checkpoint", "revision"])
        out[name] = table.reset_index(drop=True)
    return out


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory, token_ids: torch.Tensor) -> dict[str, Path]:
    """A run without revisions on each model: the trained one (seed 0) and each revision's."""
    root = tmp_path_factory.mktemp("alone")
    runs = {}
    for name, seed in {"trained": 0, **SEEDS}.items():
        runs[name] = _run(root / str(seed), load_model("random:llama", seed=seed), token_ids, Loads()).root
    return runs


@pytest.fixture(scope="module")
def with_revisions(tmp_path_factory: pytest.TempPathFactory, token_ids: torch.Tensor) -> tuple[Path, Loads]:
    loads = Loads()
    root = tmp_path_factory.mktemp("revisions") / "run"
    _run(root, load_model("random:llama", seed=0), token_ids, loads, revisions=tuple(SEEDS))
    return root, loads


def test_each_revision_equals_a_run_on_it_alone(with_revisions: tuple[Path, Loads], alone: dict[str, Path]) -> None:
    root, loads = with_revisions
    assert loads.count == {rev: 1 for rev in SEEDS}  # each loaded once
    for rev in SEEDS:
        assert_tables_close(_tables(root, rev), _tables(alone[rev], "trained"))
        with pytest.raises(AssertionError):  # not vacuous: another model, other numbers
            assert_tables_close(_tables(root, rev), _tables(root, "trained"))
    for name in TABLES:
        table = pd.read_parquet(root / "tables" / f"{name}.parquet")
        assert list(table.columns[:4]) == ["model", "revision", "text", "checkpoint"]
        assert table["checkpoint"].tolist() == table["revision"].replace("", "trained").tolist()
        assert list(pd.unique(table["checkpoint"])) == ["trained", *SEEDS]


def test_trained_rows_unchanged_by_revisions(with_revisions: tuple[Path, Loads], alone: dict[str, Path]) -> None:
    """The trained rows equal a run without revisions, whose tables are today's with
    ``checkpoint`` = trained; attention.json is the trained model's, with each revision's
    summary under ``revisions``."""
    root, _ = with_revisions
    assert_tables_close(_tables(root, "trained"), _tables(alone["trained"], "trained"))
    assert {name: set(t["checkpoint"]) for name, t in _tables(alone["trained"]).items()} == \
        {name: {"trained"} for name in TABLES}
    summary = json.loads((root / "attention.json").read_text())
    revisions = summary.pop("revisions")
    assert summary == json.loads((alone["trained"] / "attention.json").read_text())
    for rev in SEEDS:
        own = json.loads((alone[rev] / "attention.json").read_text())
        del own["options"]
        assert revisions[rev] == own


def test_revision_units_are_file_names_of_their_own(with_revisions: tuple[Path, Loads]) -> None:
    root, _ = with_revisions
    units = root / "units" / "attention"
    assert [p for p in units.rglob("*") if p.is_dir()] == []  # "refs/pr/1" made no folder
    for rev in SEEDS:
        prefix = stage.unit_prefix(rev)
        assert prefix and "/" not in prefix and (units / f"{prefix}probe.done").is_file()
    assert (units / "probe.done").is_file()  # the trained model's keys are a run's without revisions
    assert len({stage.unit_prefix(r) for r in ("a/b", "a_b", "A_b")}) == 3


def test_revision_units_resume(with_revisions: tuple[Path, Loads], token_ids: torch.Tensor, tmp_path: Path) -> None:
    """A resumed run recomputes only the missing units of a revision, loads no revision whose
    units all finished, and ends with the same tables."""
    import shutil

    root, _ = with_revisions
    copy = tmp_path / "run"
    shutil.copytree(root, copy)
    before = _tables(copy)
    prefix = stage.unit_prefix("step1")
    for key in ("heads00001", "depth00002", "induction"):
        (copy / "units" / "attention" / f"{prefix}{key}.done").unlink()
    loads = Loads()
    _run(copy, load_model("random:llama", seed=0), token_ids, loads, RunMode.RESUME, revisions=tuple(SEEDS))
    assert loads.count == {"step1": 1}
    assert_tables_close(_tables(copy), before)
    loads = Loads()
    _run(copy, load_model("random:llama", seed=0), token_ids, loads, RunMode.RESUME, revisions=tuple(SEEDS))
    assert loads.count == {}


def test_a_failing_revision_leaves_the_others(token_ids: torch.Tensor, alone: dict[str, Path], tmp_path: Path) -> None:
    loads = Loads(failing="step1")
    run_dir = _run(tmp_path / "run", load_model("random:llama", seed=0), token_ids, loads, revisions=tuple(SEEDS))
    [failure] = run_dir.failures.of("attention")
    assert failure.unit == stage.unit_prefix("step1").rstrip("_") and "not on the hub" in failure.error
    assert {name: list(pd.unique(t["checkpoint"])) for name, t in _tables(run_dir.root).items()} == \
        {name: ["trained", "refs/pr/1"] for name in TABLES}
    assert_tables_close(_tables(run_dir.root, "refs/pr/1"), _tables(alone["refs/pr/1"], "trained"))
    assert list(json.loads((run_dir.root / "attention.json").read_text())["revisions"]) == ["refs/pr/1"]
