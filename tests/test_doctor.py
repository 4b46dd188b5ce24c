"""The environment block and ``depthlens doctor`` (integration tier: one tiny random Llama)."""

from __future__ import annotations

import io
import json
import pathlib

import numpy as np
import pytest

from depthlens import doctor
from depthlens.environment import (
    NUMERIC_ENV_VARS,
    environment_block,
    format_environment,
)

LINALG_CHECKS = tuple(c for c in doctor.CHECKS if c[0] in ("sigma_min", "kreiss_value", "kreiss_upper"))


# ----------------------------------------------------------------------------- environment


def test_block_is_json_and_reports_openblas_kernel() -> None:
    from threadpoolctl import threadpool_info

    block = environment_block()
    assert json.loads(json.dumps(block)) == block
    assert set(block) >= {"blas", "torch", "numpy", "scipy", "numba", "env", "cpu", "platform", "python"}
    assert set(block["env"]) == set(NUMERIC_ENV_VARS)
    expected = sorted(
        (lib["version"], lib.get("architecture"), lib["num_threads"])
        for lib in threadpool_info()
        if lib["internal_api"] == "openblas"
    )
    if not expected:
        pytest.skip("no OpenBLAS loaded in this environment")
    got = sorted(
        (lib["version"], lib["architecture"], lib["num_threads"])
        for lib in block["blas"]
        if lib["internal_api"] == "openblas"
    )
    assert got == expected
    text = format_environment(block)
    for _, arch, _ in expected:
        assert f"kernel {arch}" in text
    assert block["torch"]["num_threads"] >= 1 and isinstance(block["torch"]["mkl"], bool)
    if pathlib.Path("/proc/cpuinfo").is_file():
        assert isinstance(block["cpu"]["simd"], list)


def test_env_vars_are_picked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.delenv("MKL_CBWR", raising=False)
    block = environment_block()
    assert block["env"]["OPENBLAS_CORETYPE"] == "Haswell"
    assert block["env"]["MKL_CBWR"] is None
    assert "OPENBLAS_CORETYPE=Haswell" in format_environment(block)


def test_block_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import threadpoolctl

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("unreadable")

    monkeypatch.setattr(threadpoolctl, "threadpool_info", boom)
    monkeypatch.setattr(pathlib.Path, "read_text", boom)
    block = environment_block()
    assert block["blas"] is None and block["cpu"]["simd"] is None
    json.dumps(block)
    text = format_environment(block)
    assert "blas: ?" in text and "cpu:" in text
    assert format_environment({}).count("\n") == 4  # a partial block renders too


# ----------------------------------------------------------------------------- doctor


def test_run_doctor_passes_here() -> None:
    buf = io.StringIO()
    assert doctor.run_doctor(buf) == 0
    text = buf.getvalue()
    lines = [ln for ln in text.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert [ln.split()[1] for ln in lines] == [name for name, _ in doctor.CHECKS]
    assert all(ln.startswith("PASS  ") and "error=" in ln and "tol=" in ln for ln in lines), text
    assert "kernel" in text and "torch" in text and "cpu:" in text
    assert "Traceback" not in text


def test_wrong_reference_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from depthlens.linalg import reference

    real = reference.kreiss_bruteforce
    monkeypatch.setattr(reference, "kreiss_bruteforce", lambda M, **kw: (real(M, **kw)[0] * (1 + 1e-6), 0j))
    monkeypatch.setattr(doctor, "CHECKS", LINALG_CHECKS)
    buf = io.StringIO()
    assert doctor.run_doctor(buf) == 1
    status = {ln.split()[1]: ln.split()[0] for ln in buf.getvalue().splitlines() if ln.startswith(("PASS", "FAIL"))}
    assert status == {"sigma_min": "PASS", "kreiss_value": "FAIL", "kreiss_upper": "PASS"}
    assert "1 of 3 checks failed (kreiss_value)" in buf.getvalue()


def test_wrong_kernel_and_raising_check_fail_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from depthlens.linalg import sigma

    real = sigma.sigma_min

    class Off:
        def __init__(self, r: object) -> None:
            self.sigma = np.asarray(r.sigma) * (1 + 1e-9)  # type: ignore[attr-defined]

    monkeypatch.setattr(sigma, "sigma_min", lambda *a, **k: Off(real(*a, **k)))

    def broken(cases: doctor.Cases) -> doctor.Measured:
        raise RuntimeError("kernel exploded\nsecond line")

    def nan(cases: doctor.Cases) -> doctor.Measured:
        return doctor.Measured(float("nan"), 1.0)

    checks = (LINALG_CHECKS[0], ("broken", broken), ("nan", nan), LINALG_CHECKS[2])
    results = doctor.run_checks(checks)
    assert [r.passed for r in results] == [False, False, False, True]
    assert results[0].error is not None and results[0].error > results[0].tol  # type: ignore[operator]
    line = results[1].line()
    assert line.startswith("FAIL  broken") and "RuntimeError: kernel exploded" in line
    assert "\n" not in line and "second line" not in line
