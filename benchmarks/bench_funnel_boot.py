"""The chunk bootstrap of the claims' funnel (``--funnel-boot``, ``--init-seeds``) on SmolLM2: its
extra cost over the jacobian stage without it, measured in one run and projected to a preset.

(a) The funnel mode's operators: :func:`mean_operators` (batch sums, the stage without the
    bootstrap) against :func:`chunk_operator_sums` (chunk sums, the bootstrapped mode), both
    ``isolated`` over ``--chunks`` chunks of 128 tokens, ``--batch-size`` chunks per forward pass.
(b) The bootstrap itself: :func:`funnel_bootstrap` at rank 512 with 0 and ``--replicates``
    replicates on those chunk sums; the difference over the replicates is the cost of one.
(c) The projection to ``--preset-chunks`` chunks, ``--preset-replicates`` replicates and
    ``--preset-seeds`` step-0 nulls: the trained model and its null pay (chunk sums − batch sums)
    per chunk plus the replicates; each extra null pays its whole chunk pass plus the replicates.
    The chunk passes scale with the chunks, the replicates do not.

Times are CPU seconds of this process on ``torch.get_num_threads()`` threads (set
``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` to compare with a machine's cores), best of
``--repeat``. The replicates' numbers are checked against :func:`cumulative_ranks` of replicate 0.

``python benchmarks/bench_funnel_boot.py [--chunks 8] [--replicates 10] [--repeat 1]``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from depthlens.jacobian.bootstrap import bootstrap_weights, funnel_bootstrap
from depthlens.jacobian.cumulative import cumulative_ranks
from depthlens.jacobian.engines import chunk_operator_sums, mean_operators
from depthlens.jacobian.store import operator_list, sublayer_keys_backward
from depthlens.models import load_model

RANK = 512


def best(func: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Least CPU seconds of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.process_time()
        result = func()
        times.append(time.process_time() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--replicates", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--preset-chunks", type=int, default=32)
    parser.add_argument("--preset-replicates", type=int, default=50)
    parser.add_argument("--preset-seeds", type=int, default=3)
    args = parser.parse_args()
    adapter = load_model("smollm2-135m").adapter
    ids = torch.randint(0, 40000, (args.chunks, 128), generator=torch.Generator().manual_seed(0))
    keys = sublayer_keys_backward(adapter.n_layers)

    def sums() -> list:
        return list(chunk_operator_sums(adapter, ids, keys, batch_size=args.batch_size))

    t_mean, means = best(lambda: mean_operators(adapter, ids, batch_size=args.batch_size), args.repeat)
    t_chunks, chunk_sums = best(sums, args.repeat)
    runs = {}
    for R in (0, args.replicates):
        weights = bootstrap_weights(args.chunks, R, seed=0)
        runs[R] = best(lambda w=weights: funnel_bootstrap(iter(chunk_sums), w, len(keys), RANK), args.repeat)
    per_replicate = (runs[args.replicates][0] - runs[0][0]) / args.replicates
    table = runs[args.replicates][1]
    curve = cumulative_ranks(operator_list(means), "backward", RANK).sort_values("steps")["erank"].to_numpy()
    agree = np.abs(table.loc[0, ["erank_one_step", "erank_full_depth"]].to_numpy(float) - curve[[0, -1]]).max()

    print(f"SmolLM2-135M, {args.chunks} chunks of 128 tokens, isolated, {torch.get_num_threads()} thread(s)")
    print(f"(a) batch sums (mean_operators)     {t_mean:8.1f} s   ({t_mean / args.chunks:.2f} s per chunk)")
    print(f"    chunk sums (chunk_operator_sums) {t_chunks:7.1f} s   ({t_chunks / args.chunks:.2f} s per chunk; "
          f"ratio {t_chunks / t_mean:.2f})")
    print(f"(b) bootstrap, point only            {runs[0][0]:7.1f} s")
    print(f"    bootstrap, {args.replicates} replicates          {runs[args.replicates][0]:7.1f} s   "
          f"({per_replicate:.2f} s per replicate)")
    print(f"    replicate 0 against the curve of the batch means: largest erank difference {agree:.2e}")
    extra_chunk = (t_chunks - t_mean) / args.chunks
    pass_chunk = t_chunks / args.chunks
    C, R, S = args.preset_chunks, args.preset_replicates, args.preset_seeds
    extra = 2 * (C * extra_chunk + R * per_replicate) + (S - 1) * (C * pass_chunk + runs[0][0] + R * per_replicate)
    print(f"(c) projected extra CPU time at {C} chunks, {R} replicates, {S} step-0 nulls: {extra:.0f} s "
          f"(trained and init: {2 * (C * extra_chunk + R * per_replicate):.0f} s; "
          f"{S - 1} extra nulls: {extra - 2 * (C * extra_chunk + R * per_replicate):.0f} s)")


if __name__ == "__main__":
    main()
