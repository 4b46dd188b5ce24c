"""Run every benchmark in this folder (``make bench``); each prints ratios against the
naive method measured in the same run. ``python benchmarks/run_all.py NAME ...`` runs a subset
(``NAME`` as in ``bench_NAME.py``). Each script runs in its own process, so the thread
settings it makes before importing numpy take effect and memory does not accumulate.

What each benchmark prints is shown as it runs and kept: at the end ``benchmarks/RESULTS.md``
gets one section per benchmark that ran (its output, wall time, exit status, date and machine),
and the sections of the benchmarks that did not run stay as they were (:mod:`_results`).
``--no-results`` leaves the file alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from _results import RESULTS, Section, clean_output, machine_description, now, write_results

HERE = Path(__file__).resolve().parent


def run_one(script: Path) -> tuple[int, float, str]:
    """Run one benchmark script, echoing what it prints; returns its exit status, wall seconds
    and the printed text (stdout and stderr interleaved, as a terminal shows them)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    captured = bytearray()
    while chunk := proc.stdout.read1(4096):
        captured += chunk
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
    status = proc.wait()
    return status, time.perf_counter() - start, captured.decode("utf-8", errors="replace")


def _load() -> str:
    """The load average when a benchmark starts: other work on the cores slows every timing."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average: unknown"
    return f"load average at start: {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def main(argv: list[str]) -> int:
    """Run the benchmarks named in ``argv`` (all without names) and update RESULTS.md."""
    write = "--no-results" not in argv
    names = [a for a in argv if a != "--no-results"]
    scripts = sorted(HERE.glob("bench_*.py"))
    known = {s.stem.removeprefix("bench_") for s in scripts}
    unknown = sorted(set(names) - known)
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    machine = machine_description() if write else ""
    failed, ran = [], []
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        print(f"\n=== {script.stem} ===", flush=True)
        date, load = now(), _load()
        status, seconds, output = run_one(script)
        if status != 0:
            failed.append(script.stem)
        print(f"--- {script.stem}: {seconds:.1f} s", flush=True)
        ran.append(Section(name, date, f"{machine}\n{load}", seconds, status, clean_output(output)))
        if write:  # after each benchmark, so an interrupted `make bench` keeps what it measured
            write_results(ran, RESULTS)
    if write:
        print(f"results: {RESULTS}", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
