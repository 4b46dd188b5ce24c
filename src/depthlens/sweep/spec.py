"""A sweep file: the options every cell shares, and the axes its cells vary.

``SWEEP.toml`` is a run configuration file (top-level run options, a ``[STAGE]`` section per
stage, exactly as ``--config`` reads them) with one more table, ``[sweep]``::

    preset = "quick"
    chunks = 8

    [attention]
    null_samples = 4

    [sweep]
    models = ["smollm2-135m", "random:llama"]   # required: at least one model spec
    revisions = ["", "step1000"]                # hub revisions; "" is the model as given
    texts = ["python-docs", "wikitext-2"]       # text sources
    seeds = [0, 1]                              # run seeds
    stages = ["attention", "jacobian"]          # default: every stage, as `depthlens run`
    claims = "claims.toml"                      # default: the packaged claims

The cells are every combination of models × revisions × texts × seeds, in that order. An axis
left out takes the file's own top-level value (``model``, ``revision``, ``text``, ``seed``) or
the default; giving both is refused. Relative paths in ``[sweep]`` (texts, model folders,
claims) are read relative to the sweep file.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from ..config import RunConfig, read_toml
from ..errors import InputError
from ..stages import STAGES, run_stages

__all__ = ["AXES", "Cell", "Sweep", "read_sweep"]

#: Each axis of ``[sweep]`` and the run option it sets.
AXES = {"models": "model", "revisions": "revision", "texts": "text", "seeds": "seed"}
#: The other keys ``[sweep]`` takes.
KEYS = {"stages": list[str], "claims": str}


@dataclass(frozen=True)
class Cell:
    """One cell of a sweep: an ordinary run.

    Parameters
    ----------
    label : str
        Its name: the folder ``OUT/cells/LABEL`` and its row of the ``sweep`` table.
    config : RunConfig
        Its run configuration.
    """

    label: str
    config: RunConfig

    @property
    def axes(self) -> dict[str, Any]:
        """The cell's value on each axis (``revision`` ``""`` for the model as given)."""
        return {"model": self.config.model, "revision": self.config.revision or "", "text": self.config.text,
                "seed": self.config.seed}


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file.

    Parameters
    ----------
    source : Path
        The sweep file.
    cells : tuple of Cell
        Every cell, in axis order.
    stages : tuple of str
        The stages every cell runs.
    claims : Path or None
        The claims file every cell registers (None: the packaged one).
    """

    source: Path
    cells: tuple[Cell, ...]
    stages: tuple[str, ...]
    claims: Path | None

    def digest(self) -> str:
        """A short stable hash of what the sweep computes (16 hex digits of SHA-256): every
        cell's label and configuration hash, the stages and the claims file's bytes."""
        claims = hashlib.sha256(self.claims.read_bytes()).hexdigest() if self.claims else None
        blob = json.dumps({"cells": [[c.label, c.config.hash()] for c in self.cells], "stages": list(self.stages),
                           "claims": claims}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file: every key known, every cell's configuration valid.

    Raises
    ------
    InputError
        One line naming the file and what is wrong: unreadable or not TOML, no ``[sweep]``
        table, an unknown key, a value of the wrong type, an empty axis, an axis given twice,
        an unknown stage, a missing claims file, or a cell configuration that
        :class:`~depthlens.config.RunConfig` refuses (it names the cell).
    """
    source = Path(path)
    values = read_toml(source, what="sweep file", flag="depthlens sweep")
    table = values.pop("sweep", None)
    if not isinstance(table, dict):
        raise InputError(f"sweep file {source} has no [sweep] table; add one with at least `models = [...]`.")
    unknown = sorted(set(table) - set(AXES) - set(KEYS))
    if unknown:
        raise InputError(f"sweep file {source}: unknown key [sweep] {unknown[0]}; the [sweep] keys are: "
                         f"{', '.join([*AXES, *KEYS])}.")
    base = source.parent
    axes: dict[str, list[Any]] = {}
    for key, option in AXES.items():
        if key not in table:
            axes[option] = [values.pop(option)] if option in values else [None]
            continue
        if option in values:
            raise InputError(f"sweep file {source} sets both `{option}` and [sweep] {key}; keep one of them.")
        _check(source, key, table[key], int if option == "seed" else str)
        if not table[key]:
            raise InputError(f"sweep file {source}: [sweep] {key} is empty; give at least one value or leave it out.")
        axes[option] = [_local(v, base) if option in ("model", "text") else v for v in table[key]]
    if axes["model"] == [None]:
        raise InputError(f"sweep file {source}: [sweep] models is missing; list the model specs to sweep.")
    _check(source, "stages", table.get("stages", []), str)
    stages = tuple(table.get("stages") or ("run",))
    bad = [s for s in stages if s != "run" and s not in STAGES]
    if bad:
        raise InputError(f"sweep file {source}: [sweep] stages has unknown stage {bad[0]!r}; known: "
                         f"run, {', '.join(STAGES)}.")
    if "run" in stages:  # depthlens run's stages, and any other named beside it
        stages = (*run_stages(), *(s for s in stages if s != "run" and s not in run_stages()))
    claims = None
    if "claims" in table:
        _check(source, "claims", table["claims"], str, array=False)
        claims = Path(_local(table["claims"], base))
        if not claims.is_file():
            raise InputError(f"sweep file {source}: claims file {claims} does not exist; fix [sweep] claims.")
    cells = []
    for model, revision, text, seed in product(*(axes[o] for o in AXES.values())):
        given = {"model": model, "revision": revision or None, "text": text, "seed": seed}
        label = _label(given)
        try:
            config = RunConfig.from_mapping(values, **given)
        except InputError as exc:
            raise InputError(f"sweep file {source}, cell {label}: {exc}") from None
        cells.append(Cell(label, config))
    return Sweep(source, tuple(_distinct(cells)), stages, claims)


