"""Edges found in review: slow and undecodable bodies, valid-but-unusable JSON, start-up
values, phantom attempts, slow healthy suppliers, the environment's proxies, /ready."""

from __future__ import annotations

import asyncio
import gzip
import logging
import signal
import subprocess
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from quoteflow.app import SUPPLIER_CLIENT
from quoteflow.catalogue import MAX_SUPPLIERS
from quoteflow.handlers import SERVICE
from quoteflow.logs import quiet_caller_mistakes
from quoteflow.options import ConfigError, parse_settings
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, delay, hang, payload, status
from tests.process import quoteflow_process
from tests.test_decision_table import ask
from tests.test_observability import explain, metric


async def raw_request(port: int, head: bytes, body_parts: list[tuple[float, bytes]]) -> bytes:
    """Send ``head`` then each body part after its pause; return the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    for pause, part in body_parts:
        await asyncio.sleep(pause)
        writer.write(part)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_slow_body_is_408_and_holds_no_slot(start_quoteflow: StartQuoteFlow) -> None:
    """A body that trickles in is refused with 408; meanwhile the only slot serves others."""
    client = await start_quoteflow(inbound_limit=1, body_timeout=0.3)
    assert client.port is not None
    head = (
        b"POST /api/quotes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nConnection: close\r\n\r\n{"
    )
    slow = asyncio.create_task(raw_request(client.port, head, [(2.0, b"}")]))
    await asyncio.sleep(0.1)
    assert client.app[SERVICE].in_flight == 0
    assert (await client.post("/api/quotes", json={})).status == 200
    answer = await slow
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"body_timeout"' in answer


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip", b"not gzip at all"),
        # A bad CRC/length trailer; mtime=0 keeps the test id the same in every process.
        ("gzip", gzip.compress(b"{}", mtime=0)[:-4] + b"\x00\x00\x00\x00"),
        ("deflate", b"not deflate either"),
    ],
)
async def test_undecodable_request_body_is_400(
    start_quoteflow: StartQuoteFlow, encoding: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """A Content-Encoding that does not decode is the caller's error (400), not ours (500)."""
    quiet_caller_mistakes()  # as the command line's logging setup does
    caplog.set_level(logging.INFO)
    client = await start_quoteflow()
    assert client.port is not None
    head = (
        f"POST /api/quotes HTTP/1.1\r\nHost: x\r\nContent-Encoding: {encoding}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    answer = await raw_request(client.port, head + body, [])
    # aiohttp closes such a connection after the answer; the first answer is ours.
    assert answer.startswith(b"HTTP/1.1 400")
    assert b'"error":"invalid_json"' in answer
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_requests_total", result="error") == 0
    # aiohttp meets the broken body again when it drains it: not an error of ours.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "caller_body_error" in [getattr(r, "event", None) for r in caplog.records]


async def test_gzipped_request_body_is_accepted(start_quoteflow: StartQuoteFlow) -> None:
    """A correctly gzipped body is read as the JSON it carries."""
    client = await start_quoteflow()
    response = await client.post(
        "/api/quotes",
        data=gzip.compress(b'{"quantity": 1}'),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert response.status == 200
    assert (await response.json())["quantity"] == 1


@pytest.mark.parametrize("body", [b'{"quantity": ' + b"9" * 5000 + b"}", b"[" * 5000 + b"]" * 5000])
async def test_valid_but_unusable_json_is_422(start_quoteflow: StartQuoteFlow, body: bytes) -> None:
    """Valid JSON that no request can be (a 5000-digit integer, deep nesting) is 422, not 400."""
    response = await (await start_quoteflow()).post("/api/quotes", data=body)
    assert response.status == 422
    assert (await response.json())["error"] == "invalid_request"


@pytest.mark.parametrize(
    "argv",
    [
        ["--budget", "inf"],
        ["--budget", "1e308"],
        ["--budget", "nan"],
        ["--provider-url", "http://"],
        ["--provider-url", "http://127.0.0.1:99999"],
        ["--provider-url", "http://[::1"],
        ["--budget", "0.004"],
        ["--no-such-flag"],
    ],
)
def test_values_that_cannot_run_are_refused(argv: list[str]) -> None:
    """Every value QuoteFlow could start with but not serve with is refused up front."""
    with pytest.raises(ConfigError):
        parse_settings(argv, {})


def test_port_in_use_is_one_line() -> None:
    """A port already taken stops start-up with one line and exit 2, no traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "quoteflow", "--port", str(port), "--log-level", "error"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"quoteflow: error: cannot listen on 127.0.0.1:{port}")


async def test_calls_that_never_got_a_slot_are_not_attempts(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Metrics and the bill count only attempts the supplier really received."""
    suppliers.always("boreal", hang())
    # Room for atlas and cedar beside boreal's share of 2: boreal's free slots
    # always go to the first two calls.
    client = await start_quoteflow(read_timeout=10.0, outbound_limit=6, supplier_share=2)

    async def timeouts() -> float:
        text = await (await client.get("/metrics")).text()
        return metric(
            text,
            "quoteflow_supplier_attempts_total",
            supplier="boreal",
            attempt="1",
            outcome="timeout",
        )

    # First one call cut by the deadline: boreal is then known to need the
    # whole budget, so no waiter is handed a slot with too little time left to
    # reach it (one sent with milliseconds left could be cut on its way, counted
    # by QuoteFlow and never seen by the supplier; on a busy machine it was).
    await client.post("/api/quotes", json={})
    assert await timeouts() == suppliers.count("boreal") == 1
    await asyncio.gather(*(client.post("/api/quotes", json={}) for _ in range(6)))
    counted = await timeouts() - 1
    # Two hold boreal's share; whatever was sent is exactly what the metrics
    # count, and the calls that never got a slot are not in it.
    assert counted == suppliers.count("boreal") - 1
    assert 2 <= counted < 6


async def test_slow_but_healthy_supplier_keeps_its_quotes(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Atlas answering in 150 ms, 8 requests at once: the default share loses none of them."""
    suppliers.always("atlas", delay(0.15))
    client = await start_quoteflow(budget=0.8)
    responses = await asyncio.gather(*(client.post("/api/quotes", json={}) for _ in range(8)))
    for response in responses:
        result = await response.json()
        assert result["failures"] == []


async def test_proxy_settings_in_the_environment_are_ignored(
    start_quoteflow: StartQuoteFlow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY pointing nowhere does not affect supplier calls; the pool is the limit."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    client = await start_quoteflow(outbound_limit=5)
    result = await ask(client)
    assert result["failures"] == []
    connector = client.app[SUPPLIER_CLIENT]._session.connector
    assert connector is not None
    # The outbound limit, and room for each supplier's OAuth2 token fetch (none here).
    assert connector.limit == 5 + MAX_SUPPLIERS


async def test_retry_after_zero_without_time_is_no_time(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Retry-After: 0 asks for no wait, so a refusal for lack of time is no_time."""
    suppliers.always("boreal", delay(0.2, status(503, headers={"Retry-After": "0"})))
    body = await explain(await start_quoteflow(budget=0.3))  # 100 ms left: not enough
    assert body["explain"]["suppliers"]["boreal"]["stopped"] == "no_time"


async def test_ready_is_503_while_draining(suppliers: FakeSuppliers) -> None:
    """After SIGTERM a real process answers /ready 503 for the drain, then exits 0."""
    flags = ("--shutdown-drain", "1.0", "--log-level", "warning")
    async with quoteflow_process(suppliers.url, *flags) as running:
        url = running.url
        async with aiohttp.ClientSession() as session, session.get(url + "/ready") as ready:
            assert ready.status == 200
        running.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        async with aiohttp.ClientSession() as fresh:  # a new connection, as a prober makes
            async with fresh.get(url + "/ready") as ready:
                assert ready.status == 503
                body: Any = await ready.json()
                assert body == {"status": "shutting_down"}
            async with fresh.get(url + "/health") as health:
                assert health.status == 200
            async with fresh.post(url + "/api/quotes", json={}) as served:
                assert served.status == 200
        assert await asyncio.wait_for(running.process.wait(), 10) == 0


async def test_a_supplier_cookie_never_reaches_a_later_request(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """One session serves every caller, so a cookie a supplier sets is not kept or sent on."""

    async def sets_a_cookie(request: web.Request) -> web.StreamResponse:
        response = web.json_response(payload("boreal", request.query["sku"]))
        response.set_cookie("session", "caller-one")
        return response

    suppliers.script("boreal", sets_a_cookie)
    # By host name: aiohttp's default jar would silently drop a cookie from an IP address.
    by_name = suppliers.url.replace("127.0.0.1", "localhost")
    client = await start_quoteflow(provider_url=by_name)
    await ask(client)
    await ask(client)
    assert [r.headers.get("Cookie") for r in suppliers.received] == [None] * 6


async def test_each_sku_and_scenario_reaches_the_supplier_as_asked(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Supplier URLs are reused per SKU and scenario; each request still asks for its own."""
    client = await start_quoteflow()
    asked = [("KB-001", "normal"), ("MS-002", "flaky"), ("KB-001", "flaky"), ("KB-001", "normal")]
    for sku, scenario in asked:
        await ask(client, sku=sku, scenario=scenario)
    seen = [(r.query["sku"], r.query["scenario"]) for r in suppliers.of("atlas")]
    assert seen == asked
    assert all(set(r.query) == {"sku", "scenario"} for r in suppliers.received)


@pytest.mark.parametrize(
    "head",
    [
        b"POST /api/quotes HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    ],
    ids=["bad Content-Length", "header line too long"],
)
async def test_a_request_that_is_not_valid_http_is_400_and_not_our_error(
    start_quoteflow: StartQuoteFlow, head: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp answers what it cannot parse; the log says so at info, not as our error."""
    quiet_caller_mistakes()  # as the command line's logging setup does
    caplog.set_level(logging.INFO)
    client = await start_quoteflow()
    assert client.port is not None
    answer = await raw_request(client.port, head, [])
    assert answer.split(b" ", 2)[1] == b"400"  # aiohttp answers HTTP/1.0 when it cannot parse
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert "caller_bad_http" in [getattr(r, "event", None) for r in caplog.records]
    assert (await client.get("/health")).status == 200


async def test_an_unknown_key_that_is_a_lone_surrogate_is_still_422(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """Valid JSON that no UTF-8 encoder takes back as-is still gets the contract's 422 JSON."""
    client = await start_quoteflow()
    response = await client.post(
        "/api/quotes", data=b'{"\\ud800": 1}', headers={"Content-Type": "application/json"}
    )
    assert response.status == 422
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert await response.json() == {
        "error": "invalid_request",
        "detail": [{"loc": ["\ud800"], "msg": "unknown field"}],
    }


async def test_caller_mistakes_stay_out_of_a_warning_level_log(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """Lowered to info, a caller's malformed request is not written at --log-level warning."""
    quiet_caller_mistakes()
    # As the command line sets it up: the root logger at warning, a handler with no level.
    written: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append(record)

    handler = Keep()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    try:
        client = await start_quoteflow()
        assert client.port is not None
        head = b"POST /api/quotes HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"
        answer = await raw_request(client.port, head, [])
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert answer.split(b" ", 2)[1] == b"400"
    events = [getattr(r, "event", r.getMessage()) for r in written]
    assert events == ["api_keys_off"]  # the start-up warning, and nothing of the caller's
