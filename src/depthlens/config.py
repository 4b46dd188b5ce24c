"""Typed, validated run configuration, read from TOML files and command-line flags."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:
    from .attention.analysis import AttentionOptions
    from .jacobian.stage import JacobianOptions
    from .topology.stage import TopologyOptions

DTYPES = ("float32", "float64", "bfloat16", "float16")
#: Largest run seed: torch.manual_seed (random models, step-0 nulls) takes 64 bits.
MAX_SEED = 2**64 - 1
PRESETS = ("quick", "default", "paper")
SAVE_ARRAYS = ("float64", "float32", "none")
#: The values each preset gives the fields it controls (a field left unset, ``None``, takes
#: its preset's value; an explicit value, a flag or a --config key, always wins). ``"all"``
#: stands for the run's chunk count. ``default`` is the historical run; ``quick`` a smoke run
#: of a minute or two on SmolLM2 (2 cores); ``paper`` the protocol of METHODS.md (A3: every
#: chunk's pseudospectral radii; A4: S = 16 nulls per observed matrix; A5: 128 probes of
#: length 64; B3: truncation rank 512; B5: 1000 permutations).
PRESET_VALUES: dict[str, dict[str, Any]] = {
    "default": {"chunks": 32, "seq_len": 128, "null_samples": 8, "null_chunks": 8, "extras_chunks": 1,
                "certify": "median", "probe_seqs": 128, "probe_len": 64, "jacobian_mode": "both", "funnel_rank": 512,
                "funnel_alphas": "0,0.25,0.5,0.75,1", "n_perm": 1000, "save_arrays": "float64"},
}
PRESET_VALUES["quick"] = {**PRESET_VALUES["default"], "chunks": 4, "seq_len": 32, "null_samples": 2, "null_chunks": 1,
                          "extras_chunks": 1, "certify": "none", "probe_seqs": 8, "probe_len": 16,
                          "jacobian_mode": "isolated", "funnel_rank": 0, "funnel_alphas": "1", "n_perm": 100,
                          "save_arrays": "none"}
PRESET_VALUES["paper"] = {**PRESET_VALUES["default"], "null_samples": 16, "null_chunks": "all", "extras_chunks": "all"}
_TYPE_NAMES = {bool: "a boolean (true or false, unquoted)", int: "an integer", float: "a number",
               str: "a string (quoted)", type(None): "absent"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings (quoted)"}
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
          tuple: "a list", dict: "a table", type(None): "absent"}


def _describe(annotation: Any) -> str:
    """How a value of type ``annotation`` is written, for error messages."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(annotation) if a is not type(None)) + " (or absent)"
    if origin in (tuple, list):
        item = typing.get_args(annotation)[0]
        return "a list of " + _PLURALS.get(item, f"{_describe(item)} items")
    return _TYPE_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is a value of ``annotation`` (``bool`` is no integer; an integer is a float)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(annotation))
    if origin in (tuple, list):
        item = typing.get_args(annotation)[0]
        return isinstance(value, (tuple, list)) and all(_matches(v, item) for v in value)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    raise TypeError(f"config type {annotation!r} has no check")  # a new field type needs a rule here


