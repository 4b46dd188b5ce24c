"""The claims' verdicts in HTML: the at-a-glance table, each claim's folded prose (interval,
calibration, protocol, sensitivity and sample), the verdict legend, and the badges the report
and the cross-model comparison share."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..runs.tables import STATUS_TEXT
from .claims import VERDICTS, claims_hash
from .methods_page import METHODS_PAGE, link_sections
from .verdict_text import interval_ends, interval_inline, verdict_label
from .statistics import SAMPLE_UNITS

VERDICT_COLOURS = {"supported": "#1a7f37", "falsified": "#cf222e", "inconclusive": "#bf8700",
                   "not tested": "#6e7781"}
#: An inconclusive verdict because the run's sample is below the claim's minimum.
UNDERPOWERED_COLOUR = "#8250df"
#: The mark of a decisive verdict that changes under one of the claim's sensitivity variants.
FRAGILE_BADGE = '<span class="verdict fragile" style="background:#bc4c00">fragile</span>'


def esc(value: Any) -> str:
    """``html.escape`` of ``str(value)`` (quotes included)."""
    return html.escape(str(value), quote=True)


def section_links(escaped: str, folder: str = "docs/") -> str:
    """Escaped HTML ``escaped`` with each section citation (``§A4``) as a link to its section of
    ``docs/methods.md`` (relative to the run directory, where the report writes ``docs/``)."""
    return link_sections(escaped, lambda cite, anchor: f'<a href="{folder}{METHODS_PAGE}#{anchor}">{cite}</a>')


def verdict_badge(r: Mapping[str, Any]) -> str:
    """The coloured badge of a claim result's (or a sensitivity variant's) ``verdict``; an
    underpowered inconclusive verdict gets its own colour and says so."""
    if r.get("underpowered"):
        label = f"{esc(r['verdict'])}: underpowered"
        return (f'<span title="{label}" class="verdict underpowered" style="background:{UNDERPOWERED_COLOUR}">'
                f"{label}</span>")
    colour = VERDICT_COLOURS.get(r["verdict"], "#6e7781")
    label = esc(verdict_label(r))  # the glance table may cut a long one short: the title holds it whole
    return f"<span title=\"{label}\" class=\"verdict\" style=\"background:{colour}\">{label}</span>"


#: The mark beside every verdict of a smoke run (see :mod:`.header_html`).
SMOKE_MARK = ('<span class="smoke-mark" title="a smoke run: verdicts at these sizes are not measurements">'
              "smoke run</span>")


def glance_section(results: list[dict], smoke: bool = False) -> str:
    """Every claim's verdict, value (with its interval) and test on one line each, the first
    thing on the page (at 1280 × 800 the whole table is on the first screen); each id links to
    the claim's section below. With ``smoke``, every verdict says it is a smoke run's."""
    if not results:
        return ""
    mark = " " + SMOKE_MARK if smoke else ""
    rows = "".join(
        f'<tr><td><a href="#claim-{esc(r["id"])}">{esc(r["id"])}</a></td><td>{verdict_badge(r)}'
        f'{" " + FRAGILE_BADGE if r.get("fragile") else ""}{mark}</td>'
        f'<td class="num">{esc(r["value_text"] or "—")}{esc(interval_inline(r))}</td>'
        f'<td class="num">{esc(r["criterion"])}</td></tr>' for r in results)
    return ('<section id="glance"><table class="glance" id="verdicts"><thead><tr><th>claim</th><th>verdict</th>'
            "<th>value [95% interval]</th><th>test</th></tr></thead><tbody>" + rows + "</tbody></table></section>")


def claim_details(r: Mapping[str, Any]) -> str:
    """A claim's prose, folded: its prediction, falsifier, source and protocol, the statistic
    with its value and interval, the threshold with its band and sample, and the verdict's
    reason, calibration and sensitivity variants."""
    return (
        '<details class="claim-prose"><summary>Prediction, statistic and verdict</summary><dl>'
        f"<dt>prediction</dt><dd>{esc(r['prediction'])}<br><small>falsified if: {esc(r['falsifier'])}</small><br>"
        f"<small>source: {esc(r['source'])}</small>{_protocol_text(r)}{_methods_link(r)}</dd>"
        f"<dt>statistic</dt><dd><code>{esc(r['statistic'])}</code>: {esc(r['statistic_description'])}</dd>"
        f"<dt>value</dt><dd>{esc(r['value_text'] or '—')}{_interval_text(r)}</dd>"
        f"<dt>threshold</dt><dd>{esc(r['criterion'])}{_band_text(r)}{_sample_text(r)}</dd>"
        f"<dt>verdict</dt><dd>{esc(verdict_label(r))}: {esc(r['reason'])}{_calibration_text(r)}{_sensitivity_html(r)}</dd>"
        "</dl></details>")


def claims_legend(results: list[dict], claims_file: Path, registered: str | None = None) -> str:
    """The verdict counts, the claims file with its hash, and what each verdict means."""
    counts = ", ".join(f"{sum(r['verdict'] == v for r in results)} {esc(v)}" for v in VERDICTS)
    n_under = sum(bool(r.get("underpowered")) for r in results)
    if n_under:
        counts += f" ({n_under} of the inconclusive underpowered)"
    current = claims_hash(claims_file)
    if registered is None:
        hashes = f"sha256 <code>{esc(current)}</code> (the run recorded no registered claims hash)"
    elif registered == current:
        hashes = f"sha256 <code>{esc(current)}</code>, the one registered with the run"
    else:
        hashes = (f"sha256 <code>{esc(current)}</code>; registered with the run: sha256 "
                  f"<code>{esc(registered)}</code> (re-scored)")
    return (
        f"<p class=\"meta\" id=\"claims-file\">{counts}. Claims file {esc(claims_file.name)}, {hashes}.</p>"
        "<details class=\"legend\"><summary>What the verdicts mean</summary><p>"
        "<i>not tested</i> = the statistic's inputs are missing (stage not run); "
        "<i>inconclusive</i> = too little data, or a near miss inside the pre-registered band; "
        "<i>inconclusive: underpowered</i> = the run's sample (chunks, heads, boundaries, ...) is "
        "below the claim's pre-registered minimum, or the claim's calibration at this sample (its error "
        "rates under a planted null and a planted effect of the seed's size) exceeds 0.05, so no verdict "
        "is drawn from it; a decisive verdict also needs the statistic's 95% interval (or, for a range over "
        "protocol choices, every choice) to stay out of the opposite region; "
        "<i>fragile</i> = a decisive verdict that changes under one of the claim's sensitivity variants "
        "(the same test on another operationalisation), listed under it.</p></details>"
    )


def _interval_text(result: Mapping[str, Any]) -> str:
    """The statistic's 95% interval (or range over protocol choices) under its value."""
    ends = interval_ends(result)
    if ends is None:
        return ""
    what = "range over orders" if result.get("interval_kind") == "range" else "95% interval"
    return f"<br><small>{what} [{esc(ends[0])}, {esc(ends[1])}]</small>"


