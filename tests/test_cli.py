"""Start-up configuration: flags, environment variables, and one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quoteflow.cli import ConfigError, parse_settings
from quoteflow.config import Settings


def test_defaults_are_the_contracts() -> None:
    """With nothing set, the contract's limits apply."""
    settings = parse_settings([], {})
    assert settings == Settings()
    assert (settings.budget, settings.inbound_limit, settings.outbound_limit) == (0.8, 8, 6)
    assert settings.provider_url == "http://127.0.0.1:9101"


def test_environment_is_read_and_flags_win() -> None:
    """QUOTEFLOW_* variables configure the service; a flag beats its variable."""
    environ = {
        "QUOTEFLOW_PROVIDER_URL": "http://127.0.0.1:1",
        "QUOTEFLOW_BUDGET": "0.5",
        "QUOTEFLOW_INBOUND_LIMIT": "3",
        "QUOTEFLOW_OUTBOUND_LIMIT": "2",
    }
    settings = parse_settings(["--budget", "0.25", "--port", "9200"], environ)
    assert settings.budget == 0.25
    assert settings.port == 9200
    assert settings.provider_url == "http://127.0.0.1:1"
    assert (settings.inbound_limit, settings.outbound_limit) == (3, 2)


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--budget", "soon"], {}),
        (["--budget", "0"], {}),
        (["--budget", "-1"], {}),
        ([], {"QUOTEFLOW_INBOUND_LIMIT": "0"}),
        ([], {"QUOTEFLOW_OUTBOUND_LIMIT": "many"}),
        (["--provider-url", "ftp://x"], {}),
        (["--port", "70000"], {}),
    ],
)
def test_bad_values_are_refused(argv: list[str], environ: dict[str, str]) -> None:
    """A value QuoteFlow cannot run with is a ConfigError naming it."""
    with pytest.raises(ConfigError):
        parse_settings(argv, environ)


def test_bad_value_stops_start_up_with_one_line() -> None:
    """`python -m quoteflow` with a bad value exits 2 with a one-line error, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--budget", "soon"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "quoteflow: error: --budget: 'soon' is not a valid float"
    ]
