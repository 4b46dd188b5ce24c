"""The run report: one self-contained HTML file, ``RUN/report.html``.

Order: the pre-registered claims table first (id, prediction, statistic value, criterion,
verdict), then the stages, part A (attention), part B (residual stream: Jacobians, funnel,
topology), each figure with its caption, and last the run's configuration and provenance
(manifest). Images are embedded as base64 ``data:`` URIs; the file has no scripts and no
external resources. Every string that comes from a run or a model is escaped with
:func:`html.escape`. Rendering reads tables, summaries and arrays only: no analysis is
recomputed (claims and figures are re-derived from the tables each time).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..runs.atomic import write_bytes
from .claims import VERDICTS, claims_hash, default_claims_path, evaluate, load_claims, write_claims_json
from .figures import FIGURES, build_figures
from .tables import STATUS_TEXT, RunTables

REPORT = "report.html"
#: Stages of each report part, in order.
PARTS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "A": ("Part A. The resolvent view of causal attention", ("capture", "attention"),
          "Per-head operators A and their Perron deflations B = A − P, matched shuffle nulls, head "
          "roles and depth products (METHODS A1–A6)."),
    "B": ("Part B. Spectral geometry of the residual stream", ("jacobian", "topology"),
          "Mean sub-layer Jacobians, their spectra, the cumulative funnel with the Schur split, and "
          "the coupling of activation topology to Jacobian amplification (METHODS B1–B6)."),
}
VERDICT_COLOURS = {"supported": "#1a7f37", "falsified": "#cf222e", "inconclusive": "#bf8700",
                   "not tested": "#6e7781"}

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#1f2328;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:2em}
h3{margin-top:1.5em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}
th,td{border:1px solid #d0d7de;padding:.3em .55em;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.verdict{color:#fff;font-weight:600;border-radius:.8em;padding:.1em .6em;white-space:nowrap;display:inline-block}
.meta{color:#57606a;font-size:.9em}
.status{display:inline-block;padding:.15em .6em;border-radius:.3em;font-weight:600;font-size:.85em}
.status-done{background:#dafbe1;color:#1a7f37}.status-notrun{background:#eaeef2;color:#57606a}
.status-failed{background:#ffebe9;color:#cf222e}.status-running{background:#fff8c5;color:#9a6700}
.notrun{background:#f6f8fa;border-left:4px solid #8c959f;padding:.5em .8em;margin:.8em 0}
figure{margin:1.2em 0;border:1px solid #d0d7de;border-radius:.4em;padding:.6em}
figure img{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:.88em;color:#424a53;margin-top:.5em}
.unavailable{color:#6e7781;font-style:italic}
pre{background:#f6f8fa;padding:.8em;overflow:auto;font-size:.8em;max-height:40em}
small{color:#57606a}
table.claims{width:100%}table.claims td:first-child{white-space:nowrap}
table.claims td:nth-child(2){width:42%}table.claims td:nth-child(3){width:24%}
"""


def esc(value: Any) -> str:
    """``html.escape`` of ``str(value)`` (quotes included)."""
    return html.escape(str(value), quote=True)


def render_report(run_dir: str | Path, *, claims_path: str | Path | None = None) -> Path:
    """Evaluate the claims, draw the figures and write ``RUN/report.html`` atomically.

    Also writes ``RUN/claims.json`` and ``RUN/figures/*.png``. Reads tables, summaries and
    arrays only; parts whose stage did not run are marked "not run".

    Parameters
    ----------
    run_dir : str or Path
        The run directory.
    claims_path : str or Path, optional
        A claims TOML file; the packaged ``default_claims.toml`` when omitted.

    Returns
    -------
    Path
        The report's path.

    Raises
    ------
    RunError
        If ``run_dir`` is not a directory.
    InputError
        If the claims file is malformed (see :func:`~depthlens.report.claims.load_claims`).
    """
    root = Path(run_dir)
    if not root.is_dir():
        raise RunError(f"{root} is not a run directory; pass the --out folder of a depthlens run.")
    claims_file = Path(claims_path or default_claims_path())
    claims = load_claims(claims_file)
    tables = RunTables(root)
    results = evaluate(claims, tables)
    write_claims_json(root, results, claims_path=claims_file)
    figures = build_figures(tables)
    page = _page(tables, results, figures, claims_file)
    path = root / REPORT
    write_bytes(path, page.encode("utf-8"))
    return path


