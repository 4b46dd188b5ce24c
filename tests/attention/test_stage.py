"""The attention stage end to end on a tiny random model with planted heads."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from depthlens import data
from depthlens.stages import attention as stage
from depthlens.stats import EXCESS_ZERO
from depthlens.attention.options import AttentionOptions
from depthlens.executors import Execution
from depthlens.attention.features import kreiss_b, matrix_features, null_reserves
from depthlens.linalg.causal import deflate
from depthlens.linalg.nulls import shuffle_null
from depthlens.schema import SCHEMA
from depthlens.stats import log_median
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


class _Captured(dict):
    """Captures that remember their sequences (the planted patterns depend on the tokens)."""

    ids: torch.Tensor


class PlantedAdapter:
    """The real adapter of a random model with some heads replaced by exact patterns, in every
    way the stage forms matrices (in one pass, or from kept captures)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def attention_probs(self, input_ids: torch.Tensor, layers: Iterable[int] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        yield from self._planted(self._inner.attention_probs(input_ids, layers=layers), input_ids)

    def qk_captures(self, input_ids: torch.Tensor, layers: Iterable[int] | None = None) -> _Captured:
        found = _Captured(self._inner.qk_captures(input_ids, layers))
        found.ids = input_ids
        return found

    def probs_from_captures(self, captured: _Captured, layers: Iterable[int] | None = None
                            ) -> Iterator[tuple[int, torch.Tensor]]:
        yield from self._planted(self._inner.probs_from_captures(captured, layers), captured.ids)

    @staticmethod
    def _planted(found: Iterator[tuple[int, torch.Tensor]],
                 input_ids: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        for layer, probs in found:
            probs = probs.clone()
            for (pl, head), kind in PLANTED.items():
                if pl == layer:
                    for b in range(probs.shape[0]):
                        probs[b, head] = torch.from_numpy(planted_matrix(kind, input_ids[b]))
            yield layer, probs


@pytest.fixture(scope="module")
def planted_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, torch.Tensor, AttentionOptions]:
    """The planted model, its natural-text chunks and the run's options."""
    loaded = load_model("random:llama", seed=0)
    loaded.adapter = PlantedAdapter(loaded.adapter)
    text = tmp_path_factory.mktemp("t") / "text.txt"
    text.write_text(TEXT)
    ids = data.chunks(str(text), loaded.tokenizer, 4, 24, seed=None)
    opts = AttentionOptions(null_samples=4, null_chunks=2, extras_chunks=1, probe_seqs=8, probe_len=12, ratio_seqs=2)
    return loaded, ids, opts


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory,
                planted_inputs: tuple[Any, torch.Tensor, AttentionOptions]) -> tuple[Path, dict]:
    loaded, ids, opts = planted_inputs
    root = tmp_path_factory.mktemp("run")
    run_dir = RunDirectory.open(root / "r", RunMode.NEW, {"config_hash": "x"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stage, "PROBE_BATCH", 2)  # probe and induction phases over several batches
        tables, summary = stage.analyse(run_dir, loaded, ids, opts, batch_size=2, execution=Execution(quiet=True, jobs=1))
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
    # a paired per-chunk contrast is possible: every null chunk has, per operator at the final
    # depth, the model's row and the S null samples' rows of the same chunk
    final = depth[(depth["depth"] == 2) & (depth["chunk"] < 2)]
    for _, g in final.groupby(["operator", "chunk"]):
        assert sorted(g["sample"]) == [-1, 0, 1, 2, 3] and g[["gap_e1", "gap_e2"]].notna().all().all()


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


def test_saved_head_spectra(planted_run: tuple[Path, dict]) -> None:
    """The head explorer's arrays: every head on its median chunk; the planted heads' closed
    forms (previous-token: ‖B^k‖ = √(n − k) up to k = n − 1, then 0; sink: B = 0, σ_min = |z|)."""
    from depthlens.attention.head_view import EXPLORER_GRID, EXPLORER_POWERS
    from depthlens.runs.atomic import read_safetensors

    root, _ = planted_run
    arrays, meta = read_safetensors(root / "arrays" / "head_spectra.safetensors")
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet")
    L, H = int(chunks["layer"].max()) + 1, int(chunks["head"].max()) + 1
    n = 24
    assert arrays["sigma"].shape == (L, H, 41, 41) and arrays["eig"].shape == (L, H, n)
    assert arrays["transient"].shape == (L, H, EXPLORER_POWERS.size) and arrays["sigma"].dtype == np.float64
    np.testing.assert_array_equal(arrays["x"], EXPLORER_GRID)
    np.testing.assert_array_equal(arrays["powers"], EXPLORER_POWERS)
    medians = pd.read_parquet(root / "tables" / "heads.parquet").set_index(["layer", "head"])["certified_chunk"]
    assert all(arrays["chunk"][layer, head] == medians[(layer, head)] for layer, head in medians.index)
    assert np.isfinite(arrays["sigma"]).all() and np.isfinite(arrays["transient"]).all()
    k = EXPLORER_POWERS
    np.testing.assert_allclose(arrays["transient"][0, 1], np.sqrt(np.maximum(n - k, 0)) * (k < n - 1), rtol=1e-12)
    X, Y = np.meshgrid(EXPLORER_GRID, EXPLORER_GRID)
    np.testing.assert_allclose(arrays["sigma"][1, 0], np.abs(X + 1j * Y), rtol=1e-12, atol=1e-14)
    assert not arrays["transient"][1, 0].any() and not arrays["eig"][1, 0].any()
    assert meta["config_hash"] == "x"


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


def _reserve(A: np.ndarray) -> float:
    """TR1 = log K(B) of one attention matrix, by the global search."""
    return math.log(kreiss_b(deflate(A), upper=False).value)


def test_delta_tr1_half_by_hand(planted_run: tuple[Path, dict],
                                planted_inputs: tuple[Any, torch.Tensor, AttentionOptions]) -> None:
    """``delta_TR1_half`` of the planted previous-token head and of a random head is TR1 minus
    the mean reserve of the first ⌈S/2⌉ nulls of the chunk's stream, which are the nulls an
    S/2 run draws; per head it is the median over chunks."""
    root, _ = planted_run
    loaded, ids, opts = planted_inputs
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet").set_index(["layer", "head", "chunk"])
    half = math.ceil(opts.null_samples / 2)
    layer0 = next(loaded.adapter.attention_probs(ids[:2], layers=[0]))[1].numpy()  # the run's first batch
    for chunk in (0, 1):
        matrices = {(0, 1): planted_matrix("prev", ids[chunk]), (0, 0): layer0[chunk, 0]}
        for (layer, head), A in matrices.items():
            stream = [opts.seed, 1, layer, head, chunk]  # the head phase's null stream
            rng = np.random.default_rng(np.random.SeedSequence(stream))
            nulls = shuffle_null(A, opts.null_mode, opts.null_samples, rng=rng)
            first_half = np.mean([_reserve(N) for N in nulls[:half]])
            row = chunks.loc[(layer, head, chunk)]
            assert row["delta_TR1_half"] == pytest.approx(_reserve(A) - first_half, rel=1e-12, abs=1e-12)
            assert row["delta_TR1"] == pytest.approx(_reserve(A) - np.mean([_reserve(N) for N in nulls]),
                                                     rel=1e-12, abs=1e-12)
            small = null_reserves(A, opts.null_mode, half, np.random.default_rng(np.random.SeedSequence(stream)))
            assert row["delta_TR1_half"] == pytest.approx(_reserve(A) - small.mean(), rel=1e-12, abs=1e-12)
    assert chunks.loc[chunks.index.get_level_values("chunk") >= 2, "delta_TR1_half"].isna().all()
    heads = pd.read_parquet(root / "tables" / "heads.parquet").set_index(["layer", "head"])
    expected = chunks["delta_TR1_half"].groupby(level=["layer", "head"]).median()
    np.testing.assert_allclose(heads.loc[expected.index, "delta_TR1_half"], expected, rtol=1e-14)


def test_plain_median_lists_the_scale_quantities_with_nonpositive_values(planted_run: tuple[Path, dict]) -> None:
    """Per head, ``plain_median`` lists exactly the log-median columns (as the schema declares
    them) with a chunk value ≤ 0; those hold the plain median, the others the median of logs."""
    root, _ = planted_run
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet")
    heads = pd.read_parquet(root / "tables" / "heads.parquet").set_index(["layer", "head"])
    scale = [c for c, col in SCHEMA["heads"].columns.items() if col.definition.startswith("Median of logs")]
    assert {"norm_B", "kreiss_B", "peak_B", "henrici_B", "psr_B@0.01"} <= set(scale)
    for (layer, head), g in chunks.groupby(["layer", "head"]):
        listed = [c for c in heads.loc[(layer, head), "plain_median"].split(",") if c]
        assert set(listed) == {c for c in scale if (g[c].dropna() <= 0).any()}
        for c in scale:
            v = g[c].dropna().to_numpy()
            want = np.median(v) if c in listed else log_median(v)
            assert heads.loc[(layer, head), c] == pytest.approx(want, rel=1e-14)
    # the planted sink head A = P has B = 0: its norm, Henrici departure and peak are 0
    assert {"norm_B", "henrici_B", "peak_B"} <= set(heads.loc[(1, 0), "plain_median"].split(","))
    assert heads.loc[(0, 1), "plain_median"] == ""


def test_induction_control_by_hand(planted_run: tuple[Path, dict],
                                   planted_inputs: tuple[Any, torch.Tensor, AttentionOptions]) -> None:
    """The three excess reserves of each planted routing head, recomputed from the probe and
    its length-matched control [BOS, r, r′] with the documented null streams; the ratios and
    the exclusion counts of the summary follow from them."""
    root, summary = planted_run
    loaded, _, opts = planted_inputs
    heads = pd.read_parquet(root / "tables" / "heads.parquet").set_index(["layer", "head"])
    args = (loaded.tokenizer, opts.probe_seqs, opts.probe_len)
    probe = data.repeated_random_tokens(*args, seed=opts.seed)[: opts.ratio_seqs]
    control = data.control_random_tokens(*args, seed=opts.seed)[: opts.ratio_seqs]
    m = opts.probe_len

    def excess(A: np.ndarray, rng: np.random.Generator) -> float:
        return _reserve(A) - null_reserves(A, opts.null_mode, opts.null_samples, rng).mean()

    expected = {}
    for (layer, head), kind in PLANTED.items():
        if kind == "sink":
            continue
        per_seq = []
        for s in range(opts.ratio_seqs):
            A, C = planted_matrix(kind, probe[s]), planted_matrix(kind, control[s])
            rng = np.random.default_rng(np.random.SeedSequence([opts.seed, 3, layer, head, s]))
            second = excess(A, rng)
            first = excess(A[: m + 1, : m + 1], rng)
            ctrl = excess(C, np.random.default_rng(np.random.SeedSequence([opts.seed, 4, layer, head, s])))
            per_seq.append((first, second, ctrl))
        first, second, ctrl = np.median(per_seq, axis=0)
        expected[(layer, head)] = first, second, ctrl
        row = heads.loc[(layer, head)]
        np.testing.assert_allclose(row[["delta_TR1_first_copy", "delta_TR1_second_copy", "delta_TR1_control"]]
                                   .to_numpy(dtype=float), [first, second, ctrl], rtol=1e-12, atol=1e-12)
        for name, base in (("induction_ratio", first), ("induction_ratio_control", ctrl)):
            if base > EXCESS_ZERO:
                assert row[name] == pytest.approx(second / base, rel=1e-12)
            else:
                assert math.isnan(row[name])
    others = heads.drop(index=list(expected))
    assert others[["delta_TR1_control", "induction_ratio_control"]].isna().all().all()
    assert summary["induction_routing_heads"] == len(expected) == 2
    assert summary["induction_excluded_first"] == sum(v[0] <= EXCESS_ZERO for v in expected.values())
    assert summary["induction_excluded_control"] == sum(v[2] <= EXCESS_ZERO for v in expected.values())
    # the planted induction head has nothing to copy in the control: its excess is zero to
    # rounding, so it is excluded rather than giving a ratio over a denominator of 1e-15
    assert abs(expected[(1, 2)][2]) < EXCESS_ZERO and math.isnan(heads.loc[(1, 2), "induction_ratio_control"])


def test_bracket_check_and_numerical_health(planted_run: tuple[Path, dict]) -> None:
    """Every head's certified chunk has its search value inside its own bracket; the summary
    counts brackets, violations, uncertified brackets and flagged K(A) checks."""
    root, summary = planted_run
    heads = pd.read_parquet(root / "tables" / "heads.parquet")
    chunks = pd.read_parquet(root / "tables" / "head_chunks.parquet").set_index(["layer", "head", "chunk"])
    rtol = AttentionOptions().rtol
    for row in heads.itertuples():
        value = chunks.loc[(row.layer, row.head, int(row.certified_chunk)), "kreiss_B"]
        inside = row.kreiss_B_lo * (1 - rtol) <= value <= row.kreiss_B_hi * (1 + 1e-9)
        assert row.kreiss_B_in_bracket == float(inside) == 1.0
    assert summary["numerical_health"] == {
        "brackets": len(heads), "bracket_violations": 0,
        "uncertified": int((heads["kreiss_B_certified"] == 0).sum()),
        "kreiss_A_flagged": summary["kreiss_A_flagged_matrices"],
    }


def test_bracket_check_flags_values_outside() -> None:
    """A search value below lo·(1 − rtol) or above hi·(1 + 1e-9) is a violation (0); a missing
    bracket gives NaN; without certification (no certified chunk) every head is NaN."""
    from depthlens.attention.analysis import bracket_check, numerical_health

    chunks = pd.DataFrame({"layer": 0, "head": [0, 1, 2, 3, 4], "chunk": [1, 0, 2, 0, 0],
                           "kreiss_B": [2.0, 2.0, 2.0, 2.0, 2.0]})
    heads = pd.DataFrame({"layer": 0, "head": [0, 1, 2, 3, 4], "certified_chunk": [1, 0, 2, 0, np.nan],
                          "kreiss_B_lo": [1.9995, 2.01, 1.9, 2.0 * (1 + 1e-4), np.nan],
                          "kreiss_B_hi": [2.0, 2.02, 2.0 * (1 - 1e-8), 2.001, np.nan],
                          "kreiss_B_certified": [1.0, 1.0, 0.0, 1.0, np.nan], "kreiss_A_flagged": [0, 2, 0, 0, 1]})
    check = bracket_check(heads, chunks, 1e-3)
    np.testing.assert_array_equal(check, [1.0, 0.0, 0.0, 1.0, np.nan])
    heads["kreiss_B_in_bracket"] = check
    assert numerical_health(heads) == {"brackets": 4, "bracket_violations": 2, "uncertified": 1, "kreiss_A_flagged": 3}
    assert np.isnan(bracket_check(heads.drop(columns="certified_chunk"), chunks, 1e-3)).all()


def test_certify_all_gives_every_chunk_a_bracket_and_each_head_its_certified_chunks(tmp_path: Path) -> None:
    """--certify all: every matrix gets a bracket in head_chunks; a head's bracket columns are
    its certified chunk's (not medians over chunks), and its search value lies inside."""
    from depthlens.cli import main

    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "run"
    assert main(["attention", "--model", "random:llama", "--text", str(text), "--chunks", "3", "--seq-len", "12",
                 "--null-samples", "2", "--null-chunks", "1", "--probe-seqs", "2", "--probe-len", "4",
                 "--certify", "all", "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    chunks = pd.read_parquet(out / "tables" / "head_chunks.parquet")
    heads = pd.read_parquet(out / "tables" / "heads.parquet")
    assert chunks["kreiss_B_lo"].notna().all() and (chunks["kreiss_B_lo"] <= chunks["kreiss_B_hi"]).all()
    merged = heads.merge(chunks, left_on=["layer", "head", "certified_chunk"], right_on=["layer", "head", "chunk"],
                         suffixes=("", "_chunk"))
    assert len(merged) == len(heads)
    np.testing.assert_array_equal(merged["kreiss_B_lo"], merged["kreiss_B_lo_chunk"])
    assert (heads["kreiss_B_in_bracket"] == 1.0).all()
    assert json.loads((out / "attention.json").read_text())["numerical_health"]["bracket_violations"] == 0


def test_kept_and_recomputed_batches_give_the_same_tables(planted_inputs, tmp_path: Path) -> None:
    """The later phases read the heads phase's kept queries and keys; with no budget every batch
    is passed again, whole, and every table and array is the same, bit for bit."""
    loaded, ids, opts = planted_inputs
    outputs, passes = [], []
    for budget in (0, stage.CAPTURE_BUDGET):
        run_dir = RunDirectory.open(tmp_path / f"b{budget}", RunMode.NEW, {"config_hash": "x"})
        counted: list[int] = []
        capture = loaded.adapter.qk_captures
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(stage, "CAPTURE_BUDGET", budget)
            patch.setattr(stage, "PROBE_BATCH", 2)
            patch.setattr(loaded.adapter, "qk_captures", lambda *a, **k: counted.append(1) or capture(*a, **k))
            tables, _ = stage.analyse(run_dir, loaded, ids, opts, batch_size=2, execution=Execution(quiet=True, jobs=1))
        passes.append(len(counted))
        arrays = load_file(str(tmp_path / f"b{budget}" / "arrays" / "head_spectra.safetensors"))
        outputs.append((tables, arrays))
    (first, first_arrays), (second, second_arrays) = outputs
    assert passes[1] == 2 < passes[0]  # kept: the heads phase's two batches, one pass each
    for name, table in first.items():
        pd.testing.assert_frame_equal(table, second[name], check_exact=True)
    assert all(np.array_equal(v, second_arrays[k].numpy(), equal_nan=True) for k, v in
               ((k, v.numpy()) for k, v in first_arrays.items()))
