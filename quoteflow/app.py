"""The composition root: ``create_app`` wires settings, session, client and service.

``gunicorn_app`` is the same app for gunicorn's aiohttp workers (fleet mode)::

    gunicorn -c python:quoteflow.gunicorn_conf quoteflow.app:gunicorn_app \
        --worker-class aiohttp.GunicornUVLoopWebWorker --workers 2 --bind 127.0.0.1:9100
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shlex
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from quoteflow import handlers, logs
from quoteflow.cache import CachingBatches, CachingGateway, QuoteCache
from quoteflow.callers import Callers, CallersFile, Gate, SharedMeter
from quoteflow.catalogue import MAX_SUPPLIERS, Catalogue
from quoteflow.coalesce import CoalescingGateway
from quoteflow.config import Settings
from quoteflow.connections import ConnectionLimits, GuardedRunner, reserve_descriptors
from quoteflow.console import add_console
from quoteflow.fleet import Coordinator, LoopFairTimeout
from quoteflow.fx import Rates, RatesFeed, RatesFile, check_rates_file, is_url
from quoteflow.hostmetrics import HostTelemetry
from quoteflow.logs import log_event
from quoteflow.observe import PlainGauge, ReadCounter, Telemetry
from quoteflow.offers import Pricing
from quoteflow.options import (
    GUNICORN_MASTER_ENV,
    ConfigError,
    load_catalogue,
    loggable,
    metrics_dir,
    settings_from_environ,
)
from quoteflow.pauses import Pauses
from quoteflow.reload import register
from quoteflow.retry import HedgeLimiter, RetryLimiter
from quoteflow.roster import SupplierRoster
from quoteflow.service import BatchGateway, CartSettings, QuoteService, SupplierGateway
from quoteflow.slots import OutboundLimiter, OutboundSlots
from quoteflow.supplier import SupplierClient, session_timeout
from quoteflow.tracing import TracingConfig, tracing_from_environ

if TYPE_CHECKING:
    from quoteflow.spans import Tracing

log = logging.getLogger("quoteflow")

SETTINGS = web.AppKey("settings", Settings)
SUPPLIER_CLIENT = web.AppKey("supplier_client", SupplierClient)
ROSTER = web.AppKey("roster", SupplierRoster)
"""The catalogue served now, and what reloads it."""
COORDINATOR = web.AppKey("coordinator", Coordinator)
"""Fleet mode only (``redis_url`` set): this worker's link to the others through Redis."""
SUPPLIER_RATES = web.AppKey("supplier_rates", SharedMeter)
"""Fleet mode only: each supplier's outbound rate, held in Redis for every worker."""
PAUSES = web.AppKey("pauses", Pauses)
"""Suppliers paused after a 429 with ``Retry-After``: one board for the process."""
RATES = web.AppKey("rates", Rates)
"""The exchange rates (``--fx-rates``); absent when none are configured."""
RATES_FEED = web.AppKey("rates_feed", RatesFeed)
"""The background fetches of an ``--fx-rates`` URL."""

GatewayFactory = Callable[[SupplierGateway], SupplierGateway]


WORKER_BOOT_ERROR = 3
"""The exit code gunicorn's master reads as "worker failed to boot": it stops, not respawns."""


