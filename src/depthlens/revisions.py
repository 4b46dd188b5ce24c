"""A checkpoint series: which checkpoints a census visits, in training order.

A series is one of

- a local folder of checkpoints (``step-N`` sub-folders, as ``depthlens train`` writes them);
- a hub model with a list or range of revisions: ``--revisions step1000,step2000`` or
  ``--revisions 'step{0..143000..1000}'`` (Pythia's ``stepN``, OLMo's ``stageX-stepN-...``);
- a text file listing revisions, one per line (``#`` starts a comment), given as
  ``--revisions @FILE``.

The training step of a checkpoint is read from its name (the number after the last ``step``);
checkpoints are visited in step order when every name has one, else in the order given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

__all__ = ["Checkpoint", "expand_revisions", "label_of", "resolve_series", "step_of"]

_STEP = re.compile(r"step[-_]?(\d+)", re.IGNORECASE)
_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.(\d+))?\}")
#: Most revisions one range may expand to (a typo like step{0..1000000} should not queue a million loads).
MAX_RANGE = 10_000


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a series.

    Parameters
    ----------
    label : str
        Its name in the census tables and its sub-run folder (filename-safe).
    spec : str
        The model spec to load (``--model``).
    revision : str or None
        The revision of ``spec`` (a hub revision or a ``step-N`` folder of a local series).
    step : int or None
        Its training step, when its name carries one.
    """

    label: str
    spec: str
    revision: str | None
    step: int | None


def step_of(name: str) -> int | None:
    """The training step in a checkpoint name: the number after its last ``step``.

    Examples
    --------
    >>> step_of("step-1000"), step_of("stage1-step2000-tokens9B"), step_of("main")
    (1000, 2000, None)
    """
    found = _STEP.findall(name)
    return int(found[-1]) if found else None


def label_of(name: str) -> str:
    """A filename-safe label for a revision name (``/`` and other odd characters become ``_``).

    Examples
    --------
    >>> label_of("stage1-step2000-tokens9B"), label_of("refs/pr/1")
    ('stage1-step2000-tokens9B', 'refs_pr_1')
    """
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


def expand_revisions(items: tuple[str, ...] | list[str]) -> list[str]:
    """Revisions from ``--revisions`` items: each item is a name, a brace range
    ``PREFIX{START..STOP}SUFFIX`` or ``PREFIX{START..STOP..STEP}SUFFIX`` (both ends included),
    or ``@FILE``, a file listing names one per line (blank lines and ``#`` comments skipped).
    Repeats are dropped, the first kept.

    Raises
    ------
    InputError
        A range that is empty, decreasing or larger than :data:`MAX_RANGE`; braces that are no
        range (``step{0..}``); an unreadable file.

    Examples
    --------
    >>> expand_revisions(["step{0..3000..1000}", "main"])
    ['step0', 'step1000', 'step2000', 'step3000', 'main']
    """
    out: list[str] = []
    for item in items:
        item = item.strip()
        if item.startswith("@"):
            names = _read_list(Path(item[1:]))
        else:
            names = _expand_range(item)
        for name in names:
            if name and name not in out:
                out.append(name)
    return out


def _expand_range(item: str) -> list[str]:
    match = _RANGE.search(item)
    if match is None:
        if "{" in item or "}" in item:  # a range with a typo (step{0..}, step{0-1000}) is no revision name
            raise InputError(f"--revisions {item!r} is not a range; write PREFIX{{START..STOP}} or "
                             "PREFIX{START..STOP..STEP} with whole numbers, e.g. step{0..143000..1000}.")
        return [item]
    start, stop, stride = int(match.group(1)), int(match.group(2)), int(match.group(3) or 1)
    if stride < 1 or stop < start:
        raise InputError(f"--revisions range {item!r} is empty; write PREFIX{{START..STOP..STEP}} with "
                         "START <= STOP and STEP >= 1, e.g. step{0..143000..1000}.")
    count = (stop - start) // stride + 1
    if count > MAX_RANGE:
        raise InputError(f"--revisions range {item!r} expands to {count} revisions, more than {MAX_RANGE}; "
                         "pass a larger STEP.")
    head, tail = item[: match.start()], item[match.end():]
    return [f"{head}{k}{tail}" for k in range(start, stop + 1, stride)]


def _read_list(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise InputError(f"--revisions @{path}: cannot read the revision list ({reason}); "
                         "pass a text file with one revision per line.") from None
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    names = [n for n in names if n]
    if not names:
        raise InputError(f"--revisions @{path} lists no revision; write one revision per line.")
    return names


def resolve_series(model: str, revisions: tuple[str, ...] | list[str] = ()) -> list[Checkpoint]:
    """The checkpoints of the series ``model`` (a local folder of checkpoints or a hub id) with
    the ``--revisions`` items ``revisions``, in training order.

    A local series without ``revisions`` visits every checkpoint it holds; with them, the
    named ones. A hub id needs ``revisions``.

    Raises
    ------
    InputError
        No series (a hub id without revisions, a folder that is no series, another spec),
        or a revision a local series does not hold.
    """
    names = expand_revisions(revisions)
    path = Path(model).expanduser()
    if path.is_dir():
        from .models import series_checkpoints

        if (path / "config.json").is_file():
            raise InputError(f"--model {model} is a single checkpoint, not a series; pass the folder holding its "
                             "step-N checkpoints (as depthlens train writes them).")
        held = [name for name, _ in series_checkpoints(path)]
        if not held:
            raise InputError(f"--model {model} holds no step-N checkpoints; pass a folder written by "
                             "depthlens train, or a hub id with --revisions.")
        unknown = [n for n in names if n not in held]
        if unknown:
            raise InputError(f"--revisions {unknown[0]} is not a checkpoint of {model}; it holds "
                             f"{', '.join(held)}.")
        chosen = names or held
        return _ordered([Checkpoint(label_of(n), model, n, step_of(n)) for n in chosen])
    from .models.loading import spec_source

    if spec_source(model) != "hub":
        raise InputError(f"--model {model!r} is no checkpoint series; pass a folder written by depthlens train, "
                         "or a hub id with --revisions.")
    if not names:
        raise InputError(f"--model {model} is a hub id; name its checkpoints with --revisions, e.g. "
                         "--revisions 'step{0..143000..10000}' or --revisions @revisions.txt.")
    return _ordered([Checkpoint(label_of(n), model, n, step_of(n)) for n in names])


def _ordered(points: list[Checkpoint]) -> list[Checkpoint]:
    """``points`` in step order when each has a step, else as given."""
    labels = [p.label for p in points]
    if len(set(labels)) != len(labels):
        twice = next(label for label in labels if labels.count(label) > 1)
        raise InputError(f"two revisions map to the checkpoint label {twice!r}; name each revision once.")
    if all(p.step is not None for p in points):
        return sorted(points, key=lambda p: p.step)
    return points
