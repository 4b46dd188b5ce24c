"""Ablation criticality (METHODS A7) on tiny random models: planted and silenced heads, the
truncated block path against independent full forward passes, the head means and resample
pairing, the bootstrap, the stage's checks, table and resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens import data
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.errors import InputError
from depthlens.stages import ablate as ablate_stage
from depthlens.interventions import ablation as ab
from depthlens.models import load_model
from depthlens.runs import RunMode
from depthlens.workflow import run as run_workflow

TEXT = " ".join(f"Sentence number {i} talks about topic {i % 7} and the weather." for i in range(400))
CHUNKS, SEQ_LEN, HELDOUT, BATCH = 7, 24, 4, 3  # 3 mean chunks: resample pairing wraps around
METHODS = ("mean", "zero", "resample")


@pytest.fixture(scope="module")
def text_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "t.txt"
    path.write_text(TEXT)
    return path


def _model(scale: dict[tuple[int, int], float] | None = None):
    """The tiny random llama (seed 0) with the output-projection slices of some heads scaled."""
    loaded = load_model("random:llama", seed=0)
    ad = loaded.adapter
    with torch.no_grad():
        for (layer, head), factor in (scale or {}).items():
            ad.out_proj(layer).weight[:, head * ad.head_dim : (head + 1) * ad.head_dim] *= factor
    return loaded


@pytest.fixture(scope="module")
def ids(text_path: Path) -> torch.Tensor:
    return data.chunks(str(text_path), _model().tokenizer, CHUNKS, SEQ_LEN, seed=0)


def _brute_nll(ad, ids: torch.Tensor) -> torch.Tensor:
    """Per-token CE from the model's own forward pass, log-softmax in float64: (B, T - 1)."""
    logits = ad.logits(ids).to(torch.float64)[:, :-1]
    return -torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]


def _brute_delta(ad, ids: torch.Tensor, layer: int, head: int, method: str, value=None) -> float:
    held = ids[CHUNKS - HELDOUT :]
    clean = _brute_nll(ad, held)
    with ad.ablate_head(layer, head, method, value):
        ablated = _brute_nll(ad, held)
    return float((ablated - clean).mean())


def test_split_and_pairing() -> None:
    mean, held = ab.split_chunks(7, 4)
    assert mean.tolist() == [0, 1, 2] and held.tolist() == [3, 4, 5, 6]
    assert ab.resample_sources(3, 4).tolist() == [0, 1, 2, 0]
    assert [a.tolist() for a in ab.split_chunks(4, 4)] == [[0], [1, 2, 3]]  # at least one mean chunk
    with pytest.raises(InputError, match="--chunks 1 leaves no mean chunk"):
        ab.split_chunks(1, 1)
    with pytest.raises(InputError, match="--heldout-chunks 0"):
        ab.split_chunks(4, 0)


