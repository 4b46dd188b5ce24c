"""Part A's statistics of attention (claims A1–A6): Kreiss pinning, the eigenvalue gaps of the
depth products against their matched nulls, the routing and sink heads' rank tests, the
induction ratios and the routing reserve's tie to previous-token heads."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ...runs.tables import RunTables
from ...stats import head_rank_tests, induction_ratio_replicates, percentile_interval, proportion_interval, sign_test
from .core import (Estimate, NotTested, SampleCounter, Statistic, TooLittleData, as_count, config_count, finite_median,
                   finite_spearman, median_estimate, numeric, option_count, registrar, require_columns, rerun,
                   run_chunks, select_rows, spearman_estimate)

STATISTICS: dict[str, Statistic] = {}
register = registrar(STATISTICS)


def _distinct_depth_chunks(source: str) -> SampleCounter:
    """Chunks of the mean-head depth products with ``source`` rows at the final depth."""
    def count(t: RunTables) -> int | None:
        df = t.trained("depth")
        if df is None or not {"operator", "source", "depth", "chunk"} <= set(df.columns):
            return None
        df = df[(df["operator"] == "mean") & (df["source"] == source)]
        return int(df.loc[df["depth"] == df["depth"].max(), "chunk"].nunique()) if len(df) else 0

    return count


def _role_heads(role: str, finite: str | None = None) -> SampleCounter:
    """Heads of ``role`` (with a finite ``finite`` column when given) in heads.parquet, else
    the role counts of attention.json."""
    def count(t: RunTables) -> int | None:
        heads = t.trained("heads")
        if heads is not None and "role" in heads.columns:
            sel = heads[heads["role"] == role]
            if finite is None:
                return len(sel)
            if finite in sel.columns:
                return int(np.isfinite(numeric(sel[finite])).sum())
            return None
        roles = (t.json("attention") or {}).get("roles")
        return as_count(roles.get(role, 0)) if finite is None and isinstance(roles, dict) else None

    return count


def _null_chunks_of(role: str) -> SampleCounter:
    """Chunks with null samples behind each head's Δ_TR and sign test: the least
    ``n_null_chunks`` over the heads of ``role``; else the chunks with a finite per-chunk
    ``delta_TR1``; else min(chunks, null_chunks) of the manifest."""
    def count(t: RunTables) -> int | None:
        heads = t.trained("heads")
        if heads is not None and {"role", "n_null_chunks"} <= set(heads.columns):
            n = numeric(heads.loc[heads["role"] == role, "n_null_chunks"])
            n = n[~np.isnan(n)]
            if n.size:
                return int(n.min())
        chunks = t.trained("head_chunks")
        if chunks is not None and {"chunk", "delta_TR1"} <= set(chunks.columns):
            return int(chunks.loc[np.isfinite(numeric(chunks["delta_TR1"])), "chunk"].nunique())
        known = [n for n in (run_chunks(t), config_count(t, "null_chunks")) if n is not None]
        return min(known) if known else None

    return count


def _simple_matrices(t: RunTables) -> int | None:
    df = t.trained("head_chunks")
    if df is None or "perron_simple" not in df.columns:
        return None
    return int((numeric(df["perron_simple"]) == 1.0).sum())



_NULL_HEADS = {"routing": _null_chunks_of("routing"), "sink": _null_chunks_of("sink")}


@register("kreiss_A_pinned_fraction", ["head_chunks"],
          "Fraction of attention matrices with a simple Perron root whose K(A) reaches √n "
          "(column kreiss_A_ok of head_chunks).", samples={"matrices": _simple_matrices})
def _kreiss_pinned(t: RunTables) -> float:
    df = t.trained("head_chunks")
    require_columns(df, "head_chunks", "perron_simple", "kreiss_A_ok")
    simple = df[numeric(df["perron_simple"]) == 1.0]
    if simple.empty:
        raise TooLittleData("no matrix with a simple Perron root")
    return float(np.mean(numeric(simple["kreiss_A_ok"]) == 1.0))


def _final_gaps(t: RunTables, which: str = "gap_e1") -> pd.DataFrame:
    """Final-depth rows of the mean-head depth products (both sources)."""
    df = select_rows(t.trained("depth"), "depth.parquet", operator="mean")
    require_columns(df, "depth.parquet", "source", "chunk", "sample", "depth", which)
    return df[df["depth"] == df["depth"].max()]


def _gap(source: str, which: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        final = _final_gaps(t, which)
        final = final[final["source"] == source]
        if final.empty:
            raise NotTested(f"depth.parquet has no {source} rows",
                            needs="--null-chunks 1 or more" if source == "null" else rerun("depth.parquet"))
        return finite_median(numeric(final[which]), f"{which} ({source}) at the final depth")

    return stat


for _name, _source, _which in (("eig_gap_e1_model_final", "model", "gap_e1"),
                               ("eig_gap_e2_model_final", "model", "gap_e2"),
                               ("eig_gap_e1_null_final", "null", "gap_e1"),
                               ("eig_gap_e2_null_final", "null", "gap_e2")):
        register(_name, ["depth"],
                 f"Median over chunks{' and null samples' if _source == 'null' else ''} of {_which} = "
                 f"log10(‖D‖/{_which[-2:].upper()}) of the mean-head operator at the final depth, "
                 f"source = {_source} (descriptive: the absolute gap).",
                 samples={"null_chunks" if _source == "null" else "chunks": _distinct_depth_chunks(_source)},
                 )(_gap(_source, _which))


def gap_contrasts(depth: pd.DataFrame, which: str = "gap_e1") -> np.ndarray:
    """Per chunk with null samples: the model's final-depth gap minus the mean of its matched
    nulls' gaps (mean-head operator), in orders of magnitude. ``+inf`` when the model's
    prediction error is exactly zero (E = 0) and the nulls' are not."""
    model = depth[depth["source"] == "model"].groupby("chunk")[which].first()
    null = depth[depth["source"] == "null"].groupby("chunk")[which].mean()
    both = model.index.intersection(null.index)
    return (model.loc[both] - null.loc[both]).to_numpy(dtype=float)


