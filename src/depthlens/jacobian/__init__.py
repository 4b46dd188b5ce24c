"""Sub-layer Jacobians of the residual stream (METHODS B1–B4).

:mod:`.metrics` (per-operator spectral metrics, B2) and :mod:`.cumulative` (cumulative
products over depth and the Schur funnel, B3–B4) are model-free: they take the operators
``J = I + U`` as arrays and return records or tidy tables."""

from .cumulative import ALPHAS, DIRECTIONS, cumulative_ranks, schur_funnel
from .metrics import METRICS, SELF_ALIGN_K, OperatorSpectra, metrics_and_eigenvalues, metrics_table, operator_metrics, spectra

__all__ = [
    "ALPHAS",
    "DIRECTIONS",
    "METRICS",
    "SELF_ALIGN_K",
    "OperatorSpectra",
    "cumulative_ranks",
    "metrics_and_eigenvalues",
    "metrics_table",
    "operator_metrics",
    "schur_funnel",
    "spectra",
]
from .engines import MeanAccumulator, input_state, mean_operators, sublayer_jacobian_sum, sublayer_jacobians  # noqa: E402

__all__ += ["MeanAccumulator", "input_state", "mean_operators", "sublayer_jacobian_sum", "sublayer_jacobians"]
