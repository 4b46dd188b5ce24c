"""The paper's jacobian protocol at Llama-3.1-8B's shape, per operator, and its projection to
32 layers on 2 cores (issue 30's 3-hour target).

The protocol: isolated operators of both sub-layers and of the layer (one chunk of 64 tokens,
last position), every operator's B2 metrics, and the backward rank-512 funnel at α ∈ {0, 1}
under every Schur order (:data:`~depthlens.linalg.schur.SCHUR_ORDERS`) over the 64 sub-layer
operators. A streamed 32-layer run of it takes hours, so this script measures its parts on
layer ``--layer`` of a layerwise random model of that shape (``random:llama:init=layerwise``,
d = 4096, 32 query / 8 key-value heads, d_ff 14336; streamed, so one layer's weights are in
memory), one BLAS thread per process as the stage's workers run:

- the layer's two mean sub-layer Jacobians (:func:`~depthlens.jacobian.mean.mean_operators`);
- per sub-layer operator: :func:`~depthlens.jacobian.metrics.operator_metrics` (a real Schur
  form without vectors and an SVD with vectors), the Schur forms of every order as the funnel
  computes them (:func:`~depthlens.linalg.schur.schur_forms`: one complex decomposition, two
  reorderings, the canonical form), and their normal parts;
- one backward rank-512 funnel step, real (α = 1) and complex (α = 0), as the funnel's own
  accumulator takes it (:class:`~depthlens.jacobian.cumulative._Accumulator`: the d × d operator
  times the d × 512 factor, and that product's singular values) against the naive step, the
  exact product's (the d × d product and its singular values), the ratio printed.

The projection for 32 layers assumes the stage's two workers share the per-operator work
evenly (metrics of 96 operators, Schur forms of 64, five curves of 64 steps) and the
Jacobians run as measured; it prints each part, the total against 3 hours, and which part
dominates, and this process's peak resident memory. That is not the stage's: this process
holds the streamed layer and its float64 copy, both operators, and all four Schur forms of an
operator with their normal parts at once (``bench_stream.py --protocol`` measures the stage's
own peak, workers included).

``python benchmarks/bench_protocol_8b.py [--layer 1]``
"""

from __future__ import annotations

import argparse
import os
import resource
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from depthlens.jacobian.cumulative import _Accumulator  # noqa: E402
from depthlens.jacobian.mean import mean_operators  # noqa: E402
from depthlens.jacobian.metrics import operator_metrics  # noqa: E402
from depthlens.linalg.schur import SCHUR_ORDERS, schur_forms  # noqa: E402
from depthlens.models import load_model  # noqa: E402

SHAPE = ("random:llama:init=layerwise,hidden_size=4096,num_hidden_layers={layers},num_attention_heads=32,"
         "num_key_value_heads=8,intermediate_size=14336,max_position_embeddings=8192")
LAYERS, RANK, WORKERS, TARGET_H = 32, 512, 2, 3.0


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _step(J: np.ndarray, factor: np.ndarray) -> float:
    """Seconds of one funnel step on the running product held as ``factor`` (d × k): the
    accumulator's ``J @ factor`` and its singular values (k = 512 truncated, k = d exact)."""
    acc = _Accumulator(factor.shape[1])
    acc.factor = factor
    return _timed(lambda: acc.push(J))[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", type=int, default=1, help="which layer's operators are measured (1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(SHAPE.format(layers=args.layer + 1), stream_layers=True)
    ids = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(0))  # the random model's vocabulary
    t_jac, ops = _timed(lambda: mean_operators(loaded.adapter, ids, layers=[args.layer]))
    print(f"bench_protocol_8b: layer {args.layer} of the Llama-3.1-8B shape (d = 4096), one chunk of 64 tokens, "
          f"1 BLAS thread")
    print(f"  mean sub-layer Jacobians (isolated, both sub-layers): {t_jac:7.1f} s")
    timings = []  # per sub-layer operator: seconds of its metrics, Schur forms and normal parts
    for (_, kind), J in ops.items():
        J = np.ascontiguousarray(J)
        t_m, _ = _timed(lambda J=J: operator_metrics(J))
        t_s, got = _timed(lambda J=J: schur_forms(J, SCHUR_ORDERS))
        t_n, _ = _timed(lambda got=got: [f.normal_part for f in got])
        timings.append((t_m, t_s, t_n))
        print(f"  {kind:4s}: metrics {t_m:6.1f} s; Schur forms in {len(SCHUR_ORDERS)} orders {t_s:6.1f} s; "
              f"their normal parts {t_n:5.1f} s")
    metrics, forms, parts = (np.array(column) for column in zip(*timings))
    J = np.ascontiguousarray(next(iter(ops.values())))
    d = J.shape[0]
    rng = np.random.default_rng(0)
    F = np.linalg.qr(rng.standard_normal((d, RANK)))[0]
    Fc = F + 1j * np.linalg.qr(rng.standard_normal((d, RANK)))[0]
    t_real, t_cplx = _step(J, F), _step(J.astype(np.complex128), Fc)
    t_naive = _step(J, rng.standard_normal((d, d)))
    print(f"  funnel step, rank {RANK}: real {t_real:5.2f} s, complex {t_cplx:5.2f} s; naive (the exact product's "
          f"step: d x d product and its singular values, real) {t_naive:5.1f} s: {t_naive / t_real:5.1f}x the "
          f"truncated real step")
    n_sub, n_ops = 2 * LAYERS, 3 * LAYERS
    parts_h = {
        "Jacobians": LAYERS * t_jac / 3600,
        "metrics": n_ops * metrics.mean() / WORKERS / 3600,
        "Schur forms": LAYERS * forms.sum() / WORKERS / 3600,
        "normal parts": LAYERS * parts.sum() / WORKERS / 3600,
        "curves": n_sub * (t_real + len(SCHUR_ORDERS) * t_cplx) / WORKERS / 3600,
    }
    total = sum(parts_h.values())
    print(f"  projection, {LAYERS} layers on {WORKERS} workers: " + ", ".join(f"{k} {v:4.2f} h" for k, v in parts_h.items())
          + f"; total {total:4.2f} h = {total / TARGET_H:4.2f}x the {TARGET_H:g}-hour target "
          f"(largest: {max(parts_h, key=parts_h.get)})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    print(f"  peak resident memory of this process: {peak:4.2f} GiB (the layer and its float64 copy, both operators, "
          "four Schur forms and their normal parts at once; bench_stream.py --protocol measures the stage's own)")


if __name__ == "__main__":
    main()