def _contrast(which: str) -> Callable[[RunTables], Estimate]:
    def stat(t: RunTables) -> Estimate:
        final = _final_gaps(t, which)
        if not (final["source"] == "null").any():
            raise NotTested("depth.parquet has no null samples to contrast with (--null-chunks 0?)",
                            needs="--null-chunks 1 or more")
        return median_estimate(gap_contrasts(final, which), f"{which} contrasts")

    return stat


for _name, _which in (("eig_gap_e1_contrast", "gap_e1"), ("eig_gap_e2_contrast", "gap_e2")):
    register(_name, ["depth"],
             f"Median over chunks with nulls of the paired contrast {_which}(model) − mean over the chunk's "
             f"null samples of {_which}(null) at the final depth (mean-head operator): how many more "
             "orders of magnitude the model's eigenvalue prediction errs than its matched nulls'.",
             samples={"null_chunks": _distinct_depth_chunks("null"), "null_samples": option_count("null_samples")})(
        _contrast(_which))


@register("eig_gap_e1_null_chunks", ["depth"],
          "Median over chunks with nulls of the chunk's mean null gap_e1 at the final depth (mean-head operator), "
          "with its distribution-free 95% interval over chunks: whether the eigenvalue-prediction error is absent "
          "in the matched nulls (near 0).",
          samples={"null_chunks": _distinct_depth_chunks("null"), "null_samples": option_count("null_samples")})
def _null_gap(t: RunTables) -> Estimate:
    final = _final_gaps(t)
    null = final[final["source"] == "null"]
    if null.empty:
        raise NotTested("depth.parquet has no null samples (--null-chunks 0?)", needs="--null-chunks 1 or more")
    return median_estimate(null.groupby("chunk")["gap_e1"].mean().to_numpy(dtype=float), "null gaps")


