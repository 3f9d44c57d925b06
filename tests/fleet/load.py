"""Load on a gunicorn fleet and the lab's counts of it, for the fleet's multi-process tests."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from tests.fleet.procs import Gunicorn, Lab

CONNECTIONS = 32


class Load:
    """Callers (32 unless told) asking the fleet until stopped; every status they saw.

    With ``watch``, also what each answer said of that supplier: its failure
    code, or ``None`` for a quote (``take_codes``). The slowest answer as the
    callers saw it (``slowest``, with the ``phase`` then and QuoteFlow's own
    ``elapsed_ms`` of it), and the longest ``elapsed_ms`` of any 200.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        fleet: Gunicorn,
        watch: str | None = None,
        *,
        connections: int = CONNECTIONS,
    ) -> None:
        self.session = session
        self.fleet = fleet
        self.watch = watch
        self.connections = connections
        self.statuses: list[int] = []
        self.codes: list[str | None] = []
        self.dropped = 0
        self.phase = ""
        self.slowest = 0.0
        self.slowest_at: tuple[str, float | None] = ("", None)
        self.longest_ms = 0.0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._stop.clear()
        self._tasks = [asyncio.create_task(self._caller()) for _ in range(self.connections)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _caller(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                async with self.session.post(
                    f"{self.fleet.url}/api/quotes", json={"quantity": 1}
                ) as response:
                    body = await response.read()
                    self.statuses.append(response.status)
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, TimeoutError):
                # A kept-alive connection an old worker closes as it stops (the
                # request on its way in is never read): no answer of QuoteFlow's.
                self.dropped += 1
                continue
            took = time.monotonic() - started
            answer = json.loads(body) if response.status == 200 else None
            elapsed = answer["elapsed_ms"] if answer is not None else None
            self.longest_ms = max(self.longest_ms, elapsed or 0.0)
            if took > self.slowest:
                self.slowest, self.slowest_at = took, (self.phase, elapsed)
            if self.watch is not None and answer is not None:
                failures = answer["failures"]
                self.codes.append(
                    next((f["code"] for f in failures if f["supplier"] == self.watch), None)
                )

    def take_codes(self) -> list[str | None]:
        """The watched supplier's codes since the last call."""
        codes, self.codes = self.codes, []
        return codes


async def peaks(session: aiohttp.ClientSession, lab: Lab) -> dict[str, int]:
    async with session.get(f"{lab.url}/stats?summary=1") as response:
        stats: dict[str, Any] = await response.json()
    return dict(stats["max_in_flight"])


async def reset(session: aiohttp.ClientSession, lab: Lab) -> None:
    """Zero the lab's counts once nothing is in flight (it refuses while something is)."""
    end = time.monotonic() + 5
    while True:
        async with session.post(f"{lab.url}/reset") as response:
            if response.status == 200:
                return
        assert time.monotonic() < end, "the lab never went idle"
        await asyncio.sleep(0.05)


async def phase(
    load: Load, session: aiohttp.ClientSession, lab: Lab, seconds: float
) -> dict[str, int]:
    """Quiet, zero the counts, load for ``seconds``: each supplier's peak in flight."""
    await load.stop()
    await reset(session, lab)
    load.start()
    await asyncio.sleep(seconds)
    return await peaks(session, lab)
