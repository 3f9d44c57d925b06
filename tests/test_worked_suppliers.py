"""docs/suppliers.md's three worked suppliers, as written there, against the real lab.

The catalogue is the page's TOML block with the lab's address put in; the lab
runs in this process on a real socket, speaking its three dialects, and its
own counts say what each supplier was sent.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.state import LabConfig
from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.options import load_catalogue
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT

DOC = Path(__file__).parent.parent / "docs" / "suppliers.md"
WRITTEN_FOR = "http://127.0.0.1:9101"
ENVIRON = {"LAB_CLIENT_SECRET": "lab-secret", "LAB_API_KEY": "lab-key"}


def worked_catalogue() -> str:
    """The TOML block under "Three worked suppliers", as the page has it."""
    section = DOC.read_text().split("## Three worked suppliers", 1)[1]
    match = re.search(r"```toml\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


async def start(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> tuple[TestClient[Any, Any], TestClient[Any, Any]]:
    lab_server = await aiohttp_server(create_lab(LabConfig()))
    lab_url = str(lab_server.make_url("")).rstrip("/")
    lab: TestClient[Any, Any] = await aiohttp_client(lab_server)
    path = tmp_path / "suppliers.toml"
    path.write_text(worked_catalogue().replace(WRITTEN_FOR, lab_url))
    settings = Settings(
        budget=TEST_BUDGET, connect_timeout=TEST_CONNECT_TIMEOUT, suppliers_file=str(path)
    )
    catalogue = load_catalogue(settings, ENVIRON)
    quoteflow = await aiohttp_client(create_app(settings, catalogue=catalogue, environ=ENVIRON))
    return quoteflow, lab


async def quotes(client: TestClient[Any, Any], quantity: int) -> dict[str, int]:
    response = await client.post("/api/quotes", json={"sku": "KB-001", "quantity": quantity})
    assert response.status == 200
    answer = await response.json()
    assert answer["failures"] == [], answer
    return {quote["supplier"]: quote["unit_cents"] for quote in answer["quotes"]}


async def test_the_three_worked_suppliers_quote_as_the_page_says(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """Classic, POST JSON with OAuth2 and price breaks, path with an API key: all answer."""
    quoteflow, lab = await start(aiohttp_server, aiohttp_client, tmp_path)
    # Quantity 1: every break at its first price; cedar's one unit in stock is enough.
    assert await quotes(quoteflow, 1) == {"atlas": 1200, "boreal": 1100, "cedar": 900}
    # Quantity 10: boreal's 10+ break; cedar (1 in stock) is a valid answer left out.
    assert await quotes(quoteflow, 10) == {"atlas": 1200, "boreal": 990}
    oauth2 = await (await lab.get("/oauth2")).json()
    assert oauth2["fetches"]["issued"] == 1  # one token served both requests
    stats = await (await lab.get("/stats")).json()
    assert stats["answers"] == {"atlas": {"ok": 2}, "boreal": {"ok": 2}, "cedar": {"ok": 2}}
