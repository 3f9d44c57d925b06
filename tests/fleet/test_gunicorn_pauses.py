"""A 429 with ``Retry-After`` pauses a supplier for the whole fleet: 2 gunicorn workers, Redis.

The moments the paused supplier answered 429 are sampled from the lab's
counts, with Redis up (one wave a pause for the fleet) and stopped (each
worker pauses on its own 429).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.catalogue_fakes import write_catalogue
from tests.fleet.load import CONNECTIONS, Load
from tests.fleet.procs import Lab, RedisServer, start_gunicorn, start_lab, stop
from tests.fleet.test_gunicorn_contracts import _send, _settings, _stats

PAUSE_S = 2


def _waves(moments: list[tuple[float, int]], apart: float = 1.0) -> list[tuple[float, float, int]]:
    """The lab's count of 429s sampled over time, as waves: (first seen, last seen, requests)."""
    waves: list[tuple[float, float, int]] = []
    for (_, before), (at, count) in itertools.pairwise(moments):
        if count == before:
            continue
        if waves and at - waves[-1][1] < apart:
            first, _, sent = waves[-1]
            waves[-1] = (first, at, sent + count - before)
        else:
            waves.append((at, at, count - before))
    return waves


async def _refused(session: aiohttp.ClientSession, lab: Lab, supplier: str) -> tuple[float, int]:
    """Now, and how many of ``supplier``'s requests the lab has answered with its 429."""
    stats = await _stats(session, lab)
    return time.monotonic(), stats["answers"][supplier].get("http_429", 0)


async def _sample_after_fault(
    session: aiohttp.ClientSession, lab: Lab, supplier: str, fault: Any, seconds: float
) -> list[tuple[float, int]]:
    """``supplier``'s 429s so far, then ``fault`` set, then its 429s every 50 ms for ``seconds``.

    The 429s are counted, not every request, so that the count read before the
    fault is a true baseline: the first wave meets the fault within a few
    milliseconds, sooner than a loaded machine may answer the first read after it.
    """
    moments = [await _refused(session, lab, supplier)]
    await _send(session, "PUT", f"{lab.url}/faults/{supplier}", fault)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        moments.append(await _refused(session, lab, supplier))
        await asyncio.sleep(0.05)
    return moments


async def test_a_429_retry_after_2_pauses_the_supplier_for_every_worker(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """6 s of load against 429 Retry-After: 2 — 3 or 4 waves, none within 2 s of the last.

    Then the supplier answers again and is quoted; with Redis stopped each
    worker pauses it on its own 429, so at most a wave per worker per pause.
    """
    lab = start_lab(tmp_path, "--names", "busy,plain")
    path = tmp_path / "suppliers.toml"
    write_catalogue(
        path,
        [
            {"name": "busy", "url": f"{lab.url}/quotes/busy", "share": 4},
            {"name": "plain", "url": f"{lab.url}/quotes/plain"},
        ],
    )
    fleet = start_gunicorn(tmp_path, _settings(path, redis_server, "pauses"))
    fault = {"kind": "http_429", "retry_after": PAUSE_S, "count": None}
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS + 2),
            timeout=aiohttp.ClientTimeout(total=5),
        ) as session:
            await _send(session, "PUT", f"{lab.url}/latency", {"ms": 20})
            load = Load(session, fleet, watch="busy")
            load.start()
            await asyncio.sleep(1.0)  # both workers synced
            shared = _waves(await _sample_after_fault(session, lab, "busy", fault, 6.0))
            await _send(session, "DELETE", f"{lab.url}/faults/busy")
            load.take_codes()
            await asyncio.sleep(PAUSE_S + 0.5)  # the last pause ends
            load.take_codes()
            await asyncio.sleep(1.0)
            after = load.take_codes()
            await asyncio.to_thread(redis_server.stop)
            try:
                await asyncio.sleep(1.0)  # both workers on their own
                alone = _waves(await _sample_after_fault(session, lab, "busy", fault, 4.5))
                await _send(session, "DELETE", f"{lab.url}/faults/busy")
            finally:
                await asyncio.to_thread(redis_server.start)
            await load.stop()
    finally:
        code = fleet.stop()
        stop(lab.process)
    assert code == 0, fleet.log_path.read_text()[-3000:]
    # One wave a pause (0, 2, 4 s, and perhaps one at the very end), never hundreds.
    assert 3 <= len(shared) <= 5, shared
    assert sum(sent for *_, sent in shared) <= 5 * 8, shared  # a wave is about the share
    for (_, last, _), (first, _, _) in itertools.pairwise(shared):
        # Nothing for 2 s by any worker (less the 50 ms the samples are apart, twice).
        assert first - last >= PAUSE_S - 0.15, shared
    # Quoted again once it answers (32 callers queue for its 4 slots just after a
    # pause, so on a loaded machine some still give their place up in time).
    assert after.count(None) >= 10, after
    # Alone, each worker learns of the pause from its own 429: a wave per worker per pause.
    assert len(alone) >= 2, alone  # still asked after each pause
    assert sum(sent for *_, sent in alone) <= 2 * 4 * 8, alone
    assert set(load.statuses) == {200}, set(load.statuses)
