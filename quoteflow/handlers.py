"""HTTP in and out: the only module that knows ``web.HTTP*``.

Handlers parse the request, call the service and shape the answer. Every error
a caller can cause, and every bug of ours, leaves through ``error_middleware``
as a JSON body — never as HTML or a traceback — carrying the request's id.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any, Protocol, TypedDict

import attrs
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST

from quoteflow.apidoc import openapi_document
from quoteflow.bom import CsvCart, basket_csv, csv_body_cap, decode_csv_cart
from quoteflow.callers import QUOTA_EXCEEDED, SEATS_EXCEEDED, Caller, Gate, Pass
from quoteflow.codec import (
    decode_cart,
    decode_currency,
    decode_request,
    encode_cart,
    encode_cart_explain,
    encode_errors,
    encode_explain,
    encode_result,
    to_json,
)
from quoteflow.errors import (
    BadRequestBody,
    CapacityExhausted,
    FieldError,
    InvalidRequest,
    QuotaExceeded,
    SeatsExceeded,
    SlowRequestBody,
    Unauthenticated,
)
from quoteflow.models import QuoteReport
from quoteflow.observe import BUSY, ERROR, INVALID, OK, Telemetry
from quoteflow.service import QuoteService
from quoteflow.waterfall import render_cart, render_quote

SERVICE = web.AppKey("service", QuoteService)
"""The one ``QuoteService`` of the app, wired at start-up."""
TELEMETRY = web.AppKey("telemetry", Telemetry)
READY = web.AppKey("ready", list[bool])
"""``[True]`` while serving; flipped when shutdown begins."""
REQUEST_ID = web.RequestKey("request_id", str)


class CurrentTrace(Protocol):
    """The trace of the request being served (tracing, ``spans.Tracing``)."""

    def trace_id(self) -> str | None:
        """Its trace id, 32 hex digits."""
        ...


CURRENT_TRACE = web.AppKey("current_trace", CurrentTrace)
"""Set only when tracing is on: the bill names the request's trace."""
BODY_TIMEOUT = web.AppKey("body_timeout", float)
"""Seconds an inbound body may take to arrive."""
GATE = web.AppKey("gate", Gate)
"""Set only when keys are configured (callers or API keys): then every ``/api/`` route needs one."""
CALLER = web.RequestKey("caller", Caller)
"""Who the request's key says it is (set by ``auth_middleware``)."""
PASS = web.RequestKey("pass", Pass)
"""The quote request's way through its caller's seats and rate (``quotes_for_caller``)."""
METRICS_NEED_KEY = web.AppKey("metrics_need_key", bool)
MAX_CART_LINES = web.AppKey("max_cart_lines", int)
"""Most lines a cart may have; its body may be ``cart_body_cap`` bytes."""

_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

_routes = web.RouteTableDef()

_ERROR_NAMES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}
"""Stable ``error`` names for aiohttp's own answers (HTTP reason phrases vary by Python)."""


def _snake(reason: str) -> str:
    return reason.lower().replace(" ", "_")


@_routes.get("/health")
async def health(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return _json({"status": "ok"})


@_routes.get("/ready")
async def ready(request: web.Request) -> web.Response:
    """Readiness: 200 while serving, 503 once shutdown has begun."""
    if request.app[READY][0]:
        return _json({"status": "ready"})
    return _json({"status": "shutting_down"}, status=503)


@_routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition of this app's metrics (the host's, under gunicorn)."""
    body = request.app[TELEMETRY].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@_routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    """QuoteFlow's OpenAPI document, naming the suppliers of the catalogue served now."""
    suppliers = request.app[SERVICE].lineup.suppliers
    document = openapi_document(suppliers, request.app[MAX_CART_LINES])
    return web.Response(body=document, content_type="application/json")


async def quotes(request: web.Request) -> web.Response:
    """The cheapest usable quote for a SKU and quantity, with every supplier failure.

    ``?explain=1`` adds the budget bill: every attempt of every supplier;
    ``?explain=svg`` answers with the bill drawn instead (``waterfall.py``).
    """
    service = request.app[SERVICE]
    # Under overload a refusal must cost as little as possible: refuse before
    # the body is read. The slot itself is taken only once the body is in, so
    # a caller that sends it slowly never holds one.
    service.ensure_capacity()
    quote_request = decode_request(await _read_body(request))
    _answerable(service, quote_request.currency)
    with service.admitted() as admitted_at:
        report = await service.quote(quote_request, request[REQUEST_ID], admitted_at)
    return _answer(request, report)


