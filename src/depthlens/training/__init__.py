"""Training small causal LMs from scratch, offline, with log-spaced checkpoints
(``depthlens train``).

A series is a folder of ``step-N`` checkpoints (Hugging Face folders) that
:func:`depthlens.models.load_model` reads with ``revision="step-N"``, and that every stage
analyses. :func:`train` (imported on first use, so the options stay light) writes one;
:class:`TrainOptions` and :data:`TRAINING_PRESETS` say what it trains.

Examples
--------
>>> from depthlens.training import checkpoint_steps, resolve
>>> options = resolve("induction", steps=100)
>>> checkpoint_steps(options.steps, 3)
[0, 1, 10, 100]
"""

from typing import Any

from .options import TrainOptions
from .presets import TRAINING_PRESETS, resolve
from .schedule import checkpoint_steps, learning_rate

__all__ = ["TRAINING_PRESETS", "TrainOptions", "checkpoint_steps", "learning_rate", "resolve", "train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from .loop import train

        return train
    raise AttributeError(f"module 'depthlens.training' has no attribute {name!r}")
