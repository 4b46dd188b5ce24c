"""The cross-model report: ``depthlens compare RUN_DIR... --out DIR``.

Every claim of the seed is made across models, while each run directory has its own report.
:func:`render_comparison` puts runs side by side in ``OUT/compare.html`` (self-contained:
figures embedded as PNG, no scripts, no external resources) and ``OUT/compare.json`` (the
same, machine-readable), each written atomically. The page shows, in order:

1. the runs: label, model, revision, text, seed, layers, the stages done and not done (from
   the manifest) and the status;
2. every claim's verdict per model in one table (rows: claims; columns: models), a verdict
   badge and the value, the reason on hover (``title``); each run is scored with its own
   registered claims file (:func:`~depthlens.report.claims.run_claims_path`), as ``depthlens
   report`` scores it, and a claim that a run's file lacks shows "—";
3. the sensitivity of each verdict: per claim and model, every variant's value and verdict,
   and whether the decisive verdict is fragile (:func:`~depthlens.report.claims.fragile`);
4. the key profiles of every run overlaid on a normalised depth axis
   (:mod:`depthlens.report.compare_figures`).

A model that failed (``failed``: label → one-line error, as a sweep passes the cells it could
not load or analyse) is marked with a ``failed`` badge and its error in every table; it has
no data unless one of ``runs`` (a partial run) carries its label. Rendering reads manifests,
tables and summaries only: nothing is recomputed and nothing is written into the runs.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import InputError, RunError
from ..runs import check_run_directory, read_manifest
from ..runs.atomic import write_bytes, write_json
from .canvas import DPI, Skip
from .claims import claims_hash, evaluate, load_claims, run_claims_path
from .compare_figures import PROFILES, ProfileSpec, build_profiles, draw_profile, model_colours
from .html import CSS, figure_html
from .verdicts_html import FRAGILE_BADGE, esc, status_badge, verdict_badge
from ..runs.tables import RunTables

__all__ = ["COMPARE_HTML", "COMPARE_JSON", "FORMAT", "default_labels", "render_comparison"]

COMPARE_HTML = "compare.html"
COMPARE_JSON = "compare.json"
#: The marker of ``compare.json``: an OUT folder holding it may be rewritten.
FORMAT = "depthlens-compare"
FORMAT_VERSION = 1
#: What a claim result of each run keeps in ``compare.json``.
_RESULT_KEYS = ("verdict", "value", "value_text", "reason", "criterion", "underpowered", "sample", "fragile",
                "sensitivity")
_HEX = re.compile(r"[0-9a-f]{16,}")
_COMPARE_CSS = CSS + """
table.verdicts td:first-child,table.sensitivity td:first-child{max-width:26em}
td.cell{white-space:nowrap}td.cell small{white-space:normal}
th .error,td .error{color:#cf222e;font-weight:normal;white-space:normal}
"""


@dataclass
class _Model:
    """One column of the comparison: a run (``tables``), a failed model (``error``), or both."""

    label: str
    root: Path | None = None
    error: str | None = None
    tables: RunTables | None = None
    claims_file: Path | None = None
    results: list[dict[str, Any]] = field(default_factory=list)


def render_comparison(runs: Sequence[str | Path], out: str | Path, *, labels: Sequence[str] | None = None,
                      failed: Mapping[str, str] | None = None) -> Path:
    """Write the cross-model report of ``runs`` to ``OUT/compare.html`` and ``OUT/compare.json``.

    Parameters
    ----------
    runs : sequence of str or Path
        Run directories (each with a ``manifest.json``), one column each, in this order.
    out : str or Path
        The output folder: absent, empty or holding a previous comparison (which is
        rewritten); created when absent.
    labels : sequence of str, optional
        One distinct, non-empty label per run; default :func:`default_labels`.
    failed : mapping of str to str, optional
        Label → one-line error of models that failed. A label of ``labels`` marks that
        (partial) run failed; any other label is a further column with no data. Either way
        the model is marked failed, with its error, in every table.

    Returns
    -------
    Path
        The path of ``compare.html``.

    Raises
    ------
    InputError
        One line, before anything is written: no run and no failed model; a run that is
        missing or not a depthlens run directory (a folder of another tool, as ``depthlens
        report`` refuses it); labels that are not one distinct non-empty string
        per run; an ``out`` that is a file or holds anything but a previous comparison; a
        run's claims file that is malformed.
    """
    roots = [Path(r) for r in runs]
    failed = {str(k): " ".join(str(v).split()) for k, v in (failed or {}).items()}
    if not roots and not failed:
        raise InputError("nothing to compare; pass at least one run directory.")
    manifests = [_manifest(root) for root in roots]
    names = _check_labels(list(labels) if labels is not None else default_labels(roots, manifests), len(roots),
                          failed)
    target = Path(out)
    _check_out(target)
    models = [_Model(label, root, failed.get(label), RunTables(root)) for label, root in zip(names, roots)]
    models += [_Model(label, error=error) for label, error in failed.items() if label not in names]
    for model in models:
        if model.tables is not None:
            model.claims_file = run_claims_path(model.root)
            model.results = evaluate(load_claims(model.claims_file), model.tables)
    infos = [_run_info(m) for m in models]
    claims = _claim_rows(models)
    points, missing = build_profiles({m.label: m.tables for m in models if m.tables is not None})
    for m in models:
        if m.tables is None:
            for reasons in missing.values():
                reasons[m.label] = f"failed: {m.error}"
    colours = model_colours([m.label for m in models])
    figures = {spec.name: _figure_png(spec, points, colours) for spec in PROFILES}
    write_json(target / COMPARE_JSON, _document(infos, claims, points, missing, figures))
    page = _page(models, infos, claims, missing, figures)
    write_bytes(target / COMPARE_HTML, page.encode("utf-8"))
    return target / COMPARE_HTML


# ---------------------------------------------------------------------------------------
# inputs
def _manifest(root: Path) -> dict[str, Any]:
    """The manifest of the run directory ``root``, or one line saying why it is not one
    (:func:`depthlens.runs.check_run_directory`, as ``depthlens report`` refuses it)."""
    try:
        check_run_directory(root)
        manifest = read_manifest(root)
    except RunError as exc:
        raise InputError(str(exc)) from None
    if not isinstance(manifest, dict):
        raise InputError(f"{root / 'manifest.json'} is not a JSON object; the run directory is damaged.")
    return manifest


def default_labels(roots: Sequence[Path], manifests: Sequence[Mapping[str, Any]]) -> list[str]:
    """A short distinct label per run: the model's name (a path shortened to its last part,
    hex digests to 8 digits) and ``@revision`` when it has one; labels that coincide get the
    run directory's name, then a number.

    Examples
    --------
    >>> default_labels([Path("a"), Path("b")], [{"model": {"name": "smollm2-135m"}},
    ...                                         {"config": {"model": "org/m", "revision": "step1"}}])
    ['smollm2-135m', 'org/m@step1']
    """
    base = [_model_label(root, manifest) for root, manifest in zip(roots, manifests)]
    counts = Counter(base)
    named = [label if counts[label] == 1 else f"{label} ({root.name})" for label, root in zip(base, roots)]
    counts, seen = Counter(named), Counter[str]()
    out = []
    for label in named:
        seen[label] += 1
        out.append(label if counts[label] == 1 else f"{label} #{seen[label]}")
    return out


def _model_label(root: Path, manifest: Mapping[str, Any]) -> str:
    model = manifest.get("model") if isinstance(manifest.get("model"), Mapping) else {}
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    name = str(model.get("name") or config.get("model") or root.resolve().name)
    scheme, colon, rest = name.partition(":") if re.match(r"^[a-z]+:[/~.]", name) else ("", "", name)
    if rest.startswith(("/", "~", "./", "../")):  # a file-system path: its last part
        rest = Path(rest).name or rest
    short = _HEX.sub(lambda m: m.group()[:8], f"{scheme}{colon}{rest}")
    revision = model.get("revision") or config.get("revision")
    return f"{short}@{revision}" if revision else short


def _check_labels(labels: list[str], n_runs: int, failed: Mapping[str, str]) -> list[str]:
    if len(labels) != n_runs:
        raise InputError(f"{len(labels)} labels for {n_runs} run directories; give one label per run.")
    labels = [str(label).strip() for label in labels]
    for label in [*labels, *failed]:
        if not label:
            raise InputError("a label is empty; give every model a non-empty label.")
    twice = [label for label, n in Counter(labels).items() if n > 1]
    if twice:
        raise InputError(f"label {twice[0]!r} is given to two runs; give each run its own label.")
    return labels


def _check_out(out: Path) -> None:
    """Refuse an output folder that is a file or holds anything but a previous comparison."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; pass a folder for the comparison.")
    if out.is_dir() and any(out.iterdir()) and not _is_comparison(out):
        raise InputError(f"--out {out} holds files that are not a previous comparison (no {COMPARE_JSON} of "
                         "depthlens compare); nothing was written, choose another --out.")


