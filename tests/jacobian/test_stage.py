"""The jacobian stage's layer operators, depth order and funnel plan, on hand-built operator dicts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from depthlens.config import RunConfig
from depthlens.jacobian.cumulative import schur_funnel
from depthlens.jacobian.store import operator_list, with_layer_operators
from depthlens.stages.jacobian import funnel_plan


def _ops(rng: np.random.Generator, n_layers: int, d: int) -> dict[tuple[int, str], np.ndarray]:
    return {(layer, kind): np.eye(d) + rng.standard_normal((d, d)) / 4 for layer in range(n_layers) for kind in ("mlp", "attn")}


def test_layer_operator_is_the_product_of_the_two_sub_layers(rng: np.random.Generator) -> None:
    ops = _ops(rng, 3, 5)
    out = with_layer_operators(ops, parallel_residual=False)
    assert list(out) == [(layer, kind) for layer in range(3) for kind in ("attn", "mlp", "layer")]
    for layer in range(3):
        want = np.einsum("ij,jk->ik", ops[(layer, "mlp")], ops[(layer, "attn")])
        np.testing.assert_allclose(out[(layer, "layer")], want, rtol=1e-14, atol=1e-14)
        assert out[(layer, "attn")] is ops[(layer, "attn")] and out[(layer, "mlp")] is ops[(layer, "mlp")]


def test_parallel_residual_layer_operator_is_the_sum(rng: np.random.Generator) -> None:
    """h' = h + A(h) + F(h): the layer's Jacobian is attn + mlp − I, not their product."""
    ops = _ops(rng, 2, 4)
    out = with_layer_operators(ops, parallel_residual=True)
    for layer in range(2):
        U = (ops[(layer, "attn")] - np.eye(4)) + (ops[(layer, "mlp")] - np.eye(4))
        np.testing.assert_allclose(out[(layer, "layer")], np.eye(4) + U, rtol=0, atol=1e-15)


def test_operator_list_keeps_sub_layers_in_depth_order(rng: np.random.Generator) -> None:
    ops = with_layer_operators(_ops(rng, 3, 4), parallel_residual=False)
    got = operator_list(ops)
    assert len(got) == 6
    for i, (layer, kind) in enumerate((layer, kind) for layer in range(3) for kind in ("attn", "mlp")):
        assert got[i] is ops[(layer, kind)]


def _planned_table(opts, rng: np.random.Generator, d: int = 8, depth: int = 6) -> pd.DataFrame:
    """The ``cumulative`` table of the curves :func:`funnel_plan` plans for ``trained`` and
    ``init`` in both modes, computed by :func:`schur_funnel` on triangular operators whose
    products funnel (diagonals in [0.2, 1.2], cubed for ``trained``)."""
    parts = []
    for checkpoint, power in (("trained", 3.0), ("init", 0.3)):
        for mode in ("isolated", "in_context"):
            plan = funnel_plan(opts, checkpoint, mode, d)
            if plan is None:
                continue
            ops = [np.diag(rng.uniform(0.2, 1.2, d) ** power) + 0.3 * np.triu(rng.standard_normal((d, d)), 1)
                   for _ in range(depth)]
            parts.append(schur_funnel(ops, **plan).assign(checkpoint=checkpoint, jacobian_mode=mode))
    return pd.concat(parts, ignore_index=True)


def test_default_plan_computes_what_the_funnel_statistics_read(rng: np.random.Generator) -> None:
    """Every statistic that reads the funnel curves alone (the claims B2–B4, their variants and
    descriptive values) finds its curves among those the default plan computes: none says
    "not tested" and none lacks a curve (d = 8 and rank 4: both truncations are computed)."""
    from depthlens.report.statistics import STATISTICS, compute_estimate
    from depthlens.report.worlds import MemoryTables

    opts = RunConfig(funnel_rank=4).options("jacobian")
    tables = MemoryTables({"cumulative": _planned_table(opts, rng)})
    names = [n for n, s in STATISTICS.items() if s.needs == ("cumulative",)]
    assert len(names) >= 20
    for name in names:
        estimate, note = compute_estimate(name, tables)
        assert estimate is not None and np.isfinite(estimate.value), f"{name}: {note}"


def test_default_plan_draws_the_same_funnel_figures_as_every_curve() -> None:
    """The figures that read the Schur split (the forward cumulative erank of the least
    truncation, the backward full-depth erank against α) draw the trained model's lines the same,
    bit for bit, from the default plan's curves as from every curve (d = 8, rank 4: the default
    leaves out the split's backward exact and forward truncated curves)."""
    from depthlens.report.figures import draw_cumulative_erank, draw_schur_split
    from depthlens.report.worlds import MemoryTables

    read, every = (RunConfig(funnel_rank=4, funnel_curves=curves).options("jacobian") for curves in ("read", "every"))
    planned, full = (_planned_table(opts, np.random.default_rng(7)) for opts in (read, every))

    def lines(table: pd.DataFrame, draw) -> dict[str, tuple]:
        axes = draw(MemoryTables({"cumulative": table})).axes[0]
        return {line.get_label(): tuple(line.get_ydata()) for line in axes.lines
                if str(line.get_label()).startswith("trained")}

    for draw in (draw_cumulative_erank, draw_schur_split):
        drawn = lines(planned, draw)
        assert len(drawn) >= 3 and drawn == lines(full, draw)
    split = planned[(planned["checkpoint"] == "trained") & (planned["jacobian_mode"] == "isolated")
                    & (planned["schur_alpha"] < 1)]
    assert set(zip(split["direction"], split["exact"])) == {("backward", False), ("forward", True)}


