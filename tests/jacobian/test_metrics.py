"""Per-operator metrics of sub-layer Jacobians (METHODS B2), against hand-built matrices and
direct computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
from scipy.stats import ortho_group

from depthlens.errors import InputError
from depthlens.jacobian.metrics import METRICS, metrics_and_eigenvalues, metrics_table, operator_metrics, spectra
from depthlens.linalg.normality import henrici_rel, symmetry_index
from depthlens.linalg.ranks import erank, erank_sigma, participation_ratio, self_alignment, self_alignment_svd, stable_rank


def rotation_blocks(angles: np.ndarray) -> np.ndarray:
    return scipy.linalg.block_diag(*[np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]]) for t in angles])


def test_metric_names_and_types(rng: np.random.Generator) -> None:
    m = operator_metrics(np.eye(6) + 0.3 * rng.standard_normal((6, 6)))
    assert tuple(m) == METRICS
    assert all(type(v) is float for v in m.values())


def test_rotation_blocks() -> None:
    angles = np.array([0.3, 1.1, 2.0, 2.9])
    m = operator_metrics(rotation_blocks(angles))
    assert m["complex_frac"] == m["complex_frac_nontrivial"] == 1.0
    # e^{iθ} − 1 = 2 sin(θ/2) e^{i(θ + π)/2}: every eigenvalue of U has |arg| = (θ + π)/2.
    assert m["rot_angle_mean"] == pytest.approx(np.mean((angles + np.pi) / 2), rel=1e-12)
    assert m["henrici_rel"] == pytest.approx(0.0, abs=1e-14)
    assert m["henrici_update_rel"] == pytest.approx(0.0, abs=1e-14)
    assert m["symmetry"] == pytest.approx(np.mean(np.cos(angles) ** 2), rel=1e-12)
    assert m["cond"] == pytest.approx(1.0, rel=1e-13)
    assert m["spectral_radius"] == pytest.approx(1.0, rel=1e-13)
    assert m["expand_eig"] == m["expand_sv"] == 0.0


def test_symmetric_psd(rng: np.random.Generator) -> None:
    X = rng.standard_normal((70, 70))
    m = operator_metrics(X @ X.T / 70 + 0.1 * np.eye(70))
    for k in (1, 8, 64):
        assert m[f"self_align_{k}"] == pytest.approx(1.0, rel=1e-10)
    assert m["henrici_rel"] == pytest.approx(0.0, abs=1e-13)
    assert m["henrici_update_rel"] == pytest.approx(0.0, abs=1e-13)
    assert m["symmetry"] == m["symmetry_update"] == pytest.approx(1.0, rel=1e-15)
    assert m["complex_frac"] == 0.0


@pytest.mark.parametrize("d", [1, 7, 100])
def test_identity(d: int) -> None:
    m = operator_metrics(np.eye(d))
    for name in ("erank", "erank_sigma", "participation_ratio", "stable_rank"):
        assert m[name] == pytest.approx(d, rel=1e-13)
    assert m["cond"] == m["spectral_radius"] == 1.0
    assert m["henrici_rel"] == m["henrici_update_rel"] == 0.0
    assert np.isnan(m["rot_angle_mean"]) and np.isnan(m["complex_frac_nontrivial"])  # no non-trivial eigenvalue
    assert m["symmetry_update"] == 1.0  # U = 0 is symmetric (and normal)
    assert m["self_align_64"] == pytest.approx(1.0, rel=1e-13)  # k capped at d: ‖UᵀV‖_F² = d


def test_diagonal_closed_forms() -> None:
    d = 9
    m = operator_metrics(np.diag(np.arange(1.0, d + 1)))
    assert m["cond"] == pytest.approx(d, rel=1e-14)
    entries = np.array([0.5, 1.0, 1.0005, 1.002, 3.0, -2.0, 0.999])
    m = operator_metrics(np.diag(entries))
    assert m["expand_eig"] == pytest.approx(3 / 7)  # 1.002, 3, −2 exceed 1 + 1e-3
    assert m["expand_sv"] == pytest.approx(3 / 7)
    assert m["spectral_radius"] == pytest.approx(3.0, rel=1e-15)
    # Real eigenvalues of U: arg is π for the negative ones (0.5 − 1, 0.999 − 1, −2 − 1); the
    # exact 1 is trivial and left out.
    assert m["rot_angle_mean"] == pytest.approx(3 * np.pi / 6, rel=1e-14)
    assert m["complex_frac"] == m["complex_frac_nontrivial"] == 0.0


def test_against_direct_computations(rng: np.random.Generator) -> None:
    d = 80
    A = rng.standard_normal((d, 16)) @ rng.standard_normal((16, d)) / d
    J = np.eye(d) + A + 0.05 * rng.standard_normal((d, d)) / np.sqrt(d)
    U = J - np.eye(d)
    m = operator_metrics(J)
    lam, mu = np.linalg.eigvals(J), np.linalg.eigvals(U)
    sv = np.linalg.svd(J, compute_uv=False)
    assert m["cond"] == pytest.approx(np.linalg.cond(J), rel=1e-10)
    assert m["henrici_rel"] == pytest.approx(float(henrici_rel(J)), rel=1e-9)
    assert m["henrici_update_rel"] == pytest.approx(float(henrici_rel(U)), rel=1e-9)
    assert m["symmetry"] == pytest.approx(float(symmetry_index(J)), rel=1e-14)
    assert m["symmetry_update"] == pytest.approx(float(symmetry_index(U)), rel=1e-14)
    assert m["complex_frac"] == pytest.approx(np.mean(np.abs(lam.imag) > 1e-8 * np.abs(lam).max()))
    assert np.all(np.abs(mu) > 1e-6)  # no trivial eigenvalue: every one counts
    assert m["complex_frac_nontrivial"] == m["complex_frac"]
    assert m["rot_angle_mean"] == pytest.approx(np.mean(np.abs(np.angle(mu))), rel=1e-9)
    assert m["expand_eig"] == pytest.approx(np.mean(np.abs(lam) > 1.001))
    assert m["expand_sv"] == pytest.approx(np.mean(sv > 1.001))
    assert m["spectral_radius"] == pytest.approx(np.abs(lam).max(), rel=1e-12)
    for k in (1, 8, 64):
        assert m[f"self_align_{k}"] == pytest.approx(float(self_alignment(J, k)), rel=1e-9)
    for fn in (erank, erank_sigma, participation_ratio, stable_rank):
        assert m[fn.__name__] == pytest.approx(float(fn(J)), rel=1e-12)
    # without the singular vectors: the self-alignment is NaN, every other metric the same to rounding
    values_only = operator_metrics(J, self_alignment=False)
    assert values_only.keys() == m.keys()
    for name, value in values_only.items():
        if name.startswith("self_align_"):
            assert np.isnan(value), name
        else:
            assert value == pytest.approx(m[name], rel=1e-12, abs=1e-15), name
    # Henrici by the (cancelling) eigenvalue formula agrees to its own accuracy.
    direct = np.sqrt(np.linalg.norm(J) ** 2 - np.sum(np.abs(lam) ** 2)) / np.linalg.norm(J)
    assert m["henrici_rel"] == pytest.approx(direct, rel=1e-6)


def test_update_eigenvalues_accurate_near_identity() -> None:
    """U is decomposed directly, so small (non-trivial) updates keep their phases; λ − 1 loses
    about ε / |μ| of them."""
    angles = np.array([0.4, 1.3, 2.2, 3.0])
    blocks = 3e-8 * np.array([[[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]] for t in angles])
    Q = ortho_group.rvs(8, random_state=5)
    J = np.eye(8) + Q @ scipy.linalg.block_diag(*blocks) @ Q.T  # eigenvalues of U: 3e-8 e^{±iθ}
    mu = np.linalg.eigvals(J - np.eye(8))
    m = operator_metrics(J)
    assert m["rot_angle_mean"] == pytest.approx(np.mean(np.abs(np.angle(mu))), rel=1e-12)
    from_lambda = np.mean(np.abs(np.angle(np.linalg.eigvals(J) - 1.0)))
    assert abs(from_lambda - m["rot_angle_mean"]) > 1e-10  # the route this avoids


def test_trivial_eigenvalues_are_left_out(rng: np.random.Generator) -> None:
    """J = I + A B with a rank-r update: d − r eigenvalues are exactly 1 (computed at rounding
    level, with random phases). The non-trivial ones are the eigenvalues of B A (r × r)."""
    d, r = 60, 7
    A, B = rng.standard_normal((d, r)), rng.standard_normal((r, d)) / np.sqrt(d)
    m = operator_metrics(np.eye(d) + A @ B)
    nu = np.linalg.eigvals(B @ A)
    lam = 1.0 + nu
    assert m["complex_frac_nontrivial"] == pytest.approx(np.mean(np.abs(lam.imag) > 1e-8 * np.abs(lam).max()))
    assert 0 < m["complex_frac_nontrivial"] < 1
    assert m["complex_frac"] == pytest.approx(m["complex_frac_nontrivial"] * r / d)
    assert m["rot_angle_mean"] == pytest.approx(np.mean(np.abs(np.angle(nu))), rel=1e-9)


def test_triviality_tolerance_is_stated() -> None:
    """``|λ − 1| > 1e-8 · max(1, max|λ|)``: just above counts, just below does not."""
    base = [3.0, 0.5 + 0.2j, 0.5 - 0.2j]
    above = operator_metrics(np.diag([*base, 1 + 3.5e-8j, 1 - 3.5e-8j]).astype(complex))
    below = operator_metrics(np.diag([*base, 1 + 2.5e-8j, 1 - 2.5e-8j]).astype(complex))
    assert above["complex_frac_nontrivial"] == pytest.approx(4 / 5)
    assert below["complex_frac_nontrivial"] == pytest.approx(2 / 3)
    assert below["rot_angle_mean"] == pytest.approx((0.0 + 2 * np.abs(np.angle(-0.5 + 0.2j))) / 3, rel=1e-12)


def test_invariant_under_orthogonal_similarity(rng: np.random.Generator) -> None:
    J = np.eye(12) + rng.standard_normal((12, 12)) / 4
    Q = ortho_group.rvs(12, random_state=3)
    a, b = operator_metrics(J), operator_metrics(Q @ J @ Q.T)
    for name in METRICS:
        assert b[name] == pytest.approx(a[name], rel=1e-8, abs=1e-12), name


def test_spectra(rng: np.random.Generator) -> None:
    J = np.eye(20) + rng.standard_normal((20, 20)) / 3
    s = spectra(J)
    assert s.eigenvalues.dtype == s.update_eigenvalues.dtype == np.complex128
    assert s.singular_values.dtype == np.float64
    mod = np.abs(s.eigenvalues)
    assert np.all(np.diff(mod) <= 1e-12)
    direct = np.linalg.eigvals(J)
    assert np.abs(s.eigenvalues[:, None] - direct[None, :]).min(axis=1).max() < 1e-12
    assert np.abs(s.eigenvalues[:, None] - direct[None, :]).min(axis=0).max() < 1e-12
    np.testing.assert_allclose(s.update_eigenvalues + 1.0, s.eigenvalues, atol=1e-15)
    np.testing.assert_allclose(s.singular_values, np.linalg.svd(J, compute_uv=False), rtol=1e-13)
    m = operator_metrics(J)
    assert m["spectral_radius"] == pytest.approx(mod[0], rel=1e-14)
    assert m["erank"] == pytest.approx(float(erank(s.singular_values)), rel=1e-14)


def test_complex_input(rng: np.random.Generator) -> None:
    J = np.eye(10) + (rng.standard_normal((10, 10)) + 1j * rng.standard_normal((10, 10))) / 5
    m = operator_metrics(J)
    assert m["rot_angle_mean"] == pytest.approx(np.mean(np.abs(np.angle(np.linalg.eigvals(J - np.eye(10))))), rel=1e-9)
    assert m["henrici_rel"] == pytest.approx(float(henrici_rel(J)), rel=1e-9)


def test_self_alignment_svd_matches_matrix_form(rng: np.random.Generator) -> None:
    M = rng.standard_normal((2, 9, 9))
    u, _, vh = np.linalg.svd(M)
    for k in (1, 4, 9):
        np.testing.assert_array_equal(self_alignment_svd(u, vh, k), self_alignment(M, k))
    with pytest.raises(InputError, match="one SVD"):
        self_alignment_svd(u, vh[0], 2)
    with pytest.raises(InputError, match="k is"):
        self_alignment_svd(u, vh, 10)


def test_metrics_table(rng: np.random.Generator) -> None:
    ops = {(layer, sub): np.eye(8) + rng.standard_normal((8, 8)) / 5 for layer in range(3) for sub in ("attn", "mlp")}
    table = metrics_table(ops)
    assert list(table.columns) == ["layer", "sublayer", *METRICS, "failure"]
    assert table["failure"].isna().all()
    assert table[["layer", "sublayer"]].values.tolist() == [[k[0], k[1]] for k in ops]
    assert all(table[name].dtype == np.float64 for name in METRICS)
    row = table.iloc[3]
    assert row[list(METRICS)].to_dict() == operator_metrics(ops[(1, "mlp")])
    assert isinstance(table, pd.DataFrame)
    values_only = metrics_table(ops, self_alignment=False)  # the jacobian stage's default
    aligned = [name for name in METRICS if name.startswith("self_align_")]
    assert aligned and values_only[aligned].isna().all().all() and table[aligned].notna().all().all()
    others = [name for name in METRICS if name not in aligned]
    np.testing.assert_allclose(values_only[others].to_numpy(), table[others].to_numpy(), rtol=1e-12, atol=1e-15)


def test_eigenvalues_come_with_the_metrics(rng: np.random.Generator) -> None:
    """The eigenvalue table from the metrics' Schur forms equals spectra() and numpy's eig."""
    ops = {(layer, sub): np.eye(7) + rng.standard_normal((7, 7)) / 3 for layer in range(2) for sub in ("attn", "mlp")}
    table, eigen = metrics_and_eigenvalues(ops)
    pd.testing.assert_frame_equal(table, metrics_table(ops))
    for (layer, sub), J in ops.items():
        got = eigen[(eigen["layer"] == layer) & (eigen["sublayer"] == sub)]
        lam = got["re"].to_numpy() + 1j * got["im"].to_numpy()
        np.testing.assert_allclose(lam, spectra(J).eigenvalues, rtol=0, atol=1e-12)
        ref = np.linalg.eigvals(J)
        assert np.abs(lam[:, None] - ref[None]).min(axis=1).max() < 1e-10


@pytest.mark.parametrize(
    ("operators", "match"),
    [
        ({}, "empty"),
        ([np.eye(2)], "mapping"),
        ({0: np.eye(2)}, "pair"),
        ({("0", "attn"): np.eye(2)}, "pair"),
        ({(0, "attn"): np.ones((2, 3))}, r"\(0, 'attn'\).*shape"),
        ({(0, "mlp"): np.zeros((3, 3))}, r"\(0, 'mlp'\).*zero"),
        ({(1, "attn"): np.array([[np.nan]])}, "non-finite"),
    ],
)
def test_metrics_table_errors(operators: object, match: str) -> None:
    with pytest.raises(InputError, match=match):
        metrics_table(operators)  # type: ignore[arg-type]
