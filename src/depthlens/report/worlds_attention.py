"""The planted worlds of Part A (METHODS A2–A7): the depth products' gaps, induction, the
null ranks of routing and sink heads, the clamp chain (judged by the stage's own
:func:`~depthlens.interventions.clamp_verdict.chain_verdict`) and the feature-family contest
(rows drawn from a sampling model measured on the stage's contest code: :func:`contest_world`,
:func:`real_contest`). Gathered by :mod:`depthlens.report.calibration`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from ..contest import cv
from ..interventions import clamp as cl
from ..interventions import clamp_verdict
from ..runs.tables import RunTables
from ..stats import aggregate_induction
from .measured_nulls import measured_summary, measured_values
from .worlds import MemoryTables, Scenario, Simulator, correlated_normals, head_rows, mix, planted_ranks, registrar

__all__ = ["CLAMP_DIMS", "CONTEST_HEADS", "CONTEST_METRIC", "CRITICALITY_RHO", "SCENARIOS", "contest_planted", "contest_row_model",
           "contest_world", "criticality_weight", "real_contest"]

#: The scenarios of Part A, by statistic.
SCENARIOS: dict[str, Scenario] = {}
scenario = registrar(SCENARIOS)


_MEASURED = "real random-init models (llama, gpt_neox) at SmolLM2's shape (report/measured_nulls.json)"


def _depth(rng: np.random.Generator, statistic: str, chunks: int, samples: int, shift: float,
           absent: float = 0.0) -> pd.DataFrame:
    """Final-depth rows of the mean-head depth products (orders of magnitude), resampled from
    :data:`_MEASURED`: per chunk the model's gap (plus ``shift``) and ``samples`` null gaps,
    each null gap moved the share ``absent`` of the way to N(0.3, 1) (an error absent in the
    nulls)."""
    model = rng.choice(measured_values(statistic, "model gap_e1 (orders)"), chunks) + shift
    nulls = rng.choice(measured_values(statistic, "null gap_e1 (orders)"), (chunks, samples))
    if absent:
        nulls = (1.0 - absent) * nulls + absent * (0.3 + rng.standard_normal((chunks, samples)))
    rows = []
    for c in range(chunks):
        rows.append({"chunk": c, "source": "model", "sample": -1, "gap_e1": float(model[c])})
        rows += [{"chunk": c, "source": "null", "sample": s, "gap_e1": float(g)} for s, g in enumerate(nulls[c])]
    return pd.DataFrame(rows).assign(operator="mean", depth=30, gap_e2=lambda d: d["gap_e1"])


@scenario("eig_gap_e1_contrast", {"null_chunks": 10, "null_samples": 8},
          null=f"model and null gaps resampled from {_MEASURED} (the model errs as much as its nulls, about 3.5 "
               "orders each)",
          effect="the model's gaps 8.5 orders above those (the seed's 7–11 orders over its nulls)")
def _sim_contrast(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    return MemoryTables({"depth": _depth(rng, "eig_gap_e1_contrast", n["null_chunks"], n["null_samples"],
                                         mix(0.0, 8.5, strength))})


@scenario("eig_gap_e1_null_chunks", {"null_chunks": 10, "null_samples": 8},
          null=f"null gaps resampled from {_MEASURED} (the error is present in the nulls, about 3.5 orders)",
          effect="null gaps N(0.3, 1) (absent in the nulls, as the seed says)")
def _sim_null_gap(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    return MemoryTables({"depth": _depth(rng, "eig_gap_e1_null_chunks", n["null_chunks"], n["null_samples"], 0.0,
                                         mix(0.0, 1.0, strength, low=0.0, high=1.0))})


@scenario("induction_ratio_control_median", {"routing_heads": 24, "probe_seqs": 16},
          null="per routing head a control excess reserve |N(0.15, 0.12)| nats and a ratio exp N(0, 0.4) of the "
               "probe's to it; each sequence adds N(0, 0.025²) nats to both (SmolLM2's spread between sequences)",
          effect="the same with ratios exp N(log 2, 0.4): the seed's doubling")
def _sim_induction(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    heads, seqs = head_rows(9, n["routing_heads"], "routing"), n["probe_seqs"]
    control = np.abs(0.15 + 0.12 * rng.standard_normal(len(heads)))
    ratio = np.exp(mix(0.0, math.log(2.0), strength) + 0.4 * rng.standard_normal(len(heads)))
    noise = 0.025 * rng.standard_normal((3, len(heads), seqs))
    rows = pd.DataFrame({"layer": np.repeat(heads["layer"], seqs), "head": np.repeat(heads["head"], seqs),
                         "seq": np.tile(np.arange(seqs), len(heads)),
                         "delta_TR1_first_copy": (control[:, None] + noise[0]).ravel(),
                         "delta_TR1_second_copy": ((control * ratio)[:, None] + noise[1]).ravel(),
                         "delta_TR1_control": (control[:, None] + noise[2]).ravel()})
    return MemoryTables({"heads": heads.merge(aggregate_induction(rows), on=["layer", "head"]),
                         "induction_seqs": rows})


#: The measured inputs of the null ranks (:mod:`~depthlens.report.measured_nulls`).
_RANKS, _HEAD_RANKS = "rank of TR1 among its nulls / null samples", "a head's mean of that over its chunks"


@lru_cache(maxsize=None)
def rank_bias(statistic: str) -> tuple[float, float]:
    """The mean ``μ`` and between-head spread ``τ`` of the latent shift of a head's TR1 over its
    nulls (TR1 ~ N(shift, 1) against N(0, 1) nulls, so a chunk's expected rank fraction is
    Φ(shift/√2)) that give the measured rank fractions of :data:`_MEASURED`: ``μ`` from their
    mean, ``τ`` from the spread of the heads' means beyond what their chunks alone give."""
    ranks, heads = measured_summary(statistic, _RANKS), measured_summary(statistic, _HEAD_RANKS)
    m = min(max(ranks["mean"], 0.02), 0.98)
    chunks = ranks["n"] / heads["n"]
    between = math.sqrt(max(0.0, heads["sd"] ** 2 - ranks["sd"] ** 2 / chunks))
    z = float(ndtri(m))
    return math.sqrt(2.0) * z, between * math.sqrt(2.0) / (math.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi))