def _is_comparison(out: Path) -> bool:
    try:
        doc = json.loads((out / COMPARE_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


# ---------------------------------------------------------------------------------------
# what the report shows
def _run_info(m: _Model) -> dict[str, Any]:
    """A run's row of the runs table (and of ``compare.json``)."""
    info: dict[str, Any] = {"label": m.label, "run_dir": None if m.root is None else str(m.root), "model": None,
                            "revision": None, "text": None, "seed": None, "layers": None, "stages": {},
                            "status": "failed", "error": m.error, "claims_file": None, "claims_hash": None}
    if m.tables is None:
        return info
    manifest = m.tables.manifest
    model = manifest.get("model") if isinstance(manifest.get("model"), Mapping) else {}
    config = manifest.get("config") if isinstance(manifest.get("config"), Mapping) else {}
    stages = {str(s): m.tables.stage_status(str(s)) for s in (manifest.get("stages") or {})}
    done = bool(stages) and all(status == "done" for status in stages.values())
    data = manifest.get("data") if isinstance(manifest.get("data"), Mapping) else {}
    info.update(model=model.get("name") or config.get("model"),
                revision=model.get("revision") or config.get("revision"),
                text=config.get("text") or data.get("source"), seed=manifest.get("seed", config.get("seed")),
                layers=_n_layers(m.tables), stages=stages,
                status="failed" if m.error is not None else "done" if done else "incomplete",
                claims_file=m.claims_file.name, claims_hash=claims_hash(m.claims_file))
    return info


def _n_layers(t: RunTables) -> int | None:
    """The model's layer count as its tables record it (None when no table has layers)."""
    for name in ("heads", "operators", "attention_summary"):
        df = t.trained(name)
        if df is not None and "layer" in df.columns and len(df):
            return int(df["layer"].max()) + 1
    return None


def _claim_rows(models: Sequence[_Model]) -> list[dict[str, Any]]:
    """One row per claim id (in the order the runs' claims files list them), with each run's
    result under ``verdicts[label]``."""
    rows: dict[str, dict[str, Any]] = {}
    for m in models:
        for r in m.results:
            row = rows.setdefault(r["id"], {"id": r["id"], "prediction": r["prediction"], "statistic": r["statistic"],
                                            "criterion": r["criterion"], "source": r["source"], "verdicts": {}})
            row["verdicts"][m.label] = {k: r[k] for k in _RESULT_KEYS}
    return list(rows.values())


def _figure_png(spec: ProfileSpec, points: pd.DataFrame, colours: Mapping[str, str]) -> tuple[bytes | None, str]:
    """The profile's figure as PNG bytes, or None and why (a drawing failure is also warned)."""
    try:
        fig = draw_profile(spec, points, colours)
    except Skip as exc:
        return None, str(exc)
    except Exception as exc:  # a figure must never take the report down
        warnings.warn(f"figure {spec.name} failed: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return None, f"drawing failed ({type(exc).__name__}: {exc})"
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue(), ""


def _document(infos: list[dict[str, Any]], claims: list[dict[str, Any]], points: pd.DataFrame,
              missing: Mapping[str, Mapping[str, str]], figures: Mapping[str, tuple[bytes | None, str]]
              ) -> dict[str, Any]:
    """``compare.json``: the runs, each claim's result per run (with its sensitivity), and the
    profiles (which runs each leaves out and why, and every point drawn)."""
    profiles = {spec.name: {"title": spec.title, "drawn": figures[spec.name][0] is not None,
                            "why": figures[spec.name][1], "left_out": dict(missing[spec.name]),
                            "points": points.loc[points["profile"] == spec.name,
                                                 ["run", "series", "position", "depth", "value"]].to_dict("records")}
                for spec in PROFILES}
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "runs": infos,
            "claims": claims, "profiles": profiles}


# ---------------------------------------------------------------------------------------
# the page
def _page(models: Sequence[_Model], infos: list[dict[str, Any]], claims: list[dict[str, Any]],
          missing: Mapping[str, Mapping[str, str]], figures: Mapping[str, tuple[bytes | None, str]]) -> str:
    title = f"depthlens comparison: {', '.join(m.label for m in models)}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title>",
        f"<style>{_COMPARE_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">{len(models)} models; each run scored with its own registered claims file, from its '
        "tables (nothing recomputed).</p>",
        _runs_section(models, infos),
        _verdicts_section(models, claims),
        _sensitivity_section(models, claims),
        _profiles_section(missing, figures),
        "</body></html>",
    ]) + "\n"


