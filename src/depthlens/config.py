"""Typed, validated run configuration, read from TOML files, command-line flags and Python.

A configuration is the run's own options (:class:`RunOptions`: model, text, chunk sizes,
seed, ...), a preset, and one options dataclass per stage (:data:`depthlens.stages.STAGES`).
In a TOML file the run's options are top-level keys and each stage's are a section::

    model = "smollm2-135m"
    chunks = 16

    [attention]
    null_samples = 4

    [jacobian]
    funnel_alphas = [0, 0.5, 1]

Option names are unique across the run and every stage, so flags (``--null-samples``) and
keyword arguments (``RunConfig(null_samples=4)``) need no section; both are generated from
the dataclass fields, and their defaults are written once, in those dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import tomllib
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import InputError
from .options import OptionField, Spelling, check_fields, check_type, flags_restated, option_choices, option_fields
from .jacobian.options import ALPHAS as JACOBIAN_ALPHAS
from .stages import STAGES

__all__ = ["DTYPES", "MAX_SEED", "OPTION_CHOICES", "PRESETS", "PRESET_VALUES", "PROMPTS_SUFFIX", "RunConfig", "RunOptions",
           "check_type", "config_file_spelling", "file_options", "is_prompts_file", "option_owner"]

DTYPES = ("float32", "float64", "bfloat16", "float16")
#: The ending of a ``--text`` value that names a prompts file (:func:`is_prompts_file`).
PROMPTS_SUFFIX = ".jsonl"
#: Largest run seed: torch.manual_seed (random models, step-0 nulls) takes 64 bits.
MAX_SEED = 2**64 - 1
PRESETS = ("quick", "default", "paper")
#: The values each preset gives the options it controls, by option name; ``default`` is every
#: option's own default. An option given explicitly (a flag, a --config key, a keyword) always
#: wins. ``"all"`` stands for the run's chunk count. ``quick`` is a smoke run without the step-0 null
#: (timings: benchmarks/RESULTS.md, bench_quick); ``paper`` the papers' protocol as docs/methods.md gives it
#: (§A3: every chunk's pseudospectral radii; §A4: S = 16 nulls per observed matrix, on every chunk; §B4: the five
#: α of the Schur split, on every checkpoint, every Schur order in both directions; §A7: every control seed at
#: every clamp dose; §B2: the self-alignment of every operator).
PRESET_VALUES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"chunks": 4, "seq_len": 32, "null_samples": 2, "null_chunks": 1, "extras_chunks": 1,
              "certify": "none", "probe_seqs": 8, "probe_len": 16, "ratio_seqs": 4, "jacobian_mode": "isolated",
              "funnel_rank": 0, "funnel_alphas": (1.0,), "n_perm": 100, "save_arrays": "none", "heldout_chunks": 1,
              "ablation_boot": 200,
              "clamp_chunks": 2, "control_seeds": 1, "clamp_null_samples": 1, "contest_chunks": 2, "contest_boot": 200,
              "contest_perm": 200, "funnel_boot": 0, "init_seeds": 1, "null": "none"},
    "paper": {"null_samples": 16, "null_chunks": "all", "extras_chunks": "all", "funnel_boot": 200,
              "funnel_alphas": JACOBIAN_ALPHAS, "funnel_curves": "every", "control_curves": "every",
              "operator_metrics": "every"},
}


@dataclass(frozen=True)
class RunOptions:
    """The run's own options: what is analysed, and how it is loaded.

    Execution options that do not change the results (output folder, resume/overwrite,
    progress bars, worker processes) are no options, so a resumed run has the same hash.

    Parameters
    ----------
    model : str
        smollm2-135m (embedded default), a hub id, a local folder, a .gguf file or
        random:<family>[:key=value,...]
    revision : str or None
        hub revision (checkpoint) of --model
    revisions : tuple of str
        comma-separated extra hub revisions of --model that the attention, jacobian and
        topology stages analyse besides it (their tables' checkpoint column names each); for
        depthlens census also a range PREFIX{START..STOP..STEP} (ends included, e.g.
        step{0..143000..1000}) or @FILE (one revision per line)
    text : str
        python-docs (default, offline), wikitext-2, a text file path, or a prompts file
        (a path ending in .jsonl: one JSON object per line, {"text": ..., "positions": [...]},
        each prompt one chunk of its own length)
    chunks : int
        number of text chunks (with a prompts file: the first N prompts, all of them when
        it has fewer)
    seq_len : int
        tokens per chunk including BOS (not used with a prompts file)
    seed : int
        the run's one seed; every unit spawns its own stream from it
    batch_size : int
        chunks per forward pass; also the size of one resumable unit
    dtype : {"float32", "float64", "bfloat16", "float16"}
        model weight dtype; the analyses are float64 regardless
    device : str
        torch device of the model
    stream_layers : bool
        keep one decoder layer's weights in memory at a time, for models larger than memory:
        a folder of *.safetensors (memory-mapped), a hub id (its snapshot, downloaded to the
        Hugging Face cache first), a GGUF file (from its converted cache) or
        random:<family>:init=layerwise; the model's
        numbers do not change (its step-0 null is drawn layer by layer)
    trust_remote_code : bool
        allow a hub model's own code to run
    """

    model: str = "smollm2-135m"
    revision: str | None = None
    revisions: tuple[str, ...] = ()
    text: str = "python-docs"
    chunks: int = field(default=32, metadata={"min": 1})
    seq_len: int = field(default=128, metadata={"min": 2})
    seed: int = field(default=0, metadata={"min": 0})
    batch_size: int = field(default=4, metadata={"min": 1})
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    stream_layers: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.seed > MAX_SEED:  # torch.manual_seed takes 64 bits
            raise InputError(f"--seed {self.seed} is too large; pass an integer from 0 to {MAX_SEED} (2**64 - 1).")
        if not self.model:
            raise InputError("--model is empty; pass --model smollm2-135m, a hub id, a folder or a .gguf file.")
        if not self.text:
            raise InputError("--text is empty; pass --text python-docs, wikitext-2, a file path or a prompts "
                             "file (.jsonl).")
        object.__setattr__(self, "revisions", tuple(self.revisions))
        _check_revisions(self.revisions, self.revision)


#: Checkpoint names the stages give weights other than an extra revision (``--revisions``).
_RESERVED = ("trained", "init")


def _check_revisions(revisions: tuple[str, ...], revision: str | None) -> None:
    """Refuse ``--revisions`` that would not name distinct checkpoints: an empty name, a
    repeat, a reserved checkpoint name, or the run's own ``--revision``.

    Raises
    ------
    InputError
        One line naming ``--revisions``.
    """
    shown = ",".join(revisions)
    bad = next((r for r in revisions if not r or r != r.strip()), None)
    if bad is not None:
        raise InputError(f"--revisions {shown!r} holds {bad!r}, which is no revision name; pass comma-separated names "
                         "without surrounding spaces, e.g. step1000,step2000.")
    if len(set(revisions)) != len(revisions):
        raise InputError(f"--revisions {shown} repeats a revision; pass each revision once.")
    reserved = next((r for r in revisions if r in _RESERVED), None)
    if reserved is not None:
        raise InputError(f"--revisions {shown} names the {reserved} checkpoint, which every run has; pass hub "
                         "revision names other than trained and init.")
    if revision is not None and revision in revisions:
        raise InputError(f"--revisions {shown} repeats --revision {revision}, the model as loaded (checkpoint "
                         f"trained); drop {revision} from --revisions.")


def is_prompts_file(text: object) -> bool:
    """Whether a ``--text`` value names a prompts file: a path ending in :data:`PROMPTS_SUFFIX`
    (any case). The rule reads the name only, never the file, so a plain text corpus is never
    taken for prompts by its contents (rename a ``.jsonl`` corpus to read it as text).

    Examples
    --------
    >>> is_prompts_file("ioi.jsonl"), is_prompts_file("python-docs"), is_prompts_file("notes.txt")
    (True, False, False)
    """
    return str(text).lower().endswith(PROMPTS_SUFFIX)


def _owners() -> dict[str, str | None]:
    """Where each option lives: ``None`` for the run's own options, else the stage's name (for
    the registry as it stands: :func:`depthlens.stages.register` adds stages)."""
    # keyed by what the map depends on, (name, options class) per stage: cheap to hash, where
    # the Stage records themselves hash every field (this runs on every option read)
    return _owners_of(tuple((stage.name, stage.options) for stage in STAGES.values()))


@functools.cache
def _owners_of(stages: tuple[tuple[str, type], ...]) -> dict[str, str | None]:
    owners: dict[str, str | None] = {f.name: None for f in option_fields(RunOptions)}
    names = {name for name, _ in stages}
    for name, options in stages:
        for f in option_fields(options):
            if f.derived is None:
                if f.name in owners or f.name in names or f.name == "preset":
                    raise TypeError(f"option {f.name} of stage {name} clashes with another option")
                owners[f.name] = name
    return owners


_owners()  # a clash among the built-in stages' options fails at import
#: The choices of every option that has them, by name (:func:`~depthlens.options.option_choices`).
OPTION_CHOICES = option_choices([RunOptions, *(stage.options for stage in STAGES.values())])


def option_owner(name: str) -> str | None:
    """The stage whose option ``name`` is (``None`` for the run's own options).

    Raises
    ------
    KeyError
        For a name that is no option.
    """
    return _owners()[name]


def _preset_value(preset: str, name: str, chunks: int) -> Any:
    value = PRESET_VALUES[preset][name]
    return chunks if value == "all" else value


def _section_values(name: str, value: Any) -> dict[str, Any]:
    """The explicit values of section ``name`` given as a mapping or an options instance."""
    cls = STAGES[name].options
    if isinstance(value, cls):
        return {f.name: getattr(value, f.name) for f in option_fields(cls) if f.derived is None}
    if isinstance(value, Mapping):
        return dict(value)
    raise InputError(f"config section [{name}] is a {type(value).__name__}; pass a table of its options.")


class RunConfig:
    """Everything that determines a run's numbers: the run's options, the preset, and every
    stage's options.

    Parameters
    ----------
    preset : {"quick", "default", "paper"}
        Gives the options of :data:`PRESET_VALUES` that are not passed explicitly.
    **values
        Options by name (``chunks=8``, ``null_samples=4``: names are unique across the run
        and the stages) or whole sections (``attention={"null_samples": 4}`` or an
        :class:`~depthlens.attention.options.AttentionOptions`). Unset options take the
        preset's value, else their default.

    Raises
    ------
    InputError
        One line for an unknown key, a value of the wrong type or out of range, naming the
        flag.

    Examples
    --------
    >>> config = RunConfig(preset="quick", null_samples=3)
    >>> config.chunks, config.null_samples, config.options("attention").null_samples
    (4, 3, 3)
    >>> config.options("topology").seed == config.seed
    True
    """

    def __init__(self, preset: str = "default", **values: Any) -> None:
        check_type("preset", preset, str)
        if preset not in PRESETS:
            raise InputError(f"--preset {preset!r} is unknown; use one of {', '.join(PRESETS)}.")
        explicit: dict[str | None, dict[str, Any]] = {None: {}, **{name: {} for name in STAGES}}
        for key, value in values.items():
            if key in STAGES:
                explicit[key].update(_section_values(key, value))
            elif key in _owners():
                explicit[_owners()[key]][key] = value
            else:
                raise InputError(_unknown_key(key, [*_owners(), *STAGES, "preset"]))
        chunks = explicit[None].get("chunks", PRESET_VALUES[preset].get("chunks", RunOptions.chunks))
        for name in PRESET_VALUES[preset]:
            owner = _owners()[name]
            explicit[owner].setdefault(name, _preset_value(preset, name, chunks))
        object.__setattr__(self, "preset", preset)
        object.__setattr__(self, "run", RunOptions(**explicit.pop(None)))
        sections = {}
        for name, given in explicit.items():
            sections[name] = _build_section(name, given)
        object.__setattr__(self, "sections", sections)
        for name in STAGES:  # derived fields resolve (e.g. the topology's Jacobian mode)
            self.options(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __getattr__(self, name: str) -> Any:
        """An option by name: ``config.chunks``, ``config.null_samples`` (its section's value)."""
        if name.startswith("_") or name not in _owners():
            raise AttributeError(name)
        owner = _owners()[name]
        return getattr(self.run if owner is None else self.sections[owner], name)

    @property
    def prompts(self) -> bool:
        """Whether ``text`` names a prompts file (:func:`is_prompts_file`): chunks are then the
        file's prompts, of their own lengths, and ``seq_len`` is not used."""
        return is_prompts_file(self.run.text)

    def options(self, stage: str) -> Any:
        """The options of ``stage`` with their derived fields filled (the run's seed, the
        topology's Jacobian mode from the jacobian section)."""
        section = self.sections[stage]
        derived = {f.name: self._resolve(f) for f in option_fields(type(section)) if f.derived is not None}
        return dataclasses.replace(section, **derived) if derived else section

    def _resolve(self, f: OptionField) -> Any:
        head, _, rest = f.derived.partition(".")
        if not rest:
            return getattr(self.run, head)
        return getattr(self.options(head), rest)

    def items(self) -> Iterator[tuple[str, Any]]:
        """Every option as ``(name, value)``, the run's first, then each stage's."""
        for f in option_fields(RunOptions):
            yield f.name, getattr(self.run, f.name)
        for name, section in self.sections.items():
            for f in option_fields(type(section)):
                if f.derived is None:
                    yield f.name, getattr(section, f.name)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain JSON-serialisable dict: the run's options and the
        preset at the top, one table per stage with options (the TOML layout)."""
        out: dict[str, Any] = {**_plain(dataclasses.asdict(self.run)), "preset": self.preset}
        for name, section in self.sections.items():
            values = {f.name: getattr(section, f.name) for f in option_fields(type(section)) if f.derived is None}
            if values:
                out[name] = _plain(values)
        return out

    def hash(self) -> str:
        """A short stable hash of the configuration (16 hex digits of SHA-256).

        The section of a stage outside ``depthlens run`` (``in_run`` false: ``lens``) enters it
        only when one of its options differs from its default. So adding such a stage leaves
        the hash of every run that does not change its options as it was, and a run made
        before it existed can take that stage with ``--resume``. An option marked
        ``metadata={"hash": False}`` (one that chooses what the report draws, such as the
        attention stage's ``heads``) never enters it."""
        values = self.to_dict()
        for name, section in self.sections.items():  # options that choose what is drawn, not what is computed
            for f in option_fields(type(section)):
                if f.metadata.get("hash") is False and isinstance(values.get(name), dict):
                    values[name].pop(f.name, None)
        for name, stage in STAGES.items():
            defaults = {f.name: f.default for f in option_fields(stage.options) if f.derived is None}
            if not stage.in_run and values.get(name) == _plain(defaults):
                del values[name]
        blob = json.dumps(values, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunConfig) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.hash())

    def __repr__(self) -> str:
        return f"RunConfig({', '.join(f'{k}={v!r}' for k, v in self.items())}, preset={self.preset!r})"

    @classmethod
    def from_sources(cls, toml_path: str | Path | None = None, **overrides: Any) -> "RunConfig":
        """Build a configuration from an optional TOML file, then explicit overrides.

        ``None`` overrides are ignored, so unset command-line flags keep the file's value.

        Raises
        ------
        InputError
            If the file is missing, a folder, unreadable, not UTF-8 or not TOML, or has unknown
            keys or sections, a stage's key outside its section, values of the wrong type
            (checked by :func:`check_type`) or bad values.
        """
        return cls.from_mapping(read_toml(Path(toml_path)) if toml_path is not None else {}, **overrides)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], **overrides: Any) -> "RunConfig":
        """Build a configuration from the contents of a config file (top-level run options,
        a ``[STAGE]`` section per stage), then explicit overrides (``None`` ones ignored).

        Raises
        ------
        InputError
            As :meth:`from_sources`, for everything but reading the file; an option the file
            gives is named by its config key (:func:`config_file_spelling`), one an override
            gives by its flag.
        """
        for key, value in values.items():
            if key not in STAGES and _owners().get(key, None) is not None:
                raise InputError(f"config key {key} belongs to the [{_owners()[key]}] section; move it there.")
            if key in STAGES and not isinstance(value, Mapping):
                raise InputError(f"config key {key} names a stage; write its options as a [{key}] section.")
        flat: dict[str, Any] = {k: v for k, v in values.items() if k not in STAGES}
        for name in STAGES:
            for key, value in values.get(name, {}).items():
                if _owners().get(key, "") != name:
                    where = "a run option (top level)" if key in _owners() and _owners()[key] is None else (
                        f"an option of [{_owners()[key]}]" if key in _owners() else "unknown")
                    keys = ", ".join(k for k, o in _owners().items() if o == name) or "(none)"
                    raise InputError(f"config key [{name}] {key} is {where}; the [{name}] keys are: {keys}.")
                flat[key] = value
        given = {k: v for k, v in overrides.items() if v is not None}
        with flags_restated(config_file_spelling(file_options(values) - set(given)), OPTION_CHOICES):
            return cls(**{**flat, **given})


def file_options(values: Mapping[str, Any]) -> set[str]:
    """The options a config file's contents ``values`` give: its top-level keys and the keys of
    its ``[STAGE]`` sections."""
    return {k for k in values if k not in STAGES} | {k for name in STAGES for k in values.get(name, {})}


def config_file_spelling(keys: Collection[str]) -> Spelling:
    """How a message names the options ``keys`` that a config file gave, for
    :func:`~depthlens.options.restate_flags`: ``config key chunks = 4`` for ``--chunks 4``,
    ``config key chunks`` for ``--chunks``; any other option keeps its flag."""

    def spelling(name: str, value: str | None) -> str | None:
        if name not in keys:
            return None
        return f"config key {name}" if value is None else f"config key {name} = {value}"

    return spelling


def _build_section(name: str, given: dict[str, Any]) -> Any:
    cls = STAGES[name].options
    fields_ = {f.name: f for f in option_fields(cls)}
    for key, value in list(given.items()):
        f = fields_.get(key)
        if f is None or f.derived is not None:
            raise InputError(f"unknown config key {key!r} of stage {name}.")
        if dataclasses.is_dataclass(f.annotation) and isinstance(value, Mapping):
            given[key] = _nested(f, value)
    return cls(**given)


def _unknown_key(key: str, known: Sequence[str]) -> str:
    """The one-line error of an unknown config key: the closest known keys when some are
    close (``did you mean``), else where the keys are listed.

    Examples
    --------
    >>> _unknown_key("null_sample", ["null_samples", "null_chunks", "seed"])
    "unknown config key 'null_sample'; did you mean null_samples? (depthlens run --help lists every key)"
    """
    close = difflib.get_close_matches(str(key), list(known), n=3, cutoff=0.6)
    where = "depthlens run --help lists every key"
    return f"unknown config key {key!r}; " + (f"did you mean {' or '.join(close)}? ({where})" if close else where)


def _nested(f: OptionField, value: Mapping[str, Any]) -> Any:
    """A nested options table (``[attention.thresholds]``) as its dataclass, type-checked."""
    known = {g.name: g for g in option_fields(f.annotation)}
    for key, item in value.items():
        if key not in known:
            raise InputError(f"unknown config key {f.name}.{key}; known: {', '.join(known)}.")
        check_type(f"{f.name}.{key}", item, known[key].annotation)
    return f.annotation(**value)


def _plain(value: Any) -> Any:
    """Tuples as lists and dataclasses as tables, recursively (the JSON and TOML form)."""
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def read_toml(path: Path, what: str = "config file", flag: str = "--config") -> dict[str, Any]:
    """The TOML file ``path`` as a dict; one-line errors call it ``what`` and name ``flag``,
    the option that gave it.

    Raises
    ------
    InputError
        A missing, unreadable, non-UTF-8 or non-TOML file, or a folder.
    """
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist; pass {flag} an existing TOML file.") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a directory; pass {flag} a TOML file.") from None
    except UnicodeDecodeError:
        raise InputError(f"{what} {path} is not UTF-8 text (a binary file?); pass {flag} a TOML file.") from None
    except OSError as exc:
        raise InputError(f"{what} {path} cannot be read ({exc.strerror}); pass {flag} a readable TOML file.") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{what} {path} is not valid TOML ({exc}); fix it or pass {flag} another file.") from None
