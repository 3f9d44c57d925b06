"""SIGHUP re-reads the callers file under load: keys come and go within 1 s, a bad file is kept."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from quoteflow.callers import CallersFile, Gate, Pass, load_callers
from quoteflow.errors import QuotaExceeded
from quoteflow.options import ConfigError
from tests.callers_files import KEYS, bearer, sha256, write_callers
from tests.fakes import FakeSuppliers
from tests.process import quoteflow_process


async def within(seconds: float, check: Callable[[], Awaitable[bool]]) -> float:
    """Seconds until ``check()`` holds; fails if it does not within ``seconds``."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < seconds, "not within time"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_reload_adds_removes_and_keeps_a_bad_file_under_load(
    suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """A removed key is 401 and a new key works within 1 s; a bad file changes nothing."""
    path = write_callers(tmp_path / "callers.toml", {"name": "acme"}, {"name": "beta"})
    flags = ("--callers", str(path), "--log-level", "warning", "--budget", "0.5")
    async with (
        quoteflow_process(suppliers.url, *flags, capture_log=True) as running,
        aiohttp.ClientSession() as session,
    ):

        async def status(name: str) -> int:
            async with session.post(
                running.url + "/api/quotes", json={}, headers=bearer(name)
            ) as answer:
                await answer.read()
                return answer.status

        statuses: list[int] = []
        stop = asyncio.Event()

        async def load() -> None:
            # beta stays in every file: its requests must all be answered 200.
            while not stop.is_set():
                statuses.append(await status("beta"))

        loaders = [asyncio.create_task(load()) for _ in range(3)]
        try:
            assert await status("acme") == 200
            assert await status("gamma") == 401

            write_callers(path, {"name": "beta"}, {"name": "gamma", "rate": "2/60s"})
            running.process.send_signal(signal.SIGHUP)

            async def acme_gone() -> bool:
                return await status("acme") == 401

            async def gamma_in() -> bool:
                return await status("gamma") == 200

            assert await within(1.0, acme_gone) < 1.0
            assert await within(1.0, gamma_in) < 1.0  # gamma has spent 1 of 2

            write_callers(path, {"name": "beta", "rate": "ten/min"}, {"name": "acme"})
            running.process.send_signal(signal.SIGHUP)
            await asyncio.sleep(0.3)
            assert await status("gamma") == 200  # the old callers still serve: 2 of 2
            assert await status("gamma") == 429
            assert await status("acme") == 401

            # A changed quota applies from then on; what gamma used stays used.
            write_callers(path, {"name": "beta"}, {"name": "gamma", "rate": "3/60s"})
            running.process.send_signal(signal.SIGHUP)

            async def gamma_has_one_more() -> bool:
                return await status("gamma") == 200

            await within(1.0, gamma_has_one_more)
            assert await status("gamma") == 429
        finally:
            stop.set()
            await asyncio.gather(*loaders)
        running.process.send_signal(signal.SIGTERM)
        assert running.process.stderr is not None
        log = (await running.process.stderr.read()).decode()
        await running.process.wait()
    assert statuses
    assert set(statuses) == {200}
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    refused = [e for e in events if e["event"] == "reload_refused"]
    assert len(refused) == 1
    assert refused[0]["level"] == "error"
    assert "caller 'beta': rate 'ten/min'" in refused[0]["error"]
    for key in KEYS.values():
        assert key not in log
        assert sha256(key) not in log


async def test_a_changed_rate_keeps_what_was_used(tmp_path: Path) -> None:
    """Used 3 of 5/60s, then 2/60s: refused until below 2; a removed caller is forgotten."""
    path = write_callers(tmp_path / "c.toml", {"name": "acme", "rate": "5/60s"}, {"name": "beta"})
    callers = load_callers(str(path), {})
    gate = Gate(callers)
    reloadable = CallersFile(gate, str(path), {})
    acme = callers.identify(f"Bearer {KEYS['acme']}")
    assert acme is not None
    for _ in range(3):
        await Pass(gate, acme).enter(lambda: None)
    write_callers(path, {"name": "acme", "rate": "2/60s"}, {"name": "beta"})
    reloadable.reload()
    acme = gate.identify(f"Bearer {KEYS['acme']}")
    assert acme is not None
    assert acme.rate is not None
    assert acme.rate.quota == 2
    refused = Pass(gate, acme)
    with pytest.raises(QuotaExceeded):
        await refused.enter(lambda: None)
    assert refused.standing is not None
    assert refused.standing.retry_after == 60
    write_callers(path, {"name": "beta"})
    reloadable.reload()
    assert gate.identify(f"Bearer {KEYS['acme']}") is None
    assert gate.local.buckets == {}
    path.write_text("[[caller]]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="name must be"):
        reloadable.reload()
    assert gate.identify(f"Bearer {KEYS['beta']}") is not None