async def quotes_for_caller(request: web.Request) -> web.Response:
    """``quotes`` when keys are configured: through the caller's seats and rate first.

    Registered instead of ``quotes`` at start-up, so that without keys a
    request does nothing of this. Refused (429, or 503 when the inbound limit
    is full), the request holds nothing and its body is never read.
    """
    service = request.app[SERVICE]
    gate_pass = request[PASS] = Pass(request.app[GATE], request[CALLER])
    await gate_pass.enter(service.ensure_capacity)
    try:
        quote_request = decode_request(await _read_body(request))
        _answerable(service, quote_request.currency)
        with service.admitted() as admitted_at:
            # A fleet-wide rate's round trip came before admission: the budget pays for it.
            since = admitted_at - gate_pass.waited
            name = gate_pass.caller.name
            report = await service.quote(quote_request, request[REQUEST_ID], since, caller=name)
    finally:
        gate_pass.leave()
    return _answer(request, report)


def _answerable(service: QuoteService, currency: str | None) -> None:
    """A request's ``currency`` must be the default or one the rates table knows (else 422)."""
    if currency is not None and not service.answers_in(currency):
        problem = f"{currency} is neither {service.currency} (--currency) nor in the rates table"
        raise InvalidRequest([FieldError(("currency",), problem)])


def cart_body_cap(max_lines: int) -> int:
    """Bytes a cart's body may have: 1 KiB + 1 KiB per allowed line.

    Room for a cart of plain SKUs with four alternates and a ref of 500
    characters on every line (about 900 bytes a line); a cart of long SKUs
    or refs in escaped non-ASCII text may not fit, and is told so with a 413.
    """
    return 1024 + 1024 * max_lines


async def carts(request: web.Request) -> web.Response:
    """A whole bill of materials: every line's quotes, and the cheapest basket.

    Carts have seats of their own (``--cart-limit``) and never take a single
    quote's; ``?explain=1`` adds the cart's bill. With callers configured, a
    cart takes one of its caller's seats and one unit of its rate per SKU
    (a line's alternates count).
    """
    service = request.app[SERVICE]
    given = request.headers.get(hdrs.CONTENT_TYPE)
    kind = None if given is None else request.content_type
    if kind not in _CART_TYPES:
        return _error(415, "unsupported_media_type", accepted=sorted(_CART_TYPES - {None}))
    service.ensure_cart_capacity()
    max_lines = request.app[MAX_CART_LINES]
    from_file: CsvCart | None = None
    if kind == CSV:
        from_file = decode_csv_cart(await _read_body(request, csv_body_cap(max_lines)), max_lines)
        cart = from_file.cart
        if "currency" in request.query:  # a CSV file has no key for it: ``?currency=``
            try:
                currency = decode_currency(request.query["currency"])
            except (TypeError, ValueError) as exc:
                raise InvalidRequest([FieldError(("currency",), str(exc))]) from None
            cart = attrs.evolve(cart, currency=currency)
    else:
        cart = decode_cart(await _read_body(request, cart_body_cap(max_lines)), max_lines)
    _answerable(service, cart.currency)
    gate_pass = None
    if GATE in request.app:
        gate_pass = request[PASS] = Pass(request.app[GATE], request[CALLER])
        # One unit a SKU asked, alternates too: each is a call's worth of suppliers' work.
        units = sum(len(line.skus) for line in cart.lines)
        await gate_pass.enter(service.ensure_cart_capacity, units=units)
    try:
        with service.cart_admitted() as admitted_at:
            since = admitted_at - (0.0 if gate_pass is None else gate_pass.waited)
            name = None if gate_pass is None else gate_pass.caller.name
            report = await service.cart(cart, request[REQUEST_ID], since, caller=name)
    finally:
        if gate_pass is not None:
            gate_pass.leave()
    request.app[TELEMETRY].cart_served(report)
    body = encode_cart(report.result)
    if from_file is not None:
        body["ignored_columns"] = list(from_file.ignored_columns)
        body["skipped_rows"] = [
            {"row": row, "reason": reason} for row, reason in from_file.skipped_rows
        ]
    explain = request.query.get("explain")
    if explain is not None and explain in _EXPLAINED:
        body["explain"] = _traced(request, encode_cart_explain(report))
        if explain == "svg":
            return _svg(render_cart(body))
        return _json(body)  # the bill is JSON, whatever else was asked
    if request.query.get("format") == "csv" or CSV in request.headers.get(hdrs.ACCEPT, ""):
        return web.Response(
            body=basket_csv(body), content_type=CSV, charset="utf-8", headers=_CSV_HEADERS
        )
    return _json(body)


