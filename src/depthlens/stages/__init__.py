"""The stages depthlens runs: one registry (this module) and one driver module per stage.

A stage is a module with

- ``check(config: RunConfig) -> None``: refuse sizes the stage cannot work with, before any
  model loads (one-line :class:`~depthlens.errors.InputError` naming the flag);
- ``run(context: StageContext) -> None``: do the stage's work in resumable units and write its
  outputs through the context (:class:`depthlens.stages.context.StageContext`);
- optionally ``check_model(config: RunConfig, adapter: Adapter) -> None``: refuse what the
  loaded model cannot do (e.g. a layer it does not have), before anything is written;
- optionally ``finish(run_dir: RunDirectory) -> None``: called once the whole run ended
  without a failure (the jacobian stage deletes its unit-private operator copies there).

A *follow-up* (:data:`FOLLOW_UPS`) is a stage of the same protocol that the plan adds by
itself, after every other stage, when a run option is set; it has no command, configuration
section or options of its own. ``census`` is one: a run with ``--revisions`` writes its census
tables (:mod:`depthlens.stages.census`) as a stage, with the failure isolation, status and
timing of any other.

The drivers (``depthlens.stages.capture``, ``.attention``, ``.ablate``, ``.clamp``,
``.contest``, ``.jacobian``, ``.topology``, ``.lens``) are thin: the numerics live in the analysis
packages (:mod:`depthlens.attention`, :mod:`depthlens.jacobian`, ...), and what two stages
share lives there too (the jacobian and topology stages both read
:mod:`depthlens.jacobian.store`): no stage imports another.

Its options are a frozen dataclass (:mod:`depthlens.options`), from which the config keys (a
``[NAME]`` section of the TOML file) and the command-line flags are generated. The registry
holds only light references: the stage module is imported when the stage is checked or run,
so importing this package loads no torch. Adding a stage means writing its module and options
class and one :class:`Stage` entry here; its tables are declared in :mod:`depthlens.schema`.
A stage from outside the package is added with :func:`register` (its tables with
:func:`depthlens.schema.declare`): ``depthlens run``, the stage's own command, the
configuration and the conformance suite (``tests/stages/test_conformance.py``) then treat it
as they treat the built-in ones.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..attention.options import AttentionOptions
from ..contest.options import ContestOptions
from ..errors import InputError
from ..interventions.options import AblateOptions, ClampOptions
from ..jacobian.options import JacobianOptions
from ..lens.options import LensOptions
from ..topology.options import TopologyOptions

__all__ = ["FOLLOW_UPS", "STAGES", "Stage", "CaptureOptions", "NoOptions", "get", "plan", "register", "run_stages",
           "with_requirements"]


@dataclass(frozen=True)
class CaptureOptions:
    """Parameters of the capture stage: it has none beyond the run's (model, text, chunks)."""


@dataclass(frozen=True)
class NoOptions:
    """The options of a follow-up (:data:`FOLLOW_UPS`): none of its own."""


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
    requires_if : tuple of (option, value, stage)
        Stages it reads only under some options: ``stage`` runs first when ``value`` is the
        stage option ``option`` or one of its items.
    in_run : bool
        Whether ``depthlens run`` (and ``analyse`` and a sweep's ``run`` without a list of
        stages) runs it; a stage that is not (``lens``: hours on a large model) runs by its own
        command or when named.
    when : str
        For a follow-up only: the run option (a :class:`~depthlens.config.RunConfig` field)
        whose being set adds it to the plan.
    """

    name: str
    help: str
    options: type
    module: str
    requires: tuple[str, ...] = ()
    requires_if: tuple[tuple[str, Any, str], ...] = ()
    in_run: bool = True
    when: str = ""

    def needs(self, config: Any = None) -> tuple[str, ...]:
        """The stages it reads under ``config`` (a :class:`~depthlens.config.RunConfig`; without
        one, every stage it may read)."""
        extra = []
        for option, value, stage in self.requires_if:
            current = getattr(config.options(self.name), option) if config is not None else value
            if value == current or (isinstance(current, tuple) and value in current):
                extra.append(stage)
        return (*self.requires, *extra)

    def load(self) -> ModuleType:
        """The stage's module (imported on first use)."""
        return importlib.import_module(self.module)


