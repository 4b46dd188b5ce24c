"""The contest stage on a tiny random model (after the attention stage), its refusals, and the
contest table of every target on synthetic stage tables."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from depthlens.config import RunConfig
from depthlens.stages import contest as stage
from depthlens.contest.cv import FEATURE_FAMILIES
from depthlens.contest.options import ContestOptions
from depthlens.errors import InputError
from depthlens.schema import SCHEMA, check_table
from depthlens.stats import bh_qvalues
from depthlens.executors import Execution
from depthlens.workflow import run

TEXT = " ".join(f"Paragraph {i} is about theme {i % 9}, written on day {i % 4} of the week." for i in range(300))
FAST = {"model": "random:llama", "chunks": 4, "seq_len": 16, "null_samples": 2, "null_chunks": 1, "probe_seqs": 4,
        "probe_len": 6, "certify": "none", "contest_boot": 50, "contest_perm": 50}


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("contest")
    text = folder / "t.txt"
    text.write_text(TEXT)
    cfg = RunConfig(text=str(text), contest_targets=("persistence", "routing"), contest_chunks=3, **FAST)
    return run(cfg, folder / "run", stages=("contest",), execution=Execution(quiet=True, jobs=1))


def test_tables_conform(run_root: Path) -> None:
    tables = {name: pd.read_parquet(run_root / "tables" / f"{name}.parquet") for name in ("contest_features", "contest")}
    for name, table in tables.items():
        check_table(name, table)
        assert list(table.columns) == list(SCHEMA[name].columns)
    features, contest = tables["contest_features"], tables["contest"]
    assert len(features) == 2 * 4 and features[["layer", "head"]].duplicated().sum() == 0  # 2 layers × 4 heads
    assert np.isfinite(features.drop(columns=["model", "revision", "text"]).to_numpy(dtype=float)).all()
    # the random model has no routing head: that target is skipped, persistence has its 9 sets
    assert contest["target"].tolist() == ["persistence"] * 9
    assert contest["features"].tolist() == ["P", "E", "S", "R", "all", "all-P", "all-E", "all-S", "all-R"]
    assert (contest["n_folds"] == 2).all() and (contest["n_heads"] == 8).all()
    assert ((contest["p"] > 0) & (contest["p"] <= 1)).all()
    np.testing.assert_array_equal(contest["q"].to_numpy(), bh_qvalues(contest["p"].to_numpy()))
    assert (contest["required"] == (contest["delta_lo"] > 0)).all()


def test_features_are_medians_of_the_units(run_root: Path) -> None:
    units = pd.concat([pd.read_parquet(p) for p in sorted((run_root / "units" / "contest").glob("features*.rows.parquet"))])
    assert sorted(units["chunk"].unique()) == [0, 1, 2]  # contest_chunks = 3 of the run's 4
    got = pd.read_parquet(run_root / "tables" / "contest_features.parquet").set_index(["layer", "head"])
    for col in ("mean_distance", "persistence"):
        expect = units.groupby(["layer", "head"])[col].median()
        np.testing.assert_allclose(got[col].to_numpy(), expect.to_numpy(), rtol=1e-12)
    logs = units.groupby(["layer", "head"])["fro_B"].apply(lambda v: np.exp(np.median(np.log(v))))
    np.testing.assert_allclose(got["fro_B"].to_numpy(), logs.to_numpy(), rtol=1e-12)


def test_missing_ablation_is_refused_before_any_work(run_root: Path) -> None:
    fake = SimpleNamespace(root=run_root)
    stage.check_sources(fake, ("persistence", "routing"))
    with pytest.raises(InputError) as err:
        stage.check_sources(fake, ("persistence", "criticality"))
    message = str(err.value)
    assert "\n" not in message and "ablate stage" in message and "criticality" in message
    with pytest.raises(InputError, match="attention stage"):
        stage.check_sources(SimpleNamespace(root=run_root / "nowhere"), ("routing",))


def test_check_refuses_criticality_without_mean_ablation() -> None:
    cfg = RunConfig(model="random:llama", contest_targets=("criticality",), ablation_methods=("zero",))
    with pytest.raises(InputError, match="--ablation-methods"):
        stage.check(cfg)
    stage.check(RunConfig(model="random:llama", contest_targets=("criticality",)))


def _synthetic(rng: np.random.Generator, n_layers: int = 12, n_heads: int = 6) -> tuple[pd.DataFrame, ...]:
    keys = pd.DataFrame({"layer": np.repeat(np.arange(n_layers), n_heads), "head": np.tile(np.arange(n_heads), n_layers)})
    heads = keys.copy()
    for col in (*FEATURE_FAMILIES["P"][:2], "row_entropy", FEATURE_FAMILIES["E"][0], FEATURE_FAMILIES["S"][0], *FEATURE_FAMILIES["R"]):
        heads[col] = rng.normal(size=len(keys))
    heads["peak_k"] = np.nan  # an all-NaN column is dropped with a warning
    heads["TR1"] = np.where(rng.random(len(keys)) < 0.05, np.inf, heads["TR1"])
    heads["role"] = np.where(heads["TR2"] > 0.8, "routing", "other")
    features = keys.copy()
    for col in stage.FEATURE_COLUMNS:
        features[col] = rng.normal(size=len(keys))
    features.loc[0, "persistence"] = -np.inf  # a head of which nothing survives: no target value
    ablation = pd.concat([keys.assign(method="mean", criticality=heads["psr_B@0.01"] + 0.1 * rng.normal(size=len(keys))),
                          keys.assign(method="zero", criticality=0.0)], ignore_index=True)
    return heads, features, ablation


def test_contest_table_every_target(rng: np.random.Generator, caplog: pytest.LogCaptureFixture) -> None:
    heads, features, ablation = _synthetic(rng)
    opts = ContestOptions(contest_boot=30, contest_perm=30)
    with caplog.at_level(logging.WARNING, logger="depthlens.stages.contest"):
        table = stage.contest_table(heads, features, ablation, opts)
    assert "peak_k (all NaN)" in caplog.text and "diag_q25" not in caplog.text
    assert table.groupby("target", sort=False).size().to_dict() == {"persistence": 9, "routing": 9, "criticality": 9}
    by = table.set_index(["target", "features"])
    assert (by.loc["routing", "metric"] == "auroc").all() and by.loc["routing", "r2"].isna().all()
    assert by.loc[("persistence", "all"), "n_heads"] == 12 * 6 - 1
    assert by.loc[("criticality", "R"), "score"] > 0.8  # criticality follows psr_B@0.01 (method mean only)
    np.testing.assert_array_equal(table["q"].to_numpy(), bh_qvalues(table["p"].to_numpy()))


def test_single_class_routing_is_skipped(rng: np.random.Generator, caplog: pytest.LogCaptureFixture) -> None:
    heads, features, _ = _synthetic(rng)
    heads["role"] = "sink"
    with caplog.at_level(logging.WARNING, logger="depthlens.stages.contest"):
        table = stage.contest_table(heads, features, None, ContestOptions(contest_targets=("routing",), contest_boot=5,
                                                                          contest_perm=5))
    assert table.empty and {"target", "features", "p", "q"} <= set(table.columns)
    skips = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert skips == ["contest: target routing skipped: every head has a role other than routing (one class, no AUROC)."]
