"""The report's numbers-only sections: numerical health, the stages, each part's summaries and
the column glossary of every table, and the run's configuration and provenance, all as HTML tables
(nested tables for nested values, never a Python or JSON repr in the visible text)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ..runs.tables import RunTables
from ..schema import COLUMNS, TABLES
from .health import numerical_health
from .verdicts_html import esc, num, section_links, status_badge

__all__ = ["attention_summary", "census_summary", "df_table", "health_section", "interventions_summary",
           "provenance_section", "readout_summary", "residual_summary", "stages_section", "tables_html",
           "value_html", "value_table"]

#: Folder of the run directory with the column reference pages (as in :mod:`.html`).
DOCS = "docs"
#: Readable names of summary keys (any other key: its words, underscores as spaces).
LABELS = {
    "n_heads": "heads", "q_level": "BH-FDR level q",
    "routing_positive_significant": "routing heads with significant positive Δ_TR (fraction)",
    "sink_negative": "sink heads with negative Δ_TR (fraction)",
    "sink_negative_significant": "sink heads with significant negative Δ_TR (fraction)",
    "kreiss_A_flagged_matrices": "matrices whose K(A) misses √n",
    "induction_routing_heads": "routing heads probed", "induction_ratio_median": "median engagement ratio (probe)",
    "induction_ratio_control_median": "median engagement ratio against the control",
    "induction_excluded_first": "heads left out (no reserve on the first copy)",
    "induction_excluded_control": "heads left out (no reserve on the control)",
    "brackets": "certified Kreiss brackets", "uncertified": "brackets not certified",
    "bracket_violations": "search values outside their bracket", "kreiss_A_flagged": "heads whose K(A) misses √n",
    "significant_layers": "layers with an FDR-significant boundary", "n_boundaries": "boundaries tested",
    "seconds": "time (s)", "fallbacks": "LAPACK fallbacks", "drivers": "LAPACK drivers (calls)",
}
#: Keys of attention.json shown in its own tables (the rest: one readable table).
_INDUCTION = ("induction_routing_heads", "induction_ratio_median", "induction_ratio_control_median",
              "induction_excluded_first", "induction_excluded_control")
_SIGNS = ("routing_positive_significant", "sink_negative", "sink_negative_significant", "q_level")


def label(key: Any) -> str:
    """The readable name of a summary key."""
    return LABELS.get(str(key), str(key).replace("_", " "))


def value_html(value: Any) -> str:
    """A value as HTML: a mapping as a nested two-column table, a list of mappings as a list of
    such tables, any other list comma-separated, a scalar by :func:`~.verdicts_html.num`."""
    if isinstance(value, Mapping):
        return value_table(value, nested=True) if value else "none"
    if isinstance(value, (list, tuple)) and any(isinstance(v, Mapping) for v in value):
        return "<ol class=\"plain\">" + "".join(f"<li>{value_html(v)}</li>" for v in value) + "</ol>"
    if isinstance(value, (list, tuple)):
        return esc(", ".join(num(v) for v in value)) if value else "none"
    return esc(num(value))


def value_table(values: Mapping[str, Any], *, nested: bool = False) -> str:
    """A two-column table of ``values``: readable key names, values by :func:`value_html`."""
    rows = "".join(f"<tr><th>{esc(label(k))}</th><td{_num_class(v)}>{value_html(v)}</td></tr>"
                   for k, v in values.items())
    return f'<table class="{"kv nested" if nested else "kv"}"><tbody>{rows}</tbody></table>'


def _num_class(value: Any) -> str:
    return ' class="num"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def health_section(tables: RunTables) -> str:
    """Numerical health: structural facts and numerical checks (not claims)."""
    marks = {True: "ok", False: "check", None: "—"}
    rows = "".join(f"<tr><td>{section_links(esc(c.name))}</td><td class=\"num\">{esc(c.value)}</td><td>{marks[c.ok]}</td>"
                   f"<td><small>{esc(c.detail)}</small></td></tr>" for c in numerical_health(tables))
    return ('<section id="health"><h2>Numerical health</h2><p>Structural facts the analysis relies on and '
            "numerical checks of this run. They are not claims: a failed check is a numerical problem to look "
            "at before trusting the verdicts, not a finding.</p><table><thead><tr><th>check</th><th>value</th>"
            "<th>status</th><th>how to read it</th></tr></thead><tbody>" + rows + "</tbody></table></section>")


def stages_section(tables: RunTables, known: list[str]) -> str:
    """One row per stage (``known`` first, then any other the manifest lists): its status, time,
    LAPACK fallbacks, the LAPACK drivers it called as a nested table, and any other detail."""
    stages = tables.manifest.get("stages") or {}
    names = list(dict.fromkeys(known + list(stages)))
    infos = {s: stages.get(s) if isinstance(stages.get(s), Mapping) else {} for s in names}
    others = {s: {k: v for k, v in info.items() if k not in ("status", "seconds", "fallbacks", "drivers")}
              for s, info in infos.items()}
    rows = []
    for stage, info in infos.items():
        drivers = info.get("drivers")
        drivers_html = (df_table_rows(None, sorted(drivers.items())) if isinstance(drivers, Mapping) and drivers
                        else "—")
        other = f"<td>{value_table(others[stage], nested=True) if others[stage] else ''}</td>" if any(
            others.values()) else ""
        rows.append(f"<tr><td>{esc(stage)}</td><td>{status_badge(tables.stage_status(stage))}</td>"
                    f"<td class=\"num\">{esc(num(info.get('seconds')))}</td>"
                    f"<td class=\"num\">{esc(num(info.get('fallbacks')))}</td><td>{drivers_html}</td>{other}</tr>")
    head = ("<th>stage</th><th>status</th><th>time (s)</th><th>fallbacks</th><th>LAPACK drivers (calls)</th>"
            + ("<th>other</th>" if any(others.values()) else ""))
    return ('<section id="stages"><h2>Stages</h2><p>Each stage of the run: its status, its time, how often a '
            "LAPACK driver fell back to another, and which drivers it called how often.</p><div class=\"wide\">"
            f"<table><thead><tr>{head}</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div></section>")


def df_table_rows(header: tuple[str, ...] | None, rows: list[tuple[Any, ...]]) -> str:
    """A small nested table of ``rows`` under ``header`` (none without one; numbers right-aligned)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header or ())
    body = "".join("<tr>" + "".join(f"<td{_num_class(v)}>{esc(num(v))}</td>" for v in row) + "</tr>" for row in rows)
    thead = f"<thead><tr>{head}</tr></thead>" if head else ""
    return f'<table class="nested">{thead}<tbody>{body}</tbody></table>'


