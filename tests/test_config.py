"""Run configuration: validation, TOML, hashing."""

from __future__ import annotations

import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import pytest

from depthlens.config import RunConfig, check_type
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
    with pytest.raises(InputError, match="unknown config key 'chunkz'"):
        RunConfig.from_sources(unknown)
    with pytest.raises(InputError, match="does not exist"):
        RunConfig.from_sources(tmp_path / "missing.toml")


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("key", ["trust_remote_code", "exclude_massive"])
@pytest.mark.parametrize("value", ['"false"', '"true"', "0", "1"])
def test_toml_bool_must_be_a_boolean(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(InputError, match=f"config key {key} = .* expected a boolean") as err:
        RunConfig.from_sources(_toml(tmp_path, f"{key} = {value}\n"))
    assert f"--{key.replace('_', '-')}" in str(err.value) and "\n" not in str(err.value)
    assert getattr(RunConfig.from_sources(_toml(tmp_path, f"{key} = false\n")), key) is False
    assert getattr(RunConfig.from_sources(_toml(tmp_path, f"{key} = true\n")), key) is True


@pytest.mark.parametrize("value", ["true", "3.0", '"3"'])
def test_toml_int_must_be_an_integer(tmp_path: Path, value: str) -> None:
    with pytest.raises(InputError, match="config key chunks = .* expected an integer; .*--chunks"):
        RunConfig.from_sources(_toml(tmp_path, f"chunks = {value}\n"))


@pytest.mark.parametrize("key,value",
                         [("model", "5"), ("text", "true"), ("revision", "3"), ("revisions", '["a", "b"]')])
def test_toml_str_must_be_a_string(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(InputError, match=f"config key {key} = .* expected a string"):
        RunConfig.from_sources(_toml(tmp_path, f"{key} = {value}\n"))
    assert RunConfig.from_sources(_toml(tmp_path, 'revision = "step1000"\n')).revision == "step1000"


@pytest.mark.parametrize("key,value", [("null_mode", "1"), ("null_mode", '"bogus"'), ("certify", "true"),
                                       ("jacobian_mode", '"both "'), ("positions", '["last"]'), ("null", "false"),
                                       ("amplification", '"Column"'), ("dtype", '"int8"')])
def test_toml_choice_must_be_a_listed_string(tmp_path: Path, key: str, value: str) -> None:
    with pytest.raises(InputError) as err:
        RunConfig.from_sources(_toml(tmp_path, f"{key} = {value}\n"))
    assert "\n" not in str(err.value)


_WRONG: dict[Any, Any] = {bool: "false", int: True, str: 1, str | None: 1, int | None: True}


@pytest.mark.parametrize("field", [f.name for f in fields(RunConfig)])
def test_every_field_is_type_checked(field: str) -> None:
    hint = typing.get_type_hints(RunConfig)[field]
    with pytest.raises(InputError, match=f"config key {field} = "):
        RunConfig(**{field: _WRONG[hint]})


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
        with pytest.raises(InputError, match="config key some_key = .*expected .*--some-key"):
            check_type("some_key", value, annotation)


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
