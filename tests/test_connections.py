"""Connection limits on real sockets: header timeout, idle timeout, the cap and what it costs."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from quoteflow.app import ServingRunner, create_app
from quoteflow.cli import main
from quoteflow.config import Settings
from quoteflow.connections import GuardedHandler
from quoteflow.options import ConfigError, parse_settings
from tests.conftest import TEST_CONNECT_TIMEOUT
from tests.fakes import FakeSuppliers, delay, quote
from tests.process import free_port, quoteflow_process

QUOTE_REQUEST = (
    b"POST /api/quotes HTTP/1.1\r\nHost: quoteflow\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)
HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nHost: quoteflow\r\n\r\n"
SLOW_BODY_HEAD = (
    b"POST /api/quotes HTTP/1.1\r\nHost: quoteflow\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n"
)
"""A head whose body never comes: a request in progress until the body timeout."""


@asynccontextmanager
async def serving(suppliers: FakeSuppliers, **overrides: Any) -> AsyncIterator[ServingRunner]:
    """QuoteFlow's own runner on a free port of 127.0.0.1, as ``python -m quoteflow`` runs it."""
    values: dict[str, Any] = {
        "budget": 0.5,
        "connect_timeout": TEST_CONNECT_TIMEOUT,
        "provider_url": suppliers.url,
        "shutdown_drain": 0,
    }
    values.update(overrides)
    runner = ServingRunner(create_app(Settings(**values)))
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield runner
    finally:
        await runner.cleanup()


def port_of(runner: ServingRunner) -> int:
    return int(runner.addresses[0][1])


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length: status, headers and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers["Content-Length"]))
    return int(lines[0].split()[1]), headers, body


async def closed_after(reader: asyncio.StreamReader, limit: float) -> float:
    """Seconds until the server closes the connection (EOF), at most ``limit``."""
    started = time.monotonic()
    rest = await asyncio.wait_for(reader.read(), limit)
    assert rest == b""
    return time.monotonic() - started


def metric(text: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels) in a Prometheus exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def scrape(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


# -- settings ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--header-timeout", "0"], "header_timeout must be more than 0"),
        (["--idle-timeout", "-1"], "idle_timeout must be more than 0"),
        (["--max-connections", "0"], "'max_connections' must be >= 1"),
        (["--max-connections", "many"], "--max-connections: 'many' is not a valid int"),
        (["--header-timeout", "20"], "header_timeout (20.0 s) must not be above idle_timeout"),
        (
            ["--header-timeout", "3", "--idle-timeout", "2"],
            "header_timeout (3.0 s) must not be above idle_timeout (2.0 s)",
        ),
    ],
)
def test_senseless_limits_are_refused(argv: list[str], problem: str) -> None:
    """Zero, negative or non-numeric limits, or a header timeout above the idle one: refused."""
    with pytest.raises(ConfigError) as caught:
        parse_settings(argv, {})
    assert problem in str(caught.value)


