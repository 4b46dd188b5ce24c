"""Topology coupling (METHODS B5): correlation graphs of residual coordinates, signed Leiden
CPM communities, boundary nodes and their coupling to Jacobian amplification, with FDR over
layers. Model-free: arrays in, arrays, records and tables out."""

from .communities import (
    GAMMA_RANGE,
    LeidenRecord,
    Plateau,
    ResolutionProfile,
    choose_plateau,
    resolution_profile,
    signed_leiden,
    signed_quality,
)
from .correlation import Edges, RunningMoments, topk_graph
from .coupling import (
    CouplingRecord,
    amplification,
    boundary_nodes,
    coupling_table,
    participation_coefficient,
    permutation_pvalue,
    rank_biserial,
)
from .options import TopologyOptions

__all__ = [
    "GAMMA_RANGE",
    "CouplingRecord",
    "Edges",
    "LeidenRecord",
    "Plateau",
    "ResolutionProfile",
    "RunningMoments",
    "TopologyOptions",
    "amplification",
    "boundary_nodes",
    "choose_plateau",
    "coupling_table",
    "participation_coefficient",
    "permutation_pvalue",
    "rank_biserial",
    "resolution_profile",
    "signed_leiden",
    "signed_quality",
    "topk_graph",
]
