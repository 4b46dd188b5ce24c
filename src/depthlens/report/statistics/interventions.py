"""Statistics of the interventions (claims A7): the clamp chain of the massive dimensions and the
cross-validated contest of feature families."""

from __future__ import annotations

from collections.abc import Callable


import numpy as np
import pandas as pd

from ...runs.tables import RunTables
from .core import (Estimate, NotTested, Statistic, TooLittleData, as_count, numeric, option_count, registrar,
                   require_columns, rerun, run_chunks, select_rows)

STATISTICS: dict[str, Statistic] = {}
register = registrar(STATISTICS)


def _clamp_chunks(t: RunTables) -> int | None:
    chain = (t.json("interventions") or {}).get("clamp_chain")
    n = as_count(chain.get("n_chunks")) if isinstance(chain, dict) else None
    return n if n is not None else run_chunks(t)


def _contest_layers(t: RunTables) -> int | None:
    """Layers the contest's heads come from (its cross-validation groups and bootstrap clusters)."""
    df = t.table("contest_features")
    return None if df is None or "layer" not in df.columns else int(df["layer"].nunique())


def _clamped_layers(t: RunTables) -> int | None:
    """Layers from the first clamped one (``from_layer`` of the clamp table) to the model's last."""
    clamp, heads = t.table("clamp"), t.trained("heads")
    if clamp is None or heads is None or "from_layer" not in clamp.columns or "layer" not in heads.columns:
        return None
    first = numeric(clamp["from_layer"])
    first = first[np.isfinite(first)]
    return None if first.size == 0 else int(numeric(heads["layer"]).max()) + 1 - int(first.min())


#: What would test the clamp chain where the run does not say (the common cause: no massive
#: activations to clamp).
CHAIN_NEEDS = "a model with massive activations"


def _chain(t: RunTables) -> dict:
    """``interventions.json['clamp_chain']`` of a run in which the chain was tested."""
    chain = t.json("interventions").get("clamp_chain")
    if not isinstance(chain, dict):
        raise NotTested("interventions.json lacks 'clamp_chain'", needs=rerun("interventions.json"))
    if chain.get("tested") is False:
        raise NotTested(str(chain.get("reason") or "the clamp chain was not tested"),
                        needs=str(chain.get("needs") or CHAIN_NEEDS))
    return chain


@register("clamp_chain_n_dims", ["interventions.json"],
          "Number of massive-activation dimensions whose clamp supports the chain (sink mass "
          "falls monotonically in α, predicts the rise in reserve, control inert): "
          "len(interventions.json['clamp_chain']['dims']), 0 when the chain is not supported.",
          samples={"chunks": _clamp_chunks, "control_seeds": option_count("control_seeds"),
                   "null_samples": option_count("clamp_null_samples"), "clamped_layers": _clamped_layers})
def _clamp_chain(t: RunTables) -> float:
    chain = _chain(t)
    if chain.get("supported") is False:
        return 0.0
    dims = chain.get("dims")
    if not isinstance(dims, list):
        raise NotTested("interventions.json lacks 'clamp_chain.dims'", needs=rerun("interventions.json"))
    return float(len(dims))


def _chain_condition(name: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        held = ((_chain(t).get("conditions") or {}).get(name) or {}).get("held")
        if held is None:
            raise NotTested(f"the clamp chain's condition {name!r} was not evaluated",
                            needs=str(_chain(t).get("needs") or rerun("interventions.json")))
        return float(bool(held))

    return stat


for _statistic, _name, _what in (
        ("clamp_chain_monotone", "monotone", "sink mass falls monotonically with the dose"),
        ("clamp_chain_predicts", "predicts", "the drop in sink mass predicts the rise in reserve across heads"),
        ("clamp_chain_control_inert", "control_inert", "the random-dimension control moves neither")):
    register(_statistic, ["interventions.json"],
             f"1 when the clamp chain's condition '{_name}' held ({_what}), 0 when it did not: "
             f"interventions.json['clamp_chain']['conditions']['{_name}']['held'].")(_chain_condition(_name))


def _target_needs(t: RunTables, target: str) -> str:
    """What would give the contest rows of ``target``: the target in ``--contest-targets``, else
    heads it can be cross-validated over (the contest skips a target without them)."""
    targets = ((t.manifest.get("config") or {}).get("contest") or {}).get("contest_targets")
    if isinstance(targets, list) and target not in targets:
        return f"--contest-targets with {target}"
    if target == "routing":
        return "a model with routing heads and others"
    return f"heads with a {target} value in 2 or more layers"


def _contest_rows(t: RunTables, target: str) -> pd.DataFrame:
    df = t.table("contest")
    require_columns(df, "contest.parquet", "target", "features", "score", "q", "required")
    return select_rows(df, "contest.parquet", needs=_target_needs(t, target), target=target)


@register("contest_R_required", ["contest"],
          "Number of the targets depth persistence and routing identity for which the resolvent family R is "
          "required: the contest row `all-R` has `required` True (dropping R lowers the cross-validated score "
          "with the layer-bootstrap interval excluding 0 and the drop significant, BH q ≤ 0.05).", samples={"layers": _contest_layers, "contest_perm": option_count("contest_perm")})
def _contest_r_required(t: RunTables) -> float:
    count = 0
    for target in ("persistence", "routing"):
        rows = _contest_rows(t, target)
        drop = rows[rows["features"] == "all-R"]
        if drop.empty:
            raise NotTested(f"contest.parquet has no all-R row for {target}", needs=_target_needs(t, target))
        count += bool(drop["required"].iloc[0])
    return float(count)


@register("contest_criticality_predicted", ["contest"],
          "Number of single-family feature sets (P, E, S, R) that predict ablation criticality: contest rows of "
          "target `criticality` with a positive Spearman score and BH q ≤ 0.05.", samples={"layers": _contest_layers, "contest_perm": option_count("contest_perm")})
def _contest_criticality(t: RunTables) -> float:
    rows = _contest_rows(t, "criticality")
    single = rows[rows["features"].isin(["P", "E", "S", "R"])]
    if single.empty:
        raise NotTested("contest.parquet has no single-family rows for criticality",
                        needs=_target_needs(t, "criticality"))
    return float(((numeric(single["score"]) > 0) & (numeric(single["q"]) <= 0.05)).sum())


@register("contest_criticality_best_family", ["contest"],
          "The best single-family (P, E, S, R) cross-validated Spearman score for ablation criticality, with the "
          "interval [largest lower, largest upper] of the families' layer-bootstrap intervals: no family predicts "
          "criticality only when even the largest upper end is below the pre-registered margin.",
          samples={"layers": _contest_layers, "contest_perm": option_count("contest_perm")})
def _criticality_best(t: RunTables) -> Estimate:
    rows = _contest_rows(t, "criticality")
    require_columns(rows, "contest.parquet", "score_lo", "score_hi")
    single = rows[rows["features"].isin(["P", "E", "S", "R"])]
    if single.empty:
        raise NotTested("contest.parquet has no single-family rows for criticality",
                        needs=_target_needs(t, "criticality"))
    score, lo, hi = (numeric(single[c]) for c in ("score", "score_lo", "score_hi"))
    if not np.isfinite(score).any():
        raise TooLittleData("no single family has a finite criticality score")
    return Estimate(float(np.nanmax(score)), float(np.nanmax(lo)), float(np.nanmax(hi)))
