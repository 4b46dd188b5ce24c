"""Kreiss constants of deflated attention heads (n = 128, four kinds as in notes/kreiss.md).

Reports per core: the median time of ``kreiss(B, upper=False)`` (value search; target ≤ 20 ms,
goal 10 ms) and of the power-norm upper bound, agreement of the value with the brute-force
reference (target 1e-6 relative, on a subset: the reference costs seconds per matrix), and
the certified bracket at rtol 1e-3 (target median ≤ 0.6 s, goal 0.3 s) with its σ_min
evaluation counts, against the brute-force time on the same matrices.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _matrices import heads  # noqa: E402

from depthlens.linalg import kreiss, power_upper_bound  # noqa: E402
from depthlens.linalg.reference import kreiss_bruteforce  # noqa: E402


def main() -> None:
    """Run the value, upper-bound and certified timings; print medians and agreement."""
    n = 128
    mats = heads(n, 3, seed=3)
    kreiss(mats[0][1], certify=True)  # compile / load the numba cache
    t_val, t_up, t_cert, evals_val, evals_cert, ratio_up = [], [], [], [], [], []
    results = []
    for _, B in mats:
        t = time.perf_counter()
        r = kreiss(B, upper=False)
        t_val.append(time.perf_counter() - t)
        evals_val.append(r.n_evals)
        t = time.perf_counter()
        pb = power_upper_bound(B)
        t_up.append(time.perf_counter() - t)
        ratio_up.append(pb.value / r.value)
        t = time.perf_counter()
        c = kreiss(B, certify=True, rtol=1e-3, upper=False)
        t_cert.append(time.perf_counter() - t)
        assert c.branch_bound is not None
        evals_cert.append(c.branch_bound.evaluations)
        results.append((r, c))
    print(f"bench_kreiss: {len(mats)} deflated heads n={n} (kinds sink, sink+prev, prev, plain)")
    print(f"  value  : median {np.median(t_val) * 1e3:7.1f} ms (target <= 20, goal 10), median sigma_min evals {np.median(evals_val):.0f}")
    print(f"  upper  : median {np.median(t_up) * 1e3:7.1f} ms, upper/value median {np.median(ratio_up):.3f} (max {max(ratio_up):.3f})")
    certified = sum(c.certified for _, c in results)
    widths = [c.hi / c.lo - 1 for _, c in results]
    print(
        f"  certify: median {np.median(t_cert):7.3f} s (target <= 0.6, goal 0.3), median evals {np.median(evals_cert):.0f},"
        f" certified {certified}/{len(results)}, max hi/lo-1 {max(widths):.1e}"
    )
    sub = [0, len(mats) // 4, len(mats) // 2, 3 * len(mats) // 4]
    errs, t_bf = [], []
    for i in sub:
        B = mats[i][1]
        t = time.perf_counter()
        ref, _ = kreiss_bruteforce(B)
        t_bf.append(time.perf_counter() - t)
        r, c = results[i]
        errs.append(abs(r.value / ref - 1.0))
        assert c.lo is not None and c.hi is not None
        inside = c.lo <= ref * (1 + 1e-9) and ref <= c.hi * (1 + 1e-9)
        print(f"    {mats[i][0]:>9}: K={r.value:.10f} brute={ref:.10f} rel.diff {errs[-1]:.1e} bracket [{c.lo:.6f}, {c.hi:.6f}] contains brute: {inside}")
    print(
        f"  brute force: median {np.median(t_bf):.2f} s per matrix; value speed-up {np.median(t_bf) / np.median(t_val):.0f}x,"
        f" certify speed-up {np.median(t_bf) / np.median(t_cert):.1f}x; max rel. diff {max(errs):.1e} (target <= 1e-6)"
    )


if __name__ == "__main__":
    main()
