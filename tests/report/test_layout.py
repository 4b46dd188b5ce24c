"""The report's layout in headless Chromium at 1280 × 800, for a run of the quick preset: the
verdict table on the first screen, the first figure within three, no element wider than its box,
no raw TeX or Python dict in the visible text, and the smoke-run banner and marks.

Chromium loads a copy of the report with one script added that measures the page after it has
loaded and writes its findings into the page as JSON; ``--dump-dom`` returns the page (no
remote debugging, no playwright)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from depthlens.report import render_report

from . import CHROMIUM, build_run, read_json, write_json

pytestmark = pytest.mark.full_leg

WIDTH, HEIGHT = 1280, 800
#: Measures the loaded page and writes the findings into <pre id="layout-check">.
CHECK = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const box = (el) => el.getBoundingClientRect();
  const visible = (el) => el.getClientRects().length > 0 && getComputedStyle(el).visibility !== "hidden";
  const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  // cut short on purpose: an ellipsis, with the whole text in the title
  const clipped = (el) => getComputedStyle(el).textOverflow === "ellipsis" && el.title === el.textContent;
  const overflowing = [];
  for (const el of document.body.querySelectorAll("*")) {
    if (!visible(el) || scrolls(el) || clipped(el) || el.closest("pre, .wide") || el.clientWidth === 0) continue;
    if (el.scrollWidth > el.clientWidth + 1) {
      overflowing.push(el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + "." + el.className + ": " +
                       el.scrollWidth + " > " + el.clientWidth + " " + el.textContent.slice(0, 60));
    }
  }
  const verdicts = document.getElementById("verdicts");
  const figure = document.querySelector("figure img");
  const out = {
    innerHeight: window.innerHeight, innerWidth: window.innerWidth,
    pageWidth: document.documentElement.scrollWidth, pageHeight: document.documentElement.scrollHeight,
    verdictsBottom: verdicts ? box(verdicts).bottom + scrollY : null,
    firstFigureTop: figure ? box(figure).top + scrollY : null,
    overflowing: overflowing, text: document.body.innerText,
    smokeMarks: document.querySelectorAll("#verdicts .smoke-mark").length,
    verdictRows: document.querySelectorAll("#verdicts tbody tr").length,
  };
  const pre = document.createElement("pre");
  pre.id = "layout-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 50));
</script>"""


def layout_check(report: Path, tmp_path: Path) -> dict:
    """The findings of :data:`CHECK` on ``report`` in headless Chromium at WIDTH × HEIGHT.

    Skips the calling test when Chromium is absent."""
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    page = tmp_path / "checked.html"
    text = report.read_text(encoding="utf-8")
    page.write_text(text.replace("</body>", CHECK + "</body>"), encoding="utf-8")
    command = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--disable-background-networking", "--disable-component-update", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
               "--virtual-time-budget=10000", "--dump-dom", page.resolve().as_uri()]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    found = re.search(r'<pre id="layout-check">(.*?)</pre>', dom, re.S)
    assert found, "the check script wrote nothing (Chromium output: " + dom[-300:] + ")"
    return json.loads(html.unescape(found.group(1)))


#: The stages of the checked run: every kind of section (claim figures, figures no claim shows, the
#: head explorer, stages not run) at a third of the drawing time of all of them.
STAGES = ("capture", "attention", "ablate", "topology")


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory) -> Path:
    """The synthetic run of :data:`STAGES` (head explorer included) as a run of the quick
    preset: two chunks, below most claims' minimums, so verdicts are underpowered and marked."""
    run = build_run(tmp_path_factory.mktemp("layout") / "run", chunks=2, stages=STAGES)
    manifest = read_json(run, "manifest")
    manifest["config"]["preset"] = "quick"
    write_json(run, "manifest", manifest)
    return render_report(run)


def test_quick_report_layout_in_chromium(quick_report: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    found = layout_check(quick_report, tmp_path)
    assert time.monotonic() - start < 30
    assert found["innerWidth"] == WIDTH
    screen = HEIGHT  # in page coordinates (headless Chromium's inner height is a little less than its window's)
    assert found["verdictsBottom"] is not None and found["verdictsBottom"] <= screen, found["verdictsBottom"]
    assert found["firstFigureTop"] is not None and found["firstFigureTop"] < 3 * screen, found["firstFigureTop"]
    assert found["pageWidth"] <= WIDTH
    assert found["overflowing"] == []
    text = found["text"]
    assert not re.search(r"[{}]", text), re.findall(r".{30}[{}].{30}", text)[:5]  # TeX groups, dict reprs
    assert not re.search(r"\\[a-zA-Z]+|\$[^$\s]+\$", text)  # TeX commands or math
    assert "Smoke run: verdicts at these sizes are not measurements" in text
    assert found["smokeMarks"] == found["verdictRows"] > 0


def test_default_report_has_no_smoke_marks(tmp_path: Path) -> None:
    """Only a smoke preset gets the banner and the marks."""
    text = render_report(build_run(tmp_path / "run", stages=("attention",), explorer=False)).read_text(encoding="utf-8")
    assert 'id="smoke"' not in text and 'class="smoke-mark"' not in text and 'id="verdicts"' in text