def attention_summary(tables: RunTables) -> str:
    """``attention.json`` as readable tables: head roles against the sign of their excess reserve,
    the signed organisation, the induction probe, the eigenvalue-prediction error at the final
    depth and anything else it holds; then the heads with the largest and smallest Δ_TR."""
    summary = tables.json("attention")
    if summary is None:
        why = esc(tables.why_missing("attention.json"))
        return f'<p class="unavailable">Attention summary not available ({why}).</p>'
    out = ["<h3>Attention summary</h3>"]
    roles = summary.get("roles") if isinstance(summary.get("roles"), Mapping) else {}
    overlap = summary.get("role_overlap") if isinstance(summary.get("role_overlap"), Mapping) else {}
    signs = [s for s in ("positive", "negative", "zero") if s in overlap] + [s for s in overlap
                                                                          if s not in ("positive", "negative", "zero")]
    names = list(dict.fromkeys(list(roles) + [r for s in signs if isinstance(overlap[s], Mapping) for r in overlap[s]]))
    if names:
        rows = [(name, roles.get(name), *((overlap[s] or {}).get(name) if isinstance(overlap[s], Mapping) else None
                                          for s in signs)) for name in names]
        out.append(f"<p>{esc(num(summary.get('n_heads')))} heads of the trained model by role, and how many of each "
                   "have a positive, negative or zero excess reserve Δ_TR.</p>"
                   + df_table_rows(("role", "heads", *(f"Δ_TR {s}" for s in signs)), rows))
    groups = (("Signed organisation", _SIGNS), ("Induction probe (§A5)", _INDUCTION))
    for title, keys in groups:
        present = {k: summary[k] for k in keys if k in summary}
        if present:
            out.append(f"<h4>{esc(title)}</h4>" + value_table(present))
    out.append(_eig_gaps(summary.get("eig_gap_final_depth")))
    shown = {"roles", "role_overlap", "n_heads", "options", "eig_gap_final_depth", *_SIGNS, *_INDUCTION}
    rest = {k: v for k, v in summary.items() if k not in shown}
    if rest:
        out.append("<h4>Other facts of attention.json</h4>" + value_table(rest))
    out.append(_top_heads(tables))
    return "\n".join(out)