# ---------------------------------------------------------------------------------------
def _page(tables: RunTables, results: list[dict], figures: Mapping[str, tuple[Path | None, str]],
          claims_file: Path) -> str:
    manifest = tables.manifest
    model = (manifest.get("model") or {}).get("name") or (manifest.get("config") or {}).get("model") or "unknown model"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>depthlens report: {esc(model)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>depthlens report: {esc(model)}</h1>",
        _meta_line(manifest, claims_file),
        _claims_section(results, claims_file),
        _stages_section(tables),
    ]
    for key, (title, stages, blurb) in PARTS.items():
        parts.append(_part_section(key, title, stages, blurb, tables, figures))
    parts.append(_provenance_section(manifest))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _meta_line(manifest: Mapping[str, Any], claims_file: Path) -> str:
    model = manifest.get("model") or {}
    items = [("revision", model.get("revision") or (manifest.get("config") or {}).get("revision")),
             ("config hash", manifest.get("config_hash")), ("created", manifest.get("created")),
             ("depthlens", (manifest.get("versions") or {}).get("depthlens"))]
    text = " · ".join(f"{esc(k)}: {esc(v)}" for k, v in items if v not in (None, ""))
    if not manifest:
        text = "manifest.json is absent or unreadable"
    return f'<p class="meta">{text}</p>'


def _claims_section(results: list[dict], claims_file: Path) -> str:
    rows = []
    for r in results:
        colour = VERDICT_COLOURS.get(r["verdict"], "#6e7781")
        rows.append(
            "<tr>"
            f"<td><b>{esc(r['id'])}</b></td>"
            f"<td>{esc(r['prediction'])}<br><small>falsified if: {esc(r['falsifier'])}</small><br>"
            f"<small>source: {esc(r['source'])}</small></td>"
            f"<td><code>{esc(r['statistic'])}</code><br><small>{esc(r['statistic_description'])}</small></td>"
            f"<td class=\"num\">{esc(r['value_text'])}</td>"
            f"<td class=\"num\">{esc(r['criterion'])}{_band_text(r)}</td>"
            f"<td><span class=\"verdict\" style=\"background:{colour}\">{esc(r['verdict'])}</span>"
            f"<br><small>{esc(r['reason'])}</small></td>"
            "</tr>"
        )
    counts = ", ".join(f"{sum(r['verdict'] == v for r in results)} {esc(v)}" for v in VERDICTS)
    return (
        '<section id="claims"><h2>Pre-registered claims</h2>'
        '<table class="claims" id="claims-table"><thead><tr><th>id</th><th>prediction</th><th>statistic</th>'
        "<th>value</th><th>threshold</th><th>verdict</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
        f"<p class=\"meta\">{counts}. Claims file {esc(claims_file.name)}, sha256 "
        f"<code>{esc(claims_hash(claims_file))}</code>. Verdicts: <i>not tested</i> = the statistic's "
        "inputs are missing (stage not run); <i>inconclusive</i> = too little data, or a near miss "
        "inside the pre-registered band.</p></section>"
    )


def _band_text(result: Mapping[str, Any]) -> str:
    bands = result.get("inconclusive_band") or []
    if not bands:
        return ""
    text = " ∪ ".join(f"[{_num(lo)}, {_num(hi)}]" for lo, hi in bands)
    return f"<br><small>inconclusive: {esc(text)}</small>"


def _status_badge(status: str) -> str:
    cls = {"done": "done", "failed": "failed", "running": "running"}.get(status, "notrun")
    return f'<span class="status status-{cls}">{esc(STATUS_TEXT.get(status, status))}</span>'


def _stages_section(tables: RunTables) -> str:
    declared = list((tables.manifest.get("stages") or {}).keys())
    known = [s for _, stages, _ in PARTS.values() for s in stages]
    rows = []
    for stage in list(dict.fromkeys(known + declared)):
        info = (tables.manifest.get("stages") or {}).get(stage)
        extra = ""
        if isinstance(info, dict):
            extra = "; ".join(f"{esc(k)}: {esc(v)}" for k, v in info.items() if k != "status")
        rows.append(f"<tr><td>{esc(stage)}</td><td>{_status_badge(tables.stage_status(stage))}</td>"
                    f"<td>{extra}</td></tr>")
    return ('<section id="stages"><h2>Stages</h2><table><thead><tr><th>stage</th><th>status</th>'
            "<th>details</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")


def _part_section(key: str, title: str, stages: tuple[str, ...], blurb: str, tables: RunTables,
                  figures: Mapping[str, tuple[Path | None, str]]) -> str:
    out = [f'<section id="part-{key.lower()}"><h2>{esc(title)}</h2><p>{esc(blurb)}</p>']
    statuses = {s: tables.stage_status(s) for s in stages}
    for stage, status in statuses.items():
        if status != "done":
            out.append(f'<div class="notrun">Stage <b>{esc(stage)}</b>: {_status_badge(status)} — '
                       "the parts of this section that depend on it are marked not available.</div>")
    if key == "A":
        out.append(_attention_summary(tables))
    else:
        out.append(_residual_summary(tables))
    for spec in (s for s in FIGURES if s.part == key):
        path, why = figures.get(spec.name, (None, "not drawn"))
        out.append(_figure_html(spec.name, spec.title, spec.caption, path, why))
    out.append("</section>")
    return "\n".join(out)


