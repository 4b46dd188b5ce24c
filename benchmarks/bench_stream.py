"""Layer streaming (``--stream-layers``): what it costs, and a model of Llama-3.1-8B's shape in
little memory.

1. A layerwise random Llama (d = 1024, 8 layers) in memory and streamed, same run: one forward
   pass with attention probabilities, residual states and a layer's float64 weights; prints
   both times, their ratio (streaming's overhead: every layer is filled again per pass), the
   layer fills, and whether the numbers are equal bit for bit.
2. ``depthlens attention`` on ``random:llama:init=layerwise`` of Llama-3.1-8B's shape (d = 4096,
   32 layers, 32 query / 8 key-value heads, d_ff 14336), streamed: one chunk of 64 tokens, a
   probe of 8 sequences of block length 16 (the default probe, 128 × 129 tokens, is about
   2.5e14 flops of forward passes: over an hour on 2 cores), no certified brackets (this
   random model's heads are nearly one-hot; the branch and bound takes 15–40 s on about half
   of them and then gives up uncertified, hours for 1024 heads), in a child process whose peak
   memory is sampled as in part 3. Prints the wall time, the peak (target
   < 8 GiB) and the float32 weights the model would need in memory (the naive method, not
   run: 32 GB). ``--skip-8b`` leaves it out.
3. ``depthlens topology`` (the jacobian stage, then topology) on the same model, streamed: one
   chunk of 64 tokens, the ``isolated`` operators only, no step-0 null, the exact funnel at
   α = 1 only (``--funnel-rank 0 --funnel-alphas 1 --schur-orders lapack``: the default
   funnel is 32 curves of 64 products of 4096 × 4096, days on 2 cores), ``--jobs 1`` by
   default (``--jobs N``: N worker processes). Its operators (12.9 GB) are written to the
   run's file and read through memory maps, its co-moments (8.6 GB) to a scratch file under
   ``$TMPDIR``. Prints the wall time of each stage and the peak memory (target < 8 GiB) of
   the whole process tree: the largest sum, sampled every second, of the proportional set
   sizes (PSS: a page shared by several processes, such as a memory-mapped operator, counts
   once) of the run and its workers. About 3 hours on one core with 32 layers (about 70 s per
   4096 × 4096 operator's Schur form and SVD, 96 of them, and 128 exact funnel steps of about
   25 s); ``--jacobian-layers N`` runs N layers of the same shape, ``--jacobian-only`` skips
   topology, ``--skip-8b`` leaves parts 2 and 3 out.

   ``--protocol`` runs this part alone, under the paper's protocol (the jacobian stage: isolated
   operators, their metrics, the rank-512 funnel at α ∈ {0, 1} under every Schur order, no
   exact products at this width, no step-0 null, no bootstrap), at 1 layer and at N
   (``--jacobian-layers``, at least 2), and projects the time to 32 layers from the two: the
   1-layer time (loading and start-up included) plus 31 times the cost of a further layer,
   ``(T_N − T_1) / (N − 1)`` (the 3-hour target of issue 30).

``python benchmarks/bench_stream.py [--skip-8b] [--jacobian-layers N] [--jobs N] [--jacobian-only] [--protocol]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from depthlens.models import load_model

SMALL = "random:llama:init=layerwise,hidden_size=1024,num_attention_heads=16,num_key_value_heads=4," \
        "intermediate_size=4096,num_hidden_layers=8"
LLAMA_8B = ("random:llama:init=layerwise,hidden_size=4096,num_hidden_layers=32,num_attention_heads=32,"
            "num_key_value_heads=8,intermediate_size=14336,max_position_embeddings=8192")
#: Parameters of one decoder layer and of the embeddings + LM head of Llama-3.1-8B (vocabulary 128256).
LAYER_8B = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
OUTSIDE_8B = 2 * 128256 * 4096 + 4096


def _pass(loaded, ids: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """Seconds of one probabilities pass, one residual pass and one layer's weights; the results."""
    start = time.perf_counter()
    probs = [p for _, p in loaded.adapter.attention_probs(ids)]
    states = loaded.adapter.residual_states(ids)
    weights = loaded.adapter.layer_weights(3).Wd
    return time.perf_counter() - start, [*probs, states, weights]


