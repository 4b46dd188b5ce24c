"""Jacobian-lens artifacts: the reference format round-trips, a fit checkpoint reads as its
mean, anything else is refused in one line without running code, and the transport metrics
of a float16 lens equal a brute-force float64 computation (no model loaded)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from depthlens.errors import InputError
from depthlens.lens import TRANSPORT_COLUMNS, read_transport, transport_table, write_transport

D = 12


def _matrices(seed: int = 0, layers: tuple[int, ...] = (0, 1, 3)) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {layer: np.eye(D) + rng.standard_normal((D, D)) / (1 + layer) for layer in layers}


def test_the_reference_format_round_trips(tmp_path: Path) -> None:
    """What ``write_transport`` writes is the reference dict (``J`` layer → float16 d × d,
    ``n_prompts``, ``source_layers``, ``d_model``, ``metadata``) that a plain
    ``torch.load(weights_only=True)`` reads, and ``read_transport`` gives back its values."""
    matrices = _matrices()
    path = write_transport(tmp_path / "lens.pt", matrices, n_prompts=7, metadata={"model": "tiny", "skip_first": 16})
    raw = torch.load(path, weights_only=True)
    assert sorted(raw) == ["J", "d_model", "metadata", "n_prompts", "source_layers"]
    assert raw["source_layers"] == [0, 1, 3] and raw["d_model"] == D and raw["n_prompts"] == 7
    assert raw["metadata"] == {"model": "tiny", "skip_first": 16}
    assert all(isinstance(k, int) and v.dtype == torch.float16 and v.shape == (D, D) for k, v in raw["J"].items())
    lens = read_transport(path)
    assert (lens.source_layers, lens.d_model, lens.n_prompts, lens.dtype) == ((0, 1, 3), D, 7, "float16")
    for layer, J in lens:
        assert J.dtype == np.float64
        np.testing.assert_array_equal(J, matrices[layer].astype(np.float16).astype(np.float64))
        assert np.abs(J - matrices[layer]).max() <= 2.0**-11 * np.abs(matrices[layer]).max()
    exact = read_transport(write_transport(tmp_path / "exact.pt", matrices, n_prompts=7, dtype=torch.float64))
    np.testing.assert_array_equal(exact.matrix(3), matrices[3])
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_fit_checkpoint_reads_as_its_mean(tmp_path: Path) -> None:
    matrices = _matrices(layers=(2, 5))
    torch.save({"jacobian_sum": {k: torch.tensor(3 * v) for k, v in matrices.items()}, "n_done": 3}, tmp_path / "ck.pt")
    lens = read_transport(tmp_path / "ck.pt")
    assert lens.n_prompts == 3 and lens.source_layers == (2, 5)
    np.testing.assert_allclose(lens.matrix(5), matrices[5], rtol=1e-15, atol=1e-15)
    with pytest.raises(InputError, match="no transport of layer 0"):
        lens.matrix(0)


class _Payload:
    """Unpickling this would run code (it writes a marker file)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("case, match", [
    ("code", "torch.load\\(weights_only=True\\) refused it"),
    ("list", "holds a list, not a dict"),
    ("no J", "neither 'J' nor 'jacobian_sum' and 'n_done'"),
    ("width", "its d_model is 5 but its matrices are 12 x 12"),
    ("layers", "source_layers \\[0, 9\\] are not the layers"),
    ("square", "not a square floating-point matrix"),
    ("mixed", "different widths"),
    ("text", "torch.load\\(weights_only=True\\) refused it"),
])
def test_anything_else_is_refused_in_one_line(tmp_path: Path, case: str, match: str) -> None:
    path, marker = tmp_path / "bad.pt", tmp_path / "ran"
    good = {0: torch.eye(D), 1: torch.eye(D)}
    content = {"code": {"J": good, "x": _Payload(marker)}, "list": [1, 2], "no J": {"W": good},
               "width": {"J": good, "d_model": 5}, "layers": {"J": good, "source_layers": [0, 9]},
               "square": {"J": {0: torch.ones(3, 4)}}, "mixed": {"J": {0: torch.eye(3), 1: torch.eye(4)}}}
    if case == "text":
        path.write_text("not a torch file")
    else:
        torch.save(content[case], path)
    with pytest.raises(InputError, match=match) as info:
        read_transport(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()  # nothing in the file ran


def test_missing_file_and_bad_matrices_to_write(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no Jacobian-lens artifact at"):
        read_transport(tmp_path / "absent.pt")
    with pytest.raises(InputError, match="range of torch.float16"):
        write_transport(tmp_path / "big.pt", {0: np.full((2, 2), 1e6)}, n_prompts=1)
    with pytest.raises(InputError, match="not finite"):
        write_transport(tmp_path / "nan.pt", {0: np.full((2, 2), np.nan)}, n_prompts=1)
    with pytest.raises(InputError, match="square and of one width"):
        write_transport(tmp_path / "mixed.pt", {0: np.eye(2), 1: np.eye(3)}, n_prompts=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind


def test_transport_metrics_of_a_float16_lens_equal_a_brute_force(tmp_path: Path) -> None:
    """The float16 matrices, taken exactly to float64, against NumPy's eigenvalues and
    singular values: erank, condition number, Henrici departure (here without cancellation:
    the matrices are far from normal), complex fraction, spectral radius."""
    matrices = _matrices(seed=3)
    metrics, eigen = transport_table(write_transport(tmp_path / "lens.pt", matrices, n_prompts=2))
    assert tuple(metrics.columns) == TRANSPORT_COLUMNS and metrics["layer"].tolist() == [0, 1, 3]
    assert metrics["failure"].isna().all()
    for _, row in metrics.iterrows():
        J = matrices[row["layer"]].astype(np.float16).astype(np.float64)
        s = np.linalg.svd(J, compute_uv=False)
        p = s**2 / np.sum(s**2)
        lam = np.linalg.eigvals(J)
        assert row["erank"] == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-12)
        assert row["cond"] == pytest.approx(s[0] / s[-1], rel=1e-10)
        fro = np.linalg.norm(J)
        assert row["henrici_rel"] == pytest.approx(np.sqrt(fro**2 - np.sum(np.abs(lam) ** 2)) / fro, rel=1e-8)
        assert row["complex_frac"] == pytest.approx(np.mean(np.abs(lam.imag) > 1e-8 * np.abs(lam).max()))
        assert row["spectral_radius"] == pytest.approx(np.abs(lam).max(), rel=1e-12)
        mine = eigen[eigen["layer"] == row["layer"]]
        got = np.sort_complex((mine["re"] + 1j * mine["im"]).to_numpy())
        np.testing.assert_allclose(got, np.sort_complex(lam), rtol=0, atol=1e-10 * np.abs(lam).max())
