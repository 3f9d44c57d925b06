"""Two gunicorn workers share one caller's quota through Redis: exactly the quota between them."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.callers_files import bearer, write_callers
from tests.fleet.conftest import fleet_settings
from tests.fleet.procs import Gunicorn, Lab, RedisServer, start_gunicorn


@pytest.fixture(scope="module")
def callers_fleet(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, lab_process: Lab
) -> Iterator[Gunicorn]:
    """2 workers serving a callers file; a Redis prefix of their own beside the shared fleet's."""
    directory = tmp_path_factory.mktemp("callers-fleet")
    path = write_callers(directory / "callers.toml", {"name": "acme", "rate": "10/60s"})
    settings = fleet_settings(
        redis_server,
        lab_process,
        QUOTEFLOW_CALLERS_FILE=str(path),
        QUOTEFLOW_REDIS_PREFIX="callers-test",
    )
    running = start_gunicorn(directory, settings)
    try:
        yield running
    finally:
        code = running.stop()
    assert code == 0, f"gunicorn exited with {code}; log in {running.log_path}"


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found[1])


async def test_two_workers_admit_exactly_one_quota(
    callers_fleet: Gunicorn, session: aiohttp.ClientSession
) -> None:
    """10/60s: 6 answered by one worker alone, then the other alone admits only the 4 left."""
    url = callers_fleet.url

    async def ask() -> int:
        async with session.post(f"{url}/api/quotes", json={}, headers=bearer("acme")) as answer:
            await answer.read()
            return answer.status

    end = time.monotonic() + 5
    while True:  # both workers have joined the fleet
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
        if _metric(text, "quoteflow_coordination_workers") == 2 or time.monotonic() > end:
            break
        await asyncio.sleep(0.05)
    first, second = sorted(callers_fleet.workers())
    statuses: list[int] = []
    os.kill(second, signal.SIGSTOP)  # only the first worker takes connections
    try:
        statuses += [await ask() for _ in range(6)]
    finally:
        os.kill(second, signal.SIGCONT)
    os.kill(first, signal.SIGSTOP)
    try:
        statuses += [await ask() for _ in range(10)]
    finally:
        os.kill(first, signal.SIGCONT)
    assert statuses[:6] == [200] * 6
    # Without a fleet-wide quota the second worker would admit 10 of its own.
    admitted = statuses.count(200)
    assert 10 <= admitted <= 11  # one more only if a request drained back (6 s) meanwhile
    assert statuses.count(429) == len(statuses) - admitted
    await asyncio.sleep(0.3)  # every worker has copied its counts into the host-wide metrics
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    counted = 'quoteflow_caller_requests_total{caller="acme",result="ok"}'
    assert _metric(text, counted) == admitted
    # One round trip per admitted request, one for the first refusal, none after it.
    trips = _metric(text, 'quoteflow_caller_quota_calls_total{result="ok"}')
    assert admitted <= trips <= admitted + 2
