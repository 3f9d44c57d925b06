"""``make demo`` against a catalogue: the lab and QuoteFlow started with the same file."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

from tests.catalogue_fakes import write_catalogue
from tests.e2e.conftest import free_port

NAMES = ("north", "south", "east", "west", "zenith")


async def _healthy(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing healthy at {url}")


async def test_the_demo_tours_any_catalogue_the_lab_serves(tmp_path: Path) -> None:
    """The lab and QuoteFlow share one catalogue file; every case of its tour behaves."""
    lab_port, port = free_port(), free_port()
    path = write_catalogue(
        tmp_path / "suppliers.toml",
        [{"name": n, "url": f"http://127.0.0.1:{lab_port}/quotes/{n}"} for n in NAMES],
    )
    python = sys.executable
    lab = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "provider_lab",
        "--port",
        str(lab_port),
        "--suppliers",
        path,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    quoteflow = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "quoteflow",
        "--port",
        str(port),
        "--suppliers",
        path,
        "--log-level",
        "warning",
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await _healthy(f"http://127.0.0.1:{lab_port}")
        await _healthy(f"http://127.0.0.1:{port}")
        demo = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "provider_lab.demo",
            "--service",
            f"http://127.0.0.1:{port}",
            "--lab",
            f"http://127.0.0.1:{lab_port}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(demo.communicate(), 60)
    finally:
        for process in (quoteflow, lab):
            process.terminate()
            await process.wait()
    text = out.decode()
    assert demo.returncode == 0, text
    assert "asks a catalogue of 5: north, south, east, west, zenith" in text
    assert "zenith: 503 once" in text
    assert "cases behaved as the contract says" in text
