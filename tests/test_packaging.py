"""What a newcomer expects of the package: its commands, ``python -m``, and a licence file."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)


@pytest.mark.parametrize(
    ("command", "program"), [("quoteflow", "quoteflow"), ("quoteflow-lab", "provider_lab")]
)
def test_installed_command_prints_its_help(command: str, program: str) -> None:
    """``pip install`` puts the command beside Python, and ``--help`` exits 0."""
    script = Path(sys.executable).parent / command
    assert script.exists(), f"{command} is not installed: run pip install -e . (or make install)"
    done = _run(str(script), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")
    assert program in done.stdout.splitlines()[0]


@pytest.mark.parametrize("module", ["quoteflow", "provider_lab"])
def test_python_dash_m_still_works(module: str) -> None:
    """``python -m quoteflow --help`` and ``python -m provider_lab --help`` exit 0."""
    done = _run(sys.executable, "-m", module, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")


def test_console_scripts_point_at_the_main_functions() -> None:
    """setup.cfg's console scripts are the same ``main`` that ``python -m`` runs."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    lines = config["options.entry_points"]["console_scripts"].strip().splitlines()
    scripts = dict(line.replace(" ", "").split("=", 1) for line in lines)
    assert scripts == {"quoteflow": "quoteflow.cli:main", "quoteflow-lab": "provider_lab.cli:main"}


def test_licence_file_matches_setup_cfg() -> None:
    """setup.cfg says MIT, and the LICENSE file is the MIT licence of the QuoteFlow authors."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    assert config["metadata"]["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 the QuoteFlow authors" in text


def test_every_data_file_of_the_package_is_shipped() -> None:
    """Each non-Python file under ``quoteflow/`` (the fleet's ``sync.lua``) is package data."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    data = config["options.package_data"]
    source = ROOT / "quoteflow"
    for path in source.rglob("*"):
        if path.is_dir() or path.suffix in {".py", ".pyc"} or "__pycache__" in path.parts:
            continue
        package = ".".join(("quoteflow", *path.parent.relative_to(source).parts))
        patterns = [p.strip() for p in data.get(package, "").split(",")]
        assert any(path.match(p) for p in patterns if p), f"{path.name} is not in {package}'s data"
