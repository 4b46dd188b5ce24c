"""Which heads the report shows one by one: the top routing and the top sink head of a
``heads`` table, or the heads a user names as ``LAYER.HEAD`` (``--heads``)."""

from __future__ import annotations

import re

import pandas as pd

from ..errors import InputError

__all__ = ["chosen_heads", "parse_head", "top_heads"]


def parse_head(text: str) -> tuple[int, int]:
    """``(layer, head)`` of a ``--heads`` item ``LAYER.HEAD``.

    Raises
    ------
    InputError
        When ``text`` is not two non-negative integers joined by a dot.

    Examples
    --------
    >>> parse_head("3.5")
    (3, 5)
    """
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if match is None:
        raise InputError(f"--heads item {text!r} is not LAYER.HEAD; pass e.g. --heads 3.5,0.1.")
    return int(match.group(1)), int(match.group(2))


def top_heads(heads: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """The top routing head (largest previous-token or induction score) and the top sink head
    (largest sink mass) of a ``heads`` table: ``{"routing": (layer, head), "sink": (layer, head)}``,
    whatever their roles."""
    score = heads[["prev_token_score", "induction_score"]].max(axis=1)
    rows = {"routing": heads.loc[score.idxmax()], "sink": heads.loc[heads["sink_mass"].idxmax()]}
    return {role: (int(row["layer"]), int(row["head"])) for role, row in rows.items()}


def chosen_heads(heads: pd.DataFrame, wanted: tuple[str, ...] = ()) -> dict[tuple[int, int], str]:
    """The heads of ``wanted`` (``--heads`` items), or by default the two of :func:`top_heads`:
    ``(layer, head)`` → what picked it (``--heads``, ``routing`` or ``sink``), in order, each once.

    Raises
    ------
    InputError
        An item that is not ``LAYER.HEAD``, or a head that ``heads`` does not hold.
    """
    out: dict[tuple[int, int], str] = {}
    if not wanted:
        for role, key in top_heads(heads).items():
            out.setdefault(key, role)
        return out
    present = set(zip(heads["layer"].astype(int), heads["head"].astype(int)))
    for text in wanted:
        key = parse_head(text)
        if key not in present:
            raise InputError(f"--heads {text.strip()}: the model has layers 0–{int(heads['layer'].max())} and heads "
                             f"0–{int(heads['head'].max())}; pass heads inside them.")
        out.setdefault(key, "--heads")
    return out
