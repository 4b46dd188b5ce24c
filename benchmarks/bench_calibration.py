"""The claims' calibration table: for every default claim with a planted scenario, its error
rates under a planted null and a planted effect of the seed's size, at the default preset's
sample sizes and at every corner between them and the claim's declared minimums
(:func:`depthlens.report.calibration.calibration_points`).

The naive method, measured in the same run on the same draws, is the point rule: the verdict of
the statistic's value alone, without its interval (how the claims were judged before). Each row
prints both rules' P(supported | null), P(falsified | effect) and power P(supported | effect),
and the ratio of the point rule's worst error rate to the interval rule's (∞ where the interval
rule made no error). Acceptance: both error rates ≤ 0.05 under the interval rule at every point
(the exit status is 1 otherwise, naming the points).

The contest claims' scenarios simulate the contest table's rows from a sampling model measured
on the stage's code (:func:`depthlens.report.worlds_attention.contest_world`); their rows are followed
by the same claims calibrated with the stage's own code (``stage code``: the contest of
:func:`~depthlens.report.worlds_attention.real_contest` with 200 bootstrap resamples and 200
permutations on every draw of the planted per-head worlds), with fewer draws (``--stage-draws``).

``python benchmarks/bench_calibration.py [DRAWS] [--claims ID,...] [--stage-draws N]`` (default
400 draws a world and 20 stage-code draws; the suite's check uses 100).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from depthlens.report.calibration import ACCEPT, SCENARIOS, MemoryTables, calibrate, calibration_points
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
        resolvent, criticality = contest_planted(claim.statistic, effect)
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


def main(draws: int, only: set[str], stage_draws: int) -> int:
    claims = [c for c in load_claims() if not only or c.id in only]
    print(f"{draws} draws a world; acceptance: P(supported | null) ≤ {ACCEPT} and P(falsified | effect) ≤ {ACCEPT}")
    print(f"{'claim':34s} {'at':8s} {'sizes':60s} {'S|null':>7s} {'F|eff':>7s} {'power':>6s} | point rule: "
          f"{'S|null':>7s} {'F|eff':>7s} {'power':>6s} {'ratio':>6s}  s")
    failed = []
    for claim in claims:
        if claim.statistic not in SCENARIOS:
            print(f"{claim.id:34s} no scenario")
            continue
        for at, sizes in calibration_points(claim):
            start = time.perf_counter()
            rule = calibrate(claim, sizes, draws)
            point = calibrate(claim, sizes, draws, intervals=False)
            assert rule is not None and point is not None
            worst = max(rule["p_supported_null"], rule["p_falsified_effect"])
            naive = max(point["p_supported_null"], point["p_falsified_effect"])
            ratio = naive / worst if worst > 0 else (math.inf if naive > 0 else 1.0)
            text = ", ".join(f"{k}={v}" for k, v in rule["sizes"].items())
            print(f"{claim.id:34s} {at:8s} {text:60s} {rule['p_supported_null']:7.3f} "
                  f"{rule['p_falsified_effect']:7.3f} {rule['p_supported_effect']:6.2f} |              "
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
    if failed:
        print(f"not accepted: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draws", nargs="?", type=int, default=400, help="draws a world (default 400)")
    parser.add_argument("--claims", default="", help="comma-separated claim ids (default: every claim)")
    parser.add_argument("--stage-draws", type=int, default=20,
                        help="draws a world of the contest claims with the stage's own code (default 20; 0 skips)")
    args = parser.parse_args()
    sys.exit(main(args.draws, {c for c in args.claims.split(",") if c}, args.stage_draws))
