"""What the planted worlds of the calibration share (:mod:`depthlens.report.calibration`): a run
held in memory (:class:`MemoryTables`), the :class:`Scenario` of a statistic and the decorator
that registers one (:func:`registrar`), and the draws several worlds make."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..runs.tables import RunTables
from .statistics import STATISTICS

__all__ = ["MemoryTables", "Scenario", "Simulator", "correlated_normals", "head_rows", "mix", "planted_ranks",
           "registrar"]


class MemoryTables(RunTables):
    """A :class:`RunTables` over tables and summaries held in memory (a simulated run).

    Parameters
    ----------
    tables : mapping of str to DataFrame
        ``NAME`` → the rows of ``tables/NAME.parquet``.
    summaries : mapping of str to dict, optional
        ``NAME`` → the contents of ``NAME.json`` (``manifest`` among them).
    """

    def __init__(self, tables: Mapping[str, pd.DataFrame], summaries: Mapping[str, dict] | None = None) -> None:
        super().__init__(Path("/nonexistent/depthlens-memory-run"))
        for name, df in tables.items():
            self._cache[f"table:{name}"] = df
        for name, obj in (summaries or {}).items():
            self._cache[f"json:{name}"] = obj
        self._cache.setdefault("json:manifest", {})


#: ``simulate(rng, sizes, strength)``: the tables of one draw of a world (see :class:`Scenario`).
Simulator = Callable[[np.random.Generator, Mapping[str, int], float], RunTables]


@dataclass(frozen=True)
class Scenario:
    """The planted worlds of one statistic.

    ``simulate(rng, sizes, strength)`` returns the tables the statistic reads, drawn with the
    sample sizes ``sizes`` (units of :data:`~depthlens.report.statistics.SAMPLE_UNITS`, plus the
    scenario's own design sizes) in the world of effect ``strength``: 0 is the null world, 1 the
    effect world (the seed's effect), and values in between or beyond move every planted
    parameter along the line through the two (:func:`mix`, clipped where a parameter has a
    range), so the statistic's true value runs from the null through the threshold to twice the
    seed's effect over ``strength`` in [0, 2]. ``default`` holds the sizes of a run of the default preset on the embedded SmolLM2 (30
    layers of 9 heads); ``null`` and ``effect`` say what is planted.
    """

    statistic: str
    simulate: Simulator
    default: dict[str, int]
    null: str
    effect: str


def registrar(registry: dict[str, Scenario]) -> Callable[..., Callable[[Simulator], Simulator]]:
    """``scenario(statistic, default, null, effect)``: a decorator that puts a simulator in
    ``registry`` as the :class:`Scenario` of ``statistic`` (a world module's own registry, which
    :mod:`depthlens.report.calibration` gathers)."""

    def scenario(statistic: str, default: dict[str, int], null: str, effect: str) -> Callable[[Simulator], Simulator]:
        if statistic not in STATISTICS:
            raise ValueError(f"scenario for unknown statistic {statistic!r}")

        def wrap(func: Simulator) -> Simulator:
            registry[statistic] = Scenario(statistic, func, dict(default), " ".join(null.split()),
                                           " ".join(effect.split()))
            return func

        return wrap

    return scenario


def mix(null: float | np.ndarray, effect: float | np.ndarray, strength: float, *, low: float = -math.inf,
        high: float = math.inf) -> float | np.ndarray:
    """The planted parameter at effect ``strength``: ``(1 − s)·null + s·effect``, clipped to
    [``low``, ``high``]; exactly ``null`` at ``s`` = 0 and exactly ``effect`` at ``s`` = 1.

    Examples
    --------
    >>> mix(2.0, 9.0, 0.0), mix(2.0, 9.0, 1.0), mix(0.1, 0.75, 2.0, high=1.0)
    (2.0, 9.0, 1.0)
    """
    value = (1.0 - strength) * null + strength * effect
    return np.clip(value, low, high) if isinstance(value, np.ndarray) else min(max(value, low), high)


def planted_ranks(rng: np.random.Generator, shift: np.ndarray, samples: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per entry of ``shift`` (any shape): an observation ``N(shift, 1)`` and its ``samples``
    null draws ``N(0, 1)``; returns the rank of the observation among its nulls, among the
    first ``⌈samples/2⌉`` of them, and the observation minus the nulls' mean."""
    nulls = rng.standard_normal((*shift.shape, samples))
    obs = shift + rng.standard_normal(shift.shape)
    below = nulls < obs[..., None]
    return (below.sum(axis=-1).astype(float), below[..., : math.ceil(samples / 2)].sum(axis=-1).astype(float),
            obs - nulls.mean(axis=-1))


def correlated_normals(rng: np.random.Generator, n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs of standard normals with correlation ``rho``."""
    x = rng.standard_normal(n)
    return x, rho * x + math.sqrt(1.0 - rho * rho) * rng.standard_normal(n)


def head_rows(layer_size: int, n: int, role: str) -> pd.DataFrame:
    """``n`` heads of one ``role``, ``layer_size`` to a layer, in order."""
    idx = np.arange(n)
    return pd.DataFrame({"layer": idx // layer_size, "head": idx % layer_size, "role": role})
