"""Determinism of a whole run (every stage) on a tiny random model: the number of worker
processes never changes a table, and the thread counts change one only within float32
rounding.

Why the two claims differ:

- ``--jobs`` moves only the float64 numerics into single-threaded worker processes; the
  model's forward passes stay in the parent, the tasks and their seeds are the same, and the
  results come back in task order. With ``--jobs 1`` the same tasks run inline in the parent,
  whose OpenBLAS the command line starts on one thread (``OPENBLAS_NUM_THREADS=1``) as the
  workers' is, so the tables are bit-identical. That holds for processes started that way,
  which is why the comparison runs in fresh subprocesses started so: an OpenBLAS loaded with
  two threads and set to one at run time (``threadpoolctl``) takes other code paths, and with
  the ``Haswell`` kernel (the one OpenBLAS picks on AVX2-only CPUs, e.g. AMD EPYC Zen 2/3) the
  Schur normal parts then differ from the workers' by ~1e-15. Checked with the SkylakeX and
  Haswell kernels and ``MKL_ENABLE_INSTRUCTIONS=AVX2``, torch on 1 and 2 threads.
- torch's thread count changes the float32 reduction order of the forward passes on some CPUs
  (MKL on AMD EPYC, or on Intel under ``MKL_ENABLE_INSTRUCTIONS=AVX2``: the probe scores then
  differ by ~4e-8 relative), and OpenBLAS's the float64 one (~1e-15), so those tables agree
  within a tolerance derived from float32 rounding (:func:`assert_tables_close`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from threadpoolctl import threadpool_limits

from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.workflow import run

STAGES = ("capture", "attention", "ablate", "clamp", "contest", "jacobian", "topology")
TEXT = " ".join(f"Paragraph {i} is about theme {i % 9}, written on day {i % 4} of the week." for i in range(300))
#: Every stage with small option values (two chunks, two units per stage): a few seconds a run. The funnel
#: keeps its exact curve (``funnel_rank`` = d = 64): a truncation rank that splits a tied pair
#: of singular values (the two moduli of a complex-conjugate eigenvalue pair of the alpha = 0
#: normal part are equal) leaves the kept subspace to rounding; with rank 16 the init
#: checkpoint's backward alpha = 0 curve moved by 1.5e-3 relative between 1 and 2 OpenBLAS
#: threads under OPENBLAS_CORETYPE=Haswell.
SMALL = {"model": "random:llama", "chunks": 2, "seq_len": 16, "batch_size": 1, "null_samples": 2, "null_chunks": 1,
         "extras_chunks": 1, "probe_seqs": 2, "probe_len": 6, "funnel_rank": 64, "n_perm": 20, "topk": 5,
         "heldout_chunks": 1, "ablation_boot": 50, "clamp_chunks": 2, "control_seeds": 1, "clamp_null_samples": 1,
         "contest_chunks": 2, "contest_boot": 50, "contest_perm": 50}

#: Tables empty for a random model: the clamp stage's (no massive activation: the chain is not
#: tested; tests/interventions/test_clamp.py plants one) and induction_seqs (no routing head;
#: tests/attention/test_real.py compares it across workers on SmolLM2).
EMPTY_AT_RANDOM = ("massive", "clamp", "clamp_heads", "clamp_dims", "induction_seqs")

#: float32 machine epsilon (2**-23): the forward passes run in float32, the tables in float64.
FLOAT32_EPS = float(np.finfo(np.float32).eps)
#: A thread-count change perturbs each float32 forward-pass value by a few ulps (a different
#: summation order of the same products); the reported quantities (norms, spectra, scores,
#: Kreiss constants of well-conditioned 16 x 16 attention matrices) amplify that by their condition,
#: at most a few tens here. 256 eps (~3e-5) covers both with margin and is still far below
#: any difference a real change of the computation would make.
FLOAT32_RTOL = 256 * FLOAT32_EPS


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    tables = {p.stem: pd.read_parquet(p) for p in sorted((out / "tables").glob("*.parquet"))}
    assert {"attention_patterns", "heads", "ablation", "contest", "operators", "cumulative", "coupling"} <= set(tables), \
        sorted(tables)
    return tables


#: One run in a fresh interpreter: the same call as :func:`_inprocess_run` (no report, which
#: holds no table and costs more than the stages here).
_CHILD = """
import json, sys
from depthlens.config import RunConfig
from depthlens.executors import Execution
from depthlens.workflow import run
config, out, jobs = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
run(RunConfig(**config), out, stages=tuple(sys.argv[4].split(",")), execution=Execution(quiet=True, jobs=jobs))
"""


def _fresh_process_run(root: Path, text: Path, jobs: int) -> dict[str, pd.DataFrame]:
    """The run in a new process started as the command line starts (OpenBLAS on one thread)."""
    out = root / f"jobs{jobs}"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # depthlens.cli's default, whatever the caller set
    config = json.dumps({**SMALL, "text": str(text)})
    proc = subprocess.run([sys.executable, "-c", _CHILD, config, str(out), str(jobs), ",".join(STAGES)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _tables(out)


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(TEXT)
    return path


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch and the BLAS libraries threadpoolctl sees (numpy's and scipy's OpenBLAS) on ``n``
    threads, whatever the environment says; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(before)


def _inprocess_run(root: Path, text: Path, n_threads: int) -> dict[str, pd.DataFrame]:
    with threads(n_threads):
        out = run(RunConfig(text=str(text), **SMALL), root / f"threads{n_threads}", stages=STAGES,
                  execution=Execution(quiet=True, jobs=1))
    return _tables(out)


def _check_shapes(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    assert sorted(a) == sorted(b)
    for name, table in a.items():
        assert list(table.columns) == list(b[name].columns), name
        assert list(table.dtypes) == list(b[name].dtypes), name
        assert len(table) == len(b[name]), name
        assert len(table) > 0 or name in EMPTY_AT_RANDOM, name


def assert_tables_equal(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    """Every column of every table bit-identical (NaN where NaN, None where None)."""
    _check_shapes(a, b)
    for name, table in a.items():
        for col in table.columns:
            x, y = table[col], b[name][col]
            if pd.api.types.is_float_dtype(x):
                np.testing.assert_array_equal(x.to_numpy(), y.to_numpy(), err_msg=f"{name}.{col}", strict=True)
            else:
                pd.testing.assert_series_equal(x, y, check_exact=True, obj=f"{name}.{col}")


#: Columns that are differences of two float32 forward passes' cross-entropies (an ablated or
#: clamped model's minus the plain one's): their rounding is that of the cross-entropies
#: themselves, so they are judged on the scale of the cross-entropy column named here.
CE_DIFFERENCES = {("ablation", "criticality"): "ce_clean", ("ablation", "criticality_lo"): "ce_clean",
                  ("ablation", "criticality_hi"): "ce_clean", ("clamp", "delta_ce"): "ce"}


def assert_tables_close(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame], rtol: float = FLOAT32_RTOL) -> None:
    """Float columns within ``rtol`` relative, with an absolute floor of ``rtol`` times the
    column's largest magnitude (so quantities that cancel to near zero, such as differences and
    z-scores, are judged on their column's scale; for :data:`CE_DIFFERENCES`, on the scale of
    the cross-entropies they are differences of); NaN only where NaN. Every other column
    (identity, integer counts, roles, memberships) equal: a float32 perturbation could only
    flip one if a value sat within ~1e-7 of its threshold, which would itself be a finding.
    """
    _check_shapes(a, b)
    for name, table in a.items():
        for col in table.columns:
            x, y = table[col], b[name][col]
            if pd.api.types.is_float_dtype(x):
                u, v = x.to_numpy(np.float64), y.to_numpy(np.float64)
                reference = b[name][CE_DIFFERENCES.get((name, col), col)].to_numpy(np.float64)
                scale = np.nanmax(np.abs(reference), initial=0.0)
                np.testing.assert_allclose(u, v, rtol=rtol, atol=rtol * scale, equal_nan=True, err_msg=f"{name}.{col}")
            else:
                pd.testing.assert_series_equal(x, y, check_exact=True, obj=f"{name}.{col}")


def test_jobs_one_and_two_give_bit_identical_tables(text: Path, tmp_path: Path) -> None:
    assert_tables_equal(_fresh_process_run(tmp_path, text, jobs=1), _fresh_process_run(tmp_path, text, jobs=2))


def test_threads_one_and_two_agree_within_float32_rounding(text: Path, tmp_path: Path) -> None:
    """torch and OpenBLAS on 1 thread against both on 2 (one run each, in this process)."""
    assert_tables_close(_inprocess_run(tmp_path, text, 1), _inprocess_run(tmp_path, text, 2))


def test_the_comparisons_see_a_change() -> None:
    """The helpers are not vacuous: a one-ulp change fails the bit test, 1e-3 fails the close one."""
    t = {"t": pd.DataFrame({"layer": [0, 1], "x": [1.0, 2.0], "role": ["sink", "mixing"]})}
    ulp = {"t": t["t"].assign(x=[1.0, np.nextafter(2.0, 3.0)])}
    assert_tables_close(t, ulp)
    with pytest.raises(AssertionError):
        assert_tables_equal(t, ulp)
    with pytest.raises(AssertionError):
        assert_tables_close(t, {"t": t["t"].assign(x=[1.0, 2.002])})
    with pytest.raises(AssertionError):
        assert_tables_close(t, {"t": t["t"].assign(role=["sink", "routing"])})
