"""Synthetic run directories for the report tests (no model, no analysis: tables written by hand).

Every table is written through :func:`write_table`, which puts the identity columns of
:data:`depthlens.schema.IDENTITY` first and checks the table against its declaration in
:mod:`depthlens.schema`, so the synthetic runs have the real runs' layout.

:func:`build_run` writes a small run whose numbers support every default claim, with samples
at or above every claim's minimum (10
chunks, 6 routing and 6 sink heads, 40 boundaries, 1000 permutations, 18 layers of Jacobians); tests then overwrite
single tables or summaries to produce the other verdicts, or pass ``chunks`` /
``boundaries`` below the minimums to get underpowered ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from safetensors.numpy import save_file

from depthlens.runs import FORMAT, FORMAT_VERSION
from depthlens.runs.atomic import start_index
from depthlens.schema import ARRAYS, IDENTITY, SCHEMA, SUMMARIES, conform_table
from depthlens.stages import STAGES

ALL_STAGES = (*STAGES, "census")
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
MALICIOUS = "<script>alert(1)</script>"
IDENT = {"model": "synthetic:tiny", "revision": "", "text": "synthetic"}


def write_table(root: Path, name: str, df: pd.DataFrame, ident: dict[str, str] | None = None) -> None:
    """Write ``tables/NAME.parquet``: the identity columns first (kept when ``df`` has them,
    else from ``ident``, default :data:`IDENT`), checked against the schema."""
    df = df.copy()
    ident = {**IDENT, **(ident or {})}
    for key in reversed(list(IDENTITY)):
        df.insert(0, key, df.pop(key) if key in df.columns else ident[key])
    (root / "tables").mkdir(parents=True, exist_ok=True)
    conform_table(name, df).to_parquet(root / "tables" / f"{name}.parquet", index=False)


def read_table(root: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(root / "tables" / f"{name}.parquet")


def write_json(root: Path, name: str, obj: Any) -> None:
    (root / f"{name}.json").write_text(json.dumps(obj, indent=1))


def read_json(root: Path, name: str) -> Any:
    return json.loads((root / f"{name}.json").read_text())


def set_stage(root: Path, stage: str, status: str | None) -> None:
    """Set a stage's status in the manifest (``None`` removes it: the stage did not run)."""
    manifest = read_json(root, "manifest")
    if status is None:
        manifest["stages"].pop(stage, None)
    else:
        manifest["stages"][stage] = {"status": status}
    write_json(root, "manifest", manifest)


def drop_stage(root: Path, stage: str) -> None:
    """Remove a stage's outputs (as the schema declares them) and its manifest entry, as if it
    never ran."""
    for table in SCHEMA.values():
        if table.stage == stage:
            (root / table.file).unlink(missing_ok=True)
    for summary in SUMMARIES.values():
        if summary.stage == stage:
            (root / summary.file).unlink(missing_ok=True)
    for array in ARRAYS.values():
        if array.stage == stage:
            for path in (root / "arrays").glob(array.file.split("/")[1].split("<")[0] + "*"):
                path.unlink()
    set_stage(root, stage, None)


#: The default preset's --null-chunks.
NULL_CHUNKS = 10


