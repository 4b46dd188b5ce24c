"""Run presets (quick, default, paper) and the saved Jacobian arrays (--save-arrays)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors import safe_open

from depthlens.cli import main
from depthlens import config as config_module
from depthlens.config import RunConfig
from depthlens.errors import InputError

TEXT = " ".join(f"Line {i} of a text about subject {i % 11}, with detail {i % 3}." for i in range(300))

#: The numbers of ``depthlens run`` before presets existed; ``default`` must keep them, except
#: ``null_chunks``: 10 since the calibration harness showed A6 undecidable at 8 (A5 at 6), and
#: ``ratio_seqs``: 16 (was 4) since A4's interval resamples the probe sequences; ``funnel_alphas``:
#: {0, 0.5, 1} since the default computes what the claims and figures read (the METHODS grid is
#: ``paper``'s), and for the same reason ``control_curves``: "first" and ``operator_metrics``: "read".
HISTORICAL = {"chunks": 32, "seq_len": 128, "null_samples": 8, "null_chunks": 10, "extras_chunks": 1, "certify": "median",
              "probe_seqs": 128, "probe_len": 64, "ratio_seqs": 16, "jacobian_mode": "both", "funnel_rank": 512, "n_perm": 1000,
              "funnel_alphas": (0.0, 0.5, 1.0), "funnel_curves": "read", "control_curves": "first",
              "operator_metrics": "read",
              "control_seeds": 3,
              "topk": 20, "null": "init", "positions": "last", "null_mode": "spec"}


def test_default_preset_keeps_the_historical_numbers() -> None:
    for config in (RunConfig(), RunConfig(preset="default")):
        assert {k: getattr(config, k) for k in HISTORICAL} == HISTORICAL
        assert config.preset == "default" and config.save_arrays == "float64"
    assert RunConfig() == RunConfig(preset="default") == RunConfig(chunks=32, null_samples=8)


def test_quick_preset_shrinks_every_size() -> None:
    quick, default = RunConfig(preset="quick"), RunConfig()
    for name in ("chunks", "seq_len", "null_samples", "null_chunks", "probe_seqs", "probe_len", "ratio_seqs", "n_perm"):
        assert getattr(quick, name) < getattr(default, name), name
    assert quick.certify == "none" and quick.funnel_rank == 0 and quick.jacobian_mode == "isolated"
    assert len(quick.funnel_alphas) < len(default.funnel_alphas)
    assert quick.save_arrays == "none" and quick.extras_chunks <= 1
    assert (quick.funnel_boot, quick.init_seeds) == (0, 1) and (default.funnel_boot, default.init_seeds) == (50, 3)


def test_paper_preset_is_the_methods_protocol() -> None:
    paper = RunConfig(preset="paper", chunks=12)
    assert (paper.null_samples, paper.probe_seqs, paper.probe_len, paper.n_perm, paper.funnel_rank) == (16, 128, 64, 1000, 512)
    assert paper.null_chunks == paper.extras_chunks == 12  # every chunk gets nulls (A4) and radii (A3)
    assert paper.certify == "median" and paper.jacobian_mode == "both" and paper.save_arrays == "float64"
    assert (paper.funnel_boot, paper.init_seeds) == (200, 3)  # B3 over three initialisations (METHODS B6)
    # B4: the five α of METHODS, and the Schur split of every checkpoint in every direction and truncation
    assert (paper.funnel_alphas, paper.funnel_curves) == ((0.0, 0.25, 0.5, 0.75, 1.0), "every")
    assert paper.control_curves == "every"  # A7: every control seed at every clamp dose
    assert paper.operator_metrics == "every"  # B2: the self-alignment of every operator


def test_explicit_values_override_the_preset(tmp_path: Path) -> None:
    assert RunConfig(preset="quick", n_perm=500, chunks=2).n_perm == 500
    toml = tmp_path / "c.toml"
    toml.write_text('preset = "quick"\n[attention]\nnull_samples = 3\n')
    config = RunConfig.from_sources(toml, chunks=2, probe_seqs=None)  # an unset flag keeps file and preset
    assert (config.preset, config.null_samples, config.chunks, config.probe_seqs) == ("quick", 3, 2,
                                                                                    config_module.PRESET_VALUES["quick"]["probe_seqs"])
    assert RunConfig.from_sources(toml, preset="paper").null_samples == 3  # the file's value beats the flag's preset


def test_preset_is_in_the_config_and_its_hash() -> None:
    quick = RunConfig(preset="quick")
    assert quick.to_dict()["preset"] == "quick"
    assert len({RunConfig(preset=p).hash() for p in ("quick", "default", "paper")}) == 3
    # the same numbers under another preset name are another configuration
    same_numbers = RunConfig(**dict(quick.items()))
    assert same_numbers.to_dict() != quick.to_dict() and same_numbers.hash() != quick.hash()


def test_unknown_preset_or_save_arrays_names_the_flag() -> None:
    with pytest.raises(InputError, match="^--preset 'fast' is unknown; use one of quick, default, paper"):
        RunConfig(preset="fast")
    with pytest.raises(InputError, match="^--save-arrays 'float16' is unknown; use one of float64, float32, none"):
        RunConfig(save_arrays="float16")


def test_preset_recorded_in_the_manifest(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "run"
    assert main(["capture", "--model", "random:llama", "--text", str(text), "--preset", "quick", "--out", str(out),
                 "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["preset"] == "quick" and manifest["config"]["chunks"] == config_module.PRESET_VALUES["quick"]["chunks"]
    assert manifest["config_hash"] == RunConfig.from_sources(None, **manifest["config"]).hash()


# ----------------------------------------------------------------------------- --save-arrays
TABLES = ("operators", "eigenvalues", "cumulative", "communities", "nodes", "coupling", "topology_profile")


@pytest.fixture(scope="module")
def save_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("save_arrays")
    text = folder / "t.txt"
    text.write_text(TEXT)
    roots = {}
    for save in ("float64", "float32", "none"):
        roots[save] = folder / save
        assert main(["topology", "--model", "random:llama", "--text", str(text), "--preset", "quick", "--null", "init",
                     "--jacobian-mode", "both", "--save-arrays", save, "--out", str(roots[save]), "--quiet",
                     "--jobs", "1"]) == 0
    return roots


def test_tables_identical_whatever_the_saved_arrays(save_runs: dict[str, Path]) -> None:
    for name in TABLES:
        reference = pd.read_parquet(save_runs["float64"] / "tables" / f"{name}.parquet")
        for save in ("float32", "none"):
            pd.testing.assert_frame_equal(pd.read_parquet(save_runs[save] / "tables" / f"{name}.parquet"), reference,
                                          check_exact=True, obj=f"{name} ({save})")
    cumulative = pd.read_parquet(save_runs["none"] / "tables" / "cumulative.parquet")
    assert cumulative["truncation"].nunique() == 1  # funnel_rank 0 (quick): the exact products only
    assert sorted(cumulative["schur_alpha"].unique()) == [1.0]  # funnel_alphas 1 (quick): no Schur split


def test_saved_arrays_have_the_asked_dtype_and_no_private_copy_stays(save_runs: dict[str, Path]) -> None:
    for save in ("float64", "float32"):
        arrays = sorted((save_runs[save] / "arrays").glob("jacobians_*.safetensors"))
        assert [a.name for a in arrays] == ["jacobians_init_in_context.safetensors", "jacobians_init_isolated.safetensors",
                                            "jacobians_trained_in_context.safetensors",
                                            "jacobians_trained_isolated.safetensors"]
        for path in arrays:
            with safe_open(str(path), framework="numpy") as f:
                assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {save}
                assert json.loads(f.metadata()["dtypes"])[next(iter(f.keys()))] == save
    assert not (save_runs["none"] / "arrays").exists() or not list((save_runs["none"] / "arrays").glob("jacobians_*"))
    for root in save_runs.values():
        assert not list((root / "units" / "jacobian").glob("*.operators.safetensors"))  # deleted at the end


def test_float32_arrays_round_the_float64_ones(save_runs: dict[str, Path]) -> None:
    from safetensors.numpy import load_file

    exact = load_file(str(save_runs["float64"] / "arrays" / "jacobians_trained_isolated.safetensors"))
    rounded = load_file(str(save_runs["float32"] / "arrays" / "jacobians_trained_isolated.safetensors"))
    for key, J in exact.items():
        np.testing.assert_array_equal(rounded[key], J.astype(np.float32))


@pytest.mark.parametrize("save", ["none", "float32"])
def test_resume_recomputes_deleted_operators_exactly(save_runs: dict[str, Path], tmp_path: Path, save: str) -> None:
    """A finished run has no float64 copy left; a resume whose funnel and topology units are
    gone computes the operators again and ends with the same tables."""
    root = tmp_path / "run"
    shutil.copytree(save_runs[save], root)
    for folder, pattern in (("jacobian", "funnel_*"), ("topology", "*")):
        for path in (root / "units" / folder).glob(pattern):
            path.unlink()
    for name in TABLES:
        (root / "tables" / f"{name}.parquet").unlink()
    config = json.loads((root / "manifest.json").read_text())["config"]
    assert main(["topology", "--model", "random:llama", "--text", config["text"], "--preset", "quick", "--null", "init",
                 "--jacobian-mode", "both", "--save-arrays", save, "--out", str(root), "--resume", "--quiet",
                 "--jobs", "1"]) == 0
    for name in TABLES:
        pd.testing.assert_frame_equal(pd.read_parquet(root / "tables" / f"{name}.parquet"),
                                      pd.read_parquet(save_runs["float64"] / "tables" / f"{name}.parquet"),
                                      check_exact=True, obj=name)


def test_funnel_of_alpha_one_alone_needs_no_schur_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """quick's funnel (α = 1 only) is the plain product: it skips the Schur forms and equals
    those rows of the full split."""
    from depthlens.jacobian import cumulative

    rng = np.random.default_rng(0)
    ops = [np.eye(6) + 0.3 * rng.standard_normal((6, 6)) for _ in range(4)]
    full = cumulative.schur_funnel(ops, alphas=(0.0, 1.0))
    monkeypatch.setattr(cumulative, "_normal_part", lambda J: pytest.fail("a Schur form was computed"))
    alone = cumulative.schur_funnel(ops, alphas=(1.0,))
    pd.testing.assert_frame_equal(alone, full[full["schur_alpha"] == 1.0].reset_index(drop=True))
