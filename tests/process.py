"""QuoteFlow as a real process (``python -m quoteflow``) on a free port, for lifecycle tests."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import attrs


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@attrs.frozen
class Running:
    """A started QuoteFlow process and its base URL."""

    process: asyncio.subprocess.Process
    url: str


@asynccontextmanager
async def quoteflow_process(
    provider_url: str, *flags: str, capture_log: bool = False
) -> AsyncIterator[Running]:
    """Start QuoteFlow, wait until /health answers, and always stop it afterwards."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quoteflow",
        "--port",
        str(port),
        "--provider-url",
        provider_url,
        *flags,
        stderr=asyncio.subprocess.PIPE if capture_log else None,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(url + "/health") as health:
                        if health.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("QuoteFlow did not start")
        yield Running(process, url)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
