"""The report's head explorer: its data read from the run (quantised, escaped), the one line
of a run without it, its size for a SmolLM2-sized model, and in headless Chromium on a
random model's report: no console error, and a click on a head draws that head."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from depthlens.report.explorer import EIG_RANGE, LOG_RANGE, explorer_data, explorer_html
from depthlens.runs.tables import RunTables

from . import MALICIOUS, build_run, in_chromium, read_table, write_head_spectra, write_table

pytestmark = pytest.mark.full_leg  # the full leg only: rendering reads tables, which no kernel changes

#: Click head (layer, head) of the explorer's grid through a real mouse event at its cell's
#: centre, then read the panel: which head it shows and how much it drew.
CLICK = """(() => {{
  const g = document.getElementById('hx-grid'), box = g.getBoundingClientRect();
  const D = JSON.parse(document.getElementById('hx-data').textContent);
  const x = (D.margin[0] + ({head} + 0.5) * D.cell[0]) * box.width / parseFloat(g.style.width);
  const y = (D.margin[1] + ({layer} + 0.5) * D.cell[1]) * box.height / parseFloat(g.style.height);
  g.dispatchEvent(new MouseEvent('click', {{clientX: box.left + x, clientY: box.top + y, bubbles: true}}));
  const p = document.getElementById('hx-panel');
  return {{layer: p.dataset.layer, head: p.dataset.head, segments: +p.dataset.segments, points: +p.dataset.points,
          pinned: p.dataset.pinned, title: document.getElementById('hx-title').textContent,
          rows: document.querySelectorAll('#hx-values tr').length}};
}})()"""


def _decode(data: dict, key: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data[key]), dtype=np.uint8)


def test_data_is_the_runs_arrays_quantised(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run", stages=("attention",))
    tables = RunTables(run)
    data, why = explorer_data(tables)
    assert why == "" and (data["layers"], data["heads"], data["n"], data["grid"]["n"]) == (4, 4, 16, 41)
    arrays, _ = tables.arrays("head_spectra")
    step = (LOG_RANGE[1] - LOG_RANGE[0]) / 254
    logs = LOG_RANGE[0] + _decode(data, "sigma").reshape(arrays["sigma"].shape) * step
    want = np.clip(np.log10(np.maximum(arrays["sigma"], 1e-300)), *LOG_RANGE)
    assert np.abs(logs - want).max() <= step / 2 + 1e-12
    eig = EIG_RANGE[0] + _decode(data, "eig").reshape(arrays["eig"].shape) * (EIG_RANGE[1] - EIG_RANGE[0]) / 254
    assert np.abs(eig - arrays["eig"]).max() <= 0.5 / 254 + 1e-12
    np.testing.assert_allclose(data["transient"], arrays["transient"].reshape(16, -1), rtol=5e-4)
    assert data["powers"] == arrays["powers"].tolist() and data["chunk"] == arrays["chunk"].reshape(-1).tolist()
    heads = read_table(run, "heads").sort_values(["layer", "head"])
    assert data["columns"]["role"] == heads["role"].tolist()
    np.testing.assert_allclose(data["columns"]["delta_TR1"], heads["delta_TR1"], rtol=1e-6)
    assert data["start"] == int(np.argmax(heads["delta_TR1"]))  # the head with the most excess reserve


def test_missing_arrays_leave_one_line(tmp_path: Path) -> None:
    for stages, explorer, why in ((("attention",), False, "arrays/head_spectra.safetensors is absent although "
                                                         "stage attention is done"),
                                  (("topology",), True, "stage attention not run: arrays/head_spectra.safetensors "
                                                        "is absent")):
        run = build_run(tmp_path / f"run-{explorer}", stages=stages, explorer=explorer)
        html = explorer_html(RunTables(run))
        assert html == f'<p class="unavailable" id="head-explorer">Head explorer: not available — {why}.</p>'
    run = tmp_path / "run-True"
    (run / "arrays").mkdir()
    (run / "arrays" / "head_spectra.safetensors").write_bytes(b"not safetensors")
    assert "head_spectra.safetensors is unreadable" in explorer_html(RunTables(run))


def test_run_strings_cannot_leave_the_data_block(tmp_path: Path) -> None:
    run = build_run(tmp_path / "run", stages=("attention",))
    heads = read_table(run, "heads")
    heads.loc[0, "role"] = MALICIOUS + "</script>&"
    write_table(run, "heads", heads)
    html = explorer_html(RunTables(run))
    assert "<script>alert" not in html and "</script>&" not in html and html.count("</script>") == 2
    block = re.search(r'<script type="application/json" id="hx-data">(.*?)</script>', html, re.S).group(1)
    assert json.loads(block)["columns"]["role"][0] == MALICIOUS + "</script>&"


def test_size_and_time_for_a_smollm2_sized_model(tmp_path: Path) -> None:
    """270 heads of n = 128 (SmolLM2-135M: 30 layers × 9 heads): well under 2 MB added and
    fast (quantised bytes in base64, one JSON block)."""
    run = build_run(tmp_path / "run", stages=("attention",), explorer=False)
    write_head_spectra(run, layers=30, heads=9, n=128)
    start = time.perf_counter()
    html = explorer_html(RunTables(run))
    seconds = time.perf_counter() - start
    assert 600_000 < len(html.encode()) < 1_000_000 and seconds < 5.0


@pytest.fixture(scope="module")
def random_report(head_run) -> Path:
    """The report of the tiny random-model attention run (tests/conftest.py)."""
    return head_run.report()


def test_explorer_in_headless_chromium(random_report: Path) -> None:
    """Offline, no console or page error; a click on a head shows that head, draws its
    contours and its transient; the colour selector switches to Δ_TR without error."""
    queries = {"ready": "document.getElementById('head-explorer').dataset.ready",
               "first": "document.getElementById('hx-panel').dataset.layer",
               "click": CLICK.format(layer=1, head=2),
               "again": CLICK.format(layer=0, head=3),
               "delta": "(() => { const s = document.getElementById('hx-colour'); s.value = 'delta'; "
                        "s.dispatchEvent(new Event('change')); "
                        "return document.getElementById('hx-legend').textContent; })()",
               "keys": "(() => { const g = document.getElementById('hx-grid'); g.dispatchEvent(new KeyboardEvent("
                       "'keydown', {key: 'ArrowDown', bubbles: true})); const p = document.getElementById('hx-panel'); "
                       "return [p.dataset.layer, p.dataset.head]; })()"}
    errors, found = in_chromium(random_report, queries)
    assert errors == []
    assert found["ready"] == "1" and found["first"] in ("0", "1")
    click = found["click"]
    assert (click["layer"], click["head"], click["pinned"]) == ("1", "2", "1")
    assert click["title"].startswith("Layer 1, head 2")
    assert click["segments"] > 0 and click["points"] == 28 and click["rows"] >= 5
    assert (found["again"]["layer"], found["again"]["head"]) == ("0", "3") and found["again"]["segments"] > 0
    assert "Δ_TR" in found["delta"]
    assert found["keys"] == ["1", "3"]  # down one layer from the clicked head