def test_limits_come_from_the_environment_too(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each limit has its variable; a bad one stops start-up with one line and exit 2."""
    settings = parse_settings(
        [],
        {
            "QUOTEFLOW_HEADER_TIMEOUT": "1.5",
            "QUOTEFLOW_IDLE_TIMEOUT": "30",
            "QUOTEFLOW_MAX_CONNECTIONS": "256",
        },
    )
    assert (settings.header_timeout, settings.idle_timeout, settings.max_connections) == (
        1.5,
        30.0,
        256,
    )
    defaults = Settings()
    assert (defaults.header_timeout, defaults.idle_timeout, defaults.max_connections) == (
        5.0,
        15.0,
        1024,
    )
    monkeypatch.setenv("QUOTEFLOW_MAX_CONNECTIONS", "-5")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err == "quoteflow: error: 'max_connections' must be >= 1: -5\n"


def _file_limit(soft: int, hard: int) -> Callable[[], None]:
    def limit() -> None:  # in the child, before it runs QuoteFlow
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def test_a_cap_the_file_limit_cannot_hold_is_refused() -> None:
    """A cap above what the process may ever open is refused in one line: it would never act."""
    done = subprocess.run(
        [sys.executable, "-m", "quoteflow", "--port", "0", "--max-connections", "5000"],
        preexec_fn=_file_limit(1024, 2048),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "quoteflow: error: max_connections 5000 needs 5070 file descriptors and this process"
        " may open 2048 (ulimit -Hn): lower it or raise that limit\n"
    )


def test_a_low_soft_file_limit_is_raised_for_the_cap() -> None:
    """With the common soft limit of 1,024 descriptors, the default cap still fits: it is raised."""
    process = subprocess.Popen(
        [sys.executable, "-m", "quoteflow", "--port", str(free_port()), "--log-level", "error"],
        preexec_fn=_file_limit(1024, 4096),
    )
    try:
        wanted = "Max open files            1094                 4096"
        for _ in range(500):
            limits = Path(f"/proc/{process.pid}/limits").read_text()
            if wanted in limits:
                break
            time.sleep(0.01)
        assert wanted in limits  # 1,024 connections, 6 to the suppliers, 64 others
    finally:
        process.kill()
        process.wait()


# -- timeouts ----------------------------------------------------------------------


async def test_a_silent_connection_closes_at_the_idle_timeout(suppliers: FakeSuppliers) -> None:
    """A connection that never sends a byte is closed after the idle timeout, with no answer."""
    async with serving(suppliers, header_timeout=0.3, idle_timeout=0.6) as runner:
        reader, writer = await connect(port_of(runner))
        took = await closed_after(reader, 0.6 + 1.0)
        writer.close()
        assert took >= 0.5


async def test_an_idle_keep_alive_connection_closes_at_the_idle_timeout(
    suppliers: FakeSuppliers,
) -> None:
    """After its answer, a keep-alive connection left idle is closed after the idle timeout."""
    async with serving(suppliers, header_timeout=0.3, idle_timeout=0.6) as runner:
        reader, writer = await connect(port_of(runner))
        writer.write(HEALTH_REQUEST)
        status, _, _ = await answer(reader)
        assert status == 200
        took = await closed_after(reader, 0.6 + 1.0)
        writer.close()
        assert took >= 0.5


async def test_a_dribbled_head_gets_408_at_the_header_timeout(
    suppliers: FakeSuppliers, caplog: pytest.LogCaptureFixture
) -> None:
    """A head sent a line at a time is answered 408 and closed once the header timeout is up."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    async with serving(suppliers, header_timeout=0.5, idle_timeout=5) as runner:
        port = port_of(runner)
        reader, writer = await connect(port)
        started = time.monotonic()
        writer.write(b"GET /health HTTP/1.1\r\n")
        got = asyncio.ensure_future(answer(reader))
        while not got.done():
            await asyncio.wait((got,), timeout=0.1)
            if not got.done():
                writer.write(b"X-Dribble: one more line\r\n")
        took = time.monotonic() - started
        status, headers, body = got.result()
        assert status == 408
        assert headers["Connection"] == "close"
        assert json.loads(body) == {
            "error": "header_timeout",
            "detail": "the request head did not arrive in time",
        }
        assert await reader.read() == b""
        writer.close()
        assert 0.45 <= took <= 0.5 + 1.0
        text = await scrape(port)
        assert metric(text, 'quoteflow_connections_closed_total{reason="header_timeout"}') == 1
    closed = [r for r in caplog.records if getattr(r, "event", "") == "connections_closed"]
    assert [r.__dict__["fields"] for r in closed] == [{"header_timeout": 1, "open": 0}]


async def test_a_head_begun_late_in_the_idle_time_still_gets_its_408(
    suppliers: FakeSuppliers,
) -> None:
    """Once a head began, the header timeout rules: no silent close at the idle timeout."""
    async with serving(suppliers, header_timeout=1.0, idle_timeout=1.2) as runner:
        reader, writer = await connect(port_of(runner))
        await asyncio.sleep(0.5)  # far enough from the idle timeout for a loaded machine
        writer.write(b"GET /health HTTP/1.1\r\n")  # idle timeout in 0.7 s, header in 1 s
        started = time.monotonic()
        status, _, body = await asyncio.wait_for(answer(reader), 1.0 + 1.0)
        assert status == 408
        assert json.loads(body)["error"] == "header_timeout"
        assert time.monotonic() - started >= 0.95
        writer.close()


async def test_the_header_timeout_counts_again_on_each_keep_alive_request(
    suppliers: FakeSuppliers,
) -> None:
    """A second head on a kept-alive connection has its own header timeout, from its first byte."""
    async with serving(suppliers, header_timeout=0.4, idle_timeout=5) as runner:
        reader, writer = await connect(port_of(runner))
        writer.write(HEALTH_REQUEST)
        assert (await answer(reader))[0] == 200
        await asyncio.sleep(0.6)  # idle longer than the header timeout: still open
        writer.write(b"GET /health HTTP/1.1\r\n")
        started = time.monotonic()
        status, _, _ = await asyncio.wait_for(answer(reader), 0.4 + 1.0)
        assert status == 408
        assert time.monotonic() - started >= 0.35
        writer.close()


async def test_a_well_behaved_keep_alive_client_is_never_cut(suppliers: FakeSuppliers) -> None:
    """Requests longer than both timeouts, and a body slower than the header timeout, all answer."""
    suppliers.always("boreal", delay(0.5, quote()))
    async with serving(
        suppliers, header_timeout=0.2, idle_timeout=0.45, budget=0.8, max_connections=2
    ) as runner:
        port = port_of(runner)
        reader, writer = await connect(port)
        for _ in range(2):
            writer.write(QUOTE_REQUEST)  # boreal answers after 0.5 s: past both timeouts
            status, _, body = await answer(reader)
            assert status == 200
            assert json.loads(body)["best"]["supplier"] == "boreal"
            await asyncio.sleep(0.1)
        writer.write(SLOW_BODY_HEAD)
        await asyncio.sleep(0.4)  # the body comes after the header timeout
        writer.write(b"{}")
        status, _, _ = await answer(reader)
        assert status == 200
        writer.close()
        assert metric(await scrape(port), 'quoteflow_connections_closed_total{reason="room"}') == 0


async def test_a_body_that_arrives_after_its_answer_is_no_head(suppliers: FakeSuppliers) -> None:
    """Body bytes read after an early answer (here a 405) arm no header timeout: no stray 408."""
    async with serving(suppliers, header_timeout=0.3, idle_timeout=5) as runner:
        reader, writer = await connect(port_of(runner))
        writer.write(b"POST /health HTTP/1.1\r\nHost: quoteflow\r\nContent-Length: 5\r\n\r\n")
        assert (await answer(reader))[0] == 405  # answered before its body came
        writer.write(b"hello")
        await asyncio.sleep(0.3 + 0.5)  # past the header timeout, well within the idle one
        writer.write(HEALTH_REQUEST)  # the connection is still the client's
        assert (await asyncio.wait_for(answer(reader), 1.0))[0] == 200
        writer.close()


async def test_a_closed_connection_is_freed_without_waiting_for_the_gc(
    suppliers: FakeSuppliers,
) -> None:
    """After a request with a body, a closed connection's handler is in no reference cycle."""

    def handlers() -> int:
        return sum(1 for thing in gc.get_objects() if isinstance(thing, GuardedHandler))

    async with serving(suppliers) as runner:
        reader, writer = await connect(port_of(runner))
        writer.write(QUOTE_REQUEST)
        assert (await answer(reader))[0] == 200
        gc.collect()
        gc.disable()
        try:
            assert handlers() == 1
            writer.close()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if handlers() == 0:
                    break
            assert handlers() == 0
        finally:
            gc.enable()


# -- the cap -----------------------------------------------------------------------


async def test_at_the_cap_the_longest_idle_connection_makes_room(
    suppliers: FakeSuppliers,
) -> None:
    """With 3 places, a fourth connection closes the oldest idle one; a busy one is never chosen."""
    suppliers.always("boreal", delay(0.4, quote()))
    async with serving(suppliers, max_connections=3, budget=0.8) as runner:
        port = port_of(runner)
        busy_reader, busy_writer = await connect(port)
        busy_writer.write(QUOTE_REQUEST)  # in progress for 0.4 s
        oldest = await connect(port)
        await asyncio.sleep(0.05)
        newer = await connect(port)
        await asyncio.sleep(0.05)
        fresh_reader, fresh_writer = await connect(port)  # the fourth
        assert await closed_after(oldest[0], 1.0) < 1.0
        fresh_writer.write(HEALTH_REQUEST)
        assert (await answer(fresh_reader))[0] == 200
        assert (await answer(busy_reader))[0] == 200  # never cut
        newer[1].write(HEALTH_REQUEST)
        assert (await answer(newer[0]))[0] == 200
        text = await scrape(port)  # a fourth connection again: the oldest idle one goes
        assert metric(text, 'quoteflow_connections_closed_total{reason="room"}') == 2
        assert metric(text, "quoteflow_connections_open") == 3
        for writer in (busy_writer, oldest[1], newer[1], fresh_writer):
            writer.close()


async def test_a_head_only_begun_is_idle_and_gets_its_408_when_it_makes_room(
    suppliers: FakeSuppliers,
) -> None:
    """At the cap, a connection whose head has only begun is idle: it goes, with a 408 first."""
    async with serving(suppliers, max_connections=1) as runner:
        port = port_of(runner)
        dribbler_reader, dribbler_writer = await connect(port)
        dribbler_writer.write(b"GET /health HTTP/1.1\r\n")
        await asyncio.sleep(0.1)
        reader, writer = await connect(port)
        status, _, body = await asyncio.wait_for(answer(dribbler_reader), 1.0)
        assert status == 408
        assert json.loads(body)["error"] == "header_timeout"
        writer.write(HEALTH_REQUEST)
        assert (await answer(reader))[0] == 200
        text = await scrape(port)  # on a third connection: the second, idle again, makes room
        assert metric(text, 'quoteflow_connections_closed_total{reason="room"}') == 2
        for closing in (dribbler_writer, writer):
            closing.close()


async def test_a_request_pipelined_behind_an_answered_one_is_never_cut(
    suppliers: FakeSuppliers,
) -> None:
    """Two requests in one write: after the first answer the connection is still busy, not idle."""
    suppliers.always("boreal", delay(0.4, quote()))
    async with serving(suppliers, max_connections=1, budget=0.8) as runner:
        port = port_of(runner)
        reader, writer = await connect(port)
        writer.write(HEALTH_REQUEST + QUOTE_REQUEST)  # the quote takes 0.4 s
        assert (await answer(reader))[0] == 200
        other_reader, other_writer = await connect(port)  # at the cap: no idle one to close
        status, _, body = await asyncio.wait_for(answer(reader), 2.0)
        assert status == 200
        assert json.loads(body)["best"]["supplier"] == "boreal"
        other_writer.write(HEALTH_REQUEST)
        assert (await asyncio.wait_for(answer(other_reader), 2.0))[0] == 200
        for closing in (writer, other_writer):
            closing.close()


async def test_when_every_connection_is_busy_a_new_one_waits(suppliers: FakeSuppliers) -> None:
    """With every place taken by a request in progress, the next connection waits, then answers."""
    async with serving(suppliers, max_connections=2, body_timeout=0.8) as runner:
        port = port_of(runner)
        held = []
        for _ in range(3):  # the third finds both places busy: it stays, accepting stops
            busy_reader, busy_writer = await connect(port)
            busy_writer.write(SLOW_BODY_HEAD)  # a request in progress until the body timeout
            held.append((busy_reader, busy_writer))
            await asyncio.sleep(0.05)
        started = time.monotonic()
        reader, writer = await connect(port)  # in the listen backlog: accepted later
        writer.write(HEALTH_REQUEST)
        status, _, _ = await asyncio.wait_for(answer(reader), 3.0)
        waited = time.monotonic() - started
        assert status == 200
        assert waited >= 0.5  # until the bodies' timeout answered them
        for busy_reader, busy_writer in held:
            assert (await answer(busy_reader))[0] == 408  # answered, never cut
            busy_writer.close()
        writer.close()
        assert runner.gate.pauses == 1
        assert metric(await scrape(port), "quoteflow_accept_pauses_total") == 1


async def test_connections_accepted_together_while_full_all_wait_their_turn(
    suppliers: FakeSuppliers,
) -> None:
    """The one place busy, four connections accepted in one batch: none closes another."""
    async with serving(suppliers, max_connections=1, body_timeout=0.5) as runner:
        port = port_of(runner)
        busy_reader, busy_writer = await connect(port)
        busy_writer.write(SLOW_BODY_HEAD)
        await asyncio.sleep(0.05)
        # Connected at once: asyncio's loop accepts them all in one turn, then
        # makes their protocols one by one, the first pausing the accepting.
        batch = await asyncio.gather(*(connect(port) for _ in range(4)))
        await asyncio.sleep(0.05)
        for _, writer in batch:
            writer.write(HEALTH_REQUEST)
        for reader, _ in batch:
            assert (await asyncio.wait_for(answer(reader), 2.0))[0] == 200
        assert (await answer(busy_reader))[0] == 408
        for _, writer in [*batch, (busy_reader, busy_writer)]:
            writer.close()


async def test_accepting_resumes_when_a_busy_connection_is_dropped(
    suppliers: FakeSuppliers,
) -> None:
    """Paused with every place busy: a caller hanging up mid-request makes room, unanswered."""
    async with serving(suppliers, max_connections=2, body_timeout=10) as runner:
        port = port_of(runner)
        held = []
        for _ in range(2):  # both places busy until their bodies' timeout, 10 s away
            busy_reader, busy_writer = await connect(port)
            busy_writer.write(SLOW_BODY_HEAD)
            held.append((busy_reader, busy_writer))
            await asyncio.sleep(0.05)
        silent = await connect(port)  # accepted, then accepting stops; it never sends a byte
        await asyncio.sleep(0.05)
        assert runner.gate.paused
        for _, busy_writer in held:
            busy_writer.close()  # hung up mid-request: closed, never answered
        reader, writer = await connect(port)
        writer.write(HEALTH_REQUEST)
        assert (await asyncio.wait_for(answer(reader), 2.0))[0] == 200
        for closing in (silent[1], writer):
            closing.close()


async def test_accepting_resumes_when_an_idle_connection_could_make_room(
    suppliers: FakeSuppliers,
) -> None:
    """Paused over the cap with silent connections of one batch: a dropped request resumes it."""
    async with serving(suppliers, max_connections=2, body_timeout=10, idle_timeout=10) as runner:
        port = port_of(runner)
        held = []
        for _ in range(2):  # both places busy until their bodies' timeout, 10 s away
            busy_reader, busy_writer = await connect(port)
            busy_writer.write(SLOW_BODY_HEAD)
            held.append((busy_reader, busy_writer))
            await asyncio.sleep(0.05)
        silent = await asyncio.gather(*(connect(port) for _ in range(3)))  # accepted together
        await asyncio.sleep(0.05)
        assert runner.gate.paused
        for _, busy_writer in held:
            busy_writer.close()  # 3 silent ones still open, over the cap: they can make room
        reader, writer = await connect(port)
        writer.write(HEALTH_REQUEST)
        assert (await asyncio.wait_for(answer(reader), 2.0))[0] == 200
        for closing in [writer, *(w for _, w in silent)]:
            closing.close()


async def test_stopping_while_paused_closes_the_listener(suppliers: FakeSuppliers) -> None:
    """Shutdown with accepting paused: requests in progress answer, the port then refuses."""
    async with serving(suppliers, max_connections=1, body_timeout=0.5) as runner:
        port = port_of(runner)
        held = []
        for _ in range(2):  # the second finds the one place busy: accepting stops
            reader, writer = await connect(port)
            writer.write(SLOW_BODY_HEAD)
            held.append((reader, writer))
            await asyncio.sleep(0.05)
        assert runner.gate.paused
        answers = [asyncio.ensure_future(answer(reader)) for reader, _ in held]
    assert [(await got)[0] for got in answers] == [408, 408]
    with pytest.raises(ConnectionRefusedError):
        await connect(port)
    for _, writer in held:
        writer.close()


async def test_stopping_just_as_accepting_resumes_leaves_nothing_serving(
    suppliers: FakeSuppliers,
) -> None:
    """Shutdown while the gate's new server is starting: that server is closed too, not leaked."""
    runner = ServingRunner(
        create_app(Settings(provider_url=suppliers.url, max_connections=1, body_timeout=5))
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = port_of(runner)
        held = []
        for _ in range(2):  # the second finds the one place busy: accepting stops
            _, writer = await connect(port)
            writer.write(SLOW_BODY_HEAD)
            held.append(writer)
            await asyncio.sleep(0.05)
        assert runner.gate.paused
        runner.gate.resume()  # as an answer going out would
        await asyncio.sleep(0)  # the new server exists and is starting: stop now
    finally:
        await runner.cleanup()
    ours = [  # the fake suppliers' server is still up, on its own port
        server
        for server in gc.get_objects()
        if isinstance(server, asyncio.Server)
        and server.is_serving()
        and any(sock.fileno() == -1 or sock.getsockname()[1] == port for sock in server.sockets)
    ]
    assert ours == []
    for writer in held:
        writer.close()


# -- an attacker process -----------------------------------------------------------


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_an_attacker_with_3000_idle_connections_cannot_take_the_service(
    suppliers: FakeSuppliers,
) -> None:
    """With 256 places, 3,000 hoarded connections leave the fds bounded and a caller served fast."""
    async with quoteflow_process(
        suppliers.url,
        "--max-connections",
        "256",
        "--event-loop",
        "uvloop",
        "--log-level",
        "warning",
        "--connect-timeout",
        "1",
    ) as running:
        pid = running.process.pid
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s,
            s.post(running.url + "/api/quotes", json={}) as response,
        ):
            assert response.status == 200  # its supplier connections are open from now on
        before = open_fds(pid)
        attacker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.abuse",
            "--port",
            running.url.rsplit(":", 1)[1],
            "--idle",
            "3000",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert attacker.stdin is not None
        assert attacker.stdout is not None
        peak = before
        ready = asyncio.ensure_future(attacker.stdout.readline())
        while not ready.done():  # sampled while the attacker connects
            peak = max(peak, open_fds(pid))
            await asyncio.wait((ready,), timeout=0.005)
        assert ready.result().startswith(b"ready ")
        peak = max(peak, open_fds(pid))
        # The fixed part: what it had before, one socket being accepted and
        # one being closed at a time (uvloop accepts one by one).
        assert peak <= before + 256 + 4

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
            started = time.monotonic()
            async with s.post(running.url + "/api/quotes", json={}) as response:
                assert response.status == 200
                assert len((await response.json())["quotes"]) == 2
            assert time.monotonic() - started < 0.100
            async with s.get(running.url + "/metrics") as response:
                text = await response.text()
        assert metric(text, "quoteflow_connections_open") <= 256
        assert metric(text, 'quoteflow_connections_closed_total{reason="room"}') >= 3000 - 256

        attacker.stdin.close()
        assert (await attacker.stdout.readline()).startswith(b"done ")
        await attacker.wait()
        for _ in range(100):  # the attacker's connections close on the loop's next turns
            if open_fds(pid) <= before:
                break
            await asyncio.sleep(0.02)
        assert open_fds(pid) <= before
        async with aiohttp.ClientSession() as s:
            async with s.post(running.url + "/api/quotes", json={}) as response:
                assert response.status == 200
            async with s.get(running.url + "/metrics") as response:
                assert metric(await response.text(), "quoteflow_connections_open") == 1
