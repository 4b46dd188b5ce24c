"""``benchmarks/RESULTS.md``: what the benchmarks printed, one section per benchmark, written by
``run_all.py`` (``make bench``) and never by hand.

Each section holds the benchmark's output, its wall time, exit status, the date it ran and the
machine it ran on (CPU model, cores, BLAS libraries and threads: ``depthlens doctor``'s
environment lines). A run of a subset (``python benchmarks/run_all.py quick startup``) replaces
the sections of the benchmarks it ran and keeps every other section as it was, so the file
always says, per benchmark, when and where its numbers were measured.

A section is delimited by ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` lines; the text
above the first section (title and index) is regenerated on every write.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["RESULTS", "Section", "clean_output", "machine_description", "merge", "now", "parse_sections",
           "render_section", "write_results"]

#: The file ``make bench`` writes.
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_BLOCK = re.compile(r"^<!-- bench:(?P<name>[A-Za-z0-9_]+) -->\n(?P<body>.*?)^<!-- /bench:(?P=name) -->\n?",
                    re.S | re.M)
_SUMMARY = re.compile(r"^Run (?P<date>.+?), wall (?P<wall>[0-9.]+) s, exit status (?P<status>-?\d+)\.$", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_HEADER = """# Benchmark results

Written by `make bench` (`python benchmarks/run_all.py`), or for some benchmarks by
`python benchmarks/run_all.py NAME ...`, which replaces only their sections; do not edit by hand.
Each section is one benchmark's printed output with the date, wall time and machine of its run:
numbers from different sections may come from different machines and days.
"""


@dataclass(frozen=True)
class Section:
    """One benchmark's run: ``name`` as in ``bench_NAME.py``, ``date`` (UTC, ``YYYY-MM-DD
    HH:MM UTC``), ``machine`` (lines describing CPU, cores and BLAS), ``seconds`` (wall time),
    ``status`` (exit status) and ``output`` (stdout and stderr as printed)."""

    name: str
    date: str
    machine: str
    seconds: float
    status: int
    output: str


def now() -> str:
    """The current time as a section's ``date``."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def clean_output(raw: str) -> str:
    """Printed text as a terminal would leave it: ANSI escapes removed and each line only what
    follows its last carriage return (progress bars redraw a line with ``\\r``)."""
    lines = [_ANSI.sub("", line).split("\r")[-1].rstrip() for line in raw.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def _fence(text: str) -> str:
    """A backtick fence longer than any run of backticks in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def render_section(section: Section) -> str:
    """The markdown of one section, delimited by its ``<!-- bench:NAME -->`` markers."""
    output = section.output.strip("\n") or "(no output)"
    fence, machine_fence = _fence(output), _fence(section.machine)
    return (f"<!-- bench:{section.name} -->\n"
            f"## `bench_{section.name}`\n\n"
            f"Run {section.date}, wall {section.seconds:.1f} s, exit status {section.status}.\n\n"
            f"Machine:\n\n{machine_fence}text\n{section.machine.strip() or 'unknown'}\n{machine_fence}\n\n"
            f"Output:\n\n{fence}text\n{output}\n{fence}\n"
            f"<!-- /bench:{section.name} -->\n")


def parse_sections(text: str) -> dict[str, str]:
    """Benchmark name → its section's markdown (markers included), as found in ``text``."""
    return {m.group("name"): m.group(0).rstrip("\n") + "\n" for m in _BLOCK.finditer(text)}


def _index(sections: Mapping[str, str]) -> str:
    rows = ["| benchmark | run | wall | exit status |", "|---|---|---|---|"]
    for name, block in sections.items():
        found = _SUMMARY.search(block)
        date, wall, status = (found.group("date"), f"{found.group('wall')} s", found.group("status")) if found \
            else ("?", "?", "?")
        rows.append(f"| [`bench_{name}`](#bench_{name}) | {date} | {wall} | {status} |")
    return "\n".join(rows)


def merge(existing: str | None, ran: Iterable[Section]) -> str:
    """The text of RESULTS.md after a run: the sections of ``existing`` (None: no file yet), the
    sections of the benchmarks in ``ran`` replaced by (or added as) their new ones, in name
    order, under a regenerated title and index."""
    sections = parse_sections(existing or "")
    sections.update({s.name: render_section(s) for s in ran})
    ordered = dict(sorted(sections.items()))
    body = "\n".join(ordered.values())
    return f"{_HEADER}\n{_index(ordered)}\n\n{body}"


def write_results(ran: Iterable[Section], path: Path = RESULTS) -> Path:
    """Merge ``ran`` into the file at ``path`` (:func:`merge`) and write it atomically."""
    existing = path.read_text(encoding="utf-8") if path.is_file() else None
    text = merge(existing, list(ran))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def machine_description(python: str = sys.executable) -> str:
    """This machine as ``depthlens doctor`` describes it (CPU model and cores, BLAS libraries,
    kernels and threads, package versions), from a child process so this one stays light;
    ``unknown (why)`` when that fails."""
    code = ("from depthlens.environment import environment_block, format_environment; "
            "print(format_environment(environment_block()))")
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({type(exc).__name__}: {exc})"
    if done.returncode != 0:
        return f"unknown ({(done.stderr.strip().splitlines() or ['no message'])[-1]})"
    return done.stdout.strip()
