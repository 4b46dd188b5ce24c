"""Run configuration: validation, TOML, hashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from depthlens.config import RunConfig
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
