"""``make run`` and ``make demo``: the pair as one process tree, the README's curl, clean stops.

``make run`` also starts a second QuoteFlow asking docs/suppliers.md's worked
suppliers, whose demo cases (price breaks, tokens) run against it, and a third
asking the lab's suppliers in its batch dialect, for the demo's last cases: carts,
and a fourth, hedged (``--hedge``), for the demo's hedge case.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import attrs
import pytest

from provider_lab.run_pair import (
    BATCH_MAX_ITEMS,
    BATCH_SUPPLIERS,
    CART_SKUS,
    WORKED_SUPPLIERS,
    batch_catalogue,
)
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
    batch_port: int = 0
    """The batch suppliers' QuoteFlow (``run_pair`` only; 0: none)."""
    hedged_port: int = 0
    """The hedged QuoteFlow (``run_pair`` only; 0: none)."""

    @property
    def quoteflow_ports(self) -> tuple[int, ...]:
        """Every QuoteFlow's port."""
        ports = (self.port, self.dialects_port, self.batch_port, self.hedged_port)
        return tuple(port for port in ports if port)

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
    lab_port: int, port: int, dialects_port: int, batch_port: int, hedged_port: int
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
        "--batch-port",
        str(batch_port),
        "--hedged-port",
        str(hedged_port),
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
    running = Running(process, [], lab_port, port, dialects_port, batch_port, hedged_port)
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
    ports = (free_port() for _ in range(5))
    running, reader = await start_pair(*ports)
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
    # boreal's price list is in euros: 9.90 from 10 on, converted at the lab's rates.
    assert (result["best"]["offer"]["currency"], result["best"]["offer"]["unit_price"]) == (
        "EUR",
        "9.90",
    )
    assert result["currency"] == "USD"
    assert result["failures"] == []
    # The batch suppliers' cart: each line's best is cedar's, the basket atlas's alone.
    line = await running_pair.line_containing(f":{running_pair.batch_port}/api/carts ")
    args = shlex.split(line)
    url, body = args[args.index("POST") + 1], args[args.index("-d") + 1]
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers={"Content-Type": "application/json"}) as response,
    ):
        result = await response.json()
    assert [line["sku"] for line in result["lines"]] == list(CART_SKUS)
    assert {line["best"]["supplier"] for line in result["lines"]} == {"cedar"}
    assert all(len(line["quotes"]) == 3 for line in result["lines"])
    basket = result["basket"]
    assert {pick["supplier"] for pick in basket["picks"]} == {"atlas"}
    assert basket["shipping"] == [{"supplier": "atlas", "shipping_cents": 900}]
    assert basket["total_cents"] < basket["per_line_total_cents"]

    running_pair.process.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(running_pair.process.wait(), 15) == 0
    assert "run: stopping the QuoteFlows and the provider lab" in running_pair.lines
    for port in (running_pair.lab_port, *running_pair.quoteflow_ports):
        assert refuses(port)
        assert processes_mentioning(f"--port {port}") == []


def test_run_pair_starts_the_worked_suppliers_as_the_page_has_them() -> None:
    """The second QuoteFlow's catalogue is docs/suppliers.md's TOML block, as written."""
    assert worked_catalogue() == WORKED_SUPPLIERS


def test_run_pair_asks_the_batch_suppliers_in_the_labs_batch_dialect() -> None:
    """The third QuoteFlow's catalogue: the lab's three at its address, 20 lines a call."""
    suppliers = tomllib.loads(batch_catalogue("http://127.0.0.1:9201"))["supplier"]
    assert [s["name"] for s in suppliers] == ["atlas", "boreal", "cedar"]
    for supplier in suppliers:
        assert supplier == {
            "name": supplier["name"],
            "method": "POST",
            "url": f"http://127.0.0.1:9201/batch/{supplier['name']}/match",
            "adapter": "provider_lab.adapters:batch_dialect",
            "body": {"parts": [{"mpn": "{sku}", "qty": "{quantity}"}], "scenario": "{scenario}"},
            "batch": {"max_items": BATCH_MAX_ITEMS, "items": "parts"},
        }
    assert BATCH_MAX_ITEMS == 20
    assert batch_catalogue("http://127.0.0.1:9101") == BATCH_SUPPLIERS


