"""The architecture stays visible: folders by job, imports that only point downwards, small classes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gan_accel"

# What each folder may import from the rest of gan_accel at run time (type-only imports are free).
# The engine composes everything below it; nothing below imports the engine.
ALLOWED = {
    "models": {"models"},
    "state": {"errors", "collective", "state"},
    "data": {"errors", "data"},
    "objectives": {"errors", "objectives"},
    "eval": {"errors", "collective", "batch", "data", "state", "eval"},
    "callbacks": {"errors", "collective", "state", "visuals", "plots", "eval", "callbacks", "watchdog"},
    "engine": {"errors", "collective", "batch", "config", "objectives", "state", "callbacks", "engine", "watchdog"},
    "watchdog": {"watchdog"},  # liveness and signals of a launch: below everything that trains
}


def runtime_imports(path: Path) -> set[str]:
    """First-level gan_accel sub-packages/modules that ``path`` imports outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            parts = module.split(".")
            if parts[0] == "gan_accel" and len(parts) > 1:
                found.add(parts[1])
            elif parts == ["gan_accel"]:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "gan_accel" and len(parts) > 1:
                    found.add(parts[1])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_only_point_downwards(folder):
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        imported = runtime_imports(path)
        extra = imported - ALLOWED[folder]
        assert not extra, f"{path.relative_to(PACKAGE.parent)} imports {sorted(extra)}: not allowed for {folder}/"


def test_no_class_is_longer_than_250_lines_and_no_function_than_60():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                limit = 250 if isinstance(node, ast.ClassDef) else 60
                length = node.end_lineno - node.lineno + 1
                assert length <= limit, f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {length} lines"


def test_importing_gan_accel_loads_nothing_mnist_specific():
    code = ("import sys, gan_accel; bad = [m for m in sys.modules if m in ('gan_accel.data', 'gan_accel.eval.mnist', "
            "'torchvision.datasets', 'gan_accel.data.mnist')]; print(bad); assert not bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
