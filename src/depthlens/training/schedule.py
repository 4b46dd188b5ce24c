"""When a series is checkpointed, and the learning rate of each step: pure functions of the
options, so a resumed series follows the schedule of an uninterrupted one exactly."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["checkpoint_steps", "learning_rate"]


def checkpoint_steps(steps: int, checkpoints: int) -> list[int]:
    """Step 0 and about ``checkpoints`` log-spaced steps up to ``steps``, ascending.

    The steps are ``round(steps ** (k / (checkpoints - 1)))`` for k = 0 … checkpoints − 1
    (geometric from 1 to ``steps``; ``steps`` alone for one checkpoint), with repeats
    dropped, so early training, where most changes, gets most of them. The last step is
    always included.

    Examples
    --------
    >>> checkpoint_steps(1000, 4)
    [0, 1, 10, 100, 1000]
    >>> checkpoint_steps(5, 10)
    [0, 1, 2, 3, 4, 5]
    """
    if checkpoints == 1:
        return [0, steps]
    grid = np.rint(np.geomspace(1, steps, checkpoints)).astype(int).tolist()
    return sorted({0, *grid, steps})


def learning_rate(step: int, peak: float, warmup: int, steps: int) -> float:
    """The learning rate of optimiser step ``step`` (1 … ``steps``): linear
    warm-up to ``peak`` over ``warmup`` steps, then cosine decay to ``peak / 10`` at ``steps``.

    Examples
    --------
    >>> [round(learning_rate(s, 1.0, 2, 4), 3) for s in range(1, 5)]
    [0.5, 1.0, 0.55, 0.1]
    """
    if step <= warmup:
        return peak * step / warmup if warmup else peak
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))
