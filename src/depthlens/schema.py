"""The output schema: every table, summary and array file a run writes, in one place.

For each table :data:`SCHEMA` holds a :class:`Table`: the stage that writes it, its file
(``tables/NAME.parquet``), what one row is, its identity columns (:data:`IDENTITY`, the same in
every table), its key columns (with the identity, what a row is about) and every column's
:class:`Column` ``(definition, unit)``, where ``unit`` states the unit and how exact the number
is. :data:`SUMMARIES` and :data:`ARRAYS` declare the JSON summaries and the safetensors files.
Stages write their tables through :meth:`depthlens.stages.context.StageContext.write_table`, which
checks them against their declaration (:func:`check_table`); the report, the claims and the
tests' synthetic runs read the same declarations. Symbols follow docs/methods.md (``A`` a causal
attention matrix, ``P = 1e₁ᵀ`` its Perron projector, ``B = A − P``, ``J = I + U`` a mean
sub-layer Jacobian).

Regenerate the committed pages after changing anything here (:mod:`depthlens.report.docs`)::

    python -m depthlens.report.docs docs/

(``tests/test_schema.py`` fails while ``docs/`` differs from what this module generates, and
while a table of a real run differs from its declaration.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ARRAYS", "COLUMNS", "IDENTITY", "PRODUCERS", "SCHEMA", "SUMMARIES", "TABLES", "ArrayFile", "Column",
           "SchemaError", "Summary", "TRAINED", "Table", "check_table", "conform_table", "declare", "describe",
           "producer", "stage_of", "trained_rows"]


class Column(NamedTuple):
    """One column: its ``definition`` and its ``unit`` (unit and exactness)."""

    definition: str
    unit: str


#: What writes outputs (the stages, then census, sweep and train), in report order, each with
#: the sections of docs/methods.md its outputs implement (cited as §A3).
PRODUCERS: dict[str, str] = {
    "capture": "§A3 (pattern features) and §A7 (massive activations)",
    "attention": "§A2–§A6",
    "ablate": "§A7 (ablation criticality)",
    "clamp": "§A7 (massive activations and the clamp chain)",
    "contest": "§A7 (the feature-family contest)",
    "jacobian": "§B1–§B4",
    "topology": "§B5",
    "lens": "the Jacobian-lens transport matrices (the true end-to-end operator that §B3's funnel "
            "approximates; `depthlens lens`, not part of `depthlens run`)",
    "census": "the training-dynamics claims over a checkpoint series (`depthlens census`, or a run with "
              "`--revisions`)",
    "sweep": "the index of a sweep (`depthlens sweep SWEEP.toml`): one ordinary run per cell; its "
             "`tables/sweep.parquet`, not a run's",
    "train": "§B6 (the checkpoint series `depthlens train` writes; the `training` table is its "
             "`tables/training.parquet`, not a run's)",
}

# ----------------------------------------------------------------------------- shared columns
#: The identity columns every table starts with: which model, which weights, which text.
IDENTITY: dict[str, Column] = {
    "model": Column("Model specification as loaded (hub id, local path, `random:<family>` or the name of an "
                    "in-memory model).", "text"),
    "revision": Column("Hub revision of the weights the row was computed from; empty for the model as loaded "
                       "without `--revision` and for the step-0 null.", "text"),
    "text": Column("Text source of the run's chunks (`python-docs`, `wikitext-2` or a file path), or the prompts "
                   "file (`.jsonl`) whose prompts are the chunks.", "text"),
}
_ID = {
    "checkpoint": Column("Which weights: `trained` (the loaded model), `init` (the same architecture at "
                         "initialisation, seeded from the run seed; not in the attention stage's tables) or a hub "
                         "revision name of `--revisions`.", "text"),
    "layer": Column("Decoder layer, 0-based.", "integer"),
    "head": Column("Query head within the layer, 0-based (grouped-query attention: every query head has "
                   "its own matrix).", "integer"),
    "chunk": Column("Text chunk, 0-based, in the order of the run's token ids.", "integer"),
    "sublayer": Column("Sub-layer: `attn` (attention with its skip connection), `mlp` (MLP with its "
                       "skip connection) or, on Gemma 4, `ple` (the per-layer-input update with its skip "
                       "connection, times the layer's output scalar); in the jacobian stage's operators and "
                       "eigenvalues also `layer`, the full-layer operator: the product of the layer's mean "
                       "sub-layer operators, J̄_mlp · J̄_attn (Gemma 4: J̄_ple · J̄_mlp · J̄_attn; parallel-residual "
                       "models: J̄_attn + J̄_mlp − I, the layer's own Jacobian).", "text"),
    "jacobian_mode": Column("Jacobian mode of the operator (§B1): `isolated` (the paper's: the observed "
                            "pre-attention residual x through the whole block as a one-token sequence, the MLP at "
                            "the block-internal state x + Attn(x)), `isolated_observed` (each sub-layer one-token at "
                            "its own observed residual) or `in_context` (diagonal block with the rest of the chunk "
                            "fixed).", "text"),
}


def _keys(*names: str) -> dict[str, Column]:
    """The shared descriptions of key columns ``names``."""
    return {name: _ID[name] for name in names}


_FAILURE = Column("Empty (null) when the row was computed; otherwise the reason it could not be: no "
                  "LAPACK driver of the guarded decompositions converged (the row's quantities are then "
                  "missing, NaN).", "text or null")

_EPS = (1e-3, 1e-2, 1e-1)
_ALIGN_K = (1, 8, 64)

# ----------------------------------------------------------------------------- capture
_PATTERN = {
    "sink_mass": Column("Mean over rows i ≥ 2 of A[i, 1], the weight on the first token (§A3); of a "
                        "prompt (a prompts file), over its analysed rows.",
                        "fraction in [0, 1]; exact float64 reduction"),
    "prev_weight": Column("Mean over rows i ≥ 2 of A[i, i−1], the weight on the previous token.",
                          "fraction in [0, 1]; exact float64 reduction"),
    "row_entropy": Column("Mean over all n rows of the Shannon entropy of the row (0 log 0 = 0).",
                          "nats; exact float64 reduction"),
}

_CAPTURE = {
    "attention_patterns": {
        **_keys("layer", "head", "chunk"),
        **_PATTERN,
    },
    "attention_summary": {
        **_keys("layer", "head"),
        **{k: Column(f"Median over the head's chunks of `{k}` in attention_patterns: {c.definition}", c.unit)
           for k, c in _PATTERN.items()},
        "n_chunks": Column("Chunks the medians are taken over.", "count"),
    },
    "residual_summary": {
        **_keys("chunk"),
        "layer": Column("Layer of the boundary, 0-based; L (the number of layers) for `final`.", "integer"),
        "boundary": Column("Residual-stream boundary: `pre_attn` (input of layer l), `pre_mlp` (between its "
                           "attention and MLP), `pre_ple` (Gemma 4: between its MLP and its per-layer-input update) "
                           "or `final` (output of the last layer, before the final norm).", "text"),
        "rms": Column("Root mean square over every entry (all positions and dimensions) of the residual "
                      "states at this boundary of this chunk; of a prompt (a prompts file), over its analysed "
                      "positions, as are the other columns of the row.", "residual units; exact float64 reduction"),
        "median_abs": Column("Median of |h| over every entry at this boundary of this chunk.",
                             "residual units; exact"),
        "max_abs": Column("Largest |h| at this boundary of this chunk.", "residual units; exact"),
        "max_pos": Column("Token position (0-based) of `max_abs`.", "integer"),
        "max_dim": Column("Residual dimension (0-based) of `max_abs`.", "integer"),
        "n_massive": Column("Massive-activation entries (§A7): |h| ≥ 100 and ≥ 1000 × the median |h| "
                            "of the boundary.", "count; exact"),
    },
}

# ----------------------------------------------------------------------------- attention
_MATRIX = {
    "rho_B": Column("Spectral radius of B: max over i ≥ 2 of A[i, i] (the eigenvalues of B are 0 and the "
                    "self-attention weights).", "dimensionless in [0, 1]; exact (read off the diagonal)"),
    "norm_B": Column("Spectral norm ‖B‖₂ of the Perron deflation B = A − P.",
                     "dimensionless; dense SVD, exact to rounding"),
    "henrici_A": Column("Henrici departure from normality of A: √(‖A‖_F² − Σ|λ|²), for triangular A the "
                        "Frobenius norm of its strictly lower part.", "dimensionless; exact closed form"),
    "henrici_A_rel": Column("`henrici_A` / ‖A‖_F.", "fraction in [0, 1]; exact closed form"),
    "henrici_B": Column("Henrici departure from normality of B (as `henrici_A`, for B).",
                        "dimensionless; exact closed form"),
    "henrici_B_rel": Column("`henrici_B` / ‖B‖_F.", "fraction in [0, 1]; exact closed form"),
    "perron_simple": Column("1 when the Perron root 1 of A is simple (every A[i, i] < 1 for i ≥ 2), 0 when "
                            "some row i ≥ 2 attends only to itself (then K(A) can be below √n).", "0/1 flag"),
    "kreiss_A": Column("Check value of the Kreiss constant K(A): the largest δ / σ_min((1+δ)I − A) over "
                       "δ ∈ {1e-7, 1e-9, 1e-11}; K(A) = √n exactly when the Perron root is simple. NaN when "
                       "`perron_simple` is 0.", "dimensionless; lower bound on K(A), below √n by about δ(√n + ‖(I − B)⁻¹‖) for a simple Perron root"),
    "kreiss_A_ok": Column("1 when `kreiss_A` ≥ √n (1 − 1e-3) and the Perron root is simple (the mask-pinned "
                          "value K(A) = √n is confirmed), else 0.", "0/1 flag"),
    "kreiss_B": Column("Kreiss constant K(B) = sup_{|z|>1} (|z|−1) / σ_min(zI − B): the best point of a "
                       "search: on the positive real axis (a grid in log(r−1), then bounded Brent between the best "
                       "grid neighbours) where the axis reduction proves the supremum lies there, as it does for every "
                       "deflated causal stochastic matrix; otherwise a grid in (log(|z|−1), arg z), then L-BFGS-B.",
                       "dimensionless, ≥ 1; lower bound (a point actually evaluated), typically "
                       "exact to 1e-10 relative"),
    "kreiss_B_upper": Column("Rigorous upper bound on K(B) from the power norms ‖B^k‖ (Neumann series of the "
                             "resolvent with a geometric tail); +inf when the powers do not fall below 1 "
                             "within 20n + 100 steps. Computed on the first `extras_chunks` chunks only (on every "
                             "chunk with `certify` all; NaN elsewhere).",
                             "dimensionless; an upper bound with rounding allowances "
                             "from |B|^k (forward-error bound of the computed powers; see linalg.kreiss_bound)"),
    "TR1": Column("Transient reserve TR1 = log K(B) (natural log of `kreiss_B`), the default reserve.",
                  "nats; as `kreiss_B`"),
    "peak_B": Column("Transient peak G(B) = max_{k≥1} ‖B^k‖₂.",
                     "dimensionless; exact norms, the maximum over every k when `peak_certified` is 1"),
    "peak_k": Column("The power k at which `peak_B` is reached.", "integer power (stored as float)"),
    "peak_certified": Column("1 when `peak_B` is the supremum over every power (the scan ended with a zero "
                             "power, a geometric tail or a power of norm below 1); 0 when it is the maximum "
                             "over the 20n + 100 powers scanned.", "0/1 flag"),
    "TR2": Column("Variant reserve TR2 = log G(B) (natural log of `peak_B`; −inf when B = 0).",
                  "nats; as `peak_B`"),
    **{f"psr_B@{e:g}": Column(f"ε-pseudospectral radius ρ_ε(B) = max{{|z| : σ_min(zI − B) ≤ ε}} at ε = {e:g}. "
                              "Computed on the first `extras_chunks` chunks only (NaN elsewhere).",
                              "dimensionless; lower bound (a point on σ_min = ε found by ray marching and "
                              "Brent), at least ρ(B) + ε")
       for e in _EPS},
    **{f"TR4@{e:g}": Column(f"Variant reserve TR4 = (ρ_ε(B) − ρ(B)) / ε at ε = {e:g}: how far the "
                            "ε-pseudospectrum reaches beyond the spectrum, per unit ε (1 for a normal B). "
                            "First `extras_chunks` chunks only.", f"dimensionless; as `psr_B@{e:g}`")
       for e in _EPS},
    "num_abscissa_B": Column("Numerical abscissa λ_max(½(B + Bᵀ)). First `extras_chunks` chunks only.",
                             "dimensionless; symmetric eigensolve, exact to rounding"),
    "num_radius_B": Column("Numerical radius w(B) = max_θ λ_max(½(e^{iθ}B + e^{−iθ}Bᵀ)) = max_{‖x‖=1} |x*Bx|. "
                           "First `extras_chunks` chunks only.",
                           "dimensionless; maximised over θ (grid, then refinement to 1e-10): a lower bound "
                           "exact to about 1e-10"),
    "null_TR1_mean": Column("Mean of TR1 over the matched shuffle nulls of the matrix (§A4; `null_samples` "
                            "samples of the run's null mode, default `spec`). First `null_chunks` chunks only.",
                            "nats; Monte Carlo mean"),
    "null_TR1_sd": Column("Sample standard deviation (ddof = 1) of TR1 over the matched nulls.",
                          "nats; Monte Carlo"),
    "delta_TR1": Column("Excess reserve Δ_TR = TR1 − `null_TR1_mean`: positive when the head has more transient "
                        "reserve than row-weight-matched shuffles of itself.", "nats"),
    "z_TR1": Column("`delta_TR1` / `null_TR1_sd` (NaN when the spread is 0).", "standard deviations"),
    "delta_TR1_half": Column("Excess reserve against half the nulls: TR1 − the mean TR1 of the first ⌈S/2⌉ of the "
                             "same matched null samples (exactly the nulls a run with `null_samples` = ⌈S/2⌉ "
                             "draws), for the sensitivity of the Δ_TR verdict to S.", "nats"),
    "null_n": Column("Number S of matched null samples behind `null_TR1_mean` and `null_rank_TR1`.", "count"),
    "null_rank_TR1": Column("Rank of TR1 among its S matched null samples: how many lie below it, ties counting "
                            "one half; uniform on {0, …, S} when the head is exchangeable with its nulls (the "
                            "per-chunk input of the pooled rank test of claims A5/A6).", "rank in [0, S]; exact"),
    "null_rank_TR1_half": Column("Rank of TR1 among the first ⌈S/2⌉ of those samples (the S/2 variant of the "
                                 "pooled rank test).", "rank in [0, ⌈S/2⌉]; exact"),
}
_CERTIFIED = {
    "kreiss_B_lo": Column("Lower end of the bracket of K(B): the largest (|z|−1)/σ̄ over the points evaluated by "
                          "the search and the branch and bound over |z| > 1, with σ̄ = σ + residual + rounding "
                          "margin an upper bound on σ_min(zI − B) from an explicitly computed residual; at least 1 "
                          "(the limit at |z| → ∞).", "dimensionless; lower bound on K(B), rigorous up to the stated "
                          "floating-point margins (not interval-verified)"),
    "kreiss_B_hi": Column("Upper end of the bracket of K(B): the smaller of the branch-and-bound bound (second-order "
                          "bounds on σ_min per cell, Cholesky-certified gaps, numerical-range bounds) and "
                          "`kreiss_B_upper`.", "dimensionless; upper bound on K(B), rigorous up to the stated "
                          "floating-point margins (not interval-verified)"),
    "kreiss_B_certified": Column("1 when the bracket met the relative tolerance (hi/lo − 1 ≤ rtol, default "
                                 "1e-3); 0 when the branch and bound stopped at its evaluation budget "
                                 "(`certify_evals`) with a valid but wider bracket, or when the verdict K(B) = ∞ "
                                 "rests on a numerical rank decision (a defective unit-circle eigenvalue; bracket "
                                 "[1, ∞]).", "0/1 flag"),
}
_LOG_MEDIAN = {"norm_B", "kreiss_B", "kreiss_B_upper", "peak_B", "num_radius_B", "henrici_A", "henrici_B",
               *(f"psr_B@{e:g}" for e in _EPS)}
_MIN_FLAG = {"peak_certified"}


def _per_head(name: str, col: Column) -> Column:
    """The per-head aggregate of a per-chunk column (``aggregate_heads``)."""
    if name in _MIN_FLAG:
        how = "Minimum over the head's chunks (1 only if every chunk has it)"
    elif name in _LOG_MEDIAN:
        how = ("Median of logs over the head's chunks (exp of the median log; the plain median if a value is ≤ 0, "
               "then listed in `plain_median`)")
    else:
        how = "Median over the head's chunks"
    return Column(f"{how} of `{name}` in head_chunks: {col.definition}", col.unit)


_PROBE = {
    "prev_token_score": Column("Mean of A[p, p−1] over the second-copy query positions p of the repeated-random-"
                               "token probe [BOS, r, r] (§A5), averaged over probe sequences.",
                               "fraction in [0, 1]; exact mean"),
    "duplicate_score": Column("Mean of A[p, p−m] (the same token's first occurrence; m the block length) over "
                              "second-copy queries of the probe.", "fraction in [0, 1]; exact mean"),
    "induction_score": Column("Mean of A[p, p−m+1] (the token that followed the first occurrence) over "
                              "second-copy queries of the probe.", "fraction in [0, 1]; exact mean"),
}

_ATTENTION = {
    "heads": {
        **_keys("checkpoint", "layer", "head"),
        **{k: _per_head(k, c) for k, c in {**_PATTERN, **_MATRIX}.items()},
        "n_chunks": Column("Chunks the head's medians are taken over.", "count"),
        "plain_median": Column("The head's scale quantities (those aggregated by the median of logs) that fell back "
                               "to the plain median because some chunk's value is ≤ 0, comma-separated in column "
                               "order; empty when none did.", "text"),
        "n_extras_chunks": Column("Chunks with the ε-pseudospectral radii and numerical range (`extras`).",
                                  "count"),
        "kreiss_A_flagged": Column("Chunks whose K(A) = √n check failed (`kreiss_A_ok` = 0).", "count"),
        "n_failed_chunks": Column("Chunks whose row has a `failure` (no LAPACK driver converged).", "count"),
        "null_p": Column("Two-sided pooled rank test over the null chunks that TR1 is exchangeable with its "
                         "matched nulls: the sum over chunks of `null_rank_TR1` against the exact convolution of "
                         "uniform ranks (1 when no chunk has nulls).", "p-value; exact"),
        "n_null_chunks": Column("Chunks with a null comparison (finite `null_rank_TR1`).", "count"),
        "null_q": Column("Benjamini–Hochberg q-value of `null_p` over all heads of the checkpoint.", "q-value"),
        **_PROBE,
        "role": Column("Head role (§A5): `routing` if `prev_token_score` or `induction_score` ≥ the routing "
                       "threshold (default 0.3); else `sink` if `sink_mass` ≥ the sink threshold (default 0.5); "
                       "else `other`.", "text"),
        "excess_sign": Column("Sign of `delta_TR1`: `positive`, `negative` or `zero` (the data-driven split).",
                              "text"),
        "certified_chunk": Column("The chunk whose K(B) was certified: the head's lower-median chunk by TR1.",
                                  "integer"),
        **_CERTIFIED,
        "certify_failure": Column("Empty (null) when the certified bracket was computed; otherwise the reason it "
                                  "could not be: no LAPACK driver converged.", "text or null"),
        "kreiss_B_in_bracket": Column("Check of the search value against the bracket: 1 when `kreiss_B` of the "
                                      "certified chunk (its search value in head_chunks, the number the claims use) "
                                      "lies in [`kreiss_B_lo`·(1 − rtol), `kreiss_B_hi`·(1 + 1e-9)], 0 when not "
                                      "(counted in `attention.json` as `numerical_health.bracket_violations`), "
                                      "null without a bracket (`--certify none`, or a failed certification). Other "
                                      "chunks' search values have no bracket and are not checked.",
                                      "0/1 flag or null"),
        "delta_TR1_first_copy": Column("Routing heads only: median over probe sequences of the excess reserve of "
                                       "the leading [BOS, r] block (before induction can engage), each matrix "
                                       "against its own matched null.", "nats; null for other heads"),
        "delta_TR1_second_copy": Column("Routing heads only: median over probe sequences of the excess reserve of "
                                        "the whole [BOS, r, r] probe matrix (induction engaged).",
                                        "nats; null for other heads"),
        "induction_ratio": Column("`delta_TR1_second_copy` / `delta_TR1_first_copy` where the first-copy excess "
                                  "is positive, above 1e-8 nats (zero to the accuracy of the Kreiss search) "
                                  "(\"reserve doubles when induction engages\" predicts ≈ 2).",
                                  "ratio; null when undefined"),
        "delta_TR1_control": Column("Routing heads only: median over probe sequences of the excess reserve of the "
                                    "length-matched control [BOS, r, r′] (r the probe's block, r′ a fresh random "
                                    "block: the probe's length, no repeat, so induction cannot engage), each "
                                    "matrix against its own matched null.", "nats; null for other heads"),
        "induction_ratio_control": Column("`delta_TR1_second_copy` / `delta_TR1_control` where the control excess "
                                          "is positive (above 1e-8 nats): the induction ratio at matched length (K(B) grows with "
                                          "n, which confounds `induction_ratio`).", "ratio; null when undefined"),
    },
    "head_chunks": {
        **_keys("checkpoint", "layer", "head", "chunk"),
        "extras": Column("Whether this chunk got the costlier extras (`psr_B@ε`, `TR4@ε`, numerical range): the "
                         "first `extras_chunks` chunks.", "boolean"),
        **_PATTERN,
        **_MATRIX,
        **_CERTIFIED,
        "failure": _FAILURE,
    },
    "head_probe": {
        **_keys("checkpoint", "layer", "head"),
        **_PROBE,
    },
    "induction_seqs": {
        **_keys("checkpoint", "layer", "head"),
        "seq": Column("Probe sequence, 0-based: the first `ratio_seqs` sequences of the repeated-random-token "
                      "probe (§A5), and their length-matched controls.", "integer"),
        "delta_TR1_first_copy": Column("Excess reserve of the sequence's leading [BOS, r] block (before induction "
                                       "can engage) against its own matched null.", "nats"),
        "delta_TR1_second_copy": Column("Excess reserve of the whole [BOS, r, r] probe matrix (induction engaged) "
                                        "against its own matched null.", "nats"),
        "delta_TR1_control": Column("Excess reserve of the length-matched control [BOS, r, r′] (a fresh random "
                                    "r′, no repeat) against its own matched null.", "nats"),
        "failure": _FAILURE,
    },
    "depth": {
        **_keys("checkpoint", "chunk"),
        "operator": Column("Per-layer operator A_l of the product (§A6): `mean` (head mean), `rollout` "
                           "(½(Ā_l + I)), `chain_routing` (per layer the head with the largest previous-token or "
                           "induction score), `chain_sink` (per layer the head with the largest sink mass).",
                           "text"),
        "source": Column("`model` (the model's matrices) or `null` (every head of every layer shuffled "
                         "independently with the run's null mode).", "text"),
        "sample": Column("−1 for the model; the null sample index 0 … S−1 for nulls.", "integer"),
        "depth": Column("Number of layers b in the product D_{1→b} = B_b ⋯ B_1 (1 … L).", "integer"),
        "norm_D": Column("Surviving deviation ‖D_{1→b}‖₂ = ‖A_b ⋯ A_1 − P‖₂.",
                         "dimensionless; exact to float64 matmul rounding"),
        "e1": Column("Eigenvalue prediction E1 = ρ(D) = max_{i≥2} Π_l (A_l)[i, i] (the exact spectral radius "
                     "of the product, from the diagonals).", "dimensionless; exact"),
        "e2": Column("Eigenvalue prediction E2 = Π_l ρ(B_l).", "dimensionless; exact"),
        "gap_e1": Column("Eigenvalue-prediction error log10(‖D‖ / E1); +inf where E1 underflows to 0.",
                         "orders of magnitude (log10)"),
        "gap_e2": Column("Eigenvalue-prediction error log10(‖D‖ / E2); +inf where E2 underflows to 0.",
                         "orders of magnitude (log10)"),
    },
}

# ----------------------------------------------------------------------------- ablate, clamp, contest
_CI = "95% percentile bootstrap interval"
_ABLATE = {
    "ablation": {
        **_keys("layer", "head"),
        "method": Column("Ablation of the head's output before the output projection (§A7): `mean` (its mean "
                         "output vector over the tokens of the mean chunks), `zero`, or `resample` (its output on a mean "
                         "chunk, paired by index, in place of its output on the held-out chunk).", "text"),
        "criticality": Column("Ablation criticality ΔCE: next-token cross-entropy with the head ablated minus without, "
                              "averaged over every predicted token of the held-out chunks (the last `heldout_chunks` "
                              "of the run, disjoint from the mean chunks). Layers below the head's are not recomputed "
                              "(they are unchanged exactly).", "nats per token; float32 forward passes, float64 sums"),
        "criticality_lo": Column(f"Lower end of the {_CI} of `criticality` over held-out chunks (`ablation_boot` "
                                 "resamples of the chunks, each chunk's tokens kept together); NaN with one held-out chunk, "
                                 "whose resamples are all the same chunk.", "nats per token"),
        "criticality_hi": Column("Upper end of that interval.", "nats per token"),
        "ce_clean": Column("Cross-entropy of the unablated model on the same held-out tokens.",
                           "nats per token; float32 forward, float64 sum"),
        "n_chunks": Column("Held-out chunks.", "count"),
        "n_tokens": Column("Predicted tokens the cross-entropies average over (held-out chunks × (seq_len − 1); "
                           "with a prompts file, the held-out prompts' analysed positions that predict a token).",
                           "count"),
    },
}

_TARGET = Column("What is clamped: `massive` (the massive dimensions at the first token) or `control` (as many "
                 "random ordinary dimensions, never massive anywhere, seeded, at the same position and layers, the "
                 "i-th moved by exactly as much as the i-th massive dimension under the same arm, in a seeded random "
                 "direction ±: the control's change of the first token's residual has the massive clamp's Euclidean "
                 "norm at every layer and chunk; its α = 1 rows are the unclamped model's).", "text")
_SEED = Column("Seed index of the control's random dimensions, 0-based; −1 for the massive clamp.", "integer")
_ARM = Column("Clamp arm (§A7): `dose` (each clamped entry set to α × its clean value at that layer input in "
              "that chunk, so α = 0 is the zero arm and α = 1 the unclamped model; doses 0 and 1 always run) or "
              "`mean` (set to the dimension's mean over the ordinary positions 1 .. T−1 of the clamp chunks at that "
              "layer input).", "text")
_ALPHA = Column("Dose α of the `dose` arm; NaN for `mean`.", "fraction in [0, 1]")
_CLAMP_MEASURES = {
    "sink_mass": Column("Sink mass of the head (§A3) under the clamp: median over the clamp chunks.",
                        "fraction in [0, 1]; exact float64 reduction"),
    "TR1": Column("Transient reserve log K(B) of the head under the clamp: median over the clamp chunks; measured for "
                  "the arms α = 0, α = 1 and `mean` (NaN for the other doses).", "nats; Kreiss search (lower bound, "
                  "typically exact to 1e-10 relative)"),
    "delta_TR1": Column("Excess reserve Δ_TR = TR1 − mean TR1 of `clamp_null_samples` matched spec nulls (§A4), "
                        "median over the clamp chunks; for the arms with TR1.", "nats"),
}
_CLAMP = {
    "massive": {
        **_keys("chunk"),
        "layer": Column("Layer of the boundary, 0-based; L for `final`.", "integer"),
        "boundary": Column("Residual-stream boundary: `pre_attn`, `pre_mlp` or `final` (as in residual_summary).",
                           "text"),
        "position": Column("Token position, 0-based.", "integer"),
        "dim": Column("Residual dimension, 0-based.", "integer"),
        "value": Column("The massive entry h[position, dim] (signed): |value| ≥ 100 and ≥ 1000 × the median |h| of "
                        "the boundary in this chunk (§A7).", "residual units; float32 forward"),
        "median_abs": Column("Median of |h| over the boundary's entries in this chunk.", "residual units"),
        "ratio": Column("|value| / `median_abs`.", "dimensionless, ≥ 1000"),
    },
    "clamp": {
        "target": _TARGET,
        "seed": _SEED,
        "arm": _ARM,
        "alpha": _ALPHA,
        "dims": Column("The clamped residual dimensions, comma-separated.", "text"),
        "from_layer": Column("First clamped layer: the smallest emergence layer of the massive dimensions (a "
                             "dimension's emergence layer is the first layer whose input holds it massive at the "
                             "first token in at least half of the run's chunks; each dimension is clamped from its "
                             "own).", "integer"),
        "ce": Column("Next-token cross-entropy under the clamp over the clamp chunks.", "nats per token; float32 "
                     "forward, float64 sum"),
        "delta_ce": Column("`ce` minus the unclamped model's on the same tokens.", "nats per token"),
        "sink_mass": Column("Mean over the heads of layers ≥ `from_layer` of their `sink_mass` in clamp_heads.",
                            "fraction in [0, 1]"),
        "TR1": Column("Mean over those heads of their `TR1` (NaN for arms without it).", "nats"),
        "delta_TR1": Column("Mean over those heads of their `delta_TR1` (NaN for arms without it).", "nats"),
        "n_heads": Column("Heads averaged (every head of layers ≥ `from_layer`; those below are unchanged exactly).",
                          "count"),
        "n_chunks": Column("Clamp chunks.", "count"),
    },
    "clamp_heads": {
        **_keys("layer", "head"),
        "target": _TARGET,
        "seed": _SEED,
        "arm": _ARM,
        "alpha": _ALPHA,
        **_CLAMP_MEASURES,
        "failure": _FAILURE,
    },
    "clamp_dims": {
        **_keys("layer", "head"),
        "target": Column("Which massive dimensions the zero arm (α = 0) clamps: `alone` (only `dim`) or `left_out` "
                         "(every massive dimension but `dim`), each from its emergence layer. With a single massive "
                         "dimension these are exactly the massive zero arm and the unclamped model, copied from "
                         "clamp_heads rather than rerun.", "text"),
        "dim": Column("The massive dimension clamped alone or left out.", "integer"),
        **_CLAMP_MEASURES,
        "failure": _FAILURE,
    },
}

_FAMILY = Column("Feature set of the model: one family of four features (equal sizes, a fixed choice: see "
                 "`depthlens.contest.cv`), `P` (pattern: sink mass, previous-token weight, induction mass, row "
                 "entropy), `E` (eigenvalues: ρ_B and quantiles of the self-attention weights A[i, i]), `S` (norms "
                 "and singular values of B: ‖B‖₂, ‖B‖_F, σ₂, stable rank) or `R` (resolvent: TR1, TR2, k*, ρ_ε(B) at "
                 "ε = 1e-2); `all` (the four); or `all-X`, every family but X.", "text")
_CONTEST = {
    "contest_features": {
        **_keys("layer", "head"),
        "mean_distance": Column("Mean over rows i of Σ_j A[i, j]·(i − j), the mean attention distance; median over the "
                                "contest chunks.", "tokens; exact float64 reduction"),
        "max_weight": Column("Mean over rows i ≥ 2 of max_j A[i, j]; median over the contest chunks.",
                             "fraction in [0, 1]; exact"),
        **{f"diag_q{q}": Column(f"{q}th percentile of the self-attention weights A[i, i], i ≥ 2; median over the contest "
                                "chunks.", "fraction in [0, 1]; exact") for q in (25, 50, 75)},
        "fro_B": Column("Frobenius norm ‖B‖_F; median of logs over the contest chunks.", "dimensionless; exact"),
        "sigma2_B": Column("Second singular value of B; median of logs over the contest chunks (plain median when a "
                           "chunk's value is 0).",
                           "dimensionless; dense SVD, exact to rounding"),
        "stable_rank_B": Column("Stable rank ‖B‖_F² / ‖B‖₂²; median over the contest chunks.",
                                "dimensionless; dense SVD"),
        "induction_mass": Column("Mean, over the queries i with an earlier occurrence of their token at j ≤ i − 3, of "
                                 "Σ A[i, j + 1] over those occurrences: the weight on the token after an earlier "
                                 "occurrence (the natural-text analogue of the probe's induction score; the query "
                                 "itself and its previous token excluded); median over the contest chunks, NaN for "
                                 "a chunk without such a query.", "fraction in [0, 1]; exact"),
        "persistence": Column("Depth persistence of the head's deviation: log ‖B̄_{L−1} ⋯ B̄_{l+1} B_{l,h}‖₂ − "
                              "log ‖B̄_{L−1} ⋯ B̄_{l+1} B̄_l‖₂, with B̄_k the deflated head mean of layer k (how much "
                              "more of this head's deviation than of its layer's survives the layers above); −inf when "
                              "nothing of the head survives, NaN when nothing of its layer does; median over the "
                              "contest chunks.", "nats; dense SVD, exact to rounding"),
    },
    "contest": {
        "target": Column("What is predicted per head: `persistence` (contest_features), `routing` (role `routing` in "
                         "heads, from the probe) or `criticality` (mean-ablation ΔCE in ablation).", "text"),
        "features": _FAMILY,
        "metric": Column("Out-of-fold score: `auroc` for `routing`, `spearman` for the others; the model is a ridge "
                         "regression (median imputation, standardisation, α = 1) for every target, for `routing` a "
                         "linear probability model (so every permutation is one multi-output fit).", "text"),
        "score": Column("The metric over the out-of-fold predictions of a grouped K-fold by layer (a layer is never "
                        "split; scaling fitted inside the folds).", "AUROC in [0, 1] or Spearman ρ in [−1, 1]"),
        "score_lo": Column(f"Lower end of the {_CI} of `score` over layers (layer-cluster bootstrap; every "
                           "resample re-runs the grouped cross-validation, a layer drawn twice entering as two "
                           "copies kept in one fold).", "as `score`"),
        "score_hi": Column("Upper end of that interval.", "as `score`"),
        "r2": Column("Out-of-fold R² = 1 − Σ(y − ŷ)² / Σ(y − ȳ)² (NaN for `routing`).", "dimensionless, ≤ 1"),
        "p": Column("Permutation p-value, the whole cross-validation refitted each time: for a family and `all` "
                    "of `score`, labels permuted within layers (the set predicts nothing); for `all-X` of `delta`, "
                    "conditional: X's columns permuted among the heads of each layer, labels and the other families "
                    "kept (X adds nothing given the others; NaN for an empty X); (1 + #{perm ≥ obs}) / (1 + n_perm).",
                    "p-value; Monte Carlo, never 0"),
        "q": Column("Benjamini–Hochberg q-value of `p` over every row of the table.", "q-value"),
        "delta": Column("For `all-X`: score of `all` minus score without X (positive: X adds to the others); NaN "
                        "otherwise.", "as `score`"),
        "delta_lo": Column(f"Lower end of the {_CI} of `delta` (the refitting layer-cluster bootstrap of `score_lo`, "
                           "the same resamples for both models).", "as `score`"),
        "delta_hi": Column("Upper end of that interval.", "as `score`"),
        "required": Column("For `all-X`: True when `delta_lo` > 0 and `q` ≤ 0.05 (dropping X lowers the score, with "
                           "the interval excluding 0 and the drop significant after BH); False otherwise.", "boolean"),
        "n_heads": Column("Heads with the target (missing feature values are imputed by the training folds' median).",
                          "count"),
        "n_folds": Column("Folds of the grouped K-fold (at most the number of layers).", "count"),
    },
}

# ----------------------------------------------------------------------------- jacobian
_OPERATOR = {
    "cond": Column("Condition number σ_max / σ_min of J (+inf for a singular J).",
                   "dimensionless; SVD, backward stable"),
    "henrici_rel": Column("Relative Henrici departure of J: ‖N‖_F / ‖J‖_F, N the strictly upper part of the "
                          "complex Schur factor (√(‖J‖_F² − Σ|λ|²) without cancellation).",
                          "fraction in [0, 1]; accurate to about n ε ‖U‖"),
    "henrici_update_rel": Column("Relative Henrici departure of the update U = J − I: ‖N‖_F / ‖U‖_F (the same "
                                 "N as J; 0 for U = 0).", "fraction in [0, 1]; accurate to about n ε"),
    "symmetry": Column("Symmetric share of J: ‖(J + Jᵀ)/2‖_F² / ‖J‖_F².", "fraction in [0, 1]; exact closed form"),
    "symmetry_update": Column("Symmetric share of U: ‖(U + Uᵀ)/2‖_F² / ‖U‖_F².",
                              "fraction in [0, 1]; exact closed form"),
    "complex_frac": Column("Fraction of eigenvalues λ of J with |Im λ| > 1e-8 · max|λ| (rotation).",
                           "fraction in [0, 1]; Schur eigenvalues"),
    "complex_frac_nontrivial": Column("complex_frac among the eigenvalues λ of J that are not structurally 1: "
                                      "those with |λ − 1| > tol, tol = 1e-8 · max(1, max|λ|) (|λ − 1| = |μ| from "
                                      "the Schur form of U); complex when |Im λ| > 1e-8 · max|λ| over those. "
                                      "NaN when there are none.",
                                      "fraction in [0, 1]; Schur eigenvalues (trivial ones sit at |μ| ≈ n ε ‖U‖)"),
    "rot_angle_mean": Column("Mean rotation angle: mean |arg μ| over the eigenvalues μ of U with |μ| > tol, "
                             "tol = 1e-8 · max(1, max|λ|) (the complex_frac_nontrivial rule); the others are "
                             "structurally 0, with rounding-level moduli and random phases, and are left out. "
                             "NaN when none is left.",
                             "radians in [0, π]"),
    "expand_eig": Column("Fraction of eigenvalues of J with |λ| > 1 + 1e-3.", "fraction in [0, 1]"),
    "expand_sv": Column("Fraction of singular values of J with σ > 1 + 1e-3.", "fraction in [0, 1]"),
    "spectral_radius": Column("Spectral radius max|λ| of J.", "dimensionless; Schur eigenvalues"),
    **{f"self_align_{k}": Column(f"Subspace overlap ‖U_kᵀ V_k‖_F² / k of the top-{k} left and right singular "
                                 f"vectors of J (k capped at d).", "fraction in [0, 1]; SVD")
       for k in _ALIGN_K},
    "erank": Column("Effective rank exp(H(p)) with p_i = σ_i² / Σσ² (the default).", "in [1, d]; SVD"),
    "erank_sigma": Column("Effective rank variant exp(H(p)) with p_i = σ_i / Σσ.", "in [1, d]; SVD"),
    "participation_ratio": Column("Participation ratio (Σσ²)² / Σσ⁴.", "in [1, d]; SVD"),
    "stable_rank": Column("Stable rank ‖J‖_F² / ‖J‖₂² = Σσ² / σ_max².", "in [1, d]; SVD"),
}

_JACOBIAN = {
    "operators": {
        **_keys("checkpoint", "jacobian_mode", "layer", "sublayer"),
        **{k: Column(f"Of the mean sub-layer Jacobian J̄ = I + U, or of the layer operator (sublayer `layer`) "
                     f"(§B2): {c.definition}"
                     + (" NaN unless --operator-metrics every (--preset paper): nothing the claims, figures or "
                        "report read needs the singular vectors." if k.startswith("self_align_") else ""), c.unit)
           for k, c in _OPERATOR.items()},
        "failure": _FAILURE,
    },
    "eigenvalues": {
        **_keys("checkpoint", "jacobian_mode", "layer", "sublayer"),
        "re": Column("Real part of one eigenvalue λ = 1 + μ of the mean Jacobian J̄ or layer operator (μ from the "
                     "Schur form of U); "
                     "one row per eigenvalue.", "dimensionless; backward stable"),
        "im": Column("Imaginary part of that eigenvalue (conjugate pairs give two rows).",
                     "dimensionless; backward stable"),
    },
    "cumulative": {
        **_keys("checkpoint"),
        "jacobian_mode": Column("Jacobian mode of the operators in the products (`isolated` when it was computed).",
                                "text"),
        "schur_order": Column("Eigenvalue order of the Schur forms of the split (§B4): `lapack` (LAPACK's "
                              "own, as scipy.linalg.schur(J, output=\"complex\") returns it; the claims' "
                              "protocol), `canonical` (descending modulus, then imaginary, then real part), "
                              "`outside_first` (|λ| > 1 first) or `inside_first` (|λ| ≤ 1 first), the last two "
                              "keeping LAPACK's order within each group. The first of --schur-orders has every α; "
                              "the others α = 0 only (with --funnel-curves read, the default: on the trained "
                              "model's backward curve at the last truncation alone, where B4 reads them; the "
                              "step-0 null and --revisions have α = 1 alone); α = 1 does not depend on the order "
                              "(J(1) = J) and is computed once, labelled with the first.", "text"),
        "schur_alpha": Column("Schur-split scale α of the non-normal part: every operator replaced by "
                        "J(α) = Q(Λ + αN)Q* (§B4); α = 1 the real operators, α = 0 their normal parts.",
                        "in [0, 1]"),
        "direction": Column("`forward`: C_b = J_b ⋯ J_0 (from the input side); `backward`: "
                            "C_b = J_{last} ⋯ J_b (from the output side).", "text"),
        "truncation": Column("Rank cap of the running product: min(r, d) for the truncated curve, d for the "
                             "exact one (§B3).", "integer rank"),
        "exact": Column("Whether the curve is the exact product (truncation d). Models wider than "
                        "--funnel-exact-width (2048) have rank-truncated curves only.", "bool"),
        "depth": Column("Sub-layer index b of the product (0-based; attention then MLP of each layer).", "integer"),
        "steps": Column("Number of sub-layer factors in C_b.", "integer"),
        "erank": Column("Effective rank exp(H(p)), p_i = σ_i² / Σσ², of the cumulative product C_b.",
                        "in [1, d]; backward stable per step (singular values below ε σ_max are noise)"),
        "erank_sigma": Column("Effective rank variant with p_i = σ_i / Σσ, of C_b.", "in [1, d]"),
        "participation_ratio": Column("Participation ratio (Σσ²)² / Σσ⁴ of C_b.", "in [1, d]"),
        "log_norm": Column("ln ‖C_b‖₂ (the running product is renormalised each step; its scale is kept here).",
                           "nats (natural log); exact to rounding"),
        "failure": _FAILURE,
    },
    "funnel_boot": {
        **_keys("checkpoint"),
        "jacobian_mode": Column("Jacobian mode of the resampled operators: the funnel's (`isolated` when it was "
                                "computed).", "text"),
        "init_seed": Column("On `init` rows: the run seed whose step-0 initialisation the weights are: `--seed` for "
                            "the run's own null (the `init` checkpoint of the other tables), `--seed` + k for the "
                            "extra nulls of `--init-seeds` (k = 1, 2, …); NaN on other checkpoints.",
                            "integer-valued"),
        "truncation": Column("Rank cap of the bootstrapped products: `--funnel-rank` capped at d, d for exact products "
                             "(the claims read the replicates of the `cumulative` curve with the same truncation).",
                             "integer rank"),
        "replicate": Column("Bootstrap replicate over chunks: 0 takes every chunk once (the point estimate: the "
                            "ends of the `cumulative` curve, to rounding); k ≥ 1 draws the run's C chunks again with "
                            "replacement (seeded from the run seed, so replicate k resamples the same chunks on every "
                            "checkpoint and ratios between checkpoints are paired).", "integer"),
        "erank_one_step": Column("Effective rank exp(H(p)), p_i = σ_i² / Σσ², of the replicate's cumulative product "
                                 "after one step under the claims' protocol (backward from the last sub-layer, "
                                 "truncated to rank `truncation`, α = 1), every factor the replicate's mean operator "
                                 "Σ_c w_c S_c / Σ_c w_c n_c (w_c: draws of chunk c; S_c: the sum of its n_c "
                                 "operators).", "in [1, d]; backward stable"),
        "erank_full_depth": Column("The same replicate's effective rank at full depth (every sub-layer).",
                                   "in [1, d]; backward stable per step"),
        "failure": _FAILURE,
    },
}

# ----------------------------------------------------------------------------- topology
_BOUNDARY = Column("Operator-input boundary b of the residual stream, S a layer (2; 3 on Gemma 4): S·layer for "
                   "the input of the attention sub-layer, S·layer + 1 for the input of the MLP sub-layer, "
                   "S·layer + 2 for the input of the per-layer-input update (Gemma 4).", "integer")
_GAMMA = Column("CPM resolution γ of the positive-edge layer, chosen once per checkpoint as the centre of the "
                "widest plateau of the resolution profile (topology_profile) and used at every boundary.",
                "dimensionless")

_TOPOLOGY = {
    "communities": {
        **_keys("checkpoint"),
        "boundary_index": _BOUNDARY,
        "gamma": _GAMMA,
        "n_communities": Column("Communities of the signed Leiden CPM partition of the correlation graph.",
                                "count; heuristic optimum"),
        "sizes": Column("Community sizes, largest first, as a JSON list.", "JSON list of counts"),
        "quality": Column("Signed CPM quality Q(γ) = (signed edge weight inside communities) − γ Σ_c n_c(n_c − 1)/2.",
                          "correlation units; exact for the partition found"),
        "seed": Column("Seed of leidenalg's random number generator.", "integer"),
        "iterations": Column("Leiden iterations run (until an iteration no longer improved the quality).", "count"),
        "n_nodes": Column("Residual coordinates kept as nodes (d, minus massive-activation dimensions when they "
                          "are excluded).", "count"),
        "n_edges": Column("Undirected signed edges: the top-k |r| Pearson correlations per node (default k = 20), "
                          "symmetrised by union.", "count"),
    },
    "nodes": {
        **_keys("checkpoint"),
        "boundary_index": _BOUNDARY,
        "dim": Column("Residual dimension of the node, 0-based (as in massive).", "integer"),
        "community": Column("Community label of the node, 0 … C−1 by decreasing community size.", "integer"),
        "participation_coefficient": Column("Participation coefficient over positive edges, 1 − Σ_c (k_ic / k_i)²; "
                                            "0 for a node without positive edges.", "in [0, 1 − 1/C]; exact"),
        "is_boundary_node": Column("Boundary node of the graph: participation coefficient in the top quartile (≥ the "
                                   "⌈n/4⌉-th largest, ties included) and > 0.", "boolean"),
        "amplification": Column("Jacobian amplification of the node: the column norm ‖J̄ e_i‖₂ of the mean "
                                "Jacobian of the sub-layer this boundary feeds (variants: row norm, |J̄_ii|).",
                                "dimensionless; exact to rounding"),
    },
    "topology_profile": {
        **_keys("checkpoint"),
        "gamma": Column("Evaluated resolution γ of the profile (linear bisection), on the reference boundary.",
                        "dimensionless"),
        "n_communities": Column("Communities of the partition kept at this γ.", "count"),
        "quality": Column("Q(γ) of the partition kept at this γ.", "correlation units"),
        "found_at": Column("The γ whose Leiden run produced the partition kept at this row (a better partition "
                           "found at a neighbouring γ replaces a worse one).", "dimensionless"),
        "iterations": Column("Leiden iterations of that run.", "count"),
        "reference_boundary_index": Column("Boundary whose correlation graph the profile was computed on (the middle "
                                     "one, b = L).", "integer"),
        "chosen": Column("True for the row whose γ was chosen (centre of the widest plateau).", "boolean"),
    },
    "coupling": {
        **_keys("checkpoint"),
        "boundary_index": _BOUNDARY,
        "layer": Column("Layer of the boundary: boundary_index // S (S boundaries a layer).", "integer"),
        "sublayer": Column("Sub-layer the boundary feeds: `attn`, `mlp` or (Gemma 4) `ple`.", "text"),
        "effect": Column("Rank-biserial effect 2·AUC − 1 of boundary-node versus interior-node amplification "
                         "(positive: boundary nodes amplify more).", "in [−1, 1]; exact (mid-ranks)"),
        "p": Column("Two-sided label-permutation p-value of `effect`, (1 + #{|r_perm| ≥ |r_obs|}) / (1 + n_perm).",
                    "p-value; exact Monte Carlo test, never 0"),
        "q": Column("Benjamini–Hochberg q-value of `p` over the boundaries of this checkpoint.", "q-value"),
        "sign": Column("Sign of `effect`: −1, 0 or +1.", "integer"),
        "n_boundary_nodes": Column("Boundary nodes of the graph at this boundary.", "count"),
        "n_interior_nodes": Column("Interior (non-boundary) nodes of the graph at this boundary.", "count"),
        "henrici_update_rel": Column("`henrici_update_rel` of the same sub-layer's mean Jacobian (operators table, "
                                     "same checkpoint and mode).", "fraction in [0, 1]"),
        "symmetry": Column("`symmetry` of the same sub-layer's mean Jacobian (operators table).", "fraction in [0, 1]"),
        "symmetry_update": Column("`symmetry_update` of the same sub-layer's mean Jacobian: the symmetric share of its "
                                  "update U = J − I (operators table; the operator type of claim B5b).",
                                  "fraction in [0, 1]"),
        "significant": Column("`q` ≤ the FDR level (default 0.05).", "boolean"),
    },
}

class Table(NamedTuple):
    """One table of a run: ``tables/NAME.parquet``."""

    name: str
    stage: str
    row: str
    keys: tuple[str, ...]
    columns: dict[str, Column]
    optional: dict[str, str]

    @property
    def file(self) -> str:
        """Its path inside a run directory."""
        return f"tables/{self.name}.parquet"

    @property
    def identity(self) -> tuple[str, ...]:
        """The identity columns (:data:`IDENTITY`), first in every table."""
        return tuple(IDENTITY)


class Summary(NamedTuple):
    """One JSON summary of a run: ``NAME.json``."""

    name: str
    stage: str
    description: str

    @property
    def file(self) -> str:
        """Its path inside a run directory."""
        return f"{self.name}.json"


class ArrayFile(NamedTuple):
    """One kind of array file of a run: ``arrays/PATTERN.SUFFIX`` (safetensors, unless a
    format of another tool is the point: the lens's ``.pt``)."""

    pattern: str
    stage: str
    description: str
    suffix: str = "safetensors"

    @property
    def file(self) -> str:
        """Its path pattern inside a run directory."""
        return f"arrays/{self.pattern}.{self.suffix}"


def _table(name: str, stage: str, row: str, keys: tuple[str, ...], columns: dict[str, Column]) -> Table:
    return Table(name, stage, row, keys, {**IDENTITY, **columns}, _OPTIONAL.get(name, {}))


_WITH_CERTIFY = "with `--certify median` or `all` (the default: median)"
#: Columns a table has only under some options: table → column → when it is present.
_OPTIONAL: dict[str, dict[str, str]] = {
    "heads": {c: _WITH_CERTIFY for c in ("certified_chunk", *_CERTIFIED, "certify_failure")},
    "head_chunks": {c: "with `--certify all`" for c in _CERTIFIED},
}


_SERIES = {
    "series": Column("The checkpoint series (`--model` of the census, or one of `--replicates` or `--compare`; a "
                     "run's own model for a run with `--revisions`).", "text"),
    "replicate": Column("0 for `--model` (a run's own model), k for the k-th series of `--replicates` (the same "
                        "configuration, another seed: the census claims pool it with `--model`), -1 for a "
                        "`--compare` series.", "integer"),
    "checkpoint": Column("The checkpoint: its revision or `step-N` folder name (in a run with `--revisions`: "
                         "`init`, a revision, or `trained`).", "text"),
    "step": Column("Training step the checkpoint's name carries (`step-N`, `stepN`, `stage1-stepN-…`); NaN when it "
                   "carries none.", "integer-valued"),
    "order": Column("Index of the checkpoint in training order within its series, 0-based.", "integer"),
}
_CENSUS = {
    "census_heads": {
        **_SERIES,
        **{c: _ID[c] for c in ("layer", "head")},
        **{c: _ATTENTION["heads"][c] for c in ("role", "prev_token_score", "induction_score", "sink_mass", "TR1",
                                               "delta_TR1", "null_q")},
        "significant": Column("`null_q` ≤ 0.05: the head's excess reserve is significant at this checkpoint.",
                              "boolean"),
    },
    "census": {
        **_SERIES,
        "status": Column("`done`; `incomplete` (some of its stages failed: what finished is used); `failed` (it "
                         "could not be loaded or analysed: skipped, see `error`).", "text"),
        "error": Column("One line saying what failed; empty when done.", "text"),
        "family": Column("Architecture family of the checkpoint (empty when it failed to load).", "text"),
        "norm": Column("Normalisation of its layers: `RMSNorm` or `LayerNorm` (from its modules).", "text"),
        "loss": Column("Mean next-token cross-entropy on the census's chunks (every position but the last of each "
                       "chunk), from the model's logits with log-softmax in float64; NaN in a run with "
                       "`--revisions`.", "nats per token; exact to rounding"),
        "erank_one_step": Column("Effective rank of the cumulative Jacobian after one step under the claims' "
                                 "protocol (backward, rank-truncated, α = 1, the funnel's Jacobian mode).",
                                 "dimensionless"),
        "erank_full_depth": Column("Its effective rank at full depth (same protocol).", "dimensionless"),
        "funnel_ratio": Column("`erank_full_depth` / `erank_one_step` (B2 on this checkpoint).", "dimensionless"),
        "funnel_operators": Column("Sub-layer operators the funnel multiplies (its steps at full depth).", "count"),
        "width": Column("The residual width d of the checkpoint's operators.", "count"),
        "funnel_step0_over": Column("B3 on this checkpoint: the full-depth erank of the series' step-0 checkpoint "
                                    "(else the first checkpoint's step-0 null) over this checkpoint's.",
                                    "dimensionless"),
        "funnel_step0_over_lo": Column("Lower end of the 95% percentile interval of `funnel_step0_over` over the "
                                       "bootstrap replicates (`funnel_boot`): every pair of a replicate of the reference "
                                       "(of each step-0 null of `--init-seeds` when the reference is a null) with this "
                                       "checkpoint's replicate of the same resampled chunks; 1 at the reference itself, −inf "
                                       "without 40 pairs.",
                                       "dimensionless"),
        "funnel_step0_over_hi": Column("Upper end of that interval (1 at the reference, +inf without 40 pairs).",
                                       "dimensionless"),
        "coupling_significant": Column("FDR-significant coupling boundaries of this checkpoint (topology stage).",
                                       "count"),
        "coupling_tested": Column("Boundaries tested for coupling.", "count"),
        "n_routing": Column("Heads with role `routing`.", "count"),
        "n_sink": Column("Heads with role `sink`.", "count"),
        "max_prev_token_score": Column("Largest previous-token score over heads.", "fraction in [0, 1]"),
        "max_induction_score": Column("Largest induction score over heads.", "fraction in [0, 1]"),
        "max_sink_mass": Column("Largest sink mass over heads.", "fraction in [0, 1]"),
        "n_significant_reserve": Column("Heads with `null_q` ≤ 0.05 (either sign).", "count"),
    },
}


_TRAIN = {
    "training": {
        "step": Column("Optimiser step s: the row's loss is that of the batch of step s before the update, its "
                       "held-out loss that of the weights after it; 0 for the initial weights (no loss, no learning "
                       "rate).", "integer"),
        "tokens": Column("Tokens trained on through step s: s × batch size × sequence length (start tokens "
                         "included).", "count"),
        "loss": Column("Mean next-token cross-entropy of the step's batch (every position but the last of each "
                       "sequence), repeated-block sequences included; NaN at step 0.",
                       "nats per token; float32"),
        "lr": Column("Learning rate of the step (linear warm-up, then cosine decay to a tenth); NaN at step 0.",
                     "dimensionless"),
        "heldout_loss": Column("Mean next-token cross-entropy of the held-out sequences (the end of the token "
                               "stream, never trained on) under the weights after the step; NaN except at the "
                               "checkpoint steps.", "nats per token; float32 per batch, float64 sum"),
        "elapsed": Column("Wall seconds of training up to the step, summed over the sessions that made the series "
                          "(a killed session's steps after its last checkpoint not counted).", "seconds"),
    },
}
_SWEEP = {
    "sweep": {
        "cell": Column("The cell's label, `MODEL[@REVISION]__TEXT__seedN`: its run directory is `cells/LABEL`.",
                       "text"),
        "seed": Column("The cell's run seed (`--seed`).", "integer"),
        "run_dir": Column("The cell's run directory, relative to the sweep directory.", "path"),
        "status": Column("`done`; `incomplete` (some of its units or stages failed: what finished is in its run "
                         "directory and the comparison); `failed` (it could not be loaded or analysed: see `error`).",
                         "text"),
        "error": Column("One line saying what failed; empty when done.", "text"),
    },
}
# ----------------------------------------------------------------------------- lens
_LENS = {
    "transport": {
        "layer": Column("Source layer ℓ (0 .. L−2): the transport J_ℓ = (1/|V|) Σ_{t∈V} Σ_{t′∈V, t′≥t} "
                        "∂h_final,t′/∂h_ℓ,t runs from the output of block ℓ to the last block's output before the "
                        "final norm, averaged over the chunks (prompts) and over the source positions; sources and "
                        "targets range over the valid positions V (all but the first --lens-skip-first and the last "
                        "--lens-skip-last of each).", "integer, 0-based"),
        "n_prompts": Column("Chunks (prompts) the transport is averaged over.", "count"),
        **{k: Column(f"Of the transport J_ℓ (its update U = J_ℓ − I where named; float64 fit, not the exported "
                     f"artifact's rounding): {c.definition}", c.unit)
           for k, c in _OPERATOR.items()},
        "failure": _FAILURE,
    },
    "readout": {
        "prompt": Column("The prompt read (`depthlens lens --readout`), as given.", "text"),
        "layer": Column("Layer ℓ whose block output h_ℓ is read; the last layer's reading is the model's output.",
                        "integer, 0-based"),
        "position": Column("Token position in the prompt (0 is BOS where the tokenizer has one).", "integer, 0-based"),
        "input_token": Column("The prompt's token at that position, decoded.", "text"),
        "lens": Column("`jacobian`: the final norm and unembedding of J_ℓ h_ℓ (the lens); `logit`: of h_ℓ itself "
                       "(the logit lens).", "text"),
        "rank": Column("Rank of the prediction at that layer, position and lens, 0 the most likely.", "integer"),
        "token_id": Column("Predicted next token's id.", "integer"),
        "prediction": Column("Predicted next token, decoded.", "text"),
        "logit": Column("Its logit, in the model's dtype.", "logit units"),
        "prob": Column("Its softmax probability over the vocabulary (float64 from the logits).",
                       "fraction in [0, 1]"),
    },
}
_STAGE_TABLES = {"capture": _CAPTURE, "attention": _ATTENTION, "ablate": _ABLATE, "clamp": _CLAMP, "contest": _CONTEST,
                 "jacobian": _JACOBIAN, "topology": _TOPOLOGY, "lens": _LENS, "census": _CENSUS, "sweep": _SWEEP,
                 "train": _TRAIN}
_ROWS: dict[str, tuple[tuple[str, ...], str]] = {
    "attention_patterns": (("layer", "head", "chunk"),
                           "One row per (layer, head, chunk): the pattern features of one attention matrix."),
    "attention_summary": (("layer", "head"), "One row per (layer, head): pattern features, median over chunks."),
    "residual_summary": (("chunk", "layer", "boundary"),
                         "One row per (chunk, boundary): magnitude summary of the residual stream."),
    "heads": (("checkpoint", "layer", "head"),
              "One row per (checkpoint, layer, head): per-chunk quantities aggregated over chunks, null statistics, "
              "probe scores, role, the certified Kreiss bracket and the induction-engagement ratio."),
    "head_chunks": (("checkpoint", "layer", "head", "chunk"),
                    "One row per (checkpoint, layer, head, chunk): every §A3 quantity of one attention matrix "
                    "A and its Perron deflation B = A − P."),
    "head_probe": (("checkpoint", "layer", "head"),
                   "One row per (checkpoint, layer, head): repeated-random-token probe scores."),
    "induction_seqs": (("checkpoint", "layer", "head", "seq"),
                       "One row per (checkpoint, routing head, probe sequence): the excess reserves whose medians "
                       "over sequences are the heads table's induction columns (what A4's interval resamples)."),
    "depth": (("checkpoint", "chunk", "operator", "source", "sample", "depth"),
              "One row per (checkpoint, operator, chunk, source, sample, depth): the surviving deviation of a depth "
              "product against its eigenvalue predictions."),
    "ablation": (("layer", "head", "method"),
                 "One row per (layer, head, ablation method): the head's ablation criticality on the held-out chunks."),
    "massive": (("chunk", "layer", "boundary", "position", "dim"),
                "One row per massive-activation entry (chunk, boundary, position, dimension) of the run's chunks."),
    "clamp": (("target", "seed", "arm", "alpha"),
              "One row per clamp (target, control seed, arm, dose): cross-entropy and head averages under it. "
              "Control seeds after the first have the zero arm and α = 1 alone unless --control-curves every."),
    "clamp_heads": (("layer", "head", "target", "seed", "arm", "alpha"),
                    "One row per (head, clamp): sink mass and reserve of a head of a clamped layer under one clamp."),
    "clamp_dims": (("layer", "head", "target", "dim"),
                   "One row per (head, massive dimension, `alone` or `left_out`): sink mass and reserve of a head of "
                   "a clamped layer under the zero arm of one massive dimension alone or of all the others (its "
                   "α = 1 reference is the massive α = 1 row of clamp_heads)."),
    "contest_features": (("layer", "head"),
                         "One row per (layer, head): the pattern, eigenvalue and norm features and the depth "
                         "persistence the contest computes itself (the others come from heads)."),
    "contest": (("target", "features"),
                "One row per (target, feature set): cross-validated score, its interval and permutation test, and "
                "for `all-X` whether family X is required."),
    "operators": (("checkpoint", "jacobian_mode", "layer", "sublayer"),
                  "One row per (checkpoint, Jacobian mode, layer, sub-layer): spectral metrics of the mean Jacobian "
                  "(sub-layer `layer`: of the layer operator)."),
    "eigenvalues": (("checkpoint", "jacobian_mode", "layer", "sublayer"),
                    "One row per eigenvalue of each mean Jacobian (checkpoint, Jacobian mode, layer, sub-layer)."),
    "cumulative": (("checkpoint", "jacobian_mode", "schur_order", "schur_alpha", "direction", "truncation", "depth"),
                   "One row per (checkpoint, Schur order, alpha, direction, truncation, depth): ranks of the "
                   "cumulative Jacobian product. With --funnel-curves read (the default) only the curves a figure "
                   "draws have every depth (the forward curves of the least truncation, the trained backward α = 1 "
                   "curve of the least truncation); the others, whose ends the claims read, have the two depths of "
                   "one step and of full depth (the same values as the whole curve's there)."),
    "funnel_boot": (("checkpoint", "jacobian_mode", "init_seed", "replicate"),
                    "One row per (checkpoint, step-0 seed, bootstrap replicate) with `--funnel-boot` above 0: the "
                    "claims' funnel ends (§B3 under the B2 protocol) from mean operators of chunks drawn with "
                    "replacement; the claims B2, B3 and C2 take 95% percentile intervals from them."),
    "communities": (("checkpoint", "boundary_index"),
                    "One row per (checkpoint, boundary): the community partition of the correlation graph."),
    "nodes": (("checkpoint", "boundary_index", "dim"),
              "One row per (checkpoint, boundary, unit): community, participation coefficient and amplification "
              "of one residual coordinate."),
    "topology_profile": (("checkpoint", "gamma"), "One row per (checkpoint, γ): the resolution profile that chose γ."),
    "coupling": (("checkpoint", "boundary_index"),
                 "One row per (checkpoint, boundary): topology–dynamics coupling (§B5)."),
    "transport": (("layer",), "One row per source layer of the Jacobian lens: the spectral geometry of its "
                  "transport matrix to the last block's output."),
    "readout": (("layer", "position", "lens", "rank"),
                "One row per (layer, position, lens, rank) of one prompt: its top next-token predictions through the "
                "Jacobian lens and through the logit lens."),
    "census_heads": (("series", "checkpoint", "layer", "head"),
                     "One row per (series, checkpoint, head): the head's role, scores and reserve at that checkpoint."),
    "census": (("series", "checkpoint"),
               "One row per (series, checkpoint): its status, loss, funnel, coupling and role counts."),
    "sweep": (("cell",), "One row per cell of a sweep (`model`, `revision`, `text` are the cell's axes; `revision` "
              "empty for the model as given): where its run is and whether it finished."),
    "training": (("step",), "One row per optimiser step of a series trained by `depthlens train` (its `model` the "
                 "series folder as given to `--out`, `revision` empty), with step 0: the training loss and learning "
                 "rate, and the held-out loss at the checkpoints."),
}

#: Every table, by name, in report order.
SCHEMA: dict[str, Table] = {
    name: _table(name, stage, _ROWS[name][1], _ROWS[name][0], columns)
    for stage, tables in _STAGE_TABLES.items() for name, columns in tables.items()
}

#: Every JSON summary, by name.
SUMMARIES: dict[str, Summary] = {s.name: s for s in (
    Summary("attention", "attention", "Role counts, Δ_TR statistics by role, the depth-product headline, "
            "`numerical_health` (`brackets`, `bracket_violations`, `uncertified`, `kreiss_A_flagged`: see "
            "`kreiss_B_in_bracket`) and the stage's options, all of the trained model; with `--revisions`, "
            "`revisions` holds the same summary (without the options) of each revision analysed."),
    Summary("topology", "topology", "Significant layers per checkpoint at the FDR level `q_level`, and the "
            "boundaries tested per checkpoint."),
    Summary("interventions", "clamp", "The massive-activation clamp chain (§A7): `clamp_chain` with `tested` "
            "(false when a condition could not be tested: then `reason` names it and the option to change, `needs` "
            "says what would test it, and `supported` is null; with only `reason` and `needs` when no dimension is "
            "massive at the first token of a layer input in half the chunks, or when clamp units failed), `supported`, `reason` (null when supported, "
            "else the conditions that failed), `conditions` (`monotone` with `held`, `alphas`, `sink_mass`, "
            "`nondecreasing`, `n_heads`, `frac_positive`, `p`; `predicts` with `held`, `rho`, `p` (one-sided "
            "within-layer permutation p of the zero arm's Spearman ρ between per-head sink drop and reserve rise), "
            "`n_perm`, `n_heads`, `n_layers`; `control_inert` with `held`, `fraction`, `massive`, `seeds`; each "
            "`held` true, false or null for not tested, with a `reason` when null), `dims` (the massive dimensions "
            "that carry the chain by `dim_rule`, when supported, else empty), `all_dims`, `dim_rule`, `per_dim` "
            "(per massive dimension: `dim`, `alone` and `left_out` each with `monotone`, `predicts`, `sink_mass`, "
            "`delta_TR1` (head means) and `delta_ce`, and `alone_carries`, `left_out_breaks`, `carries`), "
            "`emergence_layers`, `from_layer`, `n_chunks` (clamp chunks), `detection_chunks`, `alphas` and "
            "`control_dims`."),
    Summary("compare", "compare", "Written by `depthlens compare RUN_DIR... --out DIR` into DIR (beside "
            "`compare.html`), not into a run: `format` (`depthlens-compare`), `format_version`; `runs` (per model: "
            "`label`, `run_dir`, `model`, `revision`, `text`, `seed`, `layers`, `stages` (stage → status), "
            "`status` (`done`, `incomplete` or `failed`), `error`, `claims_file` and `claims_hash` of the claims "
            "file it was scored with); `claims` (per claim: `id`, `prediction`, `statistic`, `criterion`, "
            "`source` and `verdicts`, label → that run's `verdict`, `value`, `value_text`, `reason`, `criterion`, "
            "`underpowered`, `sample`, `fragile` and `sensitivity`, as in `claims.json`); `profiles` (per "
            "profile: `title`, `drawn`, `why` (when not drawn), `left_out` (label → why) and `points`: `run`, "
            "`series`, `position`, `depth` normalised to [0, 1], `value`)."),
)}

#: Every kind of array file.
ARRAYS: dict[str, ArrayFile] = {a.pattern: a for a in (
    ArrayFile("pseudospectra", "attention", "σ_min(zI − B) on a 121 × 121 grid of [−1.5, 1.5]² (keys `x`, `y`, "
              "`sigma`, `eig` behind the prefix `routing.` or `sink.`) for two heads of the trained model, each on its "
              "median chunk: the largest previous-token or induction score and the largest sink mass (metadata: "
              "their `layer`, `head`, `chunk`); the report's pseudospectra figure."),
    ArrayFile("head_spectra", "attention", "Every head of the trained model on its median chunk (by TR1), float64, "
              "for the report's head explorer (one head on any chunk in full: `Run.head`): `sigma` (layers, heads, "
              "41, 41) σ_min(zI − B) on the grid `x` × `y` (every third point of the pseudospectra grid, rows = `y`), "
              "`transient` (layers, heads, 28) = ‖B^k‖ exactly at the powers `powers` (k = 1 … 16, then steps of "
              "2^¼ to 128), `eig` (layers, heads, n) the eigenvalues of B (its diagonal), `chunk` (layers, heads); "
              "NaN (chunk −1) for a head without a value."),
    ArrayFile("attention_maps", "attention", "The attention matrices A (float64, n × n, n the chunk's length) of "
              "the heads of --heads (default: the top routing head, largest previous-token or induction score, and "
              "the top sink head, largest sink mass) of the trained model, each on its median chunk (by TR1), keyed "
              "`LAYER.HEAD` (metadata: `heads`, `chunks`, `picked`); the report's attention-pattern figure."),
    ArrayFile("jacobians_<checkpoint>_<jacobian_mode>", "jacobian",
              "The mean sub-layer Jacobians of one checkpoint and mode, in the dtype of --save-arrays."),
    ArrayFile("lens", "lens", "The Jacobian-lens transport matrices in the reference artifact format that "
              "TransformerLens loads (a torch.save dict: `J`, layer → d × d in --lens-dtype, `n_prompts`, "
              "`source_layers`, `d_model`, `metadata` with the model, revision, text and skipped positions); "
              "`depthlens.lens.read_transport` reads it back.", "pt"),
    ArrayFile("lens_fit", "lens", "The lens fit's float64 checkpoint in the reference fit form: `jacobian_sum` "
              "(layer → the sum over chunks), `n_done`, and `chunks` (those summed), `skip_first`, `skip_last`; a "
              "resumed lens stage goes on from it.", "pt"),
)}

#: stage → table → column → :class:`Column` (identity columns included).
COLUMNS: dict[str, dict[str, dict[str, Column]]] = {
    stage: {name: t.columns for name, t in SCHEMA.items() if t.stage == stage} for stage in PRODUCERS
}

#: table → what one row of ``tables/TABLE.parquet`` is.
TABLES: dict[str, str] = {name: t.row for name, t in SCHEMA.items()}


#: The ``checkpoint`` of the model as loaded, in every table with that key.
TRAINED = "trained"


def declare(stage: str, implements: str, tables: dict[str, tuple[str, tuple[str, ...], dict[str, Column]]]) -> None:
    """Declare the tables of a stage from outside the package (registered with
    :func:`depthlens.stages.register`), so that its ``context.write_table`` checks them, the
    report describes them and the generated pages list them.

    Parameters
    ----------
    stage : str
        The stage's name.
    implements : str
        What its outputs implement (sections of docs/methods.md cited as §A3, or a sentence),
        for the pages.
    tables : dict
        ``NAME`` → ``(row, keys, columns)``: what one row is, the key columns, and every
        column's :class:`Column` (the identity columns are added in front).

    Raises
    ------
    SchemaError
        If the stage or one of the tables is declared already, or a key is not a column.
    """
    if stage in PRODUCERS:
        raise SchemaError(f"the outputs of stage {stage!r} are declared already")
    for name, (row, keys, columns) in tables.items():
        if name in SCHEMA:
            raise SchemaError(f"table {name!r} is declared already (by the {SCHEMA[name].stage} stage)")
        missing = [k for k in keys if k not in columns]
        if missing:
            raise SchemaError(f"key column {missing[0]!r} of table {name!r} is not among its columns")
    PRODUCERS[stage] = implements
    for name, (row, keys, columns) in tables.items():
        SCHEMA[name] = Table(name, stage, row, tuple(keys), {**IDENTITY, **columns}, {})
        TABLES[name] = row
    COLUMNS[stage] = {name: SCHEMA[name].columns for name in tables}


def trained_rows(table: "pd.DataFrame") -> "pd.DataFrame":
    """The rows of ``table`` about the model as loaded (``checkpoint`` = :data:`TRAINED`), with a
    fresh index; every row of a table without a ``checkpoint`` column (the attention stage's
    tables of runs made before it had one)."""
    if "checkpoint" not in table.columns:
        return table
    return table[table["checkpoint"] == TRAINED].reset_index(drop=True)


class SchemaError(ValueError):
    """A table that differs from its declaration: a bug of the stage that wrote it."""


def check_table(name: str, table: "pd.DataFrame") -> None:
    """Check ``table`` against the declaration of ``name``: the identity columns come first,
    every key column is present, and every column is declared.

    Raises
    ------
    SchemaError
        For an undeclared table, a missing identity or key column, or an undeclared column.
    """
    spec = SCHEMA.get(name)
    if spec is None:
        raise SchemaError(f"table {name!r} is not declared in depthlens.schema")
    if tuple(table.columns[: len(IDENTITY)]) != spec.identity:
        raise SchemaError(f"table {name} must start with the identity columns {', '.join(IDENTITY)}; "
                          f"it starts with {', '.join(map(str, table.columns[:len(IDENTITY)]))}")
    missing = [k for k in spec.keys if k not in table.columns]
    extra = [c for c in table.columns if c not in spec.columns]
    if missing or extra:
        raise SchemaError(f"table {name} differs from its declaration: missing key columns {missing}, "
                          f"undeclared columns {extra}")


def conform_table(name: str, table: "pd.DataFrame") -> "pd.DataFrame":
    """``table`` checked against the declaration of ``name`` (:func:`check_table`) with its
    columns in declaration order: the form every table is written in.

    Raises
    ------
    SchemaError
        As :func:`check_table`.
    """
    check_table(name, table)
    return table[[c for c in SCHEMA[name].columns if c in table.columns]]


def producer(output: str) -> str | None:
    """The stage that writes ``output``: a table ``NAME``, a summary ``NAME.json`` or an array
    file ``arrays/NAME`` (with or without its suffix); None for an undeclared output."""
    if output.startswith("arrays/"):
        name = output[len("arrays/"):]
        name = next((name[: -len(a.suffix) - 1] for a in ARRAYS.values() if name.endswith(f".{a.suffix}")), name)
        return next((a.stage for a in ARRAYS.values()
                     if name == a.pattern or name.startswith(a.pattern.split("<")[0]) and "<" in a.pattern), None)
    if output.endswith(".json"):
        summary = SUMMARIES.get(output[: -len(".json")])
        return None if summary is None else summary.stage
    table = SCHEMA.get(output)
    return None if table is None else table.stage


def stage_of(table: str) -> str | None:
    """The stage that writes ``tables/TABLE.parquet``, or None for an unknown table."""
    spec = SCHEMA.get(table)
    return None if spec is None else spec.stage


def describe(table: str, column: str) -> Column | None:
    """The description of ``column`` of ``table``, or None when it is not described."""
    spec = SCHEMA.get(table)
    return None if spec is None else spec.columns.get(column)


# ----------------------------------------------------------------------------- pages
