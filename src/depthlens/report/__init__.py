"""Figures, pre-registered claim verdicts and the self-contained HTML report of a run.

Everything here reads a finished (or partly finished) run directory: tables, stage
summaries and arrays. Nothing recomputes an analysis, and a stage that did not run makes the
corresponding claims ``not tested`` and figures "not available" instead of an error.

>>> from depthlens.report import render_comparison, render_report  # doctest: +SKIP
>>> render_report("runs/gpt2")                          # doctest: +SKIP
PosixPath('runs/gpt2/report.html')
>>> render_comparison(["runs/gpt2", "runs/pythia"], "runs/compare")  # doctest: +SKIP
PosixPath('runs/compare/compare.html')
"""

from .claims import (
    VERDICTS,
    Claim,
    claims_hash,
    default_claims_path,
    evaluate,
    load_claims,
    write_claims_json,
)
from .compare import render_comparison
from .figures import CAPTIONS, FIGURES, make_figures
from .html import render_report
from .statistics import STATISTICS

__all__ = [
    "CAPTIONS",
    "FIGURES",
    "STATISTICS",
    "VERDICTS",
    "Claim",
    "claims_hash",
    "default_claims_path",
    "evaluate",
    "load_claims",
    "make_figures",
    "render_comparison",
    "render_report",
    "write_claims_json",
]
