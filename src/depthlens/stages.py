"""The stages depthlens runs, in one registry: name, help, options class, what they need.

A stage is a module with

- ``check(config: RunConfig) -> None``: refuse sizes the stage cannot work with, before any
  model loads (one-line :class:`~depthlens.errors.InputError` naming the flag);
- ``run(context: StageContext) -> None``: do the stage's work in resumable units and write its
  outputs through the context (:class:`depthlens.context.StageContext`).

Its options are a frozen dataclass (:mod:`depthlens.options`), from which the config keys (a
``[NAME]`` section of the TOML file) and the command-line flags are generated. The registry
holds only light references: the stage module is imported when the stage is checked or run.
Adding a stage means writing its module and options class and one :class:`Stage` entry here;
its tables are declared in :mod:`depthlens.schema`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from .attention.options import AttentionOptions
from .errors import InputError
from .jacobian.options import JacobianOptions
from .topology.options import TopologyOptions

__all__ = ["STAGES", "Stage", "CaptureOptions", "get", "with_requirements"]


@dataclass(frozen=True)
class CaptureOptions:
    """Parameters of the capture stage: it has none beyond the run's (model, text, chunks)."""


@dataclass(frozen=True)
class Stage:
    """One stage of a run.

    Parameters
    ----------
    name : str
        The stage's name: its command (``depthlens NAME``), its config section and the
        ``stage`` of its outputs in :mod:`depthlens.schema`.
    help : str
        One line for ``depthlens --help``.
    options : type
        Its options dataclass.
    module : str
        The module with ``check(config)`` and ``run(context)``.
    requires : tuple of str
        Stages whose outputs it reads; they run first.
    """

    name: str
    help: str
    options: type
    module: str
    requires: tuple[str, ...] = ()

    def load(self) -> ModuleType:
        """The stage's module (imported on first use)."""
        return importlib.import_module(self.module)


#: Every stage, in the order ``depthlens run`` runs them.
STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("capture", "attention pattern features per head and residual summaries per boundary",
          CaptureOptions, "depthlens.capture"),
    Stage("attention", "resolvent view of every head: Kreiss constants, transients, nulls, roles, depth products",
          AttentionOptions, "depthlens.attention.stage"),
    Stage("jacobian", "mean sub-layer Jacobians, their spectral geometry, cumulative funnel and Schur split",
          JacobianOptions, "depthlens.jacobian.stage"),
    Stage("topology", "activation-correlation communities, boundary nodes and their Jacobian coupling "
          "(runs jacobian first)", TopologyOptions, "depthlens.topology.stage", requires=("jacobian",)),
)}


def get(name: str) -> Stage:
    """The stage called ``name``.

    Raises
    ------
    InputError
        For an unknown name, listing the known stages.
    """
    try:
        return STAGES[name]
    except KeyError:
        raise InputError(f"unknown stage {name!r}; known stages: {', '.join(STAGES)}.") from None


def with_requirements(names: tuple[str, ...] | list[str]) -> list[str]:
    """``names`` with the stages each needs put before it (each once, in run order)."""
    ordered: list[str] = []
    for name in names:
        for need in (*get(name).requires, name):
            if need not in ordered:
                ordered.append(need)
    return ordered