def _model_header(m: _Model) -> str:
    """A model's column heading: its label, and the failed badge with its error."""
    mark = f"<br>{status_badge('failed')}<br><small class=\"error\">{esc(m.error)}</small>" if m.error else ""
    return f"<th>{esc(m.label)}{mark}</th>"


def _failed_cell(m: _Model) -> str:
    return f'<td class="cell" title="{esc(m.error)}">{status_badge("failed")}</td>'


def _runs_section(models: Sequence[_Model], infos: list[dict[str, Any]]) -> str:
    rows = []
    for m, info in zip(models, infos):
        done = [s for s, status in info["stages"].items() if status == "done"]
        other = [f"{s} ({status})" for s, status in info["stages"].items() if status != "done"]
        status = status_badge(info["status"])
        if m.error:
            status += f'<br><small class="error">{esc(m.error)}</small>'
        cells = [info["model"], info["revision"], info["text"], info["seed"], info["layers"]]
        rows.append(f"<tr><td><b>{esc(m.label)}</b></td>"
                    + "".join(f"<td>{'—' if v in (None, '') else esc(v)}</td>" for v in cells)
                    + f"<td>{esc(', '.join(done)) or '—'}</td><td>{esc(', '.join(other)) or '—'}</td>"
                    f"<td>{status}</td><td><small>{esc(info['run_dir'] or '—')}</small></td></tr>")
    return ('<section id="runs"><h2>Runs</h2><table id="runs-table"><thead><tr><th>label</th><th>model</th>'
            "<th>revision</th><th>text</th><th>seed</th><th>layers</th><th>stages done</th><th>stages not done</th>"
            "<th>status</th><th>run directory</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")


