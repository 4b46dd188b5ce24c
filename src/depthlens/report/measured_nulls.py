"""Null worlds measured on real random-init models: what the planted null worlds of
:mod:`depthlens.report.calibration` must look like.

A claim's null world plants the inputs its statistic reads (gaps, null ranks, rotations, funnel
ends, ...). :data:`INPUTS` names, for each statistic, those inputs as functions of a run's tables,
so one function reads both a simulated world and a measured run. The measured runs are runs of
randomly initialised models at SmolLM2-135M's shape (:data:`NULL_MODELS`: every checkpoint of
such a run is a null, the ``trained`` one included) and the step-0 checkpoints (``init``) of any
other run. :func:`measure` reduces them to the package's ``measured_nulls.json`` (per input: its
count, mean, standard deviation and a sample of at most :data:`KEEP` values, which a world may
resample); :func:`compare` sets each planted world beside them.

``python -m depthlens.report.measured_nulls RUN ...`` re-measures from finished runs;
``python -m depthlens.report.measured_nulls --run DIR`` first runs the stages on
:data:`NULL_MODELS` into ``DIR`` (tens of CPU-minutes), then measures.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..runs.tables import RunTables
from .statistics import attention as attention_statistics
from .statistics import residual as residual_statistics
from .statistics.core import numeric

__all__ = ["INPUTS", "KEEP", "MEASURED", "NULL_MODELS", "SHAPE", "STAGE_OPTIONS", "Inputs", "compare", "matches", "measure",
           "measured", "measured_summary", "measured_values", "run_models"]

#: The package's measured null inputs (:func:`measure`).
MEASURED = Path(__file__).with_name("measured_nulls.json")
#: SmolLM2-135M's shape, as ``random:`` overrides.
SHAPE = "hidden_size=576,intermediate_size=1536,num_hidden_layers=30,num_attention_heads=9"
#: The random-init models measured, and the stages each runs (``depthlens STAGE``).
NULL_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama": (f"random:llama:{SHAPE},num_key_value_heads=3", ("attention", "topology")),
    "gpt_neox": (f"random:gpt_neox:{SHAPE}", ("attention",)),
}
#: Values kept per input for resampling.
KEEP = 2000

#: ``inputs(tables, checkpoints)``: named arrays of the inputs a null world plants, read from the
#: rows of ``checkpoints`` (every checkpoint of a random model's run; ``init`` of another run).
Inputs = Callable[[RunTables, Sequence[str]], dict[str, np.ndarray]]


def _has(t: RunTables, name: str) -> bool:
    """Whether the run has a non-empty table ``name``."""
    df = t.table(name)
    return df is not None and not df.empty


def _final_gaps(t: RunTables, checkpoints: Sequence[str]) -> dict[str, np.ndarray]:
    if "trained" not in checkpoints or not _has(t, "depth"):
        return {}
    final = attention_statistics._final_gaps(t)
    return {f"{source} gap_e1 (orders)": numeric(final.loc[final["source"] == source, "gap_e1"])
            for source in ("model", "null")}


def _null_ranks(t: RunTables, checkpoints: Sequence[str]) -> dict[str, np.ndarray]:
    if "trained" not in checkpoints or not _has(t, "head_chunks"):
        return {}
    rows = t.trained("head_chunks")
    rows = rows.assign(fraction=numeric(rows["null_rank_TR1"]) / numeric(rows["null_n"]))
    return {"rank of TR1 among its nulls / null samples": rows["fraction"].to_numpy(dtype=float),
            "a head's mean of that over its chunks": rows.groupby(["layer", "head"])["fraction"].mean().to_numpy(dtype=float)}


def _rotations(t: RunTables, checkpoints: Sequence[str]) -> dict[str, np.ndarray]:
    if not _has(t, "eigenvalues"):
        return {}
    found = {c: residual_statistics._layer_rotations(t, c) for c in checkpoints
             if c in set(t.table("eigenvalues")["checkpoint"])}
    if not found:
        return {}
    out = {"early-layer weighted rotation": np.concatenate([r.to_numpy(dtype=float) for r in found.values()])}
    if {"trained", "init"} <= set(found):
        both = pd.concat({c: found[c] for c in ("trained", "init")}, axis=1).dropna()
        out["early-layer rotation, trained minus init"] = (both["trained"] - both["init"]).to_numpy(dtype=float)
    return out


def _funnel_ends(t: RunTables, checkpoints: Sequence[str]) -> dict[str, np.ndarray]:
    if not _has(t, "funnel_boot"):
        return {}
    boot = t.table("funnel_boot")
    boot = boot[boot["checkpoint"].isin(checkpoints) & (boot["jacobian_mode"] == "isolated")]
    if boot.empty:
        return {}
    keys = ["checkpoint", "init_seed"]
    boot = boot.assign(init_seed=boot["init_seed"].fillna(-1.0))
    first = boot[boot["replicate"] == 0]
    replicates = boot[boot["replicate"] > 0].groupby(keys)

    def spread(column: str) -> np.ndarray:
        return replicates[column].apply(lambda v: float(np.std(np.log(numeric(v)), ddof=1))).to_numpy(dtype=float)

    full = np.log(numeric(first["erank_full_depth"]))
    return {"erank after one step": numeric(first["erank_one_step"]),
            "erank at full depth": numeric(first["erank_full_depth"]),
            "log spread of the full-depth erank between checkpoints": np.array([full.std(ddof=1)] if len(full) > 1 else []),
            "log spread of the one-step erank over chunk resamples": spread("erank_one_step"),
            "log spread of the full-depth erank over chunk resamples": spread("erank_full_depth")}


def _init_coupling(t: RunTables, checkpoints: Sequence[str]) -> dict[str, np.ndarray]:
    if not _has(t, "coupling"):
        return {}
    rows = t.table("coupling")
    rows = rows[rows["checkpoint"].isin(checkpoints)]
    return {"boundary FDR-significant (0/1)": rows["significant"].to_numpy(dtype=float)} if len(rows) else {}


#: Per statistic: its inputs and the world of its scenario that a random init is (``null``, or
#: ``effect`` for a claim that a random init has a property, B6's absence of coupling).
INPUTS: dict[str, tuple[Inputs, str]] = {
    "eig_gap_e1_contrast": (_final_gaps, "null"),
    "eig_gap_e1_null_chunks": (_final_gaps, "null"),
    "routing_positive_rank_fraction": (_null_ranks, "null"),
    "sink_negative_rank_fraction": (_null_ranks, "null"),
    "rotation_gain_early": (_rotations, "null"),
    "funnel_ratio_trained": (_funnel_ends, "null"),
    "funnel_init_over_trained": (_funnel_ends, "null"),
    "coupling_significant_fraction_init": (_init_coupling, "effect"),
}


def _null_checkpoints(manifest: Mapping[str, Any]) -> list[str]:
    """The checkpoints of the run of ``manifest`` that are nulls: all of a random model's run,
    else ``init``."""
    model = str(manifest.get("config", {}).get("model", ""))
    return ["trained", "init"] if model.startswith("random:") else ["init"]


def measure(runs: Sequence[str | Path]) -> dict[str, Any]:
    """The measured null inputs of finished ``runs``: for every statistic of :data:`INPUTS` and
    each of its inputs, the values pooled over the runs' null checkpoints, reduced to ``n``,
    ``mean``, ``sd`` and ``values`` (at most :data:`KEEP`, an evenly spaced subsample of the
    sorted values, 4 significant digits). Inputs a run lacks (a stage not run) are skipped."""
    pooled: dict[str, dict[str, list[np.ndarray]]] = {}
    sources = []
    for run in map(Path, runs):
        tables = RunTables(run)
        manifest = tables.manifest
        checkpoints = _null_checkpoints(manifest)
        sources.append({"model": manifest["config"]["model"], "checkpoints": checkpoints,
                        "stages": sorted(manifest.get("stages", {}))})
        for statistic, (inputs, _) in INPUTS.items():
            found = inputs(tables, checkpoints)
            for name, values in found.items():
                pooled.setdefault(statistic, {}).setdefault(name, []).append(np.asarray(values, dtype=float))
    out: dict[str, Any] = {}
    for statistic, named in pooled.items():
        out[statistic] = {}
        for name, parts in named.items():
            values = np.sort(np.concatenate(parts)[np.isfinite(np.concatenate(parts))])
            kept = values[np.unique(np.linspace(0, len(values) - 1, min(KEEP, len(values))).round().astype(int))]
            out[statistic][name] = {"n": int(len(values)), "mean": float(values.mean()) if len(values) else math.nan,
                                    "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                                    "values": [float(f"{v:.4g}") for v in kept]}
    return {"runs": sources, "inputs": out}


@lru_cache(maxsize=1)
def measured() -> dict[str, Any]:
    """The package's measured null inputs (``{}`` when none are shipped)."""
    return json.loads(MEASURED.read_text())["inputs"] if MEASURED.exists() else {}


