"""Callers' rates for the whole fleet: two workers (apps from ``create_app``), a real Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from quoteflow.app import COORDINATOR
from quoteflow.callers import load_callers
from quoteflow.handlers import GATE
from tests.callers_files import bearer, write_callers
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, delay
from tests.redis_server import RedisServer
from tests.test_fleet import REDIS_TIMEOUT, wait_until

Client = TestClient[Any, Any]


async def two_workers(
    start_quoteflow: StartQuoteFlow, redis: RedisServer, path: Path, **overrides: Any
) -> tuple[Client, Client]:
    """Two workers of one fleet, serving the callers of ``path``."""
    values: dict[str, Any] = {
        "redis_url": redis.url,
        "redis_timeout": REDIS_TIMEOUT,
        "callers": load_callers(str(path), {}),
    }
    values.update(overrides)
    first, second = await start_quoteflow(**values), await start_quoteflow(**values)
    coordinators = [client.app[COORDINATOR] for client in (first, second)]
    await wait_until(lambda: all(c.up and c.workers == 2 for c in coordinators))
    return first, second


async def ask(client: Client, name: str = "acme") -> tuple[int, dict[str, str]]:
    """One quote request of caller ``name``: its status and headers."""
    response = await client.post("/api/quotes", json={}, headers=bearer(name))
    await response.read()
    return response.status, dict(response.headers)


def round_trips(client: Client) -> dict[str, int]:
    """This worker's calls to Redis for callers' rates, by result."""
    shared = client.app[GATE].shared
    assert shared is not None
    return dict(shared.calls)


async def test_two_workers_admit_exactly_the_quota_between_them(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, tmp_path: Path
) -> None:
    """10/60s on two workers: 10 admitted in all, one round trip each, refusals then local."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "10/60s"})
    workers = await two_workers(start_quoteflow, redis_server, path)
    answers = [await ask(workers[i % 2]) for i in range(16)]
    statuses = [status for status, _ in answers]
    assert statuses == [200] * 10 + [429] * 6  # no refill within 6 s: exactly the quota
    assert answers[9][1]["RateLimit"] == '"acme";r=0;t=6'
    assert answers[10][1]["Retry-After"] == "6"
    # One EVALSHA per admitted request, one per worker for its first refusal, then none.
    calls = [round_trips(client) for client in workers]
    assert sum(c["ok"] for c in calls) == 10 + 2
    for _ in range(4):
        assert (await ask(workers[0]))[0] == 429
    assert round_trips(workers[0]) == calls[0]


@pytest.mark.parametrize("fault", ["frozen", "stopped"])
async def test_redis_lost_mid_window_falls_back_to_a_share_and_comes_back(
    redis_server: RedisServer,
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
    tmp_path: Path,
    fault: str,
) -> None:
    """Redis frozen or stopped: no 5xx, answers in budget, quota ÷ 2 each at most; back in 2 s."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "8/60s"})
    budget = 0.5
    workers = await two_workers(start_quoteflow, redis_server, path, budget=budget)
    coordinators = [client.app[COORDINATOR] for client in workers]
    assert [(await ask(client))[0] for client in workers] == [200, 200]  # 6 left fleet-wide

    assert redis_server.process is not None
    pid = redis_server.process.pid
    if fault == "frozen":
        os.kill(pid, signal.SIGSTOP)  # connections stay open, nothing answers
    else:
        await asyncio.to_thread(redis_server.stop)
    try:
        seen: list[tuple[int, float]] = []
        for client in workers:
            for _ in range(8):
                started = time.monotonic()
                status, _ = await ask(client)
                seen.append((status, time.monotonic() - started))
        await wait_until(lambda: not any(c.up for c in coordinators), within=2.0)
        text = await (await workers[0].get("/metrics")).text()
        assert "quoteflow_coordination_up 0.0" in text
    finally:
        if fault == "frozen":
            os.kill(pid, signal.SIGCONT)
        else:
            await asyncio.to_thread(redis_server.start)  # back empty
    assert {status for status, _ in seen} <= {200, 429}
    assert max(elapsed for _, elapsed in seen) <= budget + 0.2
    # Each worker keeps to 8 / 2 = 4 at once, less its share of what was used (1 of 2).
    admitted = sum(1 for status, _ in seen if status == 200)
    assert 1 <= admitted <= 2 * 4

    back = await wait_until(lambda: all(c.up for c in coordinators), within=2.5)
    assert back <= 2.0
    before = round_trips(workers[0])["ok"]

    async def fleet_wide_again() -> bool:
        _status, _ = await ask(workers[0])
        return round_trips(workers[0])["ok"] > before

    started = time.monotonic()
    while not await fleet_wide_again():
        assert time.monotonic() - started < 2.0
        await asyncio.sleep(0.05)


async def test_an_emptied_redis_forgets_what_was_used_and_serves_on(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, tmp_path: Path
) -> None:
    """FLUSHALL and SCRIPT FLUSH: the next request is answered, with a whole quota again."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "2/60s"})
    workers = await two_workers(start_quoteflow, redis_server, path)
    assert [(await ask(workers[0]))[0] for _ in range(3)] == [200, 200, 429]
    assert redis_server.command("FLUSHALL") == "+OK"
    assert redis_server.command("SCRIPT", "FLUSH") == "+OK"
    status, headers = await ask(workers[1])
    assert (status, headers["RateLimit"]) == (200, '"acme";r=1;t=30')


