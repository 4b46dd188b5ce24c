"""The spectral geometry of a set of transport matrices, without the model.

Each ``J_ℓ`` gets the operator metrics of METHODS B2 (:func:`depthlens.jacobian.metrics.operator_metrics`:
condition number, Henrici departure, symmetry, complex and expanding fractions, spectral
radius, self-alignment, effective ranks), so the erank of the transport against depth reads
as the operators table's ``erank`` does. The metrics written ``*_update`` and
``complex_frac_nontrivial``/``rot_angle_mean`` are those of ``J_ℓ − I``, as for a sub-layer
operator.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
import pandas as pd

from ..jacobian.metrics import METRICS, metrics_and_eigenvalues
from .artifact import Transport, read_transport

__all__ = ["TRANSPORT_COLUMNS", "transport_table"]

#: The columns of :func:`transport_table`'s first table, in order.
TRANSPORT_COLUMNS: tuple[str, ...] = ("layer", *METRICS, "failure")


class _Lazy(Mapping):
    """``(layer, "transport") → J_layer``, each read from the artifact when asked for."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def __getitem__(self, key: tuple[int, str]) -> np.ndarray:
        return self._transport.matrix(key[0])

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return ((layer, "transport") for layer in self._transport.source_layers)

    def __len__(self) -> int:
        return len(self._transport.source_layers)


def transport_table(transport: Transport | str | Path, *, pool: Executor | None = None,
                    progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The metrics of every transport matrix, one row per source layer, and its eigenvalues.

    Parameters
    ----------
    transport : Transport or path
        A :class:`~depthlens.lens.artifact.Transport` or the path of an artifact
        (:func:`~depthlens.lens.artifact.read_transport`).
    pool : Executor, optional
        Worker processes for the decompositions; the results do not depend on it.
    progress : bool
        Show a progress bar.

    Returns
    -------
    metrics : DataFrame
        :data:`TRANSPORT_COLUMNS`: ``layer`` (int), the metrics (float64; exact to the
        tolerances :func:`~depthlens.jacobian.metrics.operator_metrics` states, on the stored
        matrices converted exactly to float64) and ``failure`` (None, or why no LAPACK driver
        decomposed the matrix; its metrics are then NaN).
    eigenvalues : DataFrame
        ``layer``, ``re``, ``im``: the eigenvalues of every ``J_ℓ``.

    Notes
    -----
    Memory: the matrices are read one at a time from the memory-mapped artifact (inline; with
    ``pool``, at most :data:`~depthlens.jacobian.metrics.PENDING` are in flight), so a lens of
    32 matrices at d = 4096 needs a few matrices' worth (134 MB each in float64), not all.
    """
    lens = transport if isinstance(transport, Transport) else read_transport(transport)
    metrics, eigen = metrics_and_eigenvalues(_Lazy(lens), pool=pool, progress=progress, label="transport")
    return (metrics.drop(columns="sublayer")[list(TRANSPORT_COLUMNS)],
            eigen.drop(columns="sublayer").reset_index(drop=True))
