"""Topology coupling (§B5): correlation graphs of residual coordinates, signed Leiden
CPM communities, boundary nodes and their coupling to Jacobian amplification, with FDR over
layers. Model-free: arrays in, arrays, records and tables out. Each module loads on first use
of one of its names, so importing :mod:`.options` loads neither igraph nor leidenalg."""

from ..lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["GAMMA_RANGE", "LeidenRecord", "Plateau", "ResolutionProfile", "choose_plateau",
                     "resolution_profile", "signed_leiden", "signed_quality"], ".communities"),
    **dict.fromkeys(["Edges", "RunningMoments", "topk_graph"], ".correlation"),
    **dict.fromkeys(["CouplingRecord", "amplification", "boundary_nodes", "coupling_table",
                     "participation_coefficient", "permutation_pvalue", "rank_biserial"], ".coupling"),
    "TopologyOptions": ".options",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
