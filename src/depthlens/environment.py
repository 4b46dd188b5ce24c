"""The numerical environment of this process: what can change the last digits of a result.

Results are meant to agree across machines within a stated tolerance (DESIGN.md,
portability); when they do not, the cause is almost always here: which BLAS/LAPACK build is
loaded and which kernel it picked for this CPU (OpenBLAS ``DYNAMIC_ARCH`` selects e.g.
``SkylakeX`` or ``Haswell`` at load time, overridable with ``OPENBLAS_CORETYPE``), how many
threads each library runs (reduction order), torch's MKL / oneDNN and CPU dispatch level, the
environment variables that steer all of these, and the CPU's SIMD extensions.

:func:`environment_block` collects this as a JSON-serialisable dict (for the run manifest),
:func:`format_environment` renders it in a few lines (for ``depthlens doctor``).

Nothing here raises: whatever cannot be determined (no ``/proc`` on macOS, a package that is
not installed, an API that an older version lacks) is recorded as ``None``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["NUMERIC_ENV_VARS", "SIMD_FLAGS", "environment_block", "format_environment"]

#: Environment variables that change which kernels run or how many threads split a reduction.
NUMERIC_ENV_VARS: tuple[str, ...] = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_L2_SIZE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
    "NUMBA_NUM_THREADS",
    "NUMBA_CPU_NAME",
    "NUMBA_CPU_FEATURES",
    "NUMBA_DISABLE_JIT",
)

#: CPU flags (as ``/proc/cpuinfo`` spells them) that decide which BLAS / torch / numba kernels run.
SIMD_FLAGS: tuple[str, ...] = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512dq",
    "avx512cd",
    "avx512bw",
    "avx512vl",
    "avx512ifma",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    # aarch64 (the "Features" line)
    "asimd",
    "asimddp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)

# torch.__config__.show() lines worth keeping (prefix match after stripping "- ").
_TORCH_CONFIG_PREFIXES = (
    "Intel(R) oneAPI Math Kernel Library",
    "Intel(R) Math Kernel Library",
    "Intel(R) MKL-DNN",
    "OpenMP",
    "LAPACK is enabled",
    "CPU capability usage",
)
_TORCH_BUILD_KEYS = ("BLAS_INFO", "LAPACK_INFO", "USE_MKL", "USE_MKLDNN", "USE_OPENMP", "TORCH_VERSION")

_T = TypeVar("_T")


def _safe(fn: Callable[[], _T]) -> _T | None:
    """``fn()``, or None when it raises anything (the block must never raise)."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - by design: record null, never fail
        return None


def _jsonable(value: Any) -> Any:
    """``value`` with every leaf a JSON type (str, int, float, bool, None), containers as dict/list."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return str(value)


def _version(dist: str) -> str | None:
    return _safe(lambda: importlib.metadata.version(dist))


def _owner(filepath: str | None) -> str | None:
    """The package that ships a shared library, from its path (``numpy.libs`` -> numpy, ``torch/lib`` -> torch)."""
    if not filepath:
        return None
    parts = Path(filepath).parts
    for i, part in enumerate(parts):
        if part in ("site-packages", "dist-packages") and i + 1 < len(parts) - 1:
            name = parts[i + 1]
            for suffix in (".libs", ".dylibs"):
                name = name.removesuffix(suffix)
            return name.split("-")[0]
    return None


def _blas_libraries() -> list[dict[str, Any]] | None:
    """One record per BLAS / OpenMP library loaded in this process, from threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except Exception:  # noqa: BLE001
        return None
    info = _safe(threadpool_info)
    if info is None:
        return None
    out = []
    for lib in info:
        path = lib.get("filepath")
        out.append(
            {
                "user_api": lib.get("user_api"),
                "internal_api": lib.get("internal_api"),
                "version": lib.get("version"),
                "architecture": lib.get("architecture"),
                "num_threads": lib.get("num_threads"),
                "threading_layer": lib.get("threading_layer"),
                "filename": Path(path).name if path else None,
                "package": _owner(path),
            }
        )
    # threadpoolctl lists libraries in load order; sort so that the block does not depend on it
    return sorted(out, key=lambda r: (str(r["user_api"]), str(r["package"]), str(r["filename"])))


def _condense_torch_config(text: str) -> list[str]:
    """The key lines of ``torch.__config__.show()``: MKL / oneDNN / OpenMP / LAPACK / CPU
    capability lines, and the BLAS-related ``key=value`` items of the build-settings line."""
    keep: list[str] = []
    for raw in text.splitlines():
        line = raw.strip().lstrip("-").strip()
        if line.startswith(_TORCH_CONFIG_PREFIXES):
            keep.append(line)
        elif line.startswith("Build settings:"):
            items = [kv.strip() for kv in line[len("Build settings:") :].split(",")]
            keep.extend(kv for kv in items if kv.split("=", 1)[0] in _TORCH_BUILD_KEYS)
    return keep