async def test_demo_shows_every_case_as_expected(running_pair: Running) -> None:
    """``make demo`` against the running pair: every case behaves as the contract says."""
    await running_pair.line_containing("Ctrl-C stops all five")
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
        "--batch",
        f"http://127.0.0.1:{running_pair.batch_port}",
        "--hedged",
        f"http://127.0.0.1:{running_pair.hedged_port}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    # About 25 s; a misbehaving QuoteFlow makes the token cases poll (12 s at most each),
    # and the hedge case asks for 45 s at most.
    out, _ = await asyncio.wait_for(demo.communicate(), 180)
    text = out.decode()
    assert demo.returncode == 0, text
    assert "cases behaved as the contract says" in text
    assert "scenario flaky" in text
    for case in ("a joined call", "a joiner leaves", "a cached quote", "stale covers a 503"):
        assert case in text
    assert "hedge: boreal's tail " in text
    for case in (
        "price break at quantity 1 ",
        "price break at quantity 10 ",
        "401, then success",
        "token expired mid-run",
        "token endpoint down",
        "token endpoint back",
    ):
        assert case in text
    for case in (
        "cart of 50 lines, classic ",
        "cart of 50 lines, batch ",
        "batch: malformed entry (atlas)",
        "batch: one call 503s (boreal)",
        "basket beats each line's best",
        "BOM as CSV: a KiCad export ",
        "BOM as CSV: the basket as CSV ",
    ):
        assert case in text
    for case in (
        "KB-001 x 10, USD 1.0850 ",
        "KB-001 x 10, USD 1.3000 ",
        "RES-0402-1K: need 7, buy 10 ",
        "CAP-BULK-1: need 90, buy 100 ",
        "cart: RES-0402-10K x 5000 ",
        "rates feed down: table kept ",
        "rates stale: no_rate ",
        "rates back: boreal best again ",
    ):
        assert case in text
    assert "50/50/50" in text  # the classic cart: a call per line and supplier
    assert "atlas 20+20+10, boreal 20+20+10, cedar 20+20+10" in text
    # The BOM's round trip: refs kept, DNP and fiducial rows skipped, the CSV's sums checked.
    assert "skipped_rows: row 8 (quantity DNP: not placed), row 10 (" in text
    assert "line + shipping amounts = total row = the JSON basket's " in text
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
    running, reader = await start_pair(lab_port, free_port(), free_port(), free_port(), free_port())
    try:
        assert await asyncio.wait_for(running.process.wait(), 30) == 1
        # Checked before the teardown, which would stop a QuoteFlow left behind;
        # the children hold the output pipe, so the reader ends once none is left.
        await asyncio.wait_for(asyncio.shield(reader), 10)
        for port in running.quoteflow_ports:
            assert refuses(port)
            assert processes_mentioning(f"--port {port}") == []
    finally:
        blocker.close()
        await blocker.wait_closed()
        await stop_pair(running, reader)


async def test_a_batch_quoteflow_that_cannot_start_stops_the_others() -> None:
    """If the batch suppliers' port is taken, ``run_pair`` says so, exits 1, leaves nothing."""
    blocker = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    batch_port = blocker.sockets[0].getsockname()[1]
    running, reader = await start_pair(
        free_port(), free_port(), free_port(), batch_port, free_port()
    )
    try:
        assert await asyncio.wait_for(running.process.wait(), 30) == 1
        await asyncio.wait_for(asyncio.shield(reader), 10)
        assert any(
            "QuoteFlow of the batch suppliers did not start" in line for line in running.lines
        )
        for port in (running.lab_port, *running.quoteflow_ports):
            assert processes_mentioning(f"--port {port}") == []
            assert port == batch_port or refuses(port)
    finally:
        blocker.close()
        await blocker.wait_closed()
        await stop_pair(running, reader)
