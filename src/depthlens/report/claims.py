"""Pre-registered claims and their verdicts.

A claims file is TOML with one ``[[claim]]`` table per claim::

    [[claim]]
    id = "A2-eig-gap-model"                       # unique; letters, digits, '-', '_', '.'
    prediction = "One sentence saying what should hold."
    statistic = "eig_gap_e1_model_final"          # a name in STATISTICS
    test = ">="                                   # one of >=, <=, >, <, between
    threshold = 7.0                               # a number, or [lo, hi] for between
    inconclusive_band = [5.0, 7.0]                # optional: [lo, hi] or [[lo, hi], ...]
    falsifier = "One sentence saying what would refute it."
    source = "Which paper figure it comes from."
    min_chunks = 6                                # optional: minimum sample, one min_UNIT per unit
    protocol = "How it is measured (§A4)." # optional: the operationalisation, citing docs/methods.md
    descriptive = ["eig_gap_e1_model_final"]      # optional: statistics reported beside, no verdict
    [[claim.variant]]                             # optional, repeated: a sensitivity variant
    name = "second eigenvalue prediction"         #   what it changes
    statistic = "eig_gap_e2_contrast"             #   a statistic under the claim's own test

Sensitivity: every variant gets its own value and verdict under the claim's test, threshold
and band (``sensitivity`` in the result); a decisive verdict (supported or falsified) that
changes under a variant that could be computed is ``fragile``.

Minimum samples: ``min_UNIT = N`` (an integer ≥ 1) for any unit in :data:`SAMPLE_UNITS` that
the claim's statistic knows how to count (``Statistic.samples``: chunks, chunks with null
samples, matrices, routing or sink heads, boundaries, permutations), counted from the run's
tables, summaries and manifest. A claim whose inputs are present but whose sample is below
any declared minimum is ``inconclusive`` with ``underpowered: true`` and the reason
``underpowered (n = 2 chunks, needs 6)``, whatever its value; a count the run does not
record (``n`` unknown) does not block the verdict.

Verdicts (never dropped; every claim of the file gets one):

``not tested``
    The statistic's inputs are missing: its stage did not run or failed, or the table lacks
    the rows or columns it needs (e.g. no null samples, no ``init`` checkpoint).
``inconclusive``
    The inputs are there but too few to decide (the statistic is NaN: no routing heads, no
    funnel to remove, ...), the sample is below a declared minimum (underpowered), or the
    value fails the test but lies inside the inconclusive
    band (closed intervals): the band turns near misses into ``inconclusive`` rather than
    ``falsified`` and never overrides a passed test.
``supported`` / ``falsified``
    The value passes / fails the test.

The statistics themselves live in :mod:`depthlens.report.statistics`; this module is the
verdict engine: it reads claims files, computes each claim's statistic and sample sizes, and
gives the verdicts.
"""

from __future__ import annotations

import hashlib
import math
import re
import tomllib
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any


from ..errors import InputError
from ..runs.atomic import write_json
from .statistics import (SAMPLE_UNITS, STATISTICS, Estimate, compute_estimate, compute_statistic, needs_of,
                         note_of)
from ..runs.tables import RunTables
from .verdict_text import CLAIMS_JSON, fmt

#: The verdicts, in the order the report explains them.
VERDICTS = ("supported", "falsified", "inconclusive", "not tested")
#: Comparison tests a claim may use.
TESTS = (">=", "<=", ">", "<", "between")
#: The run's own copy of the claims file, written when the run registers it (``depthlens
#: report RUN`` scores against it by default).
CLAIMS_COPY = "claims.toml"
_FIELDS = {"id", "prediction", "statistic", "test", "threshold", "falsifier", "source", "inconclusive_band",
           "protocol", "descriptive", "variant", *(f"min_{unit}" for unit in SAMPLE_UNITS)}
_VARIANT_FIELDS = {"name", "statistic", "note"}
_REQUIRED = ("id", "prediction", "statistic", "test", "threshold", "falsifier", "source")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Variant:
    """A sensitivity variant of a claim: ``statistic`` under the claim's own test."""

    name: str
    statistic: str
    note: str = ""


