"""Claim results as text: a verdict's label, a value's interval, and the verdict lines the
terminal prints at the end of a run (read from ``RUN/claims.json``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["CLAIMS_JSON", "fmt", "interval_ends", "interval_inline", "verdict_label", "verdict_lines"]

#: The claims' results of a run, in its directory.
CLAIMS_JSON = "claims.json"


def verdict_label(result: Mapping[str, Any]) -> str:
    """A claim result's verdict as it is shown: ``supported (marginal)`` for a marginal verdict,
    ``not tested (needs --null init)`` where the result says what would test it, else the
    verdict alone.

    Examples
    --------
    >>> verdict_label({"verdict": "supported", "marginal": True})
    'supported (marginal)'
    >>> verdict_label({"verdict": "not tested", "needs": "--null init"})
    'not tested (needs --null init)'
    """
    name = str(result.get("verdict", ""))
    if result.get("marginal"):
        return f"{name} (marginal)"
    if name == "not tested" and result.get("needs"):
        return f"{name} (needs {result['needs']})"
    return name


def verdict_lines(run_dir: str | Path) -> list[str]:
    """The verdicts at a glance, one line per claim of ``RUN/claims.json`` (none when it is
    absent or unreadable): id, verdict (:func:`verdict_label`), value with its interval
    (``[lo, hi]``, a range over protocol choices as ``range lo..hi``), the test, and
    ``(underpowered)`` or ``(fragile)`` where that holds; a claim with a ``note`` gets it on
    a second line. What the terminal prints at the end of a run and the report's first
    screen shows.

    Examples
    --------
    >>> verdict_lines("/no/such/run")
    []
    """
    try:
        results = json.loads((Path(run_dir) / CLAIMS_JSON).read_text())["results"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    rows = []
    for r in results:
        value = (r.get("value_text") or "—") + interval_inline(r)
        notes = [n for n in ("underpowered", "fragile") if r.get(n)]
        rows.append((str(r.get("id", "")), verdict_label(r), value, str(r.get("criterion", "")),
                     f" ({', '.join(notes)})" if notes else ""))
    if not rows:
        return []
    widths = [max(len(row[k]) for row in rows) for k in range(3)]
    lines = []
    for (a, b, c, d, e), r in zip(rows, results):
        lines.append(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}{e}".rstrip())
        if r.get("note"):
            lines.append(f"{'':<{widths[0]}}  note: {r['note']}")
    return lines


def interval_ends(result: Mapping[str, Any]) -> tuple[str, str] | None:
    """The two ends of a claim result's ``interval`` as text (``−∞``/``+∞`` for infinite ends,
    ``—`` for a missing one), or None when it has no interval; one format for the terminal,
    the glance table and the claims table."""
    interval = result.get("interval")
    if not isinstance(interval, (list, tuple)) or len(interval) != 2:
        return None
    lo, hi = ("—" if x is None else fmt(float(x)) for x in interval)  # float("-inf") reads the JSON text ends
    return lo, hi


def interval_inline(result: Mapping[str, Any]) -> str:
    """`` [lo, hi]`` (a range over protocol choices: `` range lo..hi``) to follow a value, or
    nothing when the interval is absent or an end is missing."""
    ends = interval_ends(result)
    if ends is None or "—" in ends:
        return ""
    lo, hi = ends
    return f" range {lo}..{hi}" if result.get("interval_kind") == "range" else f" [{lo}, {hi}]"


def fmt(x: float) -> str:
    """A number as the claims show it: an integer plainly, else 3 significant digits; ±∞ and nan
    spelled out; a negative number with the minus sign ``−`` (U+2212), as ``−∞``.

    Examples
    --------
    >>> fmt(-0.10512), fmt(0.293), fmt(-3.0), fmt(float("-inf")), fmt(-2.5e-7)
    ('−0.105', '0.293', '−3', '−∞', '−2.5e-07')
    """
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "+∞" if x > 0 else "−∞"
    text = str(int(x)) if x == int(x) and abs(x) < 1e6 else f"{x:.3g}"
    return "−" + text[1:] if text.startswith("-") else text
