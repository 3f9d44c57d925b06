"""How each answer is written onto the wire, including the broken ones.

Nothing here is simulated: a truncated body is a ``Content-Length`` the lab
does not honour, a reset is a real TCP RST (``SO_LINGER`` 0, then abort), a
bad gzip body is really sent with ``Content-Encoding: gzip``. Payload bodies
are assembled from ``(key, raw JSON text)`` pairs so that the broken forms
(``NaN``, ``1e400``, repeated keys) are exactly the bytes a client receives.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import struct
import zlib
from collections.abc import Mapping
from typing import ClassVar, Final, Literal, Protocol

import attrs
from aiohttp import web

from provider_lab.catalogue import Offer, PriceList, lookup, price_list
from provider_lab.faults import EXTRA_KEY, EXTRA_VALUE, SPECS, AnyKind, Fault, Kind
from provider_lab.state import LabState

logger = logging.getLogger(__name__)

JSON: Final = "application/json"
POLL_S: Final = 0.02
# Give up this long after the caller's stated deadline, not at it: the header is
# rounded down to whole ms and measured before the trip, so answering exactly at
# the deadline could beat the caller's own timer and turn its ``timeout`` into a 504.
DEADLINE_GRACE_S: Final = 0.05
CHUNK: Final = 64 * 1024
NOT_HTTP_BYTES: Final = b"SSH-2.0-OpenSSH_9.6\r\nProtocol mismatch.\r\n"

Pairs = list[tuple[str, str]]
Waited = Literal["done", "deadline", "gone"]


class Quote(Protocol):
    """A request's good answer, not yet written: what every fault and scenario starts from.

    A single-SKU dialect's is an :class:`Offered` (the call and the supplier's
    offer for the SKU); the batch dialect's holds every part's result.
    """

    def ok(self) -> web.Response:
        """The 200 as the dialect writes it."""
        ...

    def body(self) -> bytes:
        """The 200's bytes (faults that send a valid answer, or break its bytes, use them)."""
        ...

    def malformed(self) -> bytes:
        """The ``malformed`` scenario's body: the answer with a value of the wrong type."""
        ...

    def changed(self, fault: Fault) -> bytes:
        """The body of a data fault that changes a field (``wrong_types`` … ``wrong_sku``),
        or of a batch dialect's own fault."""
        ...


@attrs.frozen
class Call:
    """One supplier request as the lab understood it, asked the classic way.

    ``GET /quotes/{supplier}?sku=...``. The other dialects
    (:mod:`provider_lab.dialects`) are subclasses that write their own good
    quote, 404 and redirect target; every fault and scenario reaches a
    dialect's bytes through these methods alone, by way of :meth:`quote`.
    """

    request: web.Request
    state: LabState
    supplier: str
    sku: str
    scenario: str
    request_id: str | None
    deadline: float | None  # loop time after which the caller has given up, if it said so

    lists_prices: ClassVar[bool] = True
    """Whether the dialect answers the parts of ``catalogue.PRICE_LISTS`` (else a 404)."""

    def quote(self) -> Quote | None:
        """This request's good answer; ``None``: the supplier does not sell the SKU (the 404,
        whatever the fault or scenario)."""
        offer = lookup(self.supplier, self.sku)
        if offer is not None:
            return Offered(self, offer)
        listed = price_list(self.supplier, self.sku) if self.lists_prices else None
        return None if listed is None else Listed(self, listed)

    def batch_size(self) -> int | None:
        """How many parts the request asks for in one call: ``None`` but in the batch dialect."""
        return None

    def first_sight(self) -> str:
        """What ``flaky`` and ``blip`` remember a first sight by: supplier and request id."""
        return f"{self.supplier} {self.request_id}"

    def ok(self, offer: Offer) -> web.Response:
        """The 200 with ``offer`` as this dialect writes a good quote."""
        # Written out rather than through ``body``: this is the benchmark's hot path.
        body = render(quote_pairs(self.supplier, self.sku, offer))
        return web.Response(body=body, content_type=JSON)

    def body(self, offer: Offer) -> bytes:
        """A good quote's bytes in this dialect (faults that send a valid quote use them)."""
        return render(quote_pairs(self.supplier, self.sku, offer))

    def malformed(self, offer: Offer) -> bytes:
        """The ``malformed`` scenario's body: a good quote with one value of the wrong type."""
        pairs = quote_pairs(self.supplier, self.sku, offer)
        return render([(k, f'"{v}"' if k == "unit_cents" else v) for k, v in pairs])

    def unknown_sku(self) -> web.Response:
        """The 404 for a SKU this supplier does not sell."""
        return json_response(
            404, {"error": "unknown_sku", "supplier": self.supplier, "sku": self.sku}
        )

    def elsewhere(self, other: str) -> str:
        """Where a 3xx sends this request: the same question to supplier ``other``."""
        query = self.request.query_string
        return f"/quotes/{other}" + (f"?{query}" if query else "")


