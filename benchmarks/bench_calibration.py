"""The claims' calibration table: for every default claim with a planted scenario, its error
rates under a planted null and a planted effect of the seed's size, at the default preset's
sample sizes and at the claim's declared minimums (:mod:`depthlens.report.calibration`).

The naive method, measured in the same run on the same draws, is the point rule: the verdict of
the statistic's value alone, without its interval (how the claims were judged before). Each row
prints both rules' P(supported | null), P(falsified | effect) and power P(supported | effect),
and the ratio of the point rule's worst error rate to the interval rule's (∞ where the interval
rule made no error). Acceptance: both error rates ≤ 0.05 under the interval rule.

``python benchmarks/bench_calibration.py [DRAWS]`` (default 400 draws a world; the suite's
check uses 120).
"""

from __future__ import annotations

import math
import sys
import time

from depthlens.report.calibration import ACCEPT, SCENARIOS, calibrate
from depthlens.report.claims import load_claims


def main(draws: int) -> int:
    claims = load_claims()
    print(f"{draws} draws a world; acceptance: P(supported | null) ≤ {ACCEPT} and P(falsified | effect) ≤ {ACCEPT}")
    print(f"{'claim':34s} {'at':8s} {'sizes':46s} {'S|null':>7s} {'F|eff':>7s} {'power':>6s} | point rule: "
          f"{'S|null':>7s} {'F|eff':>7s} {'power':>6s} {'ratio':>6s}  s")
    failed = []
    for claim in claims:
        found = SCENARIOS.get(claim.statistic)
        if found is None:
            print(f"{claim.id:34s} no scenario")
            continue
        minimum = {unit: n for unit, n in claim.min_sample if unit in found.default}
        for at, sizes in (("default", {}), ("minimum", minimum)):
            if at == "minimum" and not minimum:
                continue
            start = time.perf_counter()
            rule = calibrate(claim, sizes, draws)
            point = calibrate(claim, sizes, draws, intervals=False)
            assert rule is not None and point is not None
            worst = max(rule["p_supported_null"], rule["p_falsified_effect"])
            naive = max(point["p_supported_null"], point["p_falsified_effect"])
            ratio = naive / worst if worst > 0 else (math.inf if naive > 0 else 1.0)
            text = ", ".join(f"{k}={v}" for k, v in rule["sizes"].items())
            print(f"{claim.id:34s} {at:8s} {text:46s} {rule['p_supported_null']:7.3f} {rule['p_falsified_effect']:7.3f} "
                  f"{rule['p_supported_effect']:6.2f} |              {point['p_supported_null']:7.3f} "
                  f"{point['p_falsified_effect']:7.3f} {point['p_supported_effect']:6.2f} {ratio:6.2f}  "
                  f"{time.perf_counter() - start:.0f}", flush=True)
            if at == "default" and not rule["accepted"]:
                failed.append(claim.id)
    if failed:
        print(f"not accepted at the default sizes: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 400))
