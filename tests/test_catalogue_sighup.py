"""SIGHUP to a real ``python -m quoteflow`` under load: a good file swapped in, a bad one not."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
from pytest_aiohttp import AiohttpServer

from tests.catalogue_fakes import NamedSuppliers, after, write_catalogue
from tests.process import quoteflow_process

BUDGET = 0.4


async def test_sighup_under_load_swaps_a_good_file_and_keeps_the_old_on_a_bad_one(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """No 5xx, no answer past the budget, the new catalogue within 1 s, nothing left in flight."""
    fake = NamedSuppliers(("old", "stays", "new"))
    for name in fake.answers:
        fake.answers[name] = after(0.02)  # steady load, not a saturating one
    server = await aiohttp_server(fake.app)
    fake.url = str(server.make_url("/"))
    path = tmp_path / "suppliers.toml"

    def catalogue(*names: str) -> None:
        write_catalogue(path, [{"name": n, "url": fake.url_of(n)} for n in names])

    catalogue("old", "stays")
    answers: list[tuple[float, int, float, set[str]]] = []
    """(sent at, status, seconds taken, suppliers named in the answer) of every request."""
    stop = asyncio.Event()

    async def load(session: aiohttp.ClientSession, url: str) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            async with session.post(f"{url}/api/quotes", json={"quantity": 1}) as response:
                body = await response.json()
            named = {q["supplier"] for q in body.get("quotes", ())}
            named |= {f["supplier"] for f in body.get("failures", ())}
            answers.append((sent, response.status, time.monotonic() - sent, named))

    # At warning level: the log is read only at the end, and the pipe must not fill up.
    flags = ("--suppliers", str(path), "--budget", str(BUDGET), "--log-level", "warning")
    async with (
        quoteflow_process(fake.url, *flags, capture_log=True) as running,
        aiohttp.ClientSession() as session,
    ):
        loaders = [asyncio.create_task(load(session, running.url)) for _ in range(3)]
        await asyncio.sleep(0.3)
        catalogue("stays", "new")
        hup_good = time.monotonic()
        running.process.send_signal(signal.SIGHUP)
        await asyncio.sleep(1.2)
        path.write_text('[[supplier]]\nname = "stays"\nurl = "http://h/q"\nshare = 99\n')
        hup_bad = time.monotonic()
        running.process.send_signal(signal.SIGHUP)
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*loaders)
        async with session.get(f"{running.url}/metrics") as response:
            metrics = await response.text()
        running.process.send_signal(signal.SIGTERM)
        assert running.process.stderr is not None
        log = await asyncio.wait_for(running.process.stderr.read(), 10)
        assert await running.process.wait() == 0

    assert len(answers) > 20
    assert {status for _, status, _, _ in answers} == {200}
    assert max(taken for _, _, taken, _ in answers) < BUDGET + 0.3  # generous on a busy machine
    # Every answer names one whole catalogue, the old or the new, never a mix.
    assert {frozenset(named) for *_, named in answers} <= {
        frozenset({"old", "stays"}),
        frozenset({"stays", "new"}),
    }
    new_from = min(sent for sent, *_, named in answers if "new" in named)
    assert new_from - hup_good < 1.0
    assert all("new" in named for sent, *_, named in answers if sent > new_from + 0.01)
    assert any(sent > hup_bad for sent, *_ in answers)  # served on after the bad file
    assert all(named == {"stays", "new"} for sent, *_, named in answers if sent > hup_bad)
    # Nothing left in flight: not a slot, not a supplier call.
    assert "quoteflow_outbound_in_flight 0.0" in metrics
    assert fake.in_flight == dict.fromkeys(fake.in_flight, 0)
    events = [json.loads(line) for line in log.decode().splitlines() if line.startswith("{")]
    refused = [e for e in events if e["event"] == "reload_refused"]
    assert len(refused) == 1
    assert refused[0]["level"] == "error"
    assert "share: 99 is above the outbound limit" in refused[0]["error"]
