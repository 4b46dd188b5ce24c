"""The statistics' registry: families gathered explicitly, names found by grep, one owner a name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import depthlens.report.statistics as statistics_package
from depthlens.report.statistics import STATISTICS, attention, census, coupling, interventions, residual
from depthlens.report.statistics.core import gather, registrar

PACKAGE = Path(statistics_package.__file__).parent


def test_every_statistic_comes_from_exactly_one_family_in_order() -> None:
    families = [attention.STATISTICS, interventions.STATISTICS, residual.STATISTICS, coupling.STATISTICS,
                census.STATISTICS]
    names = [name for family in families for name in family]
    assert len(names) == len(set(names))
    assert list(STATISTICS)[:len(names)] == names
    assert all(STATISTICS[name] is family[name] for family in families for name in family)


def test_every_statistic_name_is_written_out_in_its_family_module() -> None:
    """A name is declared as a string literal, never assembled, so grep finds its definition."""
    for module, family in ((attention, attention.STATISTICS), (interventions, interventions.STATISTICS),
                           (residual, residual.STATISTICS), (coupling, coupling.STATISTICS),
                           (census, census.STATISTICS)):
        text = Path(module.__file__).read_text(encoding="utf-8")
        literals = set(re.findall(r'"(\w+)"', text))
        assert sorted(set(family) - literals) == [], module.__name__
    assert not re.search(r'register\(\s*f"', "".join(p.read_text() for p in PACKAGE.glob("*.py")))


def test_a_name_registered_twice_is_refused() -> None:
    registry: dict = {}
    register = registrar(registry)
    register("x_stat", ["heads"], "A statistic.")(lambda t: 1.0)
    with pytest.raises(ValueError, match="'x_stat' is registered twice"):
        register("x_stat", ["heads"], "Again.")(lambda t: 2.0)
    with pytest.raises(ValueError, match="unknown sample unit 'widgets'"):
        register("y_stat", ["heads"], "A statistic.", samples={"widgets": lambda t: 1})
    taken = next(iter(STATISTICS))
    with pytest.raises(ValueError, match=f"{taken!r} is registered twice"):
        gather({taken: STATISTICS[taken]})


def test_a_statistic_registered_from_outside_joins_the_study() -> None:
    from depthlens.report.statistics import compute_statistic, register
    from depthlens.runs.tables import RunTables

    register("outside_probe", [], "A statistic added by an extension.")(lambda t: 0.25)
    try:
        assert compute_statistic("outside_probe", RunTables.__new__(RunTables)) == (0.25, "")
    finally:
        del STATISTICS["outside_probe"]
