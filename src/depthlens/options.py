"""Option dataclasses: type checks, limits, help texts and command-line flags, written once.

Every stage declares its options as a frozen dataclass whose numpy-style docstring documents
each field. This module turns such a class into what the rest of depthlens needs:

- :func:`check_fields` refuses a value of the wrong type (:func:`check_type`) or below its
  field's ``min``, naming the flag;
- :func:`field_help` reads a field's help text from the class docstring;
- :func:`add_flags` adds one command-line flag per field to an ``argparse`` group
  (``--null-samples`` for ``null_samples``; choices from ``Literal`` types; comma-separated
  lists for tuple fields), and :func:`flag_values` reads them back in the fields' types;
- :func:`restate_flags` (and :func:`flags_restated`, for the errors of a block) words the
  flags an error message names as the caller gave those options: a config file's keys, the
  Python API's keyword arguments. Messages name flags; whoever takes options another way
  restates them, with one spelling of its own.

Field metadata (``dataclasses.field(metadata=...)``):

- ``min``: the smallest value a number may take;
- ``derived``: a dotted path (``"seed"``, ``"jacobian.funnel_mode"``) the run configuration
  fills the field from; such a field is neither a flag nor a config key;
- ``flag``: ``False`` for a field that is a config key but no flag.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any

from .errors import DepthlensError, InputError

__all__ = ["CommandParser", "OptionField", "Spelling", "add_flags", "check_distinct", "check_fields", "check_type", "field_help",
           "flag_name", "flag_values", "flags_restated", "option_choices", "option_fields", "parse_flag",
           "restate_flags"]

_TYPE_NAMES = {bool: "a boolean (true or false, unquoted)", int: "an integer", float: "a number",
               str: "a string (quoted)", type(None): "absent"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings (quoted)"}
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
          tuple: "a list", dict: "a table", type(None): "absent"}


def flag_name(name: str) -> str:
    """The command-line flag of option ``name``: ``--null-samples`` for ``null_samples``."""
    return "--" + name.replace("_", "-")


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
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, annotation)
    raise TypeError(f"config type {annotation!r} has no check")  # a new field type needs a rule here


def _choices(annotation: Any) -> tuple[Any, ...]:
    """The choices of a ``Literal`` type, of ``X | None``, or of the items of a list of one."""
    base = _base(annotation)
    if typing.get_origin(base) in (tuple, list):
        base = _base(typing.get_args(base)[0])
    return typing.get_args(base) if typing.get_origin(base) is typing.Literal else ()


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
        accepted), ``str``, ``X | None``, ``tuple[str, ...]``/``list[str]`` (a TOML array),
        ``Literal[...]`` (a choice) or a dataclass.

    Raises
    ------
    InputError
        Naming the flag, the value and the expected type (a choice of the right kind that is
        not listed, alone or in a list: the flag, that value and the choices); a nested key
        (``thresholds.sink``), which is no flag, as its config key. Whoever took the value
        from a config file or a keyword argument restates the flag (:func:`restate_flags`).
        The string ``"false"`` for a boolean is refused, never read as true.

    Examples
    --------
    >>> check_type("exclude_massive", False, bool)
    >>> check_type("exclude_massive", "false", bool)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    depthlens.errors.InputError: --exclude-massive 'false' is a string, expected a boolean ...
    """
    if not _matches(value, annotation):
        flagged = "." not in name and not dataclasses.is_dataclass(annotation)  # a nested table has no flag
        what = flag_name(name) if flagged else f"config key {name} ="
        choices = _choices(annotation)
        many = isinstance(value, (tuple, list)) and typing.get_origin(_base(annotation)) in (tuple, list)
        unknown = [v for v in (value if many else [value]) if not any(type(v) is type(c) and v == c for c in choices)]
        if choices and unknown and all(any(type(v) is type(c) for c in choices) for v in unknown):  # not listed
            raise InputError(f"{what} {unknown[0]!r} is unknown; use {'a list of' if many else 'one of'} "
                             f"{', '.join(map(str, choices))}.")
        kind = _KINDS.get(type(value), f"a {type(value).__name__}")
        raise InputError(f"{what} {value!r} is {kind}, expected {_describe(annotation)}.")


class OptionField(typing.NamedTuple):
    """One field of an options dataclass, with its resolved type."""

    name: str
    annotation: Any
    default: Any
    metadata: typing.Mapping[str, Any]

    @property
    def derived(self) -> str | None:
        """The dotted path the run configuration fills this field from, or None."""
        return self.metadata.get("derived")

    @property
    def is_flag(self) -> bool:
        """Whether the field has a command-line flag."""
        return self.derived is None and self.metadata.get("flag", True) and not dataclasses.is_dataclass(self.annotation)