def _torch_block() -> dict[str, Any] | None:
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    config = _safe(torch.__config__.show) or ""
    condensed = _condense_torch_config(config)
    settings = dict(kv.split("=", 1) for kv in condensed if "=" in kv)
    return {
        "version": _safe(lambda: str(torch.__version__)),
        "num_threads": _safe(torch.get_num_threads),
        "num_interop_threads": _safe(torch.get_num_interop_threads),
        "mkl": _safe(torch.backends.mkl.is_available),
        "mkldnn": _safe(torch.backends.mkldnn.is_available),
        "cpu_capability": _safe(lambda: str(torch.backends.cpu.get_cpu_capability())),
        "blas_info": settings.get("BLAS_INFO"),
        "lapack_info": settings.get("LAPACK_INFO"),
        "config": condensed,
        "cuda": _safe(lambda: torch.version.cuda),
    }


def _build_blas(module_name: str) -> dict[str, Any] | None:
    """The BLAS / LAPACK a package was built against (``show_config(mode="dicts")``; numpy ≥ 1.26, scipy ≥ 1.11).

    This is the build-time record (for OpenBLAS ``DYNAMIC_ARCH`` builds the target named in
    ``config`` is only the baseline; the kernel actually running is the threadpoolctl
    ``architecture``).
    """

    def get() -> dict[str, Any] | None:
        mod = sys.modules.get(module_name) or importlib.import_module(module_name)
        cfg = mod.show_config(mode="dicts")
        deps = cfg.get("Build Dependencies", {}) if isinstance(cfg, dict) else {}
        out: dict[str, Any] = {}
        for key in ("blas", "lapack"):
            d = deps.get(key) or {}
            out[key] = {
                "name": d.get("name"),
                "version": d.get("version"),
                "config": d.get("openblas configuration"),
            }
        simd = cfg.get("SIMD Extensions") if isinstance(cfg, dict) else None
        if simd:
            out["simd"] = simd
        return out

    return _safe(get)


def _cpu_block() -> dict[str, Any]:
    model = vendor = None
    flags: set[str] | None = None
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except Exception:  # noqa: BLE001 - no /proc (macOS, Windows) or unreadable
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "hardware", "cpu model") and model is None:
            model = value
        elif key == "vendor_id" and vendor is None:
            vendor = value
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
    if model is None:
        model = _safe(platform.processor) or None
    affinity = _safe(lambda: len(os.sched_getaffinity(0)))  # type: ignore[attr-defined]
    return {
        "model": model,
        "vendor": vendor,
        "machine": _safe(platform.machine) or None,
        "simd": None if flags is None else [f for f in SIMD_FLAGS if f in flags],
        "cpu_count": _safe(os.cpu_count),
        "usable_cores": affinity,
    }


def environment_block() -> dict[str, Any]:
    """The numerical environment of this process, as a JSON-serialisable dict.

    Imports numpy, ``scipy.linalg`` and torch when they are not imported yet, so that
    their BLAS libraries are loaded and reported; beyond those imports it takes a few
    milliseconds (no subprocess, no benchmark).

    Returns
    -------
    dict
        ``blas``
            One record per library that ``threadpoolctl.threadpool_info()`` sees: ``user_api``
            (``blas`` / ``openmp``), ``internal_api`` (``openblas``, ``mkl``, ...), ``version``,
            ``architecture`` (the OpenBLAS kernel in use, e.g. ``SkylakeX``), ``num_threads``,
            ``threading_layer``, ``filename`` and the owning ``package``. None if threadpoolctl
            is missing.
        ``torch``
            ``version``, ``num_threads``, ``num_interop_threads``, ``mkl``, ``mkldnn``,
            ``cpu_capability``, ``blas_info``, ``lapack_info``, ``config`` (the key lines of
            ``torch.__config__.show()``), ``cuda``. None if torch is missing.
        ``numpy``, ``scipy``
            ``version`` and ``build`` (the BLAS / LAPACK they were built against).
        ``numba``
            ``version`` (read from package metadata; numba is not imported).
        ``env``
            Each of :data:`NUMERIC_ENV_VARS` with its value, or None when unset.
        ``cpu``
            ``model``, ``vendor``, ``machine``, ``simd`` (the :data:`SIMD_FLAGS` present; None
            without ``/proc/cpuinfo``), ``cpu_count``, ``usable_cores`` (CPU affinity).
        ``platform``, ``python``
            ``platform.platform()``; Python version and implementation.

    Never raises: anything that cannot be determined is None.

    Examples
    --------
    >>> import json
    >>> block = environment_block()
    >>> sorted(block)[:3]
    ['blas', 'cpu', 'env']
    >>> isinstance(json.dumps(block), str)
    True
    """
    block: dict[str, Any] = {}
    for name in ("numpy", "scipy.linalg"):
        _safe(lambda name=name: importlib.import_module(name))
    block["torch"] = _safe(_torch_block)  # imports torch first, so its libraries are listed too
    block["blas"] = _safe(_blas_libraries)
    block["numpy"] = {"version": _version("numpy"), "build": _build_blas("numpy")}
    block["scipy"] = {"version": _version("scipy"), "build": _build_blas("scipy")}
    block["numba"] = {"version": _version("numba")}
    block["env"] = {name: os.environ.get(name) for name in NUMERIC_ENV_VARS}
    block["cpu"] = _safe(_cpu_block)
    block["platform"] = _safe(platform.platform)
    block["python"] = _safe(
        lambda: {"version": platform.python_version(), "implementation": platform.python_implementation()}
    )
    return _safe(lambda: _jsonable(block)) or {}


