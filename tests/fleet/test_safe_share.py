"""The safe share on real processes: Redis frozen, then stopped, under a fleet overload.

Two gunicorn workers, 32 callers, 50 ms suppliers: each worker admits 8 and
refuses the rest at once, so its loop is busy, and every admitted request
waits for outbound slots. While Redis is frozen (SIGSTOP: connections open,
no reply) and while it is stopped, each worker keeps to its safe share — 3 of
the 6 slots — so the lab, which counts what really arrives, never sees more
than 6 at once, and the fleet still answers nearly as much as with Redis up.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import aiohttp

from provider_lab.control_client import LabControl
from tests.fleet.conftest import BUDGET_S
from tests.fleet.procs import Gunicorn, RedisServer
from tests.test_observability import metric

CALLERS = 32
LATENCY_MS = 50
REFUSED_PAUSE_S = 0.02
"""A refused caller waits this long before it asks again.

Asking again at once, 16 refused callers make thousands of requests a
second: on 2 cores that starves the test run's other worker too (``make
bench`` drives that tight loop with wrk, without neighbours).
"""
PHASE_S = 2.0
"""Seconds of each measured phase: about 80 whole answers at the 40 a second 6 slots allow."""


async def joined(session: aiohttp.ClientSession, fleet: Gunicorn, within_s: float = 10.0) -> None:
    """Wait until every worker has joined the fleet (a replaced one may still be booting)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while True:
        async with session.get(f"{fleet.url}/metrics") as response:
            text = await response.text()
        # Host-wide: the lowest worker's "up", the highest worker count.
        up, workers = (metric(text, f"quoteflow_coordination_{m}") for m in ("up", "workers"))
        if up == 1 and workers == 2:
            return
        assert loop.time() < end, "the fleet's workers did not all join"
        await asyncio.sleep(0.1)


async def test_redis_frozen_or_stopped_the_fleet_keeps_its_limit_and_most_goodput(
    fleet: Gunicorn,
    redis_server: RedisServer,
    lab: LabControl,
    session: aiohttp.ClientSession,
) -> None:
    """Lab max_active ≤ 6 throughout; 200 or admission 503 within budget; frozen ≥ 80 % goodput."""
    loop = asyncio.get_running_loop()
    await joined(session, fleet)
    await lab.set_latency(LATENCY_MS)
    answers: list[tuple[float, float, int, dict[str, Any]]] = []
    done = asyncio.Event()

    async def caller() -> None:
        while not done.is_set():
            began = loop.time()
            async with session.post(f"{fleet.url}/api/quotes", json={}) as response:
                body = await response.json()
            answers.append((began, loop.time(), response.status, body))
            if response.status == 503:
                await asyncio.sleep(REFUSED_PAUSE_S)

    def goodput(start: float, end: float) -> float:
        """Whole answers (every supplier's quote) a second, of those that ended in the window."""
        whole = [
            1
            for _, ended, status, body in answers
            if start <= ended < end and status == 200 and not body["failures"]
        ]
        return len(whole) / (end - start)

    process = redis_server.process
    assert process is not None
    callers = [asyncio.create_task(caller()) for _ in range(CALLERS)]
    try:
        await asyncio.sleep(0.5)  # warm: leases taken, queues full
        up_from = loop.time()
        await asyncio.sleep(PHASE_S)
        up = goodput(up_from, loop.time())

        os.kill(process.pid, signal.SIGSTOP)
        try:
            frozen_from = loop.time()
            await asyncio.sleep(PHASE_S)
            frozen = goodput(frozen_from, loop.time())
        finally:
            os.kill(process.pid, signal.SIGCONT)
        await asyncio.sleep(0.8)  # back to leases

        await asyncio.to_thread(redis_server.stop)
        await asyncio.sleep(0.8)
        await asyncio.to_thread(redis_server.start)  # same port, every key lost
        await asyncio.sleep(1.0)  # the workers come back one by one, the limit holds
    finally:
        done.set()
        await asyncio.gather(*callers)
    await lab.wait_idle()
    stats = await lab.stats()
    await lab.set_latency(0)

    assert stats["max_active"] <= 6, stats["max_active"]  # the fleet's limit, even on its own
    assert {status for _, _, status, _ in answers} <= {200, 503}
    refused = [body for _, _, status, body in answers if status == 503]
    assert all(body["error"] == "capacity_exhausted" for body in refused)
    # Within budget as QuoteFlow measures it, from admission to answer. The
    # callers' own clock adds their loop's lag and the wait for a worker to
    # accept the connection, seen at up to 0.36 s past that margin during a
    # whole `make test` on 2 loaded cores, and once 1.02 s: bounded (by 2 s
    # past the budget), not held to the budget.
    served = [body["elapsed_ms"] / 1000 for _, _, status, body in answers if status == 200]
    assert max(served) <= BUDGET_S + 0.25, max(served)
    assert max(ended - began for began, ended, _, _ in answers) <= BUDGET_S + 2.0
    assert up > 0
    assert frozen >= 0.8 * up, (frozen, up)
