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
#: (``repeat_fraction``). Its final checkpoint has previous-token heads in layer 0 and
#: induction heads in layer 1 by the repeated-random-token probe (docs/methods.md#a5: scores ≥ 0.3;
#: 0.46 and 0.87 at seed 0, the first induction head at step-1002), step 0 none (0.01); about
#: 4 minutes on 2 CPU cores, checkpoints included (4 min 12 s measured). Text alone does not
#: form an induction head that generalises to the probe within this budget (in trials at this
#: size: none after 1500 steps of text alone; with blocks in half the sequences one only near
#: step 2000, in three quarters by step 1000): the probe draws ids uniformly from the whole
#: vocabulary, and bytes that never occur in python-docs keep their initial embeddings. The
#: blocks' lengths vary (8 to 64), so only a head that matches content, not one that attends
#: a fixed offset back, predicts them.
#:
#: ``census``: a series sized for the census claims' minimum samples (the calibration harness
#: sets them): 10 layers give 20 topology boundaries per checkpoint (C3 needs 20) and room for
#: 5 layers of paired heads (C1), 11 checkpoints (C2 needs 2, C3 3); narrower (d = 64, 4
#: heads) so that ten layers train in about 7 minutes on 2 cores, with the induction preset's
#: repeated blocks, and a context of 160 so that the default preset's probe (1 + 2 × 64
#: tokens) fits. Measured at seed 0: its census decides C2 and C3 (both falsified: no funnel
#: and no significant coupling is learned), but C1 stays underpowered, as by step 1500 one
#: head in one layer has a role (a sink; no routing head forms). At 4000 steps (seed 0; 30
#: minutes on one thread) the default probe finds a previous-token head in layer 0 (0.49), an
#: induction head in layer 1 (0.61, formed near step 1600) and a sink in layer 3 (0.80): three
#: layers of C1's five. Eight heads a layer (d = 64) made a step 1.7 times slower. At 8000
#: steps (seed 0; 17 min 52 s on 2 cores, 7.5 steps/s) the last checkpoint has roles in two
#: layers only (a previous-token head in layer 0, two induction heads in layer 1); the sink
#: that layer 3 had at step 2947 is gone, so longer training alone does not reach C1's five.
#: Eight heads a layer instead (4000 steps, 12.5 min on 2 cores) end with roles in two layers (a
#: previous-token head and a sink in layer 3, an induction head in layer 4; C1 p = 0.93).
#: Two routes to more paired layers failed before any head formed: dropping each layer with
#: probability 0.3 per step (so that circuits would repeat across layers; 3000 steps in 4.7 min)
#: left the training loss at 4.43 with no induction drop; and seed replicates, whose layers C1
#: could pool, need the induction head to form in each, which none of seeds 0 and 1 did by 2000
#: steps at lr 3e-3 (two series in parallel on one thread each: 6.9 min, 1.28 times the steps
#: per second of one series on two threads).
#:
#: ``replicates``: the census claims' minimums from seed replicates, which ``depthlens census
#: --replicates`` pools (C1 takes their layers as independent units, C3 sums their coupling
#: counts): the ``induction`` preset at half its batch, trained with :data:`PRESET_SEEDS` seeds
#: (0 … 4), gives 10 layers (C1 needs 5 paired) and 20 boundaries a checkpoint (C3 needs 20).
#: Measured on a slow 2-core host (where one ``induction`` series takes 6 min 36 s): seeds 0
#: and 1 in parallel, one thread each, 5 min 38 s; seeds 2 and 3 likewise 5 min 25 s; seed 4 on
#: two threads 3 min 22 s: 14.4 min in all. Every seed ends with a previous-token layer (0.34 to
#: 0.45) and an induction layer (0.68 to 0.76); the census (13.7 min) pairs all 10 layers and
#: decides C1 (inconclusive, p = 0.89), C2 (falsified, 1.12 [1.08, 1.22]) and C3 (falsified,
#: ρ = −0.24 [−0.52, 0.31] over 20 boundaries). At the full batch three seeds took 19.8 min
#: and pair 6 layers; at 1200 steps (seed 2, batch 32) no induction head reached 0.3 (0.22 at
#: the last step).
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
