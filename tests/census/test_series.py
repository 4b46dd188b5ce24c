"""Resolving a checkpoint series: step numbers from names, revision ranges and lists, and the
one-line errors for what is no series."""

from __future__ import annotations

from pathlib import Path

import pytest

from depthlens.revisions import expand_revisions, label_of, resolve_series, step_of
from depthlens.errors import InputError


def test_step_of_reads_pythia_olmo_and_depthlens_names() -> None:
    assert step_of("step143000") == 143000
    assert step_of("step-0") == 0
    assert step_of("stage1-step1000-tokens5B") == 1000
    assert step_of("main") is None and step_of("v1.0") is None


def test_ranges_expand_inclusively_and_lists_read_from_files(tmp_path: Path) -> None:
    assert expand_revisions(["step{0..30..10}"]) == ["step0", "step10", "step20", "step30"]
    assert expand_revisions(["stage1-step{1..3}-tokens"]) == [f"stage1-step{k}-tokens" for k in (1, 2, 3)]
    listing = tmp_path / "revisions.txt"
    listing.write_text("# Pythia\nstep1000\n\nstep2000  # late\nstep1000\n")
    assert expand_revisions([f"@{listing}", "step3000"]) == ["step1000", "step2000", "step3000"]


@pytest.mark.parametrize("item, message", [
    ("step{10..0}", "is empty"),
    ("step{0..100000000}", "more than"),
    ("@/no/such/file.txt", "cannot read the revision list"),
    ("step-{0..}", "is not a range"),
    ("step{0-1000}", "is not a range"),
])
def test_bad_revision_items_get_one_line(item: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        expand_revisions([item])
    assert "\n" not in str(err.value)


def test_labels_are_filename_safe() -> None:
    assert label_of("refs/pr/3") == "refs_pr_3" and label_of("step-10") == "step-10"


def test_hub_series_need_revisions_and_keep_step_order() -> None:
    with pytest.raises(InputError, match="name its checkpoints with --revisions"):
        resolve_series("EleutherAI/pythia-70m")
    points = resolve_series("EleutherAI/pythia-70m", ("step2000", "step{0..1000..1000}"))
    assert [(p.label, p.step, p.revision) for p in points] == [
        ("step0", 0, "step0"), ("step1000", 1000, "step1000"), ("step2000", 2000, "step2000")]
    named = resolve_series("org/model", ("main", "step5"))  # a name without a step: order as given
    assert [p.revision for p in named] == ["main", "step5"]


def test_what_is_no_series_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no checkpoint series"):
        resolve_series("random:llama")
    single = tmp_path / "single"
    single.mkdir()
    (single / "config.json").write_text("{}")
    with pytest.raises(InputError, match="single checkpoint, not a series"):
        resolve_series(str(single))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no step-N checkpoints"):
        resolve_series(str(empty))