def build_run(root: Path, *, model: str = "synthetic:tiny", stages: Iterable[str] = ALL_STAGES,
              pseudospectra: bool = True, chunks: int = NULL_CHUNKS, boundaries: int = 40, explorer: bool = True) -> Path:
    """Write a complete synthetic run directory at ``root`` and return it (``chunks`` text
    chunks, the first min(chunks, NULL_CHUNKS) with null samples; ``boundaries`` coupling boundaries
    per checkpoint; with ``explorer`` the head explorer's arrays, :func:`write_head_spectra`)."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    stages = tuple(stages)
    start_index(root)  # with the manifest's format marker, a run as depthlens report and compare take it
    write_json(root, "manifest", {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "config": {"model": model, "seed": 0, "chunks": chunks,
                   "attention": {"null_chunks": NULL_CHUNKS, "null_mode": "spec", "probe_seqs": 16},
                   "revisions": ["step1000"], "topology": {"n_perm": 1000}, "null_samples": 8,
                   "clamp": {"control_seeds": 3, "clamp_null_samples": 2}, "contest": {"contest_perm": 1000},
                   "jacobian": {"funnel_boot": 50}},
        "config_hash": "0123456789abcdef",
        "created": "2026-01-01T00:00:00+00:00",
        "model": {"name": model, "revision": None, "family": "llama", "sha256": "ab" * 32},
        "data": {"source": "synthetic", "tokens_sha256": "cd" * 32, "shape": [chunks, 16]},
        "versions": {"depthlens": "0.1.0", "numpy": np.__version__},
        "seed": 0,
        "stages": {s: {"status": "done"} for s in stages},
    })
    ident = {**IDENT, "model": model}
    if "attention" in stages:
        _attention(root, rng, ident, pseudospectra, chunks)
        if explorer:
            write_head_spectra(root)
    if "capture" in stages:
        _capture(root, ident, chunks)
    if "ablate" in stages:
        _ablate(root, ident)
    if "clamp" in stages:
        _clamp(root, ident, chunks)
    if "contest" in stages:
        _contest(root, ident)
    if "jacobian" in stages:
        _jacobian(root, rng, ident)
    if "topology" in stages:
        _topology(root, boundaries, ident)
    if "lens" in stages:
        _lens(root, ident)
    if "census" in stages:
        _census(root, ident)
    return root


def _attention(root: Path, rng: np.random.Generator, ident: dict, pseudospectra: bool, chunks: int) -> None:
    ident = {**ident, "checkpoint": "trained"}  # every row is the model's as loaded
    roles = ["routing", "sink", "routing", "sink", "other", "sink", "routing", "sink",
             "routing", "other", "sink", "routing", "routing", "sink", "other", "other"]
    null_chunks = min(chunks, NULL_CHUNKS)
    rows, chunk_rows = [], []
    for i, role in enumerate(roles):
        layer, head = divmod(i, 4)
        null_mean = 0.8 + 0.05 * i
        # routing heads: more reserve with a higher previous-token score (A5b)
        delta = {"routing": 0.3 + 0.01 * i, "sink": -0.2, "other": 0.01}[role]
        rows.append({**ident, "layer": layer, "head": head, "sink_mass": 0.7 if role == "sink" else 0.1,
                     "prev_token_score": 0.5 + 0.02 * i if role == "routing" else 0.05, "induction_score": 0.05,
                     "TR1": null_mean + delta, "null_TR1_mean": null_mean, "delta_TR1": delta,
                     "delta_TR1_half": delta, "null_q": 0.01 if role != "other" else 0.6, "role": role,
                     "induction_ratio": (2.0 + 0.05 * i) if role == "routing" else None,
                     "induction_ratio_control": (2.1 + 0.05 * i) if role == "routing" else None,
                     "plain_median": "", "n_chunks": chunks, "n_null_chunks": null_chunks})
        # rank of TR1 among its 8 nulls: above all (routing), below all (sink), in the middle (other)
        rank = {"routing": 8.0, "sink": 0.0, "other": 4.0}[role]
        for chunk in range(chunks):
            nulls = chunk < null_chunks
            chunk_rows.append({**ident, "layer": layer, "head": head, "chunk": chunk, "perron_simple": 1.0,
                               "kreiss_A": 4.0, "kreiss_A_ok": 1.0, "TR1": null_mean + delta,
                               "delta_TR1": delta if nulls else np.nan, "delta_TR1_half": delta if nulls else np.nan,
                               "null_n": 8.0 if nulls else np.nan, "null_rank_TR1": rank if nulls else np.nan,
                               "null_rank_TR1_half": rank / 2 if nulls else np.nan})
    heads = pd.DataFrame(rows)
    for column in ("induction_ratio", "induction_ratio_control"):
        heads[column] = heads[column].astype(object)
    write_table(root, "heads", heads, ident)
    write_table(root, "head_chunks", pd.DataFrame(chunk_rows), ident)
    depth_rows = []
    for op in ("mean", "rollout"):
        for chunk in range(chunks):
            for source, samples in (("model", [-1]), ("null", [0, 1] if chunk < null_chunks else [])):
                for sample in samples:
                    for depth in (1, 2, 3):
                        norm = 10.0 ** (-0.5 * depth)
                        gap = 2.8 * depth + 0.1 * chunk if source == "model" else 0.2 * depth
                        e1 = norm / 10**gap
                        row = {**ident, "operator": op, "chunk": chunk, "source": source, "sample": sample,
                               "depth": depth, "norm_D": norm, "e1": e1, "e2": e1 * 0.5,
                               "gap_e1": gap, "gap_e2": gap + np.log10(2)}
                        if op == "rollout" and source == "model" and depth == 3:  # E = 0: gap = +inf
                            row.update(e1=0.0, e2=0.0, gap_e1=np.inf, gap_e2=np.inf)
                        depth_rows.append(row)
    write_table(root, "depth", pd.DataFrame(depth_rows), ident)
    write_json(root, "attention", {
        "n_heads": len(roles), "roles": {r: roles.count(r) for r in ("routing", "sink", "other")},
        "routing_positive_significant": 1.0, "sink_negative": 1.0, "sink_negative_significant": 1.0,
        "q_level": 0.05, "kreiss_A_flagged_matrices": 0, "induction_ratio_median": 2.2,
        "induction_excluded_first": 0, "induction_excluded_control": 0,
        "numerical_health": {"brackets": 16, "uncertified": 0, "bracket_violations": 0, "kreiss_A_flagged": 0},
        "eig_gap_final_depth": {"mean": {"model": {"median_gap_e1": 8.45, "median_gap_e2": 8.75},
                                         "null": {"median_gap_e1": 0.6, "median_gap_e2": 0.9}}},
    })
    if pseudospectra:
        arrays, meta = {}, {"config_hash": "0123456789abcdef"}
        x = np.linspace(-1.5, 1.5, 31)
        for k, role in enumerate(("routing", "sink")):
            eig = np.array([0.0, 0.2, 0.5 - 0.3 * k])
            z = x[None, :] + 1j * x[:, None]
            sigma = np.min(np.abs(z[..., None] - eig), axis=-1) * (0.3 if role == "routing" else 1.0)
            arrays.update({f"{role}.x": x, f"{role}.y": x.copy(), f"{role}.sigma": sigma, f"{role}.eig": eig})
            meta.update({f"{role}.layer": str(k), f"{role}.head": "1"})
        (root / "arrays").mkdir(exist_ok=True)
        save_file(arrays, str(root / "arrays" / "pseudospectra.safetensors"), metadata=meta)
        write_attention_maps(root)


#: The heads of the synthetic attention maps ((layer, head) → what picked it) and their chunk.
MAP_HEADS = {(0, 0): "routing", (0, 1): "sink"}
MAP_CHUNK = 1


def attention_map(layer: int, head: int, n: int = 16) -> np.ndarray:
    """A causal row-stochastic (n, n) matrix: a previous-token pattern for head 0, a sink
    pattern for head 1, seeded noise under both."""
    rng = np.random.default_rng(10 * layer + head)
    A = np.tril(rng.uniform(0.0, 0.05, size=(n, n)))
    i = np.arange(1, n)
    A[i, i - 1 if head == 0 else 0] += 1.0
    A[0, 0] = 1.0
    return A / A.sum(axis=1, keepdims=True)


def write_attention_maps(root: Path) -> None:
    """Write ``arrays/attention_maps.safetensors`` as the attention stage lays it out."""
    arrays = {f"{layer}.{head}": attention_map(layer, head) for layer, head in MAP_HEADS}
    meta = {"config_hash": "0123456789abcdef", "heads": ",".join(arrays), "picked": ",".join(MAP_HEADS.values()),
            "chunks": ",".join(str(MAP_CHUNK) for _ in arrays)}
    (root / "arrays").mkdir(exist_ok=True)
    save_file(arrays, str(root / "arrays" / "attention_maps.safetensors"), metadata=meta)


def _capture(root: Path, ident: dict[str, str], chunks: int, layers: int = 4) -> None:
    """``attention_patterns`` (every head of the synthetic model and chunk, the map heads'
    rows computed from :func:`attention_map` on :data:`MAP_CHUNK`) and ``residual_summary``
    (two boundaries a layer and the output; massive activations from layer 2 on)."""
    from depthlens.attention.patterns import prev_weight, row_entropy, sink_mass

    rows = []
    for layer, head in _HEADS:
        for chunk in range(chunks):
            A = attention_map(layer, head) if (layer, head) in MAP_HEADS and chunk == MAP_CHUNK else None
            rows.append({"layer": layer, "head": head, "chunk": chunk,
                         "sink_mass": 0.3 if A is None else float(sink_mass(A)),
                         "prev_weight": 0.2 if A is None else float(prev_weight(A)),
                         "row_entropy": 1.0 if A is None else float(row_entropy(A))})
    write_table(root, "attention_patterns", pd.DataFrame(rows), ident)
    residual = []
    for chunk in range(chunks):
        for position, (layer, boundary) in enumerate(
                [(lay, b) for lay in range(layers) for b in ("pre_attn", "pre_mlp")] + [(layers, "final")]):
            massive = 2 + chunk % 2 if layer >= 2 else 0
            residual.append({"chunk": chunk, "layer": layer, "boundary": boundary, "rms": 1.0 + 0.5 * position,
                             "median_abs": 0.5 + 0.1 * position + 0.01 * chunk,
                             "max_abs": (300.0 + 10 * chunk) if massive else 5.0 + chunk, "max_pos": 0,
                             "max_dim": 7 if massive else chunk, "n_massive": massive})
    write_table(root, "residual_summary", pd.DataFrame(residual), ident)


_HEADS = [divmod(i, 4) for i in range(16)]  # (layer, head) of the synthetic heads table


def write_head_spectra(root: Path, layers: int = 4, heads: int = 4, n: int = 16) -> None:
    """Write ``arrays/head_spectra.safetensors`` as the attention stage lays it out, for the
    synthetic heads: head (l, h) has the eigenvalues ``0, 0.05·(l + h) + j/(2n)`` (j = 1 … n−1),
    σ_min = its distance to them scaled by ``1/(1 + h)`` (more non-normal with h), the
    transient ``(2 + h)·0.8^k``, and median chunk ``l``."""
    from depthlens.attention.head_view import EXPLORER_GRID, EXPLORER_POWERS

    x = np.ascontiguousarray(EXPLORER_GRID)  # a strided view of the pseudospectra axis: saved as it reads
    z = x[None, :] + 1j * x[:, None]
    sigma = np.empty((layers, heads, x.size, x.size))
    eig = np.empty((layers, heads, n))
    for layer in range(layers):
        for head in range(heads):
            eig[layer, head] = np.r_[0.0, 0.05 * (layer + head) + np.arange(1, n) / (2 * n)]
            sigma[layer, head] = np.min(np.abs(z[..., None] - eig[layer, head]), axis=-1) / (1 + head)
    transient = np.ones((layers, 1, 1)) * (2.0 + np.arange(heads))[None, :, None] * 0.8 ** EXPLORER_POWERS
    arrays = {"x": x, "y": x.copy(), "powers": EXPLORER_POWERS, "sigma": sigma, "transient": transient, "eig": eig,
              "chunk": np.repeat(np.arange(layers), heads).reshape(layers, heads).astype(np.int64)}
    (root / "arrays").mkdir(exist_ok=True)
    save_file(arrays, str(root / "arrays" / "head_spectra.safetensors"), metadata={"config_hash": "0123456789abcdef"})


def _ablate(root: Path, ident: dict[str, str]) -> None:
    rows = [{"layer": layer, "head": head, "method": "mean", "criticality": 0.01 * (i % 5) - 0.005,
             "criticality_lo": 0.01 * (i % 5) - 0.01, "criticality_hi": 0.01 * (i % 5), "ce_clean": 3.2,
             "n_chunks": 4, "n_tokens": 60} for i, (layer, head) in enumerate(_HEADS)]
    write_table(root, "ablation", pd.DataFrame(rows), ident)


def _clamp(root: Path, ident: dict[str, str], chunks: int) -> None:
    massive = [{"chunk": c, "layer": layer, "boundary": "pre_attn", "position": 0, "dim": 7, "value": 2500.0,
                "median_abs": 1.0, "ratio": 2500.0} for c in range(chunks) for layer in (1, 2, 3)]
    write_table(root, "massive", pd.DataFrame(massive), ident)
    arms = [("dose", a) for a in (0.0, 0.25, 0.5, 0.75, 1.0)] + [("mean", np.nan)]
    clamp, heads = [], []
    for target, seed in (("massive", -1), ("control", 0)):
        for arm, alpha in arms:
            effect = 0.0 if target == "control" else (1.0 - alpha if arm == "dose" else 0.9)
            measured = arm == "mean" or alpha in (0.0, 1.0)
            clamp.append({"target": target, "seed": seed, "arm": arm, "alpha": alpha, "dims": "7" if seed < 0 else "3",
                          "from_layer": 1, "ce": 3.2 + effect, "delta_ce": effect, "sink_mass": 0.7 - 0.5 * effect,
                          "TR1": 1.0 + 0.3 * effect if measured else np.nan,
                          "delta_TR1": -0.2 + 0.3 * effect if measured else np.nan, "n_heads": 12, "n_chunks": chunks})
            for layer, head in _HEADS[4:]:
                heads.append({"layer": layer, "head": head, "target": target, "seed": seed, "arm": arm, "alpha": alpha,
                              "sink_mass": 0.7 - 0.5 * effect * (1 + 0.01 * head),
                              "TR1": 1.0 + 0.3 * effect * (1 + 0.01 * head) if measured else np.nan,
                              "delta_TR1": -0.2 + 0.3 * effect * (1 + 0.01 * head) if measured else np.nan,
                              "failure": None})
    write_table(root, "clamp", pd.DataFrame(clamp), ident)
    write_table(root, "clamp_heads", pd.DataFrame(heads), ident)
    write_json(root, "interventions", {"clamp_chain": {
        "tested": True, "supported": True, "dims": [7], "all_dims": [7], "from_layer": 1, "n_chunks": chunks,
        "conditions": {"monotone": {"held": True, "sign_test_p": 0.001}, "predicts": {"held": True, "rho": 0.9},
                       "control_inert": {"held": True, "max_ratio": 0.0}}}})


def _contest(root: Path, ident: dict[str, str]) -> None:
    features = [{"layer": layer, "head": head, "mean_distance": 3.0 + head, "max_weight": 0.5, "diag_q25": 0.1,
                 "diag_q50": 0.2, "diag_q75": 0.3, "fro_B": 2.0, "sigma2_B": 0.5, "stable_rank_B": 1.5,
                 "persistence": 0.1 * head - 0.1} for layer in range(18) for head in range(2)]  # 18 layers: the contest claims' min_layers
    write_table(root, "contest_features", pd.DataFrame(features), ident)
    rows = []
    for target, metric in (("persistence", "spearman"), ("routing", "auroc"), ("criticality", "spearman")):
        for features_ in ("P", "E", "S", "R", "all", "all-P", "all-E", "all-S", "all-R"):
            good = target != "criticality" and "R" in features_.replace("all-R", "") or features_ == "all"
            score = (0.9 if good else 0.3) if target != "criticality" else 0.05
            drop = features_.startswith("all-")
            delta = (0.5 if features_ == "all-R" else 0.0) if drop and target != "criticality" else np.nan
            rows.append({"target": target, "features": features_, "metric": metric, "score": score,
                         "score_lo": score - 0.1, "score_hi": score + 0.1, "r2": np.nan if metric == "auroc" else 0.2,
                         "p": 0.001 if target != "criticality" else 0.4, "q": 0.01 if target != "criticality" else 0.6,
                         "delta": delta, "delta_lo": delta - 0.1 if drop else np.nan,
                         "delta_hi": delta + 0.1 if drop else np.nan, "required": bool(drop and delta - 0.1 > 0),
                         "n_heads": 16, "n_folds": 4})
    write_table(root, "contest", pd.DataFrame(rows), ident)


def _jacobian(root: Path, rng: np.random.Generator, ident: dict[str, str]) -> None:
    layers = 18
    op_rows, eig_rows, cum_rows = [], [], []
    for checkpoint in ("trained", "init"):
        for layer in range(layers):
            early = layer < layers // 3
            for sub in ("attn", "mlp", "layer"):
                complex_frac = (0.97 if early else 0.3) if checkpoint == "trained" else 0.2
                # trained: the update's symmetric share rises with depth; init: near-symmetric throughout
                sym_u = 0.2 + 0.1 * layer if checkpoint == "trained" else 0.8 + 0.001 * (layer % 2)
                op_rows.append({"checkpoint": checkpoint, "jacobian_mode": "isolated", "layer": layer,
                                "sublayer": sub, "complex_frac": complex_frac, "complex_frac_nontrivial": complex_frac,
                                "henrici_update_rel": 0.9 - 0.1 * layer, "symmetry": 0.4 + 0.1 * layer,
                                "symmetry_update": sym_u, "erank": 20.0, "spectral_radius": 1.5, "cond": 10.0})
                # trained early updates rotate (large imaginary parts), step-0 ones barely do
                pairs = rng.normal(size=(4, 2)) * [1.0, 0.8 if complex_frac > 0.5 else 0.05]
                for re, im in pairs:
                    for sign in (1, -1):
                        eig_rows.append({"checkpoint": checkpoint, "jacobian_mode": "isolated",
                                         "layer": layer, "sublayer": sub, "re": 1 + re, "im": sign * im})
        steps = 2 * layers
        for alpha in (0.0, 0.25, 0.5, 0.75, 1.0):
            # the paper's funnel: trained 100 → 2 at α = 1, mostly undone at α = 0; init keeps 60
            final = {"trained": 2.0 + 80.0 * (1 - alpha), "init": 70.0 - 10 * alpha}[checkpoint]
            orders = ("lapack",) if alpha == 1.0 else ("lapack", "canonical", "outside_first", "inside_first")
            for order in orders:
                for direction in ("forward", "backward"):
                    for truncation in (64, 128):  # rank-truncated and exact (d = 128)
                        for depth in range(steps):
                            erank = 100.0 * (final / 100.0) ** (depth / (steps - 1))
                            cum_rows.append({"checkpoint": checkpoint, "jacobian_mode": "isolated", "schur_alpha": alpha,
                                             "schur_order": order, "direction": direction, "truncation": truncation,
                                             "depth": depth, "steps": depth + 1, "erank": erank,
                                             "erank_sigma": erank, "participation_ratio": erank,
                                             "log_norm": 0.1 * depth})
    ops, cum = pd.DataFrame(op_rows), pd.DataFrame(cum_rows)
    # the default run's second mode: in-context operators like the isolated ones, their funnel at α = 0 and 1
    in_context = cum[cum["schur_alpha"].isin((0.0, 1.0)) & (cum["schur_order"] == "lapack")].assign(
        jacobian_mode="in_context")
    write_table(root, "operators", pd.concat([ops, ops.assign(jacobian_mode="in_context")], ignore_index=True), ident)
    write_table(root, "eigenvalues", pd.DataFrame(eig_rows), ident)
    write_table(root, "cumulative", pd.concat([cum, in_context], ignore_index=True), ident)
    write_funnel_boot(root, ident)


def write_funnel_boot(root: Path, ident: dict[str, str] | None = None, replicates: int = 50, seeds: int = 3) -> None:
    """Write ``funnel_boot`` from the run's ``cumulative`` table: per checkpoint (and, for
    ``init``, per step-0 seed offset) the ends of its backward, rank-truncated α = 1 isolated
    curve, replicate 0 exactly and replicates 1.. within ±2 % of them (step-0 seed k scales the
    full-depth erank by 1 + 0.01 k). Call it again after changing ``cumulative``."""
    cum = read_table(root, "cumulative")
    cum = cum[(cum["schur_alpha"] == 1.0) & (cum["direction"] == "backward") & (cum["jacobian_mode"] == "isolated")]
    cum = cum[cum["truncation"] == cum["truncation"].min()]
    wobble = 1.0 + 0.02 * np.sin(np.arange(replicates + 1))  # replicate 0: 1 exactly
    wobble_last = 1.0 + 0.02 * np.sin(1.7 * np.arange(replicates + 1))
    parts = []
    for checkpoint, curve in cum.groupby("checkpoint"):
        curve = curve.sort_values("steps")
        first, last = float(curve["erank"].iloc[0]), float(curve["erank"].iloc[-1])
        for k in range(seeds if checkpoint == "init" else 1):
            parts.append(pd.DataFrame({
                "checkpoint": checkpoint, "jacobian_mode": "isolated",
                "init_seed": float(k) if checkpoint == "init" else np.nan,
                "truncation": int(curve["truncation"].iloc[0]), "replicate": np.arange(replicates + 1),
                "erank_one_step": first * wobble, "erank_full_depth": last * (1.0 + 0.01 * k) * wobble_last,
                "failure": None}))
    write_table(root, "funnel_boot", pd.concat(parts, ignore_index=True), ident)


def _lens(root: Path, ident: dict[str, str]) -> None:
    """The transport of the 18 layers of :func:`_jacobian`'s model: erank 128 at the last layer,
    falling to 20 at layer 0 (less than the product of mean operators does)."""
    from depthlens.jacobian.metrics import METRICS

    rows = [{"layer": layer, "n_prompts": 4, **dict.fromkeys(METRICS, 0.5), "erank": 20.0 + 6.0 * layer,
             "failure": None} for layer in range(18)]
    write_table(root, "transport", pd.DataFrame(rows), ident)
    words = [" the", " <b>$x$</b>", " Paris", "\n"]
    readout = [{"prompt": "The capital of France is", "layer": layer, "position": pos, "input_token": words[pos],
                "lens": lens, "rank": rank, "token_id": 7 * layer + rank, "prediction": words[(layer + rank) % 4],
                "logit": 10.0 - rank, "prob": 0.8 / (1 + rank) if lens == "jacobian" else 0.4 / (1 + rank)}
               for layer in range(19) for pos in range(4) for lens in ("jacobian", "logit") for rank in range(2)]
    write_table(root, "readout", pd.DataFrame(readout), ident)


def _topology(root: Path, boundaries: int, ident: dict[str, str]) -> None:
    rows = []
    for checkpoint, every in (("init", 0), ("step1000", 4), ("trained", 2)):  # 0 → 6 → 12 significant
        for boundary in range(boundaries):
            sig = every > 0 and boundary % every == 0
            effect = (0.4 if sig else 0.05) * (-1) ** boundary
            symmetry = 0.7 if effect > 0 else 0.3  # amplified in near-symmetric layers, damped in non-normal ones
            rows.append({"checkpoint": checkpoint, "boundary_index": boundary, "layer": boundary // 2,
                         "sublayer": ("attn", "mlp")[boundary % 2], "effect": effect, "p": 0.001 if sig else 0.5,
                         "q": 0.01 if sig else 0.7, "sign": (-1) ** boundary, "n_boundary_nodes": 16,
                         "n_interior_nodes": 48, "henrici_update_rel": 1.0 - symmetry, "symmetry": symmetry,
                         "symmetry_update": symmetry, "significant": sig})
    write_table(root, "coupling", pd.DataFrame(rows), ident)
    write_json(root, "topology", {"significant_layers": {"trained": (boundaries + 1) // 2, "init": 0},
                                  "n_boundaries": {"trained": boundaries, "init": boundaries}, "q_level": 0.05})


def _census(root: Path, ident: dict[str, str]) -> None:
    """Two series (RMSNorm, LayerNorm) of 8 checkpoints of 16 heads in 8 layers: every head
    forms at checkpoint 2 or 3 and consolidates two checkpoints later (C1 supported), the
    full-depth erank falls tenfold (C2) and the significant coupling boundaries rise (C3)."""
    steps = [0, 1, 4, 16, 64, 256, 1024, 4096]
    head_rows, rows = [], []
    for series, norm in (("series-rms", "RMSNorm"), ("series-ln", "LayerNorm")):
        for k, step in enumerate(steps):
            key = {"model": series, "revision": f"step-{step}", "series": series, "checkpoint": f"step-{step}",
                   "step": float(step), "order": k}
            for h in range(16):
                sink = h % 4 == 3
                formed = k >= 2 + h % 2
                consolidated = k >= 4 + h % 2
                score = 0.7 if formed else 0.1
                head_rows.append({**key, "layer": h // 2, "head": h % 2,
                                  "role": ("sink" if sink else "routing") if formed else "other",
                                  "prev_token_score": 0.05 if sink else score, "induction_score": 0.02,
                                  "sink_mass": score if sink else 0.1, "TR1": 1.0,
                                  "delta_TR1": (-0.4 if sink else 0.4) if consolidated else 0.01,
                                  "null_q": 0.001 if consolidated else 0.6,
                                  "significant": consolidated})
            rows.append({**key, "status": "done", "error": "", "family": "llama", "norm": norm,
                         "loss": 5.0 - 0.5 * k, "erank_one_step": 100.0, "erank_full_depth": 60.0 / (1 + k),
                         "funnel_ratio": 0.6 / (1 + k), "funnel_operators": 60.0, "width": 576.0,
                         "funnel_step0_over": 1.0 + k,
                         "funnel_step0_over_lo": 0.95 * (1.0 + k), "funnel_step0_over_hi": 1.05 * (1.0 + k),
                         "coupling_significant": float(3 * k), "coupling_tested": 24.0,
                         "n_routing": 12.0 if k >= 2 else 0.0, "n_sink": 4.0 if k >= 2 else 0.0,
                         "max_prev_token_score": 0.7, "max_induction_score": 0.02, "max_sink_mass": 0.7,
                         "n_significant_reserve": 16.0 if k >= 5 else 0.0})
    write_table(root, "census_heads", pd.DataFrame(head_rows), ident)
    write_table(root, "census", pd.DataFrame(rows), ident)


def need_chromium() -> Any:
    """playwright's ``sync_api``; skips the calling test without Chromium or playwright."""
    import pytest

    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    return pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


def in_chromium(page_path: Path, queries: dict[str, str], screenshot: Path | None = None,
                viewport: tuple[int, int] = (1200, 900)) -> tuple[list[str], dict]:
    """Load ``page_path`` in headless Chromium (a window of ``viewport`` width × height) and
    return the errors it raised (console errors, page errors, failed requests) and the value of
    each JavaScript expression of ``queries``, by name; with ``screenshot``, a full-page PNG
    goes there. Skips the calling test without Chromium or playwright."""
    sync_api = need_chromium()
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(page_path.resolve().as_uri())
            page.wait_for_load_state("load")
            values = {name: page.evaluate(expression) for name, expression in queries.items()}
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
        finally:
            browser.close()
    return errors, values


#: The natural width of every image of a page (0 for one that did not load), for :func:`in_chromium`.
IMAGE_WIDTHS = "Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)"
