"""The benchmark's modules, checked mechanically: ``bench.run`` on top, no import cycles.

``bench/run.py`` imports every section; a section imports what it shares with the
others (``Bench``, ``Options``) from ``bench/core.py``, never from ``bench.run``.
Every import counts: at the top, inside a function, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
MODULES = {path.stem: path for path in sorted(BENCH.glob("*.py")) if path.stem != "__init__"}


def _imports(path: Path) -> set[str]:
    """The modules of ``bench`` (by file stem) that the file at ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: bench is one package, so ``from . import x`` is bench.x
                module = "bench" + (f".{node.module}" if node.module else "")
            else:
                module = node.module or ""
            # `from bench import hot` imports the module bench.hot.
            dotted = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in dotted:
            package, _, rest = name.partition(".")
            stem = rest.partition(".")[0]
            if package == "bench" and stem in MODULES:
                found.add(stem)
    return found


GRAPH = {stem: _imports(path) - {stem} for stem, path in MODULES.items()}


def test_the_graph_sees_the_sections() -> None:
    """The parse finds what it should, so the checks below are not vacuous."""
    assert {"core", "run", "slow", "hot", "contracts"} <= set(MODULES)
    assert {"core", "slow", "hot", "contracts"} <= GRAPH["run"]
    assert "core" in GRAPH["slow"]


def test_only_run_imports_bench_run() -> None:
    """No module but ``bench/run.py`` imports ``bench.run``, not even for a type."""
    importers = sorted(stem for stem, imported in GRAPH.items() if "run" in imported)
    assert importers == [], f"import from bench.core instead: {importers}"


def test_no_import_cycles() -> None:
    """The import graph among ``bench/*.py`` is acyclic."""
    cycles = [stem for stem in GRAPH if stem in _reachable(stem)]
    assert cycles == [], f"modules on an import cycle: {cycles}"


def _reachable(start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(GRAPH[start])
    while todo:
        stem = todo.pop()
        if stem not in seen:
            seen.add(stem)
            todo.extend(GRAPH[stem])
    return seen
