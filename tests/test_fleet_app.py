"""Fleet mode end to end: QuoteFlow apps from ``create_app``, sharing a real redis-server.

Each app is a worker of its own (its own coordinator, worker id and Redis
connections); the fake suppliers behind them count what really arrives.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from quoteflow.app import COORDINATOR
from quoteflow.catalogue import LAB_SUPPLIERS as SUPPLIERS
from tests.conftest import LOADED_MARGIN, StartQuoteFlow
from tests.fakes import FakeSuppliers, delay, first_time_per_request_id, status
from tests.process import free_port
from tests.redis_server import RedisServer
from tests.test_fleet import REDIS_TIMEOUT, wait_until

Client = TestClient[Any, Any]


async def two_workers(
    start_quoteflow: StartQuoteFlow, redis: RedisServer, **overrides: Any
) -> tuple[Client, Client]:
    """Two QuoteFlow workers of one fleet."""
    values: dict[str, Any] = {"redis_url": redis.url, "redis_timeout": REDIS_TIMEOUT}
    values.update(overrides)
    return await start_quoteflow(**values), await start_quoteflow(**values)


async def keep_asking(
    client: Client, stop: asyncio.Event, seen: list[tuple[int, float]], **body: Any
) -> None:
    """Ask for quotes until ``stop``, recording each answer's status and time."""
    while not stop.is_set():
        started = time.monotonic()
        response = await client.post("/api/quotes", json=body)
        await response.read()
        seen.append((response.status, time.monotonic() - started))


async def metric(client: Client, name: str) -> str | None:
    """The value of an unlabelled metric on ``/metrics``, or None when it is absent."""
    text = await (await client.get("/metrics")).text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return line.split()[1]
    return None


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == name]