def create_app(
    settings: Settings,
    *,
    catalogue: Catalogue | None = None,
    environ: Mapping[str, str] = os.environ,
    gateway: GatewayFactory | None = None,
    host_metrics: bool = False,
    tracing: TracingConfig | None = None,
) -> web.Application:
    """Build the QuoteFlow app; no I/O happens until it starts.

    ``catalogue``: the suppliers to ask, as ``options.load_catalogue`` read
    them from ``settings.suppliers_file``; left out, the three lab suppliers
    (it must be given when the settings name a file). With a file, a
    ``SIGHUP`` re-reads it (``roster.py``), resolving ``${VAR}`` from ``environ``.
    ``gateway`` wraps the supplier gateway the service would use (the real
    client, behind the cache and coalescing when they are on) — a seam for
    tests that need a supplier call to misbehave in ways no HTTP server can
    (a bug in our code).
    ``host_metrics``: ``/metrics`` reports every worker of the host
    (prometheus-client's multiprocess mode, ``hostmetrics.py``); the request
    path is the same either way.
    ``tracing``: OpenTelemetry spans (``tracing.tracing_from_environ``); None, off.
    """
    middlewares = [handlers.error_middleware]
    tracer: Tracing | None = None
    if tracing is not None:
        # Imported only when on: with tracing off, OpenTelemetry is never loaded.
        from quoteflow.spans import Tracing

        tracer = Tracing(tracing)
        middlewares.insert(0, tracer.middleware)  # outermost: it sees every answer
    callers = _callers(settings)
    if callers is not None:
        # Without keys there is nothing to check: no layer to pass per request.
        middlewares.append(handlers.auth_middleware)
    app = web.Application(client_max_size=settings.max_request_bytes, middlewares=middlewares)
    app[SETTINGS] = settings
    if catalogue is None:
        if settings.suppliers_file is not None:
            raise ValueError("create_app: pass the catalogue of settings.suppliers_file")
        catalogue = load_catalogue(settings, environ)  # the default: no file, no I/O
    roster = app[ROSTER] = SupplierRoster(settings, catalogue, environ)
    app[PAUSES] = Pauses(settings.pause_max)
    if settings.suppliers_file is not None:
        register(app, roster)
    app[handlers.BODY_TIMEOUT] = settings.body_timeout
    app[handlers.METRICS_NEED_KEY] = settings.metrics_require_key
    app[handlers.MAX_CART_LINES] = settings.max_cart_lines
    app.on_startup.append(_log_api_keys)
    if host_metrics:
        # No auto_describe: registering the multiprocess collector would read
        # every worker's files at boot, and a sibling booting at the same time
        # (gunicorn's HUP starts them together) may have an empty one yet:
        # struct.error, exit 3, and gunicorn halts the whole fleet.
        host = HostTelemetry(CollectorRegistry(auto_describe=False))
        # Before the session's context: its last flush comes after every request has finished.
        app.cleanup_ctx.append(host.flushing)
        app[handlers.TELEMETRY] = host
    else:
        app[handlers.TELEMETRY] = Telemetry(CollectorRegistry(auto_describe=True))
    if callers is not None:
        gate = app[handlers.GATE] = Gate(callers)
        app.on_response_prepare.append(handlers.caller_answered)
        app[handlers.TELEMETRY].watch_callers()
        if callers.source is not None:
            register(app, CallersFile(gate, callers.source, environ))
    _rates(app, settings)
    app[handlers.READY] = [True]
    app.on_shutdown.append(_stop_being_ready)
    if tracer is not None:
        app[handlers.CURRENT_TRACE] = tracer
        # Before the session: the last spans are flushed once every call has ended.
        app.cleanup_ctx.append(tracer.running)
    if settings.fleet:
        # Before the session: closed after it, once no attempt holds a slot.
        app.cleanup_ctx.append(_coordination)
    app.cleanup_ctx.append(_supplier_session(gateway, tracer))
    handlers.add_routes(app, callers=callers is not None)
    add_console(app, settings)
    return app


def _rates(app: web.Application, settings: Settings) -> None:
    """The exchange rates of ``--fx-rates``: a file read now (and on SIGHUP), or a URL's feed.

    A URL's first fetch and its refreshes run in a ``cleanup_ctx`` task of their
    own, with a client session of their own: no request ever waits for them.
    """
    source = settings.fx_rates
    if source is None:
        return
    rates = app[RATES] = Rates(settings.fx_max_age)
    feed = None
    if is_url(source):
        feed = app[RATES_FEED] = RatesFeed(source, rates, refresh=settings.fx_refresh)
        app.cleanup_ctx.append(feed.running)
    else:
        register(app, RatesFile(source, rates))
    app[handlers.TELEMETRY].watch_rates(
        published=lambda: 0.0 if rates.table is None else rates.table.published,
        fresh=lambda: 1.0 if rates.fresh() else 0.0,
        failures=lambda: {} if feed is None else feed.failures,
    )


