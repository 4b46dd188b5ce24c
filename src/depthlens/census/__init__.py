"""Training dynamics over a checkpoint series: ``depthlens census``.

:mod:`~depthlens.revisions` resolves a series (a folder of checkpoints, a hub id with
revisions, a revision list file), :mod:`~depthlens.census.runner` runs the chosen stages on
each checkpoint as an ordinary run (``run_census``), :mod:`~depthlens.report.census_tables` gathers
the census tables from those runs, and :mod:`~depthlens.report.onsets` dates formation against
consolidation. The census claims (C1–C3) are statistics of
:mod:`depthlens.report.statistics.census`. This package's top level stays light (no torch).
"""

from .options import CENSUS_STAGES, CensusOptions
from ..revisions import Checkpoint, expand_revisions, resolve_series, step_of

__all__ = ["CENSUS_STAGES", "CensusOptions", "Checkpoint", "expand_revisions", "resolve_series", "step_of"]
