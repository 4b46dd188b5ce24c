"""Prompts files (``--text FILE.jsonl``): each prompt one chunk of its own length, with optional
positions to analyse. Every quantity a stage computes from a prompt is checked against an
independent computation: the prompt run alone, unpadded, through the model (float64), reduced
by hand over its analysed positions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from depthlens import data
from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.models import load_model
from depthlens.workflow import run

#: Three prompts of different lengths; the second and third name the positions to analyse
#: (BOS is position 0; -1 the last token).
PROMPTS = [
    {"text": "When Mary and John went to the store, John gave a drink to"},
    {"text": "The cat sat on the mat.", "positions": [3, 5, 9, -1]},
    {"text": "Sentence number 4 talks about topic 4 and the weather.", "positions": [1, 2, 6, 9, 12, 30]},
]
QUIET = Execution(quiet=True, jobs=1)


def _write(path: Path, prompts: list[dict], blank: bool = True) -> Path:
    lines = [json.dumps(p) for p in prompts]
    if blank:
        lines.insert(1, "")  # blank lines are skipped
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def prompts_file(tmp_path: Path) -> Path:
    return _write(tmp_path / "prompts.jsonl", PROMPTS)


@pytest.fixture(scope="module")
def model64():
    """The run's model as the workflow loads it (``random:llama``, seed 0), in float64."""
    return load_model("random:llama", dtype="float64", seed=0)


def _alone(loaded, prompt: dict) -> tuple[torch.Tensor, np.ndarray]:
    """The prompt tokenized alone (BOS first) as a (1, n) tensor, and its analysed positions."""
    ids = loaded.tokenizer(prompt["text"], add_special_tokens=False)["input_ids"]
    ids = torch.tensor([[loaded.tokenizer.bos_token_id, *ids]])
    n = ids.shape[1]
    positions = np.arange(n) if "positions" not in prompt else np.unique(np.asarray(prompt["positions"]) % n)
    return ids, positions


def test_load_prompts_and_chunks(prompts_file: Path, model64) -> None:
    source = data.load_prompts(prompts_file)
    assert [p.line for p in source.prompts] == [1, 3, 4]
    assert source.sha256 == hashlib.sha256(prompts_file.read_bytes()).hexdigest()
    chunks = data.prompt_chunks(source, model64.tokenizer)
    assert len(chunks) == 3 and chunks.prompts and chunks.ragged
    for i, prompt in enumerate(PROMPTS):
        ids, positions = _alone(model64, prompt)
        n = ids.shape[1]
        assert chunks.lengths[i] == n
        assert torch.equal(chunks.ids[i, :n], ids[0])
        np.testing.assert_array_equal(chunks.positions(i), positions)
        assert not chunks.analysed[i, n:].any()
    assert chunks.ids.shape[1] == chunks.lengths.max()
    assert len(data.prompt_chunks(source, model64.tokenizer, 2)) == 2
    assert len(data.prompt_chunks(source, model64.tokenizer, 50)) == 3  # --chunks above the count: all prompts
    batch = chunks.take([1])  # a batch is cut to its longest prompt
    assert batch.ids.shape == (1, chunks.lengths[1]) and batch.lines == (3,)


