"""QuoteFlow and the fake suppliers on real sockets, in a thread with its own event loop.

For clients that block (schemathesis sends its requests with ``requests``): a
blocking call inside a pytest-asyncio test would stall the very loop that has
to answer it, so the servers get a loop of their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs
from aiohttp import web

from quoteflow.app import create_app
from quoteflow.config import Settings
from tests.fakes import FakeSuppliers


@attrs.frozen
class LiveQuoteFlow:
    """A running QuoteFlow: its base URL, app and fake suppliers."""

    url: str
    app: web.Application
    suppliers: FakeSuppliers


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@contextmanager
def live_quoteflow(**overrides: Any) -> Iterator[LiveQuoteFlow]:
    """Run fake suppliers and QuoteFlow in a background thread until the block ends."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        box["stop"] = lambda: loop.call_soon_threadsafe(stop.set)
        suppliers = FakeSuppliers()
        supplier_runner, suppliers.url = await _serve(suppliers.app)
        try:
            settings = Settings(**{"provider_url": suppliers.url, **overrides})
            app = create_app(settings)
            runner, url = await _serve(app)
            try:
                box["live"] = LiveQuoteFlow(url, app, suppliers)
                ready.set()
                await stop.wait()
            finally:
                await runner.cleanup()
        finally:
            await supplier_runner.cleanup()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced to the test thread below
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="live-quoteflow", daemon=True)
    thread.start()
    ready.wait(timeout=10)
    try:
        if "live" not in box:
            raise RuntimeError("live QuoteFlow did not start") from box.get("error")
        yield box["live"]
    finally:
        if "stop" in box:
            box["stop"]()
        thread.join(timeout=10)
        if "error" in box:
            raise box["error"]
