"""Every fault kind, observed by a real aiohttp client on a real socket."""

from __future__ import annotations

import asyncio
import errno
import gzip
import json
import struct
import zlib
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, ContentLengthError

from provider_lab.answers import gzip_bomb_body
from provider_lab.app import create_app
from provider_lab.faults import Kind
from provider_lab.state import LabConfig
from tests.lab.conftest import LabClient, ask, set_fault, stats, wait_idle

BOREAL: dict[str, Any] = {
    "supplier": "boreal",
    "sku": "KB-001",
    "unit_cents": 1100,
    "shipping_cents": 250,
    "stock": 50,
}


def pairs(body: bytes) -> list[tuple[str, Any]]:
    """The body's top-level key/value pairs in order, repeats kept."""
    result: list[tuple[str, Any]] = json.loads(body, object_pairs_hook=lambda p: p)
    return result


# -- statuses ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "status"),
    [("http_404", 404), ("http_429", 429), ("http_500", 500), ("http_503", 503)],
)
async def test_status_kinds_answer_their_status(lab: LabClient, kind: str, status: int) -> None:
    """Each ``http_*`` kind answers its status with a JSON error body."""
    await set_fault(lab, "boreal", kind=kind)
    got, body = await ask(lab)
    assert got == status
    assert json.loads(body) == {"error": f"injected_{kind}"}


async def test_429_carries_retry_after(lab: LabClient) -> None:
    """``http_429`` sends ``Retry-After`` (1 s by default, or the given seconds)."""
    await set_fault(lab, "boreal", kind="http_429", count=1)
    await set_fault(lab, "boreal", kind="http_429", count=1, retry_after=7, append=True)
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.headers["Retry-After"] == "1"
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.headers["Retry-After"] == "7"


async def test_503_retry_after_is_optional(lab: LabClient) -> None:
    """``http_503`` has no ``Retry-After`` unless one is asked for."""
    await set_fault(lab, "boreal", kind="http_503", count=1)
    await set_fault(lab, "boreal", kind="http_503", count=1, retry_after=2, append=True)
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert "Retry-After" not in response.headers
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.headers["Retry-After"] == "2"


async def test_error_body_can_be_padded(lab: LabClient) -> None:
    """``size`` pads an error body past aiohttp's read buffer (the unreleased-503 trap)."""
    await set_fault(lab, "boreal", kind="http_503", size=300_000)
    status, body = await ask(lab)
    assert status == 503
    assert 299_000 <= len(body) <= 300_000
    assert json.loads(body)["error"] == "injected_http_503"


async def test_any_status_and_redirects_point_elsewhere(lab: LabClient) -> None:
    """``http_status`` answers any 3xx–5xx; a 3xx points at another supplier with the same query."""
    await set_fault(lab, "boreal", kind="http_status", status=302, count=1)
    await set_fault(lab, "boreal", kind="http_status", count=1, append=True)
    async with lab.get(
        "/quotes/boreal", params={"sku": "KB-001"}, allow_redirects=False
    ) as response:
        assert response.status == 302
        assert response.headers["Location"] == "/quotes/cedar?sku=KB-001"
    assert (await ask(lab))[0] == 502


# -- undecodable or huge bodies -----------------------------------------------------------


async def test_bad_gzip_is_a_content_encoding_error(lab: LabClient) -> None:
    """``bad_gzip``: the body read raises ClientPayloadError caused by ContentEncodingError."""
    await set_fault(lab, "boreal", kind="bad_gzip")
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.status == 200
        assert response.headers["Content-Encoding"] == "gzip"
        with pytest.raises(aiohttp.ClientPayloadError) as caught:
            await response.read()
    assert isinstance(caught.value.__cause__, ContentEncodingError)


async def test_gzip_bomb_is_small_on_the_wire_and_huge_inflated(lab: LabClient) -> None:
    """``gzip_bomb``: valid gzip whose few KB inflate to ``size`` spaces and a valid quote."""
    size = 4 * 1024 * 1024
    await set_fault(lab, "boreal", kind="gzip_bomb", size=size)
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.status == 200
        assert response.headers["Content-Encoding"] == "gzip"
        assert int(response.headers["Content-Length"]) < size // 500
        body = await response.read()
    assert body[:size] == b" " * size
    assert json.loads(body) == BOREAL