def _callers(settings: Settings) -> Callers | None:
    """Who may call: the callers file, or each API key as an unnamed caller, or nobody asked."""
    if settings.api_keys is not None:
        return Callers.unnamed(settings.api_keys.digests)
    return settings.callers


async def _log_api_keys(app: web.Application) -> None:
    """One line at start-up saying whether callers need a key; never a key itself."""
    settings = app[SETTINGS]
    protected = ["/api/", "/metrics"] if settings.metrics_require_key else ["/api/"]
    if settings.callers is not None:
        named = [
            {
                "name": caller.name,
                "rate": None if caller.rate is None else str(caller.rate),
                "seats": caller.seats,
            }
            for caller in settings.callers
        ]
        log_event(log, logging.INFO, "callers_on", {"callers": named, "protected": protected})
    elif settings.api_keys is None:
        log_event(
            log,
            logging.WARNING,
            "api_keys_off",
            {"open": ["/api/quotes", "/metrics"], "enable": "--api-keys-file FILE"},
        )
    else:
        log_event(
            log,
            logging.INFO,
            "api_keys_on",
            {"keys": len(settings.api_keys), "protected": protected},
        )


async def _stop_being_ready(app: web.Application) -> None:
    # Shutdown has begun: in-flight requests finish, but balancers should stop sending.
    app[handlers.READY][0] = False


def begin_draining(app: web.Application) -> None:
    """Shutdown's first step: ``/ready`` answers 503 while every route still serves."""
    app[handlers.READY][0] = False
    log_event(log, logging.INFO, "draining", {"seconds": app[SETTINGS].shutdown_drain})


async def gunicorn_app() -> web.AppRunner:
    """QuoteFlow for one gunicorn aiohttp worker, configured by ``QUOTEFLOW_*`` variables only.

    The same settings as ``python -m quoteflow`` (``options.py``); gunicorn's
    own options decide where to listen (``gunicorn_conf`` makes
    ``QUOTEFLOW_HOST``/``QUOTEFLOW_PORT`` its default ``--bind``) and the
    event loop (the worker class). A bad value prints QuoteFlow's one-line
    error and exits with gunicorn's boot-error code, so the master stops
    with "Worker failed to boot." instead of starting workers that would fail
    the same way. ``/metrics`` reports the whole host, which needs the
    master to run ``gunicorn_conf`` (it prepares the shared metrics
    directory): a worker whose master did not refuses to boot the same way,
    its one line giving the command with the config added.
    """
    try:
        settings = settings_from_environ(os.environ)
        catalogue = load_catalogue(settings, os.environ)
        check_rates_file(settings.fx_rates)
        reserve_descriptors(ConnectionLimits.of(settings), settings.outbound_limit)
        tracing = tracing_from_environ(os.environ)
    except ConfigError as exc:
        _refuse_to_boot(str(exc))
    if os.environ.get(GUNICORN_MASTER_ENV) != str(os.getppid()):
        # Without gunicorn_conf nobody prepares the shared metrics files, and
        # each worker's /metrics would silently be its own share of the host.
        _refuse_to_boot(_without_config())
    logs.configure(settings.log_level, settings.log_format, process_ids=True)
    host_metrics = metrics_dir(os.environ) is not None
    fields = loggable(settings, catalogue)
    for gunicorns in ("host", "port", "event_loop"):  # gunicorn's options decide these
        del fields[gunicorns]
    log_event(
        log,
        logging.INFO,
        "starting",
        {**fields, "worker_pid": os.getpid(), "host_metrics": host_metrics},
    )
    return DrainingRunner(
        create_app(settings, catalogue=catalogue, host_metrics=host_metrics, tracing=tracing)
    )


