"""The study's statistics: named functions of a run's outputs that claims test.

A statistic takes a :class:`~depthlens.runs.tables.RunTables` and returns a float (``inf``
allowed), NaN for "too little data", or ``None`` for "inputs missing"; it only reads tables and
summaries, nothing is recomputed. Each is registered with the outputs it needs and the counters
of the samples it rests on (:data:`SAMPLE_UNITS`); the verdict engine
(:mod:`depthlens.report.claims`) turns their values into verdicts.

The statistics live by family, each module with a registry of its own: :mod:`.attention`
(Part A), :mod:`.interventions` (the clamp chain and the contest), :mod:`.residual` (Part B) and
:mod:`.census` (C1–C3); the common ground is :mod:`.core`. This package gathers the families
into :data:`STATISTICS` here, in that order. A statistic from outside the package is added with
:func:`register`.
"""

from __future__ import annotations

from . import attention, census, coupling, interventions, residual
from .attention import gap_contrasts, role_rank_tests
from .core import (SAMPLE_UNITS, STATISTICS, Estimate, NotTested, Statistic, TooLittleData, compute_estimate,
                   compute_statistic, gather, median_estimate, needs_of, note_of, registrar, spearman_estimate)
from .coupling import checkpoint_order
from .residual import (CLAIM_RANK, SCHUR_ORDERS, funnel_ends, funnel_operators, funnel_pair_ratios, funnel_replicates,
                       funnel_width, own_null, weighted_rotation)

__all__ = ["CLAIM_RANK", "SAMPLE_UNITS", "SCHUR_ORDERS", "STATISTICS", "Estimate", "NotTested", "Statistic",
           "TooLittleData", "checkpoint_order", "compute_estimate", "compute_statistic", "funnel_ends",
           "funnel_operators", "funnel_pair_ratios", "funnel_replicates", "funnel_width", "gap_contrasts",
           "median_estimate", "needs_of", "note_of", "own_null", "register", "role_rank_tests", "spearman_estimate",
           "weighted_rotation"]

gather(attention.STATISTICS, interventions.STATISTICS, residual.STATISTICS, coupling.STATISTICS, census.STATISTICS)

#: ``register(name, needs, description, samples=None)``: add a statistic from outside the
#: package to :data:`STATISTICS` (a name already taken is an error).
register = registrar(STATISTICS)
