"""Sweeps (``depthlens sweep SWEEP.toml``): the sweep file's cells and its one-line errors, and
a sweep of tiny random models end to end: every cell an ordinary run equal to the run made
alone, a failing cell recorded while the others finish, ``--resume`` and ``--overwrite``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from depthlens.cli import main
from depthlens.config import RunConfig
from depthlens.errors import InputError
from depthlens.runs import read_manifest
from depthlens.sweep import read_sweep

SMALL = 'preset = "quick"\nchunks = 2\nseq_len = 16\n[attention]\nprobe_seqs = 4\nprobe_len = 8\n'


def _file(tmp_path: Path, body: str, shared: str = SMALL) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(shared + body)
    return path


def test_cells_are_the_product_of_the_axes_in_order(tmp_path):
    (tmp_path / "notes.txt").write_text("some text " * 50)
    sweep = read_sweep(_file(tmp_path, '[sweep]\nmodels = ["random:llama", "random:gpt2"]\n'
                                       'texts = ["python-docs", "notes.txt"]\nseeds = [0, 3]\n'
                                       'stages = ["attention"]\n'))
    assert len(sweep.cells) == 8 and sweep.stages == ("attention",) and sweep.claims is None
    first, last = sweep.cells[0], sweep.cells[-1]
    assert first.label == "random_llama__python-docs__seed0"
    assert last.label == "random_gpt2__notes.txt__seed3"
    assert last.config.text == str((tmp_path / "notes.txt").resolve())  # relative to the sweep file
    assert [c.config.seed for c in sweep.cells[:2]] == [0, 3]
    # every cell is the shared configuration with its axes set, as a --config file would give
    expected = RunConfig(preset="quick", chunks=2, seq_len=16, probe_seqs=4, probe_len=8, model="random:gpt2",
                         text=str((tmp_path / "notes.txt").resolve()), seed=3)
    assert last.config == expected
    assert len({c.label for c in sweep.cells}) == 8


def test_default_axes_and_stages(tmp_path):
    sweep = read_sweep(_file(tmp_path, '[sweep]\nmodels = ["random:llama"]\n', shared='seed = 4\ntext = "wikitext-2"\n'))
    (cell,) = sweep.cells
    assert cell.axes == {"model": "random:llama", "revision": "", "text": "wikitext-2", "seed": 4}
    assert cell.label == "random_llama__wikitext-2__seed4"
    from depthlens.stages import run_stages

    assert sweep.stages == run_stages()


def test_repeated_labels_get_suffixes(tmp_path):
    sweep = read_sweep(_file(tmp_path, '[sweep]\nmodels = ["random:llama", "random:llama"]\n'))
    assert [c.label for c in sweep.cells] == ["random_llama__python-docs__seed0", "random_llama__python-docs__seed0-2"]


def test_digest_follows_what_is_computed(tmp_path):
    one = read_sweep(_file(tmp_path, '[sweep]\nmodels = ["random:llama"]\nseeds = [0]\n')).digest()
    assert one == read_sweep(tmp_path / "sweep.toml").digest()
    two = read_sweep(_file(tmp_path, '[sweep]\nmodels = ["random:llama"]\nseeds = [1]\n')).digest()
    assert one != two


@pytest.mark.parametrize(("body", "shared", "message"), [
    ("", SMALL, "has no [sweep] table"),
    ('[sweep]\nmodels = ["random:llama"]\nmodel = "x"\n', SMALL, "unknown key [sweep] model;"),
    ('[sweep]\nseeds = [0]\n', SMALL, "[sweep] models is missing"),
    ('[sweep]\nmodels = []\n', SMALL, "[sweep] models is empty"),
    ('[sweep]\nmodels = "random:llama"\n', SMALL, "is not an array of strings"),
    ('[sweep]\nmodels = ["random:llama"]\nseeds = [true]\n', SMALL, "is not an array of integers"),
    ('[sweep]\nmodels = ["random:llama"]\nseeds = [1]\n', "seed = 2\n", "sets both `seed` and [sweep] seeds"),
    ('[sweep]\nmodels = ["random:llama"]\nstages = ["attn"]\n', SMALL, "unknown stage 'attn'"),
    ('[sweep]\nmodels = ["random:llama"]\nclaims = "nope.toml"\n', SMALL, "does not exist"),
    ('[sweep]\nmodels = ["random:llama"]\n', "chunk = 3\n", "cell random_llama__python-docs__seed0:"),
    ('[sweep]\nmodels = ["random:llama"]\n', "[attention]\nnull_samples = -1\n", "cell random_llama"),
])
def test_bad_sweep_files_are_refused_in_one_line(tmp_path, body, shared, message):
    with pytest.raises(InputError) as info:
        read_sweep(_file(tmp_path, body, shared))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unreadable_sweep_file(tmp_path):
    with pytest.raises(InputError, match="sweep file .* does not exist; pass depthlens sweep an existing"):
        read_sweep(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[sweep\n")
    with pytest.raises(InputError, match="is not valid TOML"):
        read_sweep(tmp_path / "bad.toml")


def test_bad_sweep_writes_nothing(tmp_path, capsys):
    path = _file(tmp_path, '[sweep]\nmodels = ["random:llama"]\nstages = ["attention"]\nseedz = [1]\n')
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 2
    assert "unknown key [sweep] seedz" in capsys.readouterr().err and not out.exists()
    # a cell whose plan is refused (a revision for a random model) is refused before any work
    path = _file(tmp_path, '[sweep]\nmodels = ["random:llama"]\nrevisions = ["step1"]\nstages = ["attention"]\n')
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 2
    assert "--revision 'step1' only applies to hub ids" in capsys.readouterr().err and not out.exists()
    # a cell naming a model path that is not there is refused before any cell runs
    path = _file(tmp_path, f'[sweep]\nmodels = ["random:llama", "{tmp_path / "no" / "model"}"]\nstages = ["attention"]\n')
    assert main(["sweep", str(path), "--out", str(out), "--quiet"]) == 2
    assert "no file or folder at" in capsys.readouterr().err and not out.exists()


@pytest.mark.full_leg
def test_sweep_end_to_end(tmp_path, text_file, capsys):
    """Two tiny random models and a hub id that cannot be loaded offline: the good cells equal
    runs made alone, the bad one is recorded and marked in the comparison, and ``--resume``
    retries only it."""
    path = _file(tmp_path, f'[sweep]\nmodels = ["random:llama", "random:gpt2", "no-such-org/no-such-model"]\n'
                           f'texts = ["{text_file}"]\nstages = ["attention"]\n')
    out = tmp_path / "sweep"
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--jobs", "1"]) == 3  # a cell failed
    err = capsys.readouterr().err
    assert "sweep: cell no-such-org_no-such-model__corpus.txt__seed0 failed:" in err
    assert [line for line in err.splitlines() if line.startswith("depthlens: error:")] == [
        line for line in err.splitlines() if "sweep unit no-such-org_no-such-model__corpus.txt__seed0 failed" in line]
    table = pd.read_parquet(out / "tables" / "sweep.parquet")
    assert list(table["status"]) == ["done", "done", "failed"]
    assert list(table["model"]) == ["random:llama", "random:gpt2", "no-such-org/no-such-model"]
    assert table["error"].iloc[2] and table["error"].iloc[0] == ""
    assert read_manifest(out)["kind"] == "sweep" and (out / "sweep.toml").read_text() == path.read_text()
    alone, shared = tmp_path / "alone", tmp_path / "shared.toml"
    shared.write_text(SMALL)
    assert main(["attention", "--config", str(shared), "--model", "random:gpt2", "--text", str(text_file),
                 "--out", str(alone), "--quiet", "--jobs", "1"]) == 0
    cell = out / table["run_dir"].iloc[1]
    assert read_manifest(cell)["config_hash"] == read_manifest(alone)["config_hash"]
    pd.testing.assert_frame_equal(pd.read_parquet(cell / "tables" / "heads.parquet"),
                                  pd.read_parquet(alone / "tables" / "heads.parquet"))
    html = (out / "compare" / "compare.html").read_text()
    assert "no-such-org_no-such-model__corpus.txt__seed0" in html and "failed" in html
    # --resume: the finished cells are units of the sweep, the failed one is tried again
    heads = cell / "tables" / "heads.parquet"
    stamp = heads.stat().st_mtime_ns
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--resume", "--jobs", "1"]) == 3
    assert heads.stat().st_mtime_ns == stamp
    assert "no-such-model__corpus.txt__seed0 failed" in capsys.readouterr().err
    # --overwrite removes the cells' runs with the sweep's own files
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--overwrite", "--jobs", "1"]) == 3
    assert heads.stat().st_mtime_ns != stamp


def test_a_refused_resume_names_what_differs(tmp_path, capsys):
    """A sweep directory resumed with another sweep file is refused before any work, naming
    the cells and options that differ, not two hashes."""
    from depthlens.runs import RunDirectory, RunMode
    from depthlens.sweep.runner import KIND, sweep_changes

    first = read_sweep(_file(tmp_path, '[sweep]\nmodels = ["random:llama", "random:gpt2"]\nstages = ["attention"]\n'))
    out = tmp_path / "out"
    stored = {"kind": KIND, "config_hash": "started",
              "cells": [{"label": c.label, "config": c.config.to_dict()} for c in first.cells]}
    RunDirectory.open(out, RunMode.NEW, stored)
    path = _file(tmp_path, '[sweep]\nmodels = ["random:llama", "random:gpt_neox"]\nstages = ["attention"]\n',
                 shared=SMALL.replace("chunks = 2", "chunks = 3"))
    before = sorted(p.name for p in out.rglob("*"))
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--resume"]) == 2
    err = capsys.readouterr().err
    llama, gpt2, neox = (f"random_{f}__python-docs__seed0" for f in ("llama", "gpt2", "gpt_neox"))
    assert f"it was started with cell {llama}: --chunks 2, no cell {neox}, cell {gpt2}, not cell {llama}: " \
           f"--chunks 3, cell {neox}, no cell {gpt2};" in err and "hash" not in err
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing written
    assert sweep_changes(stored, first.cells) == []  # other stages or claims: nothing to name but the hashes
