"""The claims' calibration table: for every default claim with a planted scenario, its error
rates under a planted null and a planted effect of the seed's size, at the default preset's
sample sizes (with ``--corners`` also at every corner between them and the claim's declared
minimums, :func:`depthlens.report.calibration.calibration_points`).

The naive method, measured in the same run on the same draws, is the point rule: the verdict of
the statistic's value alone, without its interval (how the claims were judged before). Each row
prints both rules' P(supported | null), P(falsified | effect) and power P(supported | effect),
the interval rule's one-sided 95 % Clopper–Pearson upper bounds of the two error rates (``≤``),
and the ratio of the point rule's worst error rate to the interval rule's (∞ where the interval
rule made no error). Acceptance: both upper bounds ≤ 0.05 under the interval rule at every point
(the exit status is 1 otherwise, naming the points).

The contest claims' scenarios simulate the contest table's rows from a sampling model measured
on the stage's code (:func:`depthlens.report.worlds_attention.contest_world`); their rows are followed
by the same claims calibrated with the stage's own code (``stage code``: the contest of
:func:`~depthlens.report.worlds_attention.real_contest` with 200 bootstrap resamples and 200
permutations on every draw of the planted per-head worlds), with fewer draws (``--stage-draws``).

Then the operating characteristic of every claim at the default sizes: P(supported) and
P(falsified) over a grid of planted effect strengths from the null world (0) through the seed's
effect (1) to twice it (2) (:func:`depthlens.report.calibration.operating_characteristic`, 400
draws a point by default), printed with the statistic's typical value at each strength, and
drawn as one figure per part (``docs/operating_characteristic_A.png`` and so on).

``python benchmarks/bench_calibration.py [DRAWS] [--claims ID,...] [--stage-draws N] [--oc-draws N]
[--figures DIR]`` (default 400 draws a world, 20 stage-code draws, 400 draws a point of the
operating characteristic, figures in ``docs/``; ``--oc-draws 0`` skips it).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import pandas as pd

from depthlens.report.calibration import (ACCEPT, SCENARIOS, STRENGTHS, MemoryTables, calibrate, calibration_points,
                                          operating_characteristic)
from depthlens.report.worlds_attention import contest_planted, contest_world, real_contest
from depthlens.report.claims import Claim, judge, load_claims

#: The contest targets each contest claim's table needs (BH runs over every row of the table).
STAGE_TARGETS = {"contest_R_required": ("persistence", "routing", "criticality"),
                 "contest_criticality_best_family": ("criticality",)}


def stage_rates(claim: Claim, layers: int, draws: int, seed: int = 0) -> dict[str, float]:
    """P(supported | null), P(falsified | effect) and the power of ``claim`` with the contest's
    own code on ``draws`` draws of each planted per-head world at ``layers`` layers."""
    rates = {}
    for world, effect in ((0, False), (1, True)):
        resolvent, criticality = contest_planted(claim.statistic, float(effect))
        verdicts = []
        for i in range(draws):
            features, targets = contest_world(np.random.default_rng(np.random.SeedSequence([seed, world, i])), layers,
                                              resolvent, criticality)
            table = real_contest(features, targets, STAGE_TARGETS[claim.statistic], n_boot=200, n_perm=200, seed=i)
            tables = MemoryTables({"contest": table, "contest_features": features[["layer", "head"]]})
            verdicts.append(judge(claim, tables).verdict)
        name = "effect" if effect else "null"
        rates[f"p_supported_{name}"] = verdicts.count("supported") / draws
        rates[f"p_falsified_{name}"] = verdicts.count("falsified") / draws
    return rates


def characteristics(claims: list[Claim], draws: int) -> dict[str, pd.DataFrame]:
    """Print and return the operating characteristic of every claim with a scenario."""
    print(f"\noperating characteristic at the default sizes, {draws} draws a point "
          "(strength 0: null world, 1: the seed's effect; value: the statistic's median over the draws)")
    print(f"{'claim':34s} {'threshold':>16s} " + " ".join(f"{s:>17.3g}" for s in STRENGTHS))
    out = {}
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {claim.id: pool.submit(operating_characteristic, claim, STRENGTHS, draws)
                   for claim in claims if claim.statistic in SCENARIOS}
    for claim in claims:
        if claim.id not in futures:
            continue
        table = futures[claim.id].result()
        out[claim.id] = table
        threshold = claim.threshold if isinstance(claim.threshold, float) else "–".join(map(str, claim.threshold))
        cells = [f"{v:7.3g} S{s:4.2f} F{f:4.2f}" for v, s, f in table[["value", "p_supported", "p_falsified"]].values]
        print(f"{claim.id:34s} {claim.test + ' ' + str(threshold):>16s} " + " ".join(f"{c:>17s}" for c in cells)
              , flush=True)
    print(f"({time.perf_counter() - start:.0f} s on {os.cpu_count()} processes)")
    return out


def _threshold_strength(table: pd.DataFrame, threshold: float) -> float | None:
    """The strength at which the typical value crosses ``threshold`` (linear in between), if it does."""
    values, strengths = table["value"].to_numpy(), table["strength"].to_numpy()
    for i in range(len(values) - 1):
        a, b = values[i] - threshold, values[i + 1] - threshold
        if math.isfinite(a) and math.isfinite(b) and a * b <= 0 and a != b:
            return float(strengths[i] + (strengths[i + 1] - strengths[i]) * a / (a - b))
    return None


def draw(tables: dict[str, pd.DataFrame], claims: list[Claim], folder: Path) -> list[Path]:
    """One figure per part (the claim id's first letter): P(supported) and P(falsified) with their
    95 % intervals against the strength, the typical value at each strength under the axis and the
    threshold where the typical value crosses it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_id = {c.id: c for c in claims}
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for part in sorted({cid[0] for cid in tables}):
        ids = [cid for cid in tables if cid[0] == part]
        cols = 3
        rows = math.ceil(len(ids) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.1 * rows), squeeze=False)
        for ax in axes.flat[len(ids):]:
            ax.set_visible(False)
        for ax, cid in zip(axes.flat, ids):
            table, claim = tables[cid], by_id[cid]
            x = table["strength"]
            for name, colour in (("supported", "tab:green"), ("falsified", "tab:red")):
                ax.fill_between(x, table[f"p_{name}_lo"], table[f"p_{name}_hi"], color=colour, alpha=0.2, lw=0)
                ax.plot(x, table[f"p_{name}"], "o-", color=colour, ms=3, label=f"P({name})")
                ax.plot(x, table[f"p_{name}_marginal"], "--", color=colour, lw=0.9, label=f"P({name}, marginal)")
            ax.axhline(ACCEPT, color="grey", lw=0.6, ls=":")
            for t in (claim.threshold if isinstance(claim.threshold, tuple) else (claim.threshold,)):
                at = _threshold_strength(table, float(t))
                if at is not None:
                    ax.axvline(at, color="k", lw=0.8, ls="--")
            ax.set_xticks(x)
            ax.set_xticklabels([f"{s:g}\n{v:.3g}" for s, v in zip(x, table["value"])], fontsize=7)
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(cid, fontsize=9)
            ax.set_xlabel("strength / typical value", fontsize=7)
        axes.flat[0].legend(fontsize=7, loc="center right")
        fig.suptitle(f"Part {part}: operating characteristic at the default sizes "
                     f"({int(tables[ids[0]]['draws'].iloc[0])} draws a point; vertical: the threshold; dashed: marginal)", fontsize=10)
        fig.tight_layout()
        path = folder / f"operating_characteristic_{part}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
        print(f"figure: {path}")
    return written


