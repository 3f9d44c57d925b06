"""Fixtures for the provider lab: the real app from its factory, on a real socket, and
clients for each of its dialects and its token endpoint."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote, quote_plus, urlencode

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from multidict import CIMultiDictProxy
from pytest_aiohttp import AiohttpClient
from yarl import URL

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


# -- the foreign dialects and the token endpoint ------------------------------------------


def basic(client_id: str = "quoteflow", client_secret: str = "lab-secret") -> str:
    """RFC 6749 §2.3.1's ``Authorization: Basic``: each part form-urlencoded, then base64."""
    pair = f"{quote_plus(client_id)}:{quote_plus(client_secret)}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


async def token_request(
    lab: LabClient, form: dict[str, str] | None = None, **headers: str
) -> tuple[int, dict[str, Any], CIMultiDictProxy[str]]:
    """``POST /oauth2/token`` with a form (Basic credentials unless ``Authorization`` is given)."""
    if form is None:
        form = {"grant_type": "client_credentials"}
    headers.setdefault("Authorization", basic())
    if not headers["Authorization"]:
        del headers["Authorization"]
    async with lab.post("/oauth2/token", data=form, headers=headers) as response:
        return response.status, await response.json(), response.headers


async def fetch_token(lab: LabClient) -> str:
    """A fresh token from the lab's token endpoint, with the default credentials."""
    status, body, _ = await token_request(lab)
    assert status == 200, body
    token: str = body["access_token"]
    return token


async def ask_json(
    lab: LabClient,
    supplier: str = "boreal",
    sku: str = "KB-001",
    quantity: int = 1,
    *,
    token: str | None,
    scenario: str | None = None,
    request_id: str | None = None,
    **headers: str,
) -> tuple[int, bytes]:
    """One ``json``-dialect request (``token=None``: no ``Authorization``); status and body."""
    order: dict[str, Any] = {"items": [{"partNumber": sku, "quantity": quantity}]}
    if scenario is not None:
        order["scenario"] = scenario
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if request_id is not None:
        headers["X-Request-ID"] = request_id
    async with lab.post(f"/json/{supplier}/quote", json=order, headers=headers) as response:
        return response.status, await response.read()


def raw_url(lab: LabClient, path_and_query: str) -> URL:
    """An absolute URL sent exactly as written: no normalising of ``%2E%2E`` or ``..``."""
    root = str(lab.make_url("/")).rstrip("/")
    return URL(root + path_and_query, encoded=True)


async def ask_path(
    lab: LabClient,
    supplier: str = "boreal",
    sku: str = "KB-001",
    qty: int | str | None = 1,
    *,
    key: str | None = "lab-key",
    scenario: str | None = None,
    request_id: str | None = None,
    segment: str | None = None,
    **headers: str,
) -> tuple[int, bytes]:
    """One ``path``-dialect request; the SKU percent-encoded as one segment unless ``segment``
    gives the raw text to send."""
    if segment is None:
        segment = quote(sku, safe="")
        if segment in (".", ".."):
            segment = segment.replace(".", "%2E")
    given = {"qty": qty, "key": key, "scenario": scenario}
    query = [(name, str(value)) for name, value in given.items() if value is not None]
    if request_id is not None:
        headers["X-Request-ID"] = request_id
    path = f"/path/{supplier}/parts/{segment}/price?{urlencode(query, quote_via=quote)}"
    async with lab.session.get(raw_url(lab, path), headers=headers) as response:
        return response.status, await response.read()


@contextlib.asynccontextmanager
async def lab_process(*flags: str) -> AsyncIterator[str]:
    """``python -m provider_lab --port 0 FLAGS`` as a process: its URL while it runs.

    On leaving, SIGTERM, and the lab must exit 0 within 5 s; killed if it did not.
    """
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "provider_lab",
        "--port",
        "0",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 10)
        url = line.decode().strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:"), line
        yield url
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 5) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
