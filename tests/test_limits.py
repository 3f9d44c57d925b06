"""Inbound admission and the shared outbound limit: bounded, never leaked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from quoteflow.app import SUPPLIER_CLIENT
from quoteflow.handlers import SERVICE
from quoteflow.models import Failure, QuoteRequest, SupplierQuote, SupplierTrace
from quoteflow.service import SupplierGateway
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, Responder, delay, quote, status
from tests.test_decision_table import ask


def gated(gate: asyncio.Event, entered: asyncio.Event) -> Responder:
    """Answer normally, but only once ``gate`` opens; ``entered`` says a request arrived."""

    async def respond(request: web.Request) -> web.StreamResponse:
        entered.set()
        await gate.wait()
        return await quote()(request)

    return respond


async def test_request_beyond_the_limit_gets_503_and_takes_no_slot(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Busy: 503 + Retry-After: 1 at once; capacity is reused once the first request ends."""
    gate, entered = asyncio.Event(), asyncio.Event()
    suppliers.script("atlas", gated(gate, entered))
    client = await start_quoteflow(inbound_limit=1, budget=2.0)
    first = asyncio.create_task(client.post("/api/quotes", json={}))
    await entered.wait()

    busy = await client.post("/api/quotes", json={})
    assert busy.status == 503
    assert busy.headers["Retry-After"] == "1"
    assert await busy.json() == {"error": "capacity_exhausted"}
    assert suppliers.count("atlas") == 1  # the refused request reached no supplier

    gate.set()
    assert (await first).status == 200
    assert client.app[SERVICE].in_flight == 0
    result = await ask(client)
    assert result["best"]["supplier"] == "boreal"


async def test_outbound_limit_is_never_exceeded(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Many concurrent requests never put more attempts in flight than the outbound limit."""
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, delay(0.01))
    suppliers.script("boreal", *[status(503)] * 5)
    client = await start_quoteflow(inbound_limit=16, outbound_limit=3, budget=2.0)
    responses = await asyncio.gather(
        *(client.post("/api/quotes", json={"quantity": 1}) for _ in range(16))
    )
    assert [r.status for r in responses] == [200] * 16
    assert suppliers.max_in_flight == 3
    assert client.app[SUPPLIER_CLIENT].in_flight == 0


async def test_backoff_does_not_hold_the_outbound_slot(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """With one outbound slot, cedar is sent the moment boreal's 503 is in, not after the backoff.

    Arrival order alone cannot tell the two apart (waiters are served first
    come, first served either way); time can. The slot freed at once lets
    cedar, queued since the start, reach its supplier within milliseconds of
    boreal's 503. A slot kept through the backoff would hold cedar back for
    the whole 0.3 s of it.
    """
    backoff = 0.3
    suppliers.script("boreal", status(503))
    client = await start_quoteflow(
        outbound_limit=1, budget=3.0, backoff_min=backoff, backoff_max=backoff
    )
    result = await ask(client, quantity=1)
    assert result["failures"] == []
    atlas, (first, second), cedar = (suppliers.of(s) for s in ("atlas", "boreal", "cedar"))
    assert atlas[0].at < first.at < cedar[0].at < second.at
    assert cedar[0].at - first.at < backoff / 2
    assert second.at - first.at >= backoff


async def test_admission_rechecks_the_limit_once_bodies_are_in(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Nine callers pass the early check while their bodies trickle in: eight served, one 503.

    The inbound limit is checked twice: before the body is read (a cheap
    refusal) and when the slot is taken. Every caller here meets the first
    check with nobody admitted yet, so only the second one can hold the line.
    """
    gate, entered = asyncio.Event(), asyncio.Event()
    suppliers.always("atlas", gated(gate, entered))
    client = await start_quoteflow(inbound_limit=8, budget=5.0, body_timeout=5.0)
    body_complete = asyncio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"quantity":'
        await body_complete.wait()
        yield b" 1}"

    callers = [
        asyncio.create_task(
            client.post("/api/quotes", data=trickle(), headers={"Content-Type": "application/json"})
        )
        for _ in range(9)
    ]
    # Let every caller's headers and first bytes arrive: each handler passes the
    # early check and then waits for the rest of its body.
    await asyncio.sleep(0.3)
    assert client.app[SERVICE].in_flight == 0
    body_complete.set()

    refused = await next(asyncio.as_completed(callers))
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    assert await refused.json() == {"error": "capacity_exhausted"}
    assert client.app[SERVICE].in_flight == 8

    gate.set()
    statuses = sorted([(await caller).status for caller in callers])
    assert statuses == [200] * 8 + [503]
    assert suppliers.count("atlas") == 8
    assert client.app[SERVICE].in_flight == 0


def _quoteflow_tasks() -> list[asyncio.Task[Any]]:
    """Tasks still running QuoteFlow code (the per-supplier fan-out)."""
    return [
        task
        for task in asyncio.all_tasks()
        if "quoteflow" in getattr(task.get_coro(), "__qualname__", "")
        or "QuoteService" in repr(task.get_coro())
    ]


class _BuggyGateway:
    """Wraps the real client; boreal's call raises a bug after its real attempt."""

    def __init__(self, client: SupplierGateway) -> None:
        self._client = client

    async def quote(
        self, trace: SupplierTrace, request: QuoteRequest, request_id: str, deadline: float
    ) -> SupplierQuote | Failure:
        outcome = await self._client.quote(trace, request, request_id, deadline)
        if trace.supplier == "boreal":
            raise RuntimeError("a bug in supplier handling")
        return outcome


async def test_a_bug_is_a_500_and_every_slot_comes_back(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A bug is 500 JSON with no traceback; inbound, outbound slots and tasks are all back."""
    suppliers.always("atlas", delay(0.05))
    client = await start_quoteflow(gateway=_BuggyGateway, inbound_limit=1)
    response = await client.post("/api/quotes", json={})
    assert response.status == 500
    body: dict[str, Any] = await response.json()
    assert body == {"error": "internal_error"}
    assert client.app[SERVICE].in_flight == 0
    assert client.app[SUPPLIER_CLIENT].in_flight == 0
    assert not _quoteflow_tasks()
    # The single inbound slot is free again: the next request is served.
    response = await client.post("/api/quotes", json={})
    assert response.status == 500