async def test_far_from_its_quota_a_worker_takes_a_lease_but_never_exceeds_the_quota(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, tmp_path: Path
) -> None:
    """40/60s on two workers: fewer round trips than answers, and 40 admitted, never 41."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "40/60s"})
    workers = await two_workers(start_quoteflow, redis_server, path)
    answers = [await ask(workers[i % 2]) for i in range(50)]
    statuses = [status for status, _ in answers]
    assert 39 <= statuses.count(200) <= 40  # a lease's last request may lapse unused
    assert statuses[-5:] == [429] * 5
    trips = sum(round_trips(client)["ok"] for client in workers)
    assert trips < statuses.count(200)
    # What a caller is told stays true: r never grows while it spends, and ends at 0.
    remaining = [int(h["RateLimit"].split("r=")[1].split(";")[0]) for _, h in answers]
    assert remaining[0] == 39
    assert remaining[-1] == 0


async def test_concurrent_requests_of_one_caller_take_one_lease_between_them(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, tmp_path: Path
) -> None:
    """8 at once, far from the quota: one asks for a lease (24), the others for themselves."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "400/60s"})
    workers = await two_workers(start_quoteflow, redis_server, path)
    assert (await ask(workers[0]))[0] == 200  # the level is known from now on
    assert redis_server.process is not None
    pid = redis_server.process.pid
    os.kill(pid, signal.SIGSTOP)  # hold the first round trip, so the others come meanwhile
    try:
        asking = [asyncio.create_task(ask(workers[0])) for _ in range(8)]
        await asyncio.sleep(REDIS_TIMEOUT / 4)
    finally:
        os.kill(pid, signal.SIGCONT)
    answers = await asyncio.gather(*asking)
    assert [status for status, _ in answers] == [200] * 8
    async with Redis.from_url(redis_server.url) as client:
        level = await client.get("quoteflow:caller:acme")  # "<used> <at ms>"
    assert level is not None
    # 399 free / (8 × 2 workers) = 24: one lease of 24 and 7 single ones, not 8 × 24.
    assert float(level.split()[0]) <= 1 + 24 + 7 + 0.01


async def test_the_budget_pays_for_a_round_trip_to_a_frozen_redis(
    redis_server: RedisServer,
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
    tmp_path: Path,
) -> None:
    """A quota check that waits out ``redis_timeout`` shortens the fan-out: still within budget."""
    suppliers.always("boreal", delay(5))  # only the deadline ends the request
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "8/60s"})
    budget = 0.5
    workers = await two_workers(start_quoteflow, redis_server, path, budget=budget)
    assert redis_server.process is not None
    pid = redis_server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = await workers[0].post("/api/quotes?explain=1", json={}, headers=bearer("acme"))
        body = await response.json()
        elapsed = time.monotonic() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert response.status == 200
    assert {"supplier": "boreal", "code": "timeout"} in body["failures"]
    assert REDIS_TIMEOUT <= elapsed <= budget + 0.1  # not budget + redis_timeout


async def test_a_switch_of_server_counts_every_rate_as_spent_then_it_refills(
    redis_server: RedisServer, start_quoteflow: StartQuoteFlow, tmp_path: Path
) -> None:
    """The fleet found on another server (here: the fleet's record of its server says another
    run id, as on a promoted replica) may have lost what callers used: each rate counts as
    spent whole at that moment, and refills from there at its own pace."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "4/4s"})
    workers = await two_workers(start_quoteflow, redis_server, path)
    assert (await ask(workers[0]))[0] == 200  # 3 of 4 left, had no write been lost
    assert redis_server.command("SET", "quoteflow:server", "f" * 40) == "+OK"
    coordinators = [client.app[COORDINATOR] for client in workers]
    await wait_until(lambda: all(c.switches == 1 for c in coordinators), within=3.0)
    switched_at = time.monotonic()
    assert (await ask(workers[1]))[0] == 429
    await asyncio.sleep(max(0.0, switched_at + 1.1 - time.monotonic()))  # one interval: 1 s
    assert (await ask(workers[0]))[0] == 200
