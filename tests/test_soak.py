"""Soak: thousands of mixed requests, every fault and scenario, more callers than slots.

Afterwards nothing may be left over: no 5xx but busy 503s (each with
Retry-After), in-flight counters back to 0, the suppliers never saw more
attempts at once than the outbound limit, no task still pending, nothing
reported to the loop's exception handler (unclosed sessions or connections,
lost task exceptions), and memory that does not grow with the request count.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from quoteflow import handlers
from quoteflow.app import SUPPLIER_CLIENT
from quoteflow.auth import ApiKeys
from quoteflow.config import SCENARIOS
from tests.conftest import StartQuoteFlow
from tests.fakes import (
    CATALOGUE,
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

CALLERS = 24
"""Concurrent callers: three times the inbound limit."""
INBOUND_LIMIT = 8
OUTBOUND_LIMIT = 6
BUDGET = 0.25
KEY = "soak-key-0123456789"
BATCH = 1000
WARM_BATCHES = 2
MEASURED_BATCHES = 4
"""Requests are sent in batches; memory is traced over the measured ones only."""
LEAK_PER_REQUEST = 300
"""Bytes a request may leave behind on average before it counts as a leak."""


def flaky() -> Responder:
    """503 on a first attempt, the quote on the retry (stateless: keyed on X-Attempt)."""
    broken, healthy = status(503), quote()

    async def respond(request: web.Request) -> web.StreamResponse:
        first = request.headers.get("X-Attempt", "1") == "1"
        return await (broken if first else healthy)(request)

    return respond


def echoing(**overrides: Any) -> Responder:
    """200 with this supplier's quote for the SKU asked, fields replaced by ``overrides``."""

    async def respond(request: web.Request) -> web.StreamResponse:
        supplier = request.match_info["supplier"]
        return web.json_response({**payload(supplier, request.query["sku"]), **overrides})

    return respond


def oversized() -> Responder:
    """200 with a 200 KB body: over the 64 KiB supplier cap."""
    return raw(b'{"pad": "' + b"x" * 200_000 + b'"}')


FAULTS: list[tuple[float, Callable[[], Responder]]] = [
    (40, quote),
    (6, lambda: status(503)),
    (2, lambda: status(503, headers={"Retry-After": "0"})),
    (2, lambda: status(404)),
    (2, lambda: status(429, headers={"Retry-After": "1"})),
    (2, lambda: status(500)),
    (3, flaky),
    (2, lambda: raw(b"<html>not json</html>", content_type="text/html")),
    (2, lambda: echoing(unit_cents="1100")),
    (1, lambda: echoing(stock=True)),
    (1, lambda: echoing(shipping_cents=-1)),
    (1, lambda: echoing(extra=1)),
    (1, lambda: json_body({"supplier": "boreal", "sku": "KB-001"})),
    (1, lambda: echoing(supplier="nobody")),
    (1, lambda: echoing(sku="OTHER")),
    (2, bad_gzip),
    (2, lambda: gzipped(payload("boreal"))),
    (2, truncated),
    (2, reset),
    (2, close),
    (4, lambda: delay(0.02)),
    (0.25, lambda: delay(BUDGET * 2)),
    (0.25, hang),
    (1, oversized),
]
"""Every fault of tests/fakes.py and a few more, with weights."""

SCENARIO_FAULTS: dict[str, Callable[[], Responder]] = {
    "slow": lambda: delay(BUDGET * 2),
    "broken": lambda: status(503),
    "malformed": lambda: echoing(unit_cents="1100"),
    "flaky": flaky,
}
"""What boreal does in each lab scenario other than ``normal`` (as the lab does)."""


def mixed(rng: random.Random) -> Responder:
    """A responder that picks a fault per request: boreal follows the scenario, others random."""
    weights = [weight for weight, _ in FAULTS]
    makers = [make for _, make in FAULTS]

    async def respond(request: web.Request) -> web.StreamResponse:
        scenario = request.query.get("scenario", "normal")
        if request.match_info["supplier"] == "boreal" and scenario in SCENARIO_FAULTS:
            make = SCENARIO_FAULTS[scenario]
        else:
            make = rng.choices(makers, weights)[0]
        return await make()(request)

    return respond


