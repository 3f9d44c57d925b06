"""Start-up configuration: flags, environment variables, and one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from quoteflow.config import Settings
from quoteflow.options import ConfigError, env_names, loggable, parse_settings, unknown_variables


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
        (["--cart-slots", "0"], {}),
        ([], {"QUOTEFLOW_CART_SLOTS": "6"}),  # the whole outbound limit: none left for singles
        (["--cart-slots", "2", "--outbound-limit", "2"], {}),
    ],
)
def test_bad_values_are_refused(argv: list[str], environ: dict[str, str]) -> None:
    """A value QuoteFlow cannot run with is a ConfigError naming it."""
    with pytest.raises(ConfigError):
        parse_settings(argv, environ)


def test_the_carts_part_is_2_unless_set_and_always_leaves_single_quotes_a_slot() -> None:
    """--cart-slots: 2 by default, one below a smaller outbound limit, else as given."""
    assert parse_settings([], {}).carts_part == 2
    assert parse_settings(["--outbound-limit", "2"], {}).carts_part == 1
    assert parse_settings(["--outbound-limit", "1"], {}).carts_part == 0
    assert parse_settings(["--cart-slots", "5"], {}).carts_part == 5
    assert parse_settings([], {"QUOTEFLOW_CART_SLOTS": "1"}).carts_part == 1


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


def test_every_flag_has_its_environment_variable() -> None:
    """Each flag's variable is QUOTEFLOW_ and the flag's name; the older names are kept."""
    names = env_names()
    assert len(names) == len(set(names))
    for kept in (
        "QUOTEFLOW_PROVIDER_URL",
        "QUOTEFLOW_BUDGET",
        "QUOTEFLOW_INBOUND_LIMIT",
        "QUOTEFLOW_OUTBOUND_LIMIT",
        "QUOTEFLOW_LOG_LEVEL",
        "QUOTEFLOW_MAX_SUPPLIER_BODY",
        "QUOTEFLOW_API_KEYS_FILE",
        "QUOTEFLOW_METRICS_REQUIRE_KEY",
    ):
        assert kept in names
    for flag in ("--shutdown-drain", "--supplier-share", "--read-timeout", "--port"):
        assert "QUOTEFLOW_" + flag[2:].upper().replace("-", "_") in names


def test_variables_of_the_former_flag_only_settings_are_read() -> None:
    """Settings that had only a flag now come from the environment too."""
    settings = parse_settings(
        [],
        {
            "QUOTEFLOW_SHUTDOWN_DRAIN": "2.5",
            "QUOTEFLOW_SUPPLIER_SHARE": "3",
            "QUOTEFLOW_READ_TIMEOUT": "0.4",
            "QUOTEFLOW_RETRY_BUDGET_EARN": "0.25",
            "QUOTEFLOW_HOST": "0.0.0.0",
            "QUOTEFLOW_PORT": "9200",
        },
    )
    assert settings.shutdown_drain == 2.5
    assert settings.supplier_share == 3
    assert settings.read_timeout == 0.4
    assert settings.retry_budget_earn == 0.25
    assert (settings.host, settings.port) == ("0.0.0.0", 9200)
    assert parse_settings(["--shutdown-drain", "1"], {"QUOTEFLOW_SHUTDOWN_DRAIN": "2"}) == (
        Settings(shutdown_drain=1.0)
    )


def test_a_bad_variable_is_named_in_the_error() -> None:
    """The one-line error names the variable a bad value came from."""
    with pytest.raises(ConfigError, match=r"^QUOTEFLOW_CONNECT_TIMEOUT: 'fast' is not a valid"):
        parse_settings([], {"QUOTEFLOW_CONNECT_TIMEOUT": "fast"})


def test_help_names_every_variable() -> None:
    """`python -m quoteflow --help` shows each flag's environment variable."""
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    text = " ".join(done.stdout.split())  # argparse wraps lines
    for name in env_names():
        assert f"[env {name}]" in text


def test_fleet_settings_come_from_flags_and_environment() -> None:
    """--redis-url, --redis-timeout, --redis-prefix and their QUOTEFLOW_REDIS_* variables."""
    assert (Settings().redis_url, Settings().redis_timeout, Settings().redis_prefix) == (
        None,
        0.05,
        "quoteflow",
    )
    environ = {
        "QUOTEFLOW_REDIS_URL": "redis://127.0.0.1:6379/0",
        "QUOTEFLOW_REDIS_TIMEOUT": "0.1",
        "QUOTEFLOW_REDIS_PREFIX": "fleet-a",
    }
    settings = parse_settings(["--redis-prefix", "fleet-b"], environ)
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.redis_timeout == 0.1
    assert settings.redis_prefix == "fleet-b"
    assert parse_settings(["--redis-url", "unix:///run/redis.sock"], {}).redis_url


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--redis-url", "http://127.0.0.1:6379"], "redis_url"),
        (["--redis-url", "redis://"], "redis_url"),
        (["--redis-url", "redis://h:port"], "redis_url"),
        (["--redis-timeout", "0"], "redis_timeout"),
        (["--redis-timeout", "0.8"], "below the budget"),
        (["--budget", "0.2", "--redis-timeout", "0.3"], "below the budget"),
        (["--redis-prefix", "two words"], "redis_prefix"),
        (["--redis-prefix", ""], "redis_prefix"),
        (["--redis-sentinel", "127.0.0.1:26379"], "go together"),
        (["--redis-master", "qf"], "go together"),
        (["--redis-sentinel", "127.0.0.1", "--redis-master", "qf"], "not HOST:PORT"),
        (["--redis-sentinel", "h:70000", "--redis-master", "qf"], "not HOST:PORT"),
        (
            ["--redis-sentinel", "h:1", "--redis-master", "qf", "--redis-url", "unix:///r.sock"],
            "not unix",
        ),
        (["--redis-outage-grace", "-1"], "redis_outage_grace"),
    ],
)
def test_bad_fleet_settings_are_refused(argv: list[str], problem: str) -> None:
    """A Redis URL, time limit or prefix QuoteFlow cannot use stops start-up, naming it."""
    with pytest.raises(ConfigError, match=problem):
        parse_settings(argv, {})