@attrs.frozen
class Offered:
    """A single-SKU dialect's good answer: ``call``'s own bytes for ``offer``."""

    call: Call
    offer: Offer

    def ok(self) -> web.Response:
        """The 200 as ``call``'s dialect writes it."""
        return self.call.ok(self.offer)

    def body(self) -> bytes:
        """The 200's bytes."""
        return self.call.body(self.offer)

    def malformed(self) -> bytes:
        """The ``malformed`` scenario's body in ``call``'s dialect."""
        return self.call.malformed(self.offer)

    def changed(self, fault: Fault) -> bytes:
        """The classic five keys, changed as ``fault`` says, whatever the dialect."""
        return changed_quote(self.call, fault, self.offer)


@attrs.frozen
class Listed:
    """The classic dialect's good answer for a part of ``catalogue.PRICE_LISTS``: the offer
    protocol's own fields (:func:`listed_body`). Faults that change a field, and the
    ``malformed`` scenario, spoil the five classic keys nearest it (``PriceList.classic``)."""

    call: Call
    listed: PriceList

    def ok(self) -> web.Response:
        """The 200."""
        return web.Response(body=self.body(), content_type=JSON)

    def body(self) -> bytes:
        """The 200's bytes."""
        return listed_body(self.call.supplier, self.call.sku, self.listed)

    def malformed(self) -> bytes:
        """The ``malformed`` scenario's body: ``unit_cents`` as a string."""
        return self.call.malformed(self.listed.classic())

    def changed(self, fault: Fault) -> bytes:
        """The classic five keys, changed as ``fault`` says."""
        return changed_quote(self.call, fault, self.listed.classic())


@functools.lru_cache(maxsize=256)
def listed_body(supplier: str, sku: str, listed: PriceList) -> bytes:
    """A price list in the offer protocol's fields::

        {"supplier": "atlas", "sku": "RES-0402-1K", "currency": "USD",
         "breaks": [{"quantity": 1, "unit_price": "0.0100"}, ...],
         "shipping": "4.00", "stock": 50000, "moq": 10, "multiple": 10}

    ``unit_price`` instead of ``breaks`` for a single price, ``shipping_cents`` (an
    integer) instead of ``shipping`` where the supplier states it in minor units.
    """
    if listed.single:
        price: tuple[str, str] = ("unit_price", json.dumps(listed.breaks[0][1]))
    else:
        breaks = ", ".join(
            render([("quantity", str(least)), ("unit_price", json.dumps(unit))]).decode()
            for least, unit in listed.breaks
        )
        price = ("breaks", f"[{breaks}]")
    shipping = (
        ("shipping_cents", str(listed.shipping))
        if isinstance(listed.shipping, int)
        else ("shipping", json.dumps(listed.shipping))
    )
    return render(
        [
            ("supplier", json.dumps(supplier)),
            ("sku", json.dumps(sku)),
            ("currency", json.dumps(listed.currency)),
            price,
            shipping,
            ("stock", str(listed.stock)),
            ("moq", str(listed.moq)),
            ("multiple", str(listed.multiple)),
        ]
    )


def quote_pairs(supplier: str, sku: str, offer: Offer) -> Pairs:
    """The five keys of a valid quote, values as raw JSON text."""
    return [
        ("supplier", json.dumps(supplier)),
        ("sku", json.dumps(sku)),
        ("unit_cents", str(offer.unit_cents)),
        ("shipping_cents", str(offer.shipping_cents)),
        ("stock", str(offer.stock)),
    ]


def render(pairs: Pairs) -> bytes:
    """A JSON object from ``pairs``, keeping their order, repeats and raw values."""
    return ("{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}").encode()


def json_response(status: int, body: Mapping[str, object], **headers: str) -> web.Response:
    """A JSON answer with ``status``."""
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type=JSON, headers=headers
    )


def gone() -> web.StreamResponse:
    """What a handler returns once the connection is gone; aiohttp never sends it."""
    return web.StreamResponse(status=499)


def client_gone(request: web.Request) -> bool:
    """Whether the caller has hung up (or the lab closed the connection itself)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def wait(call: Call, seconds: float) -> Waited:
    """Sleep ``seconds`` (may be infinite); stop early if the caller leaves or its deadline passed.

    The connection is polled rather than relying on aiohttp's handler cancellation,
    so a hanging answer ends (and leaves ``active``) however the server is run.
    """
    return await wait_for(call.request, call.deadline, seconds)


async def wait_for(request: web.Request, deadline: float | None, seconds: float) -> Waited:
    """:func:`wait` for any request: ``deadline`` is a loop time, or ``None`` for none."""
    loop = asyncio.get_running_loop()
    target = loop.time() + seconds
    end = target if deadline is None else min(target, deadline + DEADLINE_GRACE_S)
    while True:
        if client_gone(request):
            return "gone"
        now = loop.time()
        if now >= end:
            return "done" if end == target else "deadline"
        await asyncio.sleep(min(POLL_S, end - now))


def deadline_passed(call: Call) -> web.Response:
    """The 504 a slow answer turns into once the caller's stated deadline has passed."""
    call.state.stats.deadline_expired += 1
    logger.info("deadline_passed supplier=%s request_id=%s", call.supplier, call.request_id)
    return json_response(504, {"error": "deadline_passed", "supplier": call.supplier})


