"""Under gunicorn: the connection limits hold in every worker, and no worker boots without the
config that makes ``/metrics`` the host's."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.fleet.procs import Gunicorn, Lab, gunicorn_argv, quoteflow_env, start_gunicorn
from tests.process import free_port
from tests.test_connections import (
    HEALTH_REQUEST,
    SLOW_BODY_HEAD,
    answer,
    closed_after,
    metric,
    open_fds,
)

PLACES = 16
"""``QUOTEFLOW_MAX_CONNECTIONS`` of the fleet below: per worker."""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, lab_process: Lab) -> Iterator[Gunicorn]:
    """2 workers (no Redis) with short connection timeouts and 16 places each."""
    running = start_gunicorn(
        tmp_path_factory.mktemp("limited"),
        {
            "QUOTEFLOW_PROVIDER_URL": lab_process.url,
            "QUOTEFLOW_LOG_LEVEL": "warning",
            "QUOTEFLOW_HEADER_TIMEOUT": "0.5",
            "QUOTEFLOW_IDLE_TIMEOUT": "1",
            "QUOTEFLOW_MAX_CONNECTIONS": str(PLACES),
        },
    )
    try:
        yield running
    finally:
        assert running.stop() == 0, f"gunicorn failed; log in {running.log_path}"


async def test_gunicorn_workers_close_idle_connections_and_slow_heads(limited: Gunicorn) -> None:
    """Each worker closes a silent connection at the idle timeout and a dribbled head with 408."""
    port = int(limited.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await closed_after(reader, 1 + 1.0) >= 0.9
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /health HTTP/1.1\r\n")
    got = asyncio.ensure_future(answer(reader))
    started = time.monotonic()
    while not got.done():
        await asyncio.wait((got,), timeout=0.1)
        if not got.done():
            writer.write(b"X-Dribble: one more line\r\n")
    assert got.result()[0] == 408
    assert time.monotonic() - started <= 0.5 + 1.0
    writer.close()


async def test_gunicorn_workers_keep_to_their_places(limited: Gunicorn) -> None:
    """200 hoarded connections: each worker holds at most its 16, and a caller is still served."""
    port = int(limited.url.rsplit(":", 1)[1])
    workers = limited.wait_workers(2)
    before = {pid: open_fds(pid) for pid in workers}
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]
    await asyncio.sleep(0.2)
    for pid in workers:
        assert open_fds(pid) <= before[pid] + PLACES + 4
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEALTH_REQUEST)
    assert (await asyncio.wait_for(answer(reader), 1.0))[0] == 200
    writer.close()
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(limited.url + "/metrics") as response,
    ):
        text = await response.text()
    assert metric(text, "quoteflow_connections_open") <= 2 * PLACES
    assert metric(text, 'quoteflow_connections_closed_total{reason="room"}') >= 200 - 2 * PLACES
    for _, idle in held:
        idle.close()


async def test_a_gunicorn_worker_with_every_place_busy_stops_accepting(
    tmp_path: Path, lab_process: Lab
) -> None:
    """On gunicorn's listening socket too: the next connection waits until an answer goes out."""
    single = start_gunicorn(
        tmp_path,
        {
            "QUOTEFLOW_PROVIDER_URL": lab_process.url,
            "QUOTEFLOW_LOG_LEVEL": "warning",
            "QUOTEFLOW_MAX_CONNECTIONS": "2",
            "QUOTEFLOW_BODY_TIMEOUT": "0.8",
        },
        workers=1,
    )
    try:
        port = int(single.url.rsplit(":", 1)[1])
        held = []
        for _ in range(3):  # the third finds both places busy: it stays, accepting stops
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(SLOW_BODY_HEAD)
            held.append((reader, writer))
            await asyncio.sleep(0.05)
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # the kernel's backlog
        writer.write(HEALTH_REQUEST)
        assert (await asyncio.wait_for(answer(reader), 3.0))[0] == 200
        assert time.monotonic() - started >= 0.5
        for busy_reader, busy_writer in held:
            assert (await answer(busy_reader))[0] == 408  # answered, never cut
            busy_writer.close()
        writer.close()
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
            session.get(single.url + "/metrics") as response,
        ):
            assert metric(await response.text(), "quoteflow_accept_pauses_total") == 1
    finally:
        assert single.stop() == 0, f"gunicorn failed; log in {single.log_path}"


def test_without_gunicorn_conf_no_worker_boots(tmp_path: Path) -> None:
    """A bare gunicorn command: every worker refuses with the command to run, gunicorn stops.

    Its ``/metrics`` would otherwise be one worker's share of the host's, silently.
    """
    argv = gunicorn_argv(free_port(), config=False)
    done = subprocess.run(
        argv,
        env=quoteflow_env({}, PROMETHEUS_MULTIPROC_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    command = [sys.executable, "-m", "gunicorn", "-c", "python:quoteflow.gunicorn_conf", *argv[3:]]
    ours = {line for line in done.stderr.splitlines() if line.startswith("quoteflow:")}
    assert ours == {
        "quoteflow: error: under gunicorn, /metrics adds up every worker only with QuoteFlow's"
        f" gunicorn config; start it with: {shlex.join(command)}"
    }
    assert done.returncode in (1, 3)  # see test_a_bad_variable_stops_gunicorn_with_one_line
    assert "Worker failed to boot." in done.stderr
    assert not list(tmp_path.glob("*.db"))  # no worker got as far as its metrics