def test_gzip_bomb_body_is_standard_gzip() -> None:
    """The bomb's concatenated deflate streams decode with the standard library too."""
    body = gzip_bomb_body(b'{"a": 1}', 1000)
    assert gzip.decompress(body) == b" " * 1000 + b'{"a": 1}'
    assert gzip_bomb_body(b"[]", 1000).endswith(
        struct.pack("<II", zlib.crc32(b" " * 1000 + b"[]"), 1002)
    )


async def test_oversized_body_is_a_valid_quote_padded_to_size(lab: LabClient) -> None:
    """``oversized``: ``Content-Length`` equals ``size`` and the body is still a valid quote."""
    size = 3 * 1024 * 1024
    await set_fault(lab, "boreal", kind="oversized", size=size)
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.content_length == size
        chunk = await response.content.read(1024)
    assert chunk.startswith(b'{"supplier": "boreal"')
    assert (await wait_idle(lab))["active"] == 0  # leaving early does not wedge the lab


async def test_oversized_body_read_whole(lab: LabClient) -> None:
    """Read to the end, ``oversized`` parses as the supplier's normal quote."""
    await set_fault(lab, "boreal", kind="oversized", size=1024 * 1024)
    status, body = await ask(lab)
    assert status == 200
    assert len(body) == 1024 * 1024
    assert json.loads(body) == BOREAL


# -- connection behaviour ----------------------------------------------------------------


async def test_truncated_body_is_a_content_length_error(lab: LabClient) -> None:
    """``truncated``: headers promise more than is sent; the read fails with ContentLengthError."""
    await set_fault(lab, "boreal", kind="truncated")
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError) as caught:
            await response.read()
    assert isinstance(caught.value.__cause__, ContentLengthError)


async def test_reset_is_a_real_connection_reset(lab: LabClient) -> None:
    """``reset``: the client sees a TCP RST, ClientOSError with errno ECONNRESET."""
    await set_fault(lab, "boreal", kind="reset")
    with pytest.raises(aiohttp.ClientOSError) as caught:
        await ask(lab)
    assert caught.value.errno == errno.ECONNRESET


async def test_reset_mid_body_cuts_the_body(lab: LabClient) -> None:
    """``reset`` with ``variant=mid_body``: status 200 arrives, then the body read fails."""
    await set_fault(lab, "boreal", kind="reset", variant="mid_body")
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.status == 200
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
            await response.read()


async def test_close_without_answer_is_server_disconnected(lab: LabClient) -> None:
    """``close``: the connection closes before any byte: ServerDisconnectedError."""
    await set_fault(lab, "boreal", kind="close")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await ask(lab)


async def test_not_http_is_a_response_error_not_a_status(lab: LabClient) -> None:
    """``not_http``: aiohttp reports the bad status line as ClientResponseError with 400."""
    await set_fault(lab, "boreal", kind="not_http")
    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await ask(lab)
    assert caught.value.status == 400


async def test_hang_holds_until_the_client_leaves(lab: LabClient) -> None:
    """``hang``: no answer; ``active`` counts it until the client leaves, ``answers`` after."""
    await set_fault(lab, "boreal", kind="hang")
    task = asyncio.create_task(ask(lab))
    await asyncio.sleep(0.1)
    assert not task.done()
    assert (await stats(lab))["active"] == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    current = await wait_idle(lab)
    assert current["active"] == 0
    assert current["answers"]["boreal"] == {"hang": 1}


async def test_hang_with_a_client_timeout(lab: LabClient) -> None:
    """A client's read timeout ends a ``hang``, and the lab forgets the request."""
    await set_fault(lab, "boreal", kind="hang")
    with pytest.raises(aiohttp.SocketTimeoutError):
        async with lab.get(
            "/quotes/boreal",
            params={"sku": "KB-001"},
            timeout=aiohttp.ClientTimeout(sock_read=0.1),
        ):
            pass
    assert (await wait_idle(lab))["active"] == 0