def _fit_readout(ad, ids: torch.Tensor, steps: int = 300) -> None:
    """Fit the LM head to the clean final states (logistic regression, Adam), so that the model
    uses its residual stream: a random model's readout predicts nothing, so no head of it is
    critical in the trained sense."""
    with torch.no_grad():
        h = ad.embed(ids)
        for k in range(ad.n_layers):
            h = ad.block(k)(h)
        X = ad.final_norm(h)[:, :-1].reshape(-1, ad.d_model).clone()
    W = ad.lm_head.weight.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([W], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(X @ W.T, ids[:, 1:].reshape(-1)).backward()
        opt.step()
    with torch.no_grad():
        ad.lm_head.weight.copy_(W)


def test_planted_head_is_most_critical(ids: torch.Tensor) -> None:
    """A layer-0 head scaled ×30 dominates the residual the (fitted) readout uses: it is the
    most critical head under every method, by a wide margin."""
    ad = _model({(0, 2): 30.0}).adapter
    _fit_readout(ad, ids)
    table, _ = ab.criticality(ad, ids, METHODS, HELDOUT, BATCH, n_boot=50)
    for _, t in table.groupby("method"):
        top = t.loc[t["criticality"].idxmax()]
        assert (top["layer"], top["head"]) == (0, 2)
        assert top["criticality"] > 2 * t["criticality"].drop(index=top.name).max()
        assert top["criticality_lo"] > 0


def test_silenced_head_gives_exactly_zero(ids: torch.Tensor) -> None:
    ad = _model({(0, 1): 0.0, (1, 3): 0.0}).adapter
    table, rows = ab.criticality(ad, ids, METHODS, HELDOUT, BATCH, n_boot=50)
    silenced = rows[rows[["layer", "head"]].apply(tuple, axis=1).isin([(0, 1), (1, 3)])]
    assert len(silenced) == 2 * len(METHODS) * HELDOUT
    assert (silenced["delta_ce_sum"] == 0.0).all()  # bit-exact: the same code path, clean and ablated
    others = rows.drop(index=silenced.index)
    assert (others["delta_ce_sum"] != 0.0).all()
    zeros = table[table["criticality"] == 0.0]
    assert len(zeros) == 2 * len(METHODS)
    assert (zeros["criticality_lo"] == 0).all() and (zeros["criticality_hi"] == 0).all()


@pytest.mark.parametrize("budget", [ab.LOGITS_BUDGET, 2 * 23 * 256])  # all chunks at once; two at a time
def test_delta_ce_matches_full_forward_passes(ids: torch.Tensor, budget: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every head, mean ablation: truncated block path vs the model's own forward pass."""
    monkeypatch.setattr(ab, "LOGITS_BUDGET", budget)
    ad = _model().adapter
    table, _ = ab.criticality(ad, ids, ("mean",), HELDOUT, BATCH, n_boot=50)
    means = ab.head_means(ad, ids[: CHUNKS - HELDOUT], BATCH)
    for row in table.itertuples():
        want = _brute_delta(ad, ids, row.layer, row.head, "mean", means[row.layer][row.head].float())
        assert abs(row.criticality - want) < 1e-5, (row.layer, row.head, row.criticality, want)
    held = ids[CHUNKS - HELDOUT :]
    np.testing.assert_allclose(table["ce_clean"], float(_brute_nll(ad, held).mean()), rtol=1e-6)
    assert (table["n_tokens"] == HELDOUT * (SEQ_LEN - 1)).all() and (table["n_chunks"] == HELDOUT).all()


def test_zero_ablation_equals_zeroed_weights(ids: torch.Tensor) -> None:
    ad = _model().adapter
    table, _ = ab.criticality(ad, ids, ("zero",), HELDOUT, BATCH, n_boot=50)
    held = ids[CHUNKS - HELDOUT :]
    clean = _brute_nll(ad, held).mean()
    for layer, head in [(0, 2), (1, 0)]:
        zeroed = _model({(layer, head): 0.0}).adapter  # an independent copy with the slice zeroed
        want = float(_brute_nll(zeroed, held).mean() - clean)
        got = table.set_index(["layer", "head"]).loc[(layer, head), "criticality"]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_head_means_and_resample_pairing(ids: torch.Tensor) -> None:
    ad = _model().adapter
    mean_ids = ids[: CHUNKS - HELDOUT]
    means = ab.head_means(ad, mean_ids, 2)
    for layer in range(ad.n_layers):
        brute = ad.head_outputs(mean_ids, layer).to(torch.float64).mean(dim=(0, 1))
        torch.testing.assert_close(means[layer], brute, rtol=1e-5, atol=1e-6)
    # resample: held-out chunk i gets the head's output on mean chunk i mod 3 (chunks 0, 1, 2, 0)
    layer, head = 1, 1
    table, _ = ab.criticality(ad, ids, ("resample",), HELDOUT, BATCH, n_boot=50)
    sources = ids[torch.tensor([0, 1, 2, 0])]
    value = ad.head_outputs(sources, layer)[:, :, head]
    want = _brute_delta(ad, ids, layer, head, "resample", value)
    got = table.set_index(["layer", "head"]).loc[(layer, head), "criticality"]
    assert got == pytest.approx(want, abs=1e-5)
    # the block-path head outputs are those of the model's forward pass
    torch.testing.assert_close(ab.head_outputs(ad, sources, [layer])[layer], ad.head_outputs(sources, layer),
                               rtol=1e-5, atol=1e-6)


def test_bootstrap_interval() -> None:
    rng = np.random.default_rng(3)
    sums = rng.normal(size=(5, 8)) * 10 + 2
    tokens = np.full(8, 23.0)
    counts = ab.bootstrap_counts(8, 400, seed=7)
    assert counts.shape == (400, 8) and (counts.sum(axis=1) == 8).all()
    np.testing.assert_array_equal(counts, ab.bootstrap_counts(8, 400, seed=7))
    assert not np.array_equal(counts, ab.bootstrap_counts(8, 400, seed=8))
    lo, hi = ab.ratio_interval(sums, tokens, counts)
    point = sums.sum(axis=1) / tokens.sum()
    assert (lo <= point).all() and (point <= hi).all() and (lo < hi).all()
    # against resampling the chunks directly with the same draws
    draws = np.random.default_rng(np.random.SeedSequence([7, ab.BOOT_TAG])).integers(0, 8, size=(400, 8))
    ratios = sums[:, draws].sum(axis=2) / (tokens[draws].sum(axis=1))
    np.testing.assert_allclose(lo, np.percentile(ratios, 2.5, axis=1), rtol=1e-12)
    np.testing.assert_allclose(hi, np.percentile(ratios, 97.5, axis=1), rtol=1e-12)


def test_one_held_out_chunk_gives_no_interval_rather_than_a_point() -> None:
    """A bootstrap over one chunk draws that chunk every time: the interval once collapsed to
    the point (criticality_lo == criticality_hi for every head) and nothing said so."""
    rows = pd.DataFrame({"layer": [0, 0, 1], "head": [0, 1, 0], "method": "mean", "chunk": 5,
                         "delta_ce_sum": [2.0, -1.0, 0.5], "ce_clean_sum": [30.0, 30.0, 30.0], "n_tokens": 10})
    table = ab.aggregate(rows, ["mean"], n_boot=50, seed=0)
    np.testing.assert_array_equal(table["criticality"], [0.2, -0.1, 0.05])
    assert table["criticality_lo"].isna().all() and table["criticality_hi"].isna().all()
    assert (table["n_chunks"] == 1).all()


def test_check_refuses_too_few_chunks(tmp_path: Path, text_path: Path) -> None:
    config = RunConfig(model="random:llama", text=str(text_path), chunks=1, seq_len=16)
    with pytest.raises(InputError) as info:
        ablate_stage.check(config)
    message = str(info.value)
    assert "\n" not in message and "--chunks 1" in message and "--chunks 2 or more" in message
    out = tmp_path / "run"
    with pytest.raises(InputError, match="--chunks 1 leaves no mean chunk"):
        run_workflow(config, out, stages=("ablate",), execution=Execution(quiet=True, jobs=1))
    assert not out.exists()
    ablate_stage.check(RunConfig(model="random:llama", text=str(text_path), chunks=2, seq_len=16))  # 1 held out


def test_stage_table_and_resume(tmp_path: Path, text_path: Path, ids: torch.Tensor) -> None:
    config = RunConfig(model="random:llama", text=str(text_path), chunks=CHUNKS, seq_len=SEQ_LEN, batch_size=BATCH,
                       heldout_chunks=HELDOUT, ablation_methods=METHODS, ablation_boot=200, seed=0)
    execution = Execution(quiet=True, jobs=1)
    out = run_workflow(config, tmp_path / "run", stages=("ablate",), execution=execution)
    table = pd.read_parquet(out / "tables" / "ablation.parquet")
    ad = _model().adapter
    assert len(table) == ad.n_layers * ad.n_heads * len(METHODS)
    assert list(table.columns[:3]) == ["model", "revision", "text"]
    assert not table.duplicated(["layer", "head", "method"]).any()
    assert (table["criticality_lo"] <= table["criticality"]).all()
    assert (table["criticality"] <= table["criticality_hi"]).all()
    # the in-memory computation gives the same numbers
    mem, _ = ab.criticality(ad, ids, METHODS, HELDOUT, BATCH, n_boot=200, seed=0)
    pd.testing.assert_frame_equal(table[mem.columns].reset_index(drop=True), mem, check_exact=True)
    # drop units (the second batch's layer 1, the first batch's layer 0) and resume: the same table
    units = out / "units" / "ablate"
    assert sorted(p.stem for p in units.glob("*.done")) == [ablate_stage.unit_key(b, l) for b in (0, 1) for l in (0, 1)]
    for key in (ablate_stage.unit_key(1, 1), ablate_stage.unit_key(0, 0)):
        (units / f"{key}.done").unlink()
    run_workflow(config, out, run_mode=RunMode.RESUME, stages=("ablate",), execution=execution)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "ablation.parquet"), table, check_exact=True)