@register("eig_gap_contrast_sign_p", ["depth"],
          "Two-sided exact sign-test p-value of the paired gap_e1 contrasts (model minus matched "
          "nulls, per chunk) against zero.", samples={"null_chunks": _distinct_depth_chunks("null")})
def _contrast_p(t: RunTables) -> float:
    contrasts = gap_contrasts(_final_gaps(t))
    if not np.isfinite(contrasts).any() and not np.isinf(contrasts).any():
        raise TooLittleData("no chunk with both model and null gaps")
    return sign_test(contrasts)


def _routing_median(column: str) -> Callable[[RunTables], Estimate]:
    def stat(t: RunTables) -> Estimate:
        df = t.trained("heads")
        require_columns(df, "heads.parquet", "role", column)
        routing = df[df["role"] == "routing"]
        if routing.empty:
            raise TooLittleData("no routing heads")
        return median_estimate(numeric(routing[column]), f"{column} over routing heads")

    return stat


def _induction_ratio(column: str, base: str) -> Callable[[RunTables], Estimate]:
    """The median over routing heads of ``column`` (heads.parquet) with its 95 % percentile
    interval over bootstrap replicates that redraw the probe sequences and the heads
    (:func:`~depthlens.stats.induction_ratio_replicates` of induction_seqs.parquet);
    a run without that table gets the distribution-free interval over heads alone."""
    median = _routing_median(column)

    def stat(t: RunTables) -> Estimate:
        estimate = median(t)
        seqs = t.trained("induction_seqs")
        if seqs is None:
            return estimate
        require_columns(seqs, "induction_seqs.parquet", "layer", "head", "seq", "delta_TR1_second_copy", base)
        if seqs.empty:
            return estimate
        return Estimate(estimate.value, *percentile_interval(induction_ratio_replicates(seqs, base)))

    return stat


def _probe_seqs(t: RunTables) -> int | None:
    """Probe sequences behind the induction ratios: the distinct ``seq`` of induction_seqs, else
    the run's ``probe_seqs`` option."""
    seqs = t.trained("induction_seqs")
    return config_count(t, "probe_seqs") if seqs is None or "seq" not in seqs.columns else int(seqs["seq"].nunique())


register("induction_ratio_median", ["heads"],
         "Median over routing heads of induction_ratio: Δ_TR of the whole [BOS, r, r] probe over Δ_TR "
         "of its first-copy block (confounded by length: descriptive), with its 95% interval over probe "
         "sequences and heads redrawn.",
         samples={"routing_heads": _role_heads("routing", "induction_ratio"), "probe_seqs": _probe_seqs})(
    _induction_ratio("induction_ratio", "delta_TR1_first_copy"))
register("induction_ratio_control_median", ["heads"],
         "Median over routing heads of induction_ratio_control: Δ_TR of the [BOS, r, r] probe over Δ_TR of "
         "the length-matched control [BOS, r, r′] (a fresh random r′: no repeat, no induction), with its 95% "
         "interval over bootstrap replicates that redraw the probe sequences (the same for every head) and "
         "the heads.",
         samples={"routing_heads": _role_heads("routing", "induction_ratio_control"), "probe_seqs": _probe_seqs})(
    _induction_ratio("induction_ratio_control", "delta_TR1_control"))


def _summary_value(key: str, what: str) -> Callable[[RunTables], float]:
    def stat(t: RunTables) -> float:
        summary = t.json("attention")
        if key not in summary:
            raise NotTested(f"attention.json lacks {key!r}", needs=rerun("attention.json"))
        value = summary[key]
        if value is None:
            raise TooLittleData(f"no {what}")
        return float(value)

    return stat


