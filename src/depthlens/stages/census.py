"""The census follow-up: the census tables of a run with ``--revisions``.

The plan adds it after every other stage when ``--revisions`` is set
(:data:`depthlens.stages.FOLLOW_UPS`). It computes nothing new: its one unit reads the run's
own tables at each checkpoint (the step-0 ``init``, the revisions and the ``trained`` model,
in training order: :func:`depthlens.report.census_tables.run_points`) and writes ``census``
and ``census_heads``, which the claims of part C and the report read. ``depthlens census``
writes the same tables over a series of runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..report.census_tables import census_tables, run_points
from ..runs.tables import RunTables
from ..schema import conform_table
from .context import StageContext

if TYPE_CHECKING:
    from ..config import RunConfig


def check(config: RunConfig) -> None:
    """Nothing to refuse: the census reads whatever the run's stages wrote."""


def run(context: StageContext) -> None:
    """Write the run's census tables (rewritten whole on every run, as they read the others)."""
    points = run_points(RunTables(context.run_dir.root))
    for name, table in census_tables(points, context.config.text).items():
        context.run_dir.write_table(name, conform_table(name, table))
