"""Command line and environment → ``Settings``; the only place that reads either."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import attrs
from aiohttp import web

from quoteflow import logs
from quoteflow.app import create_app
from quoteflow.auth import ApiKeys, ApiKeysError
from quoteflow.config import Settings, redact_url
from quoteflow.handlers import READY
from quoteflow.logs import log_event

log = logging.getLogger("quoteflow")


def _boolean(raw: str) -> bool:
    """An on/off value: the bare flag, or 1/true/yes/on and 0/false/no/off in the environment."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


# setting name → (environment variable or None, parser, help)
_OPTIONS: dict[str, tuple[str | None, Callable[[str], Any], str]] = {
    "host": (None, str, "address to listen on (default 127.0.0.1)"),
    "port": (None, int, "port to listen on (default 9100)"),
    "provider_url": ("QUOTEFLOW_PROVIDER_URL", str, "base URL of the suppliers"),
    "budget": ("QUOTEFLOW_BUDGET", float, "seconds per request, whatever happens (default 0.8)"),
    "inbound_limit": ("QUOTEFLOW_INBOUND_LIMIT", int, "requests served at once (default 8)"),
    "outbound_limit": (
        "QUOTEFLOW_OUTBOUND_LIMIT",
        int,
        "supplier attempts in flight at once (default 6)",
    ),
    "log_level": ("QUOTEFLOW_LOG_LEVEL", str, "debug, info, warning or error (default info)"),
    "log_format": ("QUOTEFLOW_LOG_FORMAT", str, "json (default) or text, on stderr"),
    "event_loop": (
        "QUOTEFLOW_EVENT_LOOP",
        str,
        "auto (default: uvloop if installed), asyncio, uvloop",
    ),
    "supplier_share": (None, int, "outbound slots one supplier may hold (default: limit / 3)"),
    "min_attempt_time": (None, float, "least budget a second attempt needs, seconds"),
    "retry_budget_capacity": (None, float, "retries a supplier may spend in a burst (20)"),
    "retry_budget_earn": (None, float, "share of a retry each request earns (0.1)"),
    "body_timeout": (None, float, "seconds an inbound body may take to arrive (1.0)"),
    "shutdown_drain": (None, float, "seconds /ready says 503 before the listener closes (0.5)"),
    "connect_timeout": (None, float, "socket connect timeout of one attempt, seconds"),
    "read_timeout": (None, float, "longest silence while reading an answer, seconds"),
    "max_supplier_body_bytes": (
        "QUOTEFLOW_MAX_SUPPLIER_BODY",
        int,
        "cap on a supplier's decoded body, bytes; past it: invalid_data (default 65536)",
    ),
    "api_keys": (
        "QUOTEFLOW_API_KEYS_FILE",
        ApiKeys.from_file,
        "file of bearer keys for /api/quotes, one per line (default: no key needed)",
    ),
    "metrics_require_key": (
        "QUOTEFLOW_METRICS_REQUIRE_KEY",
        _boolean,
        "/metrics needs a key too (with --api-keys-file)",
    ),
    "redis_url": (
        "QUOTEFLOW_REDIS_URL",
        str,
        "fleet mode: the Redis every worker shares, redis://host:port/db (default: none)",
    ),
    "redis_timeout": (
        "QUOTEFLOW_REDIS_TIMEOUT",
        float,
        "time limit of each Redis call, seconds; below the budget (0.05)",
    ),
    "redis_prefix": (
        "QUOTEFLOW_REDIS_PREFIX",
        str,
        "prefix of QuoteFlow's Redis keys (quoteflow)",
    ),
}

_FLAGS = {"max_supplier_body_bytes": "--max-supplier-body", "api_keys": "--api-keys-file"}
"""Flags whose name is not the setting's own."""


class _OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad command line is a ConfigError (one line), not usage and exit."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


class ConfigError(Exception):
    """A flag or environment variable has a value QuoteFlow cannot run with."""


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Build ``Settings`` from flags, then environment variables, then defaults."""
    parser = _OneLineErrors(prog="quoteflow", description=__doc__)
    for name, (env, convert, help_text) in _OPTIONS.items():
        suffix = f" [env {env}]" if env else ""
        # A switch is a bare flag; every other option takes a value.
        extra: dict[str, Any] = (
            {"action": "store_const", "const": "1"} if convert is _boolean else {}
        )
        parser.add_argument(_flag(name), dest=name, help=help_text + suffix, **extra)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    for name, (env, convert, _) in _OPTIONS.items():
        raw = getattr(args, name)
        source = _flag(name)
        if raw is None and env is not None and env in environ:
            raw, source = environ[env], env
        if raw is None:
            continue
        try:
            values[name] = convert(raw)
        except ApiKeysError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        except ValueError:
            raise ConfigError(
                f"{source}: {raw!r} is not a valid {convert.__name__.strip('_')}"
            ) from None
    try:
        settings = Settings(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None
    if settings.redis_url is not None and importlib.util.find_spec("redis") is None:
        raise ConfigError("--redis-url needs the Redis client: pip install 'quoteflow[fleet]'")
    return settings


def _flag(name: str) -> str:
    return _FLAGS.get(name, "--" + name.replace("_", "-"))


def main(argv: Sequence[str] | None = None) -> int:
    """Run QuoteFlow until interrupted; a bad setting exits 2 with one line."""
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"quoteflow: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    fields = attrs.asdict(settings)
    if settings.redis_url is not None:
        fields["redis_url"] = redact_url(settings.redis_url)  # a password never reaches a log
    log_event(log, logging.INFO, "starting", fields)
    try:
        loop = _new_event_loop(settings.event_loop)
    except ImportError:
        print("quoteflow: error: --event-loop uvloop: uvloop is not installed", file=sys.stderr)
        return 2
    try:
        _serve(settings, loop)
    except OSError as exc:  # address in use, unknown host, no permission
        where = f"{settings.host}:{settings.port}"
        print(f"quoteflow: error: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    log_event(log, logging.INFO, "stopped", {})
    return 0


def _serve(settings: Settings, loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_run(settings))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _run(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT; then drain, stop accepting and finish in-flight work.

    Shutdown in three steps, so that nothing in flight is lost:
    1. ``/ready`` turns 503 while QuoteFlow still serves, for ``shutdown_drain``
       seconds (a second signal cuts this short): load balancers stop sending.
    2. The listener closes; requests in flight finish, each within its budget.
    3. The ``ClientSession`` closes. The process exits 0.
    """
    app = create_app(settings)
    runner = web.AppRunner(
        app,
        access_log=None,
        # A caller that hangs up stops paying: its fan-out is cancelled at once.
        handler_cancellation=True,
        shutdown_timeout=settings.budget + 1.0,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
        loop = asyncio.get_running_loop()
        log_event(
            log,
            logging.INFO,
            "listening",
            {"url": f"http://{settings.host}:{settings.port}", "loop": type(loop).__module__},
        )
        signalled = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, signalled.set)
        await signalled.wait()
        signalled.clear()
        app[READY][0] = False
        log_event(log, logging.INFO, "draining", {"seconds": settings.shutdown_drain})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signalled.wait(), settings.shutdown_drain)
    finally:
        await runner.cleanup()


def _new_event_loop(choice: str) -> asyncio.AbstractEventLoop:
    """uvloop when asked for (or, with ``auto``, when installed), else asyncio's loop."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()
