"""Jacobian-lens transport matrices (Gurnee et al., 2026): read and write the reference
artifact format, and the spectral geometry of each layer's transport, without the model.

A transport matrix ``J_ℓ`` is the total, cross-position Jacobian from the output of block ℓ to
the final block's output (before the final norm), averaged over prompts and source positions:
the end-to-end operator that the cumulative funnel (:mod:`depthlens.jacobian.cumulative`)
approximates by a product of per-layer mean Jacobians. Each module loads on first use of one
of its names."""

from ..lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["PROVENANCE_KEYS", "Transport", "fit_metadata", "read_transport", "write_transport"],
                    ".artifact"),
    **dict.fromkeys(["TRANSPORT_COLUMNS", "transport_table"], ".analysis"),
    **dict.fromkeys(["SKIP_FIRST", "SKIP_LAST", "TransportSums", "prompt_transport", "source_layers",
                    "valid_positions"], ".fit"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
