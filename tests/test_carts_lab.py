"""Carts against the real provider lab's batch dialect: chunks, bad entries, flaky calls.

The lab runs in this process on a real socket; its ``/stats`` say what each
supplier was sent (calls, their sizes, request ids). QuoteFlow reads the
dialect through ``provider_lab.adapters:batch_dialect``, as a user would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.state import LabConfig
from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.options import load_catalogue
from tests.api_fakes import catalogue_text
from tests.conftest import TEST_CONNECT_TIMEOUT

Client = TestClient[Any, Any]

HOT = [f"HOT-{n:02d}" for n in range(1, 6)]


def batch_supplier(lab_url: str, name: str, max_items: int) -> dict[str, Any]:
    return {
        "name": name,
        "method": "POST",
        "url": f"{lab_url}/batch/{name}/match",
        "adapter": "provider_lab.adapters:batch_dialect",
        "body": {"parts": [{"mpn": "{sku}", "qty": "{quantity}"}], "scenario": "{scenario}"},
        "batch": {"max_items": max_items, "items": "parts"},
    }


async def start(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    max_items: int = 2,
    **lab: Any,
) -> tuple[Client, Client]:
    lab_server = await aiohttp_server(create_lab(LabConfig(**lab)))
    lab_url = str(lab_server.make_url("")).rstrip("/")
    lab_client: Client = await aiohttp_client(lab_server)
    path = tmp_path / "suppliers.toml"
    names = ("atlas", "boreal", "cedar")
    path.write_text(catalogue_text([batch_supplier(lab_url, n, max_items) for n in names]))
    settings = Settings(
        budget=0.5,
        cart_budget=1.5,
        connect_timeout=TEST_CONNECT_TIMEOUT,
        suppliers_file=str(path),
        breaker_failures=0,
    )
    catalogue = load_catalogue(settings, {})
    quoteflow = await aiohttp_client(create_app(settings, catalogue=catalogue, environ={}))
    return quoteflow, lab_client


async def post_cart(client: Client, skus: list[str], **extra: Any) -> dict[str, Any]:
    body = {"lines": [{"sku": sku, "quantity": 1} for sku in skus], **extra}
    response = await client.post("/api/carts", json=body, headers={"X-Request-ID": "lab-cart"})
    assert response.status == 200, await response.text()
    return dict(await response.json())


async def test_a_cart_is_quoted_by_every_batch_supplier_in_chunks_and_consolidated(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """5 lines in calls of 2, 2 and 1 per supplier; the basket buys all from boreal, shipping once.

    Line by line cedar is cheapest (its shipping is lowest); for five lines
    boreal's lower unit prices win once its shipping is paid only once.
    """
    quoteflow, lab = await start(aiohttp_server, aiohttp_client, tmp_path)
    answer = await post_cart(quoteflow, HOT)
    for line in answer["lines"]:
        assert line["failures"] == []
        assert line["best"]["supplier"] == "cedar"
    stats = await (await lab.get("/stats")).json()
    assert stats["batch_sizes"] == {name: {"2": 2, "1": 1} for name in ("atlas", "boreal", "cedar")}
    assert set(stats["batch_sizes_per_id"]) == {"lab-cart"}
    basket = answer["basket"]
    assert {pick["supplier"] for pick in basket["picks"]} == {"boreal"}
    assert basket["shipping"] == [{"supplier": "boreal", "shipping_cents": 250}]
    units = sum(990 + 10 * n for n in range(1, 6))
    assert basket["total_cents"] == units + 250
    assert basket["per_line_total_cents"] == sum(1010 + 10 * n + 200 for n in range(1, 6))
    assert basket["total_cents"] < basket["per_line_total_cents"]


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("batch_malformed_entry", "invalid_data"),
        ("batch_missing_entry", "invalid_data"),
        ("batch_wrong_mpn", "invalid_data"),
        ("batch_shuffled", None),
    ],
)
async def test_a_bad_entry_in_a_lab_batch_fails_its_line_alone(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    kind: str,
    code: str | None,
) -> None:
    """The lab spoils the last part of atlas's one call: that line alone; shuffled loses nothing."""
    quoteflow, lab = await start(aiohttp_server, aiohttp_client, tmp_path, max_items=5)
    response = await lab.post("/faults/atlas", json={"kind": kind})
    assert response.status in (200, 201, 204), await response.text()
    answer = await post_cart(quoteflow, HOT[:3])
    for line in answer["lines"]:
        failures = line["failures"]
        if line["sku"] == HOT[2] and code is not None:
            assert failures == [{"supplier": "atlas", "code": code}]
        else:
            assert failures == []
            assert len(line["quotes"]) == 3


async def test_a_flaky_batch_call_is_retried_once_per_chunk_with_the_carts_id(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """``flaky``: each of boreal's chunks gets its own first 503, then its quotes."""
    quoteflow, lab = await start(aiohttp_server, aiohttp_client, tmp_path)
    answer = await post_cart(quoteflow, HOT[:4], scenario="flaky")
    assert all(line["failures"] == [] for line in answer["lines"])
    stats = await (await lab.get("/stats")).json()
    # Two chunks, each answered 503 once then 200: four boreal calls, two of each size.
    assert stats["batch_sizes_per_id"]["lab-cart"]["boreal"] == [2, 2, 2, 2]
    assert stats["batch_sizes_per_id"]["lab-cart"]["atlas"] == [2, 2]
