"""Size caps: supplier bodies are capped on their decoded size while streaming; inbound
bodies past 16 KiB are a JSON 413; over-long header lines and URLs get a clean 400.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from quoteflow.codec import decode_supplier_quote
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, Responder

MiB = 1024 * 1024
QUOTE_HEAD = b'{"supplier": "boreal", "sku": "KB-001", "unit_cents": 1100, "shipping_cents": 250, '
QUOTE_TAIL = b'"stock": 50}'
"""Boreal's valid quote, split so that whitespace padding can go in between."""
FLAT = 4 * MiB
"""Peak traced memory allowed while refusing a huge body (measured: about 2.5 MiB,
the same for a 5, 50 or 200 MiB gzip inflation)."""


def padded_quote(padding: int) -> bytes:
    """Boreal's valid quote with ``padding`` spaces inside: still valid JSON, just long."""
    return QUOTE_HEAD + b" " * padding + QUOTE_TAIL


@functools.cache
def gzip_bomb(inflated: int = 50 * MiB) -> bytes:
    """Boreal's valid quote padded to ``inflated`` bytes, gzipped to a few tens of KiB."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip container
    parts = [deflate.compress(QUOTE_HEAD)]
    spaces = b" " * MiB
    for _ in range(inflated // MiB):
        parts.append(deflate.compress(spaces))
    parts.append(deflate.compress(QUOTE_TAIL))
    parts.append(deflate.flush())
    return b"".join(parts)


def streamed(total: int, *, chunked: bool, encoding: str | None = None) -> Responder:
    """200 with ``total`` bytes of padding inside a quote, written 64 KiB at a time."""
    chunk = b" " * (64 * 1024)

    async def respond(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if chunked:
            response.enable_chunked_encoding()
        else:
            response.content_length = len(QUOTE_HEAD) + total + len(QUOTE_TAIL)
        await response.prepare(request)
        try:
            await response.write(QUOTE_HEAD)
            for _ in range(total // len(chunk)):
                await response.write(chunk)
            await response.write(QUOTE_TAIL)
        except ConnectionError:
            pass  # QuoteFlow stopped reading at its cap and hung up: expected
        return response

    return respond


def body(data: bytes, **headers: str) -> Responder:
    """200 with exactly ``data``."""

    async def respond(request: web.Request) -> web.StreamResponse:
        return web.Response(body=data, headers={"Content-Type": "application/json", **headers})

    return respond


@pytest.fixture
def traced() -> Iterator[None]:
    """Trace Python allocations for the test; stopped afterwards whatever happens."""
    gc.collect()
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


async def boreal_outcome(client: TestClient[Any, Any]) -> tuple[str, float]:
    """Boreal's outcome (``ok`` or its failure code) and the answer's wall time."""
    started = time.perf_counter()
    response = await client.post("/api/quotes", json={})
    elapsed = time.perf_counter() - started
    assert response.status == 200
    result = await response.json()
    codes = {f["supplier"]: f["code"] for f in result["failures"]}
    if "boreal" in codes:
        return codes["boreal"], elapsed
    assert result["best"]["supplier"] == "boreal"
    return "ok", elapsed


# -- supplier bodies -------------------------------------------------------------------


def test_bomb_is_small_and_inflates_to_a_valid_quote() -> None:
    """The bomb is tens of KiB on the wire and, uncapped, a valid quote of 50 MiB."""
    bomb = gzip_bomb()
    assert len(bomb) < 100 * 1024
    inflated = zlib.decompress(bomb, 31)
    assert len(inflated) > 50 * MiB
    # Uncapped it would be boreal's quote: only the cap turns it into invalid_data.
    assert decode_supplier_quote(inflated, supplier="boreal", sku="KB-001").stock == 50


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_ten_megabyte_body_is_invalid_data_with_flat_memory(
    chunked: bool, traced: None, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A 10 MB quote (valid JSON, only too long) is ``invalid_data``; memory stays flat."""
    suppliers.always("boreal", streamed(10 * MiB, chunked=chunked))
    client = await start_quoteflow(budget=2.0)
    code, elapsed = await boreal_outcome(client)
    assert code == "invalid_data"
    assert elapsed < 1.0
    _, peak = tracemalloc.get_traced_memory()
    assert peak < FLAT, f"peak {peak} bytes for a 10 MiB body"


