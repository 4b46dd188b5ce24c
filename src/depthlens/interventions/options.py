"""Options of the ``ablate`` and ``clamp`` stages (docs/methods.md#a7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import InputError
from ..models.methods import ABLATION_METHODS, AblationMethod
from ..options import check_distinct, check_fields

__all__ = ["ABLATION_METHODS", "AblateOptions", "AblationMethod", "ClampOptions", "CLAMP_ALPHAS"]


#: The doses of the clamp (docs/methods.md#a7): the massive entries set to α·value (α = 0 is the zero
#: arm, α = 1 the unclamped model).
CLAMP_ALPHAS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class AblateOptions:
    """Parameters of the ablate stage.

    Parameters
    ----------
    ablation_methods : tuple of str
        comma-separated ablations of one head's output before the output projection
        (docs/methods.md#a7), distinct, of mean (its mean output over the mean chunks), zero and
        resample (its output on a mean chunk instead)
    heldout_chunks : int
        chunks (the last ones of the run) on which the cross-entropy change is measured; the
        others give the head means and the resample sources, so the two never overlap (above
        chunks − 1: every chunk but the first)
    ablation_boot : int
        bootstrap resamples of the held-out chunks for the criticality's 95% interval
    seed : int
        the run's seed (bootstrap and resample pairing)
    """

    ablation_methods: tuple[AblationMethod, ...] = ("mean",)
    heldout_chunks: int = field(default=4, metadata={"min": 1})
    ablation_boot: int = field(default=1000, metadata={"min": 1})
    seed: int = field(default=0, metadata={"derived": "seed"})

    def __post_init__(self) -> None:
        check_fields(self)
        check_distinct(self, "ablation_methods", ABLATION_METHODS)


@dataclass(frozen=True)
class ClampOptions:
    """Parameters of the clamp stage.

    Parameters
    ----------
    clamp_alphas : tuple of float
        comma-separated doses α in [0, 1]: the massive entries are set to α·value (0 is the
        zero arm, 1 the unclamped model); a mean arm (the dimension's mean over ordinary
        positions) always runs
    clamp_chunks : int
        chunks (the first ones) on which every arm is measured
    control_seeds : int
        seeds of the control, which moves as many random ordinary dimensions (seeded) under
        each arm by exactly as much as the massive dimensions move, in a seeded random
        direction ± (the same Euclidean norm of the change at the first token, layer by layer);
        0 leaves the control out (the chain is then recorded as not tested)
    control_curves : {"first", "every"}
        which control seeds get every dose and the mean arm: first = the first seed (the
        others get the zero arm alone, which the verdict's control test reads, beside the
        unclamped model); every = each seed (--preset paper)
    clamp_null_samples : int
        matched spec-null samples per attention matrix for the excess reserve Δ_TR
    seed : int
        the run's seed (control dimensions and nulls)
    """

    clamp_alphas: tuple[float, ...] = CLAMP_ALPHAS
    clamp_chunks: int = field(default=6, metadata={"min": 1})
    control_seeds: int = field(default=3, metadata={"min": 0})
    control_curves: Literal["first", "every"] = "first"
    clamp_null_samples: int = field(default=2, metadata={"min": 1})
    seed: int = field(default=0, metadata={"derived": "seed"})

    def __post_init__(self) -> None:
        check_fields(self)
        object.__setattr__(self, "clamp_alphas", tuple(float(a) for a in self.clamp_alphas))
        alphas = self.clamp_alphas
        if not alphas or len(set(alphas)) != len(alphas) or not all(0.0 <= a <= 1.0 for a in alphas):
            shown = ",".join(f"{a:g}" for a in alphas) or "(none)"
            raise InputError(f"--clamp-alphas {shown} is invalid; pass distinct numbers in [0, 1], e.g. 0,0.25,0.5,0.75,1.")
