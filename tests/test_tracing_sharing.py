"""Tracing with coalescing and the cache on: every request keeps its own supplier spans."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from tests.otlp import Receiver
from tests.test_tracing import StartTraced, lab, quote, receiver, start_traced

__all__ = ["lab", "receiver", "start_traced"]  # the fixtures, shared with test_tracing


async def test_a_joiner_has_its_supplier_spans_and_no_attempts(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer
) -> None:
    """Two identical requests 50 ms apart (200 ms suppliers): each traced; only one sends."""
    async with (
        aiohttp.ClientSession() as session,
        session.put(str(lab.make_url("/latency")), json={"ms": 200}) as response,
    ):
        assert response.status == 200
    client = await start_traced(coalesce=True, cache_size=10, budget=1.0)

    async def later() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return await quote(client)

    first, second = await asyncio.gather(quote(client), later())
    assert first["quotes"] == second["quotes"]
    assert second["explain"]["suppliers"]["boreal"]["joined"] == first["request_id"]
    starter = await receiver.trace_of(first["request_id"], spans=1 + 3 + 3)
    joiner = await receiver.trace_of(second["request_id"], spans=1 + 3)
    assert len(starter.spans) == 1 + 3 + 3  # the server span, a span per supplier, the attempts
    assert len(joiner.spans) == 1 + 3  # the joiner sent nothing: no attempt spans


async def test_a_starter_that_hands_its_call_over_says_so_and_makes_no_half_span(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer
) -> None:
    """The starter's deadline comes before the 1.05 s suppliers answer: it hands the call to a
    later joiner; its span names that joiner, with no attempt span it cannot describe.

    The joiner comes 0.1 s after the starter and must be there by the starter's
    deadline: a budget of 1 s leaves a loaded machine 0.9 s for that.
    """
    async with (
        aiohttp.ClientSession() as session,
        session.put(str(lab.make_url("/latency")), json={"ms": 1050}) as response,
    ):
        assert response.status == 200
    client = await start_traced(coalesce=True, budget=1.0)

    async def later() -> dict[str, Any]:
        await asyncio.sleep(0.1)
        return await quote(client)

    first, second = await asyncio.gather(quote(client), later())
    assert first["explain"]["suppliers"]["boreal"]["handed_over"] == second["request_id"]
    assert second["explain"]["suppliers"]["boreal"]["joined"] == first["request_id"]
    starter = await receiver.trace_of(first["request_id"], spans=1 + 3)
    owner = await receiver.trace_of(second["request_id"], spans=1 + 3)
    handed = starter.supplier("boreal")
    assert handed.attributes["quoteflow.handed_over"] == second["request_id"]
    assert starter.children(handed) == []
    for span in starter.spans + owner.spans:
        parent = next((p for p in starter.spans + owner.spans if p.span_id == span.parent_id), None)
        if parent is not None:
            assert parent.start_ns <= span.start_ns <= span.end_ns <= parent.end_ns
    assert owner.supplier("boreal").attributes["quoteflow.joined"] == first["request_id"]
