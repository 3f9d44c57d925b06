"""The architecture, checked mechanically: one-way layers and no import cycles."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import quoteflow

LAYERS = [
    "__main__",
    "cli",
    "gunicorn_conf",
    "app",
    "reload",
    "options",
    "handlers",
    "hostmetrics",
    "observe",
    "cache",
    "coalesce",
    "service",
    "breaker",
    "supplier",
    "fleet",
    "slots",
    "retry",
    "codec",
    "models",
    "config",
    "auth",
    "errors",
    "logs",
]
"""Each module may import only modules to its right (``models``, ``config`` and ``errors``
form the base)."""

MODULES = sorted(m.name for m in pkgutil.iter_modules(quoteflow.__path__))


def _imports(module: str) -> set[str]:
    path = Path(quoteflow.__file__).parent / f"{module}.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quoteflow"):
            found.add(node.module.removeprefix("quoteflow").lstrip("."))
            found.update(alias.name for alias in node.names if node.module == "quoteflow")
    return {name for name in found if name}


def test_every_module_has_a_layer() -> None:
    """A new module must be placed in the layer order."""
    assert set(MODULES) <= set(LAYERS)


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_one_way(module: str) -> None:
    """No module imports one to its left."""
    rank = LAYERS.index(module)
    for imported in _imports(module):
        assert LAYERS.index(imported) > rank, f"{module} imports {imported}"


def test_service_does_not_know_aiohttp() -> None:
    """The policy layer talks to suppliers through a Protocol, never through aiohttp."""
    tree = ast.parse((Path(quoteflow.__file__).parent / "service.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name and name.startswith("aiohttp") for name in imported)


@pytest.mark.parametrize("module", [m for m in MODULES if m != "__main__"])
def test_each_module_imports_on_its_own(module: str) -> None:
    """Importing any module first, in a fresh interpreter, works (no import cycles)."""
    subprocess.run([sys.executable, "-c", f"import quoteflow.{module}"], check=True, timeout=30)
