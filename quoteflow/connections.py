"""Inbound connections that cannot be hoarded: a header timeout, an idle timeout and a cap.

aiohttp keeps an idle connection for its ``keepalive_timeout`` (3,630 s unless
told otherwise), has no time limit on a request head and no limit on the
number of connections: one client could hold every file descriptor QuoteFlow
has without ever sending a request. Three limits close that hole, each applied
where aiohttp builds a connection's protocol, so that ``python -m quoteflow``
(``cli``) and gunicorn's aiohttp worker (which makes its own ``SockSite`` per
listening socket from the runner we hand it) behave the same:

- **Idle timeout**: a connection with no request in progress is closed after
  ``idle_timeout``, counted from when it opened or its last answer went out.
  That is aiohttp's own ``keepalive_timeout``, which also covers a connection
  that never sends a byte; we only set it.
- **Header timeout**: from the first byte of a request head (on a new
  connection or between two keep-alive requests), the whole head must be in
  within ``header_timeout``; otherwise QuoteFlow answers 408 and closes.
  A body then has ``--body-timeout`` (``handlers``).
- **Connection cap**: at ``max_connections`` open connections, a new one is
  made room for by closing the one idle the longest (a connection whose head
  has only begun is idle too: no request exists yet), as nginx reuses its
  keep-alive connections. Only when every open connection has a request in
  progress does this process stop accepting (``AcceptGate``): new
  connections then wait in the kernel's listen backlog, costing nothing here,
  or go to another gunicorn worker sharing the socket. A request in progress
  is never cut.

A request pays two method calls (its head parsed, its answer out), a few
attribute checks (one asks whether the last request's body is all in: bytes
after an early answer are that body, not a head) and two ordered-dict
operations: ``GuardedServer`` keeps the idle connections in the order they
became idle (``busy``/``idle``), so making room takes the oldest in O(1)
instead of a scan of every connection. A head that arrives whole in one read,
as nearly all do, arms no timer.

What this leans on in aiohttp 3.x beyond its public API, each pinned by
``tests/test_connections.py`` on real sockets: a ``Server`` passes its
handler arguments (``_kwargs``) to every ``RequestHandler``; a handler counts
the heads it parsed (``_request_count``), queues them with their bodies
(``_messages``), calls ``log_access`` once per answer, and re-arms its
keep-alive check for ``_next_keepalive_close_time`` when it fires early; a
site keeps its server, TLS context and backlog (``_server``,
``_ssl_context``, ``_backlog``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import sys
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import attrs
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from quoteflow.config import Settings
from quoteflow.logs import log_event
from quoteflow.options import ConfigError

log = logging.getLogger("quoteflow")

# Reasons in quoteflow_connections_closed_total.
ROOM, HEAD_TIMEOUT = "room", "header_timeout"

_HEAD_TIMEOUT_BODY = (
    b'{"error":"header_timeout","detail":"the request head did not arrive in time"}'
)
HEAD_TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: application/json; charset=utf-8\r\n"
    b"Content-Length: " + str(len(_HEAD_TIMEOUT_BODY)).encode() + b"\r\n"
    b"Connection: close\r\n"
    b"\r\n" + _HEAD_TIMEOUT_BODY
)
"""What a connection whose head began but did not finish in time gets before it is closed."""


OTHER_DESCRIPTORS = 64
"""Descriptors a process needs besides its inbound and supplier connections: the
listener, the loop, standard streams, log and metrics files, a few spare."""


def reserve_descriptors(limits: ConnectionLimits, outbound_limit: int) -> None:
    """Make sure this process may open every connection the limits allow, or refuse to start.

    A cap above what the process may open would never act: the accept would
    fail first. Like Go's runtime, raise the soft ``RLIMIT_NOFILE`` up to what
    is needed when the hard limit allows it (1,024 is a common soft default).
    """
    if sys.platform == "win32":  # no RLIMIT_NOFILE there
        return
    import resource

    needed = limits.max_connections + outbound_limit + OTHER_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise ConfigError(
            f"max_connections {limits.max_connections} needs {needed} file descriptors"
            f" and this process may open {hard} (ulimit -Hn): lower it or raise that limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


@attrs.frozen(kw_only=True)
class ConnectionLimits:
    """The three limits of one process's inbound connections (validated in ``Settings``)."""

    header_timeout: float
    idle_timeout: float
    max_connections: int

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        """The limits ``settings`` asks for."""
        return cls(
            header_timeout=settings.header_timeout,
            idle_timeout=settings.idle_timeout,
            max_connections=settings.max_connections,
        )


