"""Jacobian and topology stages through the command line on a tiny random model: every
table entry recomputed independently from the saved arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file

from depthlens.cli import main
from depthlens.jacobian.cumulative import cumulative_ranks
from depthlens.jacobian.metrics import operator_metrics
from depthlens.jacobian.store import operator_list
from depthlens.stats import bh_qvalues
from depthlens.topology import rank_biserial

TEXT = " ".join(f"Line {i} of a text about subject {i % 11}, with detail {i % 3}." for i in range(300))


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stages")
    text = folder / "t.txt"
    text.write_text(TEXT)
    out = folder / "run"
    assert main(["topology", "--model", "random:llama", "--text", str(text), "--chunks", "4", "--seq-len", "24",
                 "--batch-size", "2", "--n-perm", "200", "--out", str(out), "--quiet"]) == 0
    return out


def _ops(root: Path, checkpoint: str, mode: str) -> dict[tuple[int, str], np.ndarray]:
    arrays = load_file(str(root / "arrays" / f"jacobians_{checkpoint}_{mode}.safetensors"))
    return {(int(k.split(".")[0]), k.split(".")[1]): v for k, v in arrays.items()}


def test_operator_metrics_match_saved_operators(run_root: Path) -> None:
    table = pd.read_parquet(run_root / "tables" / "operators.parquet")
    assert set(table["checkpoint"]) == {"trained", "init"} and set(table["jacobian_mode"]) == {"isolated", "in_context"}
    for (ckpt, mode), group in table.groupby(["checkpoint", "jacobian_mode"]):
        ops = _ops(run_root, ckpt, mode)
        for _, row in group.iterrows():
            expect = operator_metrics(ops[(row["layer"], row["sublayer"])])  # with the singular vectors
            for name, value in expect.items():
                if name.startswith("self_align_"):  # --operator-metrics read (the default): not computed
                    assert np.isnan(row[name]), name
                else:
                    assert row[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name
    trained, init = _ops(run_root, "trained", "isolated"), _ops(run_root, "init", "isolated")
    assert not np.allclose(trained[(0, "attn")], init[(0, "attn")])


def test_cumulative_alpha_one_is_the_plain_product(run_root: Path) -> None:
    table = pd.read_parquet(run_root / "tables" / "cumulative.parquet")
    assert sorted(table["schur_alpha"].unique()) == [0.0, 0.5, 1.0]  # the default grid
    # the funnel mode at every α, the other mode at α = 0 and 1 on the backward curve (sensitivity);
    # the step-0 null at α = 1 alone (--funnel-curves read)
    assert set(table.loc[table["checkpoint"] == "init", "schur_alpha"]) == {1.0}
    for mode in ("isolated", "in_context"):
        rows = table[(table["checkpoint"] == "trained") & (table["jacobian_mode"] == mode)]
        assert sorted(rows["schur_alpha"].unique()) == ([0.0, 0.5, 1.0] if mode == "isolated" else [0.0, 1.0])
        assert set(rows["schur_order"]) == ({"lapack", "canonical", "outside_first", "inside_first"}
                                            if mode == "isolated" else {"lapack"})
        assert set(rows["direction"]) == ({"forward", "backward"} if mode == "isolated" else {"backward"})
        for direction in sorted(set(rows["direction"])):
            got = rows[(rows["schur_alpha"] == 1.0) & (rows["direction"] == direction)].sort_values("depth")
            expect = cumulative_ranks(operator_list(_ops(run_root, "trained", mode)), direction).set_index("depth")
            # the figures draw the funnel mode's curves at every depth; the claims read the others' two ends
            assert len(got) == (len(expect) if mode == "isolated" else 2)
            np.testing.assert_allclose(got["erank"].to_numpy(), expect.loc[got["depth"], "erank"].to_numpy(), rtol=1e-12)


def test_funnel_bootstrap_of_every_checkpoint_and_step0_seed(run_root: Path) -> None:
    """Default --funnel-boot 50 and --init-seeds 3: replicate 0 of each checkpoint is the
    backward α = 1 curve's ends (d = 64 under the rank cap of 512: the exact product), the
    run seed's null is the init checkpoint, and the nulls of seeds 1 and 2 are other draws."""
    boot = pd.read_parquet(run_root / "tables" / "funnel_boot.parquet")
    cum = pd.read_parquet(run_root / "tables" / "cumulative.parquet")
    assert set(boot["jacobian_mode"]) == {"isolated"} and set(boot["truncation"]) == {64}
    assert boot["failure"].isna().all() and np.isfinite(boot[["erank_one_step", "erank_full_depth"]]).all().all()
    sizes = boot.groupby(["checkpoint", boot["init_seed"].fillna(-1)])["replicate"].apply(list)
    assert sizes.to_dict() == {("init", 0.0): list(range(51)), ("init", 1.0): list(range(51)),
                               ("init", 2.0): list(range(51)), ("trained", -1.0): list(range(51))}
    for checkpoint in ("trained", "init"):
        curve = cum[(cum["checkpoint"] == checkpoint) & (cum["jacobian_mode"] == "isolated") & (cum["schur_alpha"] == 1.0)
                    & (cum["direction"] == "backward")].sort_values("steps")
        point = boot[(boot["checkpoint"] == checkpoint) & (boot["replicate"] == 0) & (boot["init_seed"].fillna(0) == 0)]
        np.testing.assert_allclose(point[["erank_one_step", "erank_full_depth"]].to_numpy()[0],
                                   curve["erank"].to_numpy()[[0, -1]], rtol=1e-10)
    nulls = boot[(boot["checkpoint"] == "init") & (boot["replicate"] == 0)]["erank_full_depth"].to_numpy()
    assert len(set(nulls.round(8))) == 3  # three initialisations


