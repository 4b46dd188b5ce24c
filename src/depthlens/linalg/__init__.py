
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
from .ranks import erank, erank_sigma, participation, self_alignment, stable_rank
from .schur import SchurForm, schur_form, schur_split
