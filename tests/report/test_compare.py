"""The cross-model report (``depthlens compare``): each run's own verdicts in one table, the
sensitivity, failed models marked everywhere, profiles on a normalised depth axis, refusals
that write nothing, the command line, and SmolLM2 against its random initialisation in
headless Chromium."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from depthlens.errors import InputError
from depthlens.report import evaluate, load_claims, render_comparison
from depthlens.report.claims import run_claims_path
from depthlens.report.compare import COMPARE_HTML, COMPARE_JSON, default_labels
from depthlens.report.compare_figures import PROFILES, build_profiles, draw_profile, model_colours, run_profile
from depthlens.report.verdicts_html import esc
from depthlens.runs.tables import RunTables

from . import IMAGE_WIDTHS, MALICIOUS, build_run, in_chromium, need_chromium, read_table, write_table
from .test_html import IMG

BROKEN = MALICIOUS  # a failed model's label and error are escaped like everything else
ERROR = "ModelError: cannot load <weights> of the cell"
FULL, SMALL = "synthetic:tiny", "synthetic:small"


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> dict:
    """A full synthetic run beside a smaller one (attention and jacobian, 2 chunks, 4 layers of
    operators, no cumulative table) and a failed model without a run, rendered once."""
    root = tmp_path_factory.mktemp("compare")
    full = build_run(root / "full")
    small = build_run(root / "small", model=SMALL, stages=("attention", "jacobian"), chunks=2)
    operators = read_table(small, "operators")
    write_table(small, "operators", operators[operators["layer"] < 4])
    (small / "tables" / "cumulative.parquet").unlink()
    before = {p: p.stat().st_mtime_ns for run in (full, small) for p in run.rglob("*")}
    path = render_comparison([full, small], root / "out", failed={BROKEN: ERROR})
    after = {p: p.stat().st_mtime_ns for run in (full, small) for p in run.rglob("*")}
    assert after == before  # nothing written into the runs
    return {"runs": {FULL: full, SMALL: small}, "path": path, "html": path.read_text(encoding="utf-8"),
            "json": json.loads((path.parent / COMPARE_JSON).read_text())}


def _table(html: str, table_id: str) -> str:
    start = html.index(f'id="{table_id}"')
    return html[start: html.index("</table>", start)]


def _rows(html: str, table_id: str) -> list[list[str]]:
    """The cells (``<td ...>...</td>``) of each body row of a table of the page."""
    body = _table(html, table_id).split("<tbody>", 1)[1]
    return [re.findall(r"<td\b[^>]*>.*?</td>", row, re.S) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_verdict_table_holds_each_runs_own_evaluation(compared):
    doc, html = compared["json"], compared["html"]
    labels = [r["label"] for r in doc["runs"]]
    assert labels == [FULL, SMALL, BROKEN]
    rows = _rows(html, "verdict-table")
    assert len(rows) == len(doc["claims"]) == len(load_claims())  # one row per claim
    for label, run in compared["runs"].items():
        own = evaluate(load_claims(run_claims_path(run)), run)
        column = 1 + labels.index(label)
        for result, claim, cells in zip(own, doc["claims"], rows, strict=True):
            got = claim["verdicts"][label]
            assert claim["id"] == result["id"] and f"<b>{result['id']}</b>" in cells[0]
            for key in ("verdict", "value", "value_text", "reason", "underpowered", "fragile", "sensitivity"):
                assert got[key] == result[key], (label, result["id"], key)
            cell = cells[column]
            assert f">{esc(result['verdict'])}" in cell and f"<br>{esc(result['value_text'])}" in cell
            assert f'title="{esc(result["reason"])}"' in cell  # the reason on hover
    verdicts = {c["id"]: c["verdicts"] for c in doc["claims"]}
    # the synthetic clamp spans 3 layers: calibrated at that count, the chain is underpowered
    assert verdicts["A7-clamp-chain"][FULL]["verdict"] == "inconclusive"
    assert verdicts["A7-clamp-chain"][FULL]["underpowered"]
    assert verdicts["A7-clamp-chain"][SMALL]["verdict"] == "not tested"
    assert "stage clamp" in verdicts["A7-clamp-chain"][SMALL]["reason"]
    assert verdicts["A5-routing-positive"][SMALL]["underpowered"]


def test_sensitivity_per_claim_and_model(compared):
    doc, html = compared["json"], compared["html"]
    section = _table(html, "sensitivity-table")
    for claim in doc["claims"]:
        names = [v["name"] for v in claim["verdicts"][FULL]["sensitivity"]]
        if not names:
            assert f"<b>{claim['id']}</b>" not in section
            continue
        start = section.index(f"<b>{claim['id']}</b>")
        assert f'rowspan="{len(names) + 1}"' in section[start - 30: start]
        for name in names:
            assert f"<td>{esc(name)}</td>" in section[start:]
        for label in (FULL, SMALL):
            result = claim["verdicts"][label]
            decisive = result["verdict"] in ("supported", "falsified")
            assert result["fragile"] == (decisive and any(
                v["verdict"] not in (result["verdict"], "not tested") for v in result["sensitivity"]))


def test_failed_model_is_marked_in_every_table_and_figure(compared):
    doc, html = compared["json"], compared["html"]
    assert MALICIOUS not in html and "<script" not in html.lower()
    broken = doc["runs"][-1]
    assert (broken["label"], broken["status"], broken["error"], broken["run_dir"]) == (BROKEN, "failed", ERROR, None)
    for table_id in ("runs-table", "verdict-table", "sensitivity-table"):
        table = _table(html, table_id)
        assert esc(BROKEN) in table and 'status-failed">failed' in table and esc(ERROR) in table, table_id
    for cells in _rows(html, "verdict-table"):
        assert 'status-failed">failed' in cells[3] and f'title="{esc(ERROR)}"' in cells[3]
    for spec in PROFILES:
        assert doc["profiles"][spec.name]["left_out"][BROKEN] == f"failed: {ERROR}"
        figure = html[html.index(f'id="fig-profile-{spec.name}"'):]
        assert f"{esc(BROKEN)} (failed: {esc(ERROR)})" in figure[: figure.index("</figure>")]


def test_profiles_on_normalised_depth(compared):
    """Each profile's points against an independent computation from the run's tables, and the
    figure plots exactly those points."""
    full, small = compared["runs"][FULL], compared["runs"][SMALL]

    def operators(run: Path) -> pd.DataFrame:
        ops = pd.read_parquet(run / "tables" / "operators.parquet")
        return ops[(ops["checkpoint"] == "trained") & (ops["jacobian_mode"] == "isolated")
                   & (ops["sublayer"] == "layer")].sort_values("layer")

    for run, n_layers in ((full, 18), (small, 4)):  # the small run's operators stop at layer 3
        want = operators(run)
        for name, column in (("complex_frac", "complex_frac_nontrivial"), ("henrici", "henrici_update_rel")):
            got = run_profile(name, RunTables(run))
            np.testing.assert_allclose(got["depth"], want["layer"] / (n_layers - 1))
            np.testing.assert_allclose(got["value"], want[column])
    cum = pd.read_parquet(full / "tables" / "cumulative.parquet")
    cum = cum[(cum["checkpoint"] == "trained") & (cum["jacobian_mode"] == "isolated") & (cum["direction"] == "forward")
              & (cum["schur_alpha"] == 1.0) & (cum["truncation"] == 128)].sort_values("depth")
    got = run_profile("erank_funnel", RunTables(full))
    np.testing.assert_allclose(got["depth"], cum["depth"] / 35)  # 36 sub-layer steps
    np.testing.assert_allclose(got["value"], cum["erank"])
    heads = pd.read_parquet(small / "tables" / "heads.parquet")
    got = run_profile("delta_tr_roles", RunTables(small))
    for role in ("routing", "sink"):
        mean = heads[heads["role"] == role].groupby("layer")["delta_TR1"].mean()
        mine = got[got["series"] == role]
        np.testing.assert_allclose(mine["depth"], mean.index / 3)
        np.testing.assert_allclose(mine["value"], mean.to_numpy())
    depth = pd.read_parquet(full / "tables" / "depth.parquet")
    got = run_profile("eig_gap", RunTables(full))
    for source in ("model", "null"):
        median = depth[(depth["operator"] == "mean") & (depth["source"] == source)].groupby("depth")["gap_e1"].median()
        mine = got[got["series"] == source]
        np.testing.assert_allclose(mine["depth"], (median.index - 1) / 2)  # products of 1 … 3 layers
        np.testing.assert_allclose(mine["value"], median.to_numpy())
    # compare.json holds the same points, and each figure draws them
    runs = {label: RunTables(path) for label, path in compared["runs"].items()}
    points, missing = build_profiles(runs)
    assert missing["erank_funnel"] == {SMALL: "tables/cumulative.parquet is absent although stage jacobian is done"}
    for spec in PROFILES:
        mine = points[points["profile"] == spec.name]
        stored = pd.DataFrame(compared["json"]["profiles"][spec.name]["points"])
        np.testing.assert_allclose(stored[["position", "depth", "value"]], mine[["position", "depth", "value"]])
        fig = draw_profile(spec, points, model_colours(list(runs)))
        lines = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
        groups = list(mine.groupby(["run", "series"], sort=False))
        assert len(lines) == len(groups)
        for line, (_, curve) in zip(lines, groups):
            np.testing.assert_allclose(line.get_xdata(), curve["depth"])
            np.testing.assert_allclose(line.get_ydata(), curve["value"])


def test_left_out_runs_and_empty_figures_say_why(compared, tmp_path):
    html = compared["html"]
    funnel = html[html.index('id="fig-profile-erank_funnel"'):]
    assert (f"Left out: {SMALL} (tables/cumulative.parquet is absent although stage jacobian is done)"
            in funnel[: funnel.index("</figure>")])
    run = build_run(tmp_path / "run", stages=("attention",))
    text = render_comparison([run], tmp_path / "out", labels=["only"]).read_text()
    assert ("The erank funnel against depth: not available — no run has it: only: stage jacobian not run: "
            "tables/cumulative.parquet is absent.") in text
    assert len(IMG.findall(text)) == 2  # Δ_TR by role and the eigenvalue-prediction error


def test_page_is_self_contained_with_embedded_pngs(compared):
    html = compared["html"]
    assert compared["path"].name == COMPARE_HTML and html.startswith("<!DOCTYPE html>")
    order = [html.index(f'id="{s}"') for s in ("runs", "verdicts", "sensitivity", "profiles")]
    assert order == sorted(order)
    tags = IMG.findall(html)
    assert len(tags) == sum(p["drawn"] for p in compared["json"]["profiles"].values()) == len(PROFILES)
    assert all('src="data:image/png;base64,' in tag for tag in tags)
    assert not re.search(r"""(?:src|href)\s*=\s*(?!["']?(?:data:|#))""", html)
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    assert not list(compared["path"].parent.glob(".*.tmp"))


def test_bad_inputs_give_one_line_and_write_nothing(tmp_path):
    run = build_run(tmp_path / "run", stages=("attention",))
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"name": "another tool"}')
    cases = [([tmp_path / "absent"], {}, "does not exist"), ([tmp_path / "file.txt"], {}, "it is not a folder"),
             ([tmp_path / "empty"], {}, "not a depthlens run directory"),
             ([run, foreign], {}, 'foreign is not a depthlens run directory .*"format": "depthlens-run"'),
             ([run, run], {"labels": ["a"]}, "1 labels for 2"),
             ([run, run], {"labels": ["a", "a"]}, "given to two runs"), ([run], {"labels": [" "]}, "empty"),
             ([], {}, "nothing to compare")]
    for runs, kwargs, match in cases:
        with pytest.raises(InputError, match=match) as info:
            render_comparison(runs, out, **kwargs)
        assert "\n" not in str(info.value) and not out.exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(InputError, match="not a previous comparison .*; nothing was written"):
        render_comparison([run], other)
    assert [p.name for p in other.iterdir()] == ["notes.txt"] and (other / "notes.txt").read_text() == "keep"
    with pytest.raises(InputError, match="is a file"):
        render_comparison([run], tmp_path / "file.txt")
    render_comparison([run], out)  # a previous comparison is rewritten
    render_comparison([run], out, labels=["renamed"])
    assert [r["label"] for r in json.loads((out / COMPARE_JSON).read_text())["runs"]] == ["renamed"]
    assert sorted(p.name for p in out.iterdir()) == [COMPARE_HTML, COMPARE_JSON]