def _eig_gaps(gaps: Any) -> str:
    if not isinstance(gaps, Mapping) or not gaps:
        return ""
    rows = []
    for op, by_source in gaps.items():
        for source, vals in (by_source.items() if isinstance(by_source, Mapping) else []):
            vals = vals if isinstance(vals, Mapping) else {}
            rows.append((op, source, vals.get("median_gap_e1"), vals.get("median_gap_e2")))
    return ("<h4>Eigenvalue-prediction error at the final depth (median log10 ‖D‖/E)</h4>"
            + df_table_rows(("operator", "source", "gap E1", "gap E2"), rows))


def _top_heads(tables: RunTables) -> str:
    heads = tables.trained("heads")
    if heads is None or not {"layer", "head", "delta_TR1"} <= set(heads.columns):
        return ""
    cols = [c for c in ("layer", "head", "role", "sink_mass", "prev_token_score", "induction_score", "TR1",
                        "null_TR1_mean", "delta_TR1", "null_q") if c in heads.columns]
    top = heads.sort_values("delta_TR1", ascending=False, na_position="last")[cols]
    if len(top) > 10:
        return ("<h4>Heads with the largest and smallest excess reserve Δ_TR</h4>"
                + df_table(top.head(5)) + df_table(top.tail(5).iloc[::-1]))
    return "<h4>Heads by excess reserve Δ_TR</h4>" + df_table(top)


def residual_summary(tables: RunTables) -> str:
    """The topology summary and the median operator metrics per checkpoint and Jacobian mode."""
    out = []
    topo = tables.json("topology")
    if topo is not None:
        out.append("<h3>Topology summary</h3>" + value_table(topo))
    else:
        why = esc(tables.why_missing("topology.json"))
        out.append(f'<p class="unavailable">Topology summary not available ({why}).</p>')
    ops = tables.table("operators")
    if ops is not None and {"checkpoint", "jacobian_mode", "sublayer"} <= set(ops.columns):
        ops = ops[ops["sublayer"].isin(("attn", "mlp"))]
        cols = [c for c in ("complex_frac", "henrici_update_rel", "symmetry", "erank", "spectral_radius", "cond")
                if c in ops.columns]
        if cols:
            mean = ops.groupby(["checkpoint", "jacobian_mode"])[cols].median().reset_index()
            out.append("<h3>Operator metrics (median over the attention and MLP sub-layers)</h3>" + df_table(mean))
    return "\n".join(out)


def provenance_section(manifest: Mapping[str, Any]) -> str:
    """The run's configuration, model, data and versions as nested tables, and the whole
    ``manifest.json`` folded under them."""
    out = ['<section id="provenance"><h2>Configuration and provenance</h2>']
    if not manifest:
        out.append('<p class="unavailable">manifest.json is absent or unreadable.</p></section>')
        return "\n".join(out)
    for key, title in (("config", "Configuration"), ("model", "Model"), ("data", "Data"), ("versions", "Versions")):
        value = manifest.get(key)
        if isinstance(value, Mapping) and value:
            out.append(f"<h3>{esc(title)}</h3><div class=\"wide\">{value_table(value)}</div>")
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str)
    out.append(f"<details><summary>manifest.json</summary><pre>{esc(text)}</pre></details></section>")
    return "\n".join(out)