def _refuse_to_boot(problem: str) -> NoReturn:
    """Print QuoteFlow's one-line error and exit with gunicorn's boot-error code.

    Every worker refuses at once: the line goes out in one ``write`` so that
    two workers' lines never interleave on the stderr they share.
    """
    os.write(sys.stderr.fileno(), f"quoteflow: error: {problem}\n".encode())
    raise SystemExit(WORKER_BOOT_ERROR)


def _without_config(argv: Sequence[str] = sys.argv) -> str:
    """Why a worker of a gunicorn started without ``gunicorn_conf`` refuses, and the command to run.

    A worker is a fork of its master: ``argv`` is the master's command line,
    given back with QuoteFlow's config in place of any other.
    """
    program = [sys.executable, "-m", "gunicorn"] if argv[0].endswith("__main__.py") else argv[:1]
    rest: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        if arg in ("-c", "--config"):
            next(args, None)
        elif not arg.startswith(("--config=", "-c")):
            rest.append(arg)
    command = [*program, "-c", "python:quoteflow.gunicorn_conf", *rest]
    return (
        "under gunicorn, /metrics adds up every worker only with QuoteFlow's gunicorn config;"
        f" start it with: {shlex.join(command)}"
    )


class ServingRunner(GuardedRunner):
    """The runner QuoteFlow serves with, under ``python -m quoteflow`` and gunicorn alike.

    Its connections keep to the header timeout, the idle timeout and the
    connection cap (``connections.py``), counted in ``/metrics``.
    """

    def __init__(self, app: web.Application) -> None:
        settings = app[SETTINGS]
        super().__init__(
            app,
            limits=ConnectionLimits.of(settings),
            access_log=None,
            # A caller that hangs up stops paying: its fan-out is cancelled at once.
            handler_cancellation=True,
            shutdown_timeout=settings.budget + 1.0,
        )

    async def setup(self) -> None:
        """Start the app, then show its connections in ``/metrics``."""
        await super().setup()
        server, gate = self.guarded, self.gate
        self.app[handlers.TELEMETRY].watch_connections(
            open_now=lambda: server.open,
            closed=lambda: server.closed,
            pauses=lambda: gate.pauses,
        )


class DrainingRunner(ServingRunner):
    """The runner of a gunicorn worker: it stops the way ``python -m quoteflow`` does.

    gunicorn's aiohttp worker stops its runner with ``cleanup()`` once it has
    seen SIGTERM (within a second: it checks on its heartbeat). Before the
    listener closes, ``/ready`` answers 503 for ``shutdown_drain`` seconds
    while everything else still serves; then aiohttp closes the listener and
    lets in-flight requests finish, each within its budget.
    """

    async def cleanup(self) -> None:
        """Drain, then stop as aiohttp does."""
        if self.server is not None:  # set up and serving
            begin_draining(self.app)
            await asyncio.sleep(self.app[SETTINGS].shutdown_drain)
        await super().cleanup()


