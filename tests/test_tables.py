"""``depthlens tables RUN [--csv DIR]`` and ``Run.to_csv``: a run's tables listed as the files
hold them, and exported as CSV files that read back as the parquet tables; bad input refused in
one line with nothing written."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from depthlens import open_run
from depthlens.cli import main
from depthlens.errors import RunError
from depthlens.schema import SCHEMA


@pytest.fixture(scope="module")
def run_dir(text_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tables") / "run"
    assert main(["capture", "--model", "random:llama", "--text", str(text_file), "--chunks", "2", "--seq-len", "16",
                 "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    return out


def _parquets(run: Path) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted((run / "tables").glob("*.parquet"))}


def test_lists_every_table_with_its_size_and_description(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["tables", str(run_dir)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["table", "rows", "columns", "description"]
    listed = {line.split()[0]: line for line in lines[1:]}
    tables = _parquets(run_dir)
    assert set(listed) == set(tables) and len(tables) >= 3
    for name, table in tables.items():
        words = listed[name].split()
        assert (int(words[1]), int(words[2])) == table.shape
        assert " ".join(words[3:]) in SCHEMA[name].row  # the start of what one row is


def test_csv_export_reads_back_as_the_tables(run_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "new" / "csv"
    assert main(["tables", str(run_dir), "--csv", str(target)]) == 0
    tables = _parquets(run_dir)
    assert sorted(p.name for p in target.iterdir()) == sorted(f"{name}.csv" for name in tables)
    for name, table in tables.items():
        back = pd.read_csv(target / f"{name}.csv")
        text = pd.read_csv(target / f"{name}.csv", dtype=str, keep_default_na=False)
        assert list(back.columns) == list(table.columns)
        for column in table.columns:
            if pd.api.types.is_numeric_dtype(table[column]):
                pd.testing.assert_series_equal(back[column].astype(float), table[column].astype(float),
                                               check_exact=False, rtol=1e-12)
            else:
                assert text[column].tolist() == table[column].fillna("").astype(str).tolist()
    assert [p.name for p in target.parent.iterdir()] == ["csv"]  # no staging folder left


def test_a_non_empty_folder_is_refused_unless_overwrite(run_dir: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "csv"
    target.mkdir()
    (target / "old.csv").write_text("x\n1\n")
    capsys.readouterr()
    assert main(["tables", str(run_dir), "--csv", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not empty" in err[0] and "--overwrite" in err[0]
    assert [p.name for p in target.iterdir()] == ["old.csv"]
    assert main(["tables", str(run_dir), "--csv", str(target), "--overwrite"]) == 0
    assert sorted(p.stem for p in target.iterdir()) == sorted(_parquets(run_dir))
    (target / "notes.txt").write_text("mine")  # a folder holding more than an export is never replaced
    capsys.readouterr()
    assert main(["tables", str(run_dir), "--csv", str(target), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.txt" in err[0] and (target / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["csv"]


def test_a_bad_run_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("x")
    for target in (tmp_path / "absent", tmp_path, tmp_path / "notes.txt"):
        for extra in ([], ["--csv", str(tmp_path / "csv")]):
            capsys.readouterr()
            assert main(["tables", str(target), *extra]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "is not a depthlens run directory" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_error_mid_export_leaves_nothing(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    to_csv = pd.DataFrame.to_csv

    def failing(self: pd.DataFrame, path: object, **kwargs: object) -> None:
        if written:
            raise OSError("disk full")
        written.append(str(path))
        to_csv(self, path, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_csv", failing)
    with pytest.raises(OSError, match="disk full"):
        open_run(run_dir).to_csv(tmp_path / "csv")
    assert written and list(tmp_path.iterdir()) == []


def test_run_to_csv_names_its_keyword(run_dir: Path, tmp_path: Path) -> None:
    run = open_run(run_dir)
    paths = run.to_csv(tmp_path / "csv")
    assert sorted(p.stem for p in paths) == sorted(run.tables)
    with pytest.raises(RunError, match=r"overwrite=True"):
        run.to_csv(tmp_path / "csv")
    assert run.to_csv(tmp_path / "csv", overwrite=True) == paths
