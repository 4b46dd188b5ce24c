"""Run configuration: validation, TOML, hashing."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any, Literal

import pytest

import dataclasses

from depthlens.config import RunConfig, RunOptions, check_type, option_owner
from depthlens.options import flag_name, option_fields
from depthlens.stages import STAGES
from depthlens.errors import InputError


def test_defaults_and_hash_stability() -> None:
    a, b = RunConfig(), RunConfig()
    assert a.model == "smollm2-135m" and a.text == "python-docs"
    assert a.hash() == b.hash() and len(a.hash()) == 16
    assert RunConfig(seed=1).hash() != a.hash()


@pytest.mark.parametrize(
    "field,value", [("chunks", 0), ("seq_len", 1), ("batch_size", 0), ("seed", -1), ("chunks", 2.5), ("dtype", "int8")]
)
def test_invalid_values(field: str, value: object) -> None:
    with pytest.raises(InputError) as err:
        RunConfig(**{field: value})
    assert "\n" not in str(err.value)


def test_toml_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('model = "random:llama"\nchunks = 3\nseq_len = 16\n')
    cfg = RunConfig.from_sources(f, chunks=5, seed=None)
    assert (cfg.model, cfg.chunks, cfg.seq_len, cfg.seed) == ("random:llama", 5, 16, 0)


def test_toml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("chunks = [")
    with pytest.raises(InputError, match="not valid TOML"):
        RunConfig.from_sources(bad)
    unknown = tmp_path / "u.toml"
    unknown.write_text("chunkz = 3\n")
    with pytest.raises(InputError, match="unknown config key 'chunkz'; did you mean chunks"):
        RunConfig.from_sources(unknown)
    with pytest.raises(InputError, match="does not exist"):
        RunConfig.from_sources(tmp_path / "missing.toml")


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def _line(key: str, value: str) -> str:
    """``key = value`` in the section the option lives in (top level for the run's own)."""
    owner = option_owner(key)
    return f"{key} = {value}\n" if owner is None else f"[{owner}]\n{key} = {value}\n"


@pytest.mark.parametrize("key", ["trust_remote_code", "exclude_massive"])
@pytest.mark.parametrize("value", ['"false"', '"true"', "0", "1"])
def test_toml_bool_must_be_a_boolean(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(InputError, match=f"config key {key} = .* expected a boolean") as err:
        RunConfig.from_sources(_toml(tmp_path, _line(key, value)))
    assert flag_name(key) not in str(err.value) and "\n" not in str(err.value)  # the file gave it, not the flag
    assert getattr(RunConfig.from_sources(_toml(tmp_path, _line(key, "false"))), key) is False
    assert getattr(RunConfig.from_sources(_toml(tmp_path, _line(key, "true"))), key) is True


@pytest.mark.parametrize("value", ["true", "3.0", '"3"'])
def test_toml_int_must_be_an_integer(tmp_path: Path, value: str) -> None:
    with pytest.raises(InputError, match="^config key chunks = .* expected an integer.$"):
        RunConfig.from_sources(_toml(tmp_path, f"chunks = {value}\n"))


@pytest.mark.parametrize("key,value",
                         [("model", "5"), ("text", "true"), ("revision", "3")])
def test_toml_str_must_be_a_string(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(InputError, match=f"config key {key} = .* expected a string"):
        RunConfig.from_sources(_toml(tmp_path, f"{key} = {value}\n"))
    with pytest.raises(InputError, match="config key revisions = 'a,b' is a string, expected a list of strings"):
        RunConfig.from_sources(_toml(tmp_path, 'revisions = "a,b"\n'))
    assert RunConfig.from_sources(_toml(tmp_path, 'revision = "step1000"\n')).revision == "step1000"


@pytest.mark.parametrize("key,value", [("null_mode", "1"), ("null_mode", '"bogus"'), ("certify", "true"),
                                       ("jacobian_mode", '"both "'), ("positions", '["last"]'), ("null", "false"),
                                       ("amplification", '"Column"'), ("dtype", '"int8"')])
def test_toml_choice_must_be_a_listed_string(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(InputError, match=f"config key {key} = |--{key.replace('_', '-')} .* is unknown") as err:
        RunConfig.from_sources(_toml(tmp_path, _line(key, value)))
    assert "\n" not in str(err.value)


def _wrong(annotation: Any) -> Any:
    """A value of the wrong type for ``annotation``."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return 1 if isinstance(typing.get_args(annotation)[0], str) else "x"
    if origin in (tuple, list):
        return "a,b"
    if dataclasses.is_dataclass(annotation):
        return 3
    return {bool: "false", int: True, float: "0.5", str: 1, str | None: 1, int | None: True}[annotation]


def _all_options() -> list[tuple[str, Any]]:
    classes = [RunOptions, *(s.options for s in STAGES.values())]
    return [(f.name, f.annotation) for cls in classes for f in option_fields(cls) if f.derived is None]


@pytest.mark.parametrize("field,annotation", _all_options())
def test_every_option_is_type_checked(field: str, annotation: Any) -> None:
    named = f"config key {field} = " if dataclasses.is_dataclass(annotation) else f"{flag_name(field)} "
    with pytest.raises(InputError, match=f"^{named}"):
        RunConfig(**{field: _wrong(annotation)})


def test_stage_options_live_in_sections(tmp_path: Path) -> None:
    config = RunConfig.from_sources(_toml(tmp_path, 'chunks = 3\n[attention]\nnull_samples = 5\n'
                                                    '[attention.thresholds]\nrouting = 0.4\n'
                                                    '[jacobian]\nfunnel_alphas = [0, 1]\n'))
    assert (config.chunks, config.null_samples, config.thresholds.routing) == (3, 5, 0.4)
    assert config.options("jacobian").funnel_alphas == (0.0, 1.0)
    assert config.to_dict()["attention"]["null_samples"] == 5 and "null_samples" not in config.to_dict()
    with pytest.raises(InputError, match="null_samples belongs to the \\[attention\\] section"):
        RunConfig.from_sources(_toml(tmp_path, "null_samples = 5\n"))
    with pytest.raises(InputError, match="\\[jacobian\\] null_samples is an option of \\[attention\\]"):
        RunConfig.from_sources(_toml(tmp_path, "[jacobian]\nnull_samples = 5\n"))
    with pytest.raises(InputError, match="unknown config key thresholds.rout"):
        RunConfig.from_sources(_toml(tmp_path, "[attention.thresholds]\nrout = 0.4\n"))
    with pytest.raises(InputError, match="names a stage"):
        RunConfig.from_sources(_toml(tmp_path, "attention = 3\n"))


def test_derived_options_come_from_the_run() -> None:
    config = RunConfig(seed=7, jacobian_mode="in_context")
    assert {config.options(s).seed for s in ("attention", "jacobian", "topology")} == {7}
    assert config.options("topology").jacobian_mode == "in_context"
    with pytest.raises(InputError, match="unknown config key 'seed' of stage topology"):
        RunConfig(topology={"seed": 3})


def test_revisions_are_a_run_option(tmp_path: Path) -> None:
    """``revisions`` is the run's (top level in a config file and in the manifest's config);
    the jacobian stage's options take it as a derived field."""
    config = RunConfig.from_sources(_toml(tmp_path, 'model = "org/name"\nrevisions = ["step1", "step2"]\n'))
    assert config.revisions == config.options("jacobian").revisions == ("step1", "step2")
    assert config.to_dict()["revisions"] == ["step1", "step2"] and "revisions" not in config.to_dict()["jacobian"]
    with pytest.raises(InputError, match=r"^config key \[jacobian\] revisions is a run option \(top level\)"):
        RunConfig.from_sources(_toml(tmp_path, '[jacobian]\nrevisions = ["step1"]\n'))


@pytest.mark.parametrize("revisions,message", [
    (("step1", "step1"), "--revisions step1,step1 repeats a revision; pass each revision once."),
    (("trained",), "--revisions trained names the trained checkpoint"),
    (("step1", "init"), "--revisions step1,init names the init checkpoint"),
    (("",), "--revisions '' holds '', which is no revision name"),
    ((" step1",), "--revisions ' step1' holds ' step1', which is no revision name"),
])
def test_bad_revisions_are_refused_in_one_line(revisions: tuple[str, ...], message: str) -> None:
    with pytest.raises(InputError) as info:
        RunConfig(revisions=revisions)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    with pytest.raises(InputError, match="^--revisions main,step1 repeats --revision main, the model as loaded"):
        RunConfig(revision="main", revisions=("main", "step1"))


@pytest.mark.parametrize(
    "annotation,good,bad",
    [
        (bool, [True, False], ["false", 0, 1, None]),
        (int, [0, -3, 10**20], [True, 2.0, "2", None]),
        (float, [0.5, 2, -1e300], [True, "0.5", None]),
        (str, ["", "x"], [1, b"x", None, ["x"]]),
        (str | None, [None, "x"], [1, False]),
        (tuple[str, ...], [(), ("a",), ["a", "b"]], ["a", ("a", 1), [None]]),
        (list[str], [[], ["a"]], ["ab", [1]]),
        (Literal["a", "b"], ["a", "b"], ["c", 1, True]),
    ],
)
def test_check_type_per_declared_type(annotation: Any, good: list, bad: list) -> None:
    for value in good:
        check_type("some_key", value, annotation)
    for value in bad:
        with pytest.raises(InputError, match="^--some-key .* is .*(expected|unknown)"):
            check_type("some_key", value, annotation)
    with pytest.raises(InputError, match="^--some-key 'c' is unknown; use one of a, b.$"):
        check_type("some_key", "c", Literal["a", "b"])
    with pytest.raises(InputError, match="^--some-key 'c' is unknown; use a list of a, b.$"):
        check_type("some_key", ("a", "c"), tuple[Literal["a", "b"], ...])
    with pytest.raises(InputError, match="^--some-key 'a' is a string, expected a list of one of 'a', 'b' items.$"):
        check_type("some_key", "a", tuple[Literal["a", "b"], ...])


def test_config_path_is_a_folder_or_binary(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a directory; pass --config a TOML file"):
        RunConfig.from_sources(tmp_path)
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match="not UTF-8 text.*--config"):
        RunConfig.from_sources(binary)
    control = tmp_path / "ctl.toml"
    control.write_bytes(b"chunks = 3\x00\x01\n")
    with pytest.raises(InputError, match="not valid TOML.*--config") as err:
        RunConfig.from_sources(control)
    assert "\n" not in str(err.value)


def test_a_stage_outside_run_enters_the_hash_only_off_its_defaults() -> None:
    """The lens section at its defaults leaves the hash of the options without it (a run made
    before the stage existed resumes); a lens option off its default changes it."""
    import hashlib
    import json

    config = RunConfig(chunks=4)
    without = {k: v for k, v in config.to_dict().items() if k != "lens"}
    without["attention"].pop("heads")  # what the report draws never enters it (tests/attention/test_maps.py)
    assert "lens" in config.to_dict()
    assert config.hash() == hashlib.sha256(json.dumps(without, sort_keys=True).encode()).hexdigest()[:16]
    assert RunConfig(chunks=4, lens_chunks=8).hash() != config.hash()
    assert RunConfig(chunks=4, null_samples=3).hash() != config.hash()  # a stage of run: always in it
