"""Each supplier's own share, fleet-wide: 2 gunicorn workers, Redis, the lab counting peaks.

Shares 1 and 4 under 32 connections, with Redis up and with Redis stopped
(the safe share), then a HUP that swaps them under load: while old and new
workers overlap neither supplier has more in flight than the larger of its
two shares, and once the new workers serve alone the new shares hold.

"Redis up" here means every worker reaches it: the workers get a Redis time
limit (``REDIS_TIMEOUT``) that a loop stalled by a HUP's new processes on two
cores does not pass. A worker cut off alone is held back by the others for the
outage grace (``docs/suppliers.md``), held by
``tests/test_fleet.py::test_a_worker_cut_off_alone_adds_nothing_to_any_share``
and ``tests/test_fleet_ha.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.catalogue_fakes import write_catalogue
from tests.fleet.conftest import BUDGET_S
from tests.fleet.procs import Gunicorn, Lab, RedisServer, start_gunicorn, start_lab, stop
from tests.fleet.test_gunicorn_reload import _replaced

CONNECTIONS = 32
REDIS_TIMEOUT = 0.3  # below the 0.5 s budget, as QuoteFlow requires


class Load:
    """32 callers asking the fleet until stopped; every status they saw.

    With ``watch``, also what each answer said of that supplier: its failure
    code, or ``None`` for a quote (``take_codes``).
    """

    def __init__(
        self, session: aiohttp.ClientSession, fleet: Gunicorn, watch: str | None = None
    ) -> None:
        self.session = session
        self.fleet = fleet
        self.watch = watch
        self.statuses: list[int] = []
        self.codes: list[str | None] = []
        self.dropped = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._stop.clear()
        self._tasks = [asyncio.create_task(self._caller()) for _ in range(CONNECTIONS)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _caller(self) -> None:
        while not self._stop.is_set():
            try:
                async with self.session.post(
                    f"{self.fleet.url}/api/quotes", json={"quantity": 1}
                ) as response:
                    body = await response.read()
                    self.statuses.append(response.status)
                if self.watch is not None and response.status == 200:
                    failures = json.loads(body)["failures"]
                    self.codes.append(
                        next((f["code"] for f in failures if f["supplier"] == self.watch), None)
                    )
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, TimeoutError):
                # A kept-alive connection an old worker closes as it stops (the
                # request on its way in is never read): no answer of QuoteFlow's.
                self.dropped += 1

    def take_codes(self) -> list[str | None]:
        """The watched supplier's codes since the last call."""
        codes, self.codes = self.codes, []
        return codes


async def _peaks(session: aiohttp.ClientSession, lab: Lab) -> dict[str, int]:
    async with session.get(f"{lab.url}/stats?summary=1") as response:
        stats: dict[str, Any] = await response.json()
    return dict(stats["max_in_flight"])


async def _reset(session: aiohttp.ClientSession, lab: Lab) -> None:
    """Zero the lab's counts once nothing is in flight (it refuses while something is)."""
    end = time.monotonic() + 5
    while True:
        async with session.post(f"{lab.url}/reset") as response:
            if response.status == 200:
                return
        assert time.monotonic() < end, "the lab never went idle"
        await asyncio.sleep(0.05)


async def _phase(
    load: Load, session: aiohttp.ClientSession, lab: Lab, seconds: float
) -> dict[str, int]:
    """Quiet, zero the counts, load for ``seconds``: each supplier's peak in flight."""
    await load.stop()
    await _reset(session, lab)
    load.start()
    await asyncio.sleep(seconds)
    return await _peaks(session, lab)


async def test_shares_of_1_and_4_hold_fleet_wide_through_redis_loss_and_a_reload(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The lab never sees more than each supplier's share; a HUP swaps them live."""
    lab = start_lab(tmp_path, "--names", "small,large")
    path = tmp_path / "suppliers.toml"

    def catalogue(small: int, large: int) -> None:
        write_catalogue(
            path,
            [
                {"name": "small", "url": f"{lab.url}/quotes/small", "share": small},
                {"name": "large", "url": f"{lab.url}/quotes/large", "share": large},
            ],
        )

    catalogue(1, 4)
    settings = {
        "QUOTEFLOW_SUPPLIERS_FILE": str(path),
        "QUOTEFLOW_REDIS_URL": redis_server.url,
        "QUOTEFLOW_REDIS_PREFIX": "shares",
        "QUOTEFLOW_BUDGET": str(BUDGET_S),
        "QUOTEFLOW_REDIS_TIMEOUT": str(REDIS_TIMEOUT),
        "QUOTEFLOW_LOG_LEVEL": "warning",
        "QUOTEFLOW_INBOUND_LIMIT": str(CONNECTIONS),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    fleet = start_gunicorn(tmp_path, settings)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS),
            timeout=aiohttp.ClientTimeout(total=5),
        ) as session:
            async with session.put(f"{lab.url}/latency", json={"ms": 30}) as response:
                assert response.status == 200
            load = Load(session, fleet)
            load.start()
            up = await _phase(load, session, lab, 1.5)
            assert up["small"] == 1
            assert 2 <= up["large"] <= 4
            await asyncio.to_thread(redis_server.stop)
            try:
                await asyncio.sleep(0.5)  # both workers on their own
                alone = await _phase(load, session, lab, 1.5)
            finally:
                await asyncio.to_thread(redis_server.start)
            # The safe share: 4 → 2 a worker, and the share of 1 to one worker only.
            assert alone["small"] <= 1
            assert alone["large"] <= 4
            await asyncio.sleep(1.0)  # both back in the fleet
            await load.stop()
            await _reset(session, lab)
            load.start()
            catalogue(4, 1)
            await _replaced(fleet)  # under load: old and new workers overlap
            overlap = await _peaks(session, lab)
            assert overlap["small"] <= 4
            assert overlap["large"] <= 4
            await asyncio.sleep(2.0)  # the new workers' leases: the new shares
            swapped = await _phase(load, session, lab, 1.5)
            await load.stop()
    finally:
        code = fleet.stop()
        stop(lab.process)
    assert code == 0, fleet.log_path.read_text()[-3000:]
    assert swapped["large"] == 1
    assert 2 <= swapped["small"] <= 4
    assert set(load.statuses) <= {200, 503}, set(load.statuses)
    assert load.statuses.count(200) > 100
    assert load.dropped <= 2 * CONNECTIONS  # at most each connection, once per old worker