def main(draws: int, only: set[str], stage_draws: int, oc_draws: int = 400, figures: Path | None = None,
         corners: bool = False) -> int:
    claims = [c for c in load_claims() if not only or c.id in only]
    print(f"{draws} draws a world; acceptance: P(supported | null) ≤ {ACCEPT} and P(falsified | effect) ≤ {ACCEPT}")
    print(f"{'claim':34s} {'at':8s} {'sizes':60s} {'S|null':>7s} {'≤':>6s} {'F|eff':>7s} {'≤':>6s} {'power':>6s} | point rule: "
          f"{'S|null':>7s} {'F|eff':>7s} {'power':>6s} {'ratio':>6s}  s")
    failed = []
    for claim in claims:
        if claim.statistic not in SCENARIOS:
            print(f"{claim.id:34s} no scenario")
            continue
        for at, sizes in calibration_points(claim)[: None if corners else 1]:
            start = time.perf_counter()
            rule = calibrate(claim, sizes, draws)
            point = calibrate(claim, sizes, draws, intervals=False)
            assert rule is not None and point is not None
            worst = max(rule["p_supported_null"], rule["p_falsified_effect"])
            naive = max(point["p_supported_null"], point["p_falsified_effect"])
            ratio = naive / worst if worst > 0 else (math.inf if naive > 0 else 1.0)
            text = ", ".join(f"{k}={v}" for k, v in rule["sizes"].items())
            print(f"{claim.id:34s} {at:8s} {text:60s} {rule['p_supported_null']:7.3f} "
                  f"{rule['p_supported_null_upper']:6.3f} {rule['p_falsified_effect']:7.3f} "
                  f"{rule['p_falsified_effect_upper']:6.3f} {rule['p_supported_effect']:6.2f} |              "
                  f"{point['p_supported_null']:7.3f} "
                  f"{point['p_falsified_effect']:7.3f} {point['p_supported_effect']:6.2f} {ratio:6.2f}  "
                  f"{time.perf_counter() - start:.0f}", flush=True)
            if not rule["accepted"]:
                failed.append(f"{claim.id} ({at}: {text})")
            if claim.statistic in STAGE_TARGETS and stage_draws:
                start = time.perf_counter()
                stage = stage_rates(claim, rule["sizes"]["layers"], stage_draws)
                text = f"stage code, {stage_draws} draws, layers={rule['sizes']['layers']}"
                print(f"{'':34s} {at:8s} {text:60s} {stage['p_supported_null']:7.3f} "
                      f"{stage['p_falsified_effect']:7.3f} {stage['p_supported_effect']:6.2f} |  "
                      f"{time.perf_counter() - start:.0f}", flush=True)
    if oc_draws:
        tables = characteristics(claims, oc_draws)
        if figures is not None:
            draw(tables, claims, figures)
    if failed:
        print(f"not accepted: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draws", nargs="?", type=int, default=400, help="draws a world (default 400)")
    parser.add_argument("--claims", default="", help="comma-separated claim ids (default: every claim)")
    parser.add_argument("--stage-draws", type=int, default=20,
                        help="draws a world of the contest claims with the stage's own code (default 20; 0 skips)")
    parser.add_argument("--corners", action="store_true",
                        help="also calibrate at the corners between the default sizes and the claims' minimums")
    parser.add_argument("--oc-draws", type=int, default=400,
                        help="draws a point of the operating characteristic (default 400; 0 skips it)")
    parser.add_argument("--figures", type=Path, default=Path(__file__).resolve().parent.parent / "docs",
                        help="folder of the operating characteristic figures (default docs/)")
    args = parser.parse_args()
    sys.exit(main(args.draws, {c for c in args.claims.split(",") if c}, args.stage_draws, args.oc_draws,
                  args.figures, args.corners))