def _calibration_text(result: Mapping[str, Any]) -> str:
    """The claim's error rates under planted nulls and effects at this run's sample size."""
    cal = result.get("calibration")
    if not cal:
        why = result.get("uncalibrated")
        return f'<br><small class="calibration">{esc(why)}</small>' if why else ""
    mark = "" if cal["accepted"] else " (not accepted: a 95% upper bound above 0.05)"
    return (f'<br><small class="calibration">calibrated at this sample ({cal["draws"]} draws a world): '
            f"P(supported | null) = {cal['p_supported_null']:.2f}{_upper(cal, 'p_supported_null')}, "
            f"P(falsified | effect) = {cal['p_falsified_effect']:.2f}{_upper(cal, 'p_falsified_effect')}"
            f"{esc(mark)}, power P(supported | effect) = {cal['p_supported_effect']:.2f}</small>")


def _upper(cal: Mapping[str, Any], rate: str) -> str:
    """`` (≤ bound)``: the one-sided 95 % upper bound of an error rate, where the calibration has one."""
    bound = cal.get(f"{rate}_upper")
    return "" if bound is None else f" (≤ {bound:.3f})"


def _methods_link(result: Mapping[str, Any]) -> str:
    """A link to the claim's section of the method reference, where it has one."""
    href = result.get("methods")
    return f'<br><small><a class="methods" href="{esc(href)}">method: how it is measured and judged</a></small>' \
        if href else ""


def _protocol_text(result: Mapping[str, Any]) -> str:
    out = f'<br><b class="note">note: {esc(result["note"])}</b>' if result.get("note") else ""
    out += f"<br><small>protocol: {section_links(esc(result['protocol']))}</small>" if result.get("protocol") else ""
    described = result.get("descriptive") or {}
    if described:
        out += "<br><small>beside it: " + esc("; ".join(
            f"{name} = {'—' if v is None else num(v)}" for name, v in described.items())) + "</small>"
    return out


def _sensitivity_html(result: Mapping[str, Any]) -> str:
    """The claim's sensitivity variants under its verdict, with a fragile badge when one flips it."""
    variants = result.get("sensitivity") or []
    if not variants:
        return ""
    badge = f"<br>{FRAGILE_BADGE}" if result.get("fragile") else ""
    rows = "".join(f"<li>{esc(v['name'])}: {esc(v['value_text'])} → {esc(v['verdict'])}</li>" for v in variants)
    return f'{badge}<details class="sensitivity"><summary>sensitivity</summary><ul>{rows}</ul></details>'


def _band_text(result: Mapping[str, Any]) -> str:
    bands = result.get("inconclusive_band") or []
    if not bands:
        return ""
    text = " ∪ ".join(f"[{num(lo)}, {num(hi)}]" for lo, hi in bands)
    return f"<br><small>inconclusive: {esc(text)}</small>"


def _sample_text(result: Mapping[str, Any]) -> str:
    minimum = result.get("min_sample") or {}
    if not minimum:
        return ""
    sample = result.get("sample") or {}
    parts = []
    for unit, need in minimum.items():
        n = sample.get(unit)
        have = "" if n is None else f" (n = {n})"
        parts.append(f"{need} {SAMPLE_UNITS.get(unit, unit)}{have}")
    return f"<br><small>needs ≥ {esc('; '.join(parts))}</small>"


def status_badge(status: str) -> str:
    """The badge of a stage's or run's status (``done``, ``failed``, ``running``; anything else
    grey, as not run)."""
    cls = {"done": "done", "failed": "failed", "running": "running", "interrupted": "running"}.get(status, "notrun")
    return f'<span class="status status-{cls}">{esc(STATUS_TEXT.get(status, status))}</span>'


def num(v: Any) -> str:
    """A value as the report prints it: 4 significant digits, — for missing or NaN, ±∞."""
    if isinstance(v, bool) or v is None:
        return "—" if v is None else str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "+∞" if v > 0 else "−∞"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(num(x) for x in v)
    if isinstance(v, Mapping):
        return "; ".join(f"{k}: {num(x)}" for k, x in v.items()) if v else "none"
    return str(v)
