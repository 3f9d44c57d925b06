"""Two gunicorn workers share one caller's quota through Redis: exactly the quota between them."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.callers_files import bearer, write_callers
from tests.fleet.conftest import fleet_settings
from tests.fleet.procs import Gunicorn, Lab, RedisServer, start_gunicorn


@pytest.fixture(scope="module")
def callers_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fleet's callers file: acme at 10/60s, and gamma."""
    directory = tmp_path_factory.mktemp("callers")
    return write_callers(
        directory / "callers.toml", {"name": "acme", "rate": "10/60s"}, {"name": "gamma"}
    )


@pytest.fixture(scope="module")
def callers_fleet(
    tmp_path_factory: pytest.TempPathFactory,
    redis_server: RedisServer,
    lab_process: Lab,
    callers_file: Path,
) -> Iterator[Gunicorn]:
    """2 workers serving a callers file; a Redis prefix of their own beside the shared fleet's."""
    directory = tmp_path_factory.mktemp("callers-fleet")
    path = callers_file
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


async def test_the_masters_hup_serves_the_new_file_and_the_fleet_keeps_what_was_used(
    callers_fleet: Gunicorn, callers_file: Path, session: aiohttp.ClientSession
) -> None:
    """gunicorn's HUP: a new key works, a removed one is 401, acme's new rate counts its use."""
    url = callers_fleet.url

    async def ask(name: str) -> int:
        async with session.post(f"{url}/api/quotes", json={}, headers=bearer(name)) as answer:
            await answer.read()
            return answer.status

    assert await ask("gamma") == 200
    for _ in range(12):  # acme uses all of its 10 (whatever the test above left)
        if await ask("acme") == 429:
            break
    old = callers_fleet.workers()
    write_callers(callers_file, {"name": "acme", "rate": "20/60s"}, {"name": "beta"})
    os.kill(callers_fleet.pid, signal.SIGHUP)
    end = time.monotonic() + 15
    while True:  # gunicorn's graceful reload: two new workers, booted
        new = callers_fleet.workers()
        if len(new) == 2 and not new & old and all(callers_fleet.booted(p) for p in new):
            break
        assert time.monotonic() < end, "the workers were not replaced"
        await asyncio.sleep(0.05)
    assert await ask("beta") == 200
    assert await ask("gamma") == 401
    # acme has used its 10: 20/60s leaves it 10 more, not 20.
    statuses = [await ask("acme") for _ in range(12)]
    assert 10 <= statuses.count(200) <= 11
    assert statuses[-1] == 429


async def test_a_bad_file_on_the_masters_hup_keeps_the_fleet_serving_the_last_good_one(
    callers_fleet: Gunicorn, callers_file: Path, session: aiohttp.ClientSession
) -> None:
    """The master checks the callers file on HUP: a bad one is refused, workers keep the old."""
    url = callers_fleet.url

    async def ask(name: str) -> int:
        async with session.post(f"{url}/api/quotes", json={}, headers=bearer(name)) as answer:
            await answer.read()
            return answer.status

    write_callers(callers_file, {"name": "beta"}, {"name": "gamma"})
    os.kill(callers_fleet.pid, signal.SIGHUP)
    end = time.monotonic() + 15
    while await ask("gamma") != 200:  # the good file is served
        assert time.monotonic() < end, "gamma was never let in"
        await asyncio.sleep(0.1)
    old = callers_fleet.workers()
    write_callers(callers_file, {"name": "beta", "rate": "ten/min"}, {"name": "acme"})
    os.kill(callers_fleet.pid, signal.SIGHUP)
    while True:  # gunicorn still replaces the workers: from the last good copy
        new = callers_fleet.workers()
        if len(new) == 2 and not new & old and all(callers_fleet.booted(p) for p in new):
            break
        assert time.monotonic() < end, "the workers were not replaced"
        await asyncio.sleep(0.05)
    assert callers_fleet.process.poll() is None
    assert [await ask(name) for name in ("beta", "gamma", "acme")] == [200, 200, 401]
    # The workers seen replaced may be the first HUP's last ones: the master's
    # refusal of the second file is awaited in its log, not assumed there yet.
    while "caller 'beta': rate 'ten/min'" not in callers_fleet.log_path.read_text(errors="replace"):
        assert time.monotonic() < end, callers_fleet.log_path.read_text(errors="replace")[-3000:]
        await asyncio.sleep(0.05)
    assert callers_fleet.process.poll() is None
    assert [await ask(name) for name in ("beta", "gamma", "acme")] == [200, 200, 401]
