"""HTTP in and out: the only module that knows ``web.HTTP*``.

Handlers parse the request, call the service and shape the answer. Every error
a caller can cause, and every bug of ours, leaves through ``error_middleware``
as a JSON body — never as HTML or a traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from importlib import resources
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from quoteflow.codec import decode_request, encode_errors, encode_result
from quoteflow.errors import BadRequestBody, CapacityExhausted, InvalidRequest
from quoteflow.service import QuoteService

log = logging.getLogger("quoteflow")

SERVICE = web.AppKey("service", QuoteService)
"""The one ``QuoteService`` of the app, wired at start-up."""

_routes = web.RouteTableDef()

_ERROR_NAMES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}
"""Stable ``error`` names for aiohttp's own answers (HTTP reason phrases vary by Python)."""


def _snake(reason: str) -> str:
    return reason.lower().replace(" ", "_")


def _json_error(exc_class: type[web.HTTPException], error: str, **fields: Any) -> web.HTTPException:
    body = json.dumps({"error": error, **fields})
    return exc_class(text=body, content_type="application/json")


@_routes.get("/health")
async def health(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response({"status": "ok"})


@_routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    """QuoteFlow's OpenAPI document, as kept in the package."""
    return web.Response(body=_openapi_document(), content_type="application/json")


@functools.cache
def _openapi_document() -> bytes:
    return resources.files("quoteflow").joinpath("openapi.json").read_bytes()


@_routes.post("/api/quotes")
async def quotes(request: web.Request) -> web.Response:
    """The cheapest usable quote for a SKU and quantity, with every supplier failure."""
    quote_request = decode_request(await request.read())
    report = await request.app[SERVICE].quote(quote_request, uuid.uuid4().hex)
    return web.json_response(encode_result(report.result))


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every error into a JSON answer with the right status."""
    try:
        return await handler(request)
    except CapacityExhausted:
        busy = _json_error(web.HTTPServiceUnavailable, "capacity_exhausted")
        busy.headers["Retry-After"] = "1"
        raise busy from None
    except BadRequestBody as exc:
        raise _json_error(web.HTTPBadRequest, "invalid_json", detail=str(exc)) from None
    except InvalidRequest as exc:
        raise _json_error(
            web.HTTPUnprocessableEntity, "invalid_request", detail=encode_errors(exc.errors)
        ) from None
    except web.HTTPException as exc:
        if exc.content_type == "application/json" or exc.status < 400:
            raise
        # aiohttp's own answers (404, 405, 413, ...) come as plain text. Some of
        # their classes need extra constructor arguments, so answer directly.
        return web.json_response(
            {"error": _ERROR_NAMES.get(exc.status) or _snake(exc.reason), "detail": exc.text},
            status=exc.status,
            headers={k: v for k, v in exc.headers.items() if k == "Allow"},
        )
    except Exception:
        log.exception("unhandled error", extra={"event": "request_error", "path": request.path})
        raise _json_error(web.HTTPInternalServerError, "internal_error") from None


def add_routes(app: web.Application) -> None:
    """Register QuoteFlow's routes on ``app``."""
    app.add_routes(_routes)
