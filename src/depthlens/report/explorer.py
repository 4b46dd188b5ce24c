"""The report's head explorer: one interactive figure of every head of the trained model.

A grid of layers × heads coloured by role or by the excess reserve ``Δ_TR``; hovering over a
head (or clicking it, which keeps it; the arrow keys move it) shows its ε-pseudospectrum
(contours of ``log10 σ_min(zI − B)`` at ε = 1e-3, 1e-2, 1e-1 over a grey map, the eigenvalues
of ``B`` as dots, the unit circle dashed) and its transient ``‖B^k‖`` against ``k``, both on the
head's median chunk, with the head's numbers from the ``heads`` table.

Data: ``arrays/head_spectra.safetensors`` (written by the attention stage,
:func:`depthlens.stages.attention._explorer_phase`) and ``tables/heads.parquet``, read only
(nothing is recomputed). They go into the page as one JSON block, quantised to what the
drawing needs: ``log10 σ_min`` as one byte per grid point over [−4, 0.5] (steps of 0.018
decades, finer than the contour interpolation can show), the eigenvalues as one byte over
[0, 1] (the diagonal of ``B`` lies there), the transient to 4 significant digits. For
SmolLM2-135M (270 heads, 41 × 41 grids, n = 128) that is about 0.75 MB. The drawing is
hand-written JavaScript on ``<canvas>`` (no library, nothing fetched): the page stays one
self-contained file that works offline.
"""

from __future__ import annotations

import base64
import html
import json
import math
from typing import Any

import numpy as np
import pandas as pd

from .canvas import ROLE_COLOURS
from ..runs.tables import RunTables

__all__ = ["ARRAYS", "LOG_RANGE", "explorer_data", "explorer_html"]

#: The array file the explorer draws (:data:`depthlens.schema.ARRAYS`).
ARRAYS = "head_spectra"
#: ``log10 σ_min`` range of the one-byte codes (the grey scale of the pseudospectra figure);
#: code 255 marks a missing value.
LOG_RANGE = (-4.0, 0.5)
#: Range of the eigenvalue codes: B's eigenvalues are the self-attention weights ``A_ii`` (and 0).
EIG_RANGE = (0.0, 1.0)
#: Contour levels, ``log10 ε`` (as the pseudospectra figure's), and their colours.
LEVELS = (-3, -2, -1)
LEVEL_COLOURS = ("#08519c", "#3182bd", "#9ecae1")
#: Columns of the ``heads`` table shown per head (those the run has).
COLUMNS = ("role", "delta_TR1", "null_q", "kreiss_B", "peak_B", "peak_k", "sink_mass", "prev_token_score",
           "induction_score")
_MISSING = 255

CAPTION = ("Every head of the trained model (layers down, heads across), coloured by role or by the excess reserve "
           "Δ_TR (blue above its matched null, red below). Hover over a head, or click it to keep it (the arrow keys "
           "then move it), for its ε-pseudospectrum, contours of σ_min(zI − B) at ε = 1e-3, 1e-2, 1e-1 over log10 "
           "σ_min in grey (41 × 41 points of [−1.5, 1.5]²), the eigenvalues of B as dots and the unit circle dashed, "
           "and its transient ‖B^k‖ against k (log–log, k = 1 … 16 then to 128; 1 dashed, K(B) dotted), both on the "
           "head's median chunk. Run.head(layer, head, chunk) recomputes any head on any chunk in full.")

CSS = """
#head-explorer .hx-body{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
#head-explorer canvas{border:1px solid #d0d7de;background:#fff}
#head-explorer #hx-grid{cursor:pointer}
#head-explorer #hx-panel{min-width:300px}
#head-explorer #hx-title{font-weight:600;margin:.2em 0}
#head-explorer .hx-legend span.sw{display:inline-block;width:.9em;height:.9em;margin:0 .25em 0 .6em;
vertical-align:middle;border:1px solid #8c959f}
#head-explorer table{font-size:.82em}
"""

