"""The composition root: ``create_app(config)`` builds the lab; it does no I/O."""

from __future__ import annotations

import ipaddress
import json

from aiohttp import web
from aiohttp.typedefs import Handler

from provider_lab import control, dialects, fx, handlers, oauth2
from provider_lab.state import STATE, LabConfig, LabState

# Paths anyone who can reach the lab may use; everything else is the control API.
PUBLIC_PREFIXES = ("/quotes/", "/health", "/json/", "/path/", "/batch/")
TOKEN_PATH = "/oauth2/token"  # exactly: /oauth2 and /oauth2/tokens are control paths
# The rates feed is public at exactly fx.FEED_PATH: /fx is its control path.


def is_loopback(remote: str | None) -> bool:
    """Whether ``remote`` (a peer address) is this machine: 127.0.0.0/8, ::1, or v4-mapped."""
    if remote is None:
        return False
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False  # a Unix socket or an unparsable peer is not trusted
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@web.middleware
async def loopback_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse the control API to anyone but a loopback client (the peer address, no headers)."""
    if (
        not request.path.startswith(PUBLIC_PREFIXES)
        and request.path not in (TOKEN_PATH, fx.FEED_PATH)
        and not is_loopback(request.remote)
    ):
        raise web.HTTPForbidden(
            text=json.dumps({"error": "loopback_only", "remote": request.remote}),
            content_type="application/json",
        )
    return await handler(request)


async def health(request: web.Request) -> web.Response:
    """Readiness probe."""
    return web.json_response({"status": "ok"})


def create_app(config: LabConfig | None = None) -> web.Application:
    """Build the lab: the suppliers in their four dialects, the token endpoint, the rates
    feed, the control API and their shared state."""
    app = web.Application(middlewares=[loopback_only])
    state = app[STATE] = LabState(config or LabConfig())
    app[fx.FX] = state.fx
    app.router.add_get("/health", health)
    app.router.add_get("/quotes/{supplier}", handlers.quote)
    app.router.add_post("/json/{supplier}/quote", dialects.json_quote)
    app.router.add_get("/path/{supplier}/parts/{sku}/price", dialects.path_quote)
    app.router.add_post("/batch/{supplier}/match", dialects.batch_match)
    app.router.add_get("/batch/{supplier}/parts", dialects.batch_parts)
    app.router.add_post(TOKEN_PATH, oauth2.token)
    app.router.add_get(fx.FEED_PATH, fx.feed)
    app.on_shutdown.append(fx.stopping)
    control.add_routes(app.router)
    return app