def readout_summary(tables: RunTables) -> str:
    """The lens readout of the run's prompt at its last position: per layer, the top prediction
    through the Jacobian lens and through the logit lens, with their probabilities (nothing
    when the run has no readout)."""
    df = tables.table("readout")
    if df is None or df.empty:
        return ""
    last = df[(df["rank"] == 0) & (df["position"] == df["position"].max())]
    wide = {kind: last[last["lens"] == kind].set_index("layer") for kind in ("jacobian", "logit")}
    rows = "".join(
        f"<tr><td class=\"num\">{int(layer)}</td>"
        + "".join(f"<td><code>{esc(repr(wide[k].at[layer, 'prediction']))}</code></td>"
                  f"<td class=\"num\">{wide[k].at[layer, 'prob']:.3f}</td>" for k in ("jacobian", "logit"))
        + "</tr>" for layer in sorted(wide["jacobian"].index))
    prompt, token = str(df["prompt"].iloc[0]), str(last["input_token"].iloc[0])
    return (f'<h3 id="readout">Lens readout</h3><p>The prompt <code>{esc(repr(prompt))}</code> read at its last '
            f"position (<code>{esc(repr(token))}</code>): the most likely next token at each layer through the "
            "Jacobian lens and through the logit lens (the whole table: <code>tables/readout.parquet</code>).</p>"
            "<table><thead><tr><th>layer</th><th>Jacobian lens</th><th>p</th><th>logit lens</th><th>p</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>")



def interventions_summary(tables: RunTables) -> str:
    """Ablation (most critical heads), the clamp chain (its dimensions and three conditions) and
    the contest (whether each family is required), each when its stage ran."""
    out = []
    ablation = tables.table("ablation")
    if ablation is not None and {"criticality", "method"} <= set(ablation.columns) and len(ablation):
        cols = [c for c in ("layer", "head", "method", "criticality", "criticality_lo", "criticality_hi", "ce_clean",
                            "n_tokens") if c in ablation.columns]
        top = ablation.sort_values("criticality", ascending=False)[cols].head(8)
        out.append("<h3>Most critical heads (ablation ΔCE, nats per token)</h3>" + df_table(top))
        if "n_chunks" in ablation.columns and (ablation["n_chunks"] < 2).any():
            out.append('<p class="notrun" id="ablation-one-chunk">Measured on one held-out chunk: the '
                       "criticality has no interval (a bootstrap over one chunk has no spread); pass "
                       "--heldout-chunks 2 or more for one.</p>")
    interventions = tables.json("interventions")
    chain = interventions.get("clamp_chain") if isinstance(interventions, Mapping) else None
    if isinstance(chain, Mapping):
        if chain.get("tested") is False:
            out.append(f"<h3>Clamp chain</h3><p>Not tested: {esc(chain.get('reason', ''))}</p>")
        else:
            rows = [("supported", chain.get("supported")), ("clamped dims", chain.get("all_dims")),
                    ("from layer", chain.get("from_layer")), ("chunks", chain.get("n_chunks"))]
            for name, cond in (chain.get("conditions") or {}).items():
                if isinstance(cond, Mapping):
                    rows.append((f"{name}: held", cond.get("held")))
                    rows.extend((f"{name}: {k}", v) for k, v in cond.items() if k != "held")
            out.append(f"<h3>Clamp chain ({section_links('§A7')})</h3>" + value_table(dict(rows)))
    contest = tables.table("contest")
    if contest is not None and {"target", "features", "required"} <= set(contest.columns):
        drop = contest[contest["features"].astype(str).str.startswith("all-")]
        cols = [c for c in ("target", "features", "metric", "delta", "delta_lo", "delta_hi", "required")
                if c in drop.columns]
        if len(drop):
            out.append("<h3>Contest: is each family required? (score of all four minus score without it)</h3>"
                       + df_table(drop[cols]))
    return "\n".join(out)