CSV = "text/csv"
_CART_TYPES = frozenset({None, "application/json", "application/x-www-form-urlencoded", CSV})
"""Bodies a cart is read from: JSON (also curl's ``-d`` default, and no type at all), CSV."""
_CSV_HEADERS = {"Content-Disposition": 'attachment; filename="basket.csv"'}


_EXPLAINED = frozenset({"1", "true", "svg"})
"""``?explain=`` values that add the bill; ``svg`` draws it instead of sending JSON."""


def _answer(request: web.Request, report: QuoteReport) -> web.Response:
    request.app[TELEMETRY].served(report)
    body = encode_result(report.result)
    explain = request.query.get("explain")
    if explain is not None and explain in _EXPLAINED:
        body["explain"] = _traced(request, encode_explain(report))
        if explain == "svg":
            return _svg(render_quote(body))
    return _json(body)


def _svg(drawing: str) -> web.Response:
    """A bill drawn as a waterfall: only a 200 is ever drawn, refusals stay JSON."""
    return web.Response(text=drawing, content_type="image/svg+xml", charset="utf-8")


def _traced(request: web.Request, explain: dict[str, Any]) -> dict[str, Any]:
    """The bill, naming the request's trace when tracing is on."""
    current = request.app.get(CURRENT_TRACE)
    trace_id = None if current is None else current.trace_id()
    if trace_id is not None:
        explain["trace_id"] = trace_id
    return explain


async def _read_body(request: web.Request, cap: int | None = None) -> bytes:
    """The whole inbound body, within its time limit and size cap (the app's, unless ``cap``)."""
    # Small bodies usually arrive with the headers: nothing to wait for, no timer.
    limit = None if request.content.is_eof() else request.app[BODY_TIMEOUT]
    try:
        async with asyncio.timeout(limit):
            if cap is not None:
                return await request.clone(client_max_size=cap).read()
            return await request.read()
    except TimeoutError:
        raise SlowRequestBody from None
    except web.RequestPayloadError as exc:  # e.g. Content-Encoding: gzip, but not gzip
        raise BadRequestBody(f"body could not be decoded: {exc}") from None


_BUSY_BODY = to_json({"error": "capacity_exhausted"})