class GuardedRunner(web.AppRunner):
    """An ``AppRunner`` whose connections keep to ``ConnectionLimits``.

    Whoever makes the sites (``cli``, or gunicorn's worker with its own
    ``SockSite``\\ s) gets the limits: they live in the protocol factory,
    ``runner.server``.
    """

    def __init__(self, app: web.Application, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=limits.idle_timeout, **kwargs)
        self.limits = limits
        self.gate = AcceptGate(self)

    @property
    def guarded(self) -> GuardedServer:
        """The protocol factory, once ``setup`` has made it."""
        server = self.server
        assert isinstance(server, GuardedServer), "setup() first"
        return server

    async def _make_server(self) -> web.Server:
        # aiohttp's Server, carrying the app's handler and every handler
        # argument, becomes a GuardedServer with the same arguments.
        plain = await super()._make_server()
        return GuardedServer(plain, self.limits, self.gate)

    async def cleanup(self) -> None:
        """Stop accepting for good (the listeners this runner re-opened too), then aiohttp's."""
        self.gate.close()
        await super().cleanup()


class GuardedServer(web.Server):
    """aiohttp's protocol factory, making ``GuardedHandler``\\ s and counting them.

    ``open`` counts connections that hold a socket and were not chosen to make
    room; ``_idle`` holds those of them with no request in progress, oldest
    first.
    """

    def __init__(self, plain: web.Server, limits: ConnectionLimits, gate: AcceptGate) -> None:
        super().__init__(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **plain._kwargs,
        )
        self.limit = limits.max_connections
        self.header_timeout = limits.header_timeout
        self.gate = gate
        gate.full = self.full
        self.open = 0
        self.closed: Counter[str] = Counter({ROOM: 0, HEAD_TIMEOUT: 0})
        """Connections QuoteFlow closed, by reason (``ROOM``, ``HEAD_TIMEOUT``)."""
        self._idle: OrderedDict[GuardedHandler, None] = OrderedDict()
        self._unreported: Counter[str] = Counter()
        self._reported_at = -math.inf

    def __call__(self) -> GuardedHandler:
        return GuardedHandler(self, loop=self._loop, **self._kwargs)

    def full(self) -> bool:
        """No room for one more connection: at the cap, and every connection has a request."""
        return self.open >= self.limit and not self._idle

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        """A new connection: make room for it if at the cap, and count it as idle."""
        super().connection_made(handler, transport)
        assert isinstance(handler, GuardedHandler)
        # While paused, what still arrives was accepted in the same batch
        # (asyncio's loop accepts several at a time): it waits with the rest.
        if self.open >= self.limit and not self.gate.paused:
            if self._idle:
                victim, _ = self._idle.popitem(last=False)
                self.end(victim, ROOM)
            else:
                # Every connection has a request: this one, already accepted,
                # stays (over the cap until one closes); the next ones wait in
                # the listen backlog.
                self.gate.pause()
        self.open += 1
        handler.counted = True
        # Idle, but no reason to accept again: only an answer sent or a
        # connection closed makes room that was not there.
        self._idle[handler] = None

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        """A connection closed, whoever closed it."""
        super().connection_lost(handler, exc)
        assert isinstance(handler, GuardedHandler)
        self._idle.pop(handler, None)
        if handler.counted:
            handler.counted = False
            self.open -= 1
        # Room, or an idle connection to make it (one accepted in the batch
        # that filled the last place, over the cap, and silent since).
        if self.gate.paused and not self.full():
            self.gate.resume()

    def idle(self, handler: GuardedHandler) -> None:
        """``handler``'s answer went out: the newest idle connection, and room if there was none."""
        handler.between_requests = True
        self._idle[handler] = None
        if self.gate.paused:
            self.gate.resume()

    def busy(self, handler: GuardedHandler) -> None:
        """A whole request head arrived on ``handler``: never closed to make room until answered."""
        handler.between_requests = False
        self._idle.pop(handler, None)
        if handler.head_timer is not None:
            handler.head_timer.cancel()
            handler.head_timer = None

    def end(self, handler: GuardedHandler, reason: str) -> None:
        """Close ``handler``, which has no request in progress (a 408 first if a head began)."""
        self._idle.pop(handler, None)
        if handler.counted:
            # Its socket closes on the loop's next turn; it no longer takes a place.
            handler.counted = False
            self.open -= 1
        self.closed[reason] += 1
        handler.end()
        self._report(reason)

    def _report(self, reason: str) -> None:
        # Under attack these come by the thousand: one summary a second at most.
        self._unreported[reason] += 1
        now = time.monotonic()
        if now - self._reported_at >= 1.0:
            fields = {**self._unreported, "open": self.open}
            self._unreported, self._reported_at = Counter(), now
            log_event(log, logging.INFO, "connections_closed", fields)