def overhead() -> None:
    """Part 1: in memory against streamed on the same weights."""
    ids = torch.randint(0, 256, (4, 128), generator=torch.Generator().manual_seed(0))
    memory, streamed = load_model(SMALL), load_model(SMALL, stream_layers=True)
    t_mem, out_mem = min((_pass(memory, ids) for _ in range(2)), key=lambda r: r[0])
    fills = streamed.adapter.streamer.loads
    t_str, out_str = min((_pass(streamed, ids) for _ in range(2)), key=lambda r: r[0])
    fills = (streamed.adapter.streamer.loads - fills) / 2
    equal = all(torch.equal(a, b) for a, b in zip(out_mem, out_str))
    print(f"bench_stream: {SMALL} (4 x 128 tokens)")
    print(f"  in memory: {t_mem:7.2f} s   streamed: {t_str:7.2f} s   ratio {t_str / t_mem:5.2f}x "
          f"({fills:.0f} layer fills per round of 2 forward passes + 1 weight copy); equal bit for bit: {equal}")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc/*/stat`` (Linux)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(child for child, ppid in parent.items() if ppid == found[-1])
    return found


def _pss_gib(pids: list[int]) -> tuple[float, float]:
    """The summed proportional set sizes of ``pids`` in GiB (``/proc/PID/smaps_rollup``): of
    anonymous and shared memory (what must stay in RAM), and of file-backed pages (pages of
    memory-mapped files, such as the operator file: page cache the kernel writes back and
    reclaims under pressure)."""
    totals = {"Pss_Anon:": 0, "Pss_Shmem:": 0, "Pss_File:": 0}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, *rest = line.split()
            if key in totals:
                totals[key] += int(rest[0])
    gib = 1024 / 2**30  # kB
    return (totals["Pss_Anon:"] + totals["Pss_Shmem:"]) * gib, totals["Pss_File:"] * gib


def _child(argv: list[str]) -> tuple[int, float, float, float]:
    """Run ``argv``; its exit status, wall seconds, and the peak memory in GiB of it and its
    workers together, sampled every second: the largest summed anonymous PSS of the process
    tree (what must fit in RAM), and the largest summed file-backed PSS (mapped files)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv)
    peak, done = [0.0, 0.0], threading.Event()

    def sample() -> None:
        while not done.wait(1.0):
            anon, mapped = _pss_gib(_tree(process.pid))
            peak[0], peak[1] = max(peak[0], anon), max(peak[1], mapped)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    process.wait()
    done.set()
    sampler.join()
    return process.returncode, time.perf_counter() - start, peak[0], peak[1]


def llama_8b() -> None:
    """Part 2: the streamed attention stage of the 8B-shaped model in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(Path(sys.executable).with_name("depthlens")), "attention", "--model", LLAMA_8B, "--stream-layers",
                "--chunks", "1", "--seq-len", "64", "--batch-size", "1", "--probe-seqs", "8", "--probe-len", "16",
                "--certify", "none", "--jobs", "1", "--quiet", "--out", str(Path(tmp) / "run")]
        code, elapsed, peak, mapped = _child(argv)
    print("bench_stream: Llama-3.1-8B shape, streamed, attention stage (1 chunk x 64 tokens, probe 8 x 16, "
          "--certify none)")
    print(f"  exit {code}; {elapsed / 60:6.1f} min; peak memory {peak:5.2f} GiB (anonymous PSS of the process tree; "
          f"target < 8 GiB), and {mapped:5.2f} GiB of memory-mapped file pages (reclaimable page cache)")
    print(f"  naive (all float32 weights in memory, not run): {(32 * LAYER_8B + OUTSIDE_8B) * 4 / 2**30:5.1f} GiB of "
          f"weights alone; streamed holds {(LAYER_8B + OUTSIDE_8B) * 4 / 2**30:4.1f} GiB with the real vocabulary "
          f"(this random model's is 256)")


#: The jacobian stage's funnel options: the exact funnel at α = 1 alone (part 3), or the paper's protocol (--protocol).
FUNNEL = {False: ["--funnel-rank", "0", "--funnel-alphas", "1", "--schur-orders", "lapack"],
          True: ["--funnel-rank", "512", "--funnel-alphas", "0,1", "--funnel-boot", "0"]}


def jacobian_8b(layers: int, jobs: int = 1, topology: bool = True, protocol: bool = False) -> float:
    """Part 3: the streamed jacobian (and topology) stages of the 8B-shaped model (``layers`` deep);
    ``protocol``: the jacobian stage under the paper's protocol. Returns the wall seconds."""
    spec = LLAMA_8B.replace("num_hidden_layers=32", f"num_hidden_layers={layers}")
    topology = topology and not protocol
    stage = "topology" if topology else "jacobian"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [str(Path(sys.executable).with_name("depthlens")), stage, "--model", spec, "--stream-layers",
                "--chunks", "1", "--seq-len", "64", "--jacobian-mode", "isolated", "--null", "none", *FUNNEL[protocol],
                "--jobs", str(jobs), "--quiet", "--out", str(out)]
        code, elapsed, peak, mapped = _child(argv)
        stages = json.loads((out / "manifest.json").read_text())["stages"] if (out / "manifest.json").is_file() else {}
    funnel = ("the rank-512 funnel at alpha in {0, 1} under every Schur order (the paper's protocol)" if protocol
              else "exact funnel at alpha = 1")
    print(f"bench_stream: Llama-3.1-8B shape with {layers} layers, streamed, jacobian{' + topology' if topology else ''} "
          f"stage{'s' if topology else ''} (1 chunk x 64 tokens, isolated operators, {funnel}, no step-0 "
          f"null, --jobs {jobs})")
    times = ", ".join(f"{name} {record.get('seconds', float('nan')) / 60:.1f} min ({record.get('status')})"
                      for name, record in stages.items())
    print(f"  exit {code}; {elapsed / 60:6.1f} min ({times}); peak memory {peak:5.2f} GiB (anonymous PSS of the process tree; "
          f"target < 8 GiB), and {mapped:5.2f} GiB of memory-mapped file pages (reclaimable page cache)")
    n_ops = 3 * layers
    print(f"  naive (every operator and co-moment in memory, not run): {n_ops * 4096**2 * 8 / 2**30:5.1f} GiB of "
          f"operators and {2 * layers * 4096**2 * 8 / 2**30:5.1f} GiB of co-moments")
    return elapsed


def protocol_8b(layers: int, jobs: int) -> None:
    """``--protocol``: the jacobian stage under the paper's protocol at 1 and ``layers`` layers,
    and the projection to 32 layers."""
    if layers < 2:
        raise SystemExit("--protocol needs --jacobian-layers 2 or more (it also runs 1 layer, for the difference)")
    one = jacobian_8b(1, jobs, protocol=True)
    many = jacobian_8b(layers, jobs, protocol=True)
    per_layer = (many - one) / (layers - 1)
    hours = (one + 31 * per_layer) / 3600
    print(f"  projection to 32 layers: {one / 60:.1f} min for the first layer (loading and start-up included) + 31 x "
          f"{per_layer / 60:.1f} min = {hours:4.2f} h, {hours / 3:4.2f}x the 3-hour target")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-8b", action="store_true", help="only the in-memory / streamed comparison")
    parser.add_argument("--jacobian-layers", type=int, default=32, help="layers of the 8B-shaped jacobian run (32)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes of the jacobian run (1)")
    parser.add_argument("--jacobian-only", action="store_true", help="the jacobian stage without topology")
    parser.add_argument("--protocol", action="store_true",
                        help="the paper's jacobian protocol (no topology) at 1 and N layers, projected to 32 layers")
    args = parser.parse_args()
    if args.protocol:
        protocol_8b(args.jacobian_layers, args.jobs)
        return
    overhead()
    if not args.skip_8b:
        llama_8b()
        jacobian_8b(args.jacobian_layers, args.jobs, topology=not args.jacobian_only, protocol=args.protocol)


if __name__ == "__main__":
    main()