def _attention_summary(tables: RunTables) -> str:
    summary = tables.json("attention")
    if summary is None:
        why = esc(tables.why_missing("attention.json"))
        return f'<p class="unavailable">Attention summary not available ({why}).</p>'
    shown = {k: v for k, v in summary.items() if k not in ("options", "eig_gap_final_depth")}
    html_ = "<h3>Attention summary</h3>" + _kv_table(_flatten(shown))
    gaps = summary.get("eig_gap_final_depth")
    if isinstance(gaps, Mapping) and gaps:
        rows = []
        for op, by_source in gaps.items():
            for source, vals in (by_source.items() if isinstance(by_source, Mapping) else []):
                vals = vals if isinstance(vals, Mapping) else {}
                rows.append(f"<tr><td>{esc(op)}</td><td>{esc(source)}</td>"
                            f"<td class=\"num\">{esc(_num(vals.get('median_gap_e1')))}</td>"
                            f"<td class=\"num\">{esc(_num(vals.get('median_gap_e2')))}</td></tr>")
        html_ += ("<h3>Eigenvalue-prediction error at the final depth (median log10 ‖D‖/E)</h3>"
                  "<table><thead><tr><th>operator</th><th>source</th><th>gap E1</th><th>gap E2</th></tr></thead>"
                  "<tbody>" + "".join(rows) + "</tbody></table>")
    heads = tables.table("heads")
    if heads is not None and {"layer", "head", "delta_TR1"} <= set(heads.columns):
        cols = [c for c in ("layer", "head", "role", "sink_mass", "prev_token_score", "induction_score", "TR1",
                            "null_TR1_mean", "delta_TR1", "null_q") if c in heads.columns]
        top = heads.sort_values("delta_TR1", ascending=False, na_position="last")[cols]
        if len(top) > 10:
            html_ += ("<h3>Heads with the largest and smallest excess reserve Δ_TR</h3>"
                      + _df_table(top.head(5)) + _df_table(top.tail(5).iloc[::-1]))
        else:
            html_ += "<h3>Heads by excess reserve Δ_TR</h3>" + _df_table(top)
    return html_


def _residual_summary(tables: RunTables) -> str:
    out = []
    topo = tables.json("topology")
    if topo is not None:
        out.append("<h3>Topology summary</h3>" + _kv_table(_flatten(topo)))
    else:
        why = esc(tables.why_missing("topology.json"))
        out.append(f'<p class="unavailable">Topology summary not available ({why}).</p>')
    ops = tables.table("operators")
    if ops is not None and {"checkpoint", "mode"} <= set(ops.columns):
        cols = [c for c in ("complex_frac", "henrici_update_rel", "symmetry", "erank", "spectral_radius", "cond")
                if c in ops.columns]
        if cols:
            mean = ops.groupby(["checkpoint", "mode"])[cols].median().reset_index()
            out.append("<h3>Operator metrics (median over sub-layers)</h3>" + _df_table(mean))
    return "\n".join(out)


def _figure_html(name: str, title: str, caption: str, path: Path | None, why: str) -> str:
    if path is None:
        return (f'<figure id="fig-{esc(name)}"><p class="unavailable">{esc(title)}: not available — {esc(why)}.</p>'
                f"<figcaption>{esc(caption)}</figcaption></figure>")
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return (f'<figure id="fig-{esc(name)}"><img src="data:image/png;base64,{data}" alt="{esc(title)}">'
            f"<figcaption><b>{esc(title)}.</b> {esc(caption)}</figcaption></figure>")


def _provenance_section(manifest: Mapping[str, Any]) -> str:
    out = ['<section id="provenance"><h2>Configuration and provenance</h2>']
    if not manifest:
        out.append('<p class="unavailable">manifest.json is absent or unreadable.</p></section>')
        return "\n".join(out)
    for key, title in (("config", "Configuration"), ("model", "Model"), ("data", "Data"), ("versions", "Versions")):
        value = manifest.get(key)
        if isinstance(value, Mapping) and value:
            out.append(f"<h3>{esc(title)}</h3>" + _kv_table(_flatten(value)))
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str)
    out.append(f"<h3>manifest.json</h3><pre>{esc(text)}</pre></section>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
def _flatten(d: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            rows.extend(_flatten(v, name + "."))
        else:
            rows.append((name, v))
    return rows


def _num(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "—" if v is None else str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "—"
        if math.isinf(v):
            return "+∞" if v > 0 else "−∞"
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_num(x) for x in v)
    if isinstance(v, Mapping):
        return json.dumps(v, sort_keys=True, default=str)
    return str(v)


def _kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(_num(v))}</td></tr>" for k, v in rows)
    return f"<table><tbody>{body}</tbody></table>"


def _df_table(df) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            value = v.item() if hasattr(v, "item") else v
            cls = ' class="num"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
            cells.append(f"<td{cls}>{esc(_num(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
