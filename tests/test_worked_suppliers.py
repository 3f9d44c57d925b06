"""docs/suppliers.md's three worked suppliers, as written there, against the real lab.

The catalogue is the page's TOML block with the lab's address put in; the lab
runs in this process on a real socket, speaking its three dialects, and its
own counts say what each supplier was sent. QuoteFlow takes its rates from the
lab's feed (``/fx/eurofxref-daily.xml``): boreal's price list is in euros.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.fx import FEED_PATH
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
        budget=TEST_BUDGET,
        connect_timeout=TEST_CONNECT_TIMEOUT,
        suppliers_file=str(path),
        fx_rates=lab_url + FEED_PATH,
    )
    catalogue = load_catalogue(settings, ENVIRON)
    quoteflow = await aiohttp_client(create_app(settings, catalogue=catalogue, environ=ENVIRON))
    return quoteflow, lab


async def quotes(client: TestClient[Any, Any], quantity: int) -> dict[str, dict[str, Any]]:
    response = await client.post("/api/quotes", json={"sku": "KB-001", "quantity": quantity})
    assert response.status == 200
    answer = await response.json()
    assert answer["failures"] == [], answer
    assert answer["currency"] == "USD"
    return {quote["supplier"]: quote for quote in answer["quotes"]}


def totals(quoted: dict[str, dict[str, Any]]) -> dict[str, int]:
    return {supplier: quote["total_cents"] for supplier, quote in quoted.items()}


async def test_the_three_worked_suppliers_quote_as_the_page_says(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """Classic, POST JSON with OAuth2 and price breaks, path with an API key: all answer."""
    quoteflow, lab = await start(aiohttp_server, aiohttp_client, tmp_path)
    # Quantity 1: every break at its first price; cedar's one unit in stock is enough.
    # boreal's 11.00 EUR and 2.50 EUR shipping at the lab's 1.0850 USD per EUR, each
    # rounded half-even to the cent: 11.935 -> 11.94, 2.7125 -> 2.71.
    first = await quotes(quoteflow, 1)
    assert totals(first) == {"atlas": 1500, "boreal": 1194 + 271, "cedar": 1100}
    assert (first["atlas"]["unit_cents"], first["cedar"]["unit_cents"]) == (1200, 900)
    assert "unit_cents" not in first["boreal"]
    assert first["boreal"]["offer"]["currency"] == "EUR"
    assert first["boreal"]["offer"]["unit_price"] == "11.00"
    # Quantity 10: boreal's 10+ break (99.00 EUR -> 107.415 -> 107.42 USD), the cheapest;
    # cedar (1 in stock) is a valid answer left out.
    tenth = await quotes(quoteflow, 10)
    assert totals(tenth) == {"atlas": 12300, "boreal": 10742 + 271}
    assert tenth["boreal"]["offer"]["unit_price"] == "9.90"
    oauth2 = await (await lab.get("/oauth2")).json()
    assert oauth2["fetches"]["issued"] == 1  # one token served both requests
    stats = await (await lab.get("/stats")).json()
    assert stats["answers"] == {"atlas": {"ok": 2}, "boreal": {"ok": 2}, "cedar": {"ok": 2}}
    assert stats["fx_fetches"] == 1  # at start; the next is an hour away
