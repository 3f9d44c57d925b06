"""Flags and ``QUOTEFLOW_*`` environment variables → ``Settings``; the only place that reads them.

Every flag has an environment variable of the same name: ``--read-timeout`` is
``QUOTEFLOW_READ_TIMEOUT``, ``--api-keys-file`` is ``QUOTEFLOW_API_KEYS_FILE``
(one exception: ``--callers`` is ``QUOTEFLOW_CALLERS_FILE``, as it names a file).
A flag wins over its variable. ``python -m quoteflow`` reads both (``cli.py``);
gunicorn's workers have no command line of their own and read the variables
only (``app.gunicorn_app``). Either way a bad value is one ``ConfigError``
whose text names the flag or variable it came from.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import attrs

from quoteflow import catalogue
from quoteflow.auth import ApiKeys, ApiKeysError
from quoteflow.callers import load_callers
from quoteflow.catalogue import Catalogue, CatalogueError
from quoteflow.config import Settings, redact_url
from quoteflow.errors import ConfigError as ConfigError  # where it was first defined
from quoteflow.logs import log_event

ENV_PREFIX = "QUOTEFLOW_"


def _boolean(raw: str) -> bool:
    """An on/off value: the bare flag, or 1/true/yes/on and 0/false/no/off in the environment."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


SENTINEL_PASSWORD_ENV = ENV_PREFIX + "REDIS_SENTINEL_PASSWORD"
"""The sentinels' own password: a variable only, so that it never shows in a process list."""

EXTRA_ENV = frozenset(
    {
        SENTINEL_PASSWORD_ENV,
        ENV_PREFIX + "GUNICORN_MASTER",
        ENV_PREFIX + "URL",
        ENV_PREFIX + "API_KEY",
    }
)
"""Variables QuoteFlow reads that are no setting's: the sentinels' password, gunicorn's
master (set by ``gunicorn_conf``), and ``quoteflow cart``'s service and key."""


def addresses(raw: str) -> tuple[tuple[str, int], ...]:
    """``HOST:PORT[,HOST:PORT...]`` (an IPv6 host in brackets) → ((host, port), ...)."""
    found = []
    for part in raw.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{part.strip()!r} is not HOST:PORT")
        found.append((host, int(port)))
    return tuple(found)


