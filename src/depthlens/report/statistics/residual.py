"""Part B's statistics of the residual stream (claims B1–B4): complex and rotating modes of the
mean Jacobians, the funnel of their cumulative products and the Schur split, and symmetry over
depth (the coupling of boundary nodes to the operators, B5–B6, is :mod:`.coupling`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pandas as pd

from ...runs.tables import RunTables
from ...stats import percentile_interval
from .core import (Estimate, NotTested, Statistic, TooLittleData, finite_median, median_estimate, numeric, registrar,
                   require_columns, run_chunks, select_rows, spearman_estimate)

STATISTICS: dict[str, Statistic] = {}
register = registrar(STATISTICS)


_JACOBIAN_CHUNKS = {"chunks": run_chunks}  # mean Jacobians average over every chunk of the run


def _early_operators(t: RunTables, sublayers: tuple[str, ...], checkpoint: str = "trained",
                     jacobian_mode: str = "isolated") -> pd.DataFrame:
    """Operators rows of ``sublayers`` in the first third of layers (layer < ceil(L/3))."""
    df = select_rows(t.table("operators"), "operators.parquet", checkpoint=checkpoint, jacobian_mode=jacobian_mode)
    require_columns(df, "operators.parquet", "layer", "sublayer")
    n_layers = int(df["layer"].max()) + 1
    df = df[(df["layer"] < math.ceil(n_layers / 3)) & df["sublayer"].isin(sublayers)]
    if df.empty:
        raise NotTested(f"operators.parquet has no {'/'.join(sublayers)} rows of {checkpoint} ({jacobian_mode})",
                        needs="--null init" if checkpoint == "init" else f"--jacobian-mode {jacobian_mode}")
    return df


def _complex_early(column: str, sublayers: tuple[str, ...], jacobian_mode: str = "isolated"
                   ) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        df = _early_operators(t, sublayers, jacobian_mode=jacobian_mode)
        require_columns(df, "operators.parquet", column)
        return finite_median(numeric(df[column]), f"{column} of early {'/'.join(sublayers)} operators")

    return stat


register("complex_frac_early_median", ["operators"],
         "Median complex_frac of the trained isolated attention and MLP mean Jacobians over the first third of "
         "layers (descriptive: the isolated attention update has rank ≤ n_kv·head_dim, so most of its "
         "eigenvalues are structurally 1 and real, which caps this median near 2/3).",
         samples=_JACOBIAN_CHUNKS)(_complex_early("complex_frac", ("attn", "mlp")))
for _name, _sub, _mode in (
        ("complex_frac_nontrivial_early_layer", "layer", "isolated"),
        ("complex_frac_nontrivial_early_layer_isolated_observed", "layer", "isolated_observed"),
        ("complex_frac_nontrivial_early_layer_in_context", "layer", "in_context"),
        ("complex_frac_nontrivial_early_mlp", "mlp", "isolated"),
        ("complex_frac_nontrivial_early_mlp_isolated_observed", "mlp", "isolated_observed"),
        ("complex_frac_nontrivial_early_mlp_in_context", "mlp", "in_context")):
    _what = {"layer": "the full-layer operators J_mlp·J_attn", "mlp": "the MLP sub-layer operators"}[_sub]
    register(_name, ["operators"],
             f"Median over the first third of layers of complex_frac_nontrivial (the complex fraction among "
             f"eigenvalues that are not structurally 1) of {_what}, trained, {_mode}.",
             samples=_JACOBIAN_CHUNKS)(_complex_early("complex_frac_nontrivial", (_sub,), _mode))


@register("attn_nontrivial_fraction_early", ["eigenvalues"],
          "Median over the first third of layers of the fraction of the trained isolated attention operator's "
          "eigenvalues with |λ − 1| > 1e-8·max(1, max|λ|): the structural cap on its complex fraction "
          "(rank(U) ≤ n_kv·head_dim).", samples=_JACOBIAN_CHUNKS)
def _attn_cap(t: RunTables) -> float:
    df = select_rows(t.table("eigenvalues"), "eigenvalues.parquet", checkpoint="trained", jacobian_mode="isolated",
                 sublayer="attn")
    require_columns(df, "eigenvalues.parquet", "layer", "re", "im")
    n_layers = int(df["layer"].max()) + 1
    fractions = []
    for _, group in df[df["layer"] < math.ceil(n_layers / 3)].groupby("layer"):
        lam = numeric(group["re"]) + 1j * numeric(group["im"])
        tol = 1e-8 * max(1.0, float(np.max(np.abs(lam))))
        fractions.append(float(np.mean(np.abs(lam - 1.0) > tol)))
    return finite_median(np.array(fractions), "non-trivial eigenvalue fractions")


def weighted_rotation(lam: np.ndarray) -> float:
    """Magnitude-weighted rotation of an update's eigenvalues μ = λ − 1:
    ``Σ|Im μ| / Σ|μ|`` (the mean |sin arg μ| weighted by |μ|; 0 for a symmetric update, and
    negligible rotations weigh nothing, unlike a count of complex pairs). 0 when every μ is 0."""
    mu = np.asarray(lam, dtype=np.complex128) - 1.0
    total = float(np.abs(mu).sum())
    return float(np.abs(mu.imag).sum() / total) if total > 0 else 0.0


def _layer_rotations(t: RunTables, checkpoint: str) -> pd.Series:
    """Weighted rotation (:func:`weighted_rotation`) of each early layer's full-layer operator
    (isolated mode) at ``checkpoint``, by layer."""
    return t.derived(f"layer_rotations:{checkpoint}", lambda: _compute_layer_rotations(t, checkpoint))


def _compute_layer_rotations(t: RunTables, checkpoint: str) -> pd.Series:
    df = select_rows(t.table("eigenvalues"), "eigenvalues.parquet", jacobian_mode="isolated", sublayer="layer")
    require_columns(df, "eigenvalues.parquet", "checkpoint", "layer", "re", "im")
    n_layers = int(df["layer"].max()) + 1
    df = df[(df["checkpoint"] == checkpoint) & (df["layer"] < math.ceil(n_layers / 3))]
    if df.empty:
        raise NotTested(f"eigenvalues.parquet has no full-layer operators of {checkpoint} "
                        "(the step-0 null: --null init)", needs="--null init" if checkpoint == "init" else None)
    return df.groupby("layer").apply(lambda g: weighted_rotation(numeric(g["re"]) + 1j * numeric(g["im"])))


def _rotation_pairs(t: RunTables) -> pd.DataFrame:
    both = pd.concat({c: _layer_rotations(t, c) for c in ("trained", "init")}, axis=1).dropna()
    if both.empty:
        raise TooLittleData("no early layer has both trained and step-0 operators")
    return both


@register("rotation_gain_early", ["eigenvalues"],
          "Median over the first third of layers of the weighted rotation Σ|Im μ|/Σ|μ| (μ = λ − 1) of the trained "
          "full-layer operator minus that of the same layer at step 0 (isolated mean Jacobians), with its "
          "distribution-free 95% interval over layers: how much training pulls early layers towards rotation.",
          samples={"early_layers": lambda t: _count(lambda: len(_rotation_pairs(t))), **_JACOBIAN_CHUNKS})
def _rotation_gain(t: RunTables) -> Estimate:
    both = _rotation_pairs(t)
    return median_estimate((both["trained"] - both["init"]).to_numpy(), "rotation gains")


for _name, _checkpoint in (("rotation_early_trained", "trained"), ("rotation_early_init", "init")):
    register(_name, ["eigenvalues"],
             f"Median over the first third of layers of the weighted rotation of the {_checkpoint} full-layer "
             "operator (descriptive).")(
        lambda t, c=_checkpoint: finite_median(_layer_rotations(t, c).to_numpy(dtype=float), f"{c} rotations"))


@register("complex_frac_random_baseline", ["eigenvalues"],
          "The complex fraction a real Gaussian matrix of the operators' width d already has, 1 − √(2/(πd)) "
          "(Edelman–Kostlan–Shub: about √(2d/π) real eigenvalues), printed beside the complex fractions.")
def _random_baseline(t: RunTables) -> float:
    df = select_rows(t.table("eigenvalues"), "eigenvalues.parquet", checkpoint="trained", sublayer="layer")
    require_columns(df, "eigenvalues.parquet", "jacobian_mode", "layer")
    d = int(df.groupby(["jacobian_mode", "layer"]).size().max())
    return 1.0 - math.sqrt(2.0 / (math.pi * d))


def _count(count: Callable[[], int]) -> int | None:
    """A sample count, None when its inputs are missing."""
    try:
        return count()
    except (NotTested, TooLittleData):
        return None


#: The rank cap of the claims' funnel protocol (B2, the paper's figure: rank 512).
CLAIM_RANK = 512


def exact_rows(df: pd.DataFrame) -> pd.Series:
    """Which rows of a ``cumulative`` table belong to exact-product curves: its ``exact``
    column, or in runs made before that column (which always computed the exact products)
    the largest truncation."""
    return df["exact"].astype(bool) if "exact" in df.columns else df["truncation"] == df["truncation"].max()


def _funnel_curve(t: RunTables, checkpoint: str, alpha: float, direction: str, truncated: bool,
                  schur_order: str = "lapack", jacobian_mode: str | None = None) -> pd.DataFrame:
    """One cumulative erank curve, by number of factors, of ``jacobian_mode`` (default the
    funnel's: ``isolated`` when present): ``truncated`` picks the rank-capped curve
    (truncation < d; for d ≤ :data:`CLAIM_RANK` the exact one, which that cap leaves as it
    is), else the exact one (column ``exact``; in runs without it, the largest truncation); at α < 1 the Schur order ``schur_order`` (α = 1
    does not depend on it)."""
    df = select_rows(t.table("cumulative"), "cumulative.parquet", checkpoint=checkpoint, direction=direction)
    require_columns(df, "cumulative.parquet", "jacobian_mode", "schur_alpha", "truncation", "steps", "erank")
    modes = list(pd.unique(df["jacobian_mode"]))
    mode = jacobian_mode or ("isolated" if "isolated" in modes else modes[0])
    if mode not in modes:
        raise NotTested(f"cumulative.parquet has no {mode} curves (run --jacobian-mode both or all)",
                        needs="--jacobian-mode both")
    df = df[df["jacobian_mode"] == mode]
    df = df[np.isclose(numeric(df["schur_alpha"]), alpha)]
    if alpha < 1 and "schur_order" in df.columns:
        df = df[df["schur_order"] == schur_order]
    if df.empty:
        raise NotTested(f"cumulative.parquet has no {direction} curve for {checkpoint} at α = {alpha:g}"
                        + (f" in Schur order {schur_order}" if alpha < 1 else ""),
                        needs="--null init" if checkpoint == "init" else (
                            f"--funnel-alphas with {alpha:g} and --schur-orders with {schur_order}" if alpha < 1
                            else None))
    is_exact = exact_rows(df)
    exact, capped = df[is_exact], df[~is_exact]
    if truncated and capped.empty and not exact.empty and exact["truncation"].max() <= CLAIM_RANK:
        capped = exact  # the protocol's cap is at or above d: the exact product
    df = capped if truncated else exact
    if df.empty:
        raise NotTested(f"cumulative.parquet has no {'rank-truncated' if truncated else 'exact'} curve "
                        "(--funnel-rank 0 computes exact products only; models wider than --funnel-exact-width "
                        "rank-truncated ones only)",
                        needs=f"--funnel-rank {CLAIM_RANK}" if truncated else "--funnel-exact-width at or above d")
    return df.sort_values("steps")


def funnel_ends(t: RunTables, checkpoint: str, alpha: float = 1.0, direction: str = "backward",
                 truncated: bool = True, schur_order: str = "lapack", jacobian_mode: str | None = None
                 ) -> tuple[float, float]:
    """``(erank after one step, erank at full depth)`` of a curve (:func:`_funnel_curve`)."""
    curve = _funnel_curve(t, checkpoint, alpha, direction, truncated, schur_order, jacobian_mode)
    if len(curve) < 2:
        raise TooLittleData(f"the {checkpoint} cumulative curve has fewer than two depths")
    first, last = float(curve["erank"].iloc[0]), float(curve["erank"].iloc[-1])
    if not first > 0:
        raise TooLittleData(f"the {checkpoint} one-step erank is not positive")
    return first, last


def funnel_replicates(t: RunTables, checkpoint: str) -> pd.DataFrame:
    """The bootstrap replicates (``replicate`` ≥ 1 of ``funnel_boot``) of ``checkpoint`` under
    the claims' protocol: the Jacobian mode and truncation of its backward, rank-truncated α = 1
    curve (:func:`_funnel_curve`), finite ends only; columns ``init_seed``, ``replicate``,
    ``erank_one_step``, ``erank_full_depth``. Empty when the run has none (``--funnel-boot 0``)."""
    curve = _funnel_curve(t, checkpoint, 1.0, "backward", True)
    cols = ["init_seed", "replicate", "erank_one_step", "erank_full_depth"]
    boot = t.table("funnel_boot")
    if boot is None or boot.empty:
        return pd.DataFrame(columns=cols)
    require_columns(boot, "funnel_boot.parquet", "checkpoint", "jacobian_mode", "truncation", *cols)
    keep = ((boot["checkpoint"] == checkpoint) & (boot["jacobian_mode"] == curve["jacobian_mode"].iloc[0])
            & (numeric(boot["truncation"]) == float(curve["truncation"].iloc[0])) & (numeric(boot["replicate"]) >= 1)
            & np.isfinite(numeric(boot["erank_one_step"])) & np.isfinite(numeric(boot["erank_full_depth"])))
    return boot.loc[keep, cols].reset_index(drop=True)


def own_null(replicates: pd.DataFrame) -> pd.DataFrame:
    """The replicates of the run's own step-0 null (the ``init`` checkpoint of the other
    tables): the least ``init_seed``, the run seed (the extra nulls have seed + k)."""
    seeds = numeric(replicates["init_seed"])
    return replicates[seeds == np.nanmin(seeds)] if np.isfinite(seeds).any() else replicates


def funnel_pair_ratios(numerator: pd.DataFrame, denominator: pd.DataFrame) -> np.ndarray:
    """Full-depth erank of ``numerator`` over ``denominator`` replicate by replicate: every row
    of ``numerator`` (e.g. one per step-0 seed and replicate) with the ``denominator`` row of
    its replicate (the same resampled chunks, :mod:`depthlens.jacobian.bootstrap`)."""
    pairs = numerator.merge(denominator[["replicate", "erank_full_depth"]], on="replicate", suffixes=("", "_over"))
    return numeric(pairs["erank_full_depth"]) / numeric(pairs["erank_full_depth_over"])


def _init_seeds(t: RunTables) -> int | None:
    """Step-0 initialisations with bootstrap replicates (``init`` rows of ``funnel_boot``)."""
    boot = t.table("funnel_boot")
    if boot is None or not {"checkpoint", "init_seed", "replicate"} <= set(boot.columns):
        return None
    init = boot[(boot["checkpoint"] == "init") & (numeric(boot["replicate"]) >= 1)]
    return int(init["init_seed"].nunique())


def _ratio(checkpoint: str, direction: str, truncated: bool, mode: str | None, boot: bool
           ) -> Callable[[RunTables], float | Estimate]:
    """erank at full depth over erank after one step of ``checkpoint``'s curve; ``boot`` adds
    the 95 % percentile interval over the bootstrap replicates (the run seed's null for init)."""
    def stat(t: RunTables) -> float | Estimate:
        first, last = funnel_ends(t, checkpoint, 1.0, direction, truncated, jacobian_mode=mode)
        if not boot:
            return last / first
        reps = funnel_replicates(t, checkpoint)
        reps = own_null(reps) if checkpoint == "init" else reps
        ratios = numeric(reps["erank_full_depth"]) / numeric(reps["erank_one_step"])
        return Estimate(last / first, *percentile_interval(ratios))

    return stat


def _init_over_trained(direction: str, truncated: bool, mode: str | None, boot: bool
                       ) -> Callable[[RunTables], float | Estimate]:
    """Full-depth erank of init over trained; ``boot`` adds the 95 % percentile interval over
    every pair of a step-0 null's replicate and the trained replicate of the same chunks."""
    def stat(t: RunTables) -> float | Estimate:
        value = funnel_ends(t, "init", 1.0, direction, truncated, jacobian_mode=mode)[1] / funnel_ends(
            t, "trained", 1.0, direction, truncated, jacobian_mode=mode)[1]
        if not boot:
            return value
        ratios = funnel_pair_ratios(funnel_replicates(t, "init"), funnel_replicates(t, "trained"))
        return Estimate(value, *percentile_interval(ratios))

    return stat


#: Below this fraction of d a one-step erank leaves the funnel no headroom (METHODS B3); a
#: coordinate holding this share of a unit vector's squared norm carries it.
COLLAPSED, CARRIES = 0.1, 0.9
SUBLAYER_ORDER = ("attn", "mlp", "ple")  # the sub-layers of a layer, in the residual's order


def _width(t: RunTables) -> int:
    """The residual width d: the eigenvalues of one trained operator."""
    eig = select_rows(t.table("eigenvalues"), "eigenvalues.parquet", checkpoint="trained")
    require_columns(eig, "eigenvalues.parquet", "layer", "sublayer", "jacobian_mode")
    first = eig.iloc[0]
    return int(((eig["layer"] == first["layer"]) & (eig["sublayer"] == first["sublayer"])
                & (eig["jacobian_mode"] == first["jacobian_mode"])).sum())


def top_coordinate(J: np.ndarray) -> tuple[int, float]:
    """The coordinate that carries most of ``J``'s top left singular vector u₁, and its share
    ``u₁[i]²`` (of ``‖u₁‖² = 1``; exact to LAPACK's SVD).

    Examples
    --------
    >>> top_coordinate(np.diag([1.0, 40.0, 2.0]))
    (1, 1.0)
    """
    u = np.linalg.svd(np.asarray(J, dtype=np.float64))[0][:, 0]
    i = int(np.argmax(u**2))
    return i, float(u[i] ** 2)


def _last_operator(t: RunTables, mode: str) -> np.ndarray:
    """The trained mean Jacobian of the last sub-layer (the backward funnel's first step)."""
    found = t.arrays(f"jacobians_trained_{mode}")
    if found is None:
        raise NotTested(f"the run saved no {mode} operators (arrays/jacobians_trained_{mode})",
                        needs="--save-arrays float64")
    arrays = found[0]
    keys = [k.split(".", 1) for k in arrays]
    last = max(int(layer) for layer, _ in keys)
    kinds = [kind for layer, kind in keys if int(layer) == last]
    kind = max(kinds, key=lambda k: SUBLAYER_ORDER.index(k) if k in SUBLAYER_ORDER else -1)
    return arrays[f"{last}.{kind}"]


def funnel_premise(t: RunTables) -> str | None:
    """Where B2's ratio has no premise: when the one-step erank of the claims' funnel is below
    :data:`COLLAPSED` · d, that every sub-layer operator is already rank-collapsed (with both
    eranks as fractions of d), naming the residual coordinate that carries the first step's top
    left singular vector when one holds ≥ :data:`CARRIES` of it; None otherwise (the fractions
    are the descriptive statistics ``funnel_one_step_fraction`` and
    ``funnel_full_depth_fraction``)."""
    first, last = funnel_ends(t, "trained", 1.0, "backward", True)
    d = _width(t)
    if first >= COLLAPSED * d:
        return None
    text = (f"every sub-layer operator is already rank-collapsed: no headroom for a funnel (one-step erank "
            f"{first:.3g} = {first / d:.1%} of d = {d}, full depth {last:.3g} = {last / d:.1%})")
    mode = str(_funnel_curve(t, "trained", 1.0, "backward", True)["jacobian_mode"].iloc[0])
    try:
        i, share = top_coordinate(_last_operator(t, mode))
    except NotTested:
        return text
    return text + (f"; residual coordinate {i} carries {share:.0%} of the first step's top singular vector"
                   if share >= CARRIES else "")


def boot_skipped(t: RunTables) -> str | None:
    """Why the claims' funnel has no bootstrap interval although the run asked for one: its
    ``funnel_boot`` table holds the point estimate alone (replicate 0), as the jacobian stage
    writes it over a single chunk, which is its only resample; None otherwise."""
    boot = t.table("funnel_boot")
    if boot is None or boot.empty or "replicate" not in boot.columns or (numeric(boot["replicate"]) > 0).any():
        return None
    n = run_chunks(t)
    return (f"no interval: the bootstrap resampled nothing, since {n} chunk is its only resample; pass --chunks 2 "
            "or more" if n == 1 else "no interval: the bootstrap holds the point estimate alone")


def _funnel_notes(premise: bool) -> Callable[[RunTables], str | None]:
    """The note of a funnel claim: B2's premise (:func:`funnel_premise`, with ``premise``) and a
    skipped bootstrap (:func:`boot_skipped`), joined."""
    def note(t: RunTables) -> str | None:
        parts = []
        for part in ((funnel_premise, boot_skipped) if premise else (boot_skipped,)):
            try:
                parts.append(part(t))
            except (NotTested, TooLittleData):
                continue
        return "; ".join(p for p in parts if p) or None

    return note


def funnel_operators(t: RunTables) -> int | None:
    """Sub-layer operators of the claims' funnel: the steps of the trained curve at full depth."""
    return _count(lambda: int(numeric(_funnel_curve(t, "trained", 1.0, "backward", True)["steps"]).max()))


def funnel_width(t: RunTables) -> int | None:
    """The residual width d (:func:`_width`)."""
    return _count(lambda: _width(t))

def _replicates(t: RunTables) -> int | None:
    """Bootstrap replicates of the trained funnel (``funnel_boot`` rows with ``replicate`` ≥ 1;
    0 when the run ran none or skipped them)."""
    if t.table("cumulative") is None:
        return None
    return _count(lambda: len(funnel_replicates(t, "trained")))


#: The sample units of the claims' funnel statistics.
_FUNNEL_UNITS = {**_JACOBIAN_CHUNKS, "operators": funnel_operators, "width": funnel_width,
                 "replicates": _replicates}


for _name, _end, _where in (("funnel_one_step_fraction", 0, "after one step"), ("funnel_full_depth_fraction", 1,
                                                                                  "at full depth")):
    register(_name, ["cumulative", "eigenvalues"], f"erank of the trained cumulative Jacobian {_where} (backward, "
             "rank-truncated, α = 1) over d (B2's premise).")(
        lambda t, end=_end: funnel_ends(t, "trained", 1.0, "backward", True)[end] / _width(t))


#: The funnel's protocols, the claims' own first (the paper's figure: backward, rank 512, the
#: funnel's Jacobian mode), which alone carries the bootstrap's 95% percentile interval
#: (funnel_boot; the variants stay point estimates): the names of its three statistics
#: (trained ratio, step-0 ratio, step-0 over trained), the direction, whether rank-truncated,
#: the Jacobian mode (None: the funnel's) and the words for it.
_PROTOCOLS = (
    (("funnel_ratio_trained", "funnel_ratio_init", "funnel_init_over_trained"),
     "backward", True, None, "backward, rank-truncated (512)"),
    (("funnel_ratio_trained_forward", "funnel_ratio_init_forward", "funnel_init_over_trained_forward"),
     "forward", True, None, "forward, rank-truncated"),
    (("funnel_ratio_trained_exact", "funnel_ratio_init_exact", "funnel_init_over_trained_exact"),
     "backward", False, None, "backward, exact"),
    (("funnel_ratio_trained_forward_exact", "funnel_ratio_init_forward_exact", "funnel_init_over_trained_forward_exact"),
     "forward", False, None, "forward, exact"),
    (("funnel_ratio_trained_in_context", "funnel_ratio_init_in_context", "funnel_init_over_trained_in_context"),
     "backward", True, "in_context", "backward, rank-truncated, in-context operators"),
)
for _i, ((_trained, _init, _over), _direction, _truncated, _mode, _text) in enumerate(_PROTOCOLS):
    _claims = _i == 0
    _boot = (", with the 95% percentile interval of the same ratio over the bootstrap replicates of funnel_boot "
             "(chunks redrawn with replacement; unbounded with fewer than 40)") if _claims else ""
    register(_trained, ["cumulative"],
             f"erank of the trained cumulative Jacobian ({_text}, α = 1) at full depth over its value after one "
             f"step{_boot}.", samples=_FUNNEL_UNITS if _claims else _JACOBIAN_CHUNKS,
             note=_funnel_notes(True) if _claims else None)(
        _ratio("trained", _direction, _truncated, _mode, _claims))
    register(_init, ["cumulative"],
             f"The same ratio on the step-0 (init) checkpoint ({_text}; descriptive)"
             + (", with its 95% percentile interval over the bootstrap replicates of the run seed's null"
                if _claims else "") + ".",
             samples=_JACOBIAN_CHUNKS)(_ratio("init", _direction, _truncated, _mode, _claims))
    register(_over, ["cumulative"],
             f"Full-depth erank of the step-0 (init) cumulative Jacobian over the trained one's ({_text}, α = 1): "
             "how much more rank the architecture alone keeps" + (
                 "; the value is the run seed's null, the 95% percentile interval is over every pair of a step-0 "
                 "null (--init-seeds) and a bootstrap replicate, each null's replicate over the trained replicate "
                 "of the same resampled chunks, so it covers the chunk sample and the initialisation (unbounded "
                 "with fewer than 40 pairs)" if _claims else "") + ".",
             samples={**(_FUNNEL_UNITS if _claims else _JACOBIAN_CHUNKS), **({"init_seeds": _init_seeds} if _claims
                                                                              else {})},
             note=_funnel_notes(False) if _claims else None)(
        _init_over_trained(_direction, _truncated, _mode, _claims))


#: The Schur orders of the split (METHODS B4), LAPACK's own first.
SCHUR_ORDERS = ("lapack", "canonical", "outside_first", "inside_first")


def _schur_removed(schur_order: str, direction: str = "backward", truncated: bool = True,
                   jacobian_mode: str | None = None) -> Callable:
    def stat(t: RunTables) -> float:
        first1, last1 = funnel_ends(t, "trained", 1.0, direction, truncated, jacobian_mode=jacobian_mode)
        first0, last0 = funnel_ends(t, "trained", 0.0, direction, truncated, schur_order, jacobian_mode)
        fall1, fall0 = -math.log(last1 / first1), -math.log(last0 / first0)
        if not fall1 > 0:
            raise TooLittleData("no funnel at α = 1 to remove")
        return 1.0 - fall0 / fall1

    return stat


for _name, _order in (("funnel_removed_by_schur", "lapack"), ("funnel_removed_by_schur_canonical", "canonical"),
                      ("funnel_removed_by_schur_outside_first", "outside_first"),
                      ("funnel_removed_by_schur_inside_first", "inside_first")):
    register(_name, ["cumulative"],
             "Fraction of the trained funnel (in log erank; backward, rank-truncated) removed by the Schur split "
             f"α = 0 in Schur order {_order}: 1 − log(r₀)/log(r₁), r_α = erank(full depth)/erank(one step).",
             samples=_JACOBIAN_CHUNKS)(_schur_removed(_order))


@register("funnel_removed_by_schur_every_order", ["cumulative"],
          "funnel_removed_by_schur in LAPACK's order with its range over every Schur order the run computed (the "
          "α = 0 operator depends on the order): decisive only when every order agrees.",
          samples={**_JACOBIAN_CHUNKS, "operators": funnel_operators})
def _schur_every_order(t: RunTables) -> Estimate:
    values = {}
    for order in SCHUR_ORDERS:
        try:
            values[order] = _schur_removed(order)(t)
        except NotTested:
            continue
    if "lapack" not in values:
        raise NotTested("cumulative.parquet has no α = 0 curve in LAPACK's Schur order",
                        needs="--funnel-alphas with 0 and --schur-orders with lapack")
    finite = [v for v in values.values() if not math.isnan(v)]
    if len(values) < len(SCHUR_ORDERS):
        missing = ", ".join(o for o in SCHUR_ORDERS if o not in values)
        raise TooLittleData(f"the Schur split was not computed in every order (missing: {missing}; "
                            "--schur-orders)")
    return Estimate(values["lapack"], min(finite), max(finite), "range")


register("funnel_removed_by_schur_in_context", ["cumulative"],
         "As funnel_removed_by_schur on the in-context operators (LAPACK order).",
         samples=_JACOBIAN_CHUNKS)(_schur_removed("lapack", jacobian_mode="in_context"))
register("funnel_removed_by_schur_forward_exact", ["cumulative"],
         "As funnel_removed_by_schur on the forward exact products (the protocol before the paper's).",
         samples=_JACOBIAN_CHUNKS)(_schur_removed("lapack", "forward", False))


def _depth_trend(checkpoint: str) -> Callable[[RunTables], Estimate]:
    def stat(t: RunTables) -> Estimate:
        df = select_rows(t.table("operators"), "operators.parquet", checkpoint=checkpoint, jacobian_mode="isolated")
        require_columns(df, "operators.parquet", "layer", "sublayer", "symmetry_update")
        df = df[df["sublayer"].isin(("attn", "mlp"))]
        return spearman_estimate(numeric(df["layer"]), numeric(df["symmetry_update"]),
                                 "operators with varying symmetry")

    return stat


def _trained_operators(t: RunTables) -> int | None:
    """Trained isolated attention and MLP operators (the pairs of the depth trend)."""
    df = t.table("operators")
    if df is None or not {"checkpoint", "jacobian_mode", "sublayer"} <= set(df.columns):
        return None
    return int(((df["checkpoint"] == "trained") & (df["jacobian_mode"] == "isolated")
                & df["sublayer"].isin(("attn", "mlp"))).sum())


register("symmetry_depth_trend_trained", ["operators"],
         "Spearman rank correlation between layer and symmetry_update (the symmetric share of U = J − I) of the "
         "trained isolated attention and MLP mean Jacobians (positive: late layers are nearer symmetric), with its "
         "95% interval (Fisher's z).",
         samples={**_JACOBIAN_CHUNKS, "operators": _trained_operators})(_depth_trend("trained"))
register("symmetry_depth_trend_init", ["operators"],
         "The same trend at step 0 (descriptive).", samples=_JACOBIAN_CHUNKS)(_depth_trend("init"))


@register("symmetry_init_minus_trained_early", ["operators"],
          "Median symmetry_update of the step-0 isolated attention and MLP operators minus that of the trained ones in "
          "the first third of layers (positive: training pulls early layers away from symmetry, towards "
          "rotation).", samples=_JACOBIAN_CHUNKS)
def _symmetry_gap(t: RunTables) -> float:
    values = [finite_median(numeric(_early_operators(t, ("attn", "mlp"), c)["symmetry_update"]), f"{c} symmetry")
              for c in ("init", "trained")]
    return values[0] - values[1]


def transport_against_product(t: RunTables) -> pd.DataFrame:
    """The true funnel beside the funnel of mean operators, per source layer ℓ = 0 … L − 2:
    ``erank_transport``, the effective rank of the lens's transport J_ℓ (``transport`` table:
    the total cross-position Jacobian from block ℓ's output to the last block's), and
    ``erank_product``, that of the backward product of the trained model's mean sub-layer
    Jacobians over the S(L − 1 − ℓ) sub-layers after block ℓ (S a layer: 2, or 3 with Gemma 4's
    per-layer-input update, as the ``operators`` table names them; ``cumulative``: α = 1, the
    funnel's Jacobian mode, the exact curve when the run has it, else the rank-truncated one;
    column ``truncated``). Descriptive: the two estimate different operators, and their gap is
    what the product of per-layer means leaves out (other positions, the average of products).

    Raises
    ------
    NotTested
        Without the lens stage's table or the trained backward curve.
    """
    transport = t.table("transport")
    if transport is None:
        raise NotTested("needs the lens stage's transport table: run depthlens lens into this run directory "
                        "with --resume", needs="depthlens lens")
    require_columns(transport, "transport.parquet", "layer", "erank")
    if t.table("cumulative") is None or t.table("operators") is None:
        raise NotTested("needs the jacobian stage's cumulative and operators tables: run depthlens jacobian into "
                        "this run directory with --resume", needs="the jacobian stage")
    try:
        curve, truncated = _funnel_curve(t, "trained", 1.0, "backward", False), False
    except NotTested:
        curve, truncated = _funnel_curve(t, "trained", 1.0, "backward", True), True
    ops = select_rows(t.table("operators"), "operators.parquet", checkpoint="trained")
    require_columns(ops, "operators.parquet", "sublayer")
    S = len(set(ops["sublayer"]) - {"layer"})  # sub-layers a layer
    erank = dict(zip(numeric(curve["steps"]).astype(int), numeric(curve["erank"])))
    L = max(erank) // S
    rows = [{"layer": int(layer), "erank_transport": float(value), "erank_product": erank.get(S * (L - 1 - int(layer)),
             float("nan")), "truncated": truncated}
            for layer, value in zip(transport["layer"], numeric(transport["erank"])) if int(layer) <= L - 2]
    if not rows:
        raise TooLittleData("the transport table has no layer below the last")
    return pd.DataFrame(rows).sort_values("layer").reset_index(drop=True)


@register("funnel_product_over_transport", ["transport", "cumulative", "operators"],
          "Descriptive: the erank of the backward product of the trained mean Jacobians over every sub-layer after "
          "block 0, over the erank of the true transport from block 0 (the Jacobian lens of the lens stage); 1 when "
          "the product of per-layer means funnels as much as the true end-to-end operator.")
def _product_over_transport(t: RunTables) -> float:
    pair = transport_against_product(t).iloc[0]
    if pair["layer"] != 0 or not math.isfinite(pair["erank_product"]):
        raise TooLittleData("no layer-0 pair of transport and product")
    return float(pair["erank_product"] / pair["erank_transport"])
