"""Sub-layer Jacobians of the residual stream (§B1–B4).

:mod:`.metrics` (per-operator spectral metrics, B2), :mod:`.cumulative` (cumulative
products over depth and the Schur funnel, B3–B4) and :mod:`.bootstrap` (the funnel's ends
over chunk resamples) are model-free: they take the operators ``J = I + U`` (or their
per-chunk sums) as arrays and return records or tidy tables; :mod:`.engines` computes the
Jacobians from a model, and :mod:`.store` holds a run's mean operators (computed into their
float64 file, read back or computed again) for the jacobian and topology stages. Each module loads on first use of one of its names, so importing
:mod:`.options` (the configuration does) loads neither the numerics nor torch."""

from ..lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["ALPHAS"], ".options"),
    **dict.fromkeys(["DIRECTIONS", "cumulative_ends", "cumulative_ranks", "schur_funnel"], ".cumulative"),
    **dict.fromkeys(["bootstrap_weights", "funnel_bootstrap"], ".bootstrap"),
    **dict.fromkeys(["METRICS", "SELF_ALIGN_K", "OperatorSpectra", "metrics_and_eigenvalues", "metrics_table",
                     "operator_metrics", "spectra"], ".metrics"),
    **dict.fromkeys(["MeanAccumulator", "chunk_operator_sums", "engine_states", "input_state", "kv_state",
                     "mean_operators", "read_states", "state_reads", "sublayer_jacobian_sum", "sublayer_jacobians"],
                    ".engines"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
