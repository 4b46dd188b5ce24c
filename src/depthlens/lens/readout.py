"""Read a prompt's intermediate residuals as next-token predictions through a Jacobian lens.

At every source layer ℓ the lens reads ``h_ℓ`` (block ℓ's output at each position) as the
model's own final norm and unembedding applied to ``J_ℓ h_ℓ``; the logit lens applies them to
``h_ℓ`` itself. At the last layer both are the model's output. The numerical core
(:func:`top_predictions`) takes arrays and an unembedding function; :func:`readout` runs the
model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike

from ..errors import InputError
from ..models.adapter import Adapter
from .artifact import Transport

__all__ = ["READOUT_COLUMNS", "readout", "top_predictions"]

#: The columns of :func:`readout`'s table, in order.
READOUT_COLUMNS: tuple[str, ...] = ("layer", "position", "input_token", "lens", "rank", "token_id", "prediction",
                                    "logit", "prob")


def top_predictions(logits: ArrayLike, top_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``top_k`` largest logits of each row and their softmax probabilities.

    Parameters
    ----------
    logits : array_like, shape (P, V)
        One row of vocabulary logits per position.
    top_k : int
        How many predictions a row keeps, ``1 ≤ top_k ≤ V``.

    Returns
    -------
    ids : ndarray (P, top_k) of int64
        Token ids, largest logit first (ties: the smaller id first).
    logit : ndarray (P, top_k), float64
    prob : ndarray (P, top_k), float64
        ``softmax(row)[id]``, computed in float64 with the row's maximum subtracted (exact to
        rounding).

    Examples
    --------
    >>> ids, logit, prob = top_predictions([[0.0, 2.0, 1.0]], 2)
    >>> ids.tolist(), prob.round(3).tolist()
    ([[1, 2]], [[0.665, 0.245]])
    """
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or not 1 <= top_k <= z.shape[1]:
        raise InputError(f"top_k is {top_k} for logits of shape {z.shape}; pass 1 <= top_k <= the vocabulary size.")
    ids = np.argsort(-z, axis=1, kind="stable")[:, :top_k]
    top = np.take_along_axis(z, ids, axis=1)
    shifted = z - z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    prob = np.exp(np.take_along_axis(shifted, ids, axis=1) - log_norm)
    return ids.astype(np.int64), top, prob


def _rows(layer: int, kind: str, logits: np.ndarray, positions: np.ndarray, top_k: int) -> pd.DataFrame:
    ids, logit, prob = top_predictions(logits, top_k)
    P = len(positions)
    return pd.DataFrame({"layer": layer, "position": np.repeat(positions, top_k), "lens": kind,
                         "rank": np.tile(np.arange(top_k), P), "token_id": ids.ravel(), "logit": logit.ravel(),
                         "prob": prob.ravel()})


def readout(adapter: Adapter, transport: Transport | Mapping[int, ArrayLike], input_ids: ArrayLike, *,
            layers: Sequence[int] | None = None, top_k: int = 5,
            decode: Callable[[int], str] | None = None) -> pd.DataFrame:
    """The top-``top_k`` next-token predictions of one prompt at every layer, through the lens
    (``lens="jacobian"``) and beside it the logit lens (``lens="logit"``).

    Parameters
    ----------
    adapter : Adapter
        The model the lens was fitted on (in memory or layer-streamed).
    transport : Transport or mapping of int to (d, d)
        The lens: an artifact (:func:`~depthlens.lens.read_transport`) or ``{layer: J}``.
    input_ids : array_like, shape (T,) or (1, T)
        One prompt's token ids.
    layers : sequence of int, optional
        Layers to read (default: the lens's source layers and the last layer, ``L − 1``, whose
        lens is the model's output).
    top_k : int
        Predictions kept per layer, position and lens.
    decode : callable, optional
        Token id → text, for the ``input_token`` and ``prediction`` columns (default: the id).

    Returns
    -------
    DataFrame
        :data:`READOUT_COLUMNS`, one row per (layer, position, lens, rank). ``logit`` is the
        model's logit in its own dtype (``J_ℓ h_ℓ`` is formed in float64 from the float64 lens
        and rounded to that dtype before the final norm); ``prob`` its softmax probability over
        the vocabulary in float64.

    Raises
    ------
    InputError
        A batch of prompts, a lens of another width, or a layer the lens has no matrix for.
    """
    ids = adapter.checked_ids(torch.as_tensor(np.asarray(input_ids)))
    if ids.shape[0] != 1:
        raise InputError(f"readout takes one prompt; got a batch of {ids.shape[0]}.")
    if isinstance(transport, Transport):
        fitted, d, matrix = list(transport.source_layers), transport.d_model, transport.matrix
    else:
        given = {int(k): np.asarray(v, dtype=np.float64) for k, v in transport.items()}
        fitted, matrix = sorted(given), given.__getitem__
        d = given[fitted[0]].shape[0]
    L = adapter.n_layers
    if d != adapter.d_model:
        raise InputError(f"the lens is {d} wide and the model {adapter.d_model}: it was fitted on another model.")
    final = L - 1
    wanted = sorted({*fitted, final}) if layers is None else sorted({adapter.check_layer(layer) for layer in layers})
    missing = [layer for layer in wanted if layer != final and layer not in fitted]
    if missing:
        raise InputError(f"the lens has no transport of layer {missing[0]}; its source layers are {fitted} "
                         f"(and {final}, the model's output).")
    S = len(adapter.boundaries)
    with torch.no_grad():
        states = adapter.residual_states(ids)[:, 0]  # (S·L + 1, T, d): block ℓ's output is [S·(ℓ + 1)]
        positions = np.arange(ids.shape[1])
        parts = []
        for layer in wanted:
            h = states[S * (layer + 1)]
            logit_lens = adapter.unembed(h[None])[0].double().cpu().numpy()
            if layer == final:
                lensed = logit_lens
            else:
                moved = torch.from_numpy(h.double().cpu().numpy() @ matrix(layer).T).to(device=h.device,
                                                                                          dtype=h.dtype)
                lensed = adapter.unembed(moved[None])[0].double().cpu().numpy()
            parts += [_rows(layer, "jacobian", lensed, positions, top_k), _rows(layer, "logit", logit_lens, positions,
                                                                                 top_k)]
    table = pd.concat(parts, ignore_index=True)
    tokens = ids[0].cpu().numpy()
    name = decode or str
    table["input_token"] = [name(int(tokens[p])) for p in table["position"]]
    table["prediction"] = [name(int(t)) for t in table["token_id"]]
    return table[list(READOUT_COLUMNS)]
