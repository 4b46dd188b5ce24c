"""``depthlens doctor``: the numerical environment, then the compiled kernels against references.

Results are meant to be the same on every machine within a stated tolerance (DESIGN.md). The
doctor shows what could break that here (BLAS libraries and their kernels, threads, torch's
MKL / CPU dispatch, the environment variables that steer them, the CPU; see
:mod:`depthlens.environment`) and then checks, on small cases, that the kernels this machine
runs agree with independent float64 references:

========================== ================================================================
``sigma_min``              compiled (numba) ``σ_min(zI − B)`` against LAPACK's dense SVD
                           (numpy) on a deflated synthetic causal attention matrix
``kreiss_value``           :func:`~depthlens.linalg.kreiss.kreiss` against the brute-force
                           dense-SVD search of :mod:`depthlens.linalg.reference`
``kreiss_upper``           the rigorous power-norm upper bound is not below that reference
``attention_f64``          the adapter's float64 attention probabilities against the Hugging
                           Face model's own eager ``output_attentions`` in float64
``jacobian_attn``          one in-context attention Jacobian of
                           :mod:`depthlens.jacobian.engines` against ``torch.func.jacrev``
========================== ================================================================

Each check prints one line ``PASS|FAIL  name  error=… tol=…  (time)``; a check that raises
is a FAIL with the exception's first line (no traceback) and the others still run. Every
tolerance is derived from the float64 unit roundoff ``u = 2⁻⁵³`` and the size of the case
(see each check). The whole run takes a few seconds on two cores, most of it importing
torch and building a tiny random Llama model.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TextIO

import numpy as np

from .environment import environment_block, format_environment

__all__ = ["CHECKS", "CheckResult", "run_checks", "run_doctor"]

#: float64 unit roundoff.
U = float(np.finfo(np.float64).eps) / 2

_SEED = 20240607
_N = 20  # size of the synthetic attention matrix (σ_min and Kreiss checks)
_T = 12  # tokens of the model checks


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one doctor check.

    Attributes
    ----------
    name : str
    passed : bool
        ``error <= tol`` (False for a NaN error or a check that raised).
    error, tol : float or None
        The measured error and its tolerance (None when the check raised).
    seconds : float
        Wall time of the check (including any shared case it built first).
    message : str
        The exception's first line when the check raised, else empty.
    """

    name: str
    passed: bool
    error: float | None
    tol: float | None
    seconds: float
    message: str = ""

    def line(self) -> str:
        """``PASS|FAIL  name  error=… tol=…  (time)``, or the exception in place of the numbers."""
        status = "PASS" if self.passed else "FAIL"
        if self.message:
            body = self.message
        else:
            body = f"error={self.error:.2e} tol={self.tol:.2e}"
        return f"{status}  {self.name:<14}  {body}  ({self.seconds:.2f} s)"


class Measured(NamedTuple):
    """What a check function returns: the error and the tolerance it must not exceed."""

    error: float
    tol: float


# ----------------------------------------------------------------------------- shared cases


