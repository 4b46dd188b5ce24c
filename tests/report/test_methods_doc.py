"""The method reference ``docs/methods.md``: every packaged claim has its section, every anchor
the code, the claims file, the README and the docs link to exists, and every quoted source
sentence is the papers' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from depthlens.report import load_claims
from depthlens.report.claims import default_claims_path
from depthlens.report.methods_page import (METHODS_PAGE, anchors, claim_anchor, claim_link, claim_notes,
                                           link_sections, methods_page)
from depthlens.report.verdicts_html import claim_details

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SEEDS = ROOT.parent / "shared" / "seeds"
#: A link into the page (``methods.md#a4``, ``docs/methods.md#claim-…``) or a section citation (``§A4``).
LINK = re.compile(r"methods\.md#([A-Za-z0-9_-]+)")
CITE = re.compile(r"§([AB][0-9])")


def _page_anchors() -> set[str]:
    return anchors((DOCS / METHODS_PAGE).read_text(encoding="utf-8"))


def _linking_files() -> list[Path]:
    """What a user reads that may link into the page: the package's code and data, the README,
    the hand-written and the generated docs, the benchmarks."""
    files = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "src").rglob("*.toml")),
             *sorted((ROOT / "src").rglob("*.md")), ROOT / "README.md", *sorted(DOCS.rglob("*.md")),
             *sorted((ROOT / "benchmarks").glob("*.py"))]
    return [f for f in files if f.is_file()]


def test_every_default_claim_has_its_section():
    page = _page_anchors()
    claims = load_claims()
    assert set(claim_notes()["claims"]) == {c.id for c in claims}, "add the claim to report/methods_claims.toml"
    for claim in claims:
        assert claim_anchor(claim.id) in page, claim.id
        assert claim_link(claim.id) == f"docs/methods.md#{claim_anchor(claim.id)}"
    text = (DOCS / METHODS_PAGE).read_text(encoding="utf-8")
    for claim in claims:  # the section holds the claim's decision fields
        section = text[text.index(f'<a id="{claim_anchor(claim.id)}">'):]
        section = section[: section.find("\n### ", 1) if "\n### " in section else None]
        assert claim.statistic in section and claim.criterion() in section and claim.falsifier in section
        assert "planted null" in section and "> " in section, claim.id
    assert claim_link("my-own-claim") is None


def test_anchors_are_stable_and_distinct():
    assert claim_anchor("A2b-eig-gap-absent-in-nulls") == "claim-a2b-eig-gap-absent-in-nulls"
    assert claim_anchor("X1.v2_b") == "claim-x1-v2-b"
    text = methods_page()
    found = re.findall(r'<a id="([^"]+)"></a>', text)
    assert len(found) == len(set(found)), "an anchor is defined twice"
    for section in ("a1", "a2", "a3", "a4", "a5", "a6", "a7", "b1", "b2", "b3", "b4", "b5", "b6", "claims",
                    "verdicts", "calibration", "kreiss-constant", "pseudospectra", "henrici", "leiden-cpm"):
        assert section in found, section


def test_every_anchor_that_is_linked_exists():
    page = _page_anchors()
    text = (DOCS / METHODS_PAGE).read_text(encoding="utf-8")
    missing = sorted({f"#{a}" for a in re.findall(r"\]\(#([^)]+)\)", text)} - {f"#{a}" for a in page})
    assert missing == [], f"docs/methods.md links to anchors it lacks: {missing}"
    broken = []
    for path in _linking_files():
        body = path.read_text(encoding="utf-8")
        for anchor in {*LINK.findall(body), *(a.lower() for a in CITE.findall(body))}:
            if anchor not in page and not anchor.endswith("-"):  # ``#claim-…``: a template, not a link
                broken.append(f"{path.relative_to(ROOT)}: #{anchor}")
    assert broken == [], broken
    assert link_sections("§A4 and §B5", lambda c, a: a) == "a4 and b5"


def test_the_report_links_each_claim_to_its_section():
    claims = load_claims()
    results = [{"id": c.id, "prediction": c.prediction, "falsifier": c.falsifier, "source": c.source,
                "protocol": c.protocol, "statistic": c.statistic, "statistic_description": "", "value_text": "—",
                "criterion": c.criterion(), "verdict": "not tested", "reason": "", "methods": claim_link(c.id)}
               for c in claims]
    html = "".join(claim_details(r) for r in results)
    for claim in claims:
        assert f'href="docs/methods.md#{claim_anchor(claim.id)}"' in html
    cited = set(re.findall(r'href="docs/methods\.md#([a-z0-9-]+)"', html))
    assert cited <= _page_anchors() and {"a4", "a6", "b3"} <= cited  # the protocols' citations, linked


@pytest.mark.shared
def test_every_quote_is_the_papers_own():
    if not SEEDS.is_dir():
        pytest.skip(f"{SEEDS} is absent (../shared is not beside this checkout)")
    text = " ".join(" ".join(p.read_text(encoding="utf-8").split()) for p in sorted(SEEDS.glob("*.txt")))
    for cid, notes in claim_notes()["claims"].items():
        for sentence in notes["quote"]:
            assert " ".join(sentence.split()) in text, (cid, sentence[:60])