def _yes(flag: object) -> str:
    return "?" if flag is None else ("yes" if flag else "no")


def format_environment(block: dict[str, Any]) -> str:
    """A short human-readable rendering of :func:`environment_block` (one line per item).

    One line per BLAS / OpenMP library (``openblas 0.3.31 kernel SkylakeX threads 2 (numpy)``),
    one for torch, one for the package versions, one for the environment variables that are
    set, one for the CPU. Missing entries print as ``?``; never raises on a partial block.

    Parameters
    ----------
    block : dict
        As returned by :func:`environment_block` (or read back from a manifest).

    Returns
    -------
    str
        Lines joined by ``\\n``, no trailing newline.

    Examples
    --------
    >>> print(format_environment({"env": {"OPENBLAS_CORETYPE": "Haswell", "OMP_NUM_THREADS": None}}))
    blas: ?
    torch: ?
    numpy ? scipy ? numba ? python ?
    env: OPENBLAS_CORETYPE=Haswell
    cpu: ?
    """
    b = block if isinstance(block, dict) else {}

    def get(d: object, key: str) -> Any:
        return d.get(key) if isinstance(d, dict) else None

    def show(v: object) -> str:
        return "?" if v is None else str(v)

    lines: list[str] = []
    libs = b.get("blas")
    if not libs:
        lines.append("blas: ?")
    else:
        for lib in libs:
            name = show(get(lib, "internal_api"))
            parts = [name]
            if get(lib, "version") is not None:
                parts.append(str(get(lib, "version")))
            if get(lib, "architecture") is not None:
                parts.append(f"kernel {get(lib, 'architecture')}")
            parts.append(f"threads {show(get(lib, 'num_threads'))}")
            if get(lib, "threading_layer") not in (None, "pthreads", "disabled"):
                parts.append(f"layer {get(lib, 'threading_layer')}")
            owner = get(lib, "package") or get(lib, "filename")
            lines.append(" ".join(parts) + (f" ({owner})" if owner else ""))
    t = b.get("torch")
    if not isinstance(t, dict):
        lines.append("torch: ?")
    else:
        lines.append(
            f"torch {show(t.get('version'))} blas {show(t.get('blas_info'))} lapack {show(t.get('lapack_info'))} "
            f"cpu {show(t.get('cpu_capability'))} threads {show(t.get('num_threads'))} "
            f"interop {show(t.get('num_interop_threads'))} mkl {_yes(t.get('mkl'))} mkldnn {_yes(t.get('mkldnn'))}"
        )
    py = get(b.get("python"), "version")
    lines.append(
        f"numpy {show(get(b.get('numpy'), 'version'))} scipy {show(get(b.get('scipy'), 'version'))} "
        f"numba {show(get(b.get('numba'), 'version'))} python {show(py)}"
        + (f" on {b['platform']}" if b.get("platform") else "")
    )
    env = b.get("env") if isinstance(b.get("env"), dict) else {}
    set_vars = [f"{k}={v}" for k, v in env.items() if v is not None]
    lines.append("env: " + (" ".join(set_vars) if set_vars else "none of the numeric variables set"))
    cpu = b.get("cpu")
    if not isinstance(cpu, dict):
        lines.append("cpu: ?")
    else:
        simd = cpu.get("simd")
        simd_text = " ".join(simd) if simd else ("?" if simd is None else "none")
        cores = cpu.get("usable_cores") or cpu.get("cpu_count")
        lines.append(f"cpu: {show(cpu.get('model'))} ({show(cpu.get('machine'))}) cores {show(cores)} simd {simd_text}")
    return "\n".join(lines)
