"""Device safety of the model side, checked statically.

Tensors that come out of a model on ``--device cuda`` live on the GPU, and ``Tensor.numpy()``
raises there. No second torch device runs on a CPU-only machine (the ``meta`` device has no
data, so it cannot tell a correct ``.cpu().numpy()`` from a wrong one, and this torch build
ships no ``PrivateUse1`` test backend), so this test scans the source instead: every
``.numpy()`` call in the packages that handle model tensors must go through ``.cpu()`` (or
``.to("cpu", ...)``) in the same expression, or be called on a name assigned from such an
expression in the same function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "depthlens"
#: The packages and modules whose tensors can live on the model's device.
SCANNED = ["attention", "jacobian", "topology", "interventions", "contest", "census", "lens", "models", "stages",
           "residual.py"]


def _receiver(node: ast.expr) -> ast.expr | None:
    """The object a call, attribute or subscript in a method chain is applied to."""
    if isinstance(node, ast.Call):
        return node.func.value if isinstance(node.func, ast.Attribute) else None
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return node.value
    return None


def _moves_to_cpu(node: ast.expr) -> bool:
    """Whether ``node`` is a ``.cpu()`` call or a ``.to("cpu", ...)`` call."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    if node.func.attr == "cpu":
        return True
    first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "device"), None)
    return node.func.attr == "to" and isinstance(first, ast.Constant) and first.value == "cpu"


def _on_cpu(node: ast.expr | None, cpu_names: set[str]) -> bool:
    """Whether the method chain ending in ``node`` passes through a move to the CPU."""
    while node is not None:
        if _moves_to_cpu(node) or (isinstance(node, ast.Name) and node.id in cpu_names):
            return True
        node = _receiver(node)
    return False


def unsafe_numpy_calls(source: str) -> list[int]:
    """Line numbers of ``.numpy()`` calls in ``source`` whose tensor may be on another device.

    Examples
    --------
    >>> unsafe_numpy_calls("a = x.numpy()\\nb = x.detach().cpu().numpy()\\nt = x.cpu()\\nc = t.numpy()")
    [1]
    """
    tree = ast.parse(source)
    bad: list[int] = []
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in scopes:
        nodes = list(ast.walk(scope))
        cpu_names = {t.id for n in nodes if isinstance(n, ast.Assign) and _on_cpu(n.value, set())
                     for t in n.targets if isinstance(t, ast.Name)}
        for n in nodes:
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "numpy"
                    and not n.args and not _on_cpu(n.func.value, cpu_names)):
                bad.append(n.lineno)
    return sorted(set(bad))


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        path = SRC / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def test_scanner_flags_a_device_tensor() -> None:
    """The scanner is not vacuous: the two forms that broke on a GPU are flagged."""
    assert unsafe_numpy_calls("A = probs.numpy()\nB = np.stack([p.numpy() for p in ps])") == [1, 2]
    assert unsafe_numpy_calls("A = probs.to('cpu', torch.float64).numpy()") == []


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(SRC)))
def test_numpy_conversions_go_through_the_cpu(path: Path) -> None:
    lines = unsafe_numpy_calls(path.read_text())
    assert lines == [], f"{path.relative_to(SRC)}: .numpy() without .cpu() on lines {lines}"