def measured_summary(statistic: str, name: str) -> dict[str, float]:
    """``n``, ``mean`` and ``sd`` of one measured input.

    Raises
    ------
    KeyError
        When the package has no such measured input.
    """
    found = measured()[statistic][name]
    return {key: float(found[key]) for key in ("n", "mean", "sd")}


def measured_values(statistic: str, name: str) -> np.ndarray:
    """The kept values of one measured input.

    Raises
    ------
    KeyError
        When the package has no such measured input.
    """
    return np.asarray(measured()[statistic][name]["values"], dtype=float)


def matches(world: Mapping[str, float], real: Mapping[str, float]) -> bool:
    """Whether a planted world's input (``n``, ``mean``, ``sd``) matches its measurement within
    sampling error: means within a quarter of the larger standard deviation plus three standard
    errors of their difference, and, where both vary, standard deviations within a factor of 2.

    Examples
    --------
    >>> matches({"n": 600, "mean": 0.005, "sd": 0.07}, {"n": 60, "mean": 0.0, "sd": 0.0})
    True
    >>> matches({"n": 200, "mean": 0.12, "sd": 0.036}, {"n": 10, "mean": 0.63, "sd": 0.003})
    False
    """
    se = math.sqrt(world["sd"] ** 2 / max(world["n"], 1) + real["sd"] ** 2 / max(real["n"], 1))
    near = abs(world["mean"] - real["mean"]) <= 0.25 * max(world["sd"], real["sd"]) + 3.0 * se
    if world["sd"] == 0 or real["sd"] == 0:
        return near
    return near and 0.5 <= world["sd"] / real["sd"] <= 2.0