def census_summary(tables: RunTables) -> str:
    """The checkpoints of the census (status, loss, funnel, coupling, roles), the onsets per
    head group, and where heads sit in each series when there are several."""
    from .onsets import head_onsets
    from .census_figures import norm_placement
    from .statistics.census import pooled

    census = tables.table("census")
    if census is None:
        return f'<p class="unavailable">Census not available ({esc(tables.why_missing("census"))}).</p>'
    cols = [c for c in ("series", "replicate", "checkpoint", "step", "status", "loss", "erank_full_depth",
                        "funnel_step0_over", "coupling_significant", "n_routing", "n_sink", "max_prev_token_score",
                        "max_induction_score", "error") if c in census.columns]
    out = ["<h3>Checkpoints</h3>" + df_table(census[cols])]
    heads = tables.table("census_heads")
    if heads is not None and len(heads):
        onsets = head_onsets(pooled(tables, "census_heads"))
        if len(onsets):
            summary = onsets.groupby("group").agg(
                heads=("head", "size"), formed=("formation_step", "count"),
                median_formation_step=("formation_step", "median"), consolidated=("consolidation_step", "count"),
                median_consolidation_step=("consolidation_step", "median"), median_lag=("lag", "median")).reset_index()
            out.append("<h3>Onsets per head group (primary series and its replicates)</h3>" + df_table(summary))
        if heads["series"].nunique() > 1:
            out.append("<h3>Where heads and reserve sit, per series (last checkpoint)</h3>"
                       + df_table(norm_placement(heads, census)))
    return "\n".join(out)



def _code_spans(text: str) -> str:
    """Escaped ``text`` with its markdown `code` spans as ``<code>``."""
    return section_links(re.sub(r"`([^`]*)`", r"<code>\1</code>", esc(text)))



def tables_html(stages: tuple[str, ...], tables: RunTables) -> str:
    """One section per table of ``stages``: what a row is, its size, a link to its page of
    ``RUN/docs/`` and a ``<details>`` glossary of its columns (the run's own columns in their
    order when the table exists, else every described column), so the report stays
    self-contained."""
    out = ["<h3>Tables</h3>"]
    for stage in stages:
        for name, described in COLUMNS.get(stage, {}).items():
            df = tables.table(name)
            if df is None:
                size, cols = f"not available ({tables.why_missing(name)})", list(described)
            else:
                size, cols = f"{len(df)} rows × {len(df.columns)} columns", [str(c) for c in df.columns]
            rows = "".join(
                f"<tr><td><code>{esc(c)}</code></td><td>{_code_spans(described[c].definition)}</td>"
                f"<td>{_code_spans(described[c].unit)}</td></tr>" if c in described
                else f"<tr><td><code>{esc(c)}</code></td><td colspan=\"2\"><i>not described</i></td></tr>"
                for c in cols)
            out.append(
                f'<div class="tableref" id="table-{esc(name)}"><h4><code>tables/{esc(name)}.parquet</code></h4>'
                f"<p>{esc(TABLES.get(name, ''))} <small>{esc(size)}; stage {esc(stage)}; "
                f'<a href="{DOCS}/{esc(stage)}.md#{esc(name)}">column reference</a></small></p>'
                f"<details><summary>Column glossary of {esc(name)}</summary><table><thead><tr><th>column</th>"
                f"<th>definition</th><th>unit / exactness</th></tr></thead><tbody>{rows}</tbody></table>"
                "</details></div>")
    return "\n".join(out)



def df_table(df) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            value = v.item() if hasattr(v, "item") else v
            cls = ' class="num"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
            cells.append(f"<td{cls}>{esc(num(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    # a wide table scrolls inside its own box, so the page never needs sideways scrolling
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