def _check(source: Path, key: str, value: Any, kind: type, array: bool = True) -> None:
    """Refuse a ``[sweep]`` value that is not a ``kind`` (an array of them when ``array``)."""
    items = value if array and isinstance(value, list) else [value]
    if (array and not isinstance(value, list)) or any(type(v) is not kind for v in items):
        name = {str: "string", int: "integer"}[kind]
        want = f"an array of {name}s" if array else f"a {name}"
        raise InputError(f"sweep file {source}: [sweep] {key} = {value!r} is not {want}; fix it.")


def _local(value: str, base: Path) -> str:
    """A model or text value that names a file or folder relative to the sweep file, made
    absolute; any other value (a hub id, ``python-docs``, ``random:llama``) unchanged."""
    candidate = base / value
    return str(candidate.resolve()) if not Path(value).is_absolute() and candidate.exists() else value


def _slug(value: str) -> str:
    """A file-name-safe short form of an axis value (a path's last part)."""
    value = Path(value).name if "/" in value and Path(value).exists() else value
    return re.sub(r"[^A-Za-z0-9._-]+", "_", value).strip("_") or "_"


def _label(given: dict[str, Any]) -> str:
    """``MODEL[@REVISION]__TEXT__seedN``, file-name safe."""
    model = _slug(str(given["model"] or RunConfig().model))
    if given["revision"]:
        model = f"{model}@{_slug(given['revision'])}"
    text = _slug(str(given["text"] or RunConfig().text))
    seed = given["seed"] if given["seed"] is not None else RunConfig().seed
    return f"{model}__{text}__seed{seed}"


def _distinct(cells: list[Cell]) -> list[Cell]:
    """``cells`` with a ``-2``, ``-3`` … suffix on labels that repeat an earlier one."""
    seen: set[str] = set()
    out = []
    for cell in cells:
        label, k = cell.label, 2
        while label in seen:
            label, k = f"{cell.label}-{k}", k + 1
        seen.add(label)
        out.append(Cell(label, cell.config))
    return out
