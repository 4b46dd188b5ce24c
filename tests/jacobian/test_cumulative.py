"""Cumulative products over depth and the Schur funnel (METHODS B3, B4), against explicit
products and SVDs at every depth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.linalg

from depthlens.errors import DecompositionError, InputError
from depthlens.jacobian.cumulative import cumulative_ranks, schur_funnel
from depthlens.linalg.ranks import erank, erank_sigma, participation_ratio
from depthlens.linalg.schur import SCHUR_ORDERS, schur_form, schur_forms, schur_split

RANK_FNS = {"erank": erank, "erank_sigma": erank_sigma, "participation_ratio": participation_ratio}


def random_ops(rng: np.random.Generator, n: int, d: int, scale: float = 1.0) -> list[np.ndarray]:
    return [scale * (np.eye(d) + rng.standard_normal((d, d)) / np.sqrt(d)) for _ in range(n)]


def product(ops: list[np.ndarray], lo: int, hi: int) -> np.ndarray:
    """``J_hi ⋯ J_lo`` (inclusive) built from scratch."""
    factors = ops[lo : hi + 1][::-1]
    return factors[0] if len(factors) == 1 else np.linalg.multi_dot(factors)


def reference(ops: list[np.ndarray], direction: str, rank: int | None = None) -> pd.DataFrame:
    """Explicit product at every depth, optionally truncated by a full SVD after every step."""
    n = len(ops)
    rows = []
    if rank is None:
        spans = [(0, b) if direction == "forward" else (b, n - 1) for b in range(n)]
        mats = [product(ops, lo, hi) for lo, hi in spans]
    else:  # literal protocol: multiply, then keep the best rank-r approximation, every step
        mats, C = {}, None
        for b in range(n) if direction == "forward" else range(n - 1, -1, -1):
            C = ops[b] if C is None else (ops[b] @ C if direction == "forward" else C @ ops[b])
            u, s, vh = np.linalg.svd(C)
            C = (u[:, :rank] * s[:rank]) @ vh[:rank]
            mats[b] = C
        mats = [mats[b] for b in range(n)]
    for b, C in enumerate(mats):
        sv = np.linalg.svd(C, compute_uv=False)
        rows.append({"depth": b, "log_norm": np.log(sv[0]), **{k: float(f(sv)) for k, f in RANK_FNS.items()}})
    return pd.DataFrame(rows)


def assert_curve(got: pd.DataFrame, want: pd.DataFrame, rel: float = 1e-9) -> None:
    assert got["depth"].tolist() == want["depth"].tolist()
    for col in ("erank", "erank_sigma", "participation_ratio", "log_norm"):
        np.testing.assert_allclose(got[col], want[col], rtol=rel, atol=rel, err_msg=col)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_exact_against_explicit_products(rng: np.random.Generator, direction: str) -> None:
    ops = random_ops(rng, 7, 12)
    got = cumulative_ranks(ops, direction)
    assert list(got.columns) == ["depth", "steps", "erank", "erank_sigma", "participation_ratio", "log_norm"]
    assert got["steps"].tolist() == (list(range(1, 8)) if direction == "forward" else list(range(7, 0, -1)))
    assert_curve(got, reference(ops, direction))
    assert all(got[c].dtype == np.float64 for c in ("erank", "erank_sigma", "participation_ratio", "log_norm"))


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("exponent", [27, -27])
def test_huge_and_tiny_scales(rng: np.random.Generator, direction: str, exponent: int) -> None:
    """60 operators of norm ~1e±8: the plain product over/underflows, the ranks do not move."""
    base = random_ops(rng, 60, 10)
    scale = 2.0**exponent  # a power of two, so scaled and unscaled products agree exactly
    ops = [scale * J for J in base]
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.linalg.multi_dot(ops[::-1])
    assert not np.all(np.isfinite(naive)) if exponent > 0 else np.abs(naive).max() < 1e-300
    got = cumulative_ranks(ops, direction)
    want = cumulative_ranks(base, direction)
    for col in ("erank", "erank_sigma", "participation_ratio"):
        np.testing.assert_allclose(got[col], want[col], rtol=1e-12)
    np.testing.assert_allclose(got["log_norm"] - want["log_norm"], got["steps"] * exponent * np.log(2.0), rtol=1e-12)
    assert_curve(want, reference(base, direction), rel=1e-8)  # the unscaled products stay finite


def test_scale_invariance_of_ranks(rng: np.random.Generator) -> None:
    ops = random_ops(rng, 5, 9)
    a = cumulative_ranks(ops)
    b = cumulative_ranks([3.7 * J for J in ops])
    np.testing.assert_allclose(b["erank"], a["erank"], rtol=1e-12)
    np.testing.assert_allclose(b["log_norm"] - a["log_norm"], a["steps"] * np.log(3.7), rtol=1e-12)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_truncation_at_or_above_d_is_exact(rng: np.random.Generator, direction: str) -> None:
    ops = random_ops(rng, 6, 8)
    exact = cumulative_ranks(ops, direction)
    for r in (8, 9, 512):
        pd.testing.assert_frame_equal(cumulative_ranks(ops, direction, rank=r), exact)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_truncation_on_diagonal_operators(rng: np.random.Generator, direction: str) -> None:
    """Diagonal operators whose first r entries always dominate: truncation commutes with
    the product, so every depth is the best rank-r approximation of the exact product."""
    d, r, n = 12, 4, 9
    diags = np.concatenate([rng.uniform(2.0, 3.0, (n, r)), rng.uniform(0.1, 1.0, (n, d - r))], axis=1)
    ops = [np.diag(v) for v in diags]
    got = cumulative_ranks(ops, direction, rank=r)
    spans = [diags[: b + 1] if direction == "forward" else diags[b:] for b in range(n)]
    for b, span in enumerate(spans):
        top = np.sort(np.abs(np.prod(span, axis=0)))[::-1][:r]
        for col, fn in RANK_FNS.items():
            assert got[col][b] == pytest.approx(float(fn(top)), rel=1e-12)
        assert got["log_norm"][b] == pytest.approx(np.log(top[0]), rel=1e-12)
    assert np.all(got["erank"] <= r)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_truncation_against_literal_protocol(rng: np.random.Generator, direction: str) -> None:
    """Truncating the full product after every step (reference) equals the rank-r factor."""
    ops = random_ops(rng, 8, 10)
    assert_curve(cumulative_ranks(ops, direction, rank=3), reference(ops, direction, rank=3), rel=1e-8)


def test_rank_one_start_stays_rank_one(rng: np.random.Generator) -> None:
    got = cumulative_ranks(random_ops(rng, 5, 6), rank=1)
    np.testing.assert_allclose(got["erank"], 1.0, rtol=1e-14)


def test_stacked_array_input(rng: np.random.Generator) -> None:
    ops = random_ops(rng, 4, 5)
    pd.testing.assert_frame_equal(cumulative_ranks(np.stack(ops), "backward"), cumulative_ranks(ops, "backward"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"operators": []}, "empty"),
        ({"operators": {(0, "attn"): np.eye(2)}}, "mapping"),
        ({"operators": [np.eye(3), np.eye(4)]}, r"operators\[1\] has shape"),
        ({"operators": [np.eye(3), np.full((3, 3), np.inf)]}, "non-finite"),
        ({"operators": [np.eye(2)], "direction": "up"}, "direction"),
        ({"operators": [np.eye(2)], "rank": 0}, "rank"),
        ({"operators": [np.eye(2)], "rank": 2.5}, "rank"),
        ({"operators": [np.eye(2), np.zeros((2, 2))]}, "zero"),
        ({"operators": [np.ones((2, 2)), np.full((2, 2), 1.5e308)]}, "overflow"),  # its norm is 3e308
        ({"operators": [np.full((2, 2), 1e308), np.full((2, 2), 1e308)]}, "overflow"),
    ],
)
def test_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        cumulative_ranks(**kwargs)


def nonnormal_ops(rng: np.random.Generator, n: int, d: int) -> list[np.ndarray]:
    """I + low rank + noise: complex eigenvalue pairs and a clear non-normal part."""
    return [np.eye(d) + rng.standard_normal((d, 3)) @ rng.standard_normal((3, d)) / 2 + rng.standard_normal((d, d)) / (3 * np.sqrt(d)) for _ in range(n)]


def test_funnel_alpha_one_is_plain_curve(rng: np.random.Generator) -> None:
    ops = nonnormal_ops(rng, 6, 10)
    funnel = schur_funnel(ops, alphas=(1.0,), ranks=(None, 4))
    assert list(funnel.columns) == ["schur_order", "schur_alpha", "direction", "truncation", "exact", "depth", "steps", "erank",
                                    "erank_sigma", "participation_ratio", "log_norm", "failure"]
    assert funnel["failure"].isna().all() and (funnel["schur_order"] == "lapack").all()
    assert (funnel["exact"] == (funnel["truncation"] == 10)).all() and funnel["exact"].any()
    for direction in ("forward", "backward"):
        for rank, cap in ((None, 10), (4, 4)):
            part = funnel[(funnel["direction"] == direction) & (funnel["truncation"] == cap)]
            plain = cumulative_ranks(ops, direction, rank=rank)
            pd.testing.assert_frame_equal(part[plain.columns].reset_index(drop=True), plain)


@pytest.mark.parametrize("order", SCHUR_ORDERS)
def test_funnel_matches_schur_split(rng: np.random.Generator, order: str) -> None:
    ops = nonnormal_ops(rng, 5, 9)
    alphas = (0.0, 0.5)
    funnel = schur_funnel(ops, alphas=alphas, directions=("forward",), schur_orders=(order,))
    assert (funnel["schur_order"] == order).all()
    for a in alphas:
        want = cumulative_ranks([schur_split(J, a, order) for J in ops])
        got = funnel[funnel["schur_alpha"] == a].reset_index(drop=True)
        assert_curve(got, want, rel=1e-10)
    # removing the non-normal part changes this funnel
    assert not np.allclose(funnel[funnel["schur_alpha"] == 0]["erank"], cumulative_ranks(ops)["erank"], rtol=1e-3)


#: ``sort`` of ``scipy.linalg.schur`` that gives each complex order (LAPACK ``gees`` sorts with ``trsen``).
SCIPY_SORT = {"lapack": None, "outside_first": "ouc", "inside_first": "iuc"}


def independent_normal_part(J: np.ndarray, order: str) -> np.ndarray:
    """``M₀ = QΛQ*`` built without depthlens: SciPy's complex Schur form, reordered by SciPy's own
    ``sort`` for ``outside_first`` and ``inside_first`` (the same groups when no eigenvalue is
    within rounding of the unit circle); for ``canonical`` the Schur vectors of that order as
    the QR factor of the eigenvectors sorted by descending modulus (10 digits relative to the
    spectral radius), imaginary part, real part."""
    if order == "canonical":
        lam, vectors = np.linalg.eig(J)
        idx = np.lexsort((-lam.real, -lam.imag, -np.round(np.abs(lam) / np.abs(lam).max(), 10)))
        q = np.linalg.qr(vectors[:, idx])[0]
        return (q * lam[idx]) @ q.conj().T
    t, q = scipy.linalg.schur(J.astype(np.complex128), output="complex", sort=SCIPY_SORT[order])[:2]
    return (q * np.diagonal(t)) @ q.conj().T


@pytest.mark.parametrize("device", [None, "cpu"])
def test_funnel_against_independent_reference(rng: np.random.Generator, device: str | None) -> None:
    """Every row of a full funnel (four orders, three α, two directions, exact and truncated)
    against the explicit products of ``(1 − α) M₀ + α J``, with the normal parts built by
    SciPy alone and the truncation applied literally (full SVD after every step): equal to
    1e-8 relative. Curves share one Schur decomposition per operator across orders and write
    the normal parts to files; the reference does neither. Rank 3 leaves a clear gap in the
    singular values of the first operator of either direction (a normal part's conjugate
    eigenvalues have equal moduli, and a truncation between them is not unique). With a
    torch ``device`` (here the CPU, the code path of a GPU) the products and SVDs are torch's."""
    ops, d, r = nonnormal_ops(rng, 6, 9), 9, 3
    assert min(np.abs(np.abs(np.linalg.eigvals(J)) - 1).min() for J in ops) > 1e-6  # ouc/iuc split as depthlens does
    funnel = schur_funnel(ops, alphas=(0.0, 0.5, 1.0), ranks=(None, r), schur_orders=SCHUR_ORDERS, device=device)
    assert len(funnel) == (3 + 3) * 2 * 2 * len(ops) and funnel["failure"].isna().all()
    for (order, a, direction, cap), got in funnel.groupby(["schur_order", "schur_alpha", "direction", "truncation"], sort=False):
        split = [J if a == 1.0 else (1 - a) * independent_normal_part(J, order) + a * J for J in ops]
        sv = np.linalg.svd(split[0 if direction == "forward" else -1], compute_uv=False)
        assert sv[r - 1] - sv[r] > 1e-2 * sv[0]
        assert_curve(got.reset_index(drop=True), reference(split, direction, rank=None if cap == d else cap), rel=1e-8)


