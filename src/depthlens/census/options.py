"""Options of ``depthlens census`` (beside the run's and the stages' own options)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..options import check_fields

__all__ = ["CENSUS_STAGES", "CensusOptions"]

#: What a census runs on every checkpoint unless told otherwise (the three its claims read).
CENSUS_STAGES = ("attention", "jacobian", "topology")


@dataclass(frozen=True)
class CensusOptions:
    """Parameters of a census.

    Parameters
    ----------
    census_stages : tuple of str
        comma-separated stages run on every checkpoint (the stages they need run too)
    compare : tuple of str
        comma-separated further checkpoint series censused beside --model (folders written by
        depthlens train, or hub ids, which take the same --revisions); the report compares
        where their routing and sink heads and their reserve sit, e.g. a LayerNorm family
        against an RMSNorm one trained on the same data and seed
    replicates : tuple of str
        comma-separated further series of --model's configuration trained with other seeds
        (folders written by depthlens train --seed S, with --model's checkpoint steps); the
        census claims pool them with --model as independent units: C1 tests the layers of
        every replicate, C3 sums each checkpoint's coupling counts over them
    """

    census_stages: tuple[str, ...] = CENSUS_STAGES
    compare: tuple[str, ...] = ()
    replicates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from ..stages import STAGES

        check_fields(self)
        object.__setattr__(self, "census_stages", tuple(self.census_stages))
        object.__setattr__(self, "compare", tuple(self.compare))
        object.__setattr__(self, "replicates", tuple(self.replicates))
        for flag, specs in (("--compare", self.compare), ("--replicates", self.replicates)):
            twice = next((s for i, s in enumerate(specs) if s in specs[:i]), None)
            if twice is not None:
                raise InputError(f"{flag} lists {twice} twice; pass each series once.")
        both = sorted(set(self.compare) & set(self.replicates))
        if both:
            raise InputError(f"{both[0]} is both in --compare and in --replicates; a series is compared (another "
                             "configuration) or pooled (the same configuration, another seed), not both.")
        unknown = [s for s in self.census_stages if s not in STAGES]
        if unknown or not self.census_stages:
            raise InputError(f"--census-stages {','.join(self.census_stages) or '(none)'} is invalid; pass stages of "
                             f"{','.join(STAGES)}.")
