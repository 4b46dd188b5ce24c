"""The stage protocol: every stage is a module with ``check(config)`` and ``run(context)``, and
an options dataclass whose documented fields become config keys and flags, defaults written once."""

from __future__ import annotations

import inspect

import pytest

from depthlens.cli import build_parser
from depthlens.config import PRESET_VALUES, RunConfig, RunOptions, option_owner
from depthlens.options import field_help, flag_name, option_fields
from depthlens.schema import SCHEMA
from depthlens.errors import InputError
from depthlens.stages import FOLLOW_UPS, STAGES, Stage, get, plan, register, with_requirements


@pytest.mark.parametrize("name", list(STAGES))
def test_stage_module_has_the_protocol(name: str) -> None:
    module = STAGES[name].load()
    assert list(inspect.signature(module.run).parameters) == ["context"]
    assert list(inspect.signature(module.check).parameters) == ["config"]
    module.check(RunConfig(model="random:llama"))  # the default sizes pass every stage's check
    assert any(t.stage == name for t in SCHEMA.values()), f"stage {name} declares no table in depthlens.schema"


@pytest.mark.parametrize("cls", [RunOptions, *(s.options for s in STAGES.values())], ids=lambda c: c.__name__)
def test_every_option_is_documented_and_has_one_flag(cls: type) -> None:
    parser = build_parser()
    owner = next((s for s in STAGES.values() if s.options is cls), None)
    command = "run" if owner is None or owner.in_run else owner.name  # a stage outside run: its own command
    run_help = parser._subparsers._group_actions[0].choices[command].format_help()
    for f in option_fields(cls):
        assert field_help(cls, f.name), f"{cls.__name__}.{f.name} is not described in its docstring"
        if f.is_flag:
            assert flag_name(f.name) in run_help, f"{flag_name(f.name)} is missing from depthlens {command} --help"
            assert f.name in dict(RunConfig().items())
            assert option_owner(f.name) == (None if cls is RunOptions else next(
                s.name for s in STAGES.values() if s.options is cls))


def test_defaults_are_written_once() -> None:
    """The default preset is every option's own default: no second copy of the numbers."""
    assert PRESET_VALUES["default"] == {}
    config = RunConfig()
    for cls in (RunOptions, *(s.options for s in STAGES.values())):
        for f in option_fields(cls):
            if f.derived is None:
                assert getattr(config, f.name) == f.default, f.name
    for preset, values in PRESET_VALUES.items():
        assert all(option_owner(k) is not None or k in ("chunks", "seq_len") for k in values), preset


def test_stage_help_lists_its_own_options_and_those_it_needs() -> None:
    parser = build_parser()
    choices = parser._subparsers._group_actions[0].choices
    topology = choices["topology"].format_help()
    assert "jacobian stage:" in topology and "topology stage:" in topology and "attention stage:" not in topology
    assert "--null-samples" not in topology  # accepted (one command line for every stage) but not listed
    assert choices["topology"].parse_args(["--null-samples", "3"]).null_samples == 3
    assert with_requirements(["topology", "capture"]) == ["jacobian", "topology", "capture"]


def test_the_census_follow_up_comes_last_and_only_with_revisions() -> None:
    """A run with ``--revisions`` writes its census tables as a stage after every other; it is
    no command and no configuration section, and its name cannot be registered again."""
    assert plan(["topology"], RunConfig()) == ["jacobian", "topology"]
    assert plan(["topology", "capture"], RunConfig(model="org/name", revisions=("step1",))) == [
        "jacobian", "topology", "capture", "census"]
    assert get("census") is FOLLOW_UPS["census"] and "census" not in STAGES
    assert "census" not in RunConfig().to_dict()
    with pytest.raises(InputError, match="exists already"):
        register(Stage("census", "another", STAGES["capture"].options, "depthlens.stages.capture"))


def test_a_requirement_that_depends_on_an_option() -> None:
    """The contest reads the ablate stage's table only for the criticality target."""
    assert with_requirements(["contest"]) == ["attention", "ablate", "contest"]
    assert with_requirements(["contest"], RunConfig()) == ["attention", "ablate", "contest"]
    assert with_requirements(["contest"], RunConfig(contest_targets=("routing", "persistence"))) == ["attention", "contest"]
    assert STAGES["contest"].needs(RunConfig(contest_targets=("criticality",))) == ("attention", "ablate")
