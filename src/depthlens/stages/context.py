"""What a stage gets to run: the run directory, the model, the chunks, its options.

:class:`StageContext` is the one argument of every stage's ``run`` (:mod:`depthlens.stages`).
Tables go out through :meth:`StageContext.write_table`, which puts the identity columns of
:data:`depthlens.schema.IDENTITY` first and checks the table against its declaration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from ..data import Chunks
from ..executors import Execution
from ..models import LoadedModel
from ..runs import RunDirectory
from ..schema import IDENTITY, conform_table

if TYPE_CHECKING:
    from ..config import RunConfig

__all__ = ["StageContext", "with_identity"]


def with_identity(table: pd.DataFrame, ident: dict[str, str]) -> pd.DataFrame:
    """A copy of ``table`` with the identity columns of :data:`depthlens.schema.IDENTITY`
    first: its own where it has them (e.g. a ``revision`` per row), else ``ident``'s values."""
    table = table.copy()
    for key in reversed(list(IDENTITY)):
        column = table.pop(key) if key in table.columns else ident[key]
        table.insert(0, key, column)
    return table


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

    def revision_column(self, checkpoints: pd.Series) -> pd.Series:
        """:meth:`revision_of` of every row of a ``checkpoint`` column (looked up once per checkpoint)."""
        return checkpoints.map({name: self.revision_of(name) for name in checkpoints.unique()})

    def write_table(self, name: str, table: pd.DataFrame, revision: str | None = None) -> None:
        """Write ``tables/NAME.parquet``: the identity columns first (:meth:`ident`; a table
        that has a ``revision`` column per row keeps it), then ``table``, checked against
        :data:`depthlens.schema.SCHEMA` and with its columns in declaration order.

        Raises
        ------
        depthlens.schema.SchemaError
            When the table differs from its declaration (a bug of the stage).
        """
        self.run_dir.write_table(name, conform_table(name, with_identity(table, self.ident(revision))))
