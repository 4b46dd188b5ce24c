"""One section of the report per claim: its figure first, then its prose folded in
``<details>``; and the figures no claim shows, by report part.

Each claim section has the anchor ``claim-ID`` (the verdict table links to it, and a reference
page can link to it). A figure that several claims read is drawn under the first of them; the
others link to it.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path

from .figures import FIGURES
from .verdicts_html import FRAGILE_BADGE, SMOKE_MARK, claim_details, esc, verdict_badge
from .statistics import STATISTICS
from .verdict_text import interval_inline

__all__ = ["CLAIM_FIGURES", "NEEDS_FIGURES", "claim_figure", "claim_sections", "figure_html", "other_figures"]

#: The figure of each default claim (None: the claim has no figure of its own).
CLAIM_FIGURES: dict[str, str | None] = {
    "A2-eig-gap-contrast": "depth_products", "A2b-eig-gap-absent-in-nulls": "depth_products",
    "A4-induction-doubling": None, "A5-routing-positive": "transient_reserve",
    "A5b-routing-tracks-prev-token": "transient_reserve", "A6-sink-negative": "transient_reserve",
    "A7-clamp-chain": "clamp_dose", "A7-contest-resolvent-required": "contest",
    "A7-criticality-unpredicted": "criticality", "B1-complex-early": "eigenvalue_clouds",
    "B1b-symmetric-late": "operator_profile", "B2-funnel-trained": "cumulative_erank",
    "B3-funnel-learned": "cumulative_erank", "B4-funnel-schur": "schur_split", "B5-coupling-rise": "coupling",
    "B5b-coupling-sign": "coupling", "B6-coupling-init": "coupling", "C1-consolidation-after-formation":
    "census_formation", "C2-funnel-learned-census": "census_funnel", "C3-coupling-trend": "census_coupling",
}
#: The figure of any other claim, by the first output its statistic reads.
NEEDS_FIGURES = {"depth": "depth_products", "heads": "transient_reserve", "head_chunks": "transient_reserve",
                 "interventions.json": "clamp_dose", "clamp": "clamp_dose", "contest": "contest",
                 "ablation": "criticality", "eigenvalues": "eigenvalue_clouds", "operators": "operator_profile",
                 "cumulative": "cumulative_erank", "coupling": "coupling", "transport": "transport_funnel",
                 "census_heads": "census_formation", "census": "census_funnel"}

_SPECS = {spec.name: spec for spec in FIGURES}


def claim_figure(result: Mapping[str, object]) -> str | None:
    """The name of the figure a claim result is shown with, or None."""
    if result["id"] in CLAIM_FIGURES:
        return CLAIM_FIGURES[str(result["id"])]
    statistic = STATISTICS.get(str(result.get("statistic")))
    needs = statistic.needs if statistic is not None else ()
    return next((NEEDS_FIGURES[n] for n in needs if n in NEEDS_FIGURES), None)


def figure_html(name: str, title: str, caption: str, png: bytes | None, why: str) -> str:
    """A ``<figure>`` with the PNG embedded as a ``data:`` URI and its caption, or, without
    ``png``, the title marked not available with ``why``."""
    if png is None:
        return (f'<figure id="fig-{esc(name)}"><p class="unavailable">{esc(title)}: not available — {esc(why)}.</p>'
                f"<figcaption>{esc(caption)}</figcaption></figure>")
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure id="fig-{esc(name)}"><img src="data:image/png;base64,{data}" alt="{esc(title)}">'
            f"<figcaption><b>{esc(title)}.</b> {esc(caption)}</figcaption></figure>")


def _figure(name: str, figures: Mapping[str, tuple[Path | None, str]]) -> str:
    spec = _SPECS[name]
    path, why = figures.get(name, (None, "not drawn"))
    return figure_html(name, spec.title, spec.caption, None if path is None else path.read_bytes(), why)


def claim_sections(results: list[dict], figures: Mapping[str, tuple[Path | None, str]],
                   smoke: bool = False) -> tuple[str, set[str]]:
    """Every claim's section, and the names of the figures drawn in them.

    A section holds a heading with the claim's id, verdict, value and test; the claim's figure
    (or a link to it under an earlier claim); and :func:`~.verdicts_html.claim_details`.
    """
    shown: dict[str, str] = {}
    out = []
    for r in results:
        name = claim_figure(r)
        if name is None or name not in _SPECS:
            figure = '<p class="unavailable">This claim has no figure of its own; its numbers are below.</p>'
        elif name in shown:
            figure = (f'<p class="seefig">Figure: <a href="#fig-{esc(name)}">{esc(_SPECS[name].title)}</a>, '
                      f'under <a href="#claim-{esc(shown[name])}">{esc(shown[name])}</a>.</p>')
        else:
            shown[name] = str(r["id"])
            figure = _figure(name, figures)
        out.append(
            f'<section class="claim" id="claim-{esc(r["id"])}"><h3>{esc(r["id"])} {verdict_badge(r)}'
            f'{" " + FRAGILE_BADGE if r.get("fragile") else ""}{" " + SMOKE_MARK if smoke else ""}'
            f'<span class="claim-value">{esc(r["value_text"] or "—")}{esc(interval_inline(r))} · test '
            f'{esc(r["criterion"])}</span></h3>{figure}{claim_details(r)}</section>')
    return "\n".join(out), set(shown)


def other_figures(part: str, shown: set[str], figures: Mapping[str, tuple[Path | None, str]]) -> list[str]:
    """The figures of report ``part`` that no claim section drew, in report order."""
    return [_figure(spec.name, figures) for spec in FIGURES if spec.part == part and spec.name not in shown]
