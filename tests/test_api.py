"""The Python API: ``depthlens.analyse`` on a spec or an in-memory model, the lazy ``Run``,
resuming through ``out``, and the README's example run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import depthlens
from depthlens.errors import InputError, RunError
from depthlens.models import build_random
from depthlens.schema import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"chunks": 2, "seq_len": 16, "probe_seqs": 4, "probe_len": 6, "null_samples": 2, "null_chunks": 1}


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory: pytest.TempPathFactory, text_file: Path) -> depthlens.Run:
    out = tmp_path_factory.mktemp("api") / "run"
    return depthlens.analyse("random:llama", text=str(text_file), stages=["attention"], out=out, preset="quick",
                             jobs=1, **SMALL)


def test_tables_are_the_run_directorys_dataframes(attention_run: depthlens.Run) -> None:
    run = attention_run
    assert run.tables == ["heads", "head_chunks", "head_probe", "induction_seqs", "depth"]
    heads = run.heads
    assert isinstance(heads, pd.DataFrame) and len(heads) > 0
    pd.testing.assert_frame_equal(heads, pd.read_parquet(run.path / "tables" / "heads.parquet"))
    assert list(heads.columns[:3]) == ["model", "revision", "text"] and set(heads["model"]) == {"random:llama"}
    with pytest.raises(AttributeError, match="no operators table: stage jacobian not run"):
        run.operators
    with pytest.raises(AttributeError):
        run.no_such_table
    assert set(run.tables) <= set(dir(run))


def test_arrays_summaries_config_verdicts_and_report(attention_run: depthlens.Run) -> None:
    run = attention_run
    arrays = run.arrays("pseudospectra")
    assert any(k.endswith(".sigma") for k in arrays)
    assert run.summary("attention")["n_heads"] == len(run.heads)
    with pytest.raises(RunError, match="topology.json: stage topology not run"):
        run.summary("topology")
    assert run.config == depthlens.RunConfig(preset="quick", model="random:llama", text=run.config.text, **SMALL)
    assert run.config.hash() == run.manifest["config_hash"]
    verdicts = run.verdicts
    assert {"id", "verdict"} <= set(verdicts.columns) and len(verdicts) > 0
    assert set(verdicts["verdict"]) <= {"supported", "falsified", "inconclusive", "not tested"}
    jacobian_claims = verdicts[verdicts["statistic"].str.startswith("complex_frac")]
    assert (jacobian_claims["verdict"] == "not tested").all()
    report = run.report()
    assert report == run.path / "report.html" and report.is_file()
    assert depthlens.open_run(run.path).heads.equals(run.heads)


def test_out_resumes_and_if_exists_is_checked(attention_run: depthlens.Run, text_file: Path) -> None:
    before = attention_run.heads
    again = depthlens.analyse("random:llama", text=str(text_file), stages=["attention"], out=attention_run.path,
                              preset="quick", jobs=1, **SMALL)
    manifest = json.loads((again.path / "manifest.json").read_text())
    assert len(manifest["resumed"]) == 1  # every unit was finished: nothing recomputed
    pd.testing.assert_frame_equal(again.heads, before)
    with pytest.raises(RunError, match="holds a depthlens run"):
        depthlens.analyse("random:llama", text=str(text_file), stages=["attention"], out=attention_run.path,
                          if_exists="error", preset="quick", jobs=1, **SMALL)
    with pytest.raises(InputError, match="if_exists='keep' is unknown"):
        depthlens.analyse("random:llama", if_exists="keep")
    with pytest.raises(InputError, match="unknown config key 'null_sample'"):
        depthlens.analyse("random:llama", null_sample=3)


def test_a_failed_analyse_without_out_leaves_no_temporary_folder(tmp_path: Path, text_file: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(InputError, match="seq_len=32 exceeds"):
        depthlens.analyse("random:llama:max_position_embeddings=16", text=str(text_file), stages=["capture"],
                          chunks=2, seq_len=32, jobs=1)
    with pytest.raises(InputError, match="sweep file"):  # so do a census and a sweep
        depthlens.sweep(tmp_path / "no-such-sweep.toml")
    with pytest.raises(InputError, match="no checkpoint series"):
        depthlens.census("random:llama", jobs=1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("depthlens-")] == []


def test_census_and_sweep_stay_the_api_functions_beside_their_subpackages() -> None:
    """``depthlens.census`` and ``depthlens.sweep`` are the API's functions, also once the
    subpackages of the same names are imported (the API itself imports one)."""
    import subprocess
    import sys

    code = ("import depthlens, depthlens.api, depthlens.census.runner, depthlens.sweep.runner\n"
            "assert depthlens.census is depthlens.api.census and depthlens.sweep is depthlens.api.sweep\n"
            "from depthlens.sweep import read_sweep\n"
            "from depthlens.report.onsets import head_onsets")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_in_memory_model_equals_the_same_model_from_its_spec(tmp_path: Path, text_file: Path) -> None:
    """A model object built like ``random:llama`` gives the spec's numbers; only the name differs."""
    model = build_random("llama", None, seed=0)
    run = depthlens.analyse(model, text=str(text_file), stages=["capture"], out=tmp_path / "memory", jobs=1, **SMALL)
    spec = depthlens.analyse("random:llama", text=str(text_file), stages=["capture"], out=tmp_path / "spec",
                             jobs=1, **SMALL)
    name = run.attention_patterns["model"].iloc[0]
    assert re.fullmatch(r"memory:LlamaForCausalLM@[0-9a-f]{12}", name)
    assert run.manifest["model"]["source"] == "memory"
    for table in ("attention_patterns", "residual_summary"):
        mine, theirs = getattr(run, table), getattr(spec, table)
        pd.testing.assert_frame_equal(mine.drop(columns="model"), theirs.drop(columns="model"))
    with pytest.raises(Exception, match="no transformers model"):
        depthlens.analyse(object(), stages=["capture"], out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_stages_share_the_runs_forward_passes(tmp_path: Path, text_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stages of a run compute the trained model's residual states and attention captures
    of a batch once (capture, in one pass; attention, clamp, jacobian and topology read them
    again), and every table is the one of a run that shares nothing."""
    from depthlens import workflow
    from depthlens.models.adapter import Adapter

    runs: list[str] = []
    states, captures = Adapter._residual_states, Adapter._attention_captures
    monkeypatch.setattr(Adapter, "_residual_states", lambda self, *a: runs.append("states") or states(self, *a))
    monkeypatch.setattr(Adapter, "_attention_captures", lambda self, *a: runs.append("qk") or captures(self, *a))
    stages = ["capture", "attention", "clamp", "jacobian", "topology"]
    options = {**SMALL, "chunks": 4, "batch_size": 2, "preset": "quick", "jobs": 1}
    shared = depthlens.analyse("random:llama", text=str(text_file), stages=stages, out=tmp_path / "shared", **options)
    counts = {kind: runs.count(kind) for kind in ("states", "qk")}
    runs.clear()
    monkeypatch.setattr(workflow, "SHARED_BYTES", 0)
    alone = depthlens.analyse("random:llama", text=str(text_file), stages=stages, out=tmp_path / "alone", **options)
    # two batches: capture's two passes serve every stage; alone, attention runs two more and
    # clamp's detection (no massive dimension here, so no arms), jacobian and topology six more
    assert counts["states"] == 2 and runs.count("states") == 2 + 6
    assert runs.count("qk") == counts["qk"] + 2
    assert shared.tables == alone.tables and len(shared.tables) > 5
    for name in shared.tables:
        pd.testing.assert_frame_equal(shared.table(name), alone.table(name))
    runs.clear()
    monkeypatch.setattr(workflow, "SHARED_BYTES", 1 << 30)
    depthlens.analyse("random:llama:init=layerwise", text=str(text_file), stages=["capture", "clamp"],
                      out=tmp_path / "streamed",
                      stream_layers=True, **options)
    assert runs.count("states") == 2 + 2  # a layer-streamed run keeps nothing: capture's passes, clamp's detection


def test_readme_python_example_runs(tmp_path: Path) -> None:
    """The README's Python example, as written, in a fresh folder and process."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 1, "the README holds one Python example"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "runs" / "api" / "report.html").is_file()
    assert "kreiss_B" in done.stdout and "verdict" in done.stdout


def test_a_run_at_a_scripts_top_level_is_refused_in_one_line(tmp_path: Path, text_file: Path) -> None:
    """Spawned workers re-run a script's top level: without the ``__main__`` guard each one
    started a run of its own (BrokenProcessPool, RunIncomplete several times over, or a hang).
    The unguarded call is refused before any work, naming its line; a call inside a function
    that the guard calls is fine (the README example's form is run by the test above)."""
    call = f'depthlens.analyse("random:llama", text={str(text_file)!r}, stages=["capture"], chunks=2, seq_len=12, jobs=2)'
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    bare = tmp_path / "bare.py"
    bare.write_text(f"import depthlens\n\nrun = {call}\nprint(run.root)\n")
    done = subprocess.run([sys.executable, str(bare)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert f"{bare} line 3 starts a depthlens run at the top level" in last and "__name__" in last
    guarded = tmp_path / "guarded.py"
    guarded.write_text(f"import depthlens\n\n\ndef main():\n    return {call}\n\n\n"
                       f"if __name__ == \"__main__\":\n    print(main().config.seed)\n")
    done = subprocess.run([sys.executable, str(guarded)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_package_exports() -> None:
    assert set(depthlens.__all__) == {"Run", "RunConfig", "__version__", "analyse", "census", "open_run", "sweep"}
    for name in depthlens.__all__:
        assert getattr(depthlens, name) is not None
    with pytest.raises(AttributeError):
        depthlens.nothing  # noqa: B018
    assert set(SCHEMA) >= {"heads", "operators", "coupling"}


# ---------------------------------------------------------------------------------------- run.head
def _rows(table: pd.DataFrame, **keys: int) -> pd.Series:
    mask = pd.Series(True, index=table.index)
    for key, value in keys.items():
        mask &= table[key] == value
    return table[mask].iloc[0]


def test_run_head_has_the_runs_table_values(head_run: depthlens.Run) -> None:
    """A head recomputed on a chunk gives the run's head_chunks row (same configuration, the
    same forward pass), and on its default chunk, the certified median one, the heads table's
    bracket."""
    import math

    run = head_run
    chunks, heads = run.head_chunks, run.heads
    for layer, head, chunk in ((0, 1, 0), (1, 3, 1)):
        view = run.head(layer, head, chunk)
        row = _rows(chunks, layer=layer, head=head, chunk=chunk)
        compared = [name for name, value in row.items() if name in view.values and isinstance(value, float)
                    and not math.isnan(value)]
        assert {"sink_mass", "rho_B", "norm_B", "kreiss_B", "peak_B", "peak_k", "TR1"} <= set(compared)
        # the power-norm bound is in the row on the extras chunks only (quick: the first)
        assert ("kreiss_B_upper" in compared) == (chunk == 0) and math.isfinite(view.kreiss_B_upper)
        for name in compared:
            assert view.values[name] == pytest.approx(row[name], rel=1e-9, abs=1e-12), name
        assert view.chunk_row["kreiss_B"] == row["kreiss_B"] and view.head_row["role"] == _rows(
            heads, layer=layer, head=head)["role"]
    for _, h in heads.iterrows():
        view = run.head(int(h["layer"]), int(h["head"]))
        assert view.chunk == int(h["certified_chunk"])
        for name in ("kreiss_B_lo", "kreiss_B_hi"):
            assert view.values[name] == pytest.approx(h[name], rel=1e-9), name
        assert view.kreiss_B_certified == bool(h["kreiss_B_certified"])


def test_run_head_operators_against_numpy(head_run: depthlens.Run) -> None:
    """A is causal and row-stochastic, B = A − 1e₁ᵀ, the transient equals explicit matrix
    powers and the pseudospectrum a dense SVD of zI − B."""
    view = head_run.head(1, 2, 1)
    A, B, n = view.A, view.B, view.n
    assert A.dtype == B.dtype == np.float64 and A.shape == (n, n) == (16, 16)
    np.testing.assert_allclose(A.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert (A >= 0).all() and not np.triu(A, 1).any()
    P = np.zeros((n, n))
    P[:, 0] = 1.0
    np.testing.assert_array_equal(B, A - P)
    np.testing.assert_array_equal(view.eigenvalues, np.r_[0.0, np.diag(A)[1:]])
    np.testing.assert_allclose(np.sort(np.linalg.eigvals(B).real), np.sort(view.eigenvalues), atol=1e-6)
    X, norms = np.eye(n), []
    for _ in view.powers:
        norms.append(np.linalg.norm(X, 2))
        X = B @ X
    np.testing.assert_allclose(view.transient, norms, rtol=1e-10, atol=1e-300)
    assert view.powers[-1] == max(n, 2 * view.peak_k)
    assert view.peak_B == pytest.approx(view.transient[1:].max(), rel=1e-12)
    grid = view.pseudospectrum
    assert grid.sigma.shape == (121, 121) and np.array_equal(grid.x, np.linspace(-1.5, 1.5, 121))
    for i, j in ((0, 0), (60, 100), (75, 66), (110, 15), (60, 61)):
        z = grid.x[j] + 1j * grid.y[i]
        dense = np.linalg.svd(z * np.eye(n) - B, compute_uv=False)[-1]
        assert grid.sigma[i, j] == pytest.approx(dense, rel=1e-7, abs=1e-15)


def test_run_head_matches_the_saved_explorer_arrays(head_run: depthlens.Run) -> None:
    arrays = head_run.arrays("head_spectra")
    assert arrays["sigma"].shape == (2, 4, 41, 41) and arrays["transient"].shape == (2, 4, 28)
    for layer, head in ((0, 0), (1, 3)):
        chunk = int(arrays["chunk"][layer, head])
        view = head_run.head(layer, head, kmax=int(arrays["powers"][-1]))
        assert view.chunk == chunk  # the default chunk is the one the explorer shows
        np.testing.assert_allclose(arrays["transient"][layer, head], view.transient[arrays["powers"]], rtol=1e-6)
        np.testing.assert_allclose(arrays["sigma"][layer, head], view.pseudospectrum.sigma[::3, ::3], rtol=1e-6)
        np.testing.assert_allclose(arrays["eig"][layer, head], view.eigenvalues, rtol=1e-6, atol=1e-12)


def test_run_head_refuses_what_it_cannot_recompute(head_run: depthlens.Run, tmp_path: Path) -> None:
    run = head_run
    for args, message in (((2, 0, 0), "layer=2 is out of range: the run's model has layers 0 to 1; "
                                      "pass an integer 0 <= layer < 2."),
                          ((0, 4, 0), "head=4 is out of range: each layer of the run's model has heads 0 to 3; "
                                      "pass an integer 0 <= head < 4."),
                          ((0, 0, 2), "chunk=2 is out of range: the run's text has chunks 0 to 1; "
                                      "pass an integer 0 <= chunk < 2."),
                          ((-1, 0, 0), "layer=-1 is out of range"), ((0, "1", 0), "head='1' is out of range"),
                          ((True, 0, 0), "layer=True is out of range")):
        with pytest.raises(InputError) as caught:
            run.head(*args)
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    for change, message in ((("model", "source"), "analysed a model in memory"),
                            (("data", "text_sha256"), "text of the run .* changed since the run")):
        copy = tmp_path / change[0]
        copy.mkdir()
        manifest = json.loads((run.path / "manifest.json").read_text())
        manifest[change[0]][change[1]] = "memory" if change[1] == "source" else "0" * 64
        (copy / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(RunError, match=message):
            depthlens.open_run(copy).head(0, 0, 0)


def test_errors_name_keyword_arguments_where_the_command_line_names_flags(tmp_path: Path, text_file: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The same refusals through the command line and the API: the one names flags, the other
    its keyword arguments (API errors spoke of --overwrite and --chunks)."""
    from depthlens.cli import main
    from depthlens.errors import DepthlensError

    out = tmp_path / "run"
    argv = ["capture", "--model", "random:llama", "--text", str(text_file), "--chunks", "2", "--seq-len", "16",
            "--jobs", "1", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    cases = [(["--chunks", "0"], {"chunks": 0}, "--chunks 0 must be at least 1.", "chunks=0 must be at least 1."),
             ([], {"if_exists": "error"}, "pass --resume to continue that run or --overwrite to replace it.",
              'pass if_exists="resume" to continue that run or if_exists="overwrite" to replace it.'),
             (["--resume", "--chunks", "3"], {"chunks": 3},
              "it was started with --chunks 2, not --chunks 3; rerun with the options it was started with, or pass "
              "--overwrite to replace it.",
              "it was started with chunks=2, not chunks=3; rerun with the options it was started with, or pass "
              'if_exists="overwrite" to replace it.'),
             (["--contest-targets", "foo"], {"contest_targets": ("foo",)}, "--contest-targets 'foo' is unknown",
              "contest_targets='foo' is unknown"),
             (["--executor", "rays"], {"executor": "rays"}, "--executor 'rays' is not understood",
              "executor='rays' is not understood")]
    for extra, keywords, flagged, worded in cases:
        capsys.readouterr()
        assert main([*argv, *extra]) == 2
        assert flagged in capsys.readouterr().err
        with pytest.raises(DepthlensError) as caught:
            depthlens.analyse("random:llama", **{"text": str(text_file), "stages": ["capture"], "chunks": 2,
                                                 "seq_len": 16, "jobs": 1, "out": out, **keywords})
        assert worded in str(caught.value) and "--" not in str(caught.value), str(caught.value)