def inbound(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    """One caller request: method, path, body and headers, mostly valid quote requests."""
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    roll = rng.random()
    if roll < 0.03:
        return "POST", "/api/quotes", b"{}", {}  # no key: 401
    if roll < 0.06:
        return "POST", "/api/quotes", b"{not json", headers  # 400
    if roll < 0.10:
        body = json.dumps({"quantity": rng.choice([0, 101, "2", 2.0, True]), "url": "x"})
        return "POST", "/api/quotes", body.encode(), headers  # 422
    if roll < 0.12:
        return "POST", "/api/quotes", b"{}" + b" " * 20_000, headers  # 413
    if roll < 0.14:
        return "GET", rng.choice(["/health", "/ready", "/metrics"]), b"", {}
    scenario = rng.choices(SCENARIOS, [90, 1, 3, 3, 3])[0]
    request = {
        "sku": rng.choice(["KB-001", "KB-002", "A&scenario=broken", "../x", "ключ"]),
        "quantity": rng.randint(1, 3),
        "scenario": scenario,
    }
    path = "/api/quotes?explain=1" if rng.random() < 0.1 else "/api/quotes"
    return "POST", path, json.dumps(request).encode(), headers


async def run_batch(
    session: aiohttp.ClientSession, rng: random.Random, count: int, seen: Counter[int]
) -> None:
    """Send ``count`` requests from ``CALLERS`` concurrent callers; check every answer."""
    queue = [inbound(rng) for _ in range(count)]

    async def caller() -> None:
        while queue:
            method, path, body, headers = queue.pop()
            async with session.request(method, path, data=body, headers=headers) as response:
                answer = await response.read()
                seen[response.status] += 1
                assert response.status < 500 or response.status == 503, answer
            if response.status == 503 and path.startswith("/api/"):
                assert response.headers["Retry-After"] == "1"
                assert json.loads(answer) == {"error": "capacity_exhausted"}
                # A polite caller backs off before asking again (1 s would make the
                # soak a minute long; a few ms keeps the slots contended).
                await asyncio.sleep(rng.uniform(0.005, 0.02))

    async with asyncio.TaskGroup() as group:
        for _ in range(CALLERS):
            group.create_task(caller())


def check_attempts(suppliers: FakeSuppliers) -> None:
    """No supplier saw more than two attempts for one request id; then forget them."""
    per_call = Counter((r.request_id, r.supplier) for r in suppliers.received)
    # A batch may ask no supplier at all: a quick one (most requests refused
    # or invalid) can pass while every circuit is open or every supplier
    # paused by its 429's Retry-After.
    assert max(per_call.values(), default=0) <= 2, per_call.most_common(3)
    suppliers.received.clear()


async def test_soak(start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers) -> None:
    """Thousands of mixed requests leave no 5xx, no slot, no task and no growing memory behind."""
    rng = random.Random(20261129)
    for supplier in CATALOGUE:
        suppliers.always(supplier, mixed(random.Random(f"{rng.random()}-{supplier}")))
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous_handler = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    client = await start_quoteflow(
        budget=BUDGET,
        inbound_limit=INBOUND_LIMIT,
        outbound_limit=OUTBOUND_LIMIT,
        api_keys=ApiKeys([KEY]),
    )
    seen: Counter[int] = Counter()
    started = time.perf_counter()
    # Callers get a session of their own: the test client keeps every response.
    async with aiohttp.ClientSession(str(client.make_url(""))) as session:
        for _ in range(WARM_BATCHES):
            await run_batch(session, rng, BATCH, seen)
            check_attempts(suppliers)  # then forget: the fake's record is not QuoteFlow's memory
        gc.collect()
        tracemalloc.start()
        try:
            await run_batch(session, rng, BATCH, seen)
            check_attempts(suppliers)
            gc.collect()
            baseline = tracemalloc.get_traced_memory()[0]
            for _ in range(MEASURED_BATCHES - 1):
                await run_batch(session, rng, BATCH, seen)
                check_attempts(suppliers)
            gc.collect()
            growth = tracemalloc.get_traced_memory()[0] - baseline
        finally:
            tracemalloc.stop()
    elapsed = time.perf_counter() - started

    total = (WARM_BATCHES + MEASURED_BATCHES) * BATCH
    assert sum(seen.values()) == total
    assert set(seen) <= {200, 400, 401, 413, 422, 503}, seen
    # 24 callers for 8 slots: most requests are refused at once, by design; still
    # about a thousand get a full fan-out through the faults.
    assert seen[200] >= total // 10, seen
    assert seen[503] > 0, "the callers never outnumbered the slots"
    measured = (MEASURED_BATCHES - 1) * BATCH
    assert growth < LEAK_PER_REQUEST * measured, f"{growth} bytes kept over {measured} requests"

    # Every slot given back, and the limits held on the wire.
    assert client.app is not None
    assert client.app[handlers.SERVICE].in_flight == 0
    assert client.app[SUPPLIER_CLIENT].in_flight == 0
    assert suppliers.max_in_flight <= OUTBOUND_LIMIT

    # Close everything; then no task but this test's own may remain.
    await client.close()
    current = asyncio.current_task()
    for _ in range(100):
        left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
        if not left:
            break
        await asyncio.sleep(0.01)
    assert left == [], left
    gc.collect()
    await asyncio.sleep(0)
    loop.set_exception_handler(previous_handler)
    assert reported == [], reported
    print(f"soak: {total} requests in {elapsed:.1f} s, {dict(seen)}, kept {growth} bytes")