register("induction_excluded_control", ["attention.json"],
         "Routing heads left out of induction_ratio_control because their control excess Δ_TR is not above "
         "1e-8 nats (zero up to rounding) "
         "(attention.json: induction_excluded_control).")(_summary_value("induction_excluded_control", "count"))
register("induction_excluded_first", ["attention.json"],
         "Routing heads left out of induction_ratio because their first-copy excess Δ_TR is not above 1e-8 nats "
         "(attention.json: induction_excluded_first).")(_summary_value("induction_excluded_first", "count"))
register("routing_positive_significant_fraction", ["attention.json"],
         "Fraction of routing heads with Δ_TR > 0 and BH q ≤ q_level "
         "(attention.json: routing_positive_significant).",
         samples={"routing_heads": _role_heads("routing"), "null_chunks": _NULL_HEADS["routing"]})(
    _summary_value("routing_positive_significant", "routing heads"))
register("sink_negative_fraction", ["attention.json"],
         "Fraction of sink heads with Δ_TR < 0, sign alone (attention.json: sink_negative; descriptive).",
         samples={"sink_heads": _role_heads("sink"), "null_chunks": _NULL_HEADS["sink"]})(
    _summary_value("sink_negative", "sink heads"))
register("sink_negative_significant_fraction", ["attention.json"],
         "Fraction of sink heads with Δ_TR < 0 and BH q ≤ q_level (attention.json: sink_negative_significant).",
         samples={"sink_heads": _role_heads("sink"), "null_chunks": _NULL_HEADS["sink"]})(
    _summary_value("sink_negative_significant", "sink heads"))


def role_rank_tests(t: RunTables, role: str, rank: str = "null_rank_TR1", first_chunks: int | None = None
                    ) -> pd.DataFrame:
    """The pooled rank test of every ``role`` head against its matched nulls
    (:func:`~depthlens.stats.head_rank_tests` over the chunks with nulls, optionally the first
    ``first_chunks`` of them), with BH q-values within the role family (the heads the claim is
    about, so unrelated heads cannot move them): columns ``layer``, ``head``, ``median``
    (of ``delta_TR1``), ``n``, ``p``, ``q``, ``direction`` (+1 when TR1 ranks above its nulls on
    average, −1 below, 0 level)."""
    chunks, heads = t.trained("head_chunks"), t.trained("heads")
    samples = "null_n" if rank == "null_rank_TR1" else "null_n_half"
    require_columns(chunks, "head_chunks.parquet", "layer", "head", "chunk", "delta_TR1", rank, "null_n")
    require_columns(heads, "heads.parquet", "layer", "head", "role")
    keys = heads.loc[heads["role"] == role, ["layer", "head"]]
    if keys.empty:
        raise TooLittleData(f"no {role} heads")
    chunks = chunks.merge(keys, on=["layer", "head"])
    chunks = chunks[np.isfinite(numeric(chunks[rank]))]
    if first_chunks is not None:
        kept = np.sort(chunks["chunk"].unique())[:first_chunks]
        chunks = chunks[chunks["chunk"].isin(kept)]
    if chunks.empty:
        raise NotTested(f"head_chunks.parquet has no {rank} of {role} heads (--null-chunks 0?)",
                        needs="--null-chunks 1 or more")
    chunks = chunks.assign(null_n_half=np.ceil(numeric(chunks["null_n"]) / 2))
    tests = head_rank_tests(chunks, "delta_TR1", rank, samples)
    centre = chunks.assign(excess=numeric(chunks[rank]) - numeric(chunks[samples]) / 2).groupby(
        ["layer", "head"], sort=True)["excess"].sum()
    tests["direction"] = np.sign(centre.to_numpy())
    return tests  # head_rank_tests' q-values: BH over exactly these heads


