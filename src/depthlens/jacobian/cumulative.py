"""Cumulative products of sub-layer operators over depth and their Schur funnel (§B3, B4).

For operators ``J_0, …, J_{L−1}`` in depth order:

- ``forward``: ``C_b = J_b ⋯ J_0`` for every b, accumulated from the input side
  (``C ← J_b C``);
- ``backward``: ``C_b = J_{L−1} ⋯ J_b`` for every b, accumulated from the output side
  (``C ← C J_b``).

The effective ranks are scale-invariant, but 60 factors of norm 1e8 would overflow a plain
product, so the running product is scaled by a power of two after every step (its largest
entry into [1/2, 1): exact, and the same whether or not that step's singular values are
computed), the exponents are summed as integers, and ``log_norm = ln ‖C_b‖₂`` (natural
logarithm, exact to rounding) is that sum times ln 2 plus the log of the largest singular value.

Truncation (``rank=r``, r = 512 in the source protocol) replaces the running product by its
best rank-r approximation (thin SVD) after every step. A product of rank ≤ r times any
matrix has rank ≤ r, so only the first truncation changes anything: the truncated forward
curve is ``J_b ⋯ J_1 · [J_0]_r`` exactly (``[·]_r`` the best rank-r approximation), the
backward one ``[J_{L−1}]_r · J_{L−2} ⋯ J_b``. Truncation therefore preserves the top r
singular directions of the first operator and follows them exactly through the remaining
ones; it never exceeds rank r, and with r ≥ d it is the exact curve. The running product is
held as a d×r factor whose singular values are those of the product (the dropped right
factor has orthonormal rows), so a truncated step costs O(d²r) instead of O(d³).

:func:`cumulative_ends` runs many such products side by side (the replicates of a bootstrap,
:mod:`depthlens.jacobian.bootstrap`) and measures only their first and last steps.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from ..errors import DecompositionError, InputError
from ..linalg._checks import as_square
from ..linalg.schur import SCHUR_ORDERS, SchurForm, SchurOrder, check_schur_order, iter_schur_forms
from ..executors.local import InlineExecutor
from .options import ALPHAS
from .product import RunningProduct

__all__ = ["ALPHAS", "DIRECTIONS", "cumulative_ends", "cumulative_ranks", "schur_funnel"]

DIRECTIONS: tuple[str, ...] = ("forward", "backward")
"""Accumulation directions (see the module notes)."""


_RANKS = ("erank", "erank_sigma", "participation_ratio")
_COLUMNS = ("depth", "steps", *_RANKS, "log_norm")


def _cap(rank: int | None, d: int) -> int:
    if rank is None:
        return d
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise InputError(f"rank is {rank!r}; pass None (exact) or a positive integer.")
    return min(int(rank), d)


def _check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise InputError(f"direction is {direction!r}; pass one of {', '.join(DIRECTIONS)}.")


def _operators(operators: Iterable[ArrayLike]) -> list[np.ndarray]:
    if isinstance(operators, Mapping):
        raise InputError("operators is a mapping; pass the operators as a sequence in depth order, e.g. [ops[key] for key in keys].")
    ops = [as_square(J, f"operators[{i}]") for i, J in enumerate(operators)]
    if not ops:
        raise InputError("operators is empty; pass at least one (d, d) operator in depth order.")
    for i, J in enumerate(ops):
        if J.shape != ops[0].shape:
            raise InputError(f"operators[{i}] has shape {J.shape}, operators[0] {ops[0].shape}; pass operators of one size.")
    return ops


def _order(n: int, direction: str) -> range:
    """Depth indices in the order a direction visits them."""
    return range(n) if direction == "forward" else range(n - 1, -1, -1)


def _curve(steps: Iterator[np.ndarray], order: range, rank: int, device: str | None = None,
           ends: bool = False) -> pd.DataFrame:
    """Feed the accumulator (left multiplication) and tabulate one row per depth; with ``ends``
    only the first and the last step are measured (their rows bit for bit those of the whole curve)."""
    acc = RunningProduct(rank, device)
    last = len(order) - 1
    rows = []
    for i, (b, J) in enumerate(zip(order, steps, strict=True)):
        got = acc.push(J, measure=not ends or i in (0, last))
        if got is not None:
            rows.append((b, i + 1, *got))
    return pd.DataFrame(rows, columns=list(_COLUMNS)).sort_values("depth", ignore_index=True)


def _oriented(J: np.ndarray, direction: str) -> np.ndarray:
    """Backward products ``C J_b`` are accumulated as ``J_bᵀ Cᵀ``: same singular values."""
    return J if direction == "forward" else J.T


def cumulative_ranks(operators: Sequence[ArrayLike], direction: str = "forward", rank: int | None = None) -> pd.DataFrame:
    """Effective ranks of the cumulative products at every depth (§B3).

    Parameters
    ----------
    operators : sequence of array_like (d, d), or array (L, d, d)
        Sub-layer operators in depth order (``attn`` then ``mlp`` within a layer).
    direction : {"forward", "backward"}
        ``forward``: row b is ``C_b = J_b ⋯ J_0``; ``backward``: row b is
        ``C_b = J_{L−1} ⋯ J_b`` (see the module notes).
    rank : int or None
        None for exact products; r to truncate the running product to rank r after each
        step (r is capped at d; r ≥ d is the exact curve).

    Returns
    -------
    DataFrame
        One row per depth b = 0..L−1, sorted by depth: ``depth``, ``steps`` (number of
        factors in ``C_b``), ``erank``, ``erank_sigma``, ``participation_ratio`` of ``C_b`` and
        ``log_norm`` = ``ln ‖C_b‖₂`` (of the truncated product when ``rank`` is set). Exact mode is backward stable per step (each step is
        a matrix product and an SVD of a product normalised to norm 1): singular values
        below about ``ε σ_max`` are noise, which moves the ranks by O(dε).

    Raises
    ------
    InputError
        If the operators are not a sequence of finite square matrices of one size, direction or rank is
        invalid, a product is exactly zero, or a step overflows (an operator above about
        1e300 in norm).

    Notes
    -----
    Cost per step: one d×d by d×k product and one SVD of the d×k factor (k = min(r, d)),
    O(d²k); the whole curve is O(L d³) exact, against O(L² d³) for rebuilding every product
    from scratch.

    Examples
    --------
    >>> import numpy as np
    >>> ops = [np.diag([1.0, 0.5, 0.25])] * 3
    >>> cumulative_ranks(ops)["steps"].tolist()
    [1, 2, 3]
    """
    _check_direction(direction)
    ops = _operators(operators)
    order = _order(len(ops), direction)
    return _curve((_oriented(ops[b], direction) for b in order), order, _cap(rank, ops[0].shape[0]))


def cumulative_ends(steps: Iterable[Iterable[ArrayLike]], n_steps: int, direction: str = "forward",
                    rank: int | None = None, device: str | None = None, threads: int = 1, *,
                    checked: bool = False, held_bytes: int | None = None) -> tuple[np.ndarray, list[str | None]]:
    """Effective ranks after one step and at full depth of several cumulative products at once,
    their operators fed step by step (e.g. one product per bootstrap replicate).

    Product i is the one :func:`cumulative_ranks` forms from the i-th operator of every step;
    its two values are that function's ``erank`` at ``steps`` 1 and ``n_steps``, bit for bit
    on the same operators (the same accumulator and scaling; the singular values of the steps
    in between are not computed, as no rank is wanted there).

    Parameters
    ----------
    steps : iterable of iterables of array_like (d, d)
        One iterable per step, in the order ``direction`` visits the depths (forward: the
        operators ``J_0`` first; backward: ``J_{L−1}`` first, as :func:`cumulative_ranks`
        multiplies them), each holding that step's operator of every product in product order.
        A step's iterable is used up before the next is drawn, so both may be generated lazily
        (only one operator per step needs to exist at a time).
    n_steps : int
        Number of steps L (the full depth).
    direction : {"forward", "backward"}
        As :func:`cumulative_ranks`; the operators are given in the visiting order either way.
    rank : int or None
        As :func:`cumulative_ranks`: None exact, r to keep the best rank-r approximation.
    device : str, optional
        A torch device for the products and singular values (as :func:`schur_funnel`), else
        NumPy and LAPACK.
    threads : int
        Products advanced side by side in threads of this process (NumPy and LAPACK release the
        GIL), ``threads`` operators of a step at a time. NumPy's BLAS runs one thread per call
        meanwhile (threadpoolctl; the parallelism is the products', and two threads each calling
        a two-thread BLAS on two cores spend a fifth of the CPU waiting). The numbers depend on
        neither ``threads`` nor the machine's BLAS thread count: every product is computed as
        with one thread and one BLAS thread.
    checked : bool
        The operators are finite float64 arrays already (e.g. means of checked sums,
        :func:`~depthlens.jacobian.bootstrap.funnel_bootstrap`): skip each one's finiteness
        check, a pass over d² entries per operator. A product that turns non-finite still
        raises.
    held_bytes : int, optional
        Bytes of running products in memory (or on ``device``) at once, each a factor of
        ``s = d k`` entries of the first operator's dtype (k = min(r, d)). A product being
        advanced holds its factor and the new product beside it, so ``2 × threads`` factors
        are reserved for the products in flight: products 0 … n − 1 stay in memory, n =
        ⌊held_bytes / s⌋ − 2 ``threads`` (none when that is negative), and every other product is
        parked between its steps in a ``.npy`` file of a temporary folder (under ``$TMPDIR``),
        read back by the thread that advances it. At most max(⌊held_bytes / s⌋, 2 ``threads``)
        factors are in memory at any time. Parking copies the bits, so the numbers are the
        same, bit for bit. None (the default) holds every product in memory. Either way a
        product's factor is dropped once its last step is measured.

    Returns
    -------
    ends : ndarray (R, 2) float64
        Per product: erank after one step and at full depth (NaN for a failed product).
    failures : list of (str or None)
        Per product: None, or why no SVD driver of :mod:`depthlens.linalg.guarded` converged on it.

    Raises
    ------
    InputError
        As :func:`cumulative_ranks`, or if ``n_steps`` or ``threads`` is not a positive
        integer, ``held_bytes`` is not None or a non-negative integer, ``steps`` does not hold
        exactly ``n_steps`` steps, or a step holds another number of operators than the first.

    Notes
    -----
    Cost per product: the products of :func:`cumulative_ranks`, O(L d² k) with k = min(r, d),
    and two SVDs (the first step's, which truncates, and the last); a curve computes one SVD at
    every depth. A parked product adds a write and a read of its d × k factor per step.

    Examples
    --------
    >>> import numpy as np
    >>> ops = [np.diag([1.0, 0.5, 0.25])] * 3
    >>> ends, failures = cumulative_ends(([J] for J in ops), 3)
    >>> np.allclose(ends[0], cumulative_ranks(ops)["erank"].to_numpy()[[0, -1]]), failures
    (True, [None])
    """
    _check_direction(direction)
    for name, value in (("n_steps", n_steps), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InputError(f"{name} is {value!r}; pass a positive integer.")
    if held_bytes is not None and (isinstance(held_bytes, bool) or not isinstance(held_bytes, (int, np.integer))
                                   or held_bytes < 0):
        raise InputError(f"held_bytes is {held_bytes!r}; pass None (every product in memory) or a non-negative "
                         "integer of bytes.")
    accs: list[RunningProduct] = []
    ends: list[list[float]] = []
    failures: list[str | None] = []
    shape: tuple[int, ...] = ()
    held = math.inf  # products 0 … held − 1 stay in memory (set from the first operator under held_bytes) ...
    folder = Path()  # ... and the others are parked in this folder between their steps

    def advance(i: int, J: np.ndarray, step: int, last: bool) -> None:
        """Multiply product i's operator in; record its ends, or why it has none; park it, or
        drop it after its last step."""
        if failures[i] is not None:
            return
        try:
            got = accs[i].push(_oriented(J, direction), measure=step == 0 or last)
        except DecompositionError as exc:  # every SVD driver failed: this product has no ranks
            failures[i], ends[i], accs[i].factor = str(exc), [math.nan, math.nan], None
            return
        if step == 0:
            ends[i][0] = got[0]  # type: ignore[index]
        if last:
            ends[i][1], accs[i].factor = got[0], None  # type: ignore[index]
        elif i >= held:
            accs[i].park(_npy(folder, i))

    taken = 0
    with contextlib.ExitStack() as scratch, ThreadPoolExecutor(max_workers=int(threads)) as workers, \
            threadpool_limits(1, user_api="blas"):
        for step, operators in enumerate(steps):
            if step >= n_steps:
                raise InputError(f"steps holds more than n_steps = {n_steps} steps; pass one iterable per depth.")
            last, count, group = step == n_steps - 1, 0, []
            for i, J in enumerate(itertools.chain(operators, [None])):
                if J is not None:
                    J = J if checked else as_square(J, f"steps[{step}][{i}]")
                    if step == 0:
                        if i == 0:
                            shape = J.shape
                            if held_bytes is not None:
                                each = shape[0] * _cap(rank, shape[0]) * J.dtype.itemsize
                                held = max(int(held_bytes) // each - 2 * int(threads), 0)
                                folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="depthlens-ends-")))
                        accs.append(RunningProduct(_cap(rank, shape[0]), device))
                        ends.append([math.nan, math.nan])
                        failures.append(None)
                    elif i >= len(accs):
                        raise InputError(f"step {step} holds more operators than the first ({len(accs)}); pass one "
                                         "per product.")
                    if J.shape != shape:
                        raise InputError(f"steps[{step}][{i}] has shape {J.shape}, steps[0][0] {shape}; pass "
                                         "operators of one size.")
                    count += 1
                    group.append((i, J))
                if len(group) == threads or (J is None and group):  # a group at a time: bounded memory
                    for done in [workers.submit(advance, k, M, step, last) for k, M in group]:
                        done.result()
                    group = []
            if count != len(accs) or count == 0:
                raise InputError(f"step {step} holds {count} operators, the first {len(accs)}; pass one per product.")
            taken += 1
    if taken != n_steps:
        raise InputError(f"steps holds {taken} steps, n_steps is {n_steps}; pass one iterable per depth.")
    return np.asarray(ends, dtype=np.float64).reshape(len(ends), 2), failures


def schur_funnel(
    operators: Sequence[ArrayLike | SchurForm],
    alphas: Sequence[float] = ALPHAS,
    directions: Sequence[str] = DIRECTIONS,
    ranks: Sequence[int | None] = (None,),
    *,
    schur_orders: Sequence[SchurOrder] = SCHUR_ORDERS[:1],
    split: Sequence[tuple[str, int | None]] | None = None,
    further: Sequence[tuple[str, int | None]] | None = None,
    full_curves: Sequence[tuple[float, str, int | None]] | None = None,
    progress: bool = False,
    pool: Executor | None = None,
    label: str = "",
    device: str | None = None,
) -> pd.DataFrame:
    """Cumulative effective ranks with the non-normal part of every operator scaled by α (§B4).

    Each operator is split as ``J(α) = Q(Λ + αN)Q* = (1 − α) M₀ + α J`` with its Schur form in
    a given eigenvalue order (:func:`depthlens.linalg.schur.schur_form`) and normal part
    ``M₀ = QΛQ*``, as :func:`depthlens.linalg.schur.schur_split` defines it; then
    :func:`cumulative_ranks` is evaluated on ``J_0(α), …, J_{L−1}(α)`` for every α, direction
    and truncation.

    Parameters
    ----------
    operators : sequence of array_like (d, d) or SchurForm
        Operators in depth order, or their Schur forms (reused, not recomputed, for their own
        order; other orders decompose ``form.matrix``).
    alphas : sequence of float
        Scales of the non-normal part: α = 1 is the plain curve (bit-exactly), α = 0 the
        curve of the normal parts.
    directions : sequence of {"forward", "backward"}
    ranks : sequence of (int or None)
        Truncations, as ``rank`` of :func:`cumulative_ranks`.
    schur_orders : sequence of {"lapack", "canonical", "outside_first", "inside_first"}
        Eigenvalue orders of the Schur forms (:data:`~depthlens.linalg.schur.SCHUR_ORDERS`),
        distinct, the protocol's order first (default: ``lapack`` alone). The first gets every
        α of ``alphas`` (α < 1 on the ``split`` curves); every further order only α = 0 (when 0
        is among ``alphas``), where the order matters most (``J(0)`` is the normal part
        itself), to keep the cost down. α = 1 does not depend on the order (``J(1) = J``): its
        curves are computed once and labelled with the first order.
    split : sequence of (direction, rank), optional
        The curves of the first order at every α other than 1, as ``(direction, rank)`` pairs
        (a rank as in ``ranks``); default: every direction with every rank, like α = 1. A run
        that reads the split on a few curves only computes just those.
    further : sequence of (direction, rank), optional
        The curves of the further orders' α = 0, as ``split``; default: every direction with
        every rank. A run that reads those orders on one curve only (the claims' protocol)
        computes just that one.
    full_curves : sequence of (alpha, direction, rank), optional
        The curves measured at every depth; every other curve (any Schur order) is measured at
        its two ends only: the rows of one step and of full depth, bit for bit those of the
        whole curve (the steps between are products without singular values). Default None:
        every curve at every depth. A run whose figures draw a few curves and whose claims read
        the others' ends only saves the singular values of most depths.
    progress : bool
        Show progress bars (tqdm); ``label`` (e.g. ``step-0 null``) follows their names.
    pool : Executor, optional
        Worker processes (:func:`depthlens.executors.local.executor`): the Schur forms (one task per
        operator) and the curves (one task each) are computed there. The normal parts go to
        ``.npy`` files in a temporary folder as they are computed; the workers memory-map
        them and the operators when they run on this machine (``pool.local_files``), and get
        them with every curve task otherwise (Ray, SLURM). Results are the same bit for bit.
    device : str, optional
        A torch device (``"cuda"``, ``"cuda:1"``; ``"cpu"`` runs the same code on the CPU):
        the curves run in this process on that device, products and singular values in torch
        (:func:`~depthlens.linalg.guarded.svd_torch`, LAPACK on the CPU where torch does not
        converge); the Schur forms stay on ``pool``. Default: LAPACK on ``pool``. The two
        agree to rounding (singular values to about ``d ε`` of the largest at every step), not
        bit for bit.

    Returns
    -------
    DataFrame
        Columns ``schur_order``, ``schur_alpha``, ``direction``, ``truncation`` (the rank cap used:
        min(r, d), and d for exact), ``exact`` (the cap is d: the exact products), then the
        columns of :func:`cumulative_ranks` and ``failure``; one row per (schur_order,
        schur_alpha, direction, truncation, depth) computed (two depths, one step and full depth,
        for a curve outside ``full_curves``), the first order's rows first, by α in the order given. ``failure`` is None, or the
        reason why no SVD driver of :mod:`depthlens.linalg.guarded` converged on that curve,
        whose values are then NaN. Where a normal part is complex (always for the orders other
        than ``canonical``, and for ``canonical`` when J has complex eigenvalues), ``J(α)``
        for α < 1 is complex and so are its products; the ranks are real.

    Raises
    ------
    InputError
        As :func:`cumulative_ranks`, or if alphas, directions, ranks or schur_orders is
        empty, an alpha is not finite, or an order is unknown or repeated.

    Notes
    -----
    Cost: per operator, one complex Schur decomposition for ``lapack``, ``outside_first``
    and ``inside_first`` together (the latter two reorder it, :func:`depthlens.linalg.schur.
    schur_forms`), the ``canonical`` form's own, and one normal part per order, O(d³) each;
    then per (order, α, direction, truncation) one curve, O(L d³) (complex arithmetic, about
    4× real, for α < 1), most of it the singular values at every depth. The normal parts
    (L d² complex numbers per order) live in the temporary folder, not in memory. The α = 1
    curves are started first: they need no Schur form.
    """
    alpha_values = np.asarray(alphas, dtype=np.float64)
    if alpha_values.ndim != 1 or alpha_values.size == 0 or not np.all(np.isfinite(alpha_values)):
        raise InputError(f"alphas is {alphas!r}; pass a non-empty sequence of finite numbers.")
    if not directions or not ranks:
        raise InputError("directions and ranks must be non-empty; pass e.g. directions=('forward',), ranks=(None,).")
    for direction in directions:
        _check_direction(direction)
    orders = [check_schur_order(o) for o in schur_orders]
    if not orders or len(set(orders)) != len(orders):
        raise InputError(f"schur_orders is {schur_orders!r}; pass distinct orders of {', '.join(SCHUR_ORDERS)}.")
    for name, pairs in (("split", split), ("further", further)):
        if pairs is not None and not pairs:
            raise InputError(f"{name} is empty; pass (direction, rank) pairs, e.g. [('backward', 512)], "
                             "or None for all.")
        for direction, _ in pairs or ():
            _check_direction(direction)
    for _, direction, _ in full_curves or ():
        _check_direction(direction)
    items = list(operators)
    forms = [J if isinstance(J, SchurForm) else None for J in items]
    ops = _operators([form.matrix if form is not None else J for form, J in zip(forms, items, strict=True)])
    d = ops[0].shape[0]
    # the (direction, rank cap) of every curve of α = 1, of the first order's split and of the further orders' α = 0
    every = [(direction, _cap(r, d)) for direction in directions for r in ranks]
    split_curves, further_curves = (every if pairs is None else list(dict.fromkeys((di, _cap(r, d)) for di, r in pairs))
                                    for pairs in (split, further))
    full = None if full_curves is None else {(float(a), di, _cap(r, d)) for a, di, r in full_curves}

    def ends(a: float, direction: str, cap: int) -> bool:
        """Whether the curve is measured at its two ends only."""
        return full is not None and (a, direction, cap) not in full

    # (order, α) in row order: every α for the first order (α = 1 unsplit), α = 0 for the others
    plan = [(orders[0], float(a)) for a in alpha_values] + [(o, 0.0) for o in orders[1:] if np.any(alpha_values == 0)]
    split_orders = list(dict.fromkeys(o for o, a in plan if a != 1.0))  # the orders whose normal parts are needed
    pool = pool if pool is not None else InlineExecutor()
    on = pool if device is None else InlineExecutor()  # where the curves run
    local = getattr(on, "local_files", False)  # workers on this machine memory-map the arrays
    curves: dict[tuple[str, float], list[Future]] = {}
    with tempfile.TemporaryDirectory(prefix="depthlens-funnel-") as tmp:
        folder = Path(tmp)
        ops_ref: Sequence[object] = _share(ops, folder / "ops") if local else ops
        if (orders[0], 1.0) in plan:  # needs no Schur form, so it starts while they are computed
            curves[(orders[0], 1.0)] = [on.submit(_split_curve, ops_ref, None, 1.0, direction, cap, orders[0], device,
                                                  ends(1.0, direction, cap)) for direction, cap in every]
        normal = _normal_parts(pool, forms, ops, split_orders, folder, progress=progress, label=label)
        for order, a in plan:
            if a != 1.0:
                refs = normal[order] if local else _load(normal[order])
                curves[(order, a)] = [on.submit(_split_curve, ops_ref, refs, a, direction, cap, order, device,
                                                ends(a, direction, cap))
                                      for direction, cap in (split_curves if order == orders[0] else further_curves)]
        futures = [f for key in plan for f in curves[key]]
        tables = [f.result() for f in tqdm(futures, desc=f"schur funnel {label}".strip(), unit="curve", disable=not progress)]
    table = pd.concat(tables, ignore_index=True)
    return table[["schur_order", "schur_alpha", "direction", "truncation", "exact", *_COLUMNS, "failure"]]


def _normal_parts(pool: Executor, forms: Sequence[SchurForm | None], ops: Sequence[np.ndarray], orders: Sequence[SchurOrder],
                  folder: Path, *, progress: bool, label: str) -> dict[str, list[Path]]:
    """The normal parts of every operator in every order of ``orders`` as ``.npy`` files
    ``folder/<order>/<index>.npy``; returns their paths by order, in depth order.

    One task per operator computes all its orders from one complex Schur decomposition
    (:func:`depthlens.linalg.schur.schur_forms`, bit for bit the parts of one
    :func:`~depthlens.linalg.schur.schur_form` per order); a given Schur form supplies its own
    order's part. Tasks that run on this machine (inline, ``pool.local_files``) write their
    files themselves; tasks that run elsewhere send their parts back, and this process writes
    them and drops each result once written.
    """
    for order in orders:
        (folder / order).mkdir()
    here = getattr(pool, "local_files", False) or isinstance(pool, InlineExecutor)
    wanted = [[o for o in orders if form is None or form.order != o] for form in forms]
    paths = [[_npy(folder / o, i) for o in todo] for i, todo in enumerate(wanted)]
    tasks: list[Future | None] = [pool.submit(_normal_part, J, todo, where if here else None) if todo else None
                                  for J, todo, where in zip(ops, wanted, paths, strict=True)]
    desc = f"schur forms {label}".strip()
    for i in tqdm(range(len(ops)), desc=desc, unit="op", disable=not progress or not orders):
        task, tasks[i] = tasks[i], None  # drop each result once saved
        returned = task.result() if task is not None else None
        if returned is not None:  # the task ran elsewhere and sent its parts back
            for path, part in zip(paths[i], returned, strict=True):
                np.save(path, part)
        if forms[i] is not None and forms[i].order in orders:
            np.save(_npy(folder / forms[i].order, i), forms[i].normal_part)
    return {order: [_npy(folder / order, i) for i in range(len(ops))] for order in orders}


def _normal_part(J: np.ndarray, orders: Sequence[SchurOrder], paths: Sequence[Path] | None) -> list[np.ndarray] | None:
    """The normal parts ``M₀ = QΛQ*`` of the Schur forms of ``J`` in ``orders``, from one
    complex Schur decomposition (bit for bit those of :func:`depthlens.linalg.schur.schur_form`;
    one form alive at a time, :func:`depthlens.linalg.schur.iter_schur_forms`): saved to
    ``paths`` (one per order, each as soon as computed; returns None), or returned when
    ``paths`` is None."""
    parts = (form.normal_part for form in iter_schur_forms(J, orders))
    if paths is None:
        return list(parts)
    for path, part in zip(paths, parts, strict=True):
        np.save(path, part)
    return None


def _npy(folder: Path, i: int) -> Path:
    return folder / f"{i:04d}.npy"


def _share(arrays: Sequence[np.ndarray], folder: Path) -> list[Path]:
    """Save arrays as ``.npy`` files (each keeps its dtype) that workers memory-map."""
    folder.mkdir()
    paths = [_npy(folder, i) for i in range(len(arrays))]
    for path, arr in zip(paths, arrays, strict=True):
        np.save(path, arr)
    return paths


def _load(ref: Sequence[object]) -> list[np.ndarray]:
    return [np.load(r, mmap_mode="r") if isinstance(r, Path) else r for r in ref]  # type: ignore[misc]


def _split_curve(
    ops_ref: Sequence[object], normal_ref: Sequence[object] | None, alpha: float, direction: str, cap: int,
    order: str, device: str | None = None, ends: bool = False,
) -> pd.DataFrame:
    """One curve of the funnel: the cumulative ranks of ``J_b(α) = (1 − α) M₀_b + α J_b``.

    ``ops_ref`` and ``normal_ref`` (the normal parts in Schur order ``order``; None for α = 1,
    which needs none) hold the arrays, or paths of ``.npy`` files to memory-map; ``device``
    is the torch device of the products and SVDs (None: NumPy and LAPACK); ``ends`` measures
    the first and the last step only (the rows of depths 0 and L − 1).
    """
    ops = _load(ops_ref)
    normal = _load(normal_ref) if normal_ref is not None else None
    order_b = _order(len(ops), direction)
    # J(1) = J bit-exactly; taking it as is keeps real operators in real arithmetic.
    split = (np.asarray(ops[b]) if normal is None else (1.0 - alpha) * normal[b] + alpha * ops[b] for b in order_b)
    try:
        curve = _curve((_oriented(J, direction) for J in split), order_b, cap, device, ends).assign(failure=None)
    except DecompositionError as exc:  # every SVD driver failed: this curve is NaN, with the reason
        depths = np.unique([0, len(ops) - 1]) if ends else np.arange(len(ops))
        curve = pd.DataFrame({"depth": depths, "steps": np.nan, **{c: np.nan for c in (*_RANKS, "log_norm")},
                              "failure": str(exc)})
    return curve.assign(schur_order=order, schur_alpha=alpha, direction=direction, truncation=cap,
                        exact=cap >= len(ops[0]))
