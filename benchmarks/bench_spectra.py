"""Spectral metrics, cumulative products and the Schur funnel of 60 operators of size 576
(the sub-layer Jacobians of SmolLM2-135M), against naive versions measured in the same run.

The naive versions: every metric recomputes its own decomposition from the matrix (an
eigendecomposition per spectral metric, an SVD per singular metric, a complex Schur form per
Henrici departure); every cumulative product is rebuilt from scratch at every depth (and a
truncated one is truncated by a full SVD of the d×d product at every step); the naive
funnel recomputes the Schur form for every α. The slowest naive versions run on a subset,
and the fast version is timed on the same subset for the ratio.

``python benchmarks/bench_spectra.py`` (or ``make bench``). LAPACK threads follow
``OPENBLAS_NUM_THREADS``; on a machine shared with other processes, 1 is much faster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from depthlens.jacobian import cumulative_ranks, metrics_table, schur_funnel
from depthlens.linalg import (
    complex_fraction,
    erank,
    erank_sigma,
    expansion_fraction,
    henrici_rel,
    participation,
    rotation_angle_mean,
    schur_split,
    self_alignment,
    stable_rank,
    symmetry_index,
)

D = 576
N_LAYERS = 30  # 60 sub-layer operators
RANKS = {"attn": 192, "mlp": 512}  # rank of U = J − I before the noise
NAIVE_METRIC_OPS = 4  # operators timed with the naive metrics
NAIVE_PRODUCT_OPS = 60  # depth of the naive cumulative products (all)
FUNNEL_SUBSET = 8  # depth of the fast-versus-naive funnel comparison


def operators(seed: int = 0) -> dict[tuple[int, str], np.ndarray]:
    """``I + low rank + noise`` per sub-layer, deterministic."""
    rng = np.random.default_rng(seed)
    ops = {}
    for layer in range(N_LAYERS):
        for sub, rank in RANKS.items():
            low = rng.standard_normal((D, rank)) @ rng.standard_normal((rank, D)) / (D * np.sqrt(rank / 64))
            ops[(layer, sub)] = np.eye(D) + low + 0.01 * rng.standard_normal((D, D)) / np.sqrt(D)
    return ops


def naive_metrics(J: np.ndarray) -> dict[str, float]:
    U = J - np.eye(len(J))
    out = {
        "cond": float(np.linalg.cond(J)),
        "henrici_rel": float(henrici_rel(J)),
        "henrici_update_rel": float(henrici_rel(U)),
        "symmetry": float(symmetry_index(J)),
        "symmetry_update": float(symmetry_index(U)),
        "complex_frac": float(complex_fraction(np.linalg.eigvals(J))),
        "rot_angle_mean": float(rotation_angle_mean(np.linalg.eigvals(U))),
        "expand_eig": float(expansion_fraction(np.linalg.eigvals(J))),
        "expand_sv": float(expansion_fraction(np.linalg.svd(J, compute_uv=False))),
        "spectral_radius": float(np.abs(np.linalg.eigvals(J)).max()),
    }
    for k in (1, 8, 64):
        out[f"self_align_{k}"] = float(self_alignment(J, k))
    for fn in (erank, erank_sigma, participation, stable_rank):
        out[fn.__name__] = float(fn(J))
    return out


def naive_curve(ops: list[np.ndarray], rank: int | None = None) -> list[float]:
    """Forward erank per depth: every product from scratch (exact), or the full d×d product
    truncated by a full SVD after every step (truncated)."""
    if rank is None:
        return [float(erank(np.linalg.multi_dot(ops[: b + 1][::-1]) if b else ops[0])) for b in range(len(ops))]
    out, C = [], None
    for J in ops:
        C = J if C is None else J @ C
        u, s, vh = np.linalg.svd(C)
        C = (u[:, :rank] * s[:rank]) @ vh[:rank]
        C /= s[0]
        out.append(float(erank(s[:rank])))
    return out


def naive_funnel(ops: list[np.ndarray], alphas: tuple[float, ...]) -> dict[float, list[float]]:
    """Schur form recomputed for every α (schur_split on the matrix), products from scratch."""
    return {a: naive_curve([schur_split(J, a) for J in ops]) for a in alphas}


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    print(f"d = {D}, {2 * N_LAYERS} operators, OPENBLAS_NUM_THREADS = {os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    ops = operators()
    seq = list(ops.values())

    t_fast, table = timed(lambda: metrics_table(ops))
    subset = dict(list(ops.items())[:NAIVE_METRIC_OPS])
    t_naive, naive = timed(lambda: [naive_metrics(J) for J in subset.values()])
    worst = max(abs(table.iloc[i][k] - v) / max(abs(v), 1e-300) for i, row in enumerate(naive) for k, v in row.items())
    per_fast, per_naive = t_fast / len(ops), t_naive / len(subset)
    print(f"metrics_table, {len(ops)} operators: {t_fast:.1f} s ({per_fast:.2f} s/op); naive {per_naive:.2f} s/op "
          f"(on {len(subset)}) -> ratio {per_naive / per_fast:.1f}x; max rel. difference {worst:.1e}")

    for direction in ("forward", "backward"):
        for rank in (None, 512, 64):
            t, curve = timed(lambda: cumulative_ranks(seq, direction, rank=rank))
            label = "exact" if rank is None else f"rank {rank}"
            print(f"cumulative {direction:8s} {label:8s}: {t:5.1f} s for {len(seq)} depths; erank {curve['erank'].iloc[0]:.1f} -> "
                  f"{curve['erank'].iloc[-1]:.1f} (first -> last depth), log_norm at full product {curve['log_norm'].iloc[-1 if direction == 'forward' else 0]:.1f}")

    part = seq[:NAIVE_PRODUCT_OPS]
    for rank in (None, 512):
        label = "exact" if rank is None else f"rank {rank}"
        t_fast, fast = timed(lambda: cumulative_ranks(part, rank=rank))
        t_naive, slow = timed(lambda: naive_curve(part, rank))
        diff = np.max(np.abs(fast["erank"].to_numpy() - slow) / np.asarray(slow))
        print(f"cumulative forward {label} on {len(part)} depths: {t_fast:.1f} s vs naive {t_naive:.1f} s -> ratio "
              f"{t_naive / t_fast:.1f}x; max rel. difference {diff:.1e}")

    sub = seq[:FUNNEL_SUBSET]
    alphas = (0.0, 0.5, 1.0)
    t_fast, fast = timed(lambda: schur_funnel(sub, alphas=alphas, directions=("forward",)))
    t_naive, slow = timed(lambda: naive_funnel(sub, alphas))
    diff = max(np.max(np.abs(fast[fast["schur_alpha"] == a]["erank"].to_numpy() - slow[a]) / np.asarray(slow[a])) for a in alphas)
    print(f"schur_funnel forward, alphas {alphas}, {len(sub)} depths: {t_fast:.1f} s vs naive {t_naive:.1f} s -> ratio "
          f"{t_naive / t_fast:.1f}x; max rel. difference {diff:.1e}")

    t, funnel = timed(lambda: schur_funnel(seq))
    last = funnel[(funnel["direction"] == "forward") & (funnel["depth"] == len(seq) - 1)].set_index("schur_alpha")["erank"]
    print(f"schur_funnel, {len(seq)} operators, 5 alphas x 2 directions, exact: {t:.1f} s; forward erank at full depth by alpha: "
          + ", ".join(f"{a:g}: {v:.1f}" for a, v in last.items()))


if __name__ == "__main__":
    main()