def _roleplanted_ranks(role: str, sign: float) -> Simulator:
    """head_chunks and heads of ``role`` heads only (the claim's BH family): per head and chunk
    the rank of TR1 among ``null_samples`` nulls, TR1 ~ N(shift, 1) and nulls N(0, 1), the
    shift of a head drawn as the measured random inits' (:func:`rank_bias`) plus the effect."""
    statistic = f"{role}_{'positive' if sign > 0 else 'negative'}_rank_fraction"

    def simulate(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
        heads = head_rows(9, n[f"{role}_heads"], role)
        chunks = n["null_chunks"]
        mu, tau = rank_bias(statistic)
        bias = mu + tau * rng.standard_normal(len(heads))
        shift = np.repeat((bias + sign * strength)[:, None], chunks, axis=1)
        rank, half, excess = planted_ranks(rng, shift, n["null_samples"])
        table = pd.DataFrame({"layer": np.repeat(heads["layer"], chunks), "head": np.repeat(heads["head"], chunks),
                              "chunk": np.tile(np.arange(chunks), len(heads)), "delta_TR1": excess.ravel(),
                              "null_rank_TR1": rank.ravel(), "null_n": float(n["null_samples"]),
                              "null_rank_TR1_half": half.ravel()})
        return MemoryTables({"head_chunks": table, "heads": heads.assign(n_null_chunks=chunks)},
                            {"attention": {"q_level": 0.05}})

    return simulate


for _role, _sign, _size in (("routing", 1.0, 24), ("sink", -1.0, 120)):
    scenario(f"{_role}_{'positive' if _sign > 0 else 'negative'}_rank_fraction",
             {f"{_role}_heads": _size, "null_chunks": 10, "null_samples": 8},
             null=f"every {_role} head's TR1 placed among its nulls as those of real random-init models (llama, gpt_neox) "
                  "at SmolLM2's shape (report/measured_nulls.json) "
                  "(TR1 ~ N(shift, 1) against N(0, 1) nulls, each head's shift drawn to give their rank fractions: "
                  "not exchangeable, TR1 tends to lie above its shuffles)",
             effect=f"every {_role} head's TR1 one null standard deviation further {'above' if _sign > 0 else 'below'} "
                    "its nulls in every chunk")(_roleplanted_ranks(_role, _sign))


@scenario("routing_reserve_tracks_prev_token", {"routing_heads": 24},
          null="Δ_TR and the previous-token score independent over routing heads",
          effect="Gaussian-copula correlation 0.6 between them")
def _sim_tracks(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    heads = head_rows(9, n["routing_heads"], "routing")
    x, y = correlated_normals(rng, len(heads), mix(0.0, 0.6, strength, high=0.99))
    return MemoryTables({"heads": heads.assign(delta_TR1=x, prev_token_score=0.5 + 0.1 * y)})


# ----------------------------------------------------------------------------- A7: the clamp chain
#: The clamp scenario's massive dims (the seed's three; labels only).
CLAMP_DIMS = (101, 202, 303)
#: Per-chunk jitter of a clamped arm at α = 0: sink mass, and Δ_TR (nats) at 2 null samples
#: per matrix (it scales with 1/√samples); a dose α scales it by 1 − α, α = 1 being the model.
_CLAMP_JITTER = (0.03, 0.006)


def _clamp_arm(rng: np.random.Generator, clean: tuple[np.ndarray, np.ndarray], change: tuple[np.ndarray, np.ndarray],
               alpha: float, null_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """One arm's per-head sink mass and Δ_TR, each the median over chunks (as
    :func:`~depthlens.interventions.clamp.aggregate_heads`); Δ_TR is NaN at doses the stage
    measures no reserve for.

    ``clean`` holds the unclamped model's per-chunk values (heads × chunks), ``change`` the
    arm's per-head fall in sink mass and rise in Δ_TR at α = 0; the dose α applies ``1 − α`` of
    them and of the chunk jitter (:data:`_CLAMP_JITTER`); the sink mass stays in [0, 1].
    """
    scale = 1.0 - alpha
    sink_sd, reserve_sd = _CLAMP_JITTER
    sink = clean[0] - scale * (change[0][:, None] - sink_sd * rng.standard_normal(clean[0].shape))
    tr = np.full(len(change[1]), np.nan)
    if any(alpha == a for a in cl.TR_ALPHAS):
        noise = reserve_sd * math.sqrt(2.0 / null_samples) * rng.standard_normal(clean[1].shape)
        tr = np.median(clean[1] + scale * (change[1][:, None] + noise), axis=1)
    return np.median(np.clip(sink, 0.0, 1.0), axis=1), tr


@scenario("clamp_chain_n_dims", {"chunks": 6, "control_seeds": 3, "null_samples": 2, "clamped_layers": 18},
          null="the three massive dims carry no chain: clamping them (all, each alone, each left out) moves each "
               "head's sink mass by N(0, 0.25) at α = 0 (either sign, 1 − α of it at dose α), every control seed "
               "moves it as far (SmolLM2's three control seeds moved it 0.5 to 0.8 times as far as its clamp), "
               "and the Δ_TR rise is N(0, 0.05), unrelated to the fall",
          effect="each of the seed's three massive dims carries the chain: the clamp of all three lowers a head's "
                 "sink mass s by s·U(0.2, 0.8) at α = 0 (1 − α of it at dose α), each dim alone by a third of that "
                 "and left out by two thirds, the Δ_TR rise 0.2 × the fall plus N(0, 0.03) (rank correlation about "
                 "0.6, SmolLM2's 0.58), the control moves neither; every arm jitters per chunk by sd 0.03 in sink "
                 "mass and 0.006 nats in Δ_TR (at 2 null samples) at α = 0; the model's sink mass per head "
                 "N(0.53, 0.18) and Δ_TR N(0.035, 0.037), per chunk ± 0.1 and 0.03 (SmolLM2's clamped heads)")
def _sim_clamp(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    """The clamp stage's per-head tables of a model with 9 heads in each of the last
    ``clamped_layers`` of 30 layers (SmolLM2's massive dims emerge at layer 12), medians over
    ``chunks``, judged by the stage's own :func:`~depthlens.interventions.clamp_verdict.chain_verdict`
    (the default seed 0 for its permutations); returns ``interventions.json`` as the stage
    writes it."""
    heads, chunks, samples = 9 * n["clamped_layers"], n["chunks"], n["null_samples"]
    base = np.clip(0.53 + 0.18 * rng.standard_normal(heads), 0.02, 0.98)
    clean = (np.clip(base[:, None] + 0.1 * rng.standard_normal((heads, chunks)), 0.0, 1.0),
             0.035 + 0.037 * rng.standard_normal((heads, 1)) + 0.03 * rng.standard_normal((heads, chunks)))
    full = base * rng.uniform(0.2, 0.8, heads)

    unrelated = mix(1.0, 0.0, strength, low=0.0)

    def change(share: float) -> tuple[np.ndarray, np.ndarray]:
        sink, reserve = np.zeros(heads), np.zeros(heads)
        if unrelated:
            sink += unrelated * 0.25 * rng.standard_normal(heads)
            reserve += unrelated * 0.05 * rng.standard_normal(heads)
        if strength:
            sink += strength * share * full
            reserve += strength * (0.2 * share * full + 0.03 * share * rng.standard_normal(heads))
        return sink, reserve

    def control() -> tuple[np.ndarray, np.ndarray]:
        if not unrelated:
            return np.zeros(heads), np.zeros(heads)
        return unrelated * 0.25 * rng.standard_normal(heads), unrelated * 0.05 * rng.standard_normal(heads)

    massive = change(1.0)
    arms = [("massive", -1, a, massive) for a in (0.0, 0.25, 0.5, 0.75, 1.0)]
    arms += [("control", s, 0.0, control()) for s in range(n["control_seeds"])]
    dims = [(t, d, change(share)) for d in CLAMP_DIMS for t, share in (("alone", 1 / 3), ("left_out", 2 / 3))]
    layer = np.arange(heads) // 9 + 30 - n["clamped_layers"]
    head = np.arange(heads) % 9

    def table(keys: dict[str, list], values: list[tuple[np.ndarray, np.ndarray]], columns: list[str]) -> pd.DataFrame:
        rows = len(values)
        return pd.DataFrame({"layer": np.tile(layer, rows), "head": np.tile(head, rows),
                             **{k: np.repeat(v, heads) for k, v in keys.items()},
                             "sink_mass": np.concatenate([v[0] for v in values]), "TR1": np.nan,
                             "delta_TR1": np.concatenate([v[1] for v in values]), "failure": None})[columns]

    head_rows = table({"target": [t for t, *_ in arms], "seed": [s for _, s, *_ in arms], "arm": ["dose"] * len(arms),
                       "alpha": [a for *_, a, _ in arms]},
                      [_clamp_arm(rng, clean, c, a, samples) for *_, a, c in arms], cl.HEAD_COLUMNS)
    dim_rows = table({"target": [t for t, *_ in dims], "dim": [d for _, d, _ in dims]},
                     [_clamp_arm(rng, clean, c, 0.0, samples) for *_, c in dims], cl.DIM_COLUMNS)
    verdict = clamp_verdict.chain_verdict(head_rows, dim_rows, CLAMP_DIMS, seed=0)
    return MemoryTables({}, {"interventions": clamp_verdict.json_safe({"clamp_chain": {**verdict, "n_chunks": chunks}})})


# ----------------------------------------------------------------------------- A7: the contest
#: Heads per layer of the contest worlds (SmolLM2's 9).
CONTEST_HEADS = 9
#: The contest's metric per target (as :data:`depthlens.stages.contest.METRIC`).
CONTEST_METRIC = {"persistence": "spearman", "routing": "auroc", "criticality": "spearman"}
#: Population Spearman of criticality with the one family that predicts it (the null world of
#: A7-criticality-unpredicted).
CRITICALITY_RHO = 0.4


def contest_world(rng: np.random.Generator, layers: int, resolvent: float, criticality: float
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-head contest features and targets of a planted world: ``layers`` × :data:`CONTEST_HEADS`
    heads.

    Every feature is N(0, 1) per head plus N(0, 0.25) shared by the heads of a layer; each
    family F has the signal ``u_F`` (its four features against the fixed weights (1, −½, ½, 0),
    normalised), and ``o = (u_P + u_E + u_S)/√3``. Every resolvent feature also carries
    ``(u_E + u_S)/(2√2)`` (R overlaps other families, as resolvent quantities overlap spectra
    and norms), so R alone predicts part of what E and S predict. Persistence is
    ``o + resolvent·u_R`` (``u_R`` of R's own part, before the overlap) plus head noise N(0, 1)
    and layer noise N(0, 0.25); routing is 1 for the heads ranking in the top 24/270 (SmolLM2's
    routing share) of a second such draw; criticality is ``criticality·u_P`` plus the same
    noises (``criticality`` = :func:`criticality_weight` gives Spearman 0.4). With
    ``resolvent`` = 0, R adds nothing given P, E and S (the null of
    A7-contest-resolvent-required); with 1, R carries as much of persistence and routing as the
    other three families together.

    Returns
    -------
    features : DataFrame
        ``layer``, ``head`` and the 16 columns of :data:`depthlens.contest.cv.FEATURE_FAMILIES`.
    targets : DataFrame
        ``persistence``, ``routing`` (0/1), ``criticality``, one row per head.
    """
    n = layers * CONTEST_HEADS
    layer = np.repeat(np.arange(layers), CONTEST_HEADS)
    columns = [c for cols in cv.FEATURE_FAMILIES.values() for c in cols]
    X = rng.standard_normal((n, len(columns))) + 0.5 * rng.standard_normal((layers, len(columns)))[layer]
    weights = np.array([1.0, -0.5, 0.5, 0.0]) / math.sqrt(1.5)
    u = {f: X[:, 4 * i: 4 * i + 4] @ weights for i, f in enumerate(cv.FEATURE_FAMILIES)}
    other = (u["P"] + u["E"] + u["S"]) / math.sqrt(3.0)
    X[:, 12:] += 0.5 * ((u["E"] + u["S"]) / math.sqrt(2.0))[:, None]

    def noisy(signal: np.ndarray) -> np.ndarray:
        return signal + rng.standard_normal(n) + 0.5 * rng.standard_normal(layers)[layer]

    persistence = noisy(other + resolvent * u["R"])
    routing = np.zeros(n)
    routing[np.argsort(-noisy(other + resolvent * u["R"]))[: max(2, round(24 / 270 * n))]] = 1.0
    features = pd.DataFrame(X, columns=columns)
    features.insert(0, "head", np.arange(n) % CONTEST_HEADS)
    features.insert(0, "layer", layer)
    return features, pd.DataFrame({"persistence": persistence, "routing": routing,
                                   "criticality": noisy(criticality * u["P"])})


def criticality_weight(rho: float = CRITICALITY_RHO) -> float:
    """The weight of ``u_P`` in :func:`contest_world`'s criticality for a population Spearman
    ``rho`` between them: Pearson ``r = 2 sin(πρ/6)`` (bivariate normal), and ``u_P`` and the
    noise have the same variance, so the weight is ``r / √(1 − r²)``."""
    r = 2.0 * math.sin(math.pi * rho / 6.0)
    return r / math.sqrt(1.0 - r * r)


def real_contest(features: pd.DataFrame, targets: pd.DataFrame, names: Sequence[str], *, n_boot: int, n_perm: int,
                 seed: int = 0) -> pd.DataFrame:
    """The ``contest`` table the stage's own code makes of a :func:`contest_world`: for each
    target of ``names`` :func:`depthlens.contest.cv.contest_target` (5 folds, the stage's seed
    tags), then BH over every row (:func:`~depthlens.contest.cv.with_qvalues`)."""
    X, families, _ = cv.clean_features(features)
    parts = []
    for name in names:
        rows = cv.contest_target(X, families, targets[name].to_numpy(), features["layer"].to_numpy(),
                                 CONTEST_METRIC[name], folds=5, n_boot=n_boot, n_perm=n_perm, seed=seed,
                                 tag=(7, tuple(CONTEST_METRIC).index(name)))
        rows.insert(0, "target", name)
        parts.append(rows)
    return cv.with_qvalues(pd.concat(parts, ignore_index=True))


def contest_planted(statistic: str, strength: float) -> tuple[float, float]:
    """The ``(resolvent, criticality)`` weights of :func:`contest_world` in the planted world of
    a contest statistic's scenario at effect ``strength`` (:class:`~depthlens.report.worlds.Scenario`):
    R required for persistence and routing (weight ``strength``: 1 in the effect world, 0 adding
    nothing), criticality predicted by P at Spearman 0.4 (the null world) down to nothing
    (``strength`` ≥ 1); the other target's weight is the seed's world (R required, nothing
    predicts criticality)."""
    if statistic == "contest_R_required":
        return mix(0.0, 1.0, strength), 0.0
    if statistic == "contest_criticality_best_family":
        return 1.0, mix(criticality_weight(), 0.0, strength, low=0.0)
    raise ValueError(f"no planted contest world for {statistic!r}")


#: The sampling model of the contest rows the claims read: per kind of row, the means and
#: standard deviations of (value, lower end, upper end) of the row over draws of
#: :func:`contest_world` and the correlations (value–lower, value–upper, lower–upper), at 12 and
#: at 30 layers. The value is the score of a single family or the ``delta`` of ``all-R``, the ends
#: its layer-bootstrap interval's. Kinds: ``quiet`` (a family that does not predict criticality),
#: ``predictive`` (P at population Spearman 0.4), ``persistence``/``routing`` with R ``required``
#: (resolvent 1) or ``null`` (R adds nothing). Measured with the stage's code (:func:`real_contest`,
#: 200 bootstrap resamples and 200 permutations; the default preset's 1000 give the same intervals
#: up to resampling noise) on 30 draws per world and size; ``tests/report/test_calibration.py``
#: checks them against fresh draws.
_CONTEST_ROWS: dict[str, dict[int, tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]]] = {
    "quiet": {12: ((-0.123, -0.469, 0.198), (0.166, 0.096, 0.089), (0.76, 0.72, 0.57)),
              30: ((-0.072, -0.337, 0.133), (0.099, 0.06, 0.052), (0.67, 0.7, 0.62))},
    "predictive": {12: ((0.288, -0.075, 0.479), (0.107, 0.17, 0.079), (0.87, 0.7, 0.59)),
                   30: ((0.356, 0.146, 0.457), (0.063, 0.092, 0.049), (0.91, 0.84, 0.83))},
    "persistence_required": {12: ((0.271, 0.072, 0.543), (0.09, 0.066, 0.107), (0.74, 0.76, 0.43)),
                             30: ((0.267, 0.172, 0.419), (0.058, 0.045, 0.073), (0.9, 0.92, 0.85))},
    "persistence_null": {12: ((-0.018, -0.139, 0.081), (0.026, 0.04, 0.043), (0.37, 0.17, -0.08)),
                         30: ((-0.007, -0.054, 0.028), (0.008, 0.015, 0.013), (0.79, 0.44, 0.29))},
    "routing_required": {12: ((0.112, -0.085, 0.297), (0.102, 0.058, 0.111), (0.47, 0.89, 0.32)),
                         30: ((0.137, 0.019, 0.288), (0.06, 0.039, 0.09), (0.85, 0.91, 0.79))},
    "routing_null": {12: ((-0.025, -0.157, 0.117), (0.051, 0.046, 0.057), (0.47, 0.48, 0.24)),
                     30: ((-0.012, -0.089, 0.053), (0.02, 0.022, 0.026), (0.58, 0.64, 0.48))},
}


def contest_row_model(kind: str, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Means (3), standard deviations (3) and correlation matrix (3 × 3) of a kind of contest
    row (:data:`_CONTEST_ROWS`) at ``layers`` layers: means linear and standard deviations
    log-linear in log L through the two measured sizes (and beyond them), the correlation
    matrix the measured one of the nearer size in between (a mixture of the two: still a
    correlation matrix), the nearer one's beyond."""
    small, large = _CONTEST_ROWS[kind][12], _CONTEST_ROWS[kind][30]
    t = math.log(max(layers, 1) / 12.0) / math.log(30.0 / 12.0)
    mean = np.asarray(small[0]) + t * (np.asarray(large[0]) - np.asarray(small[0]))
    sd = np.asarray(small[1]) * (np.asarray(large[1]) / np.asarray(small[1])) ** t

    def corr(r: tuple[float, ...]) -> np.ndarray:
        return np.array([[1.0, r[0], r[1]], [r[0], 1.0, r[2]], [r[1], r[2], 1.0]])

    w = min(max(t, 0.0), 1.0)
    return mean, sd, (1.0 - w) * corr(small[2]) + w * corr(large[2])


def _mixed_row_model(null: str, effect: str, strength: float, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sampling model of a contest row at effect ``strength`` between the kinds ``null``
    (0) and ``effect`` (1): means and standard deviations along the line through the two
    (:func:`~depthlens.report.worlds.mix`, deviations floored at a tenth of the smaller), the
    correlation matrix the mixture at ``strength`` clipped to [0, 1] (still a correlation
    matrix)."""
    (m0, s0, c0), (m1, s1, c1) = contest_row_model(null, layers), contest_row_model(effect, layers)
    w = min(max(strength, 0.0), 1.0)
    return (mix(m0, m1, strength), np.maximum(mix(s0, s1, strength), 0.1 * np.minimum(s0, s1)),
            mix(c0, c1, w))


def _contest_rows(rng: np.random.Generator, kinds: Sequence[tuple[str, str, float]], null: str, layers: int,
                  n_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(value, lower end, upper end) of one row of each kind (n × 3; a kind is ``(null kind,
    effect kind, strength)``, :func:`_mixed_row_model`) and its permutation p-value:
    ``(1 + B)/(1 + n_perm)`` with B ~ Binomial(n_perm, 1 − Φ((value − m₀)/s₀)), the value's
    mean and standard deviation m₀, s₀ under the kind ``null`` (a row with nothing to find gets
    a uniform p)."""
    out = np.empty((len(kinds), 3))
    for i, kind in enumerate(kinds):
        mean, sd, corr = _mixed_row_model(*kind, layers)
        out[i] = mean + sd * (np.linalg.cholesky(corr) @ rng.standard_normal(3))
    m0, s0 = (v[0] for v in contest_row_model(null, layers)[:2])
    p = (1.0 + rng.binomial(n_perm, ndtr(-(out[:, 0] - m0) / s0))) / (1.0 + n_perm)
    return out, p


def _contest_layers_table(layers: int) -> pd.DataFrame:
    """The ``contest_features`` keys of ``layers`` layers (what the layer counter reads)."""
    return pd.DataFrame({"layer": np.repeat(np.arange(layers), CONTEST_HEADS),
                         "head": np.tile(np.arange(CONTEST_HEADS), layers)})


_CONTEST_SIZES = {"layers": 30, "contest_perm": 1000}
_CONTEST_DESIGN = ("rows drawn from a sampling model of the stage's contest code, measured on per-head features "
                   "of this world (report.worlds_attention.contest_world) and checked against that code in the suite "
                   "(it takes seconds a target, too slow for 100 draws a world; bench_calibration.py also "
                   "calibrates with it)")


@scenario("contest_R_required", _CONTEST_SIZES,
          null="R adds nothing given P, E and S (its features overlap E and S but carry nothing of their own "
               "about persistence or routing); " + _CONTEST_DESIGN,
          effect="R carries as much of persistence and of routing identity as P, E and S together; "
                 + _CONTEST_DESIGN)
def _sim_r_required(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    """The ``contest`` table's 27 rows (3 targets × 9 feature sets), BH over all of them as the
    stage does: the ``all-R`` rows of persistence and routing from the sampling model (R
    between ``null`` and ``required`` at the strength), every other row a p-value only (the permutation floor
    1/(1 + n_perm) for a set that predicts its target in the planted world, uniform for the
    criticality rows, which nothing predicts), its other columns NaN (the statistic does not read
    them)."""
    layers, n_perm = n["layers"], n["contest_perm"]
    sets = list(cv.feature_sets(cv.FEATURE_FAMILIES))
    rows = []
    for target in CONTEST_METRIC:
        for name in sets:
            row = {"target": target, "features": name, "metric": CONTEST_METRIC[target], "score": math.nan,
                   "score_lo": math.nan, "score_hi": math.nan, "r2": math.nan, "delta": math.nan,
                   "delta_lo": math.nan, "delta_hi": math.nan, "required": False, "n_heads": layers * CONTEST_HEADS,
                   "n_folds": min(5, layers)}
            if target == "criticality":
                row["p"] = (1.0 + rng.integers(0, n_perm + 1)) / (1.0 + n_perm)
            elif name == "all-R":
                (value, lo, hi), p = (v[0] for v in _contest_rows(rng, [(f"{target}_null", f"{target}_required", strength)], f"{target}_null",
                                                                   layers, n_perm))
                row.update(delta=value, delta_lo=lo, delta_hi=hi, required=bool(lo > 0), p=p)
            else:
                row["p"] = 1.0 / (1.0 + n_perm)
            rows.append(row)
    return MemoryTables({"contest": cv.with_qvalues(pd.DataFrame(rows)),
                         "contest_features": _contest_layers_table(layers)})


@scenario("contest_criticality_best_family", _CONTEST_SIZES,
          null="P predicts criticality at population Spearman 0.4 (E, S and R predict nothing); " + _CONTEST_DESIGN,
          effect="no family predicts criticality (every score's population value 0); " + _CONTEST_DESIGN)
def _sim_criticality(rng: np.random.Generator, n: Mapping[str, int], strength: float) -> RunTables:
    """The four single-family ``criticality`` rows of the ``contest`` table (the statistic's rows;
    BH over them) from the sampling model: every family ``quiet``, or P ``predictive``."""
    layers = n["layers"]
    kinds = [("predictive", "quiet", min(strength, 1.0)) if family == "P" else ("quiet", "quiet", 0.0)
             for family in cv.FEATURE_FAMILIES]
    values, p = _contest_rows(rng, kinds, "quiet", layers, n["contest_perm"])
    table = pd.DataFrame({"target": "criticality", "features": list(cv.FEATURE_FAMILIES), "metric": "spearman",
                          "score": values[:, 0], "score_lo": values[:, 1], "score_hi": values[:, 2], "r2": math.nan,
                          "p": p, "delta": math.nan, "delta_lo": math.nan, "delta_hi": math.nan, "required": False,
                          "n_heads": layers * CONTEST_HEADS, "n_folds": min(5, layers)})
    return MemoryTables({"contest": cv.with_qvalues(table), "contest_features": _contest_layers_table(layers)})