JS = r"""
(function () {
  "use strict";
  var root = document.getElementById("head-explorer");
  var D = JSON.parse(document.getElementById("hx-data").textContent);
  function bytes(b64) {
    var s = atob(b64), a = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) a[i] = s.charCodeAt(i);
    return a;
  }
  var SIG = bytes(D.sigma), EIG = bytes(D.eig);
  var L = D.layers, H = D.heads, G = D.grid.n, N = D.n, MISSING = 255;
  var LO = D.logRange[0], STEP = (D.logRange[1] - D.logRange[0]) / 254;
  var E0 = D.eigRange[0], ESTEP = (D.eigRange[1] - D.eigRange[0]) / 254;
  var X0 = D.grid.x0, DX = D.grid.dx, XN = X0 + (G - 1) * DX;
  var grid = document.getElementById("hx-grid"), select = document.getElementById("hx-colour");
  var panel = document.getElementById("hx-panel"), title = document.getElementById("hx-title");
  var legend = document.getElementById("hx-legend"), values = document.getElementById("hx-values");
  var dpr = window.devicePixelRatio || 1;
  var CW = D.cell[0], CH = D.cell[1], MX = D.margin[0], MY = D.margin[1];
  var GW = MX + H * CW + 4, GH = MY + L * CH + 4;
  var col = D.columns;
  var pinned = null, shown = null;

  function setup(canvas, w, h) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = w + "px";
    canvas.style.height = h + "px";
    var c = canvas.getContext("2d");
    c.setTransform(dpr, 0, 0, dpr, 0, 0);
    return c;
  }
  var gctx = setup(grid, GW, GH);
  var PS = 300, TW = 300, TH = 220;
  var pctx = setup(document.getElementById("hx-pseudo"), PS, PS);
  var tctx = setup(document.getElementById("hx-transient"), TW, TH);

  function value(name, i) { var v = col[name]; return v ? v[i] : null; }
  function finite(v) { return typeof v === "number" && isFinite(v); }
  function fmt(v) {
    if (v === null || v === undefined) return "\u2014";
    if (typeof v !== "number") return String(v);
    if (!isFinite(v)) return v > 0 ? "+\u221e" : "\u2212\u221e";
    var a = Math.abs(v);
    return (a !== 0 && (a < 1e-3 || a >= 1e4)) ? v.toExponential(3) : String(Number(v.toPrecision(4)));
  }
  var deltaMax = 0;
  for (var i = 0; i < L * H; i++) {
    var d = value("delta_TR1", i);
    if (finite(d)) deltaMax = Math.max(deltaMax, Math.abs(d));
  }
  if (!(deltaMax > 0)) deltaMax = 1;
  function mix(a, b, t) {
    return "rgb(" + [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * t); }).join(",") + ")";
  }
  function deltaColour(v) {
    if (!finite(v)) return "#eaeef2";
    var t = Math.max(-1, Math.min(1, v / deltaMax));
    return mix([255, 255, 255], t > 0 ? [33, 102, 172] : [178, 24, 43], Math.abs(t));
  }
  function roleColour(r) { return D.roleColours[r] || "#ff7f0e"; }
  function colour(i) {
    return select.value === "delta" ? deltaColour(value("delta_TR1", i)) : roleColour(value("role", i));
  }

  function drawLegend() {
    while (legend.firstChild) legend.removeChild(legend.firstChild);
    function item(c, text) {
      var s = document.createElement("span");
      s.className = "sw";
      s.style.background = c;
      legend.appendChild(s);
      legend.appendChild(document.createTextNode(text));
    }
    if (select.value === "delta") {
      item(deltaColour(-deltaMax), "\u0394_TR \u2264 " + fmt(-deltaMax));
      item(deltaColour(0), "0");
      item(deltaColour(deltaMax), "\u2265 " + fmt(deltaMax));
      item(deltaColour(null), "missing");
    } else {
      var counts = {};
      for (var i = 0; i < L * H; i++) {
        var r = value("role", i);
        r = r === null ? "unknown" : String(r);
        counts[r] = (counts[r] || 0) + 1;
      }
      Object.keys(counts).sort().forEach(function (r) { item(roleColour(r), r + " (" + counts[r] + ")"); });
    }
  }

  function drawGrid() {
    var c = gctx;
    c.clearRect(0, 0, GW, GH);
    c.font = "10px system-ui, sans-serif";
    c.fillStyle = "#57606a";
    c.textAlign = "center";
    c.textBaseline = "bottom";
    var hstep = Math.max(1, Math.ceil(16 / CW));
    for (var h = 0; h < H; h += hstep) c.fillText(String(h), MX + h * CW + CW / 2, MY - 3);
    c.textAlign = "right";
    c.textBaseline = "middle";
    var lstep = Math.max(1, Math.ceil(12 / CH));
    for (var l = 0; l < L; l += lstep) c.fillText(String(l), MX - 4, MY + l * CH + CH / 2);
    for (var i = 0; i < L * H; i++) {
      c.fillStyle = colour(i);
      c.fillRect(MX + (i % H) * CW, MY + Math.floor(i / H) * CH, CW - 1, CH - 1);
    }
    function outline(i, style, width) {
      if (i === null) return;
      c.strokeStyle = style;
      c.lineWidth = width;
      c.strokeRect(MX + (i % H) * CW - 0.5, MY + Math.floor(i / H) * CH - 0.5, CW, CH);
    }
    outline(shown, "#57606a", 1.5);
    outline(pinned, "#000", 2);
    drawLegend();
  }

  function cellAt(ev) {
    var r = grid.getBoundingClientRect();
    var x = (ev.clientX - r.left) * GW / r.width - MX, y = (ev.clientY - r.top) * GH / r.height - MY;
    var h = Math.floor(x / CW), l = Math.floor(y / CH);
    return (h >= 0 && h < H && l >= 0 && l < L) ? l * H + h : null;
  }

  function sigmaAt(base, r, c) {
    var code = SIG[base + r * G + c];
    return code === MISSING ? NaN : LO + code * STEP;
  }

  function drawPseudo(i) {
    var c = pctx, left = 36, top = 8, W = PS - left - 10;
    var w0 = X0 - DX / 2, w1 = XN + DX / 2, scale = W / (w1 - w0);
    function px(x) { return left + (x - w0) * scale; }
    function py(y) { return top + (w1 - y) * scale; }
    c.clearRect(0, 0, PS, PS);
    var base = i * G * G, have = 0;
    var off = document.createElement("canvas");
    off.width = G;
    off.height = G;
    var octx = off.getContext("2d"), img = octx.createImageData(G, G);
    for (var r = 0; r < G; r++) {
      for (var k = 0; k < G; k++) {
        var v = sigmaAt(base, r, k), p = ((G - 1 - r) * G + k) * 4;
        var g = isNaN(v) ? 255 : Math.round(255 * (Math.min(Math.max(v, LO), LO + 254 * STEP) - LO) / (254 * STEP));
        if (!isNaN(v)) have++;
        img.data[p] = img.data[p + 1] = img.data[p + 2] = isNaN(v) ? 240 : g;
        img.data[p + 3] = 255;
      }
    }
    octx.putImageData(img, 0, 0);
    c.imageSmoothingEnabled = true;
    c.drawImage(off, left, top, W, W);
    c.strokeStyle = "#8c959f";
    c.lineWidth = 1;
    c.strokeRect(left, top, W, W);
    var segments = 0;
    if (have) {
      D.levels.forEach(function (t, li) {
        c.strokeStyle = D.levelColours[li];
        c.lineWidth = 1.4;
        c.beginPath();
        for (var r = 0; r < G - 1; r++) {
          for (var k = 0; k < G - 1; k++) {
            var a = sigmaAt(base, r, k), b = sigmaAt(base, r, k + 1);
            var e = sigmaAt(base, r + 1, k + 1), d = sigmaAt(base, r + 1, k);
            if (isNaN(a) || isNaN(b) || isNaN(e) || isNaN(d)) continue;
            var idx = (a > t ? 1 : 0) | (b > t ? 2 : 0) | (e > t ? 4 : 0) | (d > t ? 8 : 0);
            if (idx === 0 || idx === 15) continue;
            var P = [[k + (t - a) / (b - a), r], [k + 1, r + (t - b) / (e - b)],
                     [k + (t - d) / (e - d), r + 1], [k, r + (t - a) / (d - a)]];
            var centre = (a + b + e + d) / 4 > t;
            var pairs = {1: [[3, 0]], 2: [[0, 1]], 3: [[3, 1]], 4: [[1, 2]], 6: [[0, 2]], 7: [[3, 2]],
                         8: [[2, 3]], 9: [[0, 2]], 11: [[1, 2]], 12: [[1, 3]], 13: [[0, 1]], 14: [[0, 3]],
                         5: centre ? [[0, 1], [2, 3]] : [[3, 0], [1, 2]],
                         10: centre ? [[3, 0], [1, 2]] : [[0, 1], [2, 3]]}[idx];
            pairs.forEach(function (s) {
              var p = P[s[0]], q = P[s[1]];
              c.moveTo(px(X0 + p[0] * DX), py(X0 + p[1] * DX));
              c.lineTo(px(X0 + q[0] * DX), py(X0 + q[1] * DX));
              segments++;
            });
          }
        }
        c.stroke();
      });
    }
    c.save();
    c.beginPath();
    c.rect(left, top, W, W);
    c.clip();
    c.setLineDash([4, 3]);
    c.strokeStyle = "#24292f";
    c.lineWidth = 1;
    c.beginPath();
    c.arc(px(0), py(0), scale, 0, 2 * Math.PI);
    c.stroke();
    c.setLineDash([]);
    c.fillStyle = roleColour(value("role", i));
    c.strokeStyle = "#fff";
    for (var j = 0; j < N; j++) {
      var code = EIG[i * N + j];
      if (code === MISSING) continue;
      c.beginPath();
      c.arc(px(E0 + code * ESTEP), py(0), 2.5, 0, 2 * Math.PI);
      c.fill();
      c.stroke();
    }
    c.restore();
    c.fillStyle = "#57606a";
    c.font = "10px system-ui, sans-serif";
    c.textAlign = "center";
    c.textBaseline = "top";
    [-1, 0, 1].forEach(function (x) {
      c.fillText(String(x), px(x), top + W + 3);
    });
    c.fillText("Re z", left + W / 2, top + W + 14);
    c.textAlign = "right";
    c.textBaseline = "middle";
    [-1, 0, 1].forEach(function (y) { c.fillText(String(y), left - 4, py(y)); });
    c.save();
    c.translate(10, top + W / 2);
    c.rotate(-Math.PI / 2);
    c.textAlign = "center";
    c.fillText("Im z", 0, 0);
    c.restore();
    if (!have) {
      c.fillStyle = "#cf222e";
      c.textAlign = "center";
      c.fillText("no grid for this head", left + W / 2, top + W / 2);
    }
    return segments;
  }

  function drawTransient(i) {
    var c = tctx, left = 46, right = 10, top = 10, bottom = 30;
    var W = TW - left - right, Hh = TH - top - bottom;
    c.clearRect(0, 0, TW, TH);
    var ks = D.powers, ys = D.transient[i] || [], K = value("kreiss_B", i);
    var lo = Infinity, hi = 0, kmax = ks[ks.length - 1], peak = -1, kpeak = null;
    ys.forEach(function (v, j) {
      if (finite(v) && v > 0) {
        lo = Math.min(lo, Math.log10(v));
        hi = Math.max(hi, Math.log10(v));
        if (v > peak) { peak = v; kpeak = ks[j]; }
      }
    });
    if (finite(K) && K > 0) hi = Math.max(hi, Math.log10(K));
    if (!isFinite(lo)) lo = -1;
    lo = Math.floor(Math.max(lo, hi - 12));
    hi = Math.ceil(hi);
    if (hi - lo < 1) hi = lo + 1;
    var room = 16 / Hh;  // 16 px above the highest curve or line, for the labels drawn above them
    var top_ = Math.max(Math.log10(Math.max(peak, 1e-300)), finite(K) && K > 0 ? Math.log10(K) : -Infinity, 0);
    if ((hi - top_) / (hi - lo) < room) hi = (top_ - room * lo) / (1 - room);
    function px(k) { return left + Math.log10(k) / Math.log10(kmax) * W; }
    function py(v) { return top + (hi - Math.log10(v)) / (hi - lo) * Hh; }
    c.strokeStyle = "#d0d7de";
    c.lineWidth = 1;
    c.strokeRect(left, top, W, Hh);
    c.fillStyle = "#57606a";
    c.font = "10px system-ui, sans-serif";
    c.textAlign = "right";
    c.textBaseline = "middle";
    var dstep = Math.max(1, Math.ceil((hi - lo) / 6));
    for (var e = lo; e <= Math.floor(hi); e += dstep) {
      c.fillText("1e" + e, left - 4, py(Math.pow(10, e)));
      c.beginPath();
      c.moveTo(left, py(Math.pow(10, e)));
      c.lineTo(left + W, py(Math.pow(10, e)));
      c.stroke();
    }
    c.textAlign = "center";
    c.textBaseline = "top";
    [1, 10, 100].forEach(function (k) {
      if (k <= kmax) c.fillText(String(k), px(k), top + Hh + 3);
    });
    c.fillText("k (power)", left + W / 2, top + Hh + 15);
    c.save();
    c.translate(10, top + Hh / 2);
    c.rotate(-Math.PI / 2);
    c.fillText("\u2016B\u1d4f\u2016", 0, -4);
    c.restore();
    c.save();
    c.beginPath();
    c.rect(left, top, W, Hh);
    c.clip();
    function hline(v, style, dash, label, below) {
      if (!(finite(v) && v > 0)) return;
      c.strokeStyle = style;
      c.setLineDash(dash);
      c.beginPath();
      c.moveTo(left, py(v));
      c.lineTo(left + W, py(v));
      c.stroke();
      c.setLineDash([]);
      c.fillStyle = style;
      c.textAlign = "right";
      c.textBaseline = below ? "top" : "bottom";
      c.fillText(label, left + W - 2, py(v) + (below ? 2 : -1));
    }
    // "1" under its line, "K(B)" over its own: apart even when K(B) is close to 1
    hline(1, "#57606a", [4, 3], "1", true);
    hline(K, "#bc4c00", [1, 2], "K(B)", false);
    c.strokeStyle = "#0969da";
    c.lineWidth = 1.6;
    c.beginPath();
    var points = 0, pen = false;
    ys.forEach(function (v, j) {
      if (!(finite(v) && v > 0)) { pen = false; return; }
      if (pen) c.lineTo(px(ks[j]), py(v)); else c.moveTo(px(ks[j]), py(v));
      pen = true;
      points++;
    });
    c.stroke();
    if (kpeak !== null) {
      c.fillStyle = "#cf222e";
      c.beginPath();
      c.arc(px(kpeak), py(peak), 3.5, 0, 2 * Math.PI);
      c.fill();
      // the note above the peak, left of the K(B) label when it is on the same line
      var note = "max " + fmt(peak) + " at k = " + kpeak, nw = c.measureText(note).width;
      var kw = finite(K) && K > 0 && Math.abs(py(K) - py(peak)) < 14 ? c.measureText("K(B)").width + 8 : 0;
      c.textAlign = "left";
      c.textBaseline = "bottom";
      c.fillText(note, Math.max(left + 2, Math.min(px(kpeak) + 5, left + W - nw - kw - 2)), Math.max(py(peak) - 3, top + 12));
    }
    c.restore();
    if (!points) {
      c.fillStyle = "#cf222e";
      c.textAlign = "center";
      c.fillText("no transient for this head", left + W / 2, top + Hh / 2);
    }
    return points;
  }

  function show(i) {
    shown = i;
    var l = Math.floor(i / H), h = i % H;
    panel.dataset.layer = String(l);
    panel.dataset.head = String(h);
    var role = value("role", i);
    title.textContent = "Layer " + l + ", head " + h + (role === null ? "" : " \u2014 " + role) +
      " (median chunk " + D.chunk[i] + ")";
    panel.dataset.segments = String(drawPseudo(i));
    panel.dataset.points = String(drawTransient(i));
    while (values.firstChild) values.removeChild(values.firstChild);
    D.shown.forEach(function (pair) {
      if (!col[pair[0]]) return;
      var tr = document.createElement("tr"), th = document.createElement("th"), td = document.createElement("td");
      th.textContent = pair[1];
      td.textContent = fmt(value(pair[0], i));
      td.className = "num";
      tr.appendChild(th);
      tr.appendChild(td);
      values.appendChild(tr);
    });
    drawGrid();
  }

  grid.addEventListener("mousemove", function (ev) {
    var i = cellAt(ev);
    if (i !== null && i !== shown) show(i);
  });
  grid.addEventListener("mouseleave", function () { if (pinned !== null && pinned !== shown) show(pinned); });
  grid.addEventListener("click", function (ev) {
    var i = cellAt(ev);
    if (i === null) return;
    pinned = i;
    show(i);
    panel.dataset.pinned = "1";
  });
  grid.addEventListener("keydown", function (ev) {
    var moves = {ArrowLeft: -1, ArrowRight: 1, ArrowUp: -H, ArrowDown: H};
    if (!(ev.key in moves)) return;
    var i = (pinned === null ? 0 : pinned) + moves[ev.key];
    if (i < 0 || i >= L * H) return;
    ev.preventDefault();
    pinned = i;
    show(i);
  });
  select.addEventListener("change", drawGrid);
  pinned = D.start;
  show(D.start);
  root.dataset.ready = "1";
})();
"""