# setting name → (parser, help); the flag is --<name> unless _FLAGS says otherwise.
_OPTIONS: dict[str, tuple[Callable[[str], Any], str]] = {
    "host": (str, "address to listen on (default 127.0.0.1)"),
    "port": (int, "port to listen on (default 9100)"),
    "provider_url": (str, "base URL of the suppliers"),
    "budget": (float, "seconds per request, whatever happens (default 0.8)"),
    "inbound_limit": (int, "requests served at once (default 8)"),
    "cart_budget": (float, "seconds per cart (POST /api/carts), whatever happens (default 2)"),
    "cart_limit": (int, "carts served at once, apart from single quotes (default 2)"),
    "max_cart_lines": (int, "most lines one cart may have (default 200)"),
    "outbound_limit": (int, "supplier attempts in flight at once (default 6)"),
    "cart_slots": (
        int,
        "outbound slots all carts hold at most while single quotes wait; below the "
        "outbound limit (default 2, or the limit - 1 if less)",
    ),
    "breaker_failures": (
        int,
        "failures in a row that open a supplier's circuit; 0: no breaker (default 5)",
    ),
    "breaker_open": (float, "seconds a circuit first stays open before a probe (default 1.0)"),
    "breaker_open_max": (
        float,
        "cap on the open time, which doubles with each failed probe (default 10)",
    ),
    "log_level": (str, "debug, info, warning or error (default info)"),
    "log_format": (str, "json (default) or text, on stderr"),
    "event_loop": (str, "auto (default: uvloop if installed), asyncio, uvloop"),
    "supplier_share": (
        int,
        "outbound slots one supplier may hold (default: limit - (suppliers - 1), so 4 of 6)",
    ),
    "suppliers_file": (
        str,
        "supplier catalogue, a TOML file (default: atlas, boreal, cedar under --provider-url)",
    ),
    "min_attempt_time": (float, "least budget a second attempt needs, seconds"),
    "hedge": (
        _boolean,
        "hedge every supplier without its own catalogue hedge key: a late first attempt is "
        "joined by the second (default: off)",
    ),
    "hedge_earn": (
        float,
        "hedge tokens a supplier earns per successful attempt, above 0, at most 1 (0.2)",
    ),
    "hedge_burst": (int, "hedge tokens a supplier may save up, 1 to 1000 (10)"),
    "pause_max": (
        float,
        "longest a supplier's 429 with Retry-After pauses it for every request, seconds (60)",
    ),
    "retry_budget_capacity": (float, "retries a supplier may spend in a burst (20)"),
    "retry_budget_earn": (float, "share of a retry each request earns (0.1)"),
    "body_timeout": (float, "seconds an inbound body may take to arrive (1.0)"),
    "header_timeout": (float, "seconds a request head may take to arrive, once begun (5)"),
    "idle_timeout": (float, "seconds a connection with no request in progress stays open (15)"),
    "max_connections": (
        int,
        "open connections per process; at the cap the longest-idle one is closed (1024)",
    ),
    "shutdown_drain": (float, "seconds /ready says 503 before the listener closes (0.5)"),
    "connect_timeout": (float, "socket connect timeout of one attempt, seconds"),
    "read_timeout": (float, "longest silence while reading an answer, seconds"),
    "max_supplier_body_bytes": (
        int,
        "cap on a supplier's decoded body, bytes; past it: invalid_data (default 65536)",
    ),
    "api_keys": (
        ApiKeys.from_file,
        "file of bearer keys for /api/quotes, one per line (default: no key needed)",
    ),
    "callers": (
        str,
        "TOML file of named callers: key, rate, seats; not with --api-keys-file (default: none)",
    ),
    "metrics_require_key": (_boolean, "/metrics needs a key too (with --api-keys-file)"),
    "redis_url": (
        str,
        "fleet mode: the Redis every worker shares, redis://host:port/db (default: none)",
    ),
    "redis_timeout": (float, "time limit of each Redis call, seconds; below the budget (0.05)"),
    "redis_prefix": (str, "prefix of QuoteFlow's Redis keys (quoteflow)"),
    "redis_sentinel": (
        addresses,
        "fleet mode through Redis Sentinel: HOST:PORT[,HOST:PORT...] of the sentinels; "
        "with --redis-master (default: none)",
    ),
    "redis_master": (str, "the primary's name the sentinels monitor (default: none)"),
    "redis_outage_grace": (
        float,
        "seconds the workers on Redis hold back the slots of one they lost (default 60)",
    ),
    "coalesce": (
        _boolean,
        "share a supplier call in flight with identical requests (default: off)",
    ),
    "cache_size": (
        int,
        "quotes kept as their suppliers' Cache-Control allows; 0: no cache (default 0)",
    ),
    "cache_max_age": (float, "cap on a supplier's max-age and stale-if-error, seconds (30)"),
    "console": (_boolean, "serve the console page at /console (default: off)"),
    "currency": (
        str,
        "ISO 4217 currency of answers and of suppliers that name none (default USD)",
    ),
    "fx_rates": (
        str,
        "ECB eurofxref-daily.xml rates: a file (re-read on SIGHUP) or an http(s) URL "
        "(default: none, foreign quotes are no_rate)",
    ),
    "fx_refresh": (float, "seconds between fetches of an --fx-rates URL (3600)"),
    "fx_max_age": (
        float,
        "seconds after publication (its date, 16:00 CET) rates stay usable (518400: 6 days)",
    ),
    "console_lab": (
        str,
        "provider lab whose faults and latency the console may switch, e.g. "
        "http://127.0.0.1:9101; needs --console (default: none)",
    ),
}

_FLAGS = {
    "max_supplier_body_bytes": "--max-supplier-body",
    "api_keys": "--api-keys-file",
    "suppliers_file": "--suppliers",
}
"""Flags whose name is not the setting's own."""

_ENV = {"suppliers_file": ENV_PREFIX + "SUPPLIERS_FILE", "callers": ENV_PREFIX + "CALLERS_FILE"}
"""Environment variables whose name is not their flag's (both name a file)."""


def flag(name: str) -> str:
    """The command-line flag of the setting ``name``."""
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def env_name(name: str) -> str:
    """The environment variable of the setting ``name``: its flag, upper-cased."""
    if name in _ENV:
        return _ENV[name]
    return ENV_PREFIX + flag(name).removeprefix("--").upper().replace("-", "_")


