"""``python -m depthlens.precompile`` (run by ``make install``): it leaves a numba cache from
which the attention analysis loads every kernel signature it calls, compiling none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Run in a fresh process on the cache: the per-matrix analysis of another matrix, every
#: option on, then every compiled kernel's cache hits and misses.
PROBE = """
import json
from numba.core.registry import CPUDispatcher
from depthlens.attention.analysis import head_chunk_row
from depthlens.attention.options import AttentionOptions
from depthlens.linalg import _brent, _kernels
import numpy as np
from depthlens.linalg.causal import random_causal_attention
head_chunk_row(random_causal_attention(23, np.random.default_rng(5)), 2, 1, 3, AttentionOptions(), nulls=True, extras=True, certify=True)
stats = {f"{m.__name__}.{k}": [sum(v.stats.cache_hits.values()), sum(v.stats.cache_misses.values())]
         for m in (_kernels, _brent) for k, v in vars(m).items() if isinstance(v, CPUDispatcher)}
print(json.dumps(stats))
"""


def _python(code: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    env.pop("NUMBA_DISABLE_JIT", None)
    return subprocess.run([sys.executable, *code], env=env, capture_output=True, text=True, timeout=600, check=False)


def test_precompiled_cache_serves_every_kernel_signature_the_analysis_calls(tmp_path: Path) -> None:
    cache = tmp_path / "numba"
    done = _python(["-m", "depthlens.precompile"], cache)
    assert done.returncode == 0, done.stderr
    assert "compiled into their cache" in done.stdout
    assert list(cache.rglob("*.nbc")), "no compiled kernel was cached"
    probe = _python(["-c", PROBE], cache)
    assert probe.returncode == 0, probe.stderr
    stats = json.loads(probe.stdout.strip().splitlines()[-1])
    assert sum(hits for hits, _ in stats.values()) > 0
    assert {name: misses for name, (_, misses) in stats.items() if misses} == {}
    # a cold cache compiles: the probe counts misses where nothing was cached
    cold = _python(["-c", PROBE], tmp_path / "empty")
    assert cold.returncode == 0, cold.stderr
    assert sum(misses for _, misses in json.loads(cold.stdout.strip().splitlines()[-1]).values()) > 0
