"""The numerical core: causal attention operators and the linear algebra of their products.

Non-normality (:mod:`~depthlens.linalg.normality`), effective ranks
(:mod:`~depthlens.linalg.ranks`), Schur forms (:mod:`~depthlens.linalg.schur`), the
smallest singular value of shifted triangular matrices (:mod:`~depthlens.linalg.sigma`),
pseudospectra (:mod:`~depthlens.linalg.pseudospectra`), power transients
(:mod:`~depthlens.linalg.transients`), the Kreiss constant (:mod:`~depthlens.linalg.kreiss`)
and shuffle nulls (:mod:`~depthlens.linalg.nulls`), on numpy, scipy and numba only: importing
this package loads neither torch nor the model side of depthlens.
"""

from .causal import (
    DepthProduct,
    EigPredictions,
    chain_operator,
    check_causal_stochastic,
    deflate,
    depth_product,
    eig_gap,
    eig_predictions,
    flag_nonsimple_perron,
    mean_operator,
    perron_projector,
    rollout_operator,
)
from .normality import (
    complex_fraction,
    expansion_fraction,
    henrici,
    henrici_rel,
    numerical_abscissa,
    numerical_radius,
    rotation_angle_mean,
    symmetry_index,
)
from .nulls import NULL_MODES, shuffle_null
from .ranks import erank, erank_sigma, participation_ratio, self_alignment, self_alignment_svd, stable_rank
from .schur import SchurForm, schur_form, schur_split
from .kreiss import BranchBoundRecord, CertificationBudgetWarning, KreissResult, PowerBound, kreiss, power_upper_bound
from .pseudospectra import (
    PseudospectralExtremum,
    SigmaGrid,
    pseudospectral_abscissa,
    pseudospectral_radius,
    pseudospectrum,
)
from .sigma import SigmaResult, TriangularForm, sigma_min, triangular_form
from .transients import SpijkerCheck, TransientResult, peak_transient, power_norms, spijker_check

__all__ = [
    "NULL_MODES",
    "BranchBoundRecord",
    "CertificationBudgetWarning",
    "DepthProduct",
    "EigPredictions",
    "KreissResult",
    "PowerBound",
    "PseudospectralExtremum",
    "SigmaGrid",
    "SchurForm",
    "SigmaResult",
    "SpijkerCheck",
    "TransientResult",
    "TriangularForm",
    "chain_operator",
    "check_causal_stochastic",
    "complex_fraction",
    "deflate",
    "depth_product",
    "eig_gap",
    "eig_predictions",
    "erank",
    "erank_sigma",
    "expansion_fraction",
    "flag_nonsimple_perron",
    "henrici",
    "henrici_rel",
    "kreiss",
    "mean_operator",
    "numerical_abscissa",
    "numerical_radius",
    "participation_ratio",
    "peak_transient",
    "perron_projector",
    "power_norms",
    "power_upper_bound",
    "pseudospectral_abscissa",
    "pseudospectral_radius",
    "pseudospectrum",
    "rollout_operator",
    "rotation_angle_mean",
    "schur_form",
    "schur_split",
    "self_alignment",
    "self_alignment_svd",
    "shuffle_null",
    "sigma_min",
    "spijker_check",
    "stable_rank",
    "symmetry_index",
    "triangular_form",
]
