"""Kreiss constants of deflated attention heads (n = 128, four kinds as in notes/kreiss.md).

Reports per core, per family of heads (the synthetic heads of ``_matrices.py``: the bench's
draw, seed 3, and a second draw; with ``--heads FILE.npy`` also saved causal attention matrices,
shape ``(..., n, n)`` in float64, e.g. SmolLM2's from ``Adapter.attention_probs``):

* value: the median over heads of the best of three runs of ``kreiss(B, upper=False)``
  (target ≤ 5 ms), which searches the positive real axis (the axis reduction holds for every
  deflated causal stochastic matrix), beside the two-dimensional search over the exterior
  (grid in ``(log(|z|−1), arg z)``, then L-BFGS-B: the algorithm the value used before, still
  the one for matrices without the axis reduction) timed on the same heads in the same run,
  with the largest relative difference of the two values;
* the power-norm upper bound (median CPU time, and its ratio to the value) beside the naive
  reference :func:`naive_power_upper` (the implementation before the bound reused its series
  values across bisection passes and skipped the cheap norm bounds of always-exact powers),
  timed alternately on the same heads in the same run: the ratio, and on how many heads the
  two bounds are bit-identical (they must be on all);
* certify: ``kreiss(B, certify=True, rtol=1e-3, upper=False)`` (target median ≤ 0.15 s) with
  its σ_min evaluation counts and certified count;
* on four heads of the bench's draw: agreement of the value with the brute-force reference
  (target 1e-6 relative) and whether the bracket contains it, against the brute-force time.

The code before the real-axis search (commit 482d446), run beside the current one on this
machine (2 cores shared with other work; one BLAS thread as here; medians over heads of the
best of three, over several runs): value 7.8–14 ms on the two synthetic draws and 8.5–9.5 ms
on SmolLM2-135M's 270 heads of one chunk (the current code 1.4–1.7 ms); certify
(``upper=False``) 0.018–0.033 s (the current code 0.010–0.015 s). Upper bound on 108 of
SmolLM2-135M's heads (two chunks, every fifth head), the machine shared with a stage run and a
test run: naive 11.6 ms, current 10.2 ms CPU (median; ratio 1.14x median, 1.16x total), the
same bound bit for bit on every head.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _matrices import heads  # noqa: E402

from depthlens.linalg import kreiss, power_upper_bound  # noqa: E402
from depthlens.linalg.causal import deflate  # noqa: E402
from depthlens.linalg.kreiss_bound import (EXACT_POWERS, NORM_ROUNDING, _BoundFunction,  # noqa: E402
                                           power_allowances, spectrum_status)
from depthlens.linalg.transients import iter_power_norms  # noqa: E402
from depthlens.linalg.kreiss_search import search  # noqa: E402
from depthlens.linalg.reference import kreiss_bruteforce, whole_grid_sup  # noqa: E402
from depthlens.linalg.sigma import triangular_form  # noqa: E402


def best_of(fn: Callable[[], object], repeats: int = 3) -> tuple[float, object]:
    """The shortest of ``repeats`` wall times of ``fn()`` and its last result."""
    best, out = np.inf, None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def exterior_value(B: np.ndarray) -> float:
    """The value by the two-dimensional search over the exterior, with the reductions
    ``kreiss`` does before it (triangular form, spectrum classification)."""
    tf = triangular_form(B)
    _, _, circle = spectrum_status(B, tf)
    return search(tf, "numba", (17, 14), 3, circle).best


def naive_power_upper(B: np.ndarray, share: float = 1e-3, rtol_r: float = 1e-4) -> float:
    """The power-norm upper bound as computed before the bound shared its series values across
    the bisection passes and skipped the cheap norm bounds of the always-exact powers: the
    naive reference of the ``upper`` timing (``ρ(B) < 1`` only; the same number as
    :func:`power_upper_bound`, bit for bit)."""
    n = B.shape[0]
    assert spectrum_status(B, triangular_form(B))[0] == "inside"
    top, chose = [0.0], [True]

    def need_exact(k: int, bound: float) -> bool:
        chose[0] = k <= EXACT_POWERS or bound > top[0]
        return chose[0]

    eps, rel = np.finfo(np.float64).eps, 1.0 + NORM_ROUNDING * n * np.finfo(np.float64).eps
    a_it, da_it = iter_power_norms(B, need_exact), power_allowances(B)
    a, da, exact = [1.0], [0.0], [True]
    best_m, best_rate, tail = 0, 0.0, "none"
    r = 1.0 + np.logspace(-4, 3, 80)
    log_r, pw = np.log(r), 1.0 / r
    h, cum = pw.copy(), [pw.copy()]
    while len(a) - 1 < 20 * n + 100:
        a.append(next(a_it))
        da.append((rel - 1.0) * a[-1] + next(da_it))
        exact.append(a[-1] == 0.0 or chose[0])
        top[0] = max(top[0], a[-1])
        b, k = a[-1] + da[-1], len(a) - 1
        if not np.isfinite(b):
            break
        if b == 0.0:
            tail = "nilpotent"
            break
        with np.errstate(under="ignore"):
            pw = pw / r
            h = h + b * pw
            cum.append(cum[-1] + b * pw)
        if b < 1.0 and math.log(b) / k < best_rate:
            best_m, best_rate = k, math.log(b) / k
        if not best_m or k % 4:
            continue
        with np.errstate(under="ignore"):
            q = (a[best_m] + da[best_m]) * np.exp(-best_m * log_r)
            part = (cum[k] - cum[k - best_m]) * q / (1.0 - q)
        if ((r - 1.0) * part).max() <= share * ((r - 1.0) * (h + part)).max():
            tail = "geometric"
            break
    if tail == "none":
        return np.inf
    na, nda = np.asarray(a), np.asarray(da)
    fn = _BoundFunction(na, nda, na + nda, tail, best_m if tail == "geometric" else 0, 0.0, np.asarray(exact))
    best, _ = whole_grid_sup(fn, rtol_r)  # every pass evaluates the series on the whole grid, twice
    return float(best * (1.0 + 4.0 * (fn.k0 + 1) * n * eps))


def cpu_pair(old: Callable[[], object], new: Callable[[], object], repeats: int = 3) -> tuple[float, float, object, object]:
    """The smallest CPU seconds of ``old()`` and of ``new()`` over ``repeats`` alternating runs
    (the two share whatever load the machine has), and their results."""
    t_old, t_new, r_old, r_new = np.inf, np.inf, None, None
    for _ in range(repeats):
        t = time.process_time()
        r_old = old()
        t_old = min(t_old, time.process_time() - t)
        t = time.process_time()
        r_new = new()
        t_new = min(t_new, time.process_time() - t)
    return t_old, t_new, r_old, r_new


def family(name: str, mats: list[np.ndarray]) -> list[tuple[object, object]]:
    """Time and print one family; return its ``(value, certified)`` results."""
    t_val, t_ext, t_up, t_cert, diffs, ratio_up, evals_val, evals_cert = [], [], [], [], [], [], [], []
    t_up_naive, same_up = [], []
    results = []
    for B in mats:
        t, r = best_of(lambda: kreiss(B, upper=False))
        t_val.append(t)
        evals_val.append(r.n_evals)
        t, ext = best_of(lambda: exterior_value(B))
        t_ext.append(t)
        diffs.append(abs(r.value / ext - 1.0) if not r.method.startswith("closed form") else 0.0)
        t_naive, t, naive, pb = cpu_pair(lambda: naive_power_upper(B), lambda: power_upper_bound(B))
        t_up.append(t)
        t_up_naive.append(t_naive)
        same_up.append(naive == pb.value)
        ratio_up.append(pb.value / r.value)
        t, c = best_of(lambda: kreiss(B, certify=True, rtol=1e-3, upper=False), 1)
        t_cert.append(t)
        evals_cert.append(c.branch_bound.evaluations if c.branch_bound is not None else 0)
        results.append((r, c))
    ms = 1e3
    print(f"  {name} ({len(mats)} heads)")
    print(f"    value  : median {np.median(t_val) * ms:6.2f} ms, max {max(t_val) * ms:6.2f} (target <= 5), median sigma_min evals"
          f" {np.median(evals_val):.0f}; exterior search {np.median(t_ext) * ms:6.2f} ms"
          f" ({np.median(t_ext) / np.median(t_val):.1f}x), max rel. diff of the values {max(diffs):.1e}")
    print(f"    upper  : median {np.median(t_up) * ms:6.1f} ms CPU, upper/value median {np.median(ratio_up):.3f} (max {max(ratio_up):.3f});"
          f" naive reference {np.median(t_up_naive) * ms:6.1f} ms CPU (same heads, alternating), median ratio naive/new"
          f" {np.median(np.divide(t_up_naive, t_up)):.2f}x, total {sum(t_up_naive) / sum(t_up):.2f}x;"
          f" identical bound on {sum(same_up)}/{len(same_up)}")
    certified = sum(c.certified for _, c in results)
    widths = [c.hi / c.lo - 1 for _, c in results]
    print(f"    certify: median {np.median(t_cert):6.3f} s, max {max(t_cert):6.3f} (target <= 0.15), median evals"
          f" {np.median(evals_cert):.0f}, certified {certified}/{len(results)}, max hi/lo-1 {max(widths):.1e}")
    return results


def main() -> None:
    """Run the value, upper-bound and certified timings per family; brute-force agreement."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=Path, help="a .npy of causal attention matrices (..., n, n), float64")
    args = parser.parse_args()
    n = 128
    bench = heads(n, 3, seed=3)
    families = {"synthetic, bench's draw (seed 3)": [B for _, B in bench],
                "synthetic, second draw (seed 11)": [B for _, B in heads(n, 3, seed=11)]}
    if args.heads is not None:
        A = np.load(args.heads)
        families[f"saved heads {args.heads.name}"] = list(deflate(A.reshape(-1, *A.shape[-2:])))
    kreiss(bench[0][1], certify=True)  # compile / load the numba cache
    print(f"bench_kreiss: deflated heads n={n} (synthetic kinds sink, sink+prev, prev, plain)")
    results = {name: family(name, mats) for name, mats in families.items()}
    first = results["synthetic, bench's draw (seed 3)"]
    sub = [0, len(bench) // 4, len(bench) // 2, 3 * len(bench) // 4]
    errs, t_bf = [], []
    for i in sub:
        t, (ref, _) = best_of(lambda: kreiss_bruteforce(bench[i][1]), 1)
        t_bf.append(t)
        r, c = first[i]
        errs.append(abs(r.value / ref - 1.0))
        inside = c.lo <= ref * (1 + 1e-9) and ref <= c.hi * (1 + 1e-9)
        print(f"    {bench[i][0]:>9}: K={r.value:.10f} brute={ref:.10f} rel.diff {errs[-1]:.1e} bracket [{c.lo:.6f}, {c.hi:.6f}] contains brute: {inside}")
    t_val = np.median([best_of(lambda: kreiss(bench[i][1], upper=False))[0] for i in sub])
    t_cert = np.median([best_of(lambda: kreiss(bench[i][1], certify=True, rtol=1e-3, upper=False), 1)[0] for i in sub])
    print(f"  brute force: median {np.median(t_bf):.2f} s per matrix; value speed-up {np.median(t_bf) / t_val:.0f}x,"
          f" certify speed-up {np.median(t_bf) / t_cert:.0f}x; max rel. diff {max(errs):.1e} (target <= 1e-6)")


if __name__ == "__main__":
    main()