_SHOWN = (("role", "role"), ("delta_TR1", "Δ_TR (excess reserve)"), ("null_q", "q (BH)"),
          ("kreiss_B", "K(B), median over chunks"), ("peak_B", "max ‖Bᵏ‖, median over chunks"),
          ("peak_k", "its k"), ("sink_mass", "sink mass"), ("prev_token_score", "previous-token score"),
          ("induction_score", "induction score"))


def _codes(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``values`` as one byte each over ``[lo, hi]`` (0 … 254, clipped), 255 where not finite."""
    out = np.full(values.shape, _MISSING, dtype=np.uint8)
    ok = np.isfinite(values)
    out[ok] = np.clip(np.rint((values[ok] - lo) / (hi - lo) * 254), 0, 254).astype(np.uint8)
    return out


def _json_value(v: Any) -> Any:
    """A JSON-safe scalar: None for missing or non-finite, Python numbers, strings as they are."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return float(f"{f:.6g}") if math.isfinite(f) else None
    if isinstance(v, (np.integer, int)) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return None if pd.isna(v) else str(v)


def explorer_data(tables: RunTables) -> tuple[dict[str, Any] | None, str]:
    """The explorer's data of a run, or None with the one-line reason it has none.

    Returns
    -------
    (dict or None, str)
        The JSON-ready data (``layers``, ``heads``, ``grid``, ``sigma`` and ``eig`` as base64
        bytes, ``powers``, ``transient``, ``chunk``, ``columns`` of the heads table, drawing
        settings) and ``""``; or None and why.
    """
    loaded = tables.arrays(ARRAYS)
    if loaded is None:
        return None, tables.why_missing(f"arrays/{ARRAYS}")
    arrays, _ = loaded
    missing = [k for k in ("x", "y", "sigma", "transient", "eig", "powers", "chunk") if k not in arrays]
    if missing:
        return None, f"arrays/{ARRAYS}.safetensors lacks {missing[0]!r}"
    x, y = np.asarray(arrays["x"], float), np.asarray(arrays["y"], float)
    sigma = np.asarray(arrays["sigma"], float)
    if sigma.ndim != 4 or sigma.shape[2:] != (y.size, x.size) or x.size < 2 or not np.array_equal(x, y):
        return None, f"arrays/{ARRAYS}.safetensors has sigma of shape {sigma.shape} on axes of {x.size} and {y.size}"
    step = np.diff(x)
    if not np.allclose(step, step[0], rtol=1e-9, atol=0):
        return None, f"arrays/{ARRAYS}.safetensors has a grid that is not uniform"
    n_layers, n_heads = sigma.shape[:2]
    logs = np.log10(np.where(sigma > 0, sigma, 1e-300))
    logs[~np.isfinite(sigma)] = np.nan
    eig = np.real(np.asarray(arrays["eig"])).astype(float)
    transient = np.asarray(arrays["transient"], float)
    heads = tables.trained("heads")
    columns: dict[str, list[Any]] = {}
    if heads is not None and {"layer", "head"} <= set(heads.columns):
        index = heads.set_index(["layer", "head"])
        index = index[~index.index.duplicated()]
        keys = pd.MultiIndex.from_product([range(n_layers), range(n_heads)], names=["layer", "head"])
        for name in COLUMNS:
            if name in index.columns:
                columns[name] = [_json_value(v) for v in index[name].reindex(keys).tolist()]
    delta = np.array([np.nan if v is None else v for v in columns.get("delta_TR1", [None] * n_layers * n_heads)],
                     dtype=float)
    start = int(np.nanargmax(delta)) if np.isfinite(delta).any() else 0
    cell = (max(10, min(40, 520 // n_heads)), max(6, min(22, 480 // n_layers)))
    data = {
        "layers": int(n_layers), "heads": int(n_heads), "n": int(eig.shape[-1]),
        "grid": {"x0": float(x[0]), "dx": float(step[0]), "n": int(x.size)},
        "logRange": list(LOG_RANGE), "eigRange": list(EIG_RANGE), "levels": list(LEVELS),
        "levelColours": list(LEVEL_COLOURS), "roleColours": dict(ROLE_COLOURS),
        "sigma": base64.b64encode(_codes(logs, *LOG_RANGE).tobytes()).decode("ascii"),
        "eig": base64.b64encode(_codes(eig, *EIG_RANGE).tobytes()).decode("ascii"),
        "powers": [int(k) for k in np.asarray(arrays["powers"]).tolist()],
        "transient": [[float(f"{v:.4g}") if math.isfinite(v) else None for v in row]
                      for row in transient.reshape(n_layers * n_heads, -1).tolist()],
        "chunk": [int(c) for c in np.asarray(arrays["chunk"]).reshape(-1).tolist()],
        "columns": columns, "shown": [list(pair) for pair in _SHOWN],
        "cell": list(cell), "margin": [30, 16], "start": start,
    }
    return data, ""


def _script_json(data: dict[str, Any]) -> str:
    """``data`` as JSON that is safe inside ``<script>``: ``<``, ``>`` and ``&`` escaped as
    ``\\u003c`` …, so no string of a run (a role, a model name) can close the element."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def explorer_html(tables: RunTables) -> str:
    """The head explorer's ``<figure id="head-explorer">`` (with its data and script), or one
    line saying why the run has none."""
    data, why = explorer_data(tables)
    if data is None:
        return (f'<p class="unavailable" id="head-explorer">Head explorer: not available — '
                f"{html.escape(why, quote=True)}.</p>")
    return (
        '<figure id="head-explorer" class="explorer">'
        f"<style>{CSS}</style>"
        '<div class="hx-controls"><label>Colour by <select id="hx-colour">'
        '<option value="role">role</option><option value="delta">Δ_TR (excess reserve)</option></select></label>'
        ' <span id="hx-legend" class="hx-legend"></span></div>'
        '<div class="hx-body"><canvas id="hx-grid" tabindex="0" aria-label="heads, layers down, heads across">'
        "</canvas>"
        '<div id="hx-panel" data-layer="" data-head="" data-segments="0" data-points="0">'
        '<p id="hx-title">Hover over or click a head.</p>'
        '<canvas id="hx-pseudo" aria-label="pseudospectrum of the head"></canvas><br>'
        '<canvas id="hx-transient" aria-label="transient of the head"></canvas>'
        '<table><tbody id="hx-values"></tbody></table></div></div>'
        "<noscript><p class=\"unavailable\">The head explorer needs JavaScript.</p></noscript>"
        f"<figcaption><b>Head explorer.</b> {html.escape(CAPTION, quote=True)}</figcaption>"
        f'<script type="application/json" id="hx-data">{_script_json(data)}</script>'
        f'<script id="hx-code">{JS}</script>'
        "</figure>"
    )