def _error_body(error: str, size: int) -> bytes:
    body = render([("error", json.dumps(error))])
    if size > len(body):
        padding = "x" * (size - len(body) - len(', "padding": ""'))
        body = render([("error", json.dumps(error)), ("padding", json.dumps(padding))])
    return body


def http_error(call: Call, fault: Fault) -> web.Response:
    """A non-200 answer: 404, 429, 500, 503 or any status 300–599."""
    statuses: dict[AnyKind, int] = {
        Kind.HTTP_404: 404,
        Kind.HTTP_429: 429,
        Kind.HTTP_500: 500,
        Kind.HTTP_503: 503,
    }
    status = statuses.get(fault.kind) or fault.int_param("status")
    headers: dict[str, str] = {}
    retry_after = fault.optional_int_param("retry_after")
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if 300 <= status < 400:
        headers["Location"] = call.elsewhere(call.state.other_than(call.supplier))
    size = fault.int_param("size") if "size" in fault.params else 0
    body = _error_body(f"injected_{fault.kind}", size)
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


def bad_data(fault: Fault, quote: Quote) -> web.Response:
    """A 200 whose body is wrong in exactly the way ``fault`` names.

    ``not_json`` and ``wrong_content_type`` start from the call's own dialect's
    body; the kinds that change one field are the quote's to write
    (:meth:`Quote.changed`), as are the batch dialect's own kinds.
    """
    match fault.kind:
        case Kind.NOT_JSON:
            body, content_type = _not_json(fault.str_param("variant"), quote.body())
            return web.Response(body=body, content_type=content_type)
        case Kind.WRONG_CONTENT_TYPE:
            return web.Response(body=quote.body(), content_type="text/plain")
    return web.Response(body=quote.changed(fault), content_type=JSON)


def changed_quote(call: Call, fault: Fault, offer: Offer) -> bytes:
    """The classic five keys for ``offer``, with the one change a field-changing kind names.

    The other single-SKU dialects send these too: a body no adapter of theirs accepts either.
    """
    pairs = quote_pairs(call.supplier, call.sku, offer)
    values = dict(pairs)
    match fault.kind:
        case Kind.WRONG_TYPES:
            field = fault.str_param("field")
            values[field] = retyped(int(values[field]), fault.str_param("variant"))
        case Kind.NEGATIVE:
            field = fault.str_param("field")
            values[field] = str(-(abs(int(values[field])) or 1))
        case Kind.EXTRA_KEY:
            # Not "currency": the offer protocol has one now, and this key must be unknown.
            values[EXTRA_KEY] = json.dumps(EXTRA_VALUE)
        case Kind.MISSING_KEY:
            del values[fault.str_param("field")]
        case Kind.DUPLICATE_KEY:
            return render([*pairs, (fault.str_param("field"), "1")])
        case Kind.WRONG_SUPPLIER:
            other = call.state.other_than(call.supplier)
            values["supplier"] = json.dumps(other)
        case Kind.WRONG_SKU:
            values["sku"] = json.dumps(call.sku + "-OTHER")
        case _:  # pragma: no cover - the dispatcher only sends data kinds here
            raise AssertionError(fault.kind)
    return render(list(values.items()))


def retyped(value: int, variant: str) -> str:
    """``value`` written as another JSON type, as ``wrong_types``' ``variant`` names it."""
    return {
        "string": json.dumps(str(value)),
        "bool": "true",
        "float": f"{value}.5",
        "integral_float": f"{value}.0",
        "null": "null",
        "nan": "NaN",
        "huge": "1e400",
    }[variant]