def test_sentinel_settings_come_from_flags_and_environment() -> None:
    """--redis-sentinel and --redis-master (or their variables) turn fleet mode on; the
    sentinels' password is a variable only, and never reaches the log."""
    environ = {
        "QUOTEFLOW_REDIS_SENTINEL": "10.0.0.1:26379, [::1]:26380",
        "QUOTEFLOW_REDIS_MASTER": "quoteflow",
        "QUOTEFLOW_REDIS_SENTINEL_PASSWORD": "s3cret",
    }
    settings = parse_settings([], environ)
    assert settings.fleet
    assert settings.redis_sentinel == (("10.0.0.1", 26379), ("::1", 26380))
    assert settings.redis_master == "quoteflow"
    assert settings.redis_sentinel_password == "s3cret"
    assert "s3cret" not in str(loggable(settings))
    assert not Settings().fleet


def test_a_misspelt_variable_is_named_and_a_files_own_is_not(tmp_path: Path) -> None:
    """Unknown QUOTEFLOW_* variables are named at start-up; one the catalogue reads is known."""
    catalogue = tmp_path / "suppliers.toml"
    catalogue.write_text(
        '[[supplier]]\nname = "acme"\nurl = "http://127.0.0.1:1/q"\n'
        'headers = { Authorization = "Bearer ${QUOTEFLOW_ACME_TOKEN}" }\n'
    )
    environ = {
        "QUOTEFLOW_BUGDET": "0.5",
        "QUOTEFLOW_BUDGET": "0.5",
        "QUOTEFLOW_ACME_TOKEN": "t",
        "QUOTEFLOW_REDIS_SENTINEL_PASSWORD": "p",
        "QUOTEFLOW_SUPPLIERS_FILE": str(catalogue),
    }
    settings = parse_settings([], environ)
    assert unknown_variables(settings, environ) == ["QUOTEFLOW_BUGDET"]


def test_a_redis_password_never_appears_in_an_error() -> None:
    """A refused Redis URL is named with its password masked."""
    with pytest.raises(ConfigError) as refused:
        parse_settings(["--redis-url", "http://user:s3cret@127.0.0.1:6379"], {})
    assert "s3cret" not in str(refused.value)
    assert "***" in str(refused.value)


def test_a_redis_password_never_reaches_the_log() -> None:
    """The starting event names the Redis URL with its password masked."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "quoteflow",
            "--redis-url",
            "redis://:s3cret@127.0.0.1:1/0",
            "--host",
            "256.0.0.1",  # cannot listen: the process logs, fails and exits at once
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "s3cret" not in done.stderr
    assert "redis://:***@127.0.0.1:1/0" in done.stderr


@pytest.mark.parametrize(
    ("argv", "environ", "problem"),
    [
        (["--cache-size", "-1"], {}, "cache_size"),
        (["--cache-size", "lots"], {}, "--cache-size: 'lots' is not a valid int"),
        (["--cache-size", "10000001"], {}, "cache_size"),
        (["--cache-max-age", "0"], {}, "cache_max_age"),
        ([], {"QUOTEFLOW_CACHE_MAX_AGE": "soon"}, "QUOTEFLOW_CACHE_MAX_AGE"),
        ([], {"QUOTEFLOW_COALESCE": "maybe"}, "QUOTEFLOW_COALESCE: 'maybe'"),
    ],
)
def test_bad_sharing_settings_are_refused(
    argv: list[str], environ: dict[str, str], problem: str
) -> None:
    """A cache size, cap or coalescing switch QuoteFlow cannot use is one line naming it."""
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_settings(argv, environ)


def test_sharing_settings_from_flags_and_environment() -> None:
    """``--coalesce`` is a bare switch; the cache's size and cap come from either source."""
    settings = parse_settings(["--coalesce", "--cache-size", "500"], {})
    assert (settings.coalesce, settings.cache_size, settings.cache_max_age) == (True, 500, 30.0)
    environ = {"QUOTEFLOW_COALESCE": "0", "QUOTEFLOW_CACHE_MAX_AGE": "5"}
    settings = parse_settings([], environ)
    assert (settings.coalesce, settings.cache_size, settings.cache_max_age) == (False, 0, 5.0)
