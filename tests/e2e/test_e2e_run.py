"""``make run`` and ``make demo``: the pair as one process tree, the README's curl, clean stops.

``make run`` also starts a second QuoteFlow asking docs/suppliers.md's worked
suppliers; the demo's last cases (price breaks, tokens) run against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest

from provider_lab.run_pair import WORKED_SUPPLIERS
from tests.e2e.conftest import free_port
from tests.test_worked_suppliers import worked_catalogue


def refuses(port: int) -> bool:
    """Whether nothing listens on ``port`` any more."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain ``text`` (Linux /proc)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in args:
                found.append(args)
    return found


@attrs.define
class Running:
    """A ``run_pair`` process and everything it has printed so far."""

    process: asyncio.subprocess.Process
    lines: list[str]
    lab_port: int
    port: int
    dialects_port: int = 0
    """The worked suppliers' QuoteFlow (``run_pair`` only; 0: none)."""

    async def line_containing(self, text: str, within_s: float = 20.0) -> str:
        """Wait for an output line containing ``text``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + within_s
        while loop.time() < end:
            for line in self.lines:
                if text in line:
                    return line
            if self.process.returncode is not None:
                break
            await asyncio.sleep(0.05)
        raise AssertionError(f"no line with {text!r} in:\n" + "\n".join(self.lines))


async def _drain(stream: asyncio.StreamReader, lines: list[str]) -> None:
    while line := await stream.readline():
        lines.append(line.decode(errors="replace").rstrip())


async def start_pair(
    lab_port: int, port: int, dialects_port: int
) -> tuple[Running, asyncio.Task[None]]:
    """Start ``run_pair`` and keep reading what it and its children print."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_lab.run_pair",
        "--lab-port",
        str(lab_port),
        "--port",
        str(port),
        "--dialects-port",
        str(dialects_port),
        # As `make run` starts it: with coalescing and the quote cache.
        "--",
        "--coalesce",
        "--cache-size",
        "1000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        # Its own process group: the teardown can stop the lab and QuoteFlow
        # too, which hold the output pipe the reader waits on.
        start_new_session=True,
    )
    running = Running(process, [], lab_port, port, dialects_port)
    assert process.stdout is not None
    return running, asyncio.create_task(_drain(process.stdout, running.lines))


async def stop_pair(running: Running, reader: asyncio.Task[None]) -> None:
    """Kill ``run_pair`` and whatever of its children is left, then read their last lines."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(running.process.pid, signal.SIGKILL)
    await running.process.wait()
    await reader


@pytest.fixture
async def running_pair() -> AsyncIterator[Running]:
    """``run_pair`` on free ports; killed at the end if a test left it running."""
    running, reader = await start_pair(free_port(), free_port(), free_port())
    try:
        yield running
    finally:
        await stop_pair(running, reader)


async def test_run_pair_serves_the_readme_curl_and_stops_cleanly(running_pair: Running) -> None:
    """The printed curl gives boreal as best with no failures; SIGINT stops both processes."""
    line = await running_pair.line_containing("curl -s -X POST")
    args = shlex.split(line)
    url, body = args[args.index("POST") + 1], args[args.index("-d") + 1]
    assert url == f"http://127.0.0.1:{running_pair.port}/api/quotes"
    assert body == '{"quantity":2,"scenario":"flaky"}'
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers={"Content-Type": "application/json"}) as response,
    ):
        result = await response.json()
    assert result["best"]["supplier"] == "boreal"
    assert result["failures"] == []
    # The worked suppliers' curl: boreal's break from 10, by POST JSON with a token.
    line = await running_pair.line_containing(f":{running_pair.dialects_port}/api/quotes ")
    args = shlex.split(line)
    url, body = args[args.index("POST") + 1], args[args.index("-d") + 1]
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers={"Content-Type": "application/json"}) as response,
    ):
        result = await response.json()
    assert result["best"]["supplier"] == "boreal"
    assert result["best"]["unit_cents"] == 990
    assert result["failures"] == []

    running_pair.process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(running_pair.process.wait(), 15) == 0
    for port in (running_pair.port, running_pair.lab_port, running_pair.dialects_port):
        assert refuses(port)
        assert processes_mentioning(f"--port {port}") == []


def test_run_pair_starts_the_worked_suppliers_as_the_page_has_them() -> None:
    """The second QuoteFlow's catalogue is docs/suppliers.md's TOML block, as written."""
    assert worked_catalogue() == WORKED_SUPPLIERS


async def test_demo_shows_every_case_as_expected(running_pair: Running) -> None:
    """``make demo`` against the running pair: every case behaves as the contract says."""
    await running_pair.line_containing("Ctrl-C stops all three")
    demo = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_lab.demo",
        "--service",
        f"http://127.0.0.1:{running_pair.port}",
        "--lab",
        f"http://127.0.0.1:{running_pair.lab_port}",
        "--dialects",
        f"http://127.0.0.1:{running_pair.dialects_port}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    # About 20 s; a misbehaving QuoteFlow makes the token cases poll (12 s at most each).
    out, _ = await asyncio.wait_for(demo.communicate(), 120)
    text = out.decode()
    assert demo.returncode == 0, text
    assert "cases behaved as the contract says" in text
    assert "scenario flaky" in text
    for case in ("a joined call", "a joiner leaves", "a cached quote", "stale covers a 503"):
        assert case in text
    for case in (
        "price break at quantity 1 ",
        "price break at quantity 10 ",
        "401, then success",
        "token expired mid-run",
        "token endpoint down",
        "token endpoint back",
    ):
        assert case in text
    running_pair.process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(running_pair.process.wait(), 15) == 0


async def test_demo_without_a_pair_says_how_to_start_one() -> None:
    """``make demo`` with nothing running prints one hint line and exits 1."""
    port = free_port()
    demo = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_lab.demo",
        "--service",
        f"http://127.0.0.1:{port}",
        "--lab",
        f"http://127.0.0.1:{port}",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(demo.communicate(), 10)
    assert demo.returncode == 1
    assert "make run" in out.decode()


async def test_a_child_that_cannot_start_stops_the_other() -> None:
    """If the lab's port is taken, ``run_pair`` exits 1 and leaves no QuoteFlow behind."""
    blocker = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    lab_port = blocker.sockets[0].getsockname()[1]
    running, reader = await start_pair(lab_port, free_port(), free_port())
    try:
        assert await asyncio.wait_for(running.process.wait(), 30) == 1
        # Checked before the teardown, which would stop a QuoteFlow left behind;
        # the children hold the output pipe, so the reader ends once none is left.
        await asyncio.wait_for(asyncio.shield(reader), 10)
        for port in (running.port, running.dialects_port):
            assert refuses(port)
            assert processes_mentioning(f"--port {port}") == []
    finally:
        blocker.close()
        await blocker.wait_closed()
        await stop_pair(running, reader)