def test_aggregate_order_free_and_partial() -> None:
    """The table does not depend on the order of the rows; a (layer, head, method) missing a
    chunk (a failed unit) reports the chunks it has."""
    rng = np.random.default_rng(0)
    keys = [(l, h, m, c) for l in range(2) for h in range(3) for m in ("zero", "mean") for c in range(4)]
    rows = pd.DataFrame(keys, columns=["layer", "head", "method", "chunk"])
    rows["delta_ce_sum"] = rng.normal(size=len(rows))
    rows["ce_clean_sum"] = 100.0 + rows["chunk"]
    rows["n_tokens"] = 23
    table = ab.aggregate(rows, ("zero", "mean"), 100, seed=1)
    shuffled = ab.aggregate(rows.sample(frac=1.0, random_state=2), ("zero", "mean"), 100, seed=1)
    pd.testing.assert_frame_equal(table, shuffled, check_exact=True)
    assert table[["layer", "head", "method"]].values.tolist()[:2] == [[0, 0, "zero"], [0, 0, "mean"]]
    one = rows[(rows["layer"] == 1) & (rows["head"] == 2) & (rows["method"] == "mean")]
    np.testing.assert_allclose(table.iloc[-1]["criticality"], one["delta_ce_sum"].sum() / (4 * 23), rtol=1e-15)
    partial = ab.aggregate(rows.drop(index=one.index[-1]), ("zero", "mean"), 100, seed=1)
    last = partial.iloc[-1]
    assert (last["n_chunks"], last["n_tokens"]) == (3, 3 * 23)
    assert last["criticality"] == pytest.approx(one["delta_ce_sum"].iloc[:3].sum() / (3 * 23), rel=1e-15)
    pd.testing.assert_frame_equal(partial.iloc[:-1], table.iloc[:-1], check_exact=True)


def test_ablate_each_ablates_one_head_per_block_of_rows(ids: torch.Tensor) -> None:
    ad = _model().adapter
    held = ids[:2]
    with torch.inference_mode():
        h = ad.embed(held)
        heads = [1, 0, 1]
        values = torch.randn(3, held.shape[0], held.shape[1], ad.head_dim)
        with ad.ablate_each(1, heads, "resample", values):
            got = ad.block(1)(h.repeat(3, 1, 1))
        for i, head in enumerate(heads):  # each block as ablate_head gives it on its own
            with ad.ablate_head(1, head, "resample", values[i]):
                want = ad.block(1)(h)
            torch.testing.assert_close(got[i * 2 : (i + 1) * 2], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="expected \\(n, hd\\)"):
        with ad.ablate_each(1, [0, 1], "mean", torch.zeros(3, ad.head_dim)):
            pass
    with pytest.raises(InputError, match="not 2 blocks"):
        with torch.inference_mode(), ad.ablate_each(1, [0, 1], "zero"):
            ad.block(1)(h[:1])
