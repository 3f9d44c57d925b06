"""``python -m quoteflow``: settings from flags and environment (``options.py``), then serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from quoteflow import cart_cli, logs
from quoteflow.app import ServingRunner, begin_draining, create_app
from quoteflow.catalogue import Catalogue
from quoteflow.config import Settings
from quoteflow.connections import ConnectionLimits, reserve_descriptors
from quoteflow.fx import check_rates_file
from quoteflow.logs import log_event
from quoteflow.options import (
    ConfigError,
    load_catalogue,
    loggable,
    parse_settings,
    warn_unknown_variables,
)
from quoteflow.reload import reload_all
from quoteflow.tracing import TracingConfig, tracing_from_environ

__all__ = ["ConfigError", "main", "parse_settings"]

log = logging.getLogger("quoteflow")


def main(argv: Sequence[str] | None = None) -> int:
    """Run QuoteFlow until interrupted; a bad setting exits 2 with one line.

    ``quoteflow cart FILE ...`` is a command of its own (``cart_cli``): a BOM
    quoted by a running QuoteFlow, read before any of the service's options.
    """
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "cart":
        return cart_cli.main(args[1:])
    try:
        settings = parse_settings(args, os.environ)
        catalogue = load_catalogue(settings, os.environ)
        check_rates_file(settings.fx_rates)
        reserve_descriptors(ConnectionLimits.of(settings), settings.outbound_limit)
        tracing = tracing_from_environ(os.environ)
    except ConfigError as exc:
        print(f"quoteflow: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    log_event(log, logging.INFO, "starting", loggable(settings, catalogue))
    warn_unknown_variables(settings, os.environ)
    try:
        loop = _new_event_loop(settings.event_loop)
    except ImportError:
        print("quoteflow: error: --event-loop uvloop: uvloop is not installed", file=sys.stderr)
        return 2
    try:
        _serve(settings, catalogue, tracing, loop)
    except OSError as exc:  # address in use, unknown host, no permission
        where = f"{settings.host}:{settings.port}"
        print(f"quoteflow: error: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    log_event(log, logging.INFO, "stopped", {})
    return 0


def _serve(
    settings: Settings,
    catalogue: Catalogue,
    tracing: TracingConfig | None,
    loop: asyncio.AbstractEventLoop,
) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_run(settings, catalogue, tracing))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _run(
    settings: Settings, catalogue: Catalogue, tracing: TracingConfig | None = None
) -> None:
    """Serve until SIGTERM or SIGINT; then drain, stop accepting and finish in-flight work.

    SIGHUP re-reads the files QuoteFlow serves from (``reload.py``).

    Shutdown in three steps, so that nothing in flight is lost:
    1. ``/ready`` turns 503 while QuoteFlow still serves, for ``shutdown_drain``
       seconds (a second signal cuts this short): load balancers stop sending.
    2. The listener closes; requests in flight finish, each within its budget.
    3. The ``ClientSession`` closes. The process exits 0.
    """
    app = create_app(settings, catalogue=catalogue, tracing=tracing)
    runner = ServingRunner(app)
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
        # Re-read the catalogue and callers files: new requests use what they say.
        loop.add_signal_handler(signal.SIGHUP, reload_all, app)
        await signalled.wait()
        signalled.clear()
        begin_draining(app)
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