async def test_two_workers_keep_one_outbound_limit_and_share(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Two workers flooded from start-up on: at most 6 attempts at the suppliers, 4 at one."""
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.02))
    suppliers.always("boreal", delay(0.06))  # the slow one, that would take more than its share
    workers = await two_workers(start_quoteflow, redis_server, inbound_limit=16, budget=2.0)
    responses = await asyncio.gather(
        *(c.post("/api/quotes", json={"quantity": 1}) for c in workers for _ in range(16))
    )
    bodies = [await r.json() for r in responses]
    assert [r.status for r in responses] == [200] * 32
    assert all(body["failures"] == [] for body in bodies)
    assert suppliers.max_in_flight == 6
    assert max(suppliers.max_in_flight_of.values()) <= 4
    for client in workers:
        assert client.app[COORDINATOR].up


async def test_no_capacity_is_stranded_between_two_workers(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """50 ms suppliers, load over two workers: the fleet answers near limit ÷ (3 × 50 ms)."""
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.05))
    workers = await two_workers(start_quoteflow, redis_server, inbound_limit=8, budget=0.8)
    stop, seen = asyncio.Event(), [list[tuple[int, float]]() for _ in workers]
    load = [
        asyncio.create_task(keep_asking(client, stop, seen[index], quantity=1))
        for index, client in enumerate(workers)
        for _ in range(8)
    ]
    await asyncio.sleep(0.3)  # past the first wave
    before = len(suppliers.received)
    await asyncio.sleep(1.5)
    attempts_per_second = (len(suppliers.received) - before) / 1.5
    stop.set()
    await asyncio.gather(*load)
    # 6 slots / 50 ms = 120 attempts a second at most (40 answered requests).
    # Capacity stranded in one worker would halve that; everything here (two
    # apps, the suppliers, the callers) shares one event loop on a shared
    # machine, so the bound sits between the two. The 90 % is
    # measured on real processes by `make bench` (bench/fleet.py).
    assert attempts_per_second >= 0.65 * 120, attempts_per_second
    assert all(status == 200 for per in seen for status, _ in per)
    assert suppliers.max_in_flight <= 6
    assert min(len(per) for per in seen) >= 0.3 * sum(len(per) for per in seen)  # both served


async def test_redis_down_and_back_under_load(
    redis_server: RedisServer,
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis stopped: still 200 within the budget, gauge 0, one warning each; back within 2 s."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.01))
    budget = 0.3
    workers = await two_workers(start_quoteflow, redis_server, budget=budget)
    coordinators = [client.app[COORDINATOR] for client in workers]
    stop, seen = asyncio.Event(), list[tuple[int, float]]()
    load = [
        asyncio.create_task(keep_asking(client, stop, seen)) for client in workers for _ in range(4)
    ]
    await asyncio.sleep(0.3)

    await asyncio.to_thread(redis_server.stop)  # the loop keeps serving meanwhile
    await wait_until(lambda: not any(c.up for c in coordinators), within=1.5)
    assert [await metric(client, "quoteflow_coordination_up") for client in workers] == [
        "0.0",
        "0.0",
    ]
    await asyncio.sleep(0.6)  # serving on local limits, reconnecting now and then

    await asyncio.to_thread(redis_server.start)
    back = await wait_until(lambda: all(c.up for c in coordinators), within=2.5)
    assert back <= 2.0
    await asyncio.sleep(0.5)  # attempts started on local limits are over; grants resume
    suppliers.max_in_flight = 0
    suppliers.max_in_flight_of = dict.fromkeys(SUPPLIERS, 0)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*load)

    assert {status for status, _ in seen} == {200}
    # On their own, the workers first keep within their leases (others may
    # still use theirs): an attempt for a supplier a worker held no lease of
    # waits for the deadline — and the answer still comes at the deadline, as
    # the caller on the same loop sees it: plus the closed-loop margin (seen:
    # 0.42 s against 0.4 s twice, the report and a fresh run).
    assert max(elapsed for _, elapsed in seen) <= budget + 2 * LOADED_MARGIN
    assert suppliers.max_in_flight <= 6  # fleet-wide again
    assert max(suppliers.max_in_flight_of.values()) <= 4
    down = events(caplog, "coordination_down")
    assert sorted(r.fields["worker"] for r in down) == sorted(  # type: ignore[attr-defined]
        c.worker_id for c in coordinators
    )
    assert all(r.levelno == logging.WARNING for r in down)
    assert [await metric(client, "quoteflow_coordination_up") for client in workers] == [
        "1.0",
        "1.0",
    ]


async def test_a_broken_supplier_costs_the_fleet_one_retry_budget(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """boreal always 503 through two workers: ≤ 1.2 boreal requests per inbound, fleet-wide."""
    suppliers.always("boreal", status(503))
    workers = await two_workers(start_quoteflow, redis_server, budget=0.8)

    async def ask(count: int) -> None:
        for client in workers:
            responses = await asyncio.gather(
                *(client.post("/api/quotes", json={}) for _ in range(count))
            )
            assert {r.status for r in responses} == {200}

    for _ in range(3):  # the burst: the bucket's 20 retries are spent
        await ask(8)
    after_burst = suppliers.count("boreal")
    assert after_burst <= 48 + 20 + 4.8 + 2  # one bucket, not one per worker (that'd be 40)
    for _ in range(13):
        await ask(8)
    inbound = 13 * 8 * 2
    assert suppliers.count("boreal") - after_burst <= 1.2 * inbound


async def test_a_flaky_supplier_is_recovered_through_two_workers(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """boreal 503 once per request id: its retries pay off, ≥ 99 % get boreal's quote."""
    suppliers.always("boreal", first_time_per_request_id(status(503)))
    workers = await two_workers(start_quoteflow, redis_server, budget=0.8)
    recovered = total = 0
    for _ in range(13):
        for client in workers:
            responses = await asyncio.gather(
                *(client.post("/api/quotes", json={}) for _ in range(8))
            )
            for response in responses:
                body = await response.json()
                total += 1
                recovered += any(q["supplier"] == "boreal" for q in body["quotes"])
    assert recovered >= 0.99 * total, (recovered, total)


async def test_coordination_is_visible_in_the_metrics_only_in_fleet_mode(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow
) -> None:
    """quoteflow_coordination_up is 1 in a fleet that reaches Redis, absent in one process; the
    fleet's metrics say which host they are of, and that no host differs or switched."""
    fleet = await start_quoteflow(redis_url=redis_server.url, redis_timeout=REDIS_TIMEOUT)
    await wait_until(lambda: fleet.app[COORDINATOR].up)
    assert await metric(fleet, "quoteflow_coordination_up") == "1.0"
    text = await (await fleet.get("/metrics")).text()
    assert 'quoteflow_coordination_syncs_total{result="ok"}' in text
    assert f'quoteflow_host_info{{host="{socket.gethostname()}"}} 1.0' in text
    assert await metric(fleet, "quoteflow_fleet_settings_differ") == "0.0"
    assert await metric(fleet, "quoteflow_coordination_switched_total") == "0.0"
    assert await metric(fleet, "quoteflow_coordination_past_grace_total") == "0.0"
    single = await start_quoteflow()
    assert await metric(single, "quoteflow_coordination_up") is None
    assert COORDINATOR not in single.app


async def test_a_worker_starts_and_serves_while_redis_is_down(
    start_quoteflow: StartQuoteFlow, caplog: pytest.LogCaptureFixture
) -> None:
    """No Redis at start-up: the worker starts at once, answers on local limits, warns once."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    started = time.monotonic()
    client = await start_quoteflow(
        redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_timeout=REDIS_TIMEOUT
    )
    response = await client.post("/api/quotes", json={})
    assert response.status == 200
    assert (await response.json())["failures"] == []
    assert time.monotonic() - started < 1.0
    assert await metric(client, "quoteflow_coordination_up") == "0.0"
    assert len(events(caplog, "coordination_down")) == 1