def option_fields(cls: type) -> Iterator[OptionField]:
    """The fields of the options dataclass ``cls`` in declaration order, types resolved."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        yield OptionField(f.name, hints[f.name], default, f.metadata)


def check_fields(obj: Any) -> None:
    """Check every field of the options dataclass instance ``obj``: its type
    (:func:`check_type`) and its ``min`` metadata.

    Raises
    ------
    InputError
        One line naming the flag (or the key) and what works.
    """
    for f in option_fields(type(obj)):
        value = getattr(obj, f.name)
        check_type(f.name, value, f.annotation)
        low = f.metadata.get("min")
        if low is not None and value is not None and value < low:
            what = flag_name(f.name) if f.is_flag else f"{f.name} ({type(obj).__name__})"
            raise InputError(f"{what} {value!r} must be at least {low}.")


def check_distinct(obj: Any, name: str, choices: typing.Sequence[str]) -> tuple[str, ...]:
    """Field ``name`` of the frozen options instance ``obj``, a list of ``choices``, set to a
    tuple once checked to be non-empty and free of repeats (the type check has already refused
    values outside ``choices``).

    Raises
    ------
    InputError
        One line naming the flag and the choices.
    """
    values = tuple(getattr(obj, name))
    object.__setattr__(obj, name, values)
    if not values or len(set(values)) != len(values):
        shown = ",".join(values) or "(none)"
        raise InputError(f"{flag_name(name)} {shown} is invalid; pass distinct values of {','.join(choices)}.")
    return values


def option_choices(classes: Iterable[type]) -> dict[str, tuple[str, ...]]:
    """The choices of every option of the options ``classes`` that has them (a ``Literal``
    type, or a list of one), by option name, for :func:`restate_flags`."""
    return {f.name: tuple(map(str, _choices(f.annotation))) for cls in classes for f in option_fields(cls)
            if _choices(f.annotation)}


#: How a caller names an option that a message names by its flag: ``spelling(name, value)``
#: gets the option's name (``seq_len`` for ``--seq-len``) and the value written after the flag
#: (None when none is) and returns the words for both, or None to keep the flag as it is.
Spelling = Callable[[str, str | None], str | None]
#: A flag in a message (``--seq-len``) and what follows it: a quoted string whole, else the
#: next word (up to a space, ``;``, or a comma followed by a space).
_FLAG_IN_TEXT = re.compile(r"(?<![\w-])--(?P<flag>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?![\w-])"
                           r"(?P<after> (?:'[^']*'|\"[^\"]*\"|[^\s;,'\"]|,(?=\S))+)?")
#: A word after a flag that is its value, not the sentence's next word: ``True``, ``False`` or
#: ``None``, or it starts with a quote, a digit, a sign, a bracket or a path character, or holds
#: a digit, ``=``, ``:``, ``/``, ``_``, ``.``, ``,``, ``@`` or a hyphen between letters
#: (``python-docs``).
_VALUE_LIKE = re.compile(r"(?!--)(?:(?:True|False|None)$|['\"\[{@~/.\d-]|.*(?:[\d=:/_.,@]|\w-\w))")


def restate_flags(message: str, spelling: Spelling, choices: Mapping[str, Collection[str]] | None = None) -> str:
    """``message`` with each flag it names, and the value after it, worded by ``spelling``
    (:data:`Spelling`), for a caller who gave the options another way.

    The word after a flag is taken as its value when it looks like one (a number, a quoted
    string, a path, a spec) or is one of the option's ``choices`` (option name -> choices,
    :func:`option_choices`); the sentence's punctuation after it stays.

    Examples
    --------
    >>> keyword = lambda name, value: f"{name}=" if value is None else f"{name}={value}"
    >>> restate_flags("--seq-len 1 is too short; pass --seq-len 2 or more, or another --out.", keyword)
    'seq_len=1 is too short; pass seq_len=2 or more, or another out=.'
    >>> restate_flags("use --executor local", keyword, {"executor": ("local", "ray")})
    'use executor=local'
    """
    known = choices or {}

    def restated(match: re.Match[str]) -> str:
        name, after = match["flag"].replace("-", "_"), match["after"] or ""
        word, tail = after[1:], ""
        while word.endswith(".") or (word.endswith(")") and word.count(")") > word.count("(")):
            word, tail = word[:-1], word[-1] + tail
        value = word if word and (_VALUE_LIKE.match(word) or word in known.get(name, ())) else None
        words = spelling(name, value)
        if words is None:
            return match[0]
        return words + (tail if value is not None else after)

    return _FLAG_IN_TEXT.sub(restated, message)


@contextlib.contextmanager
def flags_restated(spelling: Spelling, choices: Mapping[str, Collection[str]] | None = None) -> Iterator[None]:
    """Word the flags in the message of a :class:`~depthlens.errors.DepthlensError` raised in
    the ``with`` body (or the decorated function) by ``spelling`` (:func:`restate_flags`); the
    error keeps its type and attributes."""
    try:
        yield
    except DepthlensError as exc:
        exc.args = (restate_flags(str(exc), spelling, choices),)
        raise


def _docstring_params(doc: str) -> dict[str, str]:
    """Parameter name → description from a numpy-style ``Parameters`` section."""
    out: dict[str, str] = {}
    lines = (doc or "").expandtabs().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Parameters") + 2
    except StopIteration:
        return out
    names: list[str] = []
    for line in lines[start:]:
        stripped = line.strip()
        if stripped and set(stripped) == {"-"}:  # the next section's underline
            break
        match = re.match(r"^ {4}(\w[\w, ]*?)\s*(?::.*)?$", line)
        if match and not line.startswith(" " * 8):
            names = [n.strip() for n in match.group(1).split(",")]
            for name in names:
                out[name] = ""
        elif stripped and names:
            for name in names:
                out[name] = (out[name] + " " + stripped).strip()
    return {k: v for k, v in out.items() if k}


def field_help(cls: type, name: str) -> str:
    """The help text of field ``name`` of ``cls``: its description in the class docstring.

    Raises
    ------
    KeyError
        When the docstring does not describe the field (every option must be documented).
    """
    return _docstring_params(cls.__doc__ or "")[name]


def _base(annotation: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def parse_flag(text: str, annotation: Any) -> tuple[Any, ...]:
    """The value of a list flag's ``text`` (``0,0.5,1``) for a tuple field of type
    ``annotation``: its comma-separated items in the item type (numbers) or as strings.

    Raises
    ------
    InputError
        For an item that is not a number when the items are numbers.

    Examples
    --------
    >>> parse_flag("0,0.5,1", tuple[float, ...])
    (0.0, 0.5, 1.0)
    >>> parse_flag("step1, step2", tuple[str, ...])
    ('step1', 'step2')
    """
    item = _base(typing.get_args(_base(annotation))[0])
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    try:
        return tuple(item(p) for p in parts) if item in (int, float) else parts
    except ValueError:
        raise InputError(f"{text!r} is not a comma-separated list of {_PLURALS.get(item, 'values')}; "
                         "pass e.g. 0,0.5,1.") from None


def add_flags(group: Any, cls: type, help_suffix: typing.Callable[[str], str] | None = None) -> None:
    """Add a flag for every flag field of options class ``cls`` to ``group`` (an ``argparse``
    parser or group). Flags default to ``None`` (unset: the config file, the preset or the
    field's default gives the value); their help is the docstring's description of the
    field, with ``help_suffix(name)`` appended in parentheses when it is not empty (e.g. the
    preset values).
    """
    for f in option_fields(cls):
        if not f.is_flag:
            continue
        text = field_help(cls, f.name)
        suffix = help_suffix(f.name) if help_suffix is not None else ""
        if suffix:
            text = f"{text} ({suffix})"
        text = text.replace("%", "%%")
        base = _base(f.annotation)
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": text}
        if base is bool:
            kwargs["action"] = "store_true"
        elif typing.get_origin(base) is typing.Literal:
            kwargs["choices"] = typing.get_args(base)
        elif typing.get_origin(base) in (tuple, list):
            kwargs["metavar"] = "LIST"  # parsed by flag_values, so a bad list gets a one-line error
        else:
            kwargs["type"] = base
            kwargs["metavar"] = f.name.upper()
        group.add_argument(flag_name(f.name), **kwargs)


def flag_values(args: argparse.Namespace, classes: typing.Iterable[type]) -> dict[str, Any]:
    """The values of every flag of the options ``classes`` in parsed ``args``, in their
    fields' types (``None`` for an unset flag); list flags are parsed by :func:`parse_flag`.

    Raises
    ------
    InputError
        For a list flag whose items are not of the field's item type, naming the flag.
    """
    out: dict[str, Any] = {}
    for cls in classes:
        for f in option_fields(cls):
            if not f.is_flag:
                continue
            value = getattr(args, f.name, None)
            if isinstance(value, str) and typing.get_origin(_base(f.annotation)) in (tuple, list):
                try:
                    value = parse_flag(value, f.annotation)
                except InputError as exc:
                    raise InputError(f"{flag_name(f.name)} {exc}") from None
            out[f.name] = value
    return out


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (exit status 2): what is wrong, the flag
    meant where one is close (``--seq-lenn``: ``--seq-len``), and which help to read. Its
    subcommands' parsers are of its class (argparse's default), so they say the same."""

    def parse_args(self, args: Iterable[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """The arguments parsed; words no parser knows are refused by the parser of the
        command they follow, which names its flags and its help."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            command = next((a.choices[getattr(parsed, a.dest)] for a in subs
                            if getattr(parsed, a.dest, None) in a.choices), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message: str) -> typing.NoReturn:
        """Print ``message`` on one line, with the closest flag to an unknown one, and exit 2."""
        if message.startswith("unrecognized arguments: "):
            known = [o for a in self._actions for o in a.option_strings]
            words = [w.split("=")[0] for w in message.split(": ", 1)[1].split() if w.startswith("-")]
            close = [m for w in words for m in difflib.get_close_matches(w, known, n=1)]
            message += f" (did you mean {close[0]}?)" if close else ""
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")