def _verdicts_section(models: Sequence[_Model], claims: list[dict[str, Any]]) -> str:
    rows = []
    for row in claims:
        cells = "".join(_verdict_cell(row, m) for m in models)
        rows.append(f"<tr><td><b>{esc(row['id'])}</b><br><small>{esc(row['prediction'])}</small><br>"
                    f"<small>test: <code>{esc(row['statistic'])}</code> {esc(row['criterion'])}</small></td>"
                    f"{cells}</tr>")
    return ('<section id="verdicts"><h2>Pre-registered claims, per model</h2>'
            '<table class="verdicts" id="verdict-table"><thead><tr><th>claim</th>'
            + "".join(_model_header(m) for m in models) + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            '<p class="meta">Each cell: the verdict and the statistic\'s value; hover for the reason (for <i>not '
            "tested</i>: which input is missing). — = the claim is not in that run's claims file; a threshold "
            "under a value differs from the claim's first one. <i>fragile</i>: a decisive verdict that changes "
            "under one of the claim's sensitivity variants (next section).</p></section>")


def _claim_cell(m: _Model, result: Mapping[str, Any] | None, body: str) -> str:
    """Model ``m``'s cell of a claim row: the failed badge for a model that failed, "—" when
    it has no ``result`` (the claim is not in its claims file), else ``body`` with the
    result's reason on hover."""
    if m.tables is None:
        return _failed_cell(m)
    if result is None:
        return '<td class="cell" title="not in this run\'s claims file">—</td>'
    return f'<td class="cell" title="{esc(result["reason"])}">{body}</td>'


