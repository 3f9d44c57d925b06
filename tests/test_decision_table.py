"""Contract section 5: what each supplier outcome becomes, and whether it is retried.

Attempt counts are taken from what the fake supplier really received.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from tests.conftest import StartQuoteFlow
from tests.fakes import (
    FakeSuppliers,
    Responder,
    bad_gzip,
    close,
    delay,
    gzipped,
    hang,
    json_body,
    payload,
    quote,
    raw,
    reset,
    status,
    truncated,
)


async def ask(client: Any, **body: Any) -> dict[str, Any]:
    """POST a quote request and return the 200 body."""
    response = await client.post("/api/quotes", json={"quantity": 2, **body})
    assert response.status == 200
    return await response.json()  # type: ignore[no-any-return]


def failure_of(result: dict[str, Any], supplier: str) -> str | None:
    """The failure code listed for ``supplier``, or None."""
    codes = {f["supplier"]: f["code"] for f in result["failures"]}
    return codes.get(supplier)


def quoted(result: dict[str, Any]) -> list[str]:
    """Suppliers with a usable quote, in ranking order."""
    return [q["supplier"] for q in result["quotes"]]


async def test_503_then_200_recovers_with_the_same_request_id(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A 503 then a 200 gives boreal's quote after exactly two attempts, one request id."""
    suppliers.script("boreal", status(503))
    result = await ask(await start_quoteflow())
    assert result["best"]["supplier"] == "boreal"
    assert result["failures"] == []
    attempts = suppliers.of("boreal")
    assert len(attempts) == 2
    assert {a.request_id for a in attempts} == {result["request_id"]}
    assert [a.headers.get("X-Attempt") for a in attempts] == ["1", "2"]


