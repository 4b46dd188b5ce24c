"""The attention stage end to end on a tiny random model with planted heads."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens import data
from depthlens.attention import stage
from depthlens.attention.options import AttentionOptions
from depthlens.attention.features import matrix_features
from depthlens.models import load_model
from depthlens.runs import RunMode, RunDirectory

PLANTED = {(0, 1): "prev", (1, 2): "induction", (1, 0): "sink"}
TEXT = " ".join(f"token stream {i % 13} with words {i % 5} and more {i}" for i in range(300))


def planted_matrix(kind: str, ids: torch.Tensor) -> np.ndarray:
    """Exact previous-token, induction (attend to the token after the latest earlier
    occurrence of the current token, else BOS) or sink (A = P) pattern for one sequence."""
    n = ids.shape[0]
    A = np.zeros((n, n))
    A[0, 0] = 1.0
    for i in range(1, n):
        if kind == "prev":
            A[i, i - 1] = 1.0
        elif kind == "induction":
            earlier = [j for j in range(i) if ids[j] == ids[i]]
            A[i, earlier[-1] + 1 if earlier else 0] = 1.0
        else:
            A[i, 0] = 1.0
    return A


class PlantedAdapter:
    """The real adapter of a random model with some heads replaced by exact patterns."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def attention_probs(self, input_ids: torch.Tensor, layers: Iterable[int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        for layer, probs in self._inner.attention_probs(input_ids, layers=layers):
            probs = probs.clone()
            for (pl, head), kind in PLANTED.items():
                if pl == layer:
                    for b in range(probs.shape[0]):
                        probs[b, head] = torch.from_numpy(planted_matrix(kind, input_ids[b]))
            yield layer, probs


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    loaded = load_model("random:llama", seed=0)
    loaded.adapter = PlantedAdapter(loaded.adapter)
    text = tmp_path_factory.mktemp("t") / "text.txt"
    text.write_text(TEXT)
    ids = data.chunks(str(text), loaded.tokenizer, 4, 24, seed=None)
    opts = AttentionOptions(null_samples=4, null_chunks=2, extras_chunks=1, probe_seqs=8, probe_len=12, ratio_seqs=2)
    root = tmp_path_factory.mktemp("run")
    run_dir = RunDirectory.open(root / "r", RunMode.NEW, {"config_hash": "x"})
    tables, summary = stage.analyse(run_dir, loaded, ids, opts, batch_size=2, jobs=1, quiet=True)
    for name, table in tables.items():
        run_dir.write_table(name, table)
    return root / "r", summary


def test_roles_recovered_exactly(planted_run: tuple[Path, dict]) -> None:
    root, summary = planted_run
    heads = pd.read_parquet(root / "tables" / "heads.parquet").set_index(["layer", "head"])
    assert heads.loc[(0, 1), "role"] == "routing" and heads.loc[(0, 1), "prev_token_score"] == 1.0
    assert heads.loc[(1, 2), "role"] == "routing" and heads.loc[(1, 2), "induction_score"] >= 0.9
    assert heads.loc[(1, 0), "role"] == "sink" and heads.loc[(1, 0), "sink_mass"] == 1.0
    unplanted = heads.drop(index=list(PLANTED))
    assert (unplanted["role"] == "other").all()
    assert summary["n_heads"] == len(heads) and summary["roles"]["routing"] == 2


def test_planted_closed_forms(planted_run: tuple[Path, dict]) -> None:
    root, _ = planted_run
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet").set_index(["layer", "head", "chunk"])
    n = 24
    prev = chunks.xs((0, 1), level=("layer", "head"))
    np.testing.assert_allclose(prev["peak_B"], math.sqrt(n - 1), rtol=1e-12)
    assert (prev["peak_k"] == 1).all() and (prev["rho_B"] == 0).all()
    sink = chunks.xs((1, 0), level=("layer", "head"))
    assert (sink["norm_B"] == 0).all() and (sink["henrici_B"] == 0).all()


def test_every_matrix_passes_the_kreiss_check(planted_run: tuple[Path, dict]) -> None:
    root, summary = planted_run
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet")
    assert ((chunks["kreiss_A_ok"] == 1) | (chunks["perron_simple"] == 0)).all()
    np.testing.assert_array_less(chunks["kreiss_A"], math.sqrt(24) * (1 + 1e-12))
    assert summary["kreiss_A_flagged_matrices"] == int((chunks["kreiss_A_ok"] == 0).sum())


