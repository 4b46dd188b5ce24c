"""Guarded dense decompositions: every SVD, eigensolve, Schur form and solve of depthlens.

LAPACK's iterative drivers can fail to converge on matrices that other drivers, or the same
driver on another CPU kernel (OpenBLAS SkylakeX against Haswell), handle without trouble.
Each function here tries a fixed sequence of drivers and returns the first result; the
driver that produced it is counted (:func:`depthlens.drivers.driver_counts`), so a run records how many of its
results came from a fallback. When every driver fails, :class:`DecompositionError` is raised;
stages turn it into NaN quantities with a reason column, never into a stopped stage.

Driver order (the first is LAPACK's default through numpy or SciPy):

==========  ==================================================================================
svd         ``gesdd`` (divide and conquer), ``gesvd`` (QR iteration), ``qr+gesvd`` (SVD of the
            triangular factor of a QR decomposition), ``gesvd^H`` (SVD of the conjugate
            transpose); the last two change the rounding path, not the result beyond ``n ε ‖A‖``
eigvals     ``geev``, ``gees`` (diagonal of the complex Schur form), ``ggev`` (pencil ``(A, I)``),
            ``geev+shift`` (eigenvalues of ``A + σI`` minus σ)
eigh        ``heevd`` (numpy), ``heevr``, ``heev`` (SciPy drivers ``evr`` and ``ev``); a subset of
            the eigenvalues (``eigh_subset``): ``heevr``, ``heevx``, ``heev``
schur       ``gees``, then for complex output of a real matrix ``gees-real+rsf2csf``, then
            ``gees+shift`` (``A + σI = Q(T + σI)Q*``: same Q, T recovered by subtracting σ);
            without vectors (``schur_values``): ``gees``, ``gees+shift``
solve       ``gesv`` (LU), ``gelsd`` (least squares through the SVD) for a singular system
svd_torch   ``torch.linalg.svd`` on the tensor's device (a GPU), then the ``svd`` drivers on the
            CPU (:func:`svd_torch`)
==========  ==================================================================================

Every fallback is backward stable to the same order as the default driver (``n ε ‖A‖``);
results of different drivers agree to that accuracy, not bit for bit. Inputs are checked for
NaN and infinity first: a non-finite matrix raises :class:`DecompositionError` at once
(LAPACK's behaviour on it is undefined).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import scipy.linalg

from ..drivers import count_difference, driver_counts, fallback_count, merge_counts, record
from ..errors import DecompositionError

__all__ = [
    "DecompositionError",
    "count_difference",
    "driver_counts",
    "eigvals",
    "eigvalsh",
    "fallback_count",
    "merge_counts",
    "norm2",
    "schur",
    "schur_values",
    "solve",
    "svd",
    "svd_torch",
    "svdvals",
]

T = TypeVar("T")

def _finite(a: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(a)):
        raise DecompositionError(f"{name} of a matrix with NaN or infinite entries is undefined; the operator is not finite.")


def _attempt(name: str, drivers: list[tuple[str, Callable[[], T]]]) -> T:
    """Run the drivers in order; count and return the first that converges."""
    errors = []
    for driver, call in drivers:
        try:
            out = call()
        except (np.linalg.LinAlgError, ValueError) as exc:
            errors.append(f"{driver}: {exc}")
            continue
        record(name, driver)
        return out
    raise DecompositionError(f"{name} did not converge with any driver ({'; '.join(errors)}).")


def _batched(name: str, a: np.ndarray, batch: Callable[[np.ndarray], Any], one: Callable[[np.ndarray], Any]) -> Any:
    """``one`` (the guarded single-matrix path) for one matrix; for a stack, ``batch`` (the
    default driver on all matrices at once, counted per matrix) and, if it fails, ``one``
    on each matrix. Returns stacked outputs."""
    _finite(a, name)
    if a.ndim == 2:
        return one(a)
    try:
        out = batch(a)
    except np.linalg.LinAlgError:
        flat = a.reshape(-1, *a.shape[-2:])
        parts = [one(m) for m in flat]
        if isinstance(parts[0], tuple):
            return tuple(np.stack([p[i] for p in parts]).reshape(*a.shape[:-2], *parts[0][i].shape) for i in range(len(parts[0])))
        return np.stack(parts).reshape(*a.shape[:-2], *parts[0].shape)
    record(name, None, int(np.prod(a.shape[:-2], dtype=np.int64)))
    return out


# ----------------------------------------------------------------------------- SVD
def _svd_one(a: np.ndarray, full_matrices: bool, compute_uv: bool) -> Any:
    def gesvd() -> Any:
        return scipy.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv, lapack_driver="gesvd", check_finite=False)

    def qr_gesvd() -> Any:
        wide = a.shape[0] < a.shape[1]
        x = a.conj().T if wide else a  # QR of the tall one of a and aᴴ
        q, r = scipy.linalg.qr(x, mode="full" if full_matrices else "economic", check_finite=False)
        if not compute_uv:
            return scipy.linalg.svd(r, compute_uv=False, lapack_driver="gesvd", check_finite=False)
        u, s, vh = scipy.linalg.svd(r, full_matrices=full_matrices, lapack_driver="gesvd", check_finite=False)
        u = q[:, : u.shape[0]] @ u
        return (vh.conj().T, s, u.conj().T) if wide else (u, s, vh)

    def transposed() -> Any:
        out = scipy.linalg.svd(a.conj().T, full_matrices=full_matrices, compute_uv=compute_uv, lapack_driver="gesvd",
                               check_finite=False)
        if not compute_uv:
            return out
        u, s, vh = out
        return vh.conj().T, s, u.conj().T

    return _attempt("svd", [
        ("gesdd", lambda: np.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)),
        ("gesvd", gesvd),
        ("qr+gesvd", qr_gesvd),
        ("gesvd^H", transposed),
    ])


def svd(a: np.ndarray, *, full_matrices: bool = True, compute_uv: bool = True) -> Any:
    """Singular value decomposition, as :func:`numpy.linalg.svd`, with driver fallbacks.

    Parameters
    ----------
    a : ndarray, shape (..., m, n)
        Finite real or complex matrices.
    full_matrices, compute_uv : bool
        As in :func:`numpy.linalg.svd`.

    Returns
    -------
    ndarray or tuple of ndarray
        ``s`` or ``(u, s, vh)`` with ``a = u diag(s) vh``; singular values descending,
        accurate to about ``n ε ‖a‖`` with every driver.

    Raises
    ------
    DecompositionError
        If ``a`` is not finite or no driver converges.
    """
    a = np.asarray(a)
    return _batched("svd", a, lambda x: np.linalg.svd(x, full_matrices=full_matrices, compute_uv=compute_uv),
                    lambda m: _svd_one(m, full_matrices, compute_uv))


def svdvals(a: np.ndarray) -> np.ndarray:
    """Singular values (descending) of a matrix or a stack; see :func:`svd`."""
    return svd(a, compute_uv=False)


def svd_torch(a: Any, *, compute_uv: bool = True) -> Any:
    """Thin SVD, or the singular values, of one matrix on its own torch device (a GPU).

    ``torch.linalg.svd`` / ``svdvals`` on the tensor's device, counted as
    ``svd_torch:torch``; where torch does not converge, the drivers of :func:`svd` on the
    CPU (counted as ``svd_torch:lapack``, a fallback, and under ``svd``), the results moved
    back to the device.

    Parameters
    ----------
    a : torch.Tensor, shape (m, n)
        A finite real or complex matrix.
    compute_uv : bool
        ``(u, s, vh)`` (thin) if true, ``s`` alone otherwise.

    Returns
    -------
    torch.Tensor or tuple of torch.Tensor
        On ``a``'s device; singular values descending (real), accurate to about ``n ε ‖a‖``
        like every driver of :func:`svd`, not bit for bit LAPACK's.

    Raises
    ------
    DecompositionError
        If ``a`` is not finite or no driver converges.
    """
    import torch

    if not bool(torch.isfinite(a).all()):
        raise DecompositionError("svd of a matrix with NaN or infinite entries is undefined; the operator is not finite.")
    try:
        out = torch.linalg.svd(a, full_matrices=False) if compute_uv else torch.linalg.svdvals(a)
    except torch.linalg.LinAlgError:
        record("svd_torch", "lapack")
        found = svd(a.cpu().numpy(), full_matrices=False, compute_uv=compute_uv)
        return tuple(torch.from_numpy(x).to(a.device) for x in found) if compute_uv else torch.from_numpy(found).to(a.device)
    record("svd_torch", None)
    return out


def norm2(a: np.ndarray) -> Any:
    """Spectral norm ``σ_max`` of a matrix (a float) or of each matrix of a stack (an array)."""
    s = svdvals(a)[..., 0]
    return float(s) if np.ndim(s) == 0 else s


# ----------------------------------------------------------------------------- eigenvalues
def _shift(a: np.ndarray) -> float:
    """A shift of the order of ``‖a‖`` that is not a round number (moves every eigenvalue)."""
    return 0.7236 * float(np.max(np.abs(a))) * a.shape[-1] ** 0.5 + 0.1


def _eigvals_one(a: np.ndarray) -> np.ndarray:
    eye = np.eye(a.shape[0])

    def shifted() -> np.ndarray:
        sigma = _shift(a)
        return np.linalg.eigvals(a + sigma * eye) - sigma

    return _attempt("eigvals", [
        ("geev", lambda: np.linalg.eigvals(a)),
        ("gees", lambda: np.diagonal(scipy.linalg.schur(a.astype(np.complex128), output="complex", check_finite=False)[0]).copy()),
        ("ggev", lambda: scipy.linalg.eigvals(a, eye, check_finite=False)),
        ("geev+shift", shifted),
    ])


def eigvals(a: np.ndarray) -> np.ndarray:
    """Eigenvalues of a general matrix or stack, as :func:`numpy.linalg.eigvals`, with fallbacks.

    Returns
    -------
    ndarray, shape (..., n)
        In the order the driver returns them (sort before comparing drivers); each accurate
        to about ``ε ‖a‖ κ(λ)`` (κ the eigenvalue condition number) with every driver.

    Raises
    ------
    DecompositionError
        If ``a`` is not finite or no driver converges.
    """
    a = np.asarray(a)
    return _batched("eigvals", a, np.linalg.eigvals, _eigvals_one)


def _eigh_one(a: np.ndarray, subset: tuple[int, int] | None) -> np.ndarray:
    def scipy_driver(driver: str) -> Callable[[], np.ndarray]:
        def call() -> np.ndarray:
            if subset is not None and driver == "ev":
                return scipy.linalg.eigvalsh(a, driver=driver, check_finite=False)[subset[0] : subset[1] + 1]
            return scipy.linalg.eigvalsh(a, driver=driver, subset_by_index=subset, check_finite=False)

        return call

    if subset is not None:
        return _attempt("eigh_subset", [("heevr", scipy_driver("evr")), ("heevx", scipy_driver("evx")),
                                        ("heev", scipy_driver("ev"))])
    return _attempt("eigh", [("heevd", lambda: np.linalg.eigvalsh(a)), ("heevr", scipy_driver("evr")),
                             ("heev", scipy_driver("ev"))])


def eigvalsh(a: np.ndarray, subset_by_index: tuple[int, int] | None = None) -> np.ndarray:
    """Eigenvalues (ascending) of a Hermitian matrix or stack, with driver fallbacks.

    Parameters
    ----------
    a : ndarray, shape (..., n, n)
        Hermitian (only the lower triangle is read).
    subset_by_index : (int, int), optional
        Inclusive index range of the eigenvalues wanted (one matrix only); computed with
        LAPACK ``heevr``, then ``heevx``, then a full ``heev``.

    Returns
    -------
    ndarray
        Accurate to about ``n ε ‖a‖`` with every driver.

    Raises
    ------
    DecompositionError
        If ``a`` is not finite or no driver converges.
    """
    a = np.asarray(a)
    if subset_by_index is not None:
        _finite(a, "eigh")
        return _eigh_one(a, (int(subset_by_index[0]), int(subset_by_index[1])))
    return _batched("eigh", a, np.linalg.eigvalsh, lambda m: _eigh_one(m, None))


# ----------------------------------------------------------------------------- Schur, solve
def schur(a: np.ndarray, output: str = "complex") -> tuple[np.ndarray, np.ndarray]:
    """Schur form ``a = q t q*``, as :func:`scipy.linalg.schur`, with driver fallbacks.

    Parameters
    ----------
    a : ndarray, shape (n, n)
        A finite square matrix.
    output : {"complex", "real"}
        Triangular (complex) or quasi-triangular (real) ``t``.

    Returns
    -------
    t, q : ndarray
        Backward stable with every driver: ``q t q*`` equals ``a`` to about ``n ε ‖a‖``.
        The shifted fallback returns ``t`` with its diagonal shifted back, so ``t`` is exact
        to the same order.

    Raises
    ------
    DecompositionError
        If ``a`` is not finite or no driver converges.
    """
    a = np.asarray(a)
    _finite(a, "schur")
    eye = np.eye(a.shape[0])

    def real_then_complex() -> tuple[np.ndarray, np.ndarray]:
        if a.dtype.kind == "c" or output != "complex":
            raise ValueError("only for complex output of a real matrix")
        return scipy.linalg.rsf2csf(*scipy.linalg.schur(a, output="real", check_finite=False), check_finite=False)

    def shifted() -> tuple[np.ndarray, np.ndarray]:
        sigma = _shift(a)
        t, q = scipy.linalg.schur(a + sigma * eye, output=output, check_finite=False)
        return t - sigma * eye, q

    return _attempt("schur", [
        ("gees", lambda: scipy.linalg.schur(a, output=output, check_finite=False)),
        ("gees-real+rsf2csf", real_then_complex),
        ("gees+shift", shifted),
    ])


def _gees_without_vectors(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LAPACK ``gees`` with ``JOBVS = 'N'``: the Schur form and its eigenvalues, no Schur vectors."""
    gees = scipy.linalg.get_lapack_funcs("gees", (a,))
    unsorted = lambda *_: None  # noqa: E731 - gees wants a selection callback even when it does not sort
    lwork = int(gees(unsorted, a, compute_v=0, lwork=-1)[-2][0].real)
    out = gees(unsorted, a, compute_v=0, sort_t=0, lwork=max(lwork, 1))
    if out[-1] != 0:
        raise np.linalg.LinAlgError(f"gees returned info {out[-1]}")
    return out[0], (out[2] + 1j * out[3] if a.dtype.kind != "c" else out[2])


