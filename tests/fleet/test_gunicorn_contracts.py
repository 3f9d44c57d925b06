"""A supplier's contract held by the fleet: 2 gunicorn workers, Redis, the lab holding it too.

The lab is the supplier that enforces it (``--contract``: 429 past its rate)
and counts what reached it, so "QuoteFlow kept to the rate" is read on the
supplier's side: what it admitted each second, and what it refused. The
429-with-``Retry-After`` pause is in ``test_gunicorn_pauses.py`` (its own
file, so that the two long tests run side by side under ``--dist loadfile``).

Each test runs with Redis up and then with Redis stopped, where each worker
keeps to its own part (the rate ÷ live workers; a pause is each worker's own).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.catalogue_fakes import write_catalogue
from tests.fleet.conftest import BUDGET_S
from tests.fleet.load import CONNECTIONS, Load, reset
from tests.fleet.procs import Lab, RedisServer, start_gunicorn, start_lab, stop

LAB_RATE = 22
"""The lab's rate for the metered supplier, a second: a little above QuoteFlow's 20.

Both are GCRA with a burst of the whole quota, so what QuoteFlow sends at 20/s
reaches the lab at 20/s give or take the network's jitter; the two requests of
headroom absorb that jitter, not an excess of QuoteFlow's.
"""
RATE = 20


def _settings(path: Path, redis: RedisServer, prefix: str) -> dict[str, str]:
    return {
        "QUOTEFLOW_SUPPLIERS_FILE": str(path),
        "QUOTEFLOW_REDIS_URL": redis.url,
        "QUOTEFLOW_REDIS_PREFIX": prefix,
        "QUOTEFLOW_BUDGET": str(BUDGET_S),
        "QUOTEFLOW_LOG_LEVEL": "warning",
        "QUOTEFLOW_INBOUND_LIMIT": str(CONNECTIONS),
        "PYTHONDONTWRITEBYTECODE": "1",
    }


async def _stats(session: aiohttp.ClientSession, lab: Lab) -> dict[str, Any]:
    async with session.get(f"{lab.url}/stats?summary=1") as response:
        stats: dict[str, Any] = await response.json()
    return stats


async def _send(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> None:
    async with session.request(method, url, json=body) as response:
        assert response.status == 200, await response.text()


async def _rate_phase(
    load: Load, session: aiohttp.ClientSession, lab: Lab, seconds: float
) -> tuple[dict[str, Any], float]:
    """Quiet, zero the lab's counts, load for ``seconds``, quiet: its stats, and how long."""
    await load.stop()
    load.take_codes()  # a warm-up's, or the time Redis went away
    await reset(session, lab)
    began = time.monotonic()
    load.start()
    await asyncio.sleep(seconds)
    await load.stop()  # every attempt of the phase has reached the lab
    return await _stats(session, lab), time.monotonic() - began


async def test_a_rate_of_20_a_second_holds_fleet_wide_the_lab_refusing_none(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """32 connections on 2 workers: ≤ 20 a second after the burst, with Redis and without."""
    lab = start_lab(
        tmp_path, "--names", "metered,plain", "--contract", f"metered:rate={LAB_RATE}/1s"
    )
    path = tmp_path / "suppliers.toml"
    write_catalogue(
        path,
        [
            {"name": "metered", "url": f"{lab.url}/quotes/metered", "rate": f"{RATE}/1s"},
            {"name": "plain", "url": f"{lab.url}/quotes/plain"},
        ],
    )
    fleet = start_gunicorn(tmp_path, _settings(path, redis_server, "rates"))
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CONNECTIONS),
            timeout=aiohttp.ClientTimeout(total=5),
        ) as session:
            await _send(session, "PUT", f"{lab.url}/latency", {"ms": 20})
            load = Load(session, fleet, watch="metered")
            load.start()
            await asyncio.sleep(1.0)  # both workers synced, the first burst spent
            up, up_s = await _rate_phase(load, session, lab, 3.0)
            up_codes = load.take_codes()
            await asyncio.to_thread(redis_server.stop)
            try:
                load.start()
                await asyncio.sleep(1.0)  # both workers on their own part of the rate
                down, down_s = await _rate_phase(load, session, lab, 3.0)
                down_codes = load.take_codes()
            finally:
                await asyncio.to_thread(redis_server.start)
    finally:
        code = fleet.stop()
        stop(lab.process)
    assert code == 0, fleet.log_path.read_text()[-3000:]
    # With Redis stopped each worker keeps to half the rate, and the kernel may
    # have handed most of the 32 connections to one of them: at least half is used.
    for phase, stats, seconds, codes, least in (
        ("redis up", up, up_s, up_codes, RATE),
        ("redis stopped", down, down_s, down_codes, RATE / 2),
    ):
        sent = stats["per_supplier"].get("metered", 0)
        # A phase starts after a quiet spell that refilled part of the burst.
        assert sent <= RATE + RATE * seconds + 3, (phase, sent, seconds)
        assert sent >= least * (seconds - 1), (phase, sent, seconds)  # used, not starved
        assert stats["rate_refused"]["metered"] == 0, stats["rate_refused"]
        assert stats["per_supplier"].get("plain", 0) > 3 * sent  # only metered is held back
        # Nearly every answer has metered's quote or rate_limited at once, not a timeout
        # (98 % and more on a quiet machine; the bound leaves room for a loaded one).
        settled = sum(c in (None, "rate_limited") for c in codes)
        assert settled >= 0.95 * len(codes), {c: codes.count(c) for c in set(codes)}
        assert codes.count("rate_limited") > len(codes) / 2  # past the rate: most refused
    assert set(load.statuses) == {200}, set(load.statuses)