def _verdict_cell(row: Mapping[str, Any], m: _Model) -> str:
    r = row["verdicts"].get(m.label)
    if r is None:
        return _claim_cell(m, None, "")
    other = f"<br><small>{esc(r['criterion'])}</small>" if r["criterion"] != row["criterion"] else ""
    fragile = f"<br>{FRAGILE_BADGE}" if r["fragile"] else ""
    return _claim_cell(m, r, f"{verdict_badge(r)}<br>{esc(r['value_text'])}{other}{fragile}")


def _sensitivity_section(models: Sequence[_Model], claims: list[dict[str, Any]]) -> str:
    rows = []
    for row in claims:
        names = list(dict.fromkeys(v["name"] for r in row["verdicts"].values() for v in r["sensitivity"]))
        if not names:
            continue
        own = "".join(_own_cell(row, m) for m in models)
        rows.append(f'<tr><td rowspan="{len(names) + 1}"><b>{esc(row["id"])}</b></td><td>the claim\'s own test'
                    f"</td>{own}</tr>")
        for name in names:
            rows.append(f"<tr><td>{esc(name)}</td>" + "".join(_variant_cell(row, m, name) for m in models) + "</tr>")
    if not rows:
        return '<section id="sensitivity"><h2>Sensitivity</h2><p>No claim declares sensitivity variants.</p></section>'
    return ('<section id="sensitivity"><h2>Sensitivity of each verdict</h2>'
            '<table class="sensitivity" id="sensitivity-table"><thead><tr><th>claim</th><th>variant</th>'
            + "".join(_model_header(m) for m in models) + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            '<p class="meta">Each claim\'s verdict, then the same test on each sensitivity variant (value → '
            "verdict; hover for the reason). <i>fragile</i>: the decisive verdict changes under a variant that "
            "could be computed; <i>stable</i>: it changes under none.</p></section>")


def _own_cell(row: Mapping[str, Any], m: _Model) -> str:
    r = row["verdicts"].get(m.label)
    if r is None:
        return _claim_cell(m, None, "")
    decisive = r["verdict"] in ("supported", "falsified")
    mark = f"<br>{FRAGILE_BADGE}" if r["fragile"] else "<br><small>stable</small>" if decisive else ""
    return _claim_cell(m, r, f"{verdict_badge(r)}{mark}")


def _variant_cell(row: Mapping[str, Any], m: _Model, name: str) -> str:
    r = row["verdicts"].get(m.label) or {}
    v = next((v for v in r.get("sensitivity", ()) if v["name"] == name), None)
    return _claim_cell(m, v, "" if v is None else f"{esc(v['value_text'])} → {verdict_badge(v)}")


def _profiles_section(missing: Mapping[str, Mapping[str, str]], figures: Mapping[str, tuple[bytes | None, str]]
                      ) -> str:
    out = ['<section id="profiles"><h2>Profiles against normalised depth</h2><p>The trained rows of every run on '
           "one depth axis, 0 = first layer (or sub-layer step, or product), 1 = last, one colour per model.</p>"]
    for spec in PROFILES:
        png, why = figures[spec.name]
        left = missing[spec.name]
        caption = spec.caption
        if png is not None and left:
            caption += " Left out: " + "; ".join(f"{label} ({reason})" for label, reason in left.items()) + "."
        elif png is None and left:
            why = f"{why}: " + "; ".join(f"{label}: {reason}" for label, reason in left.items())
        out.append(figure_html(f"profile-{spec.name}", spec.title, caption, png, why))
    out.append("</section>")
    return "\n".join(out)
