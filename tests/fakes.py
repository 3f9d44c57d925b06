"""Scripted fake suppliers: a real aiohttp server on 127.0.0.1 that records what arrives.

Each supplier has a script, a list of responders used one per request; when
the script runs out, the supplier's default responder answers. Faults are
real bytes and real socket behaviour, never a mocked client.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from aiohttp import web

Responder = Callable[[web.Request], Awaitable[web.StreamResponse]]

CATALOGUE: dict[str, dict[str, int]] = {
    "atlas": {"unit_cents": 1200, "shipping_cents": 300, "stock": 20},
    "boreal": {"unit_cents": 1100, "shipping_cents": 250, "stock": 50},
    "cedar": {"unit_cents": 900, "shipping_cents": 200, "stock": 1},
}
"""At quantity 2: boreal 2450, atlas 2700, cedar filtered out (stock 1)."""


def payload(supplier: str, sku: str = "KB-001", **overrides: Any) -> dict[str, Any]:
    """A valid wire quote for ``supplier``, with fields replaced by ``overrides``."""
    return {"supplier": supplier, "sku": sku, **CATALOGUE[supplier], **overrides}


@attrs.frozen
class Received:
    """One request as the fake supplier saw it."""

    supplier: str
    request_id: str | None
    query: dict[str, str]
    headers: dict[str, str]
    at: float
    """Event-loop clock time of arrival."""


# -- responders ------------------------------------------------------------------


def quote(**overrides: Any) -> Responder:
    """200 with this supplier's catalogue quote for the SKU asked."""

    async def respond(request: web.Request) -> web.StreamResponse:
        supplier = request.match_info["supplier"]
        return web.json_response(payload(supplier, request.query["sku"], **overrides))

    return respond


def cacheable(cache_control: str, **headers: str) -> Responder:
    """200 with the catalogue quote, ``Cache-Control: <cache_control>`` and ``headers``."""

    async def respond(request: web.Request) -> web.StreamResponse:
        supplier = request.match_info["supplier"]
        body = payload(supplier, request.query["sku"])
        return web.json_response(body, headers={"Cache-Control": cache_control, **headers})

    return respond


def status(code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Responder:
    """A bare answer with ``code``."""

    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, body=body, headers=headers)

    return respond


def raw(body: bytes, *, content_type: str = "application/json", **headers: str) -> Responder:
    """200 with exactly ``body``."""

    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers={"Content-Type": content_type, **headers})

    return respond


def json_body(obj: Any) -> Responder:
    """200 with ``obj`` serialised as JSON."""
    return raw(json.dumps(obj).encode())


def bad_gzip() -> Responder:
    """200 claiming gzip, with bytes that are not gzip."""
    return raw(b"this is not gzip at all" * 4, **{"Content-Encoding": "gzip"})


def gzipped(obj: Any) -> Responder:
    """200 with ``obj`` as correctly gzipped JSON."""
    return raw(gzip.compress(json.dumps(obj).encode()), **{"Content-Encoding": "gzip"})


def first_time_per_request_id(first: Responder, then: Responder | None = None) -> Responder:
    """``first`` the first time a request id is seen, ``then`` after (the lab's flaky)."""
    seen: set[str | None] = set()
    after = then or quote()

    async def respond(request: web.Request) -> web.StreamResponse:
        request_id = request.headers.get("X-Request-ID")
        if request_id in seen:
            return await after(request)
        seen.add(request_id)
        return await first(request)

    return respond


def delay(seconds: float, then: Responder | None = None) -> Responder:
    """Wait ``seconds`` before answering (default: the catalogue quote)."""
    after = then or quote()

    async def respond(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await after(request)

    return respond


def before_the_deadline(margin: float, then: Responder) -> Responder:
    """Answer ``then`` ``margin`` s before QuoteFlow's deadline, as the attempt states it.

    Timed from ``X-Deadline-Remaining-Ms``, not from the call's arrival: on a
    loaded machine a call may arrive tens of milliseconds after QuoteFlow sent
    it, and a fixed delay would then answer after the deadline it was to precede.
    """

    async def respond(request: web.Request) -> web.StreamResponse:
        remaining = int(request.headers["X-Deadline-Remaining-Ms"]) / 1000
        await asyncio.sleep(max(0.0, remaining - margin))
        return await then(request)

    return respond


def hang() -> Responder:
    """Never answer; the handler is cancelled when the client goes away."""
    return delay(3600)


def truncated() -> Responder:
    """Headers promise 200 bytes; half a body arrives and the connection closes."""

    async def respond(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 200
        await response.prepare(request)
        await response.write(b'{"supplier": "boreal", "sku": "KB')
        assert request.transport is not None
        request.transport.close()
        return response

    return respond


def reset() -> Responder:
    """The connection is reset (TCP RST) before any answer."""

    async def respond(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
        raise asyncio.CancelledError  # nothing left to answer on

    return respond


def close() -> Responder:
    """The connection is closed cleanly with no answer at all."""

    async def respond(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        raise asyncio.CancelledError

    return respond


# -- the server --------------------------------------------------------------------


class FakeSuppliers:
    """All three suppliers behind one base URL, each with its own script."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Responder]] = {s: [] for s in CATALOGUE}
        self.defaults: dict[str, Responder] = {s: quote() for s in CATALOGUE}
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_of: dict[str, int] = dict.fromkeys(CATALOGUE, 0)
        self.max_in_flight_of: dict[str, int] = dict.fromkeys(CATALOGUE, 0)
        self.url = ""
        """Base URL, known once the server is listening."""
        self.app = web.Application()
        self.app.router.add_get("/quotes/{supplier}", self._handle)

    def script(self, supplier: str, *responders: Responder) -> None:
        """Answer the next requests to ``supplier`` with ``responders``, in order."""
        self.scripts[supplier].extend(responders)

    def always(self, supplier: str, responder: Responder) -> None:
        """Answer every request to ``supplier`` with ``responder`` once its script is used."""
        self.defaults[supplier] = responder

    def count(self, supplier: str) -> int:
        """How many requests reached ``supplier``."""
        return sum(1 for r in self.received if r.supplier == supplier)

    def of(self, supplier: str) -> list[Received]:
        """The requests that reached ``supplier``, in arrival order."""
        return [r for r in self.received if r.supplier == supplier]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        supplier = request.match_info["supplier"]
        self.received.append(
            Received(
                supplier,
                request.headers.get("X-Request-ID"),
                dict(request.query),
                dict(request.headers),
                asyncio.get_running_loop().time(),
            )
        )
        script = self.scripts.get(supplier)
        if script is None:
            return web.json_response({"error": "unknown supplier"}, status=404)
        responder = script.pop(0) if script else self.defaults[supplier]
        self.in_flight += 1
        self.in_flight_of[supplier] += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.max_in_flight_of[supplier] = max(
            self.max_in_flight_of[supplier], self.in_flight_of[supplier]
        )
        try:
            return await responder(request)
        finally:
            self.in_flight -= 1
            self.in_flight_of[supplier] -= 1