def test_attention_operators_equal_each_prompt_alone(prompts_file: Path, model64, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) Every matrix the attention stage analyses is the prompt's own operator, as the
    prompt run alone and unpadded gives it; the table's row features average over the analysed
    rows only, and the operator quantities are those of the whole matrix."""
    from depthlens.attention import analysis
    from depthlens.attention.features import matrix_features

    seen: dict[tuple[int, int, int], np.ndarray] = {}
    real = analysis.head_chunk_row

    def record(A, layer, head, chunk, *rest):
        seen[(layer, head, chunk)] = np.array(A)
        return real(A, layer, head, chunk, *rest)

    monkeypatch.setattr(analysis, "head_chunk_row", record)
    config = RunConfig(model="random:llama", dtype="float64", text=str(prompts_file), batch_size=2, null_samples=2,
                       null_chunks=1, extras_chunks=0, certify="none", probe_seqs=2, probe_len=4, ratio_seqs=1)
    out = run(config, tmp_path / "run", stages=("attention",), execution=QUIET)
    table = pd.read_parquet(out / "tables" / "head_chunks.parquet")
    adapter = model64.adapter
    assert len(seen) == 3 * adapter.n_layers * adapter.n_heads
    for chunk, prompt in enumerate(PROMPTS):
        ids, positions = _alone(model64, prompt)
        n = ids.shape[1]
        rows = np.zeros(n, dtype=bool)
        rows[positions] = True
        for layer, probs in adapter.attention_probs(ids):
            for head in range(adapter.n_heads):
                alone = probs[0, head].numpy()
                got = seen[(layer, head, chunk)]
                assert got.shape == (n, n)
                np.testing.assert_allclose(got, alone, rtol=0, atol=1e-12)
                np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-12)  # row-stochastic
                assert np.all(np.triu(got, 1) == 0)  # causal
                row = table[(table["layer"] == layer) & (table["head"] == head) & (table["chunk"] == chunk)].iloc[0]
                expect = matrix_features(alone, extras=False)
                for name in ("norm_B", "rho_B", "henrici_B", "kreiss_A"):
                    assert row[name] == pytest.approx(expect[name], rel=1e-9), name
                assert row["kreiss_B"] == pytest.approx(expect["kreiss_B"], rel=1e-7)
                # the row features over the analysed rows, by hand (0-based rows >= 1 for sink mass)
                sink_rows = positions[positions >= 1]
                assert row["sink_mass"] == pytest.approx(alone[sink_rows, 0].mean(), rel=1e-12)
                assert row["prev_weight"] == pytest.approx(alone[sink_rows, sink_rows - 1].mean(), rel=1e-12)
                logs = np.log(np.where(alone > 0, alone, 1.0))
                assert row["row_entropy"] == pytest.approx(-(alone * logs).sum(axis=1)[positions].mean(), rel=1e-12)
    depth = pd.read_parquet(out / "tables" / "depth.parquet")
    assert sorted(depth["chunk"].unique()) == [0, 1, 2]


def test_position_averages_equal_single_prompt_averages(prompts_file: Path, model64, tmp_path: Path) -> None:
    """(b) The mean Jacobians (``--positions all``: every analysed position), the residual
    summaries and the ablation cross-entropies average over the analysed positions only,
    as computed by hand from each prompt run alone."""
    from depthlens.jacobian.engines import input_state, sublayer_jacobians
    from depthlens.runs.atomic import map_safetensors

    config = RunConfig(model="random:llama", dtype="float64", text=str(prompts_file), batch_size=2,
                       jacobian_mode="isolated", positions="all", funnel_rank=0, funnel_alphas=(1.0,), funnel_boot=0,
                       null="none", heldout_chunks=1, ablation_methods=("mean", "zero"), ablation_boot=20)
    out = run(config, tmp_path / "run", stages=("capture", "jacobian", "ablate"), execution=QUIET)
    adapter = model64.adapter
    alone = [_alone(model64, p) for p in PROMPTS]

    # the mean Jacobians: every analysed position of every prompt, each prompt alone
    saved = map_safetensors(out / "arrays" / "jacobians_trained_isolated.safetensors")
    for layer in range(adapter.n_layers):
        for kind in ("attn", "mlp"):
            stacks = []
            for ids, positions in alone:
                states = adapter.residual_states(ids)
                stacks.append(sublayer_jacobians(adapter, states[input_state(adapter, layer, kind, "isolated")], layer,
                                                 kind, "isolated", positions=positions.tolist()))
            expect = torch.cat(stacks).mean(dim=0).numpy()
            np.testing.assert_allclose(saved[f"{layer}.{kind}"], expect, rtol=0, atol=1e-12)

    # the residual summaries: over the analysed positions, max_pos a position of the prompt
    summary = pd.read_parquet(out / "tables" / "residual_summary.parquet")
    for chunk, (ids, positions) in enumerate(alone):
        states = adapter.residual_states(ids)[:, 0].numpy()
        rows = summary[summary["chunk"] == chunk].reset_index(drop=True)
        for b in range(states.shape[0]):
            h = states[b, positions]
            assert rows.loc[b, "rms"] == pytest.approx(np.sqrt(np.mean(h**2)), rel=1e-12)
            assert rows.loc[b, "median_abs"] == pytest.approx(np.median(np.abs(h)), rel=1e-12)
            pos, dim = np.unravel_index(np.argmax(np.abs(h)), h.shape)
            assert (rows.loc[b, "max_pos"], rows.loc[b, "max_dim"]) == (positions[pos], dim)

    # the ablation: the clean and the mean-ablated cross-entropy of the held-out prompt (the last)
    # at its analysed positions that predict a token of it; the head means over every position
    # of the mean prompts
    table = pd.read_parquet(out / "tables" / "ablation.parquet")
    ids, positions = alone[2]
    counted = positions[positions < ids.shape[1] - 1]

    def ce(logits: torch.Tensor) -> float:
        logp = torch.log_softmax(logits[0].to(torch.float64), dim=-1)
        return float(-logp[counted, ids[0, counted + 1]].mean())

    clean = ce(adapter.logits(ids))
    assert table["n_tokens"].unique().tolist() == [len(counted)]
    assert table["ce_clean"].to_numpy() == pytest.approx(clean, rel=1e-12)
    for layer in range(adapter.n_layers):
        outputs = torch.cat([adapter.head_outputs(alone[c][0], layer)[0] for c in (0, 1)])  # (positions, H, hd)
        for head in range(adapter.n_heads):
            with adapter.ablate_head(layer, head, "mean", outputs[:, head].mean(dim=0)):
                expect = ce(adapter.logits(ids)) - clean
            got = table[(table["layer"] == layer) & (table["head"] == head) & (table["method"] == "mean")]
            assert float(got["criticality"].iloc[0]) == pytest.approx(expect, rel=1e-9, abs=1e-12)


def test_engines_take_each_chunks_own_positions(prompts_file: Path, model64) -> None:
    """The Jacobian engines with per-chunk positions (padded prompts) in every mode, as means
    and as chunk sums, equal the operators of each prompt alone."""
    from depthlens.jacobian.engines import chunk_operator_sums, input_state, mean_operators, sublayer_jacobians

    adapter = model64.adapter
    chunks = data.prompt_chunks(prompts_file, model64.tokenizer)
    own = [chunks.positions(c).tolist() for c in range(len(chunks))]
    for mode in ("in_context", "isolated_observed"):
        means = mean_operators(adapter, chunks.ids, jacobian_mode=mode, batch_size=2, chunk_positions=own)
        sums = {key: (S, n) for key, S, n in chunk_operator_sums(adapter, chunks.ids, [(1, "attn"), (0, "mlp")], mode,
                                                                 batch_size=2, chunk_positions=own)}
        for layer, kind in ((1, "attn"), (0, "mlp")):
            per_prompt = []
            for prompt in PROMPTS:
                ids, positions = _alone(model64, prompt)
                states = adapter.residual_states(ids)
                per_prompt.append(sublayer_jacobians(adapter, states[input_state(adapter, layer, kind, mode)], layer,
                                                     kind, mode, positions=positions.tolist()))
            expect = torch.cat(per_prompt).mean(dim=0).numpy()
            np.testing.assert_allclose(means[(layer, kind)], expect, rtol=0, atol=1e-12)
            S, n = sums[(layer, kind)]
            assert n.tolist() == [len(p) for p in own]
            for c, J in enumerate(per_prompt):
                np.testing.assert_allclose(S[c], J.sum(dim=0).numpy(), rtol=0, atol=1e-11)


def test_cli_runs_every_stage_on_prompts_and_resumes(prompts_file: Path, tmp_path: Path) -> None:
    """(c) ``depthlens run`` on a 3-prompt file of different lengths runs every stage (small
    sizes) and exits 0; the manifest records the file's SHA-256 and each prompt; a resumed run
    after losing a unit gives the same tables."""
    out = tmp_path / "run"
    args = ["run", "--model", "random:llama", "--text", str(prompts_file), "--preset", "quick", "--n-perm", "20",
            "--ablation-boot", "20", "--contest-boot", "20", "--contest-perm", "20", "--skip-positions", "1",
            "--batch-size", "2", "--jobs", "1", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert {name: s["status"] for name, s in manifest["stages"].items()} == dict.fromkeys(
        ("capture", "attention", "ablate", "clamp", "jacobian", "topology", "contest"), "done")
    record = manifest["data"]
    assert record["text_sha256"] == hashlib.sha256(prompts_file.read_bytes()).hexdigest()
    assert record["kind"] == "prompts" and record["lines"] == [1, 3, 4] and len(set(record["lengths"])) == 3
    assert record["analysed"][1:] == [4, 6] and record["shape"] == [3, max(record["lengths"])]
    heads = pd.read_parquet(out / "tables" / "head_chunks.parquet")
    assert sorted(heads["chunk"].unique()) == [0, 1, 2]
    tables = {p.name: pd.read_parquet(p) for p in (out / "tables").glob("*.parquet")}
    # lose the capture stage's second unit (the third prompt) and a table, then resume: the same tables
    lost = sorted((out / "units" / "capture").glob("batch00001.*"))
    assert lost
    for path in lost:
        path.unlink()
    (out / "tables" / "residual_summary.parquet").unlink()
    assert main(["capture", *args[1:], "--out", str(out), "--resume"]) == 0
    assert sorted((out / "units" / "capture").glob("batch00001.*")) == lost
    for name in ("attention_patterns.parquet", "residual_summary.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / name), tables[name])


@pytest.mark.parametrize(("content", "message"), [
    ('{"text": "a b c"}\n{"text": "d e\n', "line 2 is not JSON"),
    ('{"text": "a b c"}\n["d e"]\n', "line 2 is a JSON list, not an object"),
    ('{"prompt": "a b c"}\n', "has the key 'prompt'"),
    ('{"positions": [1]}\n', 'line 1 has no "text"'),
    ('{"text": ""}\n', '"text" is empty'),
    ('{"text": "a b c", "positions": []}\n', '"positions" is []'),
    ('{"text": "a b c", "positions": [1.5]}\n', "which is no integer"),
    ('{"text": "a b c", "positions": [1, 40]}\n', "position 40 is out of range for its 6 tokens"),
    ('{"text": "a b c", "positions": [5, -1]}\n', "position -1 names token 5 a second time"),
    ("", "holds no prompts"),
    ("\n  \n", "holds no prompts"),
    ('{"text": "' + "x" * 300 + '"}\n', "is 301 tokens long (BOS included), beyond the context of random:llama (256"),
])
def test_bad_prompts_files_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                           message: str) -> None:
    """(d) A bad prompts file is refused in one line with exit 2, and nothing is written."""
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    out = tmp_path / "run"
    assert main(["capture", "--model", "random:llama", "--text", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("depthlens: error:") and message in err and "\n" not in err, err
    assert not out.exists()


def test_stages_refuse_prompts_they_cannot_measure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where a stage cannot measure the prompts it says so in one line, before anything is
    written: resample ablation with a held-out prompt longer than its pair, a held-out prompt
    whose only analysed position is its last, and topology with too few positions."""
    path = _write(tmp_path / "p.jsonl", [{"text": "short"}, {"text": "a much longer prompt"}], blank=False)
    out = tmp_path / "run"
    base = ["--model", "random:llama", "--text", str(path), "--out", str(out), "--quiet"]
    cases = [(["ablate", *base, "--ablation-methods", "mean,resample", "--heldout-chunks", "1"],
              "resample ablation replaces a head's outputs on held-out prompt 1 (line 2 of"),
             (["topology", *base, "--skip-positions", "30"], "the topology stage 0 analysed position(s)")]
    last = _write(tmp_path / "last.jsonl", [{"text": "one two"}, {"text": "three four", "positions": [-1]}],
                  blank=False)
    cases.append((["ablate", "--model", "random:llama", "--text", str(last), "--out", str(out), "--quiet"],
                  "held-out prompt 1 (line 2 of"))
    for args, message in cases:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
        assert not out.exists()


def test_train_refuses_a_prompts_file(tmp_path: Path) -> None:
    from depthlens.errors import InputError
    from depthlens.training.options import TrainOptions

    with pytest.raises(InputError, match="is a prompts file"):
        TrainOptions(text=str(tmp_path / "p.jsonl"))