async def _coordination(app: web.Application) -> AsyncIterator[None]:
    """Fleet mode: join the other workers through Redis, and leave them at shutdown.

    Starting opens no connection that could block: a Redis that is down at
    start-up only means this worker starts on its own (one attempt at a time) and joins later.
    """
    settings = app[SETTINGS]
    catalogue = app[ROSTER].catalogue
    # Each supplier's own share and retry bucket size go to Redis with every sync.
    coordinator = Coordinator(
        settings,
        suppliers=catalogue.names,
        shares=catalogue.shares(),
        capacities={s.name: s.retry_budget_capacity for s in catalogue.suppliers},
        hedges=catalogue.hedges(),
        pauses=app[PAUSES],
    )
    await coordinator.start()
    app[COORDINATOR] = coordinator
    telemetry = app[handlers.TELEMETRY]
    telemetry.watch_coordination(
        up=lambda: float(coordinator.up),
        leased=lambda: float(coordinator.slots.leased_total),
        workers=lambda: float(coordinator.workers),
        syncs=lambda: coordinator.syncs,
        events=lambda: {
            "switched": float(coordinator.switches),
            "past_grace": float(coordinator.past_grace),
        },
        host=socket.gethostname(),
        differ=lambda: float(bool(coordinator.hosts.differ)),
    )

    def fleet_meter(kind: str) -> SharedMeter:
        """Rates held for the whole fleet in Redis, on the coordinator's client."""
        return SharedMeter(
            coordinator.redis,
            prefix=settings.redis_prefix,
            # Redis' time limit; a late loop may stretch a call by as much again,
            # never past half the budget (the request pays for the wait).
            deadline=functools.partial(
                LoopFairTimeout,
                settings.redis_timeout,
                longest=min(2 * settings.redis_timeout, settings.budget / 2),
            ),
            workers=lambda: coordinator.workers,
            coordinated=lambda: coordinator.up,
            kind=kind,
        )

    app[SUPPLIER_RATES] = supplier_rates = fleet_meter("supplier")
    coordinator.on_switch.append(supplier_rates.void_leases)
    gate = app.get(handlers.GATE)
    if gate is not None:
        shared = gate.shared = fleet_meter("caller")
        coordinator.on_switch.append(shared.void_leases)
        telemetry.watch_caller_quota(lambda: shared.calls)
    try:
        yield
    finally:
        await coordinator.close()


def _limits(
    app: web.Application,
) -> tuple[OutboundLimiter, Mapping[str, RetryLimiter] | None, Mapping[str, HedgeLimiter] | None]:
    """The outbound slots, retry and hedge budgets: the fleet's when there is one, else in memory.

    ``None`` budgets: the supplier client makes each supplier's own.
    """
    coordinator = app.get(COORDINATOR)
    if coordinator is not None:
        return coordinator.slots, dict(coordinator.budgets), coordinator.hedge_budgets
    slots = OutboundSlots.of(app[SETTINGS], app[ROSTER].catalogue.shares())
    return slots, None, None


def _sharing(
    settings: Settings, client: SupplierClient, telemetry: Telemetry
) -> tuple[SupplierGateway, QuoteCache | None]:
    """``client`` behind the quote cache and coalescing, as configured, and the cache.

    With both off it is exactly ``client``. The cache comes first: a fresh
    quote answers without a shared call; a miss may then join one.
    """
    gateway: SupplierGateway = client
    if settings.coalesce:
        gateway = _coalescing(client, telemetry)
    if not settings.cache_size:
        return gateway, None
    cache = QuoteCache(
        settings.cache_size, settings.cache_max_age, per_quantity=client.priced_per_quantity
    )
    entries = PlainGauge("quoteflow_cache_entries", "Quotes in the cache now (--cache-size).")
    entries.readers[()] = lambda: float(len(cache))
    telemetry.sharing(
        entries,
        ReadCounter(
            "quoteflow_cache_answers",
            "Quotes answered from the cache, by supplier and how: fresh, or stale for a failure.",
            ("supplier", "how"),
            lambda: {key: float(n) for key, n in cache.served.items()},
        ),
    )
    return CachingGateway(gateway, cache), cache


def _coalescing(client: SupplierClient, telemetry: Telemetry) -> SupplierGateway:
    """``client`` behind coalescing, with its metrics."""
    coalescing = CoalescingGateway(client, client.priced_per_quantity)
    shared_calls = PlainGauge(
        "quoteflow_coalesced_calls_in_flight", "Shared supplier calls running now (--coalesce)."
    )
    shared_calls.readers[()] = lambda: float(coalescing.in_flight)
    telemetry.sharing(
        shared_calls,
        ReadCounter(
            "quoteflow_coalesced_joins",
            "Supplier calls not sent because an identical one was in flight (--coalesce).",
            ("supplier",),
            lambda: {(supplier,): float(n) for supplier, n in coalescing.joins.items()},
        ),
    )
    return coalescing