def test_schur_forms_share_one_complex_decomposition(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """All four orders from two decompositions (one complex for lapack, outside_first and
    inside_first, the canonical form's own). The three complex orders are bit for bit what
    ``scipy.linalg.schur(M, output="complex", sort=...)`` returns (LAPACK ``gees`` applies its
    sort with the same ``trsen``; no eigenvalue here is within rounding of the unit circle),
    and every form is bit for bit the one its order alone gives."""
    from depthlens.linalg import guarded
    from depthlens.linalg import schur as schur_module

    calls = []
    decompose = guarded.schur
    monkeypatch.setattr(schur_module.guarded, "schur", lambda a, output: calls.append(output) or decompose(a, output))
    for M in (nonnormal_ops(rng, 1, 12)[0], rng.standard_normal((7, 7)) + 1j * rng.standard_normal((7, 7))):
        assert np.abs(np.abs(np.linalg.eigvals(M)) - 1).min() > 1e-6
        calls.clear()
        forms = schur_forms(M, SCHUR_ORDERS)
        assert calls == ["complex", "real" if M.dtype.kind == "f" else "complex"]
        for order, form in zip(SCHUR_ORDERS, forms):
            assert form.order == order
            if order in SCIPY_SORT:
                t, q = scipy.linalg.schur(M, output="complex", sort=SCIPY_SORT[order])[:2]
                np.testing.assert_array_equal(form.t, np.triu(t))
                np.testing.assert_array_equal(form.q, q)
            alone = schur_form(M, order)
            np.testing.assert_array_equal(form.t, alone.t)
            np.testing.assert_array_equal(form.q, alone.q)
        np.testing.assert_allclose(forms[1].q @ forms[1].t @ forms[1].q.conj().T, M, atol=1e-12)
    assert [f.order for f in schur_forms(M, ("inside_first", "lapack"))] == ["inside_first", "lapack"]


def test_funnel_normal_parts_bit_for_bit(rng: np.random.Generator) -> None:
    """The α = 0 curves of the complex orders are, bit for bit, :func:`cumulative_ranks` of the
    normal parts ``QΛQ*`` of SciPy's own (sorted) Schur forms, computed per operator and order
    without depthlens: sharing one decomposition across orders changes nothing."""
    ops = nonnormal_ops(rng, 5, 8)
    orders = ("inside_first", "lapack", "outside_first")
    funnel = schur_funnel(ops, alphas=(0.0,), ranks=(None, 3), schur_orders=orders)
    for (order, direction, cap), got in funnel.groupby(["schur_order", "direction", "truncation"], sort=False):
        normal = [independent_normal_part(J, order) for J in ops]
        want = cumulative_ranks(normal, direction, rank=None if cap == 8 else cap)
        pd.testing.assert_frame_equal(got[want.columns].reset_index(drop=True), want, check_exact=True)


def test_funnel_normal_input_unchanged(rng: np.random.Generator) -> None:
    """For normal operators (symmetric, orthogonal) α has nothing to scale."""
    sym = [np.eye(8) + (X + X.T) / 8 for X in rng.standard_normal((4, 8, 8))]
    orth = [np.linalg.qr(X)[0] for X in rng.standard_normal((3, 8, 8))]
    ops = sym + orth
    funnel = schur_funnel(ops, alphas=(0.0, 0.5, 1.0), schur_orders=SCHUR_ORDERS)
    assert len(funnel) == (3 + 3) * 2 * len(ops)  # lapack: every α; the other orders: α = 0
    for direction in ("forward", "backward"):
        plain = cumulative_ranks(ops, direction)
        for (order, a), got in funnel[funnel["direction"] == direction].groupby(["schur_order", "schur_alpha"]):
            assert_curve(got.reset_index(drop=True), plain, rel=1e-9)


def test_funnel_reuses_schur_forms(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forms are reused for their own order; another order decomposes their matrices."""
    from depthlens.jacobian import cumulative

    ops = nonnormal_ops(rng, 4, 7)
    forms = [schur_form(J, "canonical") for J in ops]
    want = schur_funnel(ops, alphas=(0.0, 0.75), schur_orders=("canonical", "lapack"))
    assert sorted(want["schur_order"].unique()) == ["canonical", "lapack"]
    made = []
    forms_of = cumulative.iter_schur_forms
    monkeypatch.setattr(cumulative, "iter_schur_forms", lambda J, orders: made.append(list(orders)) or forms_of(J, orders))
    pd.testing.assert_frame_equal(schur_funnel(forms, alphas=(0.0, 0.75), schur_orders=("canonical", "lapack")), want)
    assert made == [["lapack"]] * len(ops)


def test_funnel_layout_and_errors(rng: np.random.Generator) -> None:
    ops = nonnormal_ops(rng, 3, 5)
    funnel = schur_funnel(ops, ranks=(None, 2, 99))
    assert len(funnel) == 5 * 2 * 3 * 3
    assert sorted(funnel["truncation"].unique()) == [2, 5]  # 99 is capped at d = 5
    assert funnel["schur_alpha"].dtype == np.float64 and funnel["truncation"].dtype.kind == "i"
    for kwargs, match in (
        ({"alphas": ()}, "alphas"),
        ({"alphas": (0.0, np.nan)}, "alphas"),
        ({"directions": ()}, "non-empty"),
        ({"directions": ("sideways",)}, "direction"),
        ({"ranks": (-1,)}, "rank"),
        ({"schur_orders": ()}, "schur_orders"),
        ({"schur_orders": ("lapack", "lapack")}, "schur_orders"),
        ({"schur_orders": ("sorted",)}, "Schur order"),
    ):
        with pytest.raises(InputError, match=match):
            schur_funnel(ops, **kwargs)


def test_funnel_in_worker_processes_equals_inline(rng: np.random.Generator) -> None:
    """Memory-mapped operators in two workers give the same table bit for bit, with real and
    complex normal parts mixed (a symmetric operator has a real one)."""
    from depthlens.executors.local import executor

    ops = nonnormal_ops(rng, 4, 8)
    sym = rng.standard_normal((8, 8))
    ops.insert(2, np.eye(8) + (sym + sym.T) / 10)
    with executor(2) as pool:
        pooled = schur_funnel(ops, alphas=(0.0, 0.5, 1.0), ranks=(None, 3), schur_orders=SCHUR_ORDERS, pool=pool)
    pd.testing.assert_frame_equal(pooled, schur_funnel(ops, alphas=(0.0, 0.5, 1.0), ranks=(None, 3), schur_orders=SCHUR_ORDERS))


def test_funnel_on_a_torch_device_equals_lapack_to_rounding(rng: np.random.Generator,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The torch path (device "cpu", the code a GPU runs) against the LAPACK path at SmolLM2's
    shape in miniature (12 steps, d = 40, a truncation below it): every rank column to 1e-10
    relative; every SVD counted as torch's. The rank leaves a gap in the singular values of
    the first factor of every truncated curve: a normal part's conjugate eigenvalues have
    equal moduli, and a truncation between them is not unique (the two paths may keep
    different vectors). When torch does not converge on a step, that step's SVD comes from
    LAPACK on the CPU (counted as a fallback) and the curve is the same to rounding."""
    import torch

    from depthlens.drivers import count_difference, driver_counts, fallback_count
    from depthlens.executors.local import executor

    ops, orders = nonnormal_ops(rng, 12, 40), ("lapack", "canonical")
    firsts = [schur_split(ops[k], a, o) for k in (0, -1) for o in orders for a in (0.0, 0.5, 1.0)]
    svs = [np.linalg.svd(F, compute_uv=False) for F in firsts]
    rank = next(r for r in range(36, 4, -1) if all(sv[r - 1] - sv[r] > 1e-4 * sv[0] for sv in svs))
    kwargs = {"alphas": (0.0, 0.5, 1.0), "ranks": (None, rank), "schur_orders": orders}
    lapack = schur_funnel(ops, **kwargs)
    before = driver_counts()
    with executor(2) as pool:  # Schur forms in the workers, curves here on the device
        on_device = schur_funnel(ops, pool=pool, device="cpu", **kwargs)
    counts = count_difference(driver_counts(), before)
    assert counts.get("svd_torch:torch") == 4 * 2 * 2 * 12 and fallback_count(counts) == 0
    key = ["schur_order", "schur_alpha", "direction", "truncation", "depth", "steps"]
    pd.testing.assert_frame_equal(on_device[key], lapack[key])
    for col in ("erank", "erank_sigma", "participation_ratio", "log_norm"):
        np.testing.assert_allclose(on_device[col], lapack[col], rtol=1e-10, atol=1e-12, err_msg=col)
    assert on_device["failure"].isna().all()

    real, calls = torch.linalg.svdvals, []

    def fails_once(a: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:
            raise torch.linalg.LinAlgError("did not converge (test)")
        return real(a)

    monkeypatch.setattr(torch.linalg, "svdvals", fails_once)
    before = driver_counts()
    fallback = schur_funnel(ops, alphas=(1.0,), directions=("forward",), device="cpu")
    counts = count_difference(driver_counts(), before)
    assert counts["svd_torch:lapack"] == 1 and counts["svd_torch:torch"] == 11 and counts["svd:gesdd"] == 1
    for col in ("erank", "erank_sigma", "participation_ratio", "log_norm"):
        want = lapack.query("schur_alpha == 1.0 and direction == 'forward' and truncation == 40")[col].to_numpy()
        np.testing.assert_allclose(fallback[col], want, rtol=1e-10, atol=1e-12, err_msg=col)


def test_funnel_with_tasks_elsewhere_equals_inline(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor whose tasks run on another machine (``local_files`` False, as Ray and SLURM):
    the Schur tasks send their normal parts back, this process saves them, and the curve
    tasks get them as arrays; the table is the inline one bit for bit."""
    from concurrent.futures import Executor, Future

    from depthlens.jacobian import cumulative

    class Elsewhere(Executor):
        local_files = False

        def submit(self, fn, /, *args, **kwargs):
            future: Future = Future()
            future.set_result(fn(*args, **kwargs))
            return future

    sent = []
    normal_part = cumulative._normal_part
    monkeypatch.setattr(cumulative, "_normal_part", lambda J, orders, paths: sent.append(paths) or normal_part(J, orders, paths))
    ops = nonnormal_ops(rng, 4, 7)
    kwargs = {"alphas": (0.0, 0.5, 1.0), "ranks": (None, 3), "schur_orders": SCHUR_ORDERS}
    elsewhere = schur_funnel(ops, pool=Elsewhere(), **kwargs)
    assert sent == [None] * len(ops)
    pd.testing.assert_frame_equal(elsewhere, schur_funnel(ops, **kwargs), check_exact=True)


def test_funnel_order_layout(rng: np.random.Generator) -> None:
    """The first order gets every α (α = 1 once, under its name), the others α = 0 only, in
    that row order; without α = 0 the other orders are not computed."""
    ops = nonnormal_ops(rng, 3, 6)
    funnel = schur_funnel(ops, alphas=(0.5, 1.0, 0.0), directions=("backward",), schur_orders=("canonical", "inside_first"))
    keys = funnel[["schur_order", "schur_alpha"]].drop_duplicates().apply(tuple, axis=1).tolist()
    assert keys == [("canonical", 0.5), ("canonical", 1.0), ("canonical", 0.0), ("inside_first", 0.0)]
    plain = cumulative_ranks(ops, "backward")
    assert_curve(funnel[funnel["schur_alpha"] == 1.0].reset_index(drop=True), plain, rel=0)
    only = schur_funnel(ops, alphas=(0.5, 1.0), directions=("backward",), schur_orders=("canonical", "inside_first"))
    assert set(only["schur_order"]) == {"canonical"}


def test_split_and_further_orders_on_the_curves_asked_for(rng: np.random.Generator) -> None:
    """``further`` limits the further orders' α = 0 curves to the (direction, rank) pairs given,
    ``split`` the first order's α < 1 curves; α = 1 keeps every curve, and each curve computed
    equals the full layout's bit for bit (every curve is its own computation)."""
    ops = nonnormal_ops(rng, 4, 6)
    kwargs = {"alphas": (0.0, 1.0), "ranks": (None, 3), "schur_orders": ("lapack", "canonical", "inside_first")}
    full = schur_funnel(ops, **kwargs)
    part = schur_funnel(ops, further=[("backward", 3)], **kwargs)
    others = part[part["schur_order"] != "lapack"]
    assert set(others["direction"]) == {"backward"} and set(others["truncation"]) == {3}
    assert set(others["schur_order"]) == {"canonical", "inside_first"} and set(others["schur_alpha"]) == {0.0}
    first = part[part["schur_order"] == "lapack"]
    assert len(first) == len(full[full["schur_order"] == "lapack"])
    keys = ["schur_order", "schur_alpha", "direction", "truncation", "depth"]
    merged = part.merge(full, on=keys, suffixes=("", "_full"))
    assert len(merged) == len(part)
    np.testing.assert_array_equal(merged["erank"], merged["erank_full"])
    both = schur_funnel(ops, split=[("forward", None)], further=[("backward", 3)], **kwargs)
    first = both[both["schur_order"] == "lapack"]
    split0 = first[first["schur_alpha"] == 0.0]
    assert set(zip(split0["direction"], split0["truncation"])) == {("forward", 6)}
    assert len(first[first["schur_alpha"] == 1.0]) == len(full[(full["schur_order"] == "lapack")
                                                               & (full["schur_alpha"] == 1.0)])
    merged = both.merge(full, on=keys, suffixes=("", "_full"))
    assert len(merged) == len(both)
    np.testing.assert_array_equal(merged["erank"], merged["erank_full"])
    for name in ("split", "further"):
        with pytest.raises(InputError, match=name):
            schur_funnel(ops, **{name: []}, **kwargs)
        with pytest.raises(InputError, match="direction"):
            schur_funnel(ops, **{name: [("sideways", 3)]}, **kwargs)


def test_curves_outside_full_curves_are_measured_at_their_ends(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """A curve outside ``full_curves`` has two rows, one step and full depth, bit for bit the
    rows of the curve measured at every depth (the running product is scaled by powers of two,
    so skipping a step's singular values leaves its bits alone), equal to the explicit products
    to 1e-8, and costs two SVDs instead of one per depth; a failed one is NaN at its two depths."""
    from depthlens.jacobian import product

    ops, L = nonnormal_ops(rng, 7, 6), 7
    kwargs = {"alphas": (0.0, 1.0), "ranks": (None, 3), "schur_orders": ("lapack", "canonical")}
    every = schur_funnel(ops, **kwargs)
    full_curves = [(1.0, "forward", None), (0.0, "backward", 3)]
    calls = []
    real = product._svdvals
    monkeypatch.setattr(product, "_svdvals", lambda x: calls.append(x.shape) or real(x))
    part = schur_funnel(ops, full_curves=full_curves, **kwargs)
    keys = ["schur_order", "schur_alpha", "direction", "truncation"]
    assert part.groupby(keys, sort=False).ngroups == every.groupby(keys, sort=False).ngroups
    for (order, a, direction, cap), got in part.groupby(keys, sort=False):
        whole = every[(every["schur_order"] == order) & (every["schur_alpha"] == a) & (every["direction"] == direction)
                      & (every["truncation"] == cap)]
        if (a, direction, None if cap == 6 else cap) in full_curves:
            assert len(got) == L
        else:
            assert sorted(got["depth"]) == [0, L - 1] and sorted(got["steps"]) == [1, L]
        merged = got.merge(whole, on=[*keys, "depth"], suffixes=("", "_every"))
        assert len(merged) == len(got)
        for col in ("steps", "erank", "erank_sigma", "participation_ratio", "log_norm"):
            np.testing.assert_array_equal(merged[col], merged[f"{col}_every"], err_msg=col)
        split = [J if a == 1.0 else independent_normal_part(J, order) for J in ops]
        want = reference(split, direction, rank=None if cap == 6 else cap)
        assert_curve(got.reset_index(drop=True), want[want["depth"].isin(got["depth"])].reset_index(drop=True), rel=1e-8)
    sizes = part.groupby(keys).size()
    truncating = int((sizes.index.get_level_values("truncation") == 3).sum())  # their first SVD truncates: _thin_svd
    assert int((sizes == L).sum()) == 3  # (0, backward, 3) in both orders
    assert len(calls) == 2 * len(sizes) - truncating + (L - 2) * 3

    def failing(*args, **kw):
        raise DecompositionError("no driver converged")

    monkeypatch.setattr(product, "_svdvals", failing)
    monkeypatch.setattr(product, "_thin_svd", failing)
    failed = schur_funnel(ops, alphas=(1.0,), full_curves=[], directions=("backward",))
    assert failed["depth"].tolist() == [0, L - 1] and failed["erank"].isna().all()
    assert (failed["failure"] == "no driver converged").all()
    with pytest.raises(InputError, match="direction"):
        schur_funnel(ops, full_curves=[(1.0, "sideways", None)], **kwargs)


def upper_triangular_ops(rng: np.random.Generator, n: int, d: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Upper-triangular operators ``D_b + N_b``, diagonals by strictly descending modulus (so
    they are already in ``canonical``, ``lapack`` and ``outside_first`` order) straddling 1."""
    diags = np.sort(rng.uniform(0.3, 2.0, (n, d)), axis=1)[:, ::-1] * rng.choice([-1.0, 1.0], (n, d))
    return [np.diag(v) + np.triu(rng.standard_normal((d, d)), 1) for v in diags], diags


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_funnel_of_triangular_products_in_closed_form(rng: np.random.Generator, direction: str) -> None:
    """A triangular operator is its own Schur form in these orders (Q = I), so J(0) is its
    diagonal: the α = 0 product is diag(Π λ) and its erank is that of |Π λ| in closed form; for
    0 < α < 1 the product of D + αN, built and decomposed by brute force, is the reference."""
    n, d = 5, 8
    ops, diags = upper_triangular_ops(rng, n, d)
    for J in ops:  # LAPACK leaves a triangular matrix as it is
        t, q = scipy.linalg.schur(J, output="complex")
        np.testing.assert_array_equal(t, J)
        np.testing.assert_array_equal(q, np.eye(d))
    funnel = schur_funnel(ops, alphas=(0.0, 0.5), directions=(direction,), schur_orders=("lapack", "canonical", "outside_first"))
    assert set(funnel["schur_order"]) == {"lapack", "canonical", "outside_first"}
    for b in range(n):
        span = diags[: b + 1] if direction == "forward" else diags[b:]
        sv = np.sort(np.abs(np.prod(span, axis=0)))[::-1]
        for order, got in funnel[(funnel["schur_alpha"] == 0.0) & (funnel["depth"] == b)].groupby("schur_order"):
            assert got["erank"].item() == pytest.approx(float(erank(sv)), rel=1e-12), order
            assert got["log_norm"].item() == pytest.approx(np.log(sv[0]), rel=1e-12, abs=1e-14), order
        half = [np.diag(v) + 0.5 * (J - np.diag(v)) for v, J in zip(diags, ops)]
        C = product(half, 0, b) if direction == "forward" else product(half, b, n - 1)
        got = funnel[(funnel["schur_alpha"] == 0.5) & (funnel["depth"] == b)]["erank"].item()
        assert got == pytest.approx(float(erank(np.linalg.svd(C, compute_uv=False))), rel=1e-9)
    # inside_first moves the eigenvalues inside the unit circle ahead: another Q, another J(0)
    inside = schur_funnel(ops, alphas=(0.0,), directions=(direction,), schur_orders=("inside_first",))
    lapack = funnel[(funnel["schur_alpha"] == 0.0) & (funnel["schur_order"] == "lapack")]
    assert not np.allclose(inside["erank"].to_numpy(), lapack["erank"].to_numpy(), rtol=1e-6)
    ref = [(lambda t, q: (q * np.diagonal(t)) @ q.conj().T)(*scipy.linalg.schur(J, output="complex", sort="iuc")[:2]) for J in ops]
    assert_curve(inside, cumulative_ranks(ref, direction), rel=1e-10)
