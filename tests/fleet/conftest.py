"""Fleet mode as real processes: redis-server, the provider lab and a 2-worker gunicorn.

Started once for the package and shared by its tests (each test leaves the
fleet with two booted workers, the lab without faults and Redis running);
stopped at the end. A missing redis-server skips these tests, or fails them when ``CI`` is
set (``make test`` installs it first, see the Makefile).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from provider_lab.control_client import LabControl
from tests.fleet.procs import Gunicorn, Lab, RedisServer, start_gunicorn, start_lab, stop

BUDGET_S = 0.5
"""QuoteFlow's budget in these tests."""
SLOW_MS = 2000
"""How long the lab's boreal takes under scenario ``slow``: well past the budget."""


def fleet_settings(redis: RedisServer, lab: Lab, **more: str) -> dict[str, str]:
    """The ``QUOTEFLOW_*`` variables of a test fleet."""
    return {
        "QUOTEFLOW_PROVIDER_URL": lab.url,
        "QUOTEFLOW_REDIS_URL": redis.url,
        "QUOTEFLOW_BUDGET": str(BUDGET_S),
        "QUOTEFLOW_LOG_LEVEL": "warning",
        **more,
    }


@pytest.fixture(scope="package")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server on a free port, persistence off."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def lab_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The provider lab as a process on a free port."""
    lab = start_lab(tmp_path_factory.mktemp("lab"), "--slow-ms", str(SLOW_MS))
    try:
        yield lab
    finally:
        stop(lab.process)


@pytest.fixture(scope="package")
def fleet(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer, lab_process: Lab
) -> Iterator[Gunicorn]:
    """QuoteFlow under gunicorn, 2 workers, ``QUOTEFLOW_REDIS_URL`` set; stopped gracefully."""
    directory = tmp_path_factory.mktemp("fleet")
    running = start_gunicorn(directory, fleet_settings(redis_server, lab_process))
    try:
        yield running
    finally:
        code = running.stop()
    assert code == 0, f"gunicorn exited with {code}; log in {running.log_path}"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that opens a new connection per request, so gunicorn spreads them over workers."""
    connector = aiohttp.TCPConnector(force_close=True)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        yield client


@pytest.fixture
async def lab(lab_process: Lab, session: aiohttp.ClientSession) -> LabControl:
    """The lab's control API, with no faults, no latency and zeroed statistics."""
    control = LabControl(session, lab_process.url)
    await control.fresh()
    return control
