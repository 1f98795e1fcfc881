"""The architecture stays visible: folders by job, imports that only point downwards, small classes."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gan_accel"

# What each part of gan_accel (a sub-package, or a module at its root) may import from the rest at run time
# (type-only imports are free), lowest layer first. Nothing imports upwards: the engine composes the
# callbacks and everything below; the command line and sampling read run folders from above.
ALLOWED = {
    "errors": set(),
    "batch": set(),
    "text": set(),  # what every layer prints: printable text, durations
    "processes": {"errors"},  # what the processes of a launch agree on: errors raised together, bounded waits
    "ending": {"errors", "processes", "text"},  # how a run ends: signals, the time limit, the scripts' exit line
    "storage": {"errors", "processes", "storage"},
    "objectives": {"errors", "objectives"},
    "models": {"errors", "models"},
    "data": {"errors", "processes", "text", "data", "storage", "batch"},  # processes: one builds the image cache
    "augment": {"augment"},
    "tracking": set(),
    "config": {"errors", "objectives", "tracking", "augment"},
    "pictures": {"errors", "storage", "pictures"},
    "eval": {"errors", "processes", "batch", "data", "storage", "models", "eval"},
    "callbacks": {"errors", "ending", "processes", "text", "storage", "pictures", "eval", "tracking", "callbacks"},
    "engine": {"errors", "ending", "processes", "text", "batch", "config", "objectives", "storage", "tracking",
               "augment", "callbacks", "engine"},
    "sampling": {"errors", "config", "models", "storage"},
    "recipes": {"errors", "config"},  # the table of defaults by resolution and data size
    "settle": {"errors", "config", "models", "recipes"},  # one place settles a run: given, recorded, recipe, defaults
    "hub": {"errors", "text", "models", "pictures", "sampling", "storage", "hub"},  # exported generators, the Hugging Face Hub
    # the command line is the top: `gan-accel train` composes the engine, the callbacks and the data
    # (objectives and tracking: the help texts and aliases list the registered losses and trackers)
    "cli": {"errors", "ending", "processes", "text", "config", "objectives", "tracking", "storage", "pictures",
            "sampling", "data", "eval", "models", "augment", "engine", "callbacks", "hub", "recipes", "settle", "cli"},
}
# Inside the engine only the trainer composes the callbacks: the rest (launch, runner, ...) is below them.
ENGINE_MAY_IMPORT_CALLBACKS = {"trainer.py", "snapshot.py"}


def parts() -> list[tuple[str, Path]]:
    """(layer, file) for every module of the package (the package's own __init__ and __main__ are the top)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        layer = relative.parts[0].removesuffix(".py")
        if layer not in ("__init__", "__main__"):
            found.append((layer, path))
    return found


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


def upward_imports() -> list[str]:
    """Every import that breaks the layering above, as ``file -> part``."""
    bad = []
    for layer, path in parts():
        allowed = ALLOWED.get(layer)
        assert allowed is not None, f"{path.relative_to(PACKAGE.parent)}: add its layer to ALLOWED in {__file__}"
        if layer == "engine" and path.name not in ENGINE_MAY_IMPORT_CALLBACKS:
            allowed = allowed - {"callbacks"}
        bad += [f"{path.relative_to(PACKAGE.parent)} -> {name}" for name in sorted(runtime_imports(path) - allowed)]
    return bad


def test_imports_only_point_downwards():
    assert upward_imports() == []


def test_the_layering_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The check above is real: a module that imports upwards is reported."""
    fake = tmp_path / "gan_accel"
    (fake / "storage").mkdir(parents=True)
    (fake / "storage" / "bad.py").write_text("from ..engine.trainer import GANTrainer\n")
    (fake / "config.py").write_text("from .callbacks import Callback\nfrom .errors import ConfigError\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert upward_imports() == ["gan_accel/config.py -> callbacks", "gan_accel/storage/bad.py -> engine"]


def test_no_class_is_longer_than_250_lines_and_no_function_than_60():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                limit = 250 if isinstance(node, ast.ClassDef) else 60
                length = node.end_lineno - node.lineno + 1
                assert length <= limit, f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {length} lines"


def test_importing_gan_accel_loads_nothing_mnist_specific_nor_the_compiler():
    """Nothing MNIST-specific, and not torch._dynamo: importing the compiler cost every command one to two seconds
    (`gan-accel sample`, `info`, `export` never build an optimizer, whose first parameter group imports it)."""
    code = ("import sys, gan_accel; bad = [m for m in sys.modules if m in ('gan_accel.data', 'gan_accel.eval.mnist', "
            "'torchvision.datasets', 'gan_accel.data.mnist')]; import gan_accel.cli; "
            "bad += [m for m in sys.modules if m == 'torch._dynamo']; print(bad); assert not bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]


def test_the_run_folder_names_are_written_in_one_module():
    """Every name of a file in a run folder lives in gan_accel/storage/layout.py: no other module of the
    package spells one out in code (docstrings and messages may name them)."""
    from gan_accel.storage import layout

    names = {value for key, value in vars(layout).items() if key.isupper() and isinstance(value, str) and "." in value}
    assert {"metrics.jsonl", "model.safetensors", "config.json", "best.json", "history.jsonl"} <= names
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "layout.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in docstrings:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value!r}")
    assert found == [], "take these names from gan_accel.storage.layout"


def test_the_version_is_written_once():
    import importlib.metadata
    import tomllib

    import gan_accel

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gan_accel.__version__"}
    assert importlib.metadata.version("gan_accel") == gan_accel.__version__
