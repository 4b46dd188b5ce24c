"""``benchmarks/device_check.sh cpu``: the CPU half of the GPU device check runs and passes
(the same code paths as on a GPU, with the CPU on both sides), and a difference beyond its
tolerance fails the script."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlens.jacobian.options import JACOBIAN_MODES

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.real
def test_cpu_half_runs_and_prints_its_checks() -> None:
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "device_check.sh"), "cpu"],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    expected = ["tiny random llama float64 logits", "tiny random llama float32 attention probs",
                *(f"jacobian mean operators {mode}" for mode in JACOBIAN_MODES), "sigma_min grid (torch vs numba)",
                "schur funnel curves (device vs LAPACK)", "8B-layer-shape streamed float32 logits"]
    checks = [line for line in out.splitlines() if line.startswith("check ")]
    for name in expected:
        assert any(line.startswith(f"check {name}: max diff") for line in checks), name
    assert all(line.endswith(" ok") for line in checks), checks
    assert "time sigma_min grid n=128" in out and "time forward" in out and "time funnel curve" in out
    assert "skip depthlens run --device and the 8B-shape attention and jacobian stages: GPU only" in out
    assert out.rstrip().endswith("device_check: all checks passed")


def test_a_difference_beyond_tolerance_fails(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "benchmarks" / "device_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = module.Report(budget=10.0)
    report.check("within", 1e-12, 1e-10)
    report.check("beyond", 1e-9, 1e-10)
    assert report.failures == ["beyond"]
    assert "check beyond: max diff 1.000e-09 (tol 1e-10) FAIL" in capsys.readouterr().out
