"""The numerical core: causal attention operators and the linear algebra of their products.

Non-normality (:mod:`~depthlens.linalg.normality`), effective ranks
(:mod:`~depthlens.linalg.ranks`), Schur forms (:mod:`~depthlens.linalg.schur`), the
smallest singular value of shifted triangular matrices (:mod:`~depthlens.linalg.sigma`),
pseudospectra (:mod:`~depthlens.linalg.pseudospectra`), power transients
(:mod:`~depthlens.linalg.transients`), the Kreiss constant (:mod:`~depthlens.linalg.kreiss`)
and shuffle nulls (:mod:`~depthlens.linalg.nulls`), on numpy, scipy and numba only: importing
this package loads neither torch nor the model side of depthlens. Each module loads on first
use of one of its names (the stages' options read :mod:`.orders` alone).
"""

from ..lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["DepthProduct", "EigPredictions", "chain_operator", "check_causal_stochastic", "deflate",
                     "depth_product", "eig_gap", "eig_predictions", "flag_nonsimple_perron", "mean_operator",
                     "perron_projector", "rollout_operator"],
                    ".causal"),
    **dict.fromkeys(["complex_fraction", "expansion_fraction", "henrici", "henrici_rel", "numerical_abscissa",
                     "numerical_radius", "rotation_angle_mean", "symmetry_index"],
                    ".normality"),
    **dict.fromkeys(["NULL_MODES", "shuffle_null"], ".nulls"),
    **dict.fromkeys(["erank", "erank_sigma", "participation_ratio", "self_alignment", "self_alignment_svd",
                     "stable_rank"], ".ranks"),
    **dict.fromkeys(["SchurForm", "schur_form", "schur_split"], ".schur"),
    **dict.fromkeys(["BranchBoundRecord", "CertificationBudgetWarning", "KreissResult", "PowerBound", "kreiss",
                     "power_upper_bound"],
                    ".kreiss"),
    **dict.fromkeys(["PseudospectralExtremum", "SigmaGrid", "pseudospectral_abscissa", "pseudospectral_radius",
                     "pseudospectrum"],
                    ".pseudospectra"),
    **dict.fromkeys(["SigmaResult", "TriangularForm", "sigma_min", "triangular_form"], ".sigma"),
    **dict.fromkeys(["SpijkerCheck", "TransientResult", "peak_transient", "power_norms", "power_norms_at",
                     "spijker_check"],
                    ".transients"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
