"""Residual-stream summaries per sub-layer boundary (array functions, no model).

Boundary ``b`` of a model with ``L`` layers: ``b = 2l`` is the pre-attention residual of
layer ``l``, ``b = 2l + 1`` its pre-MLP residual, ``b = 2L`` the output of the last layer
before the final norm. A family whose layer updates the residual more often has ``S > 2``
boundaries a layer (Gemma 4: ``pre_attn``, ``pre_mlp``, ``pre_ple``), ``b = S·l + k``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import InputError

MASSIVE_ABS = 100.0
MASSIVE_RATIO = 1000.0


#: The boundaries of a layer with an attention and an MLP update.
BOUNDARIES: tuple[str, ...] = ("pre_attn", "pre_mlp")


def boundary_names(n_layers: int, boundaries: tuple[str, ...] = BOUNDARIES) -> list[tuple[int, str]]:
    """``(layer, boundary)`` for each of the ``S·L + 1`` boundaries (``S`` of them a layer), in depth order."""
    names = [(layer, kind) for layer in range(n_layers) for kind in boundaries]
    return names + [(n_layers, "final")]


def massive_mask(h: np.ndarray, abs_min: float = MASSIVE_ABS, ratio: float = MASSIVE_RATIO) -> np.ndarray:
    """Massive activations of one boundary (§A7).

    An entry is massive when ``|h| >= abs_min`` and ``|h| >= ratio * median(|h|)``, the
    median taken over all entries of that boundary (all tokens and dimensions given).

    Parameters
    ----------
    h : ndarray, shape (..., d)
        Residual states at one boundary.

    Returns
    -------
    ndarray of bool, same shape as ``h``.
    """
    mag = np.abs(np.asarray(h, dtype=np.float64))
    return (mag >= abs_min) & (mag >= ratio * np.median(mag))


def summarise_boundaries(states: np.ndarray, positions: np.ndarray | None = None,
                         boundaries: tuple[str, ...] = BOUNDARIES) -> pd.DataFrame:
    """Per-boundary summary of residual states of one chunk.

    Parameters
    ----------
    states : ndarray, shape (S·L + 1, T, d)
        Residual states of one chunk at every boundary (or at the positions summarised).
    positions : ndarray of int, shape (T,), optional
        The chunk's position of each of the ``T`` states given (e.g. a prompt's analysed
        positions), which ``max_pos`` reports; default ``0 … T − 1``.
    boundaries : tuple of str
        The ``S`` boundaries of a layer (the adapter's ``boundaries``).

    Returns
    -------
    DataFrame
        One row per boundary: ``layer``, ``boundary``, ``rms`` (root mean square over all
        entries), ``median_abs``, ``max_abs`` and its ``max_pos`` / ``max_dim``, and
        ``n_massive`` (count of :func:`massive_mask` entries). Exact float64 reductions.

    Raises
    ------
    InputError
        If ``states`` is not 3-D with ``S·L + 1`` boundaries.
    """
    arr = np.asarray(states, dtype=np.float64)
    S = len(boundaries)
    if arr.ndim != 3 or arr.shape[0] % S != 1 or arr.shape[1] == 0:
        raise InputError(f"residual states have shape {arr.shape}; expected ({S}L + 1, T, d) with T >= 1.")
    where = np.arange(arr.shape[1]) if positions is None else np.asarray(positions, dtype=np.int64)
    if where.shape != (arr.shape[1],):
        raise InputError(f"positions has shape {where.shape}; pass one position per state ({arr.shape[1]}).")
    rows = []
    for b, (layer, kind) in enumerate(boundary_names(arr.shape[0] // S, boundaries)):
        h = arr[b]
        mag = np.abs(h)
        pos, dim = np.unravel_index(int(np.argmax(mag)), mag.shape)
        rows.append(
            {
                "layer": layer,
                "boundary": kind,
                "rms": float(np.sqrt(np.mean(h * h))),
                "median_abs": float(np.median(mag)),
                "max_abs": float(mag[pos, dim]),
                "max_pos": int(where[pos]),
                "max_dim": int(dim),
                "n_massive": int(massive_mask(h).sum()),
            }
        )
    return pd.DataFrame(rows)
