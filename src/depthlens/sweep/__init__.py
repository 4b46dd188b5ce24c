"""Sweeps: models × revisions × text sources × seeds, each cell an ordinary run, compared in
one cross-model report (``depthlens sweep SWEEP.toml``)."""

from .runner import run_sweep
from .spec import Cell, Sweep, read_sweep

__all__ = ["Cell", "Sweep", "read_sweep", "run_sweep"]