@dataclass(frozen=True)
class Claim:
    """One pre-registered claim (see the module docstring for the fields)."""

    id: str
    prediction: str
    statistic: str
    test: str
    threshold: float | tuple[float, float]
    falsifier: str
    source: str
    inconclusive_band: tuple[tuple[float, float], ...] = field(default=())
    #: ``(unit, minimum)`` pairs from the ``min_UNIT`` fields, units of :data:`SAMPLE_UNITS`.
    min_sample: tuple[tuple[str, int], ...] = field(default=())
    #: How the statistic is measured, citing the section of docs/methods.md it follows.
    protocol: str = ""
    #: Statistics reported beside the verdict, without one of their own.
    descriptive: tuple[str, ...] = field(default=())
    #: Sensitivity variants: the same test on another operationalisation a careful reader would
    #: try.
    variants: tuple[Variant, ...] = field(default=())

    def criterion(self) -> str:
        """The test as text, e.g. ``≥ 7`` or ``in [1.5, 3]``."""
        if self.test == "between":
            lo, hi = self.threshold  # type: ignore[misc]
            return f"in [{fmt(lo)}, {fmt(hi)}]"
        sym = {">=": "≥", "<=": "≤", ">": ">", "<": "<"}[self.test]
        return f"{sym} {fmt(self.threshold)}"  # type: ignore[arg-type]


def default_claims_path() -> Path:
    """Path of the packaged ``default_claims.toml``."""
    return Path(str(resources.files(__package__).joinpath("default_claims.toml")))


def claims_hash(path: str | Path | None = None) -> str:
    """sha256 (hex) of the claims file's bytes (the packaged default when ``path`` is None)."""
    return hashlib.sha256(Path(path or default_claims_path()).read_bytes()).hexdigest()


def load_claims(path: str | Path | None = None) -> list[Claim]:
    """Read and strictly validate a claims file (the packaged default when ``path`` is None).

    Raises
    ------
    InputError
        One line naming the claim and the problem: unreadable file, invalid TOML, no
        ``[[claim]]`` tables, an unknown top-level key, a missing or unknown field, a
        duplicate id, an unknown statistic, a bad test, threshold or inconclusive band, a
        minimum sample that is not a positive integer or names a unit its statistic does
        not count.
    """
    file = Path(path or default_claims_path())
    where = f"claims file {file.name}"
    try:
        doc = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {where} ({exc.strerror or exc}); pass an existing TOML file.") from None
    except UnicodeDecodeError:
        raise InputError(f"{where} is not UTF-8 text; save it as UTF-8 TOML.") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where} is not valid TOML ({exc}); fix the syntax.") from None
    extra = sorted(set(doc) - {"claim"})
    if extra:
        raise InputError(f"{where}: unknown top-level key {extra[0]!r}; claims go in [[claim]] tables.")
    raw = doc.get("claim")
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where} has no [[claim]] tables; add at least one claim.")
    claims: list[Claim] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw, start=1):
        claim = _parse_claim(entry, i, where)
        if claim.id in seen:
            raise InputError(f"{where}: claim {claim.id!r}: duplicate id; give each claim its own id.")
        seen.add(claim.id)
        claims.append(claim)
    return claims


