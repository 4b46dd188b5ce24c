"""The top of the report: the run's facts from its manifest (model, text, preset, sizes, seed,
date, depthlens version), the smoke-run banner of a ``quick`` run, and the table of contents."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .verdicts_html import esc, num

__all__ = ["SMOKE_PRESETS", "header_html", "is_smoke", "smoke_banner", "toc_html"]

#: Presets whose sizes are for checking that a run works end to end, not for measuring.
SMOKE_PRESETS = ("quick",)


def _section(manifest: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = manifest.get(key)
    return value if isinstance(value, Mapping) else {}


def is_smoke(manifest: Mapping[str, Any]) -> bool:
    """Whether the run was made with a smoke preset (:data:`SMOKE_PRESETS`)."""
    return _section(manifest, "config").get("preset") in SMOKE_PRESETS


def _sizes(manifest: Mapping[str, Any]) -> list[str]:
    """The run's sizes: chunks × sequence length, then the main size of each stage that ran."""
    config, ran = _section(manifest, "config"), set(_section(manifest, "stages"))
    shape = _section(manifest, "data").get("shape")
    chunks = config.get("chunks", shape[0] if isinstance(shape, list) and shape else None)
    seq_len = config.get("seq_len", shape[1] if isinstance(shape, list) and len(shape) > 1 else None)
    out = [f"{num(chunks)} chunks × {num(seq_len)} tokens"] if chunks is not None or seq_len is not None else []

    def opt(stage: str, key: str) -> Any:
        return _section(config, stage).get(key, config.get(key))

    parts = {
        "attention": f"attention: {num(opt('attention', 'null_samples'))} nulls on {num(opt('attention', 'null_chunks'))} "
                     f"chunks, probe {num(opt('attention', 'probe_seqs'))} × {num(opt('attention', 'probe_len'))}",
        "ablate": f"ablate: {num(opt('ablate', 'heldout_chunks'))} held-out chunks",
        "clamp": f"clamp: {num(opt('clamp', 'clamp_chunks'))} chunks",
        "contest": f"contest: {num(opt('contest', 'contest_folds'))} folds, {num(opt('contest', 'contest_perm'))} "
                   "permutations",
        "jacobian": f"jacobian: {_rank(opt('jacobian', 'funnel_rank'))}, {num(opt('jacobian', 'init_seeds'))} "
                    "step-0 seeds",
        "topology": f"topology: {num(opt('topology', 'n_perm'))} permutations",
        "lens": f"lens: {num(opt('lens', 'lens_chunks'))} chunks",
    }
    return out + [text for stage, text in parts.items() if stage in ran and "—" not in text]


def _rank(rank: Any) -> str:
    """The funnel's truncation in words (0: the exact products only)."""
    return "exact funnel products" if rank == 0 else f"funnel rank {num(rank)}"


def _date(created: Any) -> str:
    """``2026-12-07 20:43 UTC`` from an ISO time stamp (as it is when not one)."""
    text = str(created or "")
    if len(text) >= 16 and text[10] == "T":
        return f"{text[:10]} {text[11:16]}" + (" UTC" if text.endswith(("+00:00", "Z")) else "")
    return text


def header_html(manifest: Mapping[str, Any]) -> str:
    """The run's facts as two short lines under the title: what was analysed and how (model,
    text, preset, seed, date, depthlens version, config hash), then its sizes."""
    if not manifest:
        return '<p class="meta">manifest.json is absent or unreadable</p>'
    config, model = _section(manifest, "config"), _section(manifest, "model")
    source = _section(manifest, "source")
    name = model.get("name") or config.get("model")
    revision = model.get("revision") or config.get("revision")
    how = ", ".join(str(v) for v in (model.get("family"), model.get("dtype") or config.get("dtype"),
                                     model.get("device") or config.get("device")) if v)
    version = (_section(manifest, "versions").get("depthlens") or source.get("version") or "")
    commit = str(source.get("commit") or "")[:7]
    if commit:
        version = f"{version} ({commit}{', modified' if source.get('dirty') else ''})"
    facts = [("model", f"{name}{'@' + str(revision) if revision else ''}{f' ({how})' if how else ''}"),
             ("text", config.get("text") or _section(manifest, "data").get("source")),
             ("preset", config.get("preset")), ("seed", manifest.get("seed", config.get("seed"))),
             ("date", _date(manifest.get("created"))), ("depthlens", version),
             ("config", manifest.get("config_hash"))]
    first = " · ".join(f"<b>{esc(k)}</b> {esc(v)}" for k, v in facts if v not in (None, ""))
    sizes = " · ".join(esc(s) for s in _sizes(manifest))
    return (f'<p class="meta" id="facts">{first}</p>'
            + (f'<p class="meta" id="sizes"><b>sizes</b> {sizes}</p>' if sizes else ""))


def smoke_banner(manifest: Mapping[str, Any]) -> str:
    """The banner of a smoke run (nothing for any other preset)."""
    if not is_smoke(manifest):
        return ""
    preset = _section(manifest, "config").get("preset")
    return ('<div class="smoke" id="smoke"><b>Smoke run: verdicts at these sizes are not measurements.</b> '
            f"The {esc(preset)} preset checks that every stage runs end to end; run the default preset for "
            "verdicts.</div>")


def toc_html(entries: Iterable[tuple[str, str, list[tuple[str, str]]]]) -> str:
    """The table of contents: per entry (anchor, title, sub-entries of (anchor, title)) a link,
    its sub-entries in columns under it."""
    items = []
    for anchor, title, subs in entries:
        inner = "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for a, t in subs)
        items.append(f'<li><a href="#{esc(anchor)}">{esc(title)}</a>'
                     + (f'<ol class="toc-sub">{inner}</ol>' if inner else "") + "</li>")
    return f'<nav id="toc"><h2>Contents</h2><ol class="toc">{"".join(items)}</ol></nav>'