def test_default_labels_are_short_and_distinct(tmp_path):
    one = build_run(tmp_path / "seed0", stages=("attention",))
    two = build_run(tmp_path / "seed1", stages=("attention",))
    doc = json.loads((render_comparison([one, two], tmp_path / "out").parent / COMPARE_JSON).read_text())
    assert [r["label"] for r in doc["runs"]] == ["synthetic:tiny (seed0)", "synthetic:tiny (seed1)"]
    memory = {"model": {"name": "memory:/root/.cache/gguf/" + "ab" * 32 + "@0123456789ab", "revision": None}}
    hub = {"model": {"name": "EleutherAI/pythia-70m", "revision": "step1000"}}
    assert default_labels([one, two, one], [memory, hub, hub]) == [
        "memory:abababab@0123456789ab", "EleutherAI/pythia-70m@step1000 (seed1)",
        "EleutherAI/pythia-70m@step1000 (seed0)"]


def test_command_line(tmp_path, capsys):
    from depthlens.cli import main

    one = build_run(tmp_path / "one", stages=("attention",))
    two = build_run(tmp_path / "two", model=SMALL, stages=("attention",))
    out = tmp_path / "out"
    assert main(["compare", str(one), str(two), "--out", str(out), "--labels", "first,second"]) == 0
    assert capsys.readouterr().out == f"report: {out / COMPARE_HTML}\n"
    assert [r["label"] for r in json.loads((out / COMPARE_JSON).read_text())["runs"]] == ["first", "second"]
    for argv in (["compare", str(tmp_path / "absent"), "--out", str(tmp_path / "new")],
                 ["compare", str(one), str(two), "--out", str(tmp_path / "new"), "--labels", "a"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("depthlens: error: ") and err.count("\n") == 1
        assert not (tmp_path / "new").exists()


@pytest.mark.real
@pytest.mark.full_leg
def test_smollm2_against_its_random_init_in_headless_chromium(tmp_path):
    """The Done-when check: SmolLM2 against a random-init model of the same family (attention
    and jacobian, quick preset, 1 chunk without pseudospectral radii, no step-0 null: about
    a minute and a half on 2 cores), compared and rendered in headless Chromium."""
    import depthlens
    from depthlens.models.in_memory import init_like
    from depthlens.models.loading import load_model

    need_chromium()  # before the runs
    options = {"stages": ["attention", "jacobian"], "preset": "quick", "chunks": 1, "extras_chunks": 0, "null": "none"}
    start = time.perf_counter()
    trained = depthlens.analyse("smollm2-135m", out=tmp_path / "trained", **options)
    null = init_like(load_model("smollm2-135m"))
    init = depthlens.analyse(null.model, null.tokenizer, out=tmp_path / "init", **options)
    path = render_comparison([trained.path, init.path], tmp_path / "compare", labels=["smollm2-135m", "random init"])
    elapsed = time.perf_counter() - start
    doc = json.loads((path.parent / COMPARE_JSON).read_text())
    assert [r["status"] for r in doc["runs"]] == ["done", "done"] and [r["layers"] for r in doc["runs"]] == [30, 30]
    drawn = [name for name, p in doc["profiles"].items() if p["drawn"]]
    assert {"complex_frac", "henrici", "erank_funnel", "eig_gap"} <= set(drawn)
    for name in drawn:  # both models on one normalised axis
        points = pd.DataFrame(doc["profiles"][name]["points"])
        assert points["depth"].between(0, 1).all()
        assert points["run"].nunique() == 2 - len(doc["profiles"][name]["left_out"])
    errors, found = in_chromium(path, {"widths": IMAGE_WIDTHS,
                                       "rows": "document.querySelectorAll('#verdict-table tbody tr').length",
                                       "columns": "document.querySelectorAll('#verdict-table thead th').length"})
    assert errors == []
    assert len(found["widths"]) == len(drawn) and all(w > 0 for w in found["widths"])
    assert found["rows"] == len(load_claims()) and found["columns"] == 3
    print(f"two runs and the comparison: {elapsed:.0f} s")
