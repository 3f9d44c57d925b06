"""The architecture, checked mechanically: one-way layers and no import cycles."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import quoteflow

LAYERS = [
    "__main__",
    "cli",
    "cart_cli",
    "gunicorn_conf",
    "app",
    "spans",
    "tracing",
    "connections",
    "reload",
    "roster",
    "options",
    "console",
    "handlers",
    "waterfall",
    "apidoc",
    "hostmetrics",
    "observe",
    "cache",
    "coalesce",
    "service",
    "offers",
    "fx",
    "basket",
    "breaker",
    "supplier",
    "batch_calls",
    "hedging",
    "waits",
    "wire",
    "calls",
    "tokens",
    "fleet",
    "pauses",
    "rates",
    "slots",
    "retry",
    "catalogue",
    "batching",
    "templates",
    "bom",
    "codec",
    "models",
    "config",
    "money",
    "iso4217",
    "callers",
    "auth",
    "errors",
    "logs",
]
"""Each module may import only modules to its right (``models``, ``config`` and ``errors``
form the base)."""

PACKAGE_LAYERS = {
    "fleet": [
        "coordinator",
        "release",
        "holdings",
        "hosts",
        "listener",
        "client",
        "script",
        "deadline",
        "leases",
        "trade",
        "waiters",
        "idle",
        "safe",
        "budget",
        "timing",
    ],
    "callers": ["gate", "shared", "meter", "file", "model"],
}
"""Inside a sub-package the same rule holds among its modules (``__init__`` only re-exports)."""

ROOT = Path(quoteflow.__file__).parent
MODULES = sorted(m.name for m in pkgutil.iter_modules(quoteflow.__path__))
SUBMODULES = sorted(
    f"{package}.{m.name}"
    for package in PACKAGE_LAYERS
    for m in pkgutil.iter_modules([str(ROOT / package)])
)


def _files(module: str) -> list[Path]:
    """The source files of ``module``: one file, or every file of a package."""
    path = ROOT / module.replace(".", "/")
    return sorted(path.glob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def _imports(module: str) -> set[str]:
    """Dotted names (below ``quoteflow``) that ``module`` imports from."""
    found: set[str] = set()
    for path in _files(module):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if node.module.startswith("quoteflow"):
                inside = node.module.removeprefix("quoteflow").lstrip(".")
                if node.module == "quoteflow":
                    found.update(alias.name for alias in node.names)
                elif inside in PACKAGE_LAYERS:  # a sub-package's modules, by name
                    found.update(f"{inside}.{alias.name}" for alias in node.names)
                else:
                    found.add(inside)
    return {name for name in found if name}


def test_every_module_has_a_layer() -> None:
    """A new module must be placed in the layer order, and so must a sub-package's module."""
    assert set(MODULES) <= set(LAYERS)
    for package, layers in PACKAGE_LAYERS.items():
        inside = {name.partition(".")[2] for name in SUBMODULES if name.startswith(f"{package}.")}
        assert inside == set(layers), package


@pytest.mark.parametrize("module", MODULES)
def test_imports_point_one_way(module: str) -> None:
    """No module (or any file of a package) imports one to its left."""
    rank = LAYERS.index(module)
    for imported in _imports(module):
        top = imported.partition(".")[0]
        if top != module:
            assert LAYERS.index(top) > rank, f"{module} imports {imported}"


@pytest.mark.parametrize("module", SUBMODULES)
def test_imports_point_one_way_inside_a_package(module: str) -> None:
    """Within a sub-package too, a module imports only its package's modules to its right."""
    package, _, name = module.partition(".")
    layers = PACKAGE_LAYERS[package]
    for imported in _imports(module):
        top, _, inside = imported.partition(".")
        if top == package:
            assert inside in layers, f"{module} imports the package root {imported}"
            assert layers.index(inside) > layers.index(name), f"{module} imports {imported}"
        else:
            assert LAYERS.index(top) > LAYERS.index(package), f"{module} imports {imported}"


MODULE_LINES_MOST = {"fleet": 500}
"""Lines a module of these sub-packages may have: one concern per module (issue 18)."""


@pytest.mark.parametrize("package", sorted(MODULE_LINES_MOST))
def test_package_modules_keep_to_their_size(package: str) -> None:
    """Every module of the fleet package stays within 500 lines; a larger one is split."""
    most = MODULE_LINES_MOST[package]
    sizes = {path.name: len(path.read_text().splitlines()) for path in _files(package)}
    assert {name: size for name, size in sizes.items() if size > most} == {}


SUPPLIER_LINES_MOST = 600
CLIENT_LINES_MOST = 400
"""``supplier.py`` and its ``SupplierClient``: the attempt loop alone, the rest in rooms of
their own (``hedging``, ``wire``, ``calls``, ``waits``, ``batch_calls``; issue 48)."""


def test_the_supplier_client_keeps_to_its_size() -> None:
    """A reader looking for the hedge, the wire or a batch call opens one file, not all."""
    source = (ROOT / "supplier.py").read_text()
    assert len(source.splitlines()) <= SUPPLIER_LINES_MOST
    (client,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "SupplierClient"
    ]
    assert client.end_lineno is not None
    assert client.end_lineno - client.lineno + 1 <= CLIENT_LINES_MOST


def test_service_does_not_know_aiohttp() -> None:
    """The policy layer talks to suppliers through a Protocol, never through aiohttp."""
    tree = ast.parse((ROOT / "service.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(name and name.startswith("aiohttp") for name in imported)


FIRST_IMPORTS = [m for m in MODULES if m != "__main__"] + SUBMODULES

# Each module imported first, with no module of QuoteFlow's loaded: one
# interpreter for them all (a fresh one each cost half a second, 27 s in
# all), QuoteFlow's modules dropped from sys.modules between two, so what
# each import finds is what a fresh interpreter's would (its dependencies
# stay loaded: they cannot take part in QuoteFlow's import cycles).
_FIRST_IMPORT = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m == "quoteflow" or m.startswith("quoteflow.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module("quoteflow." + name)
    except BaseException:
        failed[name] = traceback.format_exc()
print(json.dumps(failed))
"""


@pytest.fixture(scope="module")
def first_import_failures() -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_IMPORT, *FIRST_IMPORTS],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    failures: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
    return failures


@pytest.mark.parametrize("module", FIRST_IMPORTS)
def test_each_module_imports_on_its_own(module: str, first_import_failures: dict[str, str]) -> None:
    """Importing any module first, with none of QuoteFlow's loaded, works (no import cycles)."""
    assert module not in first_import_failures, first_import_failures[module]
