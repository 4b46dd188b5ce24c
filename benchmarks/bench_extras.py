"""The attention stage's extra per-head quantities (docs/methods.md#a3) on deflated causal attention
heads B = A − 1e₁ᵀ (n = 128, three of each kind of ``_matrices.KINDS``): the ε-pseudospectral
radius for ε ∈ {1e-3, 1e-2, 1e-1} and the numerical radius.

Because DBD ≥ 0 for D = diag(−1, 1, …, 1), the positive real axis attains ρ_ε and θ = 0
attains the numerical radius (:func:`~depthlens.linalg.pseudospectral_radius`,
:func:`~depthlens.linalg.normality.numerical_radius`). The naive method, measured in the same
run, is the general search over every line and angle, forced by passing the same matrix as a
complex array. Prints the time per matrix of each, the ratio and the largest relative
difference of the values. About 30 s on one core.

A complex matrix has no conjugate symmetry, so its search covers the whole circle: twice the
lines of the real search the stage ran before the axis paths, which spent about 130 ms per
matrix here on these quantities (so against the previous code the gain is about 28x, not the
printed ratio).
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

from depthlens.linalg import pseudospectral_radius  # noqa: E402
from depthlens.linalg.normality import numerical_radius  # noqa: E402

EPS = (1e-3, 1e-2, 1e-1)


def extras(B: np.ndarray) -> np.ndarray:
    """ρ_ε(B) for each ε of :data:`EPS`, then w(B)."""
    return np.array([*(pseudospectral_radius(B, e).value for e in EPS), float(numerical_radius(B))])


def timed(matrices: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """Seconds per matrix and the values, (len(matrices), 4)."""
    start = time.perf_counter()
    values = np.array([extras(B) for B in matrices])
    return (time.perf_counter() - start) / len(matrices), values


def main() -> None:
    matrices = [B for _, B in heads(128, 3, seed=7)]
    extras(matrices[0])  # compile / load the numba cache
    t_axis, axis = timed(matrices)
    t_lines, lines = timed([B.astype(np.complex128) for B in matrices])
    rel = np.abs(axis - lines) / np.abs(lines)
    print(f"bench_extras: {len(matrices)} deflated heads, n = 128; psr_B at eps {', '.join(f'{e:g}' for e in EPS)} "
          "and num_radius_B")
    print(f"  real axis and theta = 0:       {1e3 * t_axis:8.1f} ms per matrix")
    print(f"  every line and angle (naive):  {1e3 * t_lines:8.1f} ms per matrix")
    print(f"  speed-up {t_lines / t_axis:5.1f}x; largest relative difference {rel.max():.1e} "
          f"(psr {rel[:, :3].max():.1e}, numerical radius {rel[:, 3].max():.1e})")


if __name__ == "__main__":
    main()