async def test_hang_answers_504_when_the_stated_deadline_passes(lab: LabClient) -> None:
    """``hang`` given ``X-Deadline-Remaining-Ms`` answers 504 once it is 50 ms past."""
    await set_fault(lab, "boreal", kind="hang")
    status, body = await ask(lab, **{"X-Deadline-Remaining-Ms": "60"})
    assert status == 504
    assert json.loads(body)["error"] == "deadline_passed"


async def test_hang_ends_without_handler_cancellation() -> None:
    """Under a server without handler cancellation, a hang still ends when the client leaves."""
    runner = web.AppRunner(create_app(LabConfig()), handler_cancellation=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with aiohttp.ClientSession(base) as session:
            async with session.put("/faults/boreal", json={"kind": "hang"}) as response:
                assert response.status == 200
            with pytest.raises(aiohttp.SocketTimeoutError):
                async with session.get(
                    "/quotes/boreal",
                    params={"sku": "KB-001"},
                    timeout=aiohttp.ClientTimeout(sock_read=0.1),
                ):
                    pass
            for _ in range(50):
                async with session.get("/stats") as response:
                    if (await response.json())["active"] == 0:
                        break
                await asyncio.sleep(0.02)
            else:
                pytest.fail("the hanging request never left `active`")
    finally:
        await runner.cleanup()


async def test_latency_delays_a_normal_answer(lab: LabClient) -> None:
    """``latency``: the normal quote, after ``ms`` milliseconds."""
    await set_fault(lab, "boreal", kind="latency", ms=120)
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, body = await ask(lab)
    assert status == 200
    assert json.loads(body) == BOREAL
    assert loop.time() - started >= 0.11


async def test_latency_stops_at_the_stated_deadline(lab: LabClient) -> None:
    """``latency`` longer than ``X-Deadline-Remaining-Ms`` answers 504 at the deadline."""
    await set_fault(lab, "boreal", kind="latency", ms=2000)
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _ = await ask(lab, **{"X-Deadline-Remaining-Ms": "50"})
    assert status == 504
    assert loop.time() - started < 0.5


async def test_slow_body_sends_headers_first(lab: LabClient) -> None:
    """``slow_body``: status and half the body at once, the rest after ``ms``."""
    await set_fault(lab, "boreal", kind="slow_body", ms=150)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        headers_at = loop.time() - started
        body = await response.read()
    assert headers_at < 0.1
    assert loop.time() - started >= 0.14
    assert json.loads(body) == BOREAL


async def test_global_latency_delays_every_supplier(lab: LabClient) -> None:
    """``PUT /latency`` adds its delay to every supplier's answer."""
    async with lab.put("/latency", json={"ms": 80}) as response:
        assert response.status == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(*(ask(lab, s) for s in ("atlas", "boreal", "cedar")))
    assert [status for status, _ in results] == [200, 200, 200]
    assert loop.time() - started >= 0.075


# -- bad data in a 200 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "body", "content_type"),
    [
        ("html", b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"),
        ("text", b"OK", "text/plain"),
        ("empty", b"", "application/json"),
        ("null", b"null", "application/json"),
    ],
)
async def test_not_json_variants(
    lab: LabClient, variant: str, body: bytes, content_type: str
) -> None:
    """``not_json``: a 200 whose body is not a JSON object (HTML, text, empty, null)."""
    await set_fault(lab, "boreal", kind="not_json", variant=variant)
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.status == 200
        assert response.content_type == content_type
        assert await response.read() == body


async def test_not_json_array_and_partial(lab: LabClient) -> None:
    """``not_json`` ``array`` wraps the quote in a list; ``partial`` is cut mid-object."""
    await set_fault(lab, "boreal", kind="not_json", variant="array", count=1)
    await set_fault(lab, "boreal", kind="not_json", variant="partial", count=1, append=True)
    assert json.loads((await ask(lab))[1]) == [BOREAL]
    status, body = await ask(lab)
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)