def _request_id(request: web.Request) -> str:
    """The caller's ``X-Request-ID`` when it is safe to pass on, else a new one."""
    offered = request.headers.get("X-Request-ID", "")
    if _SAFE_REQUEST_ID.fullmatch(offered):
        return offered
    return f"{random.getrandbits(128):032x}"  # an id, not a secret: no syscall needed


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give every request an id, and turn every error into a JSON answer with that id."""
    request_id = request[REQUEST_ID] = _request_id(request)
    telemetry = request.app[TELEMETRY]
    try:
        response = await handler(request)
    except asyncio.CancelledError:
        # The caller hung up (aiohttp cancels the handler): the fan-out has
        # been cancelled with it and every slot given back. Count it, go on.
        telemetry.caller_left(request_id)
        raise
    except Unauthenticated as exc:
        telemetry.refused(INVALID, request_id, 401, error="unauthorized", path=request.path)
        response = _error(401, "unauthorized", detail=str(exc))
        challenge = 'Bearer realm="quoteflow"'
        response.headers["WWW-Authenticate"] = (
            challenge if exc.missing else challenge + ', error="invalid_token"'
        )
    except CapacityExhausted:
        # The cheapest answer we give: under overload most requests end here.
        telemetry.refused(BUSY, request_id, 503)
        response = web.Response(
            status=503,
            body=_BUSY_BODY,
            content_type="application/json",
            charset="utf-8",
            headers={"Retry-After": "1"},
        )
    except QuotaExceeded as exc:
        # RateLimit-Policy and RateLimit are added with every caller's answer (caller_answered).
        telemetry.refused(QUOTA_EXCEEDED, request_id, 429, caller=exc.caller)
        response = _error(
            429,
            QUOTA_EXCEEDED,
            detail=f"caller {exc.caller!r} is over its rate; retry after {exc.retry_after} s",
            retry_after_s=exc.retry_after,
        )
        response.headers["Retry-After"] = str(exc.retry_after)
    except SeatsExceeded as exc:
        telemetry.refused(SEATS_EXCEEDED, request_id, 429, caller=exc.caller)
        response = _error(
            429,
            SEATS_EXCEEDED,
            detail=f"caller {exc.caller!r} already has {exc.seats} requests in progress",
            seats=exc.seats,
        )
        response.headers["Retry-After"] = "1"
    except SlowRequestBody:
        telemetry.refused(INVALID, request_id, 408, error="body_timeout", **_who(request))
        response = _error(408, "body_timeout", detail="the request body did not arrive in time")
    except BadRequestBody as exc:
        telemetry.refused(INVALID, request_id, 400, error="invalid_json", **_who(request))
        response = _error(400, "invalid_json", detail=str(exc))
    except InvalidRequest as exc:
        telemetry.refused(INVALID, request_id, 422, error="invalid_request", **_who(request))
        response = _error(422, "invalid_request", detail=encode_errors(exc.errors))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        exc.headers["X-Request-ID"] = request_id
        if exc.content_type == "application/json":
            raise
        # aiohttp's own answers (404, 405, 413, ...) come as plain text.
        error = _ERROR_NAMES.get(exc.status) or _snake(exc.reason)
        if exc.status == 413:
            telemetry.refused(INVALID, request_id, 413, error=error, **_who(request))
        response = _error(exc.status, error, detail=exc.text)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
    except Exception as exc:
        telemetry.refused(ERROR, request_id, 500, exc=exc, path=request.path, **_who(request))
        response = _error(500, "internal_error")
    response.headers["X-Request-ID"] = request_id
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``/api/`` (and ``/metrics`` if asked) need a bearer key; installed only with keys.

    The key alone says who the caller is (``request[CALLER]``); a wrong or
    missing one is 401 before any caller's seats or rate are looked at.
    ``/health``, ``/ready`` and ``/openapi.json`` stay open: probes carry no keys.
    """
    if _needs_key(request):
        authorization = request.headers.get(hdrs.AUTHORIZATION)
        caller = request.app[GATE].identify(authorization)
        if caller is None:
            raise Unauthenticated(missing=authorization is None)
        request[CALLER] = caller
    return await handler(request)


async def caller_answered(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer to a quote request of a caller: its RateLimit fields, and a count.

    An ``on_response_prepare`` hook, installed only with keys. ``r`` is what
    remains after this request; an answer that spent nothing (refused for
    seats, or by the inbound limit) says where the caller stands now.
    """
    gate_pass = request.get(PASS)
    if gate_pass is None:
        return
    fields = gate_pass.fields()
    if fields is not None:
        response.headers["RateLimit-Policy"], response.headers["RateLimit"] = fields
    status = response.status
    if status == 200:
        result = OK
    elif gate_pass.refused is not None:
        result = gate_pass.refused
    elif status == 503:
        result = BUSY
    else:
        result = ERROR if status >= 500 else INVALID
    request.app[TELEMETRY].caller_answered(gate_pass.caller.name, result)


class _Who(TypedDict, total=False):
    caller: str


def _who(request: web.Request) -> _Who:
    """``caller`` for the log line of a refusal, when the key named one (never on the busy path)."""
    caller = request.get(CALLER)
    return {} if caller is None else {"caller": caller.name}


def _needs_key(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    # The route that would answer decides, and any path under /api/ too (even
    # an unknown one: a caller without a key learns nothing of what exists).
    paths = (request.path, resource.canonical if resource else "")
    if any(path.startswith("/api/") for path in paths):
        return True
    return request.app[METRICS_NEED_KEY] and "/metrics" in paths


def _error(status: int, error: str, **fields: Any) -> web.Response:
    return _json({"error": error, **fields}, status=status)


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=to_json(body), status=status, content_type="application/json", charset="utf-8"
    )


def add_routes(app: web.Application, *, callers: bool = False) -> None:
    """Register QuoteFlow's routes on ``app``; ``callers``: quote requests pass a caller's gate."""
    app.router.add_post("/api/quotes", quotes_for_caller if callers else quotes)
    app.router.add_post("/api/carts", carts)
    app.add_routes(_routes)
