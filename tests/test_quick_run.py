"""What the terminal shows at the end of a quick run of a tiny random model: every claim not
tested says what it needs, negative numbers carry one minus sign (U+2212), and the last line
says the run was a smoke run whose verdicts are no measurements."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from depthlens.cli import main
from depthlens.report.verdict_text import fmt

# The full leg only: a quick run's terminal and claims text, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg

#: An ASCII hyphen used as a minus sign: before a digit or ∞, not inside a word or a number.
HYPHEN_MINUS = re.compile(r"(?<![\w.])-(?=[\d∞])")


def test_the_end_of_a_quick_run(text_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", "--model", "random:llama", "--preset", "quick", "--text", str(text_file), "--jobs", "2",
                 "--quiet", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    results = json.loads((out / "claims.json").read_text())["results"]
    verdicts = [line for line in lines if line.startswith("  ") and line.split()[0] in {r["id"] for r in results}]
    assert len(verdicts) == len(results)
    untested = [line for line in verdicts if "not tested" in line]
    assert len(untested) == sum(r["verdict"] == "not tested" for r in results) > 0
    assert all("not tested (needs " in line for line in untested), "\n".join(untested)
    assert all(not HYPHEN_MINUS.search(line) for line in verdicts), "\n".join(verdicts)
    for result in results:  # each negative end of an interval is shown with U+2212
        line = next(v for v in verdicts if v.split()[0] == result["id"])
        for end in result.get("interval") or ():
            if end is not None and float(end) < 0:
                assert fmt(float(end)) in line and fmt(float(end)).startswith("−")
    assert lines[-1].startswith("smoke run (--preset quick)") and "not measurements" in lines[-1]
    capsys.readouterr()
    assert main(["report", str(out)]) == 0  # re-rendered, it ends the same way
    assert capsys.readouterr().out.strip().splitlines()[-1] == lines[-1]
