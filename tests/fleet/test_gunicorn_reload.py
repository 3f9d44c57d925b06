"""gunicorn's HUP with a catalogue file: a bad file never reaches a booting worker.

In fleet mode, so the rolling reload is seen from Redis too: old and new
workers, serving two catalogues for a moment, keep to the one outbound limit.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

from provider_lab.catalogue import derived_offer
from tests.catalogue_fakes import write_catalogue
from tests.fleet.conftest import BUDGET_S
from tests.fleet.procs import (
    Gunicorn,
    RedisServer,
    gunicorn_argv,
    quoteflow_env,
    start_gunicorn,
    start_lab,
    stop,
)
from tests.process import free_port

ADAPTER_V1 = "def adapt(payload):\n    return payload\n"
ADAPTER_V2 = (
    "def adapt(payload):\n"
    "    return {**payload, 'unit_cents': payload['unit_cents'] + 1}  # version 2\n"
)
"""An adapter for ``stays`` that a reload changes: the second adds a cent."""
PRICE = derived_offer("stays", "KB-001").unit_cents


async def _names(session: aiohttp.ClientSession, url: str) -> tuple[int, set[str], float]:
    async with session.post(f"{url}/api/quotes", json={"quantity": 1}) as response:
        body: dict[str, Any] = await response.json()
    named = {q["supplier"] for q in body.get("quotes", ())}
    named |= {f["supplier"] for f in body.get("failures", ())}
    return response.status, named, body.get("elapsed_ms", 0.0)


async def _until(
    session: aiohttp.ClientSession, fleet: Gunicorn, wanted: set[str], within_s: float = 20.0
) -> None:
    """Wait until two answers in a row name ``wanted`` (both workers' catalogues, likely)."""
    end = time.monotonic() + within_s
    streak = 0
    while streak < 6:
        assert time.monotonic() < end, f"still not {wanted}:\n{fleet.log_path.read_text()[-3000:]}"
        _, named, _ = await _names(session, fleet.url)
        streak = streak + 1 if named == wanted else 0
        await asyncio.sleep(0.02)


async def _stays_unit(session: aiohttp.ClientSession, fleet: Gunicorn) -> set[int]:
    """The unit prices eight answers in a row quote for ``stays``."""
    prices = set()
    for _ in range(8):
        async with session.post(f"{fleet.url}/api/quotes", json={"quantity": 1}) as response:
            body = await response.json()
        prices |= {q["unit_cents"] for q in body["quotes"] if q["supplier"] == "stays"}
    return prices


async def _replaced(fleet: Gunicorn, within_s: float = 20.0) -> None:
    """HUP the master; wait until both workers are new ones, booted, the master alive."""
    before = fleet.workers()
    fleet.process.send_signal(signal.SIGHUP)
    end = time.monotonic() + within_s
    while fleet.workers() & before or len(fleet.workers()) != 2:
        assert fleet.process.poll() is None, fleet.log_path.read_text()[-3000:]
        assert time.monotonic() < end, fleet.log_path.read_text()[-3000:]
        await asyncio.sleep(0.05)
    fleet.wait_workers(2)


async def test_hup_with_a_bad_file_keeps_the_fleet_and_a_good_one_moves_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """HUP after a bad file: workers boot from the last good copy; after a good one, serve it.

    Under load throughout: every answer a 200 within its budget naming one
    whole catalogue, and the lab never sees more than the outbound limit.
    """
    lab = start_lab(tmp_path, "--names", "old,stays,new")
    path = tmp_path / "suppliers.toml"

    def catalogue(*names: str) -> None:
        entries = [{"name": n, "url": f"{lab.url}/quotes/{n}"} for n in names]
        for entry in entries:
            if entry["name"] == "stays":
                entry["adapter"] = "lab_adapter:adapt"
        write_catalogue(path, entries)

    adapter = tmp_path / "lab_adapter.py"
    adapter.write_text(ADAPTER_V1)
    catalogue("old", "stays")
    settings = {
        "QUOTEFLOW_SUPPLIERS_FILE": str(path),
        "QUOTEFLOW_REDIS_URL": redis_server.url,
        "QUOTEFLOW_REDIS_PREFIX": "catalogue-reload",
        "QUOTEFLOW_BUDGET": str(BUDGET_S),
        "QUOTEFLOW_LOG_LEVEL": "warning",
        "PYTHONPATH": str(tmp_path),  # where lab_adapter lives
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    fleet = start_gunicorn(tmp_path, settings)
    answers: list[tuple[int, set[str], float]] = []
    dropped = 0
    stop_load = asyncio.Event()

    async def load(session: aiohttp.ClientSession) -> None:
        nonlocal dropped
        while not stop_load.is_set():
            try:
                answers.append(await _names(session, fleet.url))
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                # A connection an old worker accepted just before it stopped
                # listening is closed unanswered by aiohttp's shutdown (no
                # request had arrived on it yet): no answer, retried by any
                # balancer. Counted, not an HTTP answer of QuoteFlow's.
                dropped += 1

    # A new connection per request (as a balancer would): a kept-alive one may be
    # closed by an old worker as it stops, which is no answer of QuoteFlow's.
    connector = aiohttp.TCPConnector(force_close=True)
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            # Slow enough suppliers that four callers (two suppliers each) want
            # more than the six slots, and light enough on the CPU to leave
            # the tests running beside this one their share of the machine.
            async with session.put(f"{lab.url}/latency", json={"ms": 40}) as response:
                assert response.status == 200
            loaders = [asyncio.create_task(load(session)) for _ in range(4)]
            path.write_text('[[supplier]]\nname = "stays"\nurl = "gopher://x/q"\n')
            await _replaced(fleet)  # booted from the last good copy
            await _until(session, fleet, {"old", "stays"})
            assert await _stays_unit(session, fleet) == {PRICE}  # the adapter as it was
            catalogue("stays", "new")
            adapter.write_text(ADAPTER_V2)
            await _replaced(fleet)
            await _until(session, fleet, {"stays", "new"})
            # Every new worker imported the adapter afresh: the master never had it.
            assert await _stays_unit(session, fleet) == {PRICE + 1}
            stop_load.set()
            await asyncio.gather(*loaders)
            async with session.get(f"{lab.url}/stats?summary=1") as response:
                lab_stats = await response.json()
        assert fleet.process.poll() is None
        log = fleet.log_path.read_text()
    finally:
        code = fleet.stop()
        stop(lab.process)
    assert code == 0, fleet.log_path.read_text()[-4000:]
    assert "Worker failed to boot" not in log
    assert "reload refused, workers keep the last good copy" in log
    assert "supplier 'stays': url: must be an http:// or https:// URL" in log
    assert str(path) in log  # the operator's file is named, not the master's copy
    assert len(answers) > 20
    # The one outbound limit (6) held for old and new workers together, old names and new.
    downs = log.count('"event":"coordination_down"')
    assert lab_stats["max_active"] <= 6, (lab_stats["max_active"], downs)
    assert dropped <= len(answers) // 20, (dropped, len(answers))
    assert {status for status, _, _ in answers} == {200}
    # elapsed_ms is the worker's own clock; booting workers starve the loops a little.
    assert max(elapsed for _, _, elapsed in answers) <= BUDGET_S * 1000 + 100
    assert {frozenset(named) for _, named, _ in answers} <= {
        frozenset({"old", "stays"}),
        frozenset({"stays", "new"}),
    }


def test_a_bad_catalogue_stops_gunicorn_before_any_worker(tmp_path: Path) -> None:
    """A bad file at start: the master's one line, exit 2, no worker booted, no secret."""
    path = tmp_path / "suppliers.toml"
    path.write_text(
        '[[supplier]]\nname = "a"\nurl = "http://127.0.0.1:1/q"\n'
        'headers = { Authorization = "${TOKEN}" }\nread_timeout = 0\n'
    )
    done = subprocess.run(
        gunicorn_argv(free_port()),
        env=quoteflow_env({"QUOTEFLOW_SUPPLIERS_FILE": str(path)}, TOKEN="hush-hush-secret"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    ours = [line for line in done.stderr.splitlines() if line.startswith("quoteflow:")]
    assert ours == [
        f"quoteflow: error: supplier catalogue {path}: supplier 'a': read_timeout: "
        "must be more than 0 and at most 3600 s"
    ]
    assert done.returncode == 2
    assert "Booting worker" not in done.stderr
    assert "Traceback" not in done.stderr
    assert "hush-hush-secret" not in done.stderr + done.stdout


def test_a_bad_rates_file_stops_gunicorn_before_any_worker(tmp_path: Path) -> None:
    """--fx-rates naming a file that is not the ECB's format: the master's one line, exit 2."""
    path = tmp_path / "eurofxref-daily.xml"
    path.write_text("<gesmes:Envelope>not rates")
    done = subprocess.run(
        gunicorn_argv(free_port()),
        env=quoteflow_env({"QUOTEFLOW_FX_RATES": str(path)}),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    ours = [line for line in done.stderr.splitlines() if line.startswith("quoteflow:")]
    assert len(ours) == 1
    assert ours[0].startswith(f"quoteflow: error: --fx-rates {path}: not XML")
    assert done.returncode == 2
    assert "Booting worker" not in done.stderr
    assert "Traceback" not in done.stderr