def _signed_significant(role: str, sign: int, rank: str = "null_rank_TR1", halves: bool = False
                        ) -> Callable[[RunTables], Estimate]:
    """Fraction of ``role`` heads that rank on the side ``sign`` of their matched nulls with BH
    q ≤ q_level within the role (:func:`role_rank_tests`), with its Clopper–Pearson interval
    over heads; ``halves`` uses the first half of the chunks with nulls only."""
    def stat(t: RunTables) -> Estimate:
        first = None
        if halves:
            chunks = t.trained("head_chunks")
            require_columns(chunks, "head_chunks.parquet", "chunk", rank)
            first = int(chunks.loc[np.isfinite(numeric(chunks[rank])), "chunk"].nunique()) // 2
            if first < 1:
                raise TooLittleData("fewer than 2 chunks with nulls to halve")
        tests = role_rank_tests(t, role, rank, first)
        q_level = float((t.json("attention") or {}).get("q_level", 0.05))
        k, n = int(((tests["direction"] == sign) & (tests["q"] <= q_level)).sum()), len(tests)
        return Estimate(k / n, *proportion_interval(k, n))

    return stat


def _null_samples(t: RunTables) -> int | None:
    """Matched null samples per observed matrix (the least ``null_n`` of head_chunks, else the
    run's ``null_samples`` option)."""
    chunks = t.trained("head_chunks")
    if chunks is not None and "null_n" in chunks.columns:
        n = numeric(chunks["null_n"])
        n = n[np.isfinite(n)]
        if n.size:
            return int(n.min())
    return config_count(t, "null_samples")


for _role, _sign, _word, _name, _half_nulls, _half_chunks in (
        ("routing", 1, "above", "routing_positive_rank_fraction", "routing_positive_rank_fraction_half_nulls",
         "routing_positive_rank_fraction_half_chunks"),
        ("sink", -1, "below", "sink_negative_rank_fraction", "sink_negative_rank_fraction_half_nulls",
         "sink_negative_rank_fraction_half_chunks")):
    _units = {f"{_role}_heads": _role_heads(_role), "null_chunks": _NULL_HEADS[_role], "null_samples": _null_samples}
    register(_name, ["head_chunks", "heads"],
             f"Fraction of {_role} heads whose TR1 ranks {_word} its matched nulls, significant by the pooled rank "
             f"test over the chunks with nulls (sum of the per-chunk ranks against its exact null distribution) "
             f"with BH q ≤ q_level within the {_role} heads; Clopper–Pearson 95% interval over heads.",
             samples=_units)(_signed_significant(_role, _sign))
    register(_half_nulls, ["head_chunks", "heads"],
             f"As {_name} with each rank among the first "
             "⌈S/2⌉ null samples (null_rank_TR1_half).",
             samples=_units)(_signed_significant(_role, _sign, "null_rank_TR1_half"))
    register(_half_chunks, ["head_chunks", "heads"],
             f"As {_name} on the first half of the chunks "
             "with nulls.", samples=_units)(_signed_significant(_role, _sign, halves=True))


@register("routing_reserve_tracks_prev_token", ["heads"],
          "Spearman rank correlation between Δ_TR (delta_TR1) and prev_token_score over routing heads.",
          samples={"routing_heads": _role_heads("routing", "delta_TR1")})
def _tracks_prev(t: RunTables) -> Estimate:
    return spearman_estimate(*_routing_pairs(t), "routing heads with varying Δ_TR and previous-token scores")


@register("routing_reserve_tracks_prev_token_p", ["heads"],
          "Two-sided p-value of that Spearman correlation (descriptive).",
          samples={"routing_heads": _role_heads("routing", "delta_TR1")})
def _tracks_prev_p(t: RunTables) -> float:
    return finite_spearman(*_routing_pairs(t), "routing heads with varying Δ_TR and previous-token scores")[1]


def _routing_pairs(t: RunTables) -> tuple[np.ndarray, np.ndarray]:
    df = t.trained("heads")
    require_columns(df, "heads.parquet", "role", "delta_TR1", "prev_token_score")
    routing = df[df["role"] == "routing"]
    return numeric(routing["delta_TR1"]), numeric(routing["prev_token_score"])
