"""What differs between a stored run's options and a new command's, written as the command
line gives them, and the one-line refusal to resume under other options."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..options import flag_name

__all__ = ["option_changes", "resume_refused"]


#: How many differing options a refused resume names.
_CHANGES_SHOWN = 4


def resume_refused(root: Path, changes: list[tuple[str, str]], old_hash: object, new_hash: str) -> RunError:
    """The one-line refusal to resume ``root`` under other options: the options that differ,
    old and new (:func:`option_changes`; the first :data:`_CHANGES_SHOWN`), or, when none is
    recorded by name (a sweep's stages or claims file, an older manifest), the two options hashes."""
    advice = "rerun with the options it was started with, or pass --overwrite to replace it."
    if not changes:
        return RunError(f"cannot resume {root}: it was started with other options (options hash {old_hash}, now "
                        f"{new_hash}); {advice}")
    shown = changes[:_CHANGES_SHOWN]
    more = f" (and {len(changes) - len(shown)} more)" if len(changes) > len(shown) else ""
    return RunError(f"cannot resume {root}: it was started with {', '.join(old for old, _ in shown)}, not "
                    f"{', '.join(new for _, new in shown)}{more}; {advice}")


def _flat_options(tables: Mapping[str, Any]) -> dict[str, Any]:
    """Option name -> value of the option tables of a manifest (``config``, ...): a stage's
    section (``[attention]``) by its options' own names (unique across sections), a nested
    table by ``NAME.KEY``; tuples as lists, as the manifest's JSON holds them."""
    flat: dict[str, Any] = {}
    for table in tables.values():
        for key, value in (table if isinstance(table, Mapping) else {}).items():
            if not isinstance(value, Mapping):
                flat[key] = value
                continue
            for name, item in value.items():
                if isinstance(item, Mapping):
                    flat.update({f"{name}.{k}": v for k, v in item.items()})
                else:
                    flat[name] = item
    return {name: list(value) if isinstance(value, tuple) else value for name, value in flat.items()}


def _as_given(name: str, value: Any) -> str:
    """Option ``name`` with ``value`` as the command line gives it: ``--chunks 4``,
    ``--stream-layers``, ``no --revision`` (unset, off or empty), ``--funnel-alphas 0,0.5,1``; a
    nested option (never a flag) as its config key, ``thresholds.sink = 0.5``."""
    if "." in name:
        return f"{name} = {value!r}"
    flag = flag_name(name)
    if value is True:
        return flag
    if value is None or value is False or value == [] or value == "":
        return f"no {flag}"
    shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return f"{flag} {shown!r}" if any(c.isspace() for c in shown) else f"{flag} {shown}"


def option_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The options that differ between two sets of manifest option tables (``{"config":
    config.to_dict()}``), each as ``(old, new)`` written as the command line gives it
    (:func:`_as_given`), in the order of ``new``.

    Examples
    --------
    >>> option_changes({"config": {"chunks": 4, "seed": 0, "attention": {"null_samples": 2}}},
    ...                {"config": {"chunks": 8, "seed": 0, "attention": {"null_samples": 4}}})
    [('--chunks 4', '--chunks 8'), ('--null-samples 2', '--null-samples 4')]
    """
    before, after = _flat_options(old), _flat_options(new)
    names = list(dict.fromkeys([*after, *before]))  # the stored manifest's keys are sorted
    return [(_as_given(n, before.get(n)), _as_given(n, after.get(n))) for n in names if before.get(n) != after.get(n)]