def _supplier_session(
    gateway: GatewayFactory | None,
    tracer: Tracing | None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        """The app's one ``ClientSession``, open from start-up to shutdown."""
        settings = app[SETTINGS]
        # Supplier attempts hold at most the outbound limit of connections (the
        # slots see to it); the room above it is for OAuth2 token fetches, at
        # most one per supplier, so that one never queues behind attempts.
        connector = aiohttp.TCPConnector(limit=settings.outbound_limit + MAX_SUPPLIERS)
        # The global timeouts; a supplier of the catalogue with its own has its own per request.
        timeout = session_timeout(settings.connect_timeout, settings.read_timeout, settings.budget)
        async with aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            trust_env=False,
            # One session serves every caller: a cookie one supplier answer
            # sets must not ride along on other callers' requests.
            cookie_jar=aiohttp.DummyCookieJar(),
        ) as session:
            # aiohttp silently re-sends an idempotent request once after a
            # dropped connection (aio-libs/aiohttp#10790): our two attempts
            # would become four on the wire. Only this private switch stops it.
            session._retry_connection = False
            slots, budgets, hedge_budgets = _limits(app)
            roster = app[ROSTER]
            client = SupplierClient(
                session,
                settings,
                roster.catalogue,
                slots=slots,
                retry_budgets=budgets,
                hedge_budgets=hedge_budgets,
                attempts=tracer,
                keep_cache_control=settings.cache_size > 0,
                pauses=app[PAUSES],
                rates=app.get(SUPPLIER_RATES),
            )
            telemetry = app[handlers.TELEMETRY]
            shared, cache = _sharing(settings, client, telemetry)
            batches: BatchGateway = client if cache is None else CachingBatches(client, cache)
            if tracer is not None:
                batches = tracer.batches(batches)
            supplier_gateway: SupplierGateway = gateway(shared) if gateway else shared
            if tracer is not None:
                # Outermost: a request's span for each supplier, joined or cached too.
                supplier_gateway = tracer.gateway(supplier_gateway)
            service = QuoteService(
                supplier_gateway,
                roster.lineup(telemetry),
                budget=settings.budget,
                inbound_limit=settings.inbound_limit,
                answer_reserve=settings.answer_reserve,
                stale_quotes=cache,
                circuit_open=None if tracer is None else tracer.circuit_open,
                carts=CartSettings(
                    budget=settings.cart_budget,
                    limit=settings.cart_limit,
                    batches=batches,
                ),
                pricing=Pricing(settings.currency, {}, app.get(RATES)),
            )
            app[SUPPLIER_CLIENT] = client
            app[handlers.SERVICE] = service
            telemetry.watch(inbound=lambda: service.in_flight, outbound=lambda: client.in_flight)
            roster.wire(
                client,
                service,
                telemetry,
                slots=slots if isinstance(slots, OutboundSlots) else None,
                coordinator=app.get(COORDINATOR),
            )
            telemetry.add(
                ReadCounter(
                    "quoteflow_token_fetches",
                    "OAuth2 token requests, by supplier and outcome (ok, refused, error, timeout).",
                    ("supplier", "outcome"),
                    lambda: {key: float(n) for key, n in client.token_fetches.items()},
                )
            )
            pauses = app[PAUSES]
            paused = PlainGauge(
                "quoteflow_supplier_pause_seconds",
                "Seconds left of each supplier's pause after a 429 with Retry-After.",
                ("supplier",),
                host_mode="livemax",  # paused on one worker is paused on all, as Redis tells them
            )

            def show_pause(supplier: str) -> None:
                paused.readers.setdefault((supplier,), functools.partial(pauses.left, supplier))

            pauses.on_start = show_pause
            telemetry.add(
                paused,
                ReadCounter(
                    "quoteflow_supplier_pauses",
                    "Pauses of a supplier that answered a 429 with Retry-After, as they began.",
                    ("supplier",),
                    lambda: {(s,): float(n) for s, n in pauses.started.items()},
                ),
            )
            try:
                yield
            finally:
                roster.stop()
                pauses.close()
                await client.close()

    return session_ctx
