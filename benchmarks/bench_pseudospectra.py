"""Pseudospectrum of a causal attention matrix (n = 256, 40×40 grid on [−1.5, 1.5]²)
against pseudopy's ``NonnormalMeshgrid`` (dense SVD per point). Target ≥ 50× at 1e-8.

pseudopy is not a dependency. Install it only to run this comparison:
``.venv/bin/pip install --no-deps pseudopy``. Its package ``__init__`` is broken on Shapely 2
and it uses ``numpy.complex``, so its ``nonnormal`` module is loaded by file path here and
``numpy.complex`` is patched only while it runs.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import importlib  # noqa: E402
import importlib.util  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _matrices import KINDS  # noqa: E402

from depthlens.linalg.causal import random_causal_attention as causal_attention  # noqa: E402

from depthlens.linalg import pseudospectrum  # noqa: E402

INSTALL = ".venv/bin/pip install --no-deps pseudopy"


@contextmanager
def _numpy_complex() -> Iterator[None]:
    had = hasattr(np, "complex")
    if not had:
        np.complex = complex  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if not had:
            del np.complex  # type: ignore[attr-defined]


def _load_pseudopy_nonnormal() -> Any | None:
    """pseudopy's ``nonnormal`` module without running the package ``__init__``."""
    spec = importlib.util.find_spec("pseudopy") if "pseudopy" not in sys.modules else None
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = types.ModuleType("pseudopy")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["pseudopy"] = pkg
    import matplotlib

    matplotlib.use("Agg")
    return importlib.import_module("pseudopy.nonnormal")


def main() -> None:
    """Time depthlens and (if installed) pseudopy on the same grid; print ratio and agreement."""
    n, m = 256, 40
    A = causal_attention(n, np.random.default_rng(2), **KINDS["sink+prev"])
    x = np.linspace(-1.5, 1.5, m)
    tol = 1e-11  # relative change at which inverse iteration stops; error ≲ 1e-8 (see docs)
    pseudospectrum(A, x[:2], x[:1])  # compile / load the numba cache
    t = time.perf_counter()
    ours = pseudospectrum(A, x, x, tol=tol)
    t_ours = time.perf_counter() - t
    print(f"bench_pseudospectra: causal attention n={n}, {m}x{m} grid on [-1.5,1.5]^2")
    print(f"  depthlens pseudospectrum (tol={tol:g}): {t_ours:8.3f} s ({ours.n_fallback} dense fallbacks)")
    nonnormal = _load_pseudopy_nonnormal()
    if nonnormal is None:
        print(f"  pseudopy not installed; skipping the comparison (install with: {INSTALL})")
        return
    with _numpy_complex():
        t = time.perf_counter()
        ref = nonnormal.NonnormalMeshgrid(A, real_min=-1.5, real_max=1.5, real_n=m, imag_min=-1.5, imag_max=1.5, imag_n=m)
        t_ref = time.perf_counter() - t
    # pseudopy's grid is meshgrid(real, imag): Vals[i, j] at real[j] + i·imag[i], as ours.
    # Dense SVD resolves σ only to about u·‖A‖ absolutely, so relative agreement is measured
    # where σ ≥ 1e-7 (SVD itself good to ~1e-8 there); below that the absolute difference.
    big = ref.Vals >= 1e-7
    err = float(np.max(np.abs(ours.sigma[big] / ref.Vals[big] - 1.0)))
    abs_small = float(np.max(np.abs(ours.sigma[~big] - ref.Vals[~big]))) if (~big).any() else 0.0
    print(f"  pseudopy NonnormalMeshgrid (dense SVD): {t_ref:8.3f} s")
    print(
        f"  speed-up {t_ref / t_ours:6.1f}x (target >= 50x); max relative difference {err:.1e} where sigma >= 1e-7"
        f" (target <= 1e-8), {int((~big).sum())} points below: max abs difference {abs_small:.1e}"
    )


if __name__ == "__main__":
    main()