@pytest.mark.parametrize(
    ("field", "variant", "raw"),
    [
        ("stock", "string", b'"stock": "50"'),
        ("unit_cents", "bool", b'"unit_cents": true'),
        ("unit_cents", "float", b'"unit_cents": 1100.5'),
        ("shipping_cents", "integral_float", b'"shipping_cents": 250.0'),
        ("stock", "null", b'"stock": null'),
        ("unit_cents", "nan", b'"unit_cents": NaN'),
        ("unit_cents", "huge", b'"unit_cents": 1e400'),
    ],
)
async def test_wrong_types(lab: LabClient, field: str, variant: str, raw: bytes) -> None:
    """``wrong_types``: one integer field sent as a string, bool, float, null, NaN or 1e400."""
    await set_fault(lab, "boreal", kind="wrong_types", field=field, variant=variant)
    status, body = await ask(lab)
    assert status == 200
    assert raw in body
    assert [k for k, _ in pairs(body)] == list(BOREAL)


async def test_wrong_types_default_is_stock_as_string(lab: LabClient) -> None:
    """``wrong_types`` without parameters sends ``"stock": "50"``."""
    await set_fault(lab, "boreal", kind="wrong_types")
    assert json.loads((await ask(lab))[1])["stock"] == "50"


@pytest.mark.parametrize("field", ["unit_cents", "shipping_cents", "stock"])
async def test_negative(lab: LabClient, field: str) -> None:
    """``negative``: the chosen money or stock field is below zero, the rest is intact."""
    await set_fault(lab, "boreal", kind="negative", field=field)
    body = json.loads((await ask(lab))[1])
    assert body[field] == -BOREAL[field]
    assert {k: v for k, v in body.items() if k != field} == {
        k: v for k, v in BOREAL.items() if k != field
    }


async def test_extra_key(lab: LabClient) -> None:
    """``extra_key``: the valid quote plus a key no protocol knows (``currency`` is an offer's
    field now, so it would not be extra)."""
    await set_fault(lab, "boreal", kind="extra_key")
    assert json.loads((await ask(lab))[1]) == {**BOREAL, "warehouse": "FRA-2"}


@pytest.mark.parametrize("field", ["supplier", "sku", "unit_cents", "shipping_cents", "stock"])
async def test_missing_key(lab: LabClient, field: str) -> None:
    """``missing_key``: the valid quote without the chosen key."""
    await set_fault(lab, "boreal", kind="missing_key", field=field)
    assert json.loads((await ask(lab))[1]) == {k: v for k, v in BOREAL.items() if k != field}


async def test_duplicate_key(lab: LabClient) -> None:
    """``duplicate_key``: the key appears twice; plain ``json.loads`` keeps the second (1)."""
    await set_fault(lab, "boreal", kind="duplicate_key")
    body = (await ask(lab))[1]
    assert pairs(body)[-2:] == [("stock", 50), ("unit_cents", 1)]
    assert json.loads(body)["unit_cents"] == 1


async def test_wrong_supplier(lab: LabClient) -> None:
    """``wrong_supplier``: boreal's quote names cedar."""
    await set_fault(lab, "boreal", kind="wrong_supplier")
    assert json.loads((await ask(lab))[1]) == {**BOREAL, "supplier": "cedar"}


async def test_wrong_sku(lab: LabClient) -> None:
    """``wrong_sku``: the quote echoes a different SKU than was asked."""
    await set_fault(lab, "boreal", kind="wrong_sku")
    assert json.loads((await ask(lab))[1]) == {**BOREAL, "sku": "KB-001-OTHER"}


async def test_wrong_content_type_keeps_a_valid_quote(lab: LabClient) -> None:
    """``wrong_content_type``: a valid quote labelled ``text/plain``."""
    await set_fault(lab, "boreal", kind="wrong_content_type")
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert response.content_type == "text/plain"
        assert json.loads(await response.read()) == BOREAL


async def test_data_faults_keep_unknown_skus_404(lab: LabClient) -> None:
    """A data fault does not invent an offer: an unknown SKU is still 404."""
    await set_fault(lab, "boreal", kind="negative")
    assert (await ask(lab, sku="NOPE"))[0] == 404


