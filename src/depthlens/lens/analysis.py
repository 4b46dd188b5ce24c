"""The spectral geometry of a set of transport matrices, without the model.

Each ``J_ℓ`` gets the operator metrics of §B2 (:func:`depthlens.jacobian.metrics.operator_metrics`:
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

import pandas as pd
from numpy.typing import ArrayLike

from ..jacobian.metrics import METRICS, metrics_and_eigenvalues
from .artifact import Transport, read_transport

__all__ = ["TRANSPORT_COLUMNS", "transport_table"]

#: The columns of :func:`transport_table`'s first table, in order.
TRANSPORT_COLUMNS: tuple[str, ...] = ("layer", *METRICS, "failure")


class _Keyed(Mapping):
    """``(layer, "transport") → J_layer`` over a :class:`Transport` (each matrix read from the
    artifact when asked for) or a mapping of layer to matrix."""

    def __init__(self, source: Transport | Mapping[int, ArrayLike]) -> None:
        self._source = source
        self._layers = source.source_layers if isinstance(source, Transport) else tuple(source)

    def __getitem__(self, key: tuple[int, str]) -> ArrayLike:
        return self._source.matrix(key[0]) if isinstance(self._source, Transport) else self._source[key[0]]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return ((int(layer), "transport") for layer in self._layers)

    def __len__(self) -> int:
        return len(self._layers)


def transport_table(transport: Transport | str | Path | Mapping[int, ArrayLike], *, pool: Executor | None = None,
                    progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The metrics of every transport matrix, one row per source layer, and its eigenvalues.

    Parameters
    ----------
    transport : Transport, path or mapping
        A :class:`~depthlens.lens.artifact.Transport`, the path of an artifact
        (:func:`~depthlens.lens.artifact.read_transport`), or ``{layer: J}`` in memory (a fit's
        float64 mean, :meth:`~depthlens.lens.fit.TransportSums.mean`).
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
    source = transport if isinstance(transport, (Transport, Mapping)) else read_transport(transport)
    metrics, eigen = metrics_and_eigenvalues(_Keyed(source), pool=pool, progress=progress, label="transport")
    return (metrics.drop(columns="sublayer")[list(TRANSPORT_COLUMNS)],
            eigen.drop(columns="sublayer").reset_index(drop=True))
