"""A stage from outside depthlens, for the conformance suite: the distinct tokens of each chunk
and their mean id, one resumable unit per chunk (registered by the suite, then removed)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from depthlens.data import as_chunks
from depthlens.errors import require_at_least
from depthlens.options import check_fields
from depthlens.schema import Column
from depthlens.stages import Stage

NAME = "toy"
#: Its one table, as :func:`depthlens.schema.declare` takes it.
TABLES = {"toy_chunks": ("One row per chunk: its distinct tokens.", ("chunk",), {
    "chunk": Column("Chunk index, 0-based.", "integer"),
    "distinct_tokens": Column("Number of distinct token ids in the chunk, times `--toy-weight`.", "count"),
    "mean_id": Column("Mean token id of the chunk (float64, exact to rounding).", "token id"),
})}


@dataclass(frozen=True)
class ToyOptions:
    """Parameters of the toy stage.

    Parameters
    ----------
    toy_weight : int
        factor on the distinct-token count (at least 1)
    """

    toy_weight: int = field(default=1, metadata={"min": 1})

    def __post_init__(self) -> None:
        check_fields(self)


STAGE = Stage(NAME, "distinct tokens of each chunk (a stage registered from outside)", ToyOptions,
              "tests.stages.toy_stage")


def check(config) -> None:
    """The chunks need two tokens."""
    require_at_least("--seq-len", config.seq_len, 2, NAME)


def run(context) -> None:
    """One unit per chunk, then the table."""
    ids = as_chunks(context.chunks).ids.numpy()
    keys = [f"chunk_{c:03d}" for c in range(len(ids))]
    for c, key in enumerate(keys):
        if not context.run_dir.has_unit(NAME, key):
            row = {"chunk": c, "distinct_tokens": len(np.unique(ids[c])) * context.options.toy_weight,
                   "mean_id": float(np.mean(ids[c], dtype=np.float64))}
            context.run_dir.write_unit(NAME, key, {"rows": pd.DataFrame([row])})
    context.write_table("toy_chunks", context.run_dir.read_units(NAME, keys, "rows"))