async def test_gzip_bomb_is_invalid_data_with_flat_memory(
    traced: None, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A ~50 KiB gzip body inflating to 50 MiB is ``invalid_data`` after at most the cap."""
    bomb = gzip_bomb()
    tracemalloc.reset_peak()
    suppliers.always("boreal", body(bomb, **{"Content-Encoding": "gzip"}))
    client = await start_quoteflow(budget=2.0)
    code, elapsed = await boreal_outcome(client)
    assert code == "invalid_data"
    assert elapsed < 1.0
    _, peak = tracemalloc.get_traced_memory()
    assert peak < FLAT, f"peak {peak} bytes for a 50 MiB inflation"


CAP = 1000


@pytest.mark.parametrize(
    ("size", "outcome"), [(CAP, "ok"), (CAP + 1, "invalid_data")], ids=["at-cap", "one-over"]
)
@pytest.mark.parametrize("framing", ["content-length", "chunked", "gzip"])
async def test_cap_is_exact_on_the_decoded_size(
    size: int,
    outcome: str,
    framing: str,
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
) -> None:
    """A decoded body of exactly the cap is read; one byte more is ``invalid_data``."""
    data = padded_quote(size - len(QUOTE_HEAD) - len(QUOTE_TAIL))
    assert len(data) == size
    if framing == "content-length":
        suppliers.always("boreal", body(data))
    elif framing == "chunked":
        suppliers.always("boreal", streamed_exact(data))
    else:
        gzipped = zlib.compress(data, 9, wbits=31)
        suppliers.always("boreal", body(gzipped, **{"Content-Encoding": "gzip"}))
    client = await start_quoteflow(max_supplier_body_bytes=CAP)
    assert (await boreal_outcome(client))[0] == outcome


def streamed_exact(data: bytes) -> Responder:
    """200 with ``data`` in chunked encoding (no Content-Length), 100 bytes per chunk."""

    async def respond(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(data), 100):
            await response.write(data[start : start + 100])
        return response

    return respond


async def test_default_cap_is_64_kib(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """By default a 64 KiB quote is read and a byte more is ``invalid_data``."""
    client = await start_quoteflow()
    suppliers.script("boreal", body(padded_quote(64 * 1024 - len(QUOTE_HEAD) - len(QUOTE_TAIL))))
    assert (await boreal_outcome(client))[0] == "ok"
    suppliers.script(
        "boreal", body(padded_quote(64 * 1024 + 1 - len(QUOTE_HEAD) - len(QUOTE_TAIL)))
    )
    assert (await boreal_outcome(client))[0] == "invalid_data"


# -- inbound bodies --------------------------------------------------------------------

LIMIT = 16 * 1024


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(("size", "status"), [(LIMIT, 200), (LIMIT + 1, 413)])
async def test_inbound_cap_is_16_kib(
    chunked: bool, size: int, status: int, start_quoteflow: StartQuoteFlow
) -> None:
    """A 16 KiB body is served; one byte more is a JSON 413, with or without Content-Length."""
    data = b"{}" + b" " * (size - 2)
    client = await start_quoteflow()
    response = await client.post("/api/quotes", data=_chunks(data) if chunked else data)
    assert response.status == status
    if status == 413:
        assert (await response.json())["error"] == "request_too_large"


async def _raw_exchange(client: TestClient[Any, Any], data: bytes) -> tuple[bytes, bytes]:
    """Send ``data`` on a fresh connection; the status line and body of the answer."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in lines
                if line.lower().startswith("content-length:")
            )
            return status_line.encode(), await reader.readexactly(length)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_huge_declared_body_is_refused_without_reading_it(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """A caller that declares 10 MB and sends 20 KiB gets its 413 at once, not after 10 MB."""
    client = await start_quoteflow()
    head = (
        b"POST /api/quotes HTTP/1.1\r\nHost: quoteflow\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000\r\n\r\n"
    )
    status_line, answer = await _raw_exchange(client, head + b" " * (20 * 1024))
    assert status_line.startswith(b"HTTP/1.1 413 ")
    assert json.loads(answer)["error"] == "request_too_large"


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET /health HTTP/1.1\r\nHost: quoteflow\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: quoteflow\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: quoteflow\r\n"
        + b"".join(b"X-H%d: v\r\n" % i for i in range(200))
        + b"\r\n",
    ],
    ids=["long-header", "long-url", "too-many-headers"],
)
async def test_oversized_request_head_is_a_clean_400(
    request_head: bytes, start_quoteflow: StartQuoteFlow
) -> None:
    """Header lines or URLs over 8190 bytes, or over 128 headers, are a 400; serving goes on."""
    client = await start_quoteflow()
    status_line, _ = await _raw_exchange(client, request_head)
    assert status_line in (b"HTTP/1.0 400 Bad Request", b"HTTP/1.1 400 Bad Request")
    health = await client.get("/health")
    assert health.status == 200
