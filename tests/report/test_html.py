"""The HTML report: claims first, escaping, embedded images, stages not run, and a headless
Chromium check that the page renders without errors."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from depthlens.errors import RunError
from depthlens.report import load_claims, render_report
from depthlens.report.figures import FIGURES

from . import IMAGE_WIDTHS, MALICIOUS, build_run, drop_stage, in_chromium, read_json, set_stage, write_json

# The full leg only: rendering and claims read tables, which no thread count or BLAS kernel changes.
pytestmark = pytest.mark.full_leg

IMG = re.compile(r"<img\b[^>]*>", re.I)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str]:
    """A full synthetic run with a malicious model name and role string, rendered once; its
    clamp chain is not tested (a model without massive activations), so every badge shows."""
    run = build_run(tmp_path_factory.mktemp("html") / "run", model=MALICIOUS)
    write_json(run, "interventions", {"clamp_chain": {"tested": False, "reason": MALICIOUS}})
    summary = read_json(run, "attention")
    summary["roles"][MALICIOUS] = 1
    write_json(run, "attention", summary)
    path = render_report(run)
    return path, path.read_text(encoding="utf-8")


def test_report_written_with_claims_json(report):
    path, text = report
    assert path.name == "report.html" and text.startswith("<!DOCTYPE html>")
    claims = json.loads((path.parent / "claims.json").read_text())
    assert len(claims["results"]) == len(load_claims())
    for r in claims["results"]:
        assert f'<section class="claim" id="claim-{r["id"]}">' in text
    assert not list(path.parent.glob(".*.tmp"))



def test_each_claim_links_its_section_of_the_methods_page(report):
    from depthlens.report.methods_page import anchors, claim_anchor

    path, text = report
    claims = json.loads((path.parent / "claims.json").read_text())
    written = anchors((path.parent / "docs" / "methods.md").read_text(encoding="utf-8"))
    for r in claims["results"]:
        assert r["methods"] == f"docs/methods.md#{claim_anchor(r['id'])}" and r["methods"].split("#")[1] in written
        assert f'href="{r["methods"]}"' in text

def test_page_order(report):
    """Header facts, the verdict table, the contents, one section per claim (figure first, prose
    folded), the figures no claim shows, the numbers-only sections, provenance last."""
    _, text = report
    body = text[text.index("<body>"):]
    assert body[body.index("<table"):].startswith('<table class="glance" id="verdicts"')  # verdicts at a glance
    order = ['id="facts"', 'id="sizes"', 'id="verdicts"', 'id="toc"', 'id="claims"', 'id="figures"', 'id="part-a"',
             'id="part-b"', 'id="numbers"', 'id="health"', 'id="stages"', 'id="numbers-a"', 'id="provenance"']
    positions = [body.index(anchor) for anchor in order]
    assert positions == sorted(positions)
    assert body.index('id="toc"') < body.index("<img") < body.index('id="figures"')
    for section in re.findall(r'<section class="claim" id="claim-[^"]+">.*?</section>', body, re.S):
        figure = min(i for i in (section.find("<figure"), section.find('class="seefig"'),
                                 section.find('class="unavailable"')) if i >= 0)
        assert figure < section.index('<details class="claim-prose">')
    assert re.findall(r'href="#claim-([^"]+)"', body[body.index('id="toc"'):body.index('id="claims"')]) == \
        [r["id"] for r in read_json(Path(report[0]).parent, "claims")["results"]]
    assert 'class="verdict" style="background:#1a7f37">supported' in body
    assert ">not tested (needs a model with massive activations)</span>" in body  # every badge says what it needs
    assert ">not tested</span>" not in body
    assert "<b>model</b> " + html_escaped(MALICIOUS) in body and "<b>seed</b> 0" in body
    assert "10 chunks × 16 tokens" in body and 'id="smoke"' not in body and "smoke run" not in body


def test_run_text_is_escaped(report):
    _, text = report
    assert MALICIOUS not in text
    # the one script is the head explorer's (its data a JSON block): none comes from the run
    assert re.findall(r"<script\b[^>]*>", text, re.I) == ['<script type="application/json" id="hx-data">',
                                                          '<script id="hx-code">']
    assert html_escaped(MALICIOUS) in text
    assert text.count(html_escaped(MALICIOUS)) >= 4  # title, heading, summary, provenance


def html_escaped(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def test_every_image_is_an_embedded_png(report):
    _, text = report
    tags = IMG.findall(text)
    assert len(tags) == len(FIGURES)
    for tag in tags:
        src = re.search(r'src="([^"]*)"', tag).group(1)
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    for spec in FIGURES:
        assert f'id="fig-{spec.name}"' in text
        assert spec.caption.split(".")[0].replace("'", "&#x27;") in text


def test_self_contained(report):
    path, text = report
    # the only links that leave the page are the relative ones to the column reference
    # pages written beside the report (RUN/docs/), and each of those exists
    assert not re.search(r"""(?:src|href)\s*=\s*(?!["']?(?:data:|#|docs/[a-z]+\.md#))""", text, re.I)
    for target in set(re.findall(r'href="(docs/[a-z]+\.md)#', text)):
        assert (path.parent / target).is_file()
    assert "<link" not in text.lower() and "@import" not in text and "url(" not in text
    assert "http://" not in text and "https://" not in text


def test_provenance_is_last(report):
    _, text = report
    prov = text.index('id="provenance"')
    assert "config_hash" in text[prov:] and "0123456789abcdef" in text[prov:]
    assert text.index('id="part-b"') < prov


def test_stage_not_run_and_failed(tmp_path):
    run = build_run(tmp_path / "run", pseudospectra=False)
    drop_stage(run, "topology")
    drop_stage(run, "jacobian")
    set_stage(run, "jacobian", "failed")
    text = render_report(run).read_text()
    part_b = text[text.index('id="part-b"'): text.index('id="part-c"')]
    assert "Stage <b>topology</b>" in part_b and "not run" in part_b
    assert "Stage <b>jacobian</b>" in part_b and "failed" in part_b
    b5 = text[text.index('id="claim-B5-coupling-rise"'):]
    assert "Topology–dynamics coupling: not available — stage topology not run" in b5[: b5.index("</section>")]
    part_a = text[text.index('id="part-a"'): text.index('id="part-b"')]
    assert "arrays/pseudospectra.safetensors is absent" in part_a
    assert "arrays/attention_maps.safetensors is absent" in part_a
    # transient reserve, depth products, criticality, clamp dose, contest, the residual profile, the lens
    # readout and the census's four
    assert len(IMG.findall(text)) == 11
    b1b = text[text.index('id="claim-B1b-symmetric-late"'):]
    assert "stage jacobian failed: tables/operators.parquet is absent" in b1b[: b1b.index("</section>")]
    claims = {r["id"]: r["verdict"] for r in json.loads((run / "claims.json").read_text())["results"]}
    assert claims["B5-coupling-rise"] == claims["B6-coupling-init"] == "not tested"


def test_bare_directory_renders(tmp_path):
    text = render_report(tmp_path).read_text()
    assert "manifest.json is absent" in text
    # at a glance and in the full table, each saying what would test it
    assert len(re.findall(r">not tested \(needs [^<]+\)</span>", text)) == 2 * len(load_claims())
    assert "<img" not in text


def test_not_a_directory(tmp_path):
    with pytest.raises(RunError, match="not a run directory"):
        render_report(tmp_path / "absent")


def test_rendering_reads_tables_only(tmp_path):
    """Re-rendering imports no analysis code (nor torch): it cannot recompute anything (the
    head explorer included)."""
    run = build_run(tmp_path / "run", stages=("attention", "topology"))
    light = "('depthlens.models', 'depthlens.models.methods')"  # the lazy package and the ablation methods' names
    code = ("import sys; from depthlens.report import render_report; render_report(sys.argv[1]); "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.split('.')[:2] in "
            "[['depthlens', p] for p in ('attention', 'jacobian', 'topology', 'linalg', 'models')] "
            f"or m.startswith('depthlens.stages.')); print([m for m in bad if m not in {light}])")
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert "hx-code" in (run / "report.html").read_text()


def test_report_in_headless_chromium(report, tmp_path):
    path, _ = report
    shot = tmp_path / "report.png"
    errors, found = in_chromium(path, {"widths": IMAGE_WIDTHS,
                                       "claims_rows": "document.querySelectorAll('section.claim').length",
                                       "first_table": "document.querySelector('table').className",
                                       "scripts": "document.querySelectorAll('script').length"}, screenshot=shot)
    assert errors == []
    assert len(found["widths"]) == len(FIGURES) and all(w > 0 for w in found["widths"])
    assert found["claims_rows"] == len(load_claims()) and found["first_table"] == "glance"
    assert found["scripts"] == 2  # the head explorer's data and code (tests/report/test_explorer.py)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: Per row of the verdicts at a glance: its text cells and its box in the window.
GLANCE_ROWS = ("Array.from(document.querySelectorAll('#verdicts tbody tr')).map(r => {const b = "
               "r.getBoundingClientRect(); return {cells: Array.from(r.cells).map(c => c.innerText.trim()), "
               "bottom: b.bottom, right: b.right, height: b.height};})")
#: The right edge of every verdict badge of the claim sections.
VERDICT_RIGHTS = ("Array.from(document.querySelectorAll('section.claim .verdict')).map(b => "
                  "b.getBoundingClientRect().right)")


@pytest.mark.parametrize("width", [1280, 1400, 1920])
def test_every_verdict_is_on_the_first_screen(report, width):
    """At 1280 × 800 (and wider) the first screen shows every claim's verdict, value and test,
    one line per claim, and nothing of the page needs sideways scrolling (the full table's
    verdict column of the full claims table was once off-screen at 1400 and 1920 px)."""
    path, _ = report
    doc = read_json(path.parent, "claims")
    errors, found = in_chromium(path, {"glance": GLANCE_ROWS, "verdicts": VERDICT_RIGHTS,
                                       "scroll": "document.documentElement.scrollWidth",
                                       "line": "parseFloat(getComputedStyle(document.querySelector("
                                               "'#verdicts td')).lineHeight)"}, viewport=(width, 800))
    assert errors == []
    rows = found["glance"]
    assert [row["cells"][0] for row in rows] == [r["id"] for r in doc["results"]]
    for row, result in zip(rows, doc["results"]):
        assert row["bottom"] <= 800 and row["right"] <= width, row
        assert row["height"] < 2 * found["line"], row  # one line
        assert row["cells"][1].startswith(result["verdict"]) and row["cells"][3] == result["criterion"]
        assert row["cells"][2].startswith(result["value_text"] or "—")
    assert found["scroll"] <= width and max(found["verdicts"]) <= width


def test_every_table_section_links_its_docs_page_and_has_a_glossary(report):
    from depthlens.report.html import PARTS
    from depthlens.report.docs import pages
    from depthlens.schema import COLUMNS

    path, text = report
    reported = [stage for _, stages, _ in PARTS.values() for stage in stages]
    assert set(COLUMNS) - set(reported) == {"train", "sweep"}  # a training series and a sweep are no runs: no section
    for stage in reported:
        for name in COLUMNS[stage]:
            start = text.index(f'id="table-{name}"')
            section = text[start: text.index("</details>", start)]
            assert f'href="docs/{stage}.md#{name}"' in section
            assert "<details><summary>Column glossary" in section
            present = set(re.findall(r"<td><code>([^<]*)</code></td>", section))
            assert present  # the run's own columns (or every described one when the table is absent)
    # part A holds the attention tables, part B the topology ones
    assert text.index('id="table-heads"') < text.index('id="numbers-b"') < text.index('id="table-coupling"')
    heads = text[text.index('id="table-heads"'):]
    assert "Transient reserve TR1 = log K(B)" in heads[: heads.index("</details>")]
    # the pages written beside the report are the generated ones
    for name, page in pages().items():
        assert (path.parent / "docs" / name).read_text(encoding="utf-8") == page
