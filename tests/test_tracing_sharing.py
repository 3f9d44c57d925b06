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