def compare(statistic: str, draws: int = 20, seed: int = 0) -> pd.DataFrame:
    """Each measured input of ``statistic`` beside the same input of its planted world (the world
    :data:`INPUTS` names, at the scenario's default sizes, pooled over ``draws`` draws): one row per
    input with ``n``, ``mean`` and ``sd`` of both, and ``matches`` (:func:`matches`). Empty when
    nothing is measured for it; an input the world does not plant at all (the spread between
    checkpoints of a world with one checkpoint) is left out."""
    from .calibration import SCENARIOS

    inputs, world = INPUTS[statistic]
    real = measured().get(statistic, {})
    found = SCENARIOS[statistic]
    strength = 1.0 if world == "effect" else 0.0
    pooled: dict[str, list[np.ndarray]] = {}
    for i in range(draws):
        tables = found.simulate(np.random.default_rng(np.random.SeedSequence([seed, 3, i])), found.default, strength)
        for name, values in inputs(tables, ["trained", "init"]).items():
            pooled.setdefault(name, []).append(np.asarray(values, dtype=float))
    rows = []
    for name, meas in real.items():
        values = np.concatenate(pooled.get(name, [np.array([])]))
        values = values[np.isfinite(values)]
        if not len(values):
            continue
        planted = {"n": len(values), "mean": float(values.mean()) if len(values) else math.nan,
                   "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0}
        rows.append({"statistic": statistic, "input": name, "world": world, "world_n": planted["n"],
                     "world_mean": planted["mean"], "world_sd": planted["sd"], "measured_n": meas["n"],
                     "measured_mean": meas["mean"], "measured_sd": meas["sd"],
                     "matches": matches(planted, meas)})
    return pd.DataFrame(rows)


#: Options of each stage's measuring run beside the default preset: no certified Kreiss brackets,
#: as many chunks as the default has null chunks (the attention inputs are read on those, so their
#: sizes stay the default's), the isolated Jacobians only (what the residual inputs read).
STAGE_OPTIONS = {"attention": ("--certify", "none", "--chunks", "10"), "topology": ("--jacobian-mode", "isolated")}


def run_models(folder: Path) -> list[Path]:
    """Run the stages of :data:`NULL_MODELS` at the default preset into ``folder``/NAME-STAGE
    (resuming unfinished work); returns the run folders."""
    runs = []
    for name, (spec, stages) in NULL_MODELS.items():
        for stage in stages:
            out = folder / f"{name}-{stage}"
            subprocess.run([sys.executable, "-m", "depthlens", stage, "--model", spec, *STAGE_OPTIONS[stage],
                            "--out", str(out), "--resume" if out.exists() else "--overwrite"], check=True)
            runs.append(out)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m depthlens.report.measured_nulls",
                                     description="Measure the null worlds' inputs on runs of random-init models.")
    parser.add_argument("runs", nargs="*", type=Path, help="finished runs to measure")
    parser.add_argument("--run", type=Path, metavar="DIR", help="first run the stages of the null models into DIR")
    parser.add_argument("--out", type=Path, default=MEASURED, help="where to write (default: the package's file)")
    args = parser.parse_args(argv)
    runs = list(args.runs) + (run_models(args.run) if args.run else [])
    if not runs:
        parser.error("give finished runs or --run DIR")
    result = measure(runs)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    tmp.replace(args.out)
    for statistic, named in result["inputs"].items():
        for name, m in named.items():
            print(f"{statistic:36s} {name:58s} n={m['n']:6d} mean={m['mean']:.4g} sd={m['sd']:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