class GuardedHandler(RequestHandler):
    """aiohttp's protocol of one connection, telling its ``GuardedServer`` where it stands."""

    __slots__ = ("_body", "_guard", "between_requests", "counted", "head_timer")

    def __init__(self, guard: GuardedServer, **kwargs: Any) -> None:
        super().__init__(guard, **kwargs)
        self._guard = guard
        self.between_requests = True
        """No request in progress: a new head may begin (``GuardedServer`` keeps this)."""
        self.counted = False
        """Takes one of the ``max_connections`` places."""
        self.head_timer: asyncio.TimerHandle | None = None
        """Armed from a head's first byte until the head is whole."""
        self._body: Any = None
        """The body of the last request parsed (aiohttp's ``StreamReader``), once one was."""

    def data_received(self, data: bytes) -> None:
        """aiohttp parses ``data``; a head begun arms the header timer; a whole head stops it."""
        if not self.between_requests:  # a body, or a head pipelined behind a request
            super().data_received(data)
            return
        heads = self._request_count
        # An answer can go out before its request's body is all in (a 405, a
        # 413): what comes next is that body, not a head.
        in_body = self._body is not None and not self._body.is_eof()
        super().data_received(data)
        if self._request_count != heads:
            self._body = self._messages[-1][1]
            self._guard.busy(self)
        elif data and self.head_timer is None and not self._force_close and not in_body:
            self._head_began()

    def _head_began(self) -> None:
        timeout = self._guard.header_timeout
        self.head_timer = self._loop.call_later(timeout, self._head_late)
        # From a head's first byte the header timeout is the limit, not the
        # idle timeout: aiohttp's keep-alive check (which would close the
        # connection without a word) re-arms itself for this later time.
        later = self._loop.time() + 2 * timeout
        self._next_keepalive_close_time = max(self._next_keepalive_close_time, later)

    def log_access(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        """aiohttp calls this once per request, once its answer is out: the connection is idle."""
        super().log_access(request, response, time)
        # A request already parsed behind this one (pipelining) keeps it busy.
        if not self._messages and self.transport is not None:
            self._guard.idle(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        """The socket is gone: no header timeout to wait for, no body to remember."""
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        self._body = None  # it refers back to this handler: freed without waiting for the gc
        super().connection_lost(exc)

    def end(self) -> None:
        """Close now; a head that began gets its 408 first."""
        timer, self.head_timer = self.head_timer, None
        if timer is not None:
            timer.cancel()
            if self.transport is not None:
                self.transport.write(HEAD_TIMEOUT_ANSWER)
        self.force_close()

    def _head_late(self) -> None:
        # The timer is still set while the server ends this connection: the
        # head began, so a 408 goes out first.
        self._guard.end(self, HEAD_TIMEOUT)


class AcceptGate:
    """Stops and restarts accepting on every listening socket of one runner.

    Neither asyncio's loop nor uvloop can pause a listening server, only
    close it; gunicorn's worker made the sites, over sockets its master owns.
    So pausing keeps a duplicate of each listening socket's descriptor and
    closes the loop's server: the socket stays open and listening, and the
    kernel keeps new connections in its backlog (or hands them to another
    process sharing the socket). Resuming serves each duplicate with a new
    server, the same protocol factory, TLS context and backlog as the site's.
    Pausing is for when every connection has a request in progress, which
    lasts at most a budget or a body timeout, so it is rare and short.
    """

    def __init__(self, runner: web.BaseRunner) -> None:
        self._runner = runner
        self.full: Callable[[], bool] = lambda: False
        """Whether accepting one more connection would be over the cap (``GuardedServer``)."""
        self.paused = False
        self.pauses = 0
        """Times this gate stopped accepting."""
        self._closed = False
        # asyncio's or uvloop's Server (no common type with ``sockets``), its TLS context, backlog.
        self._servers: list[tuple[Any, Any, int]] | None = None
        """The servers accepting now (None: the sites' own)."""
        self._held: list[tuple[socket.socket, Any, int]] = []
        self._reopening: asyncio.Task[None] | None = None
        self._paused_at = 0.0

    def pause(self) -> None:
        """Stop accepting until ``resume``."""
        if self.paused or self._closed:
            return
        servers = self._servers
        if servers is None:
            # aiohttp keeps each site's server, TLS context and backlog private;
            # they are read here, once, and nowhere else.
            servers = [
                (site._server, site._ssl_context, site._backlog)
                for site in self._runner.sites
                if site._server is not None
            ]
        for server, tls, backlog in servers:
            for listening in server.sockets:
                held = socket.socket(fileno=os.dup(listening.fileno()))
                self._held.append((held, tls, backlog))
            server.close()
        self._servers = []
        self.paused = True
        self.pauses += 1
        self._paused_at = time.monotonic()
        log_event(log, logging.WARNING, "accepting_paused", {"reason": "all_connections_busy"})

    def resume(self) -> None:
        """Accept again, on the loop's next turns (opening a server awaits)."""
        if self.paused and self._reopening is None and not self._closed:
            self._reopening = asyncio.get_running_loop().create_task(self._reopen())

    async def _reopen(self) -> None:
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        try:
            while self._held:
                held, tls, backlog = self._held[-1]
                try:
                    # Made without serving, which does not wait: a ``close``
                    # cannot come between the server and our note of it.
                    opened = await loop.create_server(
                        server, sock=held, ssl=tls, backlog=backlog, start_serving=False
                    )
                except (OSError, ValueError) as exc:  # the socket, or a loop refusing it
                    # Still paused, the socket still held: the next answer or
                    # closed connection tries again.
                    log_event(log, logging.ERROR, "accepting_not_resumed", {"error": str(exc)})
                    return
                self._held.pop()
                assert self._servers is not None
                self._servers.append((opened, tls, backlog))
                await opened.start_serving()
        finally:
            self._reopening = None
        self.paused = False
        waited = round((time.monotonic() - self._paused_at) * 1000, 3)
        log_event(log, logging.INFO, "accepting_resumed", {"paused_ms": waited})
        if self.full():  # filled up again while the servers opened
            self.pause()

    def close(self) -> None:
        """Stop for good: close what this gate opened or holds (the sites close their own)."""
        self._closed = True
        if self._reopening is not None:
            self._reopening.cancel()
        for held, _, _ in self._held:
            held.close()
        self._held.clear()
        for opened, _, _ in self._servers or ():
            opened.close()