class Cases:
    """Inputs shared by the checks, built on first use and kept for the run.

    ``matrix``: a deflated synthetic causal attention matrix ``B`` (n = 20, sink and
    previous-token structure). ``kreiss``: ``(kreiss(B), brute-force reference)``. ``model``:
    a tiny random Llama (float32), its adapter, a float64 copy with its adapter, and token ids.
    """

    def __init__(self) -> None:
        self._memo: dict[str, Any] = {}

    def _get(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def matrix(self) -> np.ndarray:
        from .linalg.causal import deflate, random_causal_attention

        return self._get(
            "matrix",
            lambda: deflate(random_causal_attention(_N, np.random.default_rng(_SEED), sink=2.0, prev=2.0)),
        )

    def kreiss(self) -> tuple[Any, float]:
        from .linalg.kreiss import kreiss
        from .linalg.reference import kreiss_bruteforce

        def build() -> tuple[Any, float]:
            B = self.matrix()
            ref, _ = kreiss_bruteforce(B, n_t=30, n_theta=36)
            return kreiss(B), float(ref)

        return self._get("kreiss", build)

    def model(self) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            import torch

            from .models import adapter_for, build_random
            from .models.float64 import double_copy

            model = build_random("llama", seed=0)
            m64 = double_copy(model)
            ad = adapter_for(model)
            vocab = ad.vocab_size
            ids = torch.randint(0, vocab, (1, _T), generator=torch.Generator().manual_seed(_SEED))
            return {"model64": m64, "ad": ad, "ad64": adapter_for(m64), "ids": ids}

        return self._get("model", build)


# ----------------------------------------------------------------------------- checks


def check_sigma_min(cases: Cases) -> Measured:
    """Compiled ``σ_min(zI − B)`` against ``numpy.linalg.svd(zI − B)[-1]`` at seven points.

    Points: outside the unit disk (where the Kreiss search works), inside, next to an
    eigenvalue and far out. Both sides are backward stable: LAPACK's ``σ_min`` has an absolute
    error of at most a small multiple of ``n·u·‖zI − B‖₂``, and so has the inverse iteration
    after its relative stop (``1e-14``, ≈ 90u, on a value ``≤ ‖zI − B‖₂``). The error is
    therefore measured relative to ``‖zI − B‖₂`` (a relative error in ``σ_min`` itself is
    meaningless deep in the pseudospectrum, where ``σ_min`` is ~1e-18), with tolerance
    ``16·n·u`` (the rounding margin the Kreiss bounds use).
    """
    from .linalg.sigma import sigma_min

    B = cases.matrix()
    n = B.shape[0]
    z = np.array([1.05, -1.05, 1.05j, 0.6 - 0.9j, 0.3 + 0.2j, B[5, 5] + 1e-3, 3.0])
    got = sigma_min(B, z, engine="numba").sigma
    eye = np.eye(n)
    err = 0.0
    for w, s in zip(z, got, strict=True):
        sv = np.linalg.svd(w * eye - B, compute_uv=False)
        err = max(err, abs(float(s) - float(sv[-1])) / float(sv[0]))
    return Measured(err, 16 * n * U)


def check_kreiss_value(cases: Cases) -> Measured:
    """``kreiss(B).value`` against the brute-force dense-SVD grid + Nelder–Mead search.

    Both maximise the same float64 function ``(|z|−1)/σ_min(zI − B)``; at a smooth maximum the
    value is quadratic in the location error (Nelder–Mead stops at ``1e-10`` in ``x``), so they
    agree to the rounding of ``σ_min`` at the maximiser (``~n·u·‖zI−B‖/σ_min``, 1e-15 here).
    The tolerance is the accuracy the ``kreiss`` docstring states for its search, ``1e-10``
    relative: a larger gap means one of the two searches missed the maximum.
    """
    res, ref = cases.kreiss()
    return Measured(abs(res.value - ref) / ref, 1e-10)


def check_kreiss_upper(cases: Cases) -> Measured:
    """The power-norm upper bound is not below the brute-force value (error = relative deficit).

    The reference is a lower bound on ``K`` up to the rounding of one dense ``σ_min``
    (relative ``≲ n·u·‖zI−B‖/σ_min``), so ``upper ≥ ref·(1 − 16·n·u)`` must hold.
    """
    res, ref = cases.kreiss()
    n = cases.matrix().shape[0]
    return Measured(max(0.0, 1.0 - res.upper / ref), 16 * n * U)


def check_attention(cases: Cases) -> Measured:
    """Adapter float64 attention probabilities against the model's eager ``output_attentions``.

    Both run on a float64 copy of a tiny random Llama with float64 kept throughout (RMSNorm
    and the eager softmax would otherwise upcast to float32). They share the projections and
    RoPE, and differ in the score products (length ``hd``), masking and softmax: a logit error
    ``δ`` moves a probability by at most ``2|δ|``, the scores carry at most ``hd·u·S`` with
    ``S`` the largest ``Σ|q_i k_i|·scale``, and the softmax adds ``~T·u``; the tolerance is
    ``16·(hd·S + T)·u`` (max abs error over all layers, heads and rows).
    """
    import torch

    from .models.float64 import Float64Mode

    m = cases.model()
    ad64, m64, ids = m["ad64"], m["model64"], m["ids"]
    err = 0.0
    scale_max = 0.0
    with Float64Mode(), torch.no_grad():
        ref = m64(ids, output_attentions=True).attentions
        for layer, A in ad64.attention_probs(ids):
            err = max(err, float((A - ref[layer].to(torch.float64)).abs().max()))
        inputs = ad64.attention_inputs(ids)
        for layer, x in inputs.items():
            q, k, _ = ad64.qkv(layer, x)
            k = torch.repeat_interleave(k, ad64.n_heads // ad64.n_kv_heads, dim=1)
            S = (q.abs() @ k.abs().transpose(-1, -2)) * abs(ad64.attention_scale(layer))
            scale_max = max(scale_max, float(S.max()))
    tol = 16 * (ad64.head_dim * max(scale_max, 1.0) + _T) * U
    return Measured(err, tol)


def check_jacobian(cases: Cases) -> Measured:
    """One in-context attention Jacobian (engine) against ``torch.func.jacrev`` in float64.

    Layer 1 of the tiny Llama at two positions; error ``max|J − J_ref| / max|J_ref − I|``
    (relative to the update, stricter than to ``J``). The engine and autograd evaluate the
    same float64 function along different paths (closed-form factors vs reverse mode): each
    entry is a sum over ``d`` products through RMSNorm, the projections and the softmax, so
    the rounding is a few ``d·u`` per stage; the tolerance ``64·d·u`` (≈ 1e-12 for d = 64)
    allows a factor-of-16 growth over four stages.
    """
    import torch

    from .jacobian.engines import input_state, sublayer_jacobians
    from .models.float64 import Float64Mode

    m = cases.model()
    ad, ad64, ids = m["ad"], m["ad64"], m["ids"]
    layer = ad.n_layers - 1
    r = ad.residual_states(ids)[input_state(ad, layer, "attn")]
    positions = [3, _T - 1]
    J = sublayer_jacobians(ad, r, layer, "attn", jacobian_mode="in_context", positions=positions)
    f = ad64.sublayer(layer, "attn")
    h = r[:1].to(torch.float64)
    refs = []
    with Float64Mode():
        for t in positions:

            def g(x: torch.Tensor, t: int = t) -> torch.Tensor:
                return f(torch.cat([h[:, :t], x.view(1, 1, -1), h[:, t + 1 :]], dim=1))[0, t]

            refs.append(torch.func.jacrev(g)(h[0, t]))
    Jref = torch.stack(refs)
    eye = torch.eye(ad.d_model, dtype=torch.float64)
    err = float((J.to(torch.float64) - Jref).abs().max() / (Jref - eye).abs().max())
    return Measured(err, 64 * ad.d_model * U)


#: The checks in the order they run: ``(name, function(cases) -> Measured)``.
CHECKS: tuple[tuple[str, Callable[[Cases], Measured]], ...] = (
    ("sigma_min", check_sigma_min),
    ("kreiss_value", check_kreiss_value),
    ("kreiss_upper", check_kreiss_upper),
    ("attention_f64", check_attention),
    ("jacobian_attn", check_jacobian),
)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return msg if len(msg) <= 200 else msg[:197] + "..."


def run_checks(
    checks: tuple[tuple[str, Callable[[Cases], Measured]], ...] | None = None,
    out: TextIO | None = None,
) -> list[CheckResult]:
    """Run the doctor's checks, each isolated: one that raises is a FAIL, the others go on.

    Parameters
    ----------
    checks : tuple of (name, function), optional
        Default :data:`CHECKS`.
    out : text stream, optional
        Where to print each result line as it finishes (nothing printed when None).

    Returns
    -------
    list of CheckResult
    """
    cases = Cases()
    results = []
    for name, fn in CHECKS if checks is None else checks:
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                measured = fn(cases)
            error, tol = float(measured.error), float(measured.tol)
            result = CheckResult(name, bool(error <= tol), error, tol, time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - a failing check is reported, never raised
            result = CheckResult(name, False, None, None, time.perf_counter() - t0, _one_line(exc))
        results.append(result)
        if out is not None:
            print(result.line(), file=out, flush=True)
    return results


def run_doctor(out: TextIO | None = None) -> int:
    """Print the numerical environment, then check the compiled kernels against references.

    Parameters
    ----------
    out : text stream, optional
        Where to print (default ``sys.stdout``, looked up at call time).

    Returns
    -------
    int
        0 if every check passed, 1 if any failed (the exit status of ``depthlens doctor``).

    Examples
    --------
    >>> import io
    >>> buf = io.StringIO()
    >>> run_doctor(buf)  # doctest: +SKIP
    0
    """
    stream = sys.stdout if out is None else out
    t0 = time.perf_counter()
    try:
        env = format_environment(environment_block())
    except Exception as exc:  # noqa: BLE001 - environment_block never raises; belt and braces
        env = f"environment: {_one_line(exc)}"
    print(env, file=stream)
    print(file=stream)
    results = run_checks(out=stream)
    failed = [r.name for r in results if not r.passed]
    total = time.perf_counter() - t0
    if failed:
        print(f"\n{len(failed)} of {len(results)} checks failed ({', '.join(failed)}) in {total:.1f} s", file=stream)
        return 1
    print(f"\nall {len(results)} checks passed in {total:.1f} s", file=stream)
    return 0