def test_coupling_recomputed_from_nodes(run_root: Path) -> None:
    nodes = pd.read_parquet(run_root / "tables" / "nodes.parquet")
    coupling = pd.read_parquet(run_root / "tables" / "coupling.parquet")
    for ckpt, group in coupling.groupby("checkpoint"):
        ops = _ops(run_root, ckpt, "isolated")
        np.testing.assert_allclose(group["q"].to_numpy(), bh_qvalues(group["p"].to_numpy()), rtol=1e-12)
        for _, row in group.iterrows():
            u = nodes[(nodes["checkpoint"] == ckpt) & (nodes["boundary_index"] == row["boundary_index"])]
            J = ops[(row["layer"], row["sublayer"])]
            np.testing.assert_allclose(u["amplification"].to_numpy(), np.linalg.norm(J[:, u["dim"].to_numpy()], axis=0))
            amp, mask = u["amplification"].to_numpy(), u["is_boundary_node"].to_numpy()
            assert row["effect"] == pytest.approx(rank_biserial(amp[mask], amp[~mask]), abs=1e-12)
            assert 0 < row["p"] <= 1


def test_one_profiled_resolution_per_checkpoint(run_root: Path) -> None:
    profile = pd.read_parquet(run_root / "tables" / "topology_profile.parquet")
    communities = pd.read_parquet(run_root / "tables" / "communities.parquet")
    for ckpt, group in profile.groupby("checkpoint"):
        gamma = group.loc[group["chosen"], "gamma"]
        assert len(gamma) == 1
        assert (communities.loc[communities["checkpoint"] == ckpt, "gamma"] == gamma.iloc[0]).all()


def test_operator_metrics_every_computes_the_self_alignment(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "run"
    assert main(["jacobian", "--model", "random:llama", "--text", str(text), "--chunks", "2", "--seq-len", "8",
                 "--jacobian-mode", "isolated", "--null", "none", "--funnel-boot", "0", "--funnel-alphas", "1",
                 "--operator-metrics", "every", "--out", str(out), "--quiet"]) == 0
    table = pd.read_parquet(out / "tables" / "operators.parquet")
    ops = _ops(out, "trained", "isolated")
    for _, row in table.iterrows():
        expect = operator_metrics(ops[(row["layer"], row["sublayer"])])
        for name, value in expect.items():
            assert row[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name