def test_funnel_plan_keeps_the_split_for_the_trained_model() -> None:
    read = RunConfig().options("jacobian")
    trained = funnel_plan(read, "trained", "isolated", 576)
    assert trained == {"alphas": (0.0, 0.5, 1.0), "directions": ("forward", "backward"), "ranks": (None, 512),
                       "schur_orders": ("lapack", "canonical", "outside_first", "inside_first"),
                       "split": [("backward", 512), ("forward", None)], "further": [("backward", 512)],
                       "full_curves": [(0.0, "forward", None), (0.5, "forward", None), (1.0, "forward", None),
                                       (1.0, "backward", None)]}
    for checkpoint in ("init", "step-1000"):  # the step-0 null and a --revisions checkpoint: α = 1 alone
        assert funnel_plan(read, checkpoint, "isolated", 576)["alphas"] == (1.0,)
        assert funnel_plan(read, checkpoint, "isolated", 576)["full_curves"] == [(1.0, "forward", None)]
        assert funnel_plan(read, checkpoint, "in_context", 576) == {
            "alphas": (1.0,), "schur_orders": ("lapack",), "split": None, "further": None, "directions": ("backward",),
            "ranks": (512,), "full_curves": []}
    assert funnel_plan(read, "trained", "in_context", 576)["alphas"] == (0.0, 1.0)
    assert funnel_plan(read, "trained", "isolated", 400)["ranks"] == (None,)  # rank 512 is the exact product
    assert funnel_plan(RunConfig(funnel_alphas=(0.5,)).options("jacobian"), "init", "isolated", 576) is None
    every = RunConfig(preset="paper").options("jacobian")
    for checkpoint in ("trained", "init"):
        assert funnel_plan(every, checkpoint, "isolated", 576) == {
            "alphas": (0.0, 0.25, 0.5, 0.75, 1.0), "directions": ("forward", "backward"), "ranks": (None, 512),
            "schur_orders": ("lapack", "canonical", "outside_first", "inside_first"), "split": None, "further": None,
            "full_curves": None}
        assert funnel_plan(every, checkpoint, "in_context", 576)["alphas"] == (0.0, 1.0)


def test_wide_models_plan_rank_truncated_curves_only(rng: np.random.Generator) -> None:
    """Above --funnel-exact-width the plan drops the exact products (--funnel-rank 0 keeps
    them): every statistic of the rank-truncated curves is unchanged without the exact rows,
    and the exact variants say why they are not tested instead of reading a truncated curve
    as exact (d = 8, rank 4)."""
    from depthlens.report.statistics import STATISTICS, compute_estimate
    from depthlens.report.worlds import MemoryTables

    wide = RunConfig(funnel_rank=4, funnel_exact_width=6).options("jacobian")
    assert funnel_plan(wide, "trained", "isolated", 8)["ranks"] == (4,)
    assert funnel_plan(wide, "init", "in_context", 8)["ranks"] == (4,)
    assert funnel_plan(RunConfig(funnel_rank=4, funnel_exact_width=8).options("jacobian"), "trained", "isolated", 8)[
        "ranks"] == (None, 4)
    assert funnel_plan(RunConfig(funnel_rank=0, funnel_exact_width=6).options("jacobian"), "trained", "isolated", 8)[
        "ranks"] == (None,)
    table = _planned_table(RunConfig(funnel_rank=4).options("jacobian"), rng)
    assert (table["exact"] == (table["truncation"] == 8)).all() and table["exact"].any() and not table["exact"].all()
    full, truncated = MemoryTables({"cumulative": table}), MemoryTables({"cumulative": table[~table["exact"]]})
    names = [n for n, s in STATISTICS.items() if s.needs == ("cumulative",)]
    exact = [n for n in names if n.endswith("_exact")]
    assert len(exact) >= 6
    for name in names:
        want, _ = compute_estimate(name, full)
        got, note = compute_estimate(name, truncated)
        if name in exact:
            assert got is None and "--funnel-exact-width" in note, name
        else:
            assert got is not None and got.value == want.value, f"{name}: {note}"
    # the Schur-split figure names the curves it draws by the same column (a run of exact products
    # alone, --funnel-rank 0, has its split on the exact curves)
    from depthlens.report.figures import draw_schur_split

    exact_only = _planned_table(RunConfig(funnel_rank=0).options("jacobian"), rng)
    assert exact_only["exact"].all()
    for tables, protocol in ((full, "rank-truncated"), (truncated, "rank-truncated"),
                             (MemoryTables({"cumulative": exact_only}), "exact")):
        assert f"(backward, {protocol}, isolated)" in draw_schur_split(tables).axes[0].get_title()