def _parse_claim(entry: Any, index: int, where: str) -> Claim:
    label = f"{where}: claim #{index}"
    if not isinstance(entry, dict):
        raise InputError(f"{label}: is not a table; write it as [[claim]] with key = value lines.")
    cid = entry.get("id")
    if isinstance(cid, str) and _ID.match(cid):
        label = f"{where}: claim {cid!r}"
    elif "id" in entry:
        raise InputError(f"{label}: id must be a non-empty string of letters, digits, '-', '_' or '.'.")

    def fail(problem: str) -> InputError:
        return InputError(f"{label}: {problem}")

    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise fail(f"unknown field {unknown[0]!r}; allowed: {', '.join(sorted(_FIELDS))}.")
    for name in _REQUIRED:
        if name not in entry:
            raise fail(f"missing field {name!r}.")
    for name in ("prediction", "falsifier", "source", "statistic", "test"):
        if not isinstance(entry[name], str) or not entry[name].strip():
            raise fail(f"field {name!r} must be a non-empty string.")
    if entry["statistic"] not in STATISTICS:
        raise fail(f"unknown statistic {entry['statistic']!r}; known: {', '.join(sorted(STATISTICS))}.")
    test = entry["test"]
    if test not in TESTS:
        raise fail(f"unknown test {test!r}; use one of {', '.join(TESTS)}.")
    threshold: float | tuple[float, float]
    if test == "between":
        threshold = _interval(entry["threshold"], fail, "threshold")
    else:
        if not _is_number(entry["threshold"]):
            raise fail(f"threshold must be a number for test {test!r}.")
        threshold = float(entry["threshold"])
    band: tuple[tuple[float, float], ...] = ()
    if "inconclusive_band" in entry:
        b = entry["inconclusive_band"]
        if isinstance(b, list) and b and all(isinstance(x, list) for x in b):
            band = tuple(_interval(x, fail, "inconclusive_band") for x in b)
        else:
            band = (_interval(b, fail, "inconclusive_band"),)
    minimum: list[tuple[str, int]] = []
    counted = STATISTICS[entry["statistic"]].samples
    for unit in SAMPLE_UNITS:
        if f"min_{unit}" not in entry:
            continue
        n = entry[f"min_{unit}"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise fail(f"min_{unit} must be a positive integer.")
        if unit not in counted:
            which = ", ".join(f"min_{u}" for u in counted) or "none"
            raise fail(f"min_{unit} does not apply to statistic {entry['statistic']!r}; it counts: {which}.")
        minimum.append((unit, n))
    protocol = entry.get("protocol", "")
    if not isinstance(protocol, str):
        raise fail("field 'protocol' must be a string.")
    descriptive = entry.get("descriptive", [])
    if not isinstance(descriptive, list) or not all(isinstance(d, str) and d in STATISTICS for d in descriptive):
        raise fail(f"descriptive must be a list of statistic names; known: {', '.join(sorted(STATISTICS))}.")
    raw_variants = entry.get("variant", [])
    if not isinstance(raw_variants, list) or not all(isinstance(v, dict) for v in raw_variants):
        raise fail("variants go in [[claim.variant]] tables with name and statistic.")
    variants = []
    for v in raw_variants:
        bad = sorted(set(v) - _VARIANT_FIELDS)
        if bad or not isinstance(v.get("name"), str) or v.get("statistic") not in STATISTICS:
            raise fail(f"variant {v.get('name')!r}: needs a name and a known statistic "
                       f"(fields: {', '.join(sorted(_VARIANT_FIELDS))}).")
        variants.append(Variant(v["name"], v["statistic"], " ".join(str(v.get("note", "")).split())))
    return Claim(id=entry["id"], prediction=" ".join(entry["prediction"].split()), statistic=entry["statistic"],
                 test=test, threshold=threshold, falsifier=" ".join(entry["falsifier"].split()),
                 source=" ".join(entry["source"].split()), inconclusive_band=band, min_sample=tuple(minimum),
                 protocol=" ".join(protocol.split()), descriptive=tuple(descriptive), variants=tuple(variants))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _interval(x: Any, fail: Callable[[str], InputError], name: str) -> tuple[float, float]:
    if not (isinstance(x, list) and len(x) == 2 and all(_is_number(v) for v in x)):
        raise fail(f"{name} must be [lo, hi], two numbers.")
    lo, hi = float(x[0]), float(x[1])
    if not lo < hi:
        raise fail(f"{name} [{fmt(lo)}, {fmt(hi)}] needs lo < hi.")
    return lo, hi


# ---------------------------------------------------------------------------------------
# verdicts
def region(claim: Claim, x: float) -> str:
    """Where ``x`` falls under ``claim``'s test: ``"pass"``, ``"band"`` (fails the test inside
    an inconclusive band) or ``"fail"``."""
    if claim.test == "between":
        lo, hi = claim.threshold  # type: ignore[misc]
        passed = lo <= x <= hi
    else:
        t = float(claim.threshold)  # type: ignore[arg-type]
        passed = {">=": x >= t, "<=": x <= t, ">": x > t, "<": x < t}[claim.test]
    if passed:
        return "pass"
    return "band" if any(lo <= x <= hi for lo, hi in claim.inconclusive_band) else "fail"


def _regions_met(claim: Claim, lo: float, hi: float) -> set[str]:
    """The regions (:func:`region`) that the closed interval ``[lo, hi]`` meets: its ends, every
    threshold or band edge inside it, and the midpoints between those."""
    edges = [*(claim.threshold if isinstance(claim.threshold, tuple) else (claim.threshold,)),
             *(e for band in claim.inconclusive_band for e in band)]
    points = sorted({lo, hi, *(e for e in edges if lo < e < hi)})
    finite = [p for p in points if math.isfinite(p)]
    mids = [(a + b) / 2 for a, b in zip(finite, finite[1:])]
    if len(finite) < len(points):  # an unbounded end reaches past every edge
        mids += [min(edges) - 1.0] if lo == -math.inf else []
        mids += [max(edges) + 1.0] if hi == math.inf else []
    return {region(claim, p) for p in (*points, *mids)}


#: A value's region → (its verdict, the word before the criterion, the opposite region and
#: that region's verdict): what an interval must not reach for the verdict to be decisive (a
#: range over protocol choices: every choice must lie in the value's region).
_DECISIVE = {"pass": ("supported", "", "fail", "falsified"), "fail": ("falsified", "fails ", "pass", "supported")}


def verdict(claim: Claim, value: float | None, interval: tuple[float, float] | None = None,
            kind: str = "confidence") -> tuple[str, str]:
    """The verdict of ``claim`` for statistic ``value`` (with its ``interval``) and a short reason.

    ``None`` → ``not tested``; NaN → ``inconclusive`` (too little data). Otherwise the value's
    region (:func:`region`) decides, and an interval can only make a decisive verdict
    inconclusive: a value that passes is ``supported`` only when its interval does not reach
    the falsified region (for a ``range`` over protocol choices: when every choice passes), and
    a value that fails outside the band is ``falsified`` only when its interval does not reach
    the supported region (a range: every choice fails). A value inside the band is
    ``inconclusive``. So a verdict is decisive only when the run's sample (or every protocol
    choice) decides it.
    """
    if value is None:
        return "not tested", "inputs missing"
    if math.isnan(value):
        return "inconclusive", "too little data"
    where = region(claim, value)
    met = _regions_met(claim, *interval) if interval is not None else {where}
    what = "range over protocol choices" if kind == "range" else "95% interval"
    span = f"{what} [{fmt(interval[0])}, {fmt(interval[1])}]" if interval is not None else ""
    if where in _DECISIVE:
        name, word, opposite, other = _DECISIVE[where]
        blocked = met != {where} if kind == "range" else opposite in met
        text = f"{fmt(value)} {word}{claim.criterion()}"
        if not blocked:
            return name, text + (f", {span}" if span else "")
        return "inconclusive", f"{text} but its {span} reaches " + (
            f"a choice that does not {where}" if kind == "range" else f"the {other} region")
    band = next(b for b in claim.inconclusive_band if b[0] <= value <= b[1])
    return "inconclusive", (f"{fmt(value)} fails {claim.criterion()} but lies in the "
                            f"inconclusive band [{fmt(band[0])}, {fmt(band[1])}]")


def sample_sizes(claim: Claim, tables: RunTables) -> dict[str, int | None]:
    """The run's count of each sample unit ``claim`` sets a minimum for (None: not recorded)."""
    counters = STATISTICS[claim.statistic].samples
    out: dict[str, int | None] = {}
    for unit, _ in claim.min_sample:
        try:
            out[unit] = counters[unit](tables)
        except Exception as exc:  # noqa: BLE001 - an odd table: the count is unknown, the verdict stands
            warnings.warn(f"counting {unit} for {claim.statistic} failed: {type(exc).__name__}: {exc}",
                          RuntimeWarning, stacklevel=2)
            out[unit] = None
    return out


def underpowered(claim: Claim, sizes: dict[str, int | None]) -> str:
    """``"underpowered (n = 2 chunks, needs 6)"`` when a known count is below the claim's
    minimum (several joined by ``"; "``), else ``""``."""
    short = [f"n = {sizes[unit]} {SAMPLE_UNITS[unit]}, needs {need}" for unit, need in claim.min_sample
             if sizes.get(unit) is not None and sizes[unit] < need]  # type: ignore[operator]
    return f"underpowered ({'; '.join(short)})" if short else ""


def estimate_verdict(claim: Claim, estimate: Estimate | None, *, intervals: bool = True) -> tuple[str, str]:
    """:func:`verdict` of a statistic's :class:`Estimate` (None: not tested), with its interval
    unless the statistic gives none or ``intervals`` is False (the value alone)."""
    if estimate is None:
        return verdict(claim, None)
    use = intervals and estimate.kind != "none"
    return verdict(claim, estimate.value, (estimate.lo, estimate.hi) if use else None, estimate.kind)


def marginal(claim: Claim, verdict_: str, estimate: Estimate | None) -> bool:
    """Whether a decisive verdict is marginal: ``supported`` or ``falsified`` with a 95 %
    interval that reaches the claim's inconclusive band (its value is decided, but a sample
    whose value fell elsewhere in the interval would read ``inconclusive``).

    Examples
    --------
    >>> a2 = next(c for c in load_claims() if c.id == "A2-eig-gap-contrast")
    >>> marginal(a2, "supported", Estimate(5.54, 4.39, 6.14)), marginal(a2, "supported", Estimate(7.0, 6.0, 8.0))
    (True, False)
    """
    if verdict_ not in ("supported", "falsified") or estimate is None or estimate.kind != "confidence":
        return False
    return bool(claim.inconclusive_band) and "band" in _regions_met(claim, estimate.lo, estimate.hi)


@dataclass(frozen=True)
class Judgement:
    """One claim judged on one run: its verdict, the reason, the statistic's estimate (None when
    not tested), the run's sample counts, whether they fall below a declared minimum, and
    whether a decisive verdict is :func:`marginal`."""

    verdict: str
    reason: str
    estimate: Estimate | None
    sample: dict[str, int | None]
    underpowered: bool
    marginal: bool = False


def judge(claim: Claim, tables: RunTables, *, intervals: bool = True) -> Judgement:
    """The verdict of ``claim`` on ``tables``: its statistic's estimate (:func:`~depthlens.report.
    statistics.compute_estimate`) under :func:`verdict`, made ``inconclusive`` (underpowered)
    when a sample count is below a declared minimum. What :func:`evaluate` and the calibration
    harness (:mod:`depthlens.report.calibration`) both run; ``intervals=False`` judges the
    value alone (the point rule, which the calibration benchmark compares against)."""
    estimate, note = compute_estimate(claim.statistic, tables)
    value = None if estimate is None else estimate.value
    result, reason = estimate_verdict(claim, estimate, intervals=intervals)
    if result == "not tested" and note:
        reason = note
    elif value is not None and math.isnan(value) and note and note != reason:
        reason = f"{reason}: {note}"
    sizes = sample_sizes(claim, tables) if value is not None else {u: None for u, _ in claim.min_sample}
    short = underpowered(claim, sizes)
    if short:
        result, reason = "inconclusive", (f"{short}; {reason}" if value is not None and math.isnan(value) else short)
    edge = marginal(claim, result, estimate if intervals else None)
    if edge:
        reason += ", which reaches the inconclusive band (marginal)"
    return Judgement(result, reason, estimate, sizes, bool(short), edge)


def evaluate(claims: Sequence[Claim], run_dir: str | Path | RunTables, *, calibrate: bool = True
             ) -> list[dict[str, Any]]:
    """Evaluate every claim on a run directory; one JSON-ready dict per claim, in order.

    Keys: ``id``, ``prediction``, ``statistic``, ``statistic_description``, ``value`` (a
    finite float, ``"inf"``/``"-inf"``, or None when not tested or NaN), ``value_text``,
    ``interval`` (``[lo, hi]`` of the statistic's 95 % interval or range over protocol choices,
    ends as ``value``; None when the statistic gives none), ``interval_kind``
    (``confidence``, ``range`` or ``none``), ``test``, ``threshold``, ``criterion``,
    ``inconclusive_band``, ``verdict``, ``reason``, ``falsifier``, ``source``, ``min_sample``
    (unit → minimum), ``marginal`` (:func:`marginal`), ``needs`` (for a claim not tested: the
    command or flag that would test it, :func:`needs_of`; else None), ``sample`` (unit → the
    run's count, None when not tested or not recorded), ``note`` (what the value rests on where
    that matters for reading it, :attr:`~depthlens.report.statistics.Statistic.note`; else None),
    ``underpowered`` (True when a count is below its minimum, or when the
    calibration at the run's sample size fails its acceptance: the verdict is then
    ``inconclusive`` whatever the value), ``calibration`` (with ``calibrate``: the claim's
    error rates under planted nulls and effects at this run's sample size,
    :func:`~depthlens.report.calibration.calibration_at`; None when the claim has no
    scenario, was not tested or the run lacks a size), ``uncalibrated`` (why a claim with a
    scenario has no calibration: the sizes the run lacks; else None; a decisive verdict on a
    run with none of a unit reads inconclusive, ``no routing heads``), ``protocol``, ``descriptive`` (statistic → value),
    ``sensitivity`` (one dict per variant: ``name``, ``statistic``, ``note``, ``value``,
    ``value_text``, ``verdict``, ``reason``) and ``fragile`` (:func:`fragile`). Reads tables
    and summaries only.
    """
    from .calibration import calibration_at, run_sizes, uncounted

    tables = run_dir if isinstance(run_dir, RunTables) else RunTables(run_dir)
    results = []
    for claim in claims:
        judged = judge(claim, tables)
        result, reason, short = judged.verdict, judged.reason, judged.underpowered
        estimate = judged.estimate
        value = None if estimate is None else estimate.value
        sizes = run_sizes(claim, tables) if calibrate and estimate is not None else {}
        calibration = calibration_at(claim, tables, sizes=sizes) if calibrate and estimate is not None else None
        lacking = uncounted(sizes)
        absent = [SAMPLE_UNITS.get(unit, unit) for unit, n in lacking.items() if n == 0]
        if absent and result in ("supported", "falsified"):
            result, reason, short = "inconclusive", f"no {', no '.join(absent)}; {reason}", True
        edge = judged.marginal
        if calibration is not None and not calibration["accepted"] and result in ("supported", "falsified"):
            edge = False
            result, reason, short = "inconclusive", (
                f"underpowered (calibration at this sample: P(supported | null) = "
                f"{calibration['p_supported_null']:.2f} (95% upper bound "
                f"{calibration.get('p_supported_null_upper', math.nan):.3f}), P(falsified | effect) = "
                f"{calibration['p_falsified_effect']:.2f} (upper bound "
                f"{calibration.get('p_falsified_effect_upper', math.nan):.3f}), each bound needs ≤ 0.05); "
                f"{reason}"), True
        sensitivity = []
        for variant in claim.variants:
            v_est, v_note = compute_estimate(variant.statistic, tables)
            v_value = None if v_est is None else v_est.value
            v_verdict, v_reason = estimate_verdict(claim, v_est)
            sensitivity.append({"name": variant.name, "statistic": variant.statistic, "note": variant.note,
                                "value": _json_value(v_value), "value_text": _text(v_value), "verdict": v_verdict,
                                "reason": v_note if v_verdict == "not tested" and v_note else v_reason})
        has_interval = estimate is not None and estimate.kind != "none"
        results.append({
            "id": claim.id,
            "prediction": claim.prediction,
            "statistic": claim.statistic,
            "statistic_description": STATISTICS[claim.statistic].description,
            "value": _json_value(value),
            "value_text": _text(value),
            "interval": [_json_value(estimate.lo), _json_value(estimate.hi)] if has_interval else None,
            "interval_kind": estimate.kind if estimate is not None else "none",
            "test": claim.test,
            "threshold": list(claim.threshold) if isinstance(claim.threshold, tuple) else claim.threshold,
            "criterion": claim.criterion(),
            "inconclusive_band": [list(b) for b in claim.inconclusive_band],
            "verdict": result,
            "marginal": edge,
            "needs": needs_of(claim.statistic, tables) if result == "not tested" else None,
            "reason": reason,
            "note": note_of(claim.statistic, tables) if estimate is not None else None,
            "falsifier": claim.falsifier,
            "source": claim.source,
            "min_sample": dict(claim.min_sample),
            "sample": judged.sample,
            "underpowered": short,
            "calibration": calibration,
            "uncalibrated": (f"not calibrated at this sample: the run has no {', no '.join(absent)}" if absent else
                             "not calibrated at this sample: the run records no count of "
                             + ", ".join(SAMPLE_UNITS.get(u, u) for u in lacking) if lacking else None),
            "protocol": claim.protocol,
            "descriptive": {name: _json_value(compute_statistic(name, tables)[0]) for name in claim.descriptive},
            "sensitivity": sensitivity,
            "fragile": fragile(result, [s["verdict"] for s in sensitivity]),
        })
    return results


def fragile(main: str, variants: Sequence[str]) -> bool:
    """Whether a decisive verdict (supported or falsified) changes under a sensitivity variant
    that could be computed (a ``not tested`` variant does not count)."""
    return main in ("supported", "falsified") and any(v != main for v in variants if v != "not tested")


def _text(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else fmt(value)


def registered_claims(run_dir: str | Path | RunTables) -> dict[str, Any]:
    """The claims record of the run's manifest (``{}`` when absent): ``sha256`` of the file
    registered at the start of the run and ``file`` (its copy in the run directory)."""
    tables = run_dir if isinstance(run_dir, RunTables) else RunTables(run_dir)
    record = tables.manifest.get("claims")
    return record if isinstance(record, dict) else {}


def run_claims_path(run_dir: str | Path, claims_path: str | Path | None = None) -> Path:
    """The claims file to score the run at ``run_dir`` with: ``claims_path`` when given, else
    the run's own copy (``RUN/claims.toml``), else (runs made before copies) the path the
    manifest recorded if it still exists, else the packaged default. Whether the file is the
    registered one is decided by hash (:func:`write_claims_json`), not by this choice."""
    if claims_path is not None:
        return Path(claims_path)
    root = Path(run_dir)
    copy = root / CLAIMS_COPY
    if copy.is_file():
        return copy
    legacy = registered_claims(root).get("path")
    if isinstance(legacy, str) and Path(legacy).is_file():
        return Path(legacy)
    return default_claims_path()


def write_claims_json(run_dir: str | Path, results: list[dict[str, Any]], *,
                      claims_path: str | Path | None = None, registered_hash: str | None = None) -> Path:
    """Atomically write ``RUN/claims.json``: the results, verdict counts (and how many
    inconclusive verdicts are underpowered), the claims file's name and sha256 (the packaged
    default when ``claims_path`` is None), the sha256 registered with the run
    (``registered_hash``, None when the run recorded none) and ``rescored``: True when the
    two differ, i.e. the verdicts use other thresholds than the pre-registered ones."""
    file = Path(claims_path or default_claims_path())
    current = claims_hash(file)
    counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    path = Path(run_dir) / CLAIMS_JSON
    write_json(path, {"claims_file": file.name, "claims_hash": current,
                      "registered_claims_hash": registered_hash,
                      "rescored": registered_hash is not None and registered_hash != current,
                      "counts": counts, "underpowered": sum(bool(r.get("underpowered")) for r in results),
                      "results": results})
    return path


def _json_value(value: float | None) -> float | str | None:
    if value is None or math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value
