"""Presets of ``depthlens train``: named option values; explicit flags override them."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from .options import TrainOptions

__all__ = ["PRESET_SEEDS", "TRAINING_PRESETS", "resolve"]

#: Preset name -> the option values it sets (the others keep their defaults).
#:
#: ``induction``: a 2-layer llama-like model (width 128, 4 heads, byte tokenizer) on
#: python-docs with three sequences in four a repeated block of random tokens
#: (``repeat_fraction``), so that its final checkpoint has previous-token heads in layer 0 and
#: induction heads in layer 1 by the repeated-random-token probe (docs/methods.md#a5: scores
#: ≥ 0.3) and step 0 none. Text alone does not form an induction head that generalises to the
#: probe within this budget: the probe draws ids uniformly from the whole vocabulary, and bytes
#: that never occur in python-docs keep their initial embeddings. The blocks' lengths vary (8 to
#: 64), so only a head that matches content, not one that attends a fixed offset back, predicts
#: them.
#:
#: ``census``: a series sized for the census claims' minimum samples: 10 layers give 20 topology
#: boundaries per checkpoint (C3 needs 20) and room for 5 layers of paired heads (C1), 11
#: checkpoints (C2 needs 2, C3 3); narrower (d = 64, 4 heads), with the induction preset's
#: repeated blocks, and a context of 160 so that the default preset's probe (1 + 2 × 64 tokens)
#: fits. Roles form in few of its layers, so C1 may stay underpowered on one series; the
#: ``replicates`` preset pools seeds for it.
#:
#: ``replicates``: the census claims' minimums from seed replicates, which ``depthlens census
#: --replicates`` pools (C1 takes their layers as independent units, C3 sums their coupling
#: counts): the ``induction`` preset at half its batch, trained with :data:`PRESET_SEEDS` seeds
#: (0 … 4), gives 10 layers (C1 needs 5 paired) and 20 boundaries a checkpoint (C3 needs 20).
#: Training times: benchmarks/RESULTS.md, section ``bench_train``.
_INDUCTION: dict[str, Any] = {"family": "llama", "n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 512,
                              "seq_len": 160, "batch_size": 32, "steps": 2000, "lr": 1e-3, "warmup": 100,
                              "checkpoints": 12, "text": "python-docs", "repeat_fraction": 0.75, "repeat_min": 8,
                              "repeat_max": 64}
TRAINING_PRESETS: dict[str, dict[str, Any]] = {
    "induction": _INDUCTION,
    "census": {"family": "llama", "n_layers": 10, "d_model": 64, "n_heads": 4, "d_ff": 256, "seq_len": 160,
               "batch_size": 16, "steps": 1500, "lr": 2e-3, "warmup": 100, "checkpoints": 10,
               "text": "python-docs", "repeat_fraction": 0.75, "repeat_min": 8, "repeat_max": 64},
    "replicates": {**_INDUCTION, "batch_size": 16},
}
#: Seeds a preset is meant to be trained with (0 … n − 1), as replicates of one census.
PRESET_SEEDS: dict[str, int] = {"replicates": 5}


def resolve(preset: str | None, **explicit: Any) -> TrainOptions:
    """The options of ``preset`` (None: the defaults) with the ``explicit`` values (None:
    unset) winning.

    Raises
    ------
    InputError
        An unknown preset or option, or a value :class:`TrainOptions` refuses.

    Examples
    --------
    >>> resolve("induction", steps=10).steps, resolve("induction").repeat_fraction
    (10, 0.75)
    """
    if preset is not None and preset not in TRAINING_PRESETS:
        raise InputError(f"--preset {preset!r} is unknown; use one of {', '.join(TRAINING_PRESETS)}.")
    known = {f.name for f in TrainOptions.__dataclass_fields__.values()}
    unknown = sorted(set(explicit) - known)
    if unknown:
        raise InputError(f"unknown training option {unknown[0]!r}; known: {', '.join(sorted(known))}.")
    values = {**(TRAINING_PRESETS[preset] if preset else {}), **{k: v for k, v in explicit.items() if v is not None}}
    return TrainOptions(**values)
