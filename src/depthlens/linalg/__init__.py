
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
from .ranks import erank, erank_sigma, participation, self_alignment, self_alignment_svd, stable_rank
from .schur import SchurForm, schur_form, schur_split
from .kreiss import BranchBoundRecord, CertificationBudgetWarning, KreissResult, PowerBound, kreiss, power_upper_bound
from .pseudospectra import (
    PseudospectralResult,
    PseudospectrumResult,
    pseudospectral_abscissa,
    pseudospectral_radius,
    pseudospectrum,
)
from .sigma import SigmaResult, TriangularForm, sigma_min, triangular_form
from .transients import SpijkerCheck, TransientResult, peak_transient, power_norms, spijker_check
