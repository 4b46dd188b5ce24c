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
* the power-norm upper bound (median time, and its ratio to the value);
* certify: ``kreiss(B, certify=True, rtol=1e-3, upper=False)`` (target median ≤ 0.15 s) with
  its σ_min evaluation counts and certified count;
* on four heads of the bench's draw: agreement of the value with the brute-force reference
  (target 1e-6 relative) and whether the bracket contains it, against the brute-force time.

The code before the real-axis search (commit 482d446), run beside the current one on this
machine (2 cores shared with other work; one BLAS thread as here; medians over heads of the
best of three, over several runs): value 7.8–14 ms on the two synthetic draws and 8.5–9.5 ms
on SmolLM2-135M's 270 heads of one chunk (the current code 1.4–1.7 ms); certify
(``upper=False``) 0.018–0.033 s (the current code 0.010–0.015 s).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _matrices import heads  # noqa: E402

from depthlens.linalg import kreiss, power_upper_bound  # noqa: E402
from depthlens.linalg.causal import deflate  # noqa: E402
from depthlens.linalg.kreiss_bound import spectrum_status  # noqa: E402
from depthlens.linalg.kreiss_search import search  # noqa: E402
from depthlens.linalg.reference import kreiss_bruteforce  # noqa: E402
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


def family(name: str, mats: list[np.ndarray]) -> list[tuple[object, object]]:
    """Time and print one family; return its ``(value, certified)`` results."""
    t_val, t_ext, t_up, t_cert, diffs, ratio_up, evals_val, evals_cert = [], [], [], [], [], [], [], []
    results = []
    for B in mats:
        t, r = best_of(lambda: kreiss(B, upper=False))
        t_val.append(t)
        evals_val.append(r.n_evals)
        t, ext = best_of(lambda: exterior_value(B))
        t_ext.append(t)
        diffs.append(abs(r.value / ext - 1.0) if not r.method.startswith("closed form") else 0.0)
        t, pb = best_of(lambda: power_upper_bound(B), 1)
        t_up.append(t)
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
    print(f"    upper  : median {np.median(t_up) * ms:6.1f} ms, upper/value median {np.median(ratio_up):.3f} (max {max(ratio_up):.3f})")
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