def env_names() -> list[str]:
    """Every environment variable QuoteFlow reads, in ``--help`` order."""
    return [env_name(name) for name in _OPTIONS]


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad command line is a ConfigError (one line), not usage and exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m quoteflow``; ``--help`` names each flag's variable."""
    found = _OneLineErrors(
        prog="quoteflow",
        description="QuoteFlow: the cheapest supplier quote within one time budget.",
        epilog="Every flag can also be set by its environment variable; a flag wins.",
    )
    for name, (convert, help_text) in _OPTIONS.items():
        # A switch is a bare flag; every other option takes a value.
        extra: dict[str, Any] = (
            {"action": "store_const", "const": "1"} if convert is _boolean else {}
        )
        found.add_argument(
            flag(name), dest=name, help=f"{help_text} [env {env_name(name)}]", **extra
        )
    return found


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build ``Settings`` from flags, then environment variables, then defaults."""
    args = parser().parse_args(argv)
    values: dict[str, Any] = {}
    for name, (convert, _) in _OPTIONS.items():
        raw = getattr(args, name)
        source = flag(name)
        env = env_name(name)
        if raw is None and env in environ:
            raw, source = environ[env], env
        if raw is None:
            continue
        try:
            # The callers file may name its keys' variables: it reads the same environment.
            values[name] = load_callers(raw, environ) if name == "callers" else convert(raw)
        except (ApiKeysError, ConfigError) as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except ValueError:
            raise ConfigError(
                f"{source}: {raw!r} is not a valid {convert.__name__.strip('_')}"
            ) from None
    if environ.get(SENTINEL_PASSWORD_ENV):
        values["redis_sentinel_password"] = environ[SENTINEL_PASSWORD_ENV]
    try:
        settings = Settings(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None
    if settings.fleet and importlib.util.find_spec("redis") is None:
        which = "--redis-sentinel" if settings.redis_sentinel else "--redis-url"
        raise ConfigError(f"{which} needs the Redis client: pip install 'quoteflow[fleet]'")
    return settings


def warn_unknown_variables(settings: Settings, environ: Mapping[str, str]) -> None:
    """One ``unknown_variables`` warning at start-up naming every one (none: nothing)."""
    unknown = unknown_variables(settings, environ)
    if unknown:
        fields = {"names": unknown, "hint": "misspelt? python -m quoteflow --help lists each one"}
        log_event(logging.getLogger("quoteflow"), logging.WARNING, "unknown_variables", fields)


def unknown_variables(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """``QUOTEFLOW_*`` variables that nothing reads: a misspelt setting, named at start-up.

    A variable the catalogue or callers file names (``${VAR}``, ``key_env``)
    may share the prefix: the files' text is searched for each name.
    """
    known = {*env_names(), *EXTRA_ENV}
    unknown = [name for name in environ if name.startswith(ENV_PREFIX) and name not in known]
    texts = []
    for path in (settings.suppliers_file, settings.callers and settings.callers.source):
        if path:
            try:
                with open(path, encoding="utf-8", errors="replace") as file:
                    texts.append(file.read())
            except OSError:
                pass  # its loader has said so already
    return sorted(name for name in unknown if not any(name in text for text in texts))


def loggable(settings: Settings, suppliers: Catalogue | None = None) -> dict[str, Any]:
    """The settings as the ``starting`` event shows them: a Redis password never reaches a log.

    With ``suppliers``, the catalogue too: header names, never their values.
    """
    fields = attrs.asdict(settings)
    if settings.redis_sentinel_password is not None:
        fields["redis_sentinel_password"] = "********"
    if settings.redis_url is not None:
        fields["redis_url"] = redact_url(settings.redis_url)
    if suppliers is not None:
        fields["suppliers"] = suppliers.public()
    return fields


def load_catalogue(settings: Settings, environ: Mapping[str, str]) -> Catalogue:
    """The catalogue ``settings`` name: its file, checked, or the three lab suppliers.

    ``environ`` resolves the file's ``${VAR}`` header values. A bad file is one
    ``ConfigError`` naming the file, the supplier and the field.
    """
    if settings.suppliers_file is None:
        return catalogue.default_catalogue(settings)
    try:
        found = catalogue.load(settings.suppliers_file, settings, environ)
    except CatalogueError as exc:
        raise ConfigError(f"supplier catalogue {exc}") from None
    return found


def settings_from_environ(environ: Mapping[str, str]) -> Settings:
    """``Settings`` from ``QUOTEFLOW_*`` variables alone (a gunicorn worker has no flags)."""
    return parse_settings([], environ)


GUNICORN_MASTER_ENV = "QUOTEFLOW_GUNICORN_MASTER"
"""Set by ``gunicorn_conf`` in gunicorn's master to its process id: its workers then know that
the master prepares host-wide metrics (not a setting: no flag, never set by hand)."""

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus-client's own variable: set, a process writes its metrics to files in it."""


def metrics_dir(environ: Mapping[str, str]) -> str | None:
    """The directory of host-wide metrics files, if prometheus-client's multiprocess mode is on.

    prometheus-client reads the same variable when it is first imported and from
    then on writes every metric value to a file there; QuoteFlow follows it, so
    the two never disagree.
    """
    return environ.get(METRICS_DIR_ENV) or None
