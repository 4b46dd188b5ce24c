"""σ_min(zI − B) on a grid: compiled inverse iteration vs dense SVD per point (n = 512).

Target: ≥ 100× per core. Run ``python benchmarks/bench_sigma.py`` (single-threaded BLAS and
numba are set here so both sides use one core).
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

from depthlens.linalg import sigma_min, triangular_form  # noqa: E402


def main() -> None:
    """Time both methods on the same points and print the ratio and the agreement."""
    n = 512
    _, B = heads(n, 1, seed=1)[1]
    x = np.linspace(-1.5, 1.5, 12)
    Z = (x[None, :] + 1j * x[:, None]).ravel()
    tf = triangular_form(B)
    sigma_min(tf, Z[:2])  # compile / load the numba cache
    t = time.perf_counter()
    fast = sigma_min(tf, Z)
    t_fast = (time.perf_counter() - t) / Z.size
    sub = Z[:: max(1, Z.size // 12)]
    eye = np.eye(n)
    t = time.perf_counter()
    dense = np.array([np.linalg.svd(z * eye - B, compute_uv=False)[-1] for z in sub])
    t_dense = (time.perf_counter() - t) / sub.size
    idx = np.arange(0, Z.size, max(1, Z.size // 12))
    err = float(np.max(np.abs(fast.sigma[idx] / dense - 1.0)))
    print(f"bench_sigma: n={n}, {Z.size} grid points on [-1.5,1.5]^2 (deflated sink+prev head)")
    print(f"  inverse iteration (numba): {t_fast * 1e3:8.3f} ms/point, mean steps {fast.iterations.mean():.1f}, fallbacks {fast.n_fallback}")
    print(f"  dense SVD per point      : {t_dense * 1e3:8.3f} ms/point ({sub.size} points)")
    print(f"  speed-up {t_dense / t_fast:6.1f}x (target >= 100x); max relative difference {err:.1e}")


if __name__ == "__main__":
    main()