def check_type(name: str, value: Any, annotation: Any) -> None:
    """Refuse a configuration value that is not of its declared type.

    Parameters
    ----------
    name : str
        The configuration key (``trust_remote_code``); its flag is ``--trust-remote-code``.
    value : Any
        The value, as given by a TOML file, a flag or the Python API.
    annotation : type
        The declared type: ``bool``, ``int`` (a bool is refused), ``float`` (an int is
        accepted), ``str``, ``X | None``, ``tuple[str, ...]``/``list[str]`` (a TOML array)
        or ``Literal[...]`` (a choice).

    Raises
    ------
    InputError
        Naming the key, the value, the expected type and the flag. The string ``"false"``
        for a boolean is refused, never read as true.

    Examples
    --------
    >>> check_type("exclude_massive", False, bool)
    >>> check_type("exclude_massive", "false", bool)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    depthlens.errors.InputError: config key exclude_massive = 'false' is a string, expected a boolean ...
    """
    if not _matches(value, annotation):
        flag = "--" + name.replace("_", "-")
        kind = _KINDS.get(type(value), f"a {type(value).__name__}")
        raise InputError(f"config key {name} = {value!r} is {kind}, expected {_describe(annotation)}; "
                         f"fix it in --config or pass {flag}.")


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's numbers.

    Execution options that do not change the results (output folder, resume/overwrite,
    progress bars) are not part of the configuration, so a resumed run has the same hash.

    Parameters
    ----------
    model : str
        Model spec: ``smollm2-135m`` (embedded default), a hub id, a local folder, a
        ``.gguf`` file, or ``random:<family>[:<overrides>]``.
    revision : str or None
        Hub revision (checkpoint) of ``model``.
    text : str
        Text source: ``python-docs`` (default, offline), ``wikitext-2`` or a file path.
    chunks : int
        Number of text chunks (>= 1).
    seq_len : int
        Tokens per chunk including BOS (>= 2).
    seed : int
        The one seed of the run; every unit spawns its own stream from it.
    batch_size : int
        Chunks per forward pass (>= 1); also the size of one resumable unit.
    dtype : str
        Model weight dtype; analyses are float64 regardless.
    device : str
        Torch device for the model.
    trust_remote_code : bool
        Allow a hub model's own code to run.
    preset : {"quick", "default", "paper"}
        Gives the fields of :data:`PRESET_VALUES` (chunks, seq_len, null and probe sizes,
        certify, jacobian_mode, funnel_rank, funnel_alphas, n_perm, save_arrays) that are
        left ``None``; an explicit value wins. After construction every field holds its resolved value, so the manifest and
        the hash record the numbers actually used (and the preset). ``dataclasses.replace``
        keeps the resolved values: build a new config to change the preset.
    null_mode, null_samples, null_chunks, extras_chunks, certify, probe_seqs, probe_len
        Attention-stage options, see :class:`depthlens.attention.analysis.AttentionOptions`.
        The run defaults (8 null samples on 8 chunks, extras on the first chunk) keep the default
        attention stage on SmolLM2 under 10 minutes on 2 cores; METHODS A4's S = 16 is
        ``null_samples=16``.
    jacobian_mode, positions, funnel_rank, funnel_alphas, null, revisions, save_arrays
        Jacobian-stage options (``jacobian_mode`` isolated, in_context or both; ``revisions``
        comma-separated; ``funnel_rank`` 0 for the exact products only; ``funnel_alphas`` the
        comma-separated α of the Schur split; ``save_arrays`` float64, float32 or none: the
        dtype of ``arrays/jacobians_*``, which no computation reads back), see :class:`depthlens.jacobian.stage.JacobianOptions`.
    topk, n_perm, exclude_massive, amplification
        Topology-stage options, see :class:`depthlens.topology.stage.TopologyOptions`.
    """

    model: str = "smollm2-135m"
    revision: str | None = None
    text: str = "python-docs"
    chunks: int | None = None
    seq_len: int | None = None
    seed: int = 0
    batch_size: int = 4
    dtype: str = "float32"
    device: str = "cpu"
    trust_remote_code: bool = False
    preset: str = "default"
    null_mode: str = "spec"
    null_samples: int | None = None
    null_chunks: int | None = None
    extras_chunks: int | None = None
    certify: str | None = None
    probe_seqs: int | None = None
    probe_len: int | None = None
    jacobian_mode: str | None = None
    positions: str = "last"
    funnel_rank: int | None = None
    funnel_alphas: str | None = None
    null: str = "init"
    revisions: str = ""
    save_arrays: str | None = None
    topk: int = 20
    n_perm: int | None = None
    exclude_massive: bool = False
    amplification: str = "column"

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in fields(self):
            value, hint = getattr(self, field.name), hints[field.name]
            if field.name in PRESET_VALUES["default"] and value is not None:  # None only means "from the preset"
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            check_type(field.name, value, hint)
        if self.preset not in PRESETS:
            raise InputError(f"--preset {self.preset!r} is unknown; use one of {', '.join(PRESETS)}.")
        values = PRESET_VALUES[self.preset]
        for name in ("chunks", *values):  # chunks first: "all" means the run's chunk count
            if getattr(self, name) is None:
                value = values[name]
                object.__setattr__(self, name, self.chunks if value == "all" else value)
        for name, low in (("chunks", 1), ("seq_len", 2), ("batch_size", 1), ("seed", 0), ("null_samples", 1),
                          ("null_chunks", 0), ("extras_chunks", 0), ("probe_seqs", 1), ("probe_len", 1), ("funnel_rank", 0),
                          ("topk", 1), ("n_perm", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                flag = "--" + name.replace("_", "-")
                raise InputError(f"{flag} {value!r} is invalid; pass an integer >= {low}.")
        if self.seed > MAX_SEED:  # torch.manual_seed takes 64 bits
            raise InputError(f"--seed {self.seed} is too large; pass an integer from 0 to {MAX_SEED} (2**64 - 1).")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype {self.dtype!r} is not supported; use one of {', '.join(DTYPES)}.")
        if self.save_arrays not in SAVE_ARRAYS:
            raise InputError(f"--save-arrays {self.save_arrays!r} is unknown; use one of {', '.join(SAVE_ARRAYS)}.")
        self.attention_options()  # validates the stage options
        self.jacobian_options()
        self.topology_options()
        if not self.model:
            raise InputError("--model is empty; pass --model smollm2-135m, a hub id, a folder or a .gguf file.")
        if not self.text:
            raise InputError("--text is empty; pass --text python-docs, wikitext-2 or a file path.")

    def attention_options(self) -> "AttentionOptions":
        """The attention-stage options of this configuration (validated)."""
        from .attention.analysis import AttentionOptions

        names = ("null_mode", "null_samples", "null_chunks", "extras_chunks", "certify", "probe_seqs", "probe_len")
        return AttentionOptions(**{n: getattr(self, n) for n in names}, seed=self.seed)

    def jacobian_options(self) -> "JacobianOptions":
        """The jacobian-stage options of this configuration (validated)."""
        from .jacobian.stage import MODES, JacobianOptions

        modes = MODES if self.jacobian_mode == "both" else (self.jacobian_mode,)
        revisions = tuple(r.strip() for r in self.revisions.split(",") if r.strip())
        try:
            alphas = tuple(float(a) for a in self.funnel_alphas.split(","))
        except ValueError:
            raise InputError(f"--funnel-alphas {self.funnel_alphas!r} is not a comma-separated list of numbers; "
                             "pass e.g. --funnel-alphas 0,0.5,1.") from None
        return JacobianOptions(modes=modes, positions=self.positions, funnel_rank=self.funnel_rank, alphas=alphas,
                               null=self.null, revisions=revisions, seed=self.seed, save_arrays=self.save_arrays)

    def topology_options(self) -> "TopologyOptions":
        """The topology-stage options of this configuration (validated); the amplification
        comes from the isolated operators when that mode runs, else from the first mode."""
        from .topology.stage import TopologyOptions

        modes = self.jacobian_options().modes
        return TopologyOptions(topk=self.topk, n_perm=self.n_perm, exclude_massive=self.exclude_massive,
                               amplification=self.amplification, seed=self.seed,
                               mode="isolated" if "isolated" in modes else modes[0])

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (JSON-serialisable)."""
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """A short stable hash of the configuration (16 hex digits of SHA-256)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @classmethod
    def from_sources(cls, toml_path: str | Path | None = None, **overrides: Any) -> "RunConfig":
        """Build a configuration from an optional TOML file, then explicit overrides.

        ``None`` overrides are ignored, so unset command-line flags keep the file's value.

        Raises
        ------
        InputError
            If the file is missing, a folder, unreadable, not UTF-8 or not TOML, or has unknown
            keys, values of the wrong type (checked by :func:`check_type`) or bad values.
        """
        values: dict[str, Any] = {}
        if toml_path is not None:
            path = Path(toml_path)
            try:
                values = tomllib.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise InputError(f"config file {path} does not exist; pass --config an existing TOML file.") from None
            except IsADirectoryError:
                raise InputError(f"config file {path} is a directory; pass --config a TOML file.") from None
            except UnicodeDecodeError:
                raise InputError(f"config file {path} is not UTF-8 text (a binary file?); pass --config a TOML file.") from None
            except OSError as exc:
                raise InputError(f"config file {path} cannot be read ({exc.strerror}); pass --config a readable TOML file.") from None
            except tomllib.TOMLDecodeError as exc:
                raise InputError(f"config file {path} is not valid TOML ({exc}); fix it or pass --config another file.") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown config key {unknown[0]!r}; known keys: {', '.join(sorted(known))}.")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
