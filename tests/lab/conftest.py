"""Fixtures for the provider lab: the real app from its factory, on a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from provider_lab.app import create_app
from provider_lab.state import LabConfig

LabClient = TestClient[web.Request, web.Application]
StartLab = Callable[..., Awaitable[LabClient]]

SLOW_MS = 200
"""The tests' boreal ``slow`` scenario: short, so the suite stays fast."""


@pytest.fixture
def start_lab(aiohttp_client: AiohttpClient) -> StartLab:
    """Start a lab built by ``create_app``; keyword arguments override its config."""

    async def start(**overrides: Any) -> LabClient:
        values: dict[str, Any] = {"slow_ms": SLOW_MS, "seed": 1}
        values.update(overrides)
        return await aiohttp_client(create_app(LabConfig(**values)))

    return start


@pytest.fixture
async def lab(start_lab: StartLab) -> LabClient:
    """A lab with the default test config and no faults."""
    return await start_lab()


async def set_fault(lab: LabClient, supplier: str, *, append: bool = False, **fault: Any) -> None:
    """Switch a fault on through the control API (``append`` queues it after the others)."""
    method = lab.post if append else lab.put
    async with method(f"/faults/{supplier}", json=fault) as response:
        assert response.status == 200, await response.text()


async def ask(
    lab: LabClient,
    supplier: str = "boreal",
    sku: str = "KB-001",
    *,
    scenario: str | None = None,
    request_id: str | None = None,
    **headers: str,
) -> tuple[int, bytes]:
    """One supplier request; returns the status and the raw body."""
    params = {"sku": sku} if scenario is None else {"sku": sku, "scenario": scenario}
    if request_id is not None:
        headers["X-Request-ID"] = request_id
    async with lab.get(f"/quotes/{supplier}", params=params, headers=headers) as response:
        return response.status, await response.read()


async def stats(lab: LabClient) -> dict[str, Any]:
    """The lab's ``GET /stats``."""
    async with lab.get("/stats") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def wait_idle(lab: LabClient, within_s: float = 2.0) -> dict[str, Any]:
    """Poll ``/stats`` until nothing is in flight; return the last stats."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while True:
        current = await stats(lab)
        if current["active"] == 0 or loop.time() > end:
            return current
        await asyncio.sleep(0.02)