# -- blips ----------------------------------------------------------------------------------


async def test_blip_fails_each_request_id_at_most_once(lab: LabClient) -> None:
    """``blip`` with p=1: the first request of each id is 503, the next one succeeds."""
    await set_fault(lab, "boreal", kind="blip", probability=1.0)
    assert (await ask(lab, request_id="x"))[0] == 503
    assert (await ask(lab, request_id="x"))[0] == 200
    assert (await ask(lab, request_id="y"))[0] == 503


async def test_blip_with_zero_probability_never_fails(lab: LabClient) -> None:
    """``blip`` with p=0 never fails."""
    await set_fault(lab, "boreal", kind="blip", probability=0)
    for request_id in "abc":
        assert (await ask(lab, request_id=request_id))[0] == 200


async def test_blip_rate_is_roughly_the_probability(lab: LabClient) -> None:
    """``blip`` with p=0.3 fails about 30% of first sights (seeded dice)."""
    await set_fault(lab, "boreal", kind="blip", probability=0.3)
    statuses = [(await ask(lab, request_id=str(i)))[0] for i in range(200)]
    assert 30 <= statuses.count(503) <= 90


# -- counts and queues -----------------------------------------------------------------------


async def test_count_limits_a_fault_to_the_next_n_requests(lab: LabClient) -> None:
    """A fault with ``count: 2`` hits the next two requests of that supplier only."""
    await set_fault(lab, "boreal", kind="http_500", count=2)
    assert [(await ask(lab))[0] for _ in range(3)] == [500, 500, 200]
    assert (await ask(lab, "atlas"))[0] == 200


async def test_no_count_lasts_until_cleared(lab: LabClient) -> None:
    """A fault without a count lasts until ``DELETE /faults/{supplier}``."""
    await set_fault(lab, "atlas", kind="http_404")
    assert [(await ask(lab, "atlas"))[0] for _ in range(3)] == [404, 404, 404]
    async with lab.delete("/faults/atlas") as response:
        assert response.status == 200
    assert (await ask(lab, "atlas"))[0] == 200


async def test_queued_faults_play_in_order(lab: LabClient) -> None:
    """Appended faults play one after another: 503, a cut body, then normal answers."""
    await set_fault(lab, "boreal", kind="http_503", count=1)
    await set_fault(lab, "boreal", kind="truncated", count=1, append=True)
    assert (await ask(lab))[0] == 503
    with pytest.raises(aiohttp.ClientPayloadError):
        await ask(lab)
    assert (await ask(lab))[0] == 200
    assert (await stats(lab))["answers"]["boreal"] == {"http_503": 1, "truncated": 1, "ok": 1}


async def test_put_replaces_the_queue(lab: LabClient) -> None:
    """``PUT`` replaces whatever faults the supplier had."""
    await set_fault(lab, "cedar", kind="http_404")
    await set_fault(lab, "cedar", kind="http_500", count=1)
    assert [(await ask(lab, "cedar"))[0] for _ in range(2)] == [500, 200]


async def test_faults_override_the_scenario(lab: LabClient) -> None:
    """An injected fault answers instead of the scenario; afterwards the scenario is back."""
    await set_fault(lab, "boreal", kind="http_429", count=1)
    assert (await ask(lab, scenario="broken"))[0] == 429
    assert (await ask(lab, scenario="broken"))[0] == 503


async def test_plain_client_session_resends_a_get_after_a_drop(lab: LabClient) -> None:
    """aiohttp's own silent re-send (issue #10790): one drop becomes two requests on the wire."""
    await set_fault(lab, "boreal", kind="close", count=1)
    async with (
        aiohttp.ClientSession(lab.make_url("/")) as session,
        session.get("/quotes/boreal", params={"sku": "KB-001"}) as response,
    ):
        assert response.status == 200
    assert (await stats(lab))["per_supplier"]["boreal"] == 2


def test_every_kind_is_tested() -> None:
    """Each fault kind appears in this module's tests."""
    with open(__file__, encoding="utf-8") as source:
        text = source.read()
    assert [k for k in Kind if f'"{k}"' not in text] == []