def test_null_and_certified_columns(planted_run: tuple[Path, dict]) -> None:
    root, _ = planted_run
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet")
    heads = pd.read_parquet(root / "tables" / "heads.parquet")
    with_nulls = chunks[chunks["chunk"] < 2]
    assert with_nulls["delta_TR1"].notna().all() and chunks.loc[chunks["chunk"] >= 2, "delta_TR1"].isna().all()
    np.testing.assert_allclose(with_nulls["delta_TR1"], with_nulls["TR1"] - with_nulls["null_TR1_mean"])
    assert (chunks.loc[chunks["chunk"] < 1, "psr_B@0.01"].notna()).all()
    assert heads["null_q"].between(0, 1).all() and (heads["null_q"] >= heads["null_p"] - 1e-15).all()
    assert (heads["kreiss_B_lo"] <= heads["kreiss_B_hi"]).all() and heads["kreiss_B_certified"].all()
    # the median chunk's search value (a lower bound) lies below the certified upper end and
    # within the bracket's tolerance of its lower end (the lower end may be a supremum limit)
    merged = heads.merge(chunks, left_on=["layer", "head", "certified_chunk"], right_on=["layer", "head", "chunk"],
                         suffixes=("", "_chunk"))
    assert (merged["kreiss_B_chunk"] <= merged["kreiss_B_hi"] * (1 + 1e-9)).all()
    assert (merged["kreiss_B_chunk"] >= merged["kreiss_B_lo"] * (1 - 1e-3)).all()


def test_depth_table(planted_run: tuple[Path, dict]) -> None:
    root, summary = planted_run
    depth = pd.read_parquet(root / "tables" / "depth.parquet")
    assert set(depth["operator"]) == {"mean", "rollout", "chain_routing", "chain_sink"}
    model = depth[depth["source"] == "model"]
    assert len(model) == 4 * 4 * 2  # operators x chunks x layers
    assert len(depth[depth["source"] == "null"]) == 4 * 2 * 4 * 2  # operators x null chunks x samples x layers
    assert "mean" in summary["eig_gap_final_depth"]


def test_matrix_features_flags_nonsimple_perron() -> None:
    feats = matrix_features(np.eye(6), extras=False)
    assert feats["perron_simple"] == 0 and feats["kreiss_A_ok"] == 0


def test_saved_pseudospectra(planted_run: tuple[Path, dict]) -> None:
    """The saved grids equal a dense SVD of zI − B for the recorded head and chunk."""
    from safetensors import safe_open

    root, _ = planted_run
    with safe_open(str(root / "arrays" / "pseudospectra.safetensors"), "np") as f:
        meta = f.metadata()
        sink = {k: f.get_tensor(f"sink.{k}") for k in ("x", "y", "sigma", "eig")}
    assert (int(meta["sink.layer"]), int(meta["sink.head"])) == (1, 0)  # the planted A = P head
    # B = 0 for the sink head: σ_min(zI) = |z|
    X, Y = np.meshgrid(sink["x"], sink["y"])
    np.testing.assert_allclose(sink["sigma"], np.abs(X + 1j * Y), rtol=1e-12, atol=1e-14)
    assert (sink["eig"] == 0).all()


def test_transient_peak_reuse_matches_peak_transient(rng: np.random.Generator) -> None:
    """The peak read off the Kreiss bound's power norms equals a fresh certified scan."""
    from depthlens.attention.features import transient_peak
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.kreiss import kreiss
    from depthlens.linalg.transients import peak_transient
    from tests.linalg._make import causal_softmax

    for kwargs in ({}, {"sink": 4.0}, {"prev": 5.0}, {"scale": 3.0}):
        B = deflate(causal_softmax(48, rng, **kwargs))
        peak, k, certified = transient_peak(B, kreiss(B))
        fresh = peak_transient(B)
        assert certified and fresh.certified and k == fresh.argmax
        assert peak == pytest.approx(fresh.peak, rel=1e-12)
        assert peak == pytest.approx(max(np.linalg.norm(np.linalg.matrix_power(B, j), 2) for j in range(1, 80)), rel=1e-10)


def test_transient_peak_of_a_slowly_decaying_head_is_flagged_uncertified(rng: np.random.Generator) -> None:
    """A self-weight of 0.9999 keeps every scanned power above norm 1: no finite power bound,
    and the peak over the scanned powers, reused from the bound, matches a fresh scan and is
    marked uncertified."""
    from depthlens.attention.features import matrix_features, transient_peak
    from depthlens.linalg.causal import deflate
    from depthlens.linalg.kreiss import kreiss
    from depthlens.linalg.transients import peak_transient
    from tests.linalg._make import causal_softmax

    A = causal_softmax(16, rng)
    A[1, :2] = [1e-4, 1.0 - 1e-4]
    B = deflate(A)
    kb = kreiss(B)
    assert kb.upper == np.inf and kb.power_bound.tail == "none"
    peak, k, certified = transient_peak(B, kb)
    fresh = peak_transient(B)
    assert not certified and not fresh.certified
    assert (peak, k) == (pytest.approx(fresh.peak, rel=1e-12), fresh.argmax)
    assert matrix_features(A, extras=False)["peak_certified"] == 0.0
