"""The composition root: ``create_app`` wires settings, session, client and service."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from quoteflow import handlers
from quoteflow.breaker import Breakers
from quoteflow.config import SUPPLIERS, Settings
from quoteflow.logs import log_event
from quoteflow.observe import Telemetry
from quoteflow.service import QuoteService, SupplierGateway
from quoteflow.supplier import SupplierClient

log = logging.getLogger("quoteflow")

SETTINGS = web.AppKey("settings", Settings)
SUPPLIER_CLIENT = web.AppKey("supplier_client", SupplierClient)

GatewayFactory = Callable[[SupplierClient], SupplierGateway]


def create_app(settings: Settings, *, gateway: GatewayFactory | None = None) -> web.Application:
    """Build the QuoteFlow app; no I/O happens until it starts.

    ``gateway`` wraps the real supplier client — a seam for tests that need a
    supplier call to misbehave in ways no HTTP server can (a bug in our code).
    """
    middlewares = [handlers.error_middleware]
    if settings.api_keys is not None:
        # Without keys there is nothing to check: no layer to pass per request.
        middlewares.append(handlers.auth_middleware)
    app = web.Application(client_max_size=settings.max_request_bytes, middlewares=middlewares)
    app[SETTINGS] = settings
    app[handlers.BODY_TIMEOUT] = settings.body_timeout
    if settings.api_keys is not None:
        app[handlers.API_KEYS] = settings.api_keys
    app[handlers.METRICS_NEED_KEY] = settings.metrics_require_key
    app.on_startup.append(_log_api_keys)
    app[handlers.TELEMETRY] = Telemetry(CollectorRegistry(auto_describe=True))
    app[handlers.READY] = [True]
    app.on_shutdown.append(_stop_being_ready)
    app.cleanup_ctx.append(_supplier_session(gateway))
    handlers.add_routes(app)
    return app


async def _log_api_keys(app: web.Application) -> None:
    """One line at start-up saying whether callers need a key; never a key itself."""
    settings = app[SETTINGS]
    if settings.api_keys is None:
        log_event(
            log,
            logging.WARNING,
            "api_keys_off",
            {"open": ["/api/quotes", "/metrics"], "enable": "--api-keys-file FILE"},
        )
    else:
        protected = ["/api/", "/metrics"] if settings.metrics_require_key else ["/api/"]
        log_event(
            log,
            logging.INFO,
            "api_keys_on",
            {"keys": len(settings.api_keys), "protected": protected},
        )


async def _stop_being_ready(app: web.Application) -> None:
    # Shutdown has begun: in-flight requests finish, but balancers should stop sending.
    app[handlers.READY][0] = False


def _supplier_session(
    gateway: GatewayFactory | None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        """The app's one ``ClientSession``, open from start-up to shutdown."""
        settings = app[SETTINGS]
        connector = aiohttp.TCPConnector(limit=settings.outbound_limit)
        timeout = aiohttp.ClientTimeout(
            total=None,  # a total timeout can eat the request deadline's cancellation
            sock_connect=settings.connect_timeout,
            # A read timeout at or past the budget can never fire before the
            # deadline does: then no timer, instead of one re-armed per read.
            sock_read=settings.read_timeout if settings.read_timeout < settings.budget else None,
        )
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
            client = SupplierClient(session, settings)
            telemetry = app[handlers.TELEMETRY]
            breakers = None
            if settings.breaker_failures:
                breakers = Breakers(
                    SUPPLIERS,
                    failures_to_open=settings.breaker_failures,
                    open_time=settings.breaker_open,
                    open_max=settings.breaker_open_max,
                    listener=telemetry.circuit_moved,
                )
            service = QuoteService(
                gateway(client) if gateway else client,
                budget=settings.budget,
                inbound_limit=settings.inbound_limit,
                answer_reserve=settings.answer_reserve,
                breakers=breakers,
            )
            app[SUPPLIER_CLIENT] = client
            app[handlers.SERVICE] = service
            telemetry.watch(
                inbound=lambda: service.in_flight,
                outbound=lambda: client.in_flight,
                retry_tokens=client.retry_tokens,
                circuit_state=None if breakers is None else breakers.state,
            )
            yield

    return session_ctx
