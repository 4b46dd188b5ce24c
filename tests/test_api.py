"""The Python API: ``depthlens.analyse`` on a spec or an in-memory model, the lazy ``Run``,
resuming through ``out``, and the README's example run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
    assert run.tables == ["heads", "head_chunks", "head_probe", "depth"]
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
    with pytest.raises(InputError, match="--seq-len"):
        depthlens.analyse("random:llama:max_position_embeddings=16", text=str(text_file), stages=["capture"],
                          chunks=2, seq_len=32, jobs=1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("depthlens-")] == []


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