async def test_503_twice_is_http_503_after_two_attempts(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Two 503s end as http_503; there is never a third attempt."""
    suppliers.always("boreal", status(503))
    result = await ask(await start_quoteflow())
    assert failure_of(result, "boreal") == "http_503"
    assert suppliers.count("boreal") == 2
    assert quoted(result) == ["atlas"]


@pytest.mark.parametrize("code", [404, 429, 500, 502, 302])
async def test_other_statuses_are_final_after_one_attempt(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, code: int
) -> None:
    """Any non-200 other than 503 is http_<status> after one attempt (redirects not followed)."""
    headers = {"Retry-After": "0", "Location": "/quotes/atlas"}
    suppliers.always("boreal", status(code, headers=headers))
    result = await ask(await start_quoteflow())
    assert failure_of(result, "boreal") == f"http_{code}"
    assert suppliers.count("boreal") == 1
    assert suppliers.count("atlas") == 1


INVALID_PAYLOADS: dict[str, Responder] = {
    "not JSON": raw(b"<html>oops</html>"),
    "empty body": raw(b""),
    "JSON array": json_body([payload("boreal")]),
    "JSON string": json_body("boreal"),
    "JSON null": json_body(None),
    "integer as string": json_body(payload("boreal", unit_cents="100")),
    "integer as bool": json_body(payload("boreal", stock=True)),
    "integer as float": json_body(payload("boreal", unit_cents=1.5)),
    "integer in exponent form": raw(
        json.dumps(payload("boreal")).replace('"stock": 50', '"stock": 1e2').encode()
    ),
    "integer as null": json_body(payload("boreal", shipping_cents=None)),
    "NaN": raw(json.dumps(payload("boreal", unit_cents=float("nan"))).encode()),
    "Infinity": raw(json.dumps(payload("boreal", unit_cents=float("inf"))).encode()),
    "huge exponent": raw(
        json.dumps(payload("boreal")).replace('"stock": 50', '"stock": 1e400').encode()
    ),
    "negative money": json_body(payload("boreal", unit_cents=-1)),
    "negative stock": json_body(payload("boreal", stock=-5)),
    "money past 2**53": json_body(payload("boreal", unit_cents=2**53)),
    "money of 30 digits": json_body(payload("boreal", unit_cents=10**30)),
    "extra key": json_body(payload("boreal", discount=10)),
    "missing key": json_body({k: v for k, v in payload("boreal").items() if k != "stock"}),
    "SKU not a string": json_body({**payload("boreal"), "sku": 1}),
    "supplier null": json_body({**payload("boreal"), "supplier": None}),
    "wrong supplier": json_body(payload("atlas")),
    "wrong SKU": json_body({**payload("boreal"), "sku": "KB-999"}),
    "duplicate key": raw(json.dumps(payload("boreal")).replace("{", '{"stock": 1, ', 1).encode()),
    "bad gzip": bad_gzip(),
    "deeply nested": raw(b"[" * 50_000 + b"]" * 50_000),
    "over the body cap": raw(b" " * 70_000 + json.dumps(payload("boreal")).encode()),
}


@pytest.mark.parametrize("responder", INVALID_PAYLOADS.values(), ids=INVALID_PAYLOADS.keys())
async def test_invalid_data_is_never_retried(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, responder: Responder
) -> None:
    """Every form of bad supplier data is invalid_data after one attempt; others are kept."""
    suppliers.always("boreal", responder)
    result = await ask(await start_quoteflow())
    assert failure_of(result, "boreal") == "invalid_data"
    assert suppliers.count("boreal") == 1
    assert quoted(result) == ["atlas"]


async def test_503_then_invalid_data_stops_at_invalid_data(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """The last attempt's code stands: 503 then bad data is invalid_data, no third attempt."""
    suppliers.script("boreal", status(503), json_body(payload("boreal", stock="50")))
    result = await ask(await start_quoteflow())
    assert failure_of(result, "boreal") == "invalid_data"
    assert suppliers.count("boreal") == 2


@pytest.mark.parametrize(
    "responder",
    [raw(b"", content_type="text/plain"), raw(b"", content_type="application/octet-stream")],
    ids=["text/plain", "octet-stream"],
)
async def test_content_type_does_not_matter(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, responder: Responder
) -> None:
    """A valid quote sent with the wrong Content-Type is still a quote."""
    body = json.dumps(payload("boreal")).encode()

    async def respond(request: Any) -> Any:
        response = await responder(request)
        response.body = body  # type: ignore[attr-defined]
        return response

    suppliers.always("boreal", respond)
    result = await ask(await start_quoteflow())
    assert result["best"]["supplier"] == "boreal"


async def test_gzipped_quote_is_decoded(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A correctly gzipped quote is a quote."""
    suppliers.always("boreal", gzipped(payload("boreal")))
    result = await ask(await start_quoteflow())
    assert result["best"]["supplier"] == "boreal"


TRANSIENT: dict[str, Responder] = {
    "truncated body": truncated(),
    "connection reset": reset(),
    "closed without answer": close(),
}


@pytest.mark.parametrize("responder", TRANSIENT.values(), ids=TRANSIENT.keys())
async def test_transport_failure_then_good_answer_recovers(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, responder: Responder
) -> None:
    """A broken connection is retried once and the second, good answer is the quote."""
    suppliers.script("boreal", responder)
    result = await ask(await start_quoteflow())
    assert result["best"]["supplier"] == "boreal"
    assert result["failures"] == []
    assert suppliers.count("boreal") == 2


@pytest.mark.parametrize("responder", TRANSIENT.values(), ids=TRANSIENT.keys())
async def test_supplier_that_always_drops_sees_exactly_two_requests(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, responder: Responder
) -> None:
    """aiohttp's own silent re-send is off: two attempts are two requests on the wire."""
    suppliers.always("boreal", responder)
    client = await start_quoteflow()
    for expected in (2, 4):
        result = await ask(client)
        assert failure_of(result, "boreal") == "transport_error"
        assert suppliers.count("boreal") == expected


async def test_connection_refused_is_transport_error(start_quoteflow: StartQuoteFlow) -> None:
    """Nobody listening: every supplier is transport_error, and the answer is still 200."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = await ask(await start_quoteflow(provider_url=f"http://127.0.0.1:{port}"))
    assert result["quotes"] == []
    assert result["best"] is None
    assert [(f["supplier"], f["code"]) for f in result["failures"]] == [
        ("atlas", "transport_error"),
        ("boreal", "transport_error"),
        ("cedar", "transport_error"),
    ]


async def test_non_http_reply_is_invalid_data(start_quoteflow: StartQuoteFlow) -> None:
    """A server answering garbage instead of HTTP is invalid_data, not http_400."""

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SPAM SPAM SPAM\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await ask(await start_quoteflow(provider_url=f"http://127.0.0.1:{port}"))
    finally:
        server.close()
        await server.wait_closed()
    assert {f["code"] for f in result["failures"]} == {"invalid_data"}


async def test_socket_read_timeout_is_transport_error_and_retried(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A supplier silent past the read timeout is transport_error after two attempts."""
    suppliers.always("boreal", hang())
    result = await ask(await start_quoteflow(read_timeout=0.05, budget=0.5))
    assert failure_of(result, "boreal") == "transport_error"
    assert suppliers.count("boreal") == 2


async def test_request_deadline_is_timeout(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A supplier silent past the request's deadline is timeout, after one attempt."""
    suppliers.always("boreal", hang())
    result = await ask(await start_quoteflow(read_timeout=5.0))
    assert failure_of(result, "boreal") == "timeout"
    assert suppliers.count("boreal") == 1
    assert quoted(result) == ["atlas"]


async def test_socket_timeout_then_good_answer_recovers(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A read timeout on the first attempt, then a good answer, gives the quote."""
    suppliers.script("boreal", delay(0.2))
    result = await ask(await start_quoteflow(read_timeout=0.05, budget=0.5))
    assert result["best"]["supplier"] == "boreal"
    assert suppliers.count("boreal") == 2


async def test_quote_arrives_unchanged_for_every_supplier(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """With all suppliers healthy, every quote is present and priced for the quantity."""
    suppliers.always("cedar", quote(stock=10))
    result = await ask(await start_quoteflow())
    assert [(q["supplier"], q["total_cents"]) for q in result["quotes"]] == [
        ("cedar", 2000),
        ("boreal", 2450),
        ("atlas", 2700),
    ]