def _not_json(variant: str, quote: bytes) -> tuple[bytes, str]:
    return {
        "html": (b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"),
        "text": (b"OK", "text/plain"),
        "empty": (b"", JSON),
        "array": (b"[" + quote + b"]", JSON),
        "null": (b"null", JSON),
        "partial": (quote[: len(quote) // 2], JSON),
    }[variant]


def bad_gzip(quote: Quote) -> web.Response:
    """A 200 that claims gzip but whose bytes are plain text."""
    body = quote.body()
    return web.Response(body=body, content_type=JSON, headers={"Content-Encoding": "gzip"})


GZIP_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, mtime 0


@functools.lru_cache(maxsize=4)
def _deflated_padding(size: int) -> tuple[bytes, int]:
    """``size`` spaces as raw deflate ending in a full flush, and their CRC-32.

    Independent of what follows, so it is computed once per size: the quote is
    deflated separately after it and the two streams concatenate (a full flush
    ends byte-aligned with no back-references across it, as pigz relies on).
    """
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = b" " * (CHUNK * 16)
    parts, crc, left = [], 0, size
    while left > 0:
        piece = block[: min(left, len(block))]
        parts.append(packer.compress(piece))
        crc = zlib.crc32(piece, crc)
        left -= len(piece)
    parts.append(packer.flush(zlib.Z_FULL_FLUSH))
    return b"".join(parts), crc


def gzip_bomb_body(quote: bytes, size: int) -> bytes:
    """Valid gzip of ``size`` spaces then ``quote``: JSON whitespace, then the real object."""
    padding, crc = _deflated_padding(size)
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    tail = packer.compress(quote) + packer.flush()
    trailer = struct.pack("<II", zlib.crc32(quote, crc), (size + len(quote)) & 0xFFFFFFFF)
    return GZIP_HEADER + padding + tail + trailer


def warm_up() -> None:
    """Deflate the default gzip bomb's padding now, so its first use is not slower."""
    default = SPECS[Kind.GZIP_BOMB].params["size"].default
    assert isinstance(default, int)
    _deflated_padding(default)


async def gzip_bomb(fault: Fault, quote: Quote) -> web.Response:
    """A small, valid gzip body that inflates to ``size`` bytes of whitespace and a quote."""
    body = await asyncio.to_thread(gzip_bomb_body, quote.body(), fault.int_param("size"))
    return web.Response(body=body, content_type=JSON, headers={"Content-Encoding": "gzip"})


async def oversized(call: Call, fault: Fault, good: Quote) -> web.StreamResponse:
    """A valid quote padded with whitespace to ``size`` bytes, streamed without buffering it."""
    quote = good.body()
    size = max(fault.int_param("size"), len(quote))
    response = web.StreamResponse()
    response.content_type = JSON
    response.content_length = size
    try:
        await response.prepare(call.request)
        await response.write(quote[:-1])
        padding = size - len(quote)
        block = b" " * CHUNK
        while padding > 0:
            step = min(padding, CHUNK)
            await response.write(block[:step])
            padding -= step
        await response.write(quote[-1:])
    except ConnectionError:
        logger.info("client_gone supplier=%s request_id=%s", call.supplier, call.request_id)
    return response


def _socket_of(request: web.Request) -> socket.socket | None:
    transport = request.transport
    if transport is None:
        return None
    sock: socket.socket | None = transport.get_extra_info("socket")
    return sock


def reset_connection(request: web.Request) -> None:
    """Abort the connection with a TCP RST: linger 0 makes close() discard and reset."""
    transport = request.transport
    if transport is None:
        return
    sock = _socket_of(request)
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def reset_mid_body(call: Call, quote: Quote) -> web.StreamResponse:
    """Headers and half the body, a moment for the client to read them, then a TCP RST."""
    response = await _half_sent(call, quote)
    await asyncio.sleep(0.05)
    reset_connection(call.request)
    return response


async def _half_sent(call: Call, quote: Quote) -> web.StreamResponse:
    body = quote.body()
    response = web.StreamResponse()
    response.content_type = JSON
    response.content_length = len(body)
    await response.prepare(call.request)
    await response.write(body[: len(body) // 2])
    return response


async def truncated(call: Call, quote: Quote) -> web.StreamResponse:
    """Half the promised ``Content-Length``, then a clean close (FIN)."""
    response = await _half_sent(call, quote)
    transport = call.request.transport
    if transport is not None:
        transport.close()  # flushes what was written, then closes
    return response


def close(call: Call) -> web.StreamResponse:
    """Close the connection without writing a single byte."""
    transport = call.request.transport
    if transport is not None:
        transport.close()
    return gone()


def not_http(call: Call) -> web.StreamResponse:
    """Answer with bytes that are not an HTTP response, then close."""
    transport = call.request.transport
    if transport is not None:
        transport.write(NOT_HTTP_BYTES)
        transport.close()
    return gone()


async def slow_body(call: Call, fault: Fault, quote: Quote) -> web.StreamResponse:
    """Headers and half the body now, the rest after ``ms`` (or a close at the deadline)."""
    response = await _half_sent(call, quote)
    waited = await wait(call, fault.int_param("ms") / 1000)
    if waited == "done":
        body = quote.body()
        await response.write(body[len(body) // 2 :])
    elif waited == "deadline" and call.request.transport is not None:
        call.state.stats.deadline_expired += 1
        call.request.transport.close()
    return response
