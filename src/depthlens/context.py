"""What a stage gets to run: the run directory, the model, the chunks, its options.

:class:`StageContext` is the one argument of every stage's ``run`` (:mod:`depthlens.stages`).
Tables go out through :meth:`StageContext.write_table`, which puts the identity columns of
:data:`depthlens.schema.IDENTITY` first and checks the table against its declaration.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from .config import RunConfig
from .data import Chunks
from .models import LoadedModel
from .runs import RunDirectory
from .schema import IDENTITY, conform_table

__all__ = ["Execution", "StageContext"]


@dataclass(frozen=True)
class Execution:
    """How to run, without changing any number: progress bars and where the numerical tasks
    run (:mod:`depthlens.executors`).

    Attributes
    ----------
    quiet : bool
        No progress bars.
    jobs : int
        Worker processes of the ``local`` executor (inline in this process when 1), CPUs of a
        private Ray instance (``ray``); not used by a Ray cluster or by SLURM.
    executor : str
        ``local``, ``ray``, ``ray=HOST:PORT``, ``ray=auto``, ``slurm`` or ``slurm=local``
        (:func:`depthlens.executors.parse_executor`).
    slurm_params : str
        ``key=value,...`` settings of the SLURM jobs
        (:func:`depthlens.executors.parse_slurm_params`); only with a ``slurm`` executor.
    command : tuple of str
        The command line that started the work, for the manifest (``depthlens run ...``); empty:
        this process's ``sys.argv`` (a script calling the API).
    """

    quiet: bool = False
    jobs: int = 2
    executor: str = "local"
    slurm_params: str = ""
    command: tuple[str, ...] = ()

    def say(self, line: str) -> None:
        """Print ``line`` to stderr unless :attr:`quiet` (a census's or sweep's progress)."""
        if not self.quiet:
            print(line, file=sys.stderr, flush=True)


@dataclass
class StageContext:
    """Everything one stage of a run works with.

    Parameters
    ----------
    stage : str
        The stage's name.
    run_dir : RunDirectory
        Where units, tables, summaries and arrays go.
    config : RunConfig
        The run's configuration.
    loaded : LoadedModel
        The model as loaded (the ``trained`` checkpoint).
    chunks : Chunks
        The run's chunks (:class:`depthlens.data.Chunks`: with a prompts file, the prompts
        right-padded to the longest, with each one's length and analysed positions). A stage
        trims every per-chunk array to the chunk's length and averages over positions only
        where it is analysed.
    execution : Execution
        Progress bars and where the numerical tasks run.
    load_revision : callable
        ``revision -> LoadedModel``: another hub revision of the same model, checked like the
        first.
    """

    stage: str
    run_dir: RunDirectory
    config: RunConfig
    loaded: LoadedModel
    chunks: Chunks
    execution: Execution
    load_revision: Callable[[str], LoadedModel]

    @property
    def token_ids(self) -> torch.Tensor:
        """The chunks' token ids ``(N, T)`` (right-padded with a prompts file)."""
        return self.chunks.ids

    @property
    def options(self) -> Any:
        """This stage's options (derived fields filled)."""
        return self.config.options(self.stage)

    def ident(self, revision: str | None = None) -> dict[str, str]:
        """The identity columns of a row: the model, the revision of its weights (the run's
        ``--revision`` unless ``revision`` is given; ``""`` for none) and the text source."""
        if revision is None:
            revision = self.loaded.provenance.get("revision") or self.config.revision or ""
        return {"model": self.loaded.name, "revision": revision, "text": self.config.text}

    def revision_of(self, checkpoint: str) -> str:
        """The hub revision of a checkpoint's weights: the run's (:meth:`ident`) for
        ``trained``, none for the step-0 null ``init``, the checkpoint's own name for an extra
        revision (``--revisions``)."""
        return {"trained": self.ident()["revision"], "init": ""}.get(checkpoint, checkpoint)

    def write_table(self, name: str, table: pd.DataFrame, revision: str | None = None) -> None:
        """Write ``tables/NAME.parquet``: the identity columns first (:meth:`ident`; a table
        that has a ``revision`` column per row keeps it), then ``table``, checked against
        :data:`depthlens.schema.SCHEMA` and with its columns in declaration order.

        Raises
        ------
        depthlens.schema.SchemaError
            When the table differs from its declaration (a bug of the stage).
        """
        table = table.copy()
        ident = self.ident(revision)
        for key in reversed(list(IDENTITY)):
            column = table.pop(key) if key in table.columns else ident[key]
            table.insert(0, key, column)
        self.run_dir.write_table(name, conform_table(name, table))