def schur_values(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Schur form of ``a`` without its Schur vectors, and the eigenvalues in its order.

    Parameters
    ----------
    a : ndarray, shape (n, n)
        A finite square matrix, real or complex.

    Returns
    -------
    t : ndarray, shape (n, n)
        For real ``a`` the real Schur form (quasi-triangular, in LAPACK's standard form: each
        2×2 diagonal block ``[[p, b], [c, p]]`` with ``b c < 0`` holds a conjugate pair
        ``p ± i√(−bc)``); for complex ``a`` the triangular one. Backward stable: the Schur
        form of ``a + E`` with ``‖E‖_F`` about ``n ε ‖a‖_F`` (``gees`` balances by
        permutation only, which leaves norms alone).
    w : ndarray, shape (n,), complex128
        The eigenvalues, in the order of ``t``'s diagonal (a pair: positive imaginary part
        first).

    Raises
    ------
    DecompositionError
        If ``a`` is not finite or no driver converges (``gees``, then ``gees+shift``).

    Notes
    -----
    Cheaper than :func:`schur` by the accumulation of the Schur vectors (about 10 % at
    n = 576); the QR sweeps over ``t`` are the same.
    """
    a = np.asarray(a)
    _finite(a, "schur")
    eye = np.eye(a.shape[0])

    def shifted() -> tuple[np.ndarray, np.ndarray]:
        sigma = _shift(a)
        t, w = _gees_without_vectors(a + sigma * eye)
        return t - sigma * eye, w - sigma

    return _attempt("schur", [("gees", lambda: _gees_without_vectors(a)), ("gees+shift", shifted)])


def solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Solution of ``a x = b`` (LU, ``gesv``); a singular ``a`` gets the least-squares
    minimum-norm solution (``gelsd``), counted as a fallback.

    Raises
    ------
    DecompositionError
        If ``a`` or ``b`` is not finite or both drivers fail.
    """
    a, b = np.asarray(a), np.asarray(b)
    _finite(a, "solve")
    _finite(b, "solve")
    return _attempt("solve", [
        ("gesv", lambda: np.linalg.solve(a, b)),
        ("gelsd", lambda: np.linalg.lstsq(a, b, rcond=None)[0]),
    ])