#: Every stage, in the order ``depthlens run`` runs them (those with ``in_run``: :func:`run_stages`).
STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("capture", "attention pattern features per head and residual summaries per boundary",
          CaptureOptions, "depthlens.stages.capture"),
    Stage("attention", "resolvent view of every head: Kreiss constants, transients, nulls, roles, depth products",
          AttentionOptions, "depthlens.stages.attention"),
    Stage("ablate", "ablation criticality of every head: the cross-entropy change when its output is ablated",
          AblateOptions, "depthlens.stages.ablate"),
    Stage("clamp", "massive activations and the clamp chain: sink mass, reserve and cross-entropy under clamps",
          ClampOptions, "depthlens.stages.clamp"),
    Stage("contest", "which feature family predicts what a head does (runs attention, and ablate for the "
          "criticality target, first)", ContestOptions, "depthlens.stages.contest", requires=("attention",),
          requires_if=(("contest_targets", "criticality", "ablate"),)),
    Stage("jacobian", "mean sub-layer Jacobians, their spectral geometry, cumulative funnel and Schur split",
          JacobianOptions, "depthlens.stages.jacobian"),
    Stage("topology", "activation-correlation communities, boundary nodes and their Jacobian coupling "
          "(runs jacobian first)", TopologyOptions, "depthlens.stages.topology", requires=("jacobian",)),
    Stage("lens", "Jacobian-lens transport matrices fitted in float64, exported as arrays/lens.pt, and their "
          "spectral geometry (not part of depthlens run)", LensOptions, "depthlens.stages.lens", in_run=False),
)}


def run_stages() -> tuple[str, ...]:
    """The stages ``depthlens run`` runs, in order: every registered one with ``in_run``."""
    return tuple(name for name, stage in STAGES.items() if stage.in_run)


#: Stages the plan adds by itself after every other one, when their ``when`` run option is set.
FOLLOW_UPS: dict[str, Stage] = {s.name: s for s in (
    Stage("census", "the census tables of a run with --revisions (its checkpoints in training order)",
          NoOptions, "depthlens.stages.census", when="revisions"),
)}


def get(name: str) -> Stage:
    """The stage called ``name`` (one of :data:`STAGES` or :data:`FOLLOW_UPS`).

    Raises
    ------
    InputError
        For an unknown name, listing the known stages.
    """
    try:
        return STAGES[name] if name in STAGES else FOLLOW_UPS[name]
    except KeyError:
        raise InputError(f"unknown stage {name!r}; known stages: {', '.join(STAGES)}.") from None


def register(stage: Stage) -> Stage:
    """Add ``stage`` to :data:`STAGES` (after the built-in ones; ``depthlens run`` runs it last
    unless its ``in_run`` is False).

    Register before the command line is built or a configuration is made, and declare its
    tables with :func:`depthlens.schema.declare`. Returns ``stage``.

    Raises
    ------
    InputError
        If a stage of that name exists, or it needs a stage that does not.
    """
    if stage.name in STAGES or stage.name in FOLLOW_UPS:
        raise InputError(f"a stage called {stage.name!r} exists already; register yours under another name.")
    unknown = [s for s in (*stage.requires, *(s for _, _, s in stage.requires_if)) if s not in STAGES]
    if unknown:
        raise InputError(f"stage {stage.name!r} needs the unknown stage {unknown[0]!r}; known stages: "
                         f"{', '.join(STAGES)}.")
    STAGES[stage.name] = stage
    return stage


def with_requirements(names: tuple[str, ...] | list[str], config: Any = None) -> list[str]:
    """``names`` with the stages each needs under ``config`` put before it (each once, in run
    order; without a config, every stage each may need)."""
    ordered: list[str] = []
    for name in names:
        for need in (*get(name).needs(config), name):
            if need not in ordered:
                ordered.append(need)
    return ordered


def plan(names: tuple[str, ...] | list[str], config: Any) -> list[str]:
    """What a run of ``names`` under ``config`` runs, in order: :func:`with_requirements`, then
    each follow-up whose ``when`` option ``config`` sets."""
    return [*with_requirements(names, config),
            *(s.name for s in FOLLOW_UPS.values() if getattr(config, s.when))]
