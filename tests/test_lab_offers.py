"""The lab's offers as distributors quote passives: the reel-packed ``RES-0402-*`` range and
``CAP-BULK-1`` (``provider_lab.catalogue.PRICE_LISTS``) on the classic endpoint and in the
batch dialect, the batch adapter's price-list offers, and QuoteFlow buying from them.

Real sockets: the lab from its factory behind pytest-aiohttp's server.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.adapters import batch_dialect
from provider_lab.app import create_app
from provider_lab.catalogue import PRICE_LISTS, SUPPLIERS, PriceList
from provider_lab.fx import FEED_PATH
from provider_lab.state import LabConfig
from quoteflow.app import create_app as create_quoteflow
from quoteflow.config import Settings
from quoteflow.options import load_catalogue
from tests.catalogue_fakes import write_catalogue
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT

LabClient = TestClient[web.Request, web.Application]

RES_1K_ATLAS = (
    b'{"supplier": "atlas", "sku": "RES-0402-1K", "currency": "USD", "breaks": ['
    b'{"quantity": 1, "unit_price": "0.0100"}, {"quantity": 100, "unit_price": "0.0060"}, '
    b'{"quantity": 1000, "unit_price": "0.0034"}], "shipping": "4.00", "stock": 50000, '
    b'"moq": 10, "multiple": 10}'
)
BOREAL_KB_001 = (
    b'{"supplier": "boreal", "sku": "KB-001", "unit_cents": 1100, "shipping_cents": 250, '
    b'"stock": 50}'
)


@pytest.fixture
async def lab(aiohttp_client: AiohttpClient) -> LabClient:
    """A lab with the default config."""
    return await aiohttp_client(create_app(LabConfig(seed=1)))


async def ask(lab: LabClient, supplier: str, sku: str) -> tuple[int, bytes]:
    """``GET /quotes/{supplier}?sku=``: status and raw body."""
    async with lab.get(f"/quotes/{supplier}", params={"sku": sku}) as response:
        return response.status, await response.read()


def protocol_offer(supplier: str, sku: str, listed: PriceList) -> dict[str, Any]:
    """What the classic endpoint answers for a price list, written out from its fields."""
    offer: dict[str, Any] = {"supplier": supplier, "sku": sku, "currency": listed.currency}
    if listed.single:
        offer["unit_price"] = listed.breaks[0][1]
    else:
        offer["breaks"] = [{"quantity": q, "unit_price": p} for q, p in listed.breaks]
    if isinstance(listed.shipping, int):
        offer["shipping_cents"] = listed.shipping
    else:
        offer["shipping"] = listed.shipping
    return {**offer, "stock": listed.stock, "moq": listed.moq, "multiple": listed.multiple}


# -- the range, as the catalogue has it ------------------------------------------------------


def test_the_range_is_what_the_lessons_need() -> None:
    """Sub-cent reels in USD and EUR, moq and multiple 10, a reel of 5000, the 90/100 break."""
    assert {sku for sku in PRICE_LISTS if sku.startswith("RES-0402-")} == {
        "RES-0402-1K",
        "RES-0402-4K7",
        "RES-0402-10K",
        "RES-0402-100K",
    }
    atlas = PRICE_LISTS["RES-0402-1K"]["atlas"]
    assert (atlas.currency, atlas.moq, atlas.multiple) == ("USD", 10, 10)
    assert atlas.breaks == ((1, "0.0100"), (100, "0.0060"), (1000, "0.0034"))
    boreal = PRICE_LISTS["RES-0402-1K"]["boreal"]
    assert (boreal.currency, boreal.moq, boreal.multiple) == ("EUR", 5000, 5000)
    bulk = PRICE_LISTS["CAP-BULK-1"]["atlas"]
    assert bulk.breaks == ((1, "5.00"), (100, "4.00"))  # 90 cost 450.00, 100 cost 400.00
    for offers in PRICE_LISTS.values():
        assert set(offers) <= set(SUPPLIERS)
        for listed in offers.values():
            quantities = [quantity for quantity, _ in listed.breaks]
            assert quantities == sorted(set(quantities))
            assert quantities[0] >= 1
            assert listed.stock >= listed.moq


# -- the classic endpoint --------------------------------------------------------------------


async def test_the_classic_endpoint_answers_the_offer_fields_byte_for_byte(
    lab: LabClient,
) -> None:
    """atlas ``RES-0402-1K``: currency, breaks, shipping, stock, moq and multiple, exactly."""
    assert await ask(lab, "atlas", "RES-0402-1K") == (200, RES_1K_ATLAS)


async def test_every_price_list_is_answered_as_the_table_has_it(lab: LabClient) -> None:
    """Each SKU and supplier of the range; a supplier not selling it answers 404."""
    for sku, offers in PRICE_LISTS.items():
        for supplier in SUPPLIERS:
            status, body = await ask(lab, supplier, sku)
            listed = offers.get(supplier)
            if listed is None:
                assert status == 404
                assert json.loads(body)["error"] == "unknown_sku"
                continue
            assert status == 200
            assert json.loads(body) == protocol_offer(supplier, sku, listed)


async def test_the_single_price_and_shipping_in_cents_forms(lab: LabClient) -> None:
    """cedar's ``CAP-BULK-1``: ``unit_price`` alone and ``shipping_cents``; boreal's 100K
    reel: one EUR price with moq and multiple 100."""
    assert json.loads((await ask(lab, "cedar", "CAP-BULK-1"))[1]) == {
        "supplier": "cedar",
        "sku": "CAP-BULK-1",
        "currency": "USD",
        "unit_price": "4.60",
        "shipping_cents": 300,
        "stock": 1000,
        "moq": 1,
        "multiple": 1,
    }
    boreal = json.loads((await ask(lab, "boreal", "RES-0402-100K"))[1])
    assert (boreal["currency"], boreal["unit_price"], boreal["moq"]) == ("EUR", "0.0041", 100)


async def test_existing_skus_answer_as_before(lab: LabClient) -> None:
    """Every SKU the lab sold before answers byte for byte as it did: the five keys."""
    assert await ask(lab, "boreal", "KB-001") == (200, BOREAL_KB_001)
    status, body = await ask(lab, "atlas", "HOT-01")
    assert (status, list(json.loads(body))) == (
        200,
        ["supplier", "sku", "unit_cents", "shipping_cents", "stock"],
    )


async def test_the_range_is_not_sold_to_derived_suppliers_nor_in_the_other_dialects(
    aiohttp_client: AiohttpClient,
) -> None:
    """Suppliers outside the table, and the json and path dialects, answer 404 for it."""
    lab = await aiohttp_client(create_app(LabConfig(suppliers=("north", "atlas"))))
    assert (await ask(lab, "north", "RES-0402-1K"))[0] == 404
    async with lab.post(
        "/oauth2/token",
        data={"grant_type": "client_credentials"},
        auth=None,
        headers={"Authorization": "Basic cXVvdGVmbG93OmxhYi1zZWNyZXQ="},
    ) as got:
        token = (await got.json())["access_token"]
    order = {"items": [{"partNumber": "RES-0402-1K", "quantity": 7}]}
    headers = {"Authorization": f"Bearer {token}"}
    async with lab.post("/json/atlas/quote", json=order, headers=headers) as response:
        assert response.status == 404
    async with lab.get("/path/atlas/parts/RES-0402-1K/price?qty=7&key=lab-key") as response:
        assert response.status == 404


@pytest.mark.parametrize(
    ("fault", "spoiled"),
    [
        ({"kind": "wrong_types", "field": "stock"}, ("stock", "50000")),
        ({"kind": "negative", "field": "unit_cents"}, ("unit_cents", -1)),
        ({"kind": "missing_key", "field": "stock"}, ("stock", ...)),
        ({"kind": "extra_key"}, ("warehouse", "FRA-2")),
    ],
)
async def test_a_field_fault_spoils_a_price_list_too(
    lab: LabClient, fault: dict[str, Any], spoiled: tuple[str, Any]
) -> None:
    """A fault that changes a field sends the classic five keys nearest the offer, changed:
    never a valid quote (the unit price is the first break's rounded up to a cent)."""
    async with lab.put("/faults/atlas", json=fault) as response:
        assert response.status == 200
    body = json.loads((await ask(lab, "atlas", "RES-0402-1K"))[1])
    key, value = spoiled
    if value is ...:
        assert key not in body
    else:
        assert body[key] == value
    assert body["sku"] == "RES-0402-1K"


async def test_faults_that_send_the_good_body_send_the_price_list(lab: LabClient) -> None:
    """``truncated`` cuts the price list itself; ``wrong_content_type`` labels it text."""
    async with lab.put("/faults/atlas", json={"kind": "wrong_content_type", "count": 1}):
        pass
    async with lab.get("/quotes/atlas", params={"sku": "RES-0402-1K"}) as response:
        assert response.content_type == "text/plain"
        assert await response.read() == RES_1K_ATLAS


# -- the batch dialect -----------------------------------------------------------------------


async def batch(lab: LabClient, supplier: str, parts: list[tuple[str, int]]) -> dict[str, Any]:
    body = {"parts": [{"mpn": mpn, "qty": qty} for mpn, qty in parts]}
    async with lab.post(f"/batch/{supplier}/match", json=body) as response:
        assert response.status == 200
        answer: dict[str, Any] = json.loads(await response.read())
        return answer


def lines(supplier: str, parts: list[tuple[str, int]]) -> list[SimpleNamespace]:
    return [SimpleNamespace(supplier=supplier, sku=mpn, quantity=qty) for mpn, qty in parts]


async def test_the_batch_dialect_offers_price_lists_beside_classic_offers(lab: LabClient) -> None:
    """A reel line's offer is its price list (not priced for the quantity); a classic line's
    is exactly as before; the adapter maps both to the protocol."""
    parts = [("RES-0402-1K", 7), ("KB-001", 10), ("CAP-BULK-1", 90), ("RES-0402-10K", 7)]
    answer = await batch(lab, "atlas", parts)
    assert answer["results"][0] == {
        "mpn": "RES-0402-1K",
        "qty": 7,
        "offer": {
            "currency": "USD",
            "moq": 10,
            "multiple": 10,
            "breaks": [
                {"quantity": 1, "unitPrice": "0.0100"},
                {"quantity": 100, "unitPrice": "0.0060"},
                {"quantity": 1000, "unitPrice": "0.0034"},
            ],
            "shipping": "4.00",
            "stock": 50000,
        },
    }
    assert answer["results"][1]["offer"] == {"unitCents": 1080, "shippingCents": 300, "stock": 20}
    read = batch_dialect(answer, lines("atlas", parts))
    assert read["KB-001"] == {
        "supplier": "atlas",
        "sku": "KB-001",
        "unit_cents": 1080,
        "shipping_cents": 300,
        "stock": 20,
    }
    assert read["RES-0402-1K"] == {
        "supplier": "atlas",
        "sku": "RES-0402-1K",
        "currency": "USD",
        "breaks": [
            {"quantity": 1, "unit_price": "0.0100"},
            {"quantity": 100, "unit_price": "0.0060"},
            {"quantity": 1000, "unit_price": "0.0034"},
        ],
        "shipping": "4.00",
        "stock": 50000,
        "moq": 10,
        "multiple": 10,
    }
    bulk: Any = read["CAP-BULK-1"]
    assert bulk["breaks"] == [
        {"quantity": 1, "unit_price": "5.00"},
        {"quantity": 100, "unit_price": "4.00"},
    ]


async def test_every_batch_price_list_reads_as_the_classic_endpoint_answers(
    lab: LabClient,
) -> None:
    """For each supplier, the whole range in one call, read by the adapter: the same offer
    as ``/quotes/{supplier}`` (a single price as one break from 1)."""
    for supplier in SUPPLIERS:
        parts = [(sku, 7) for sku in PRICE_LISTS if supplier in PRICE_LISTS[sku]]
        read = batch_dialect(await batch(lab, supplier, parts), lines(supplier, parts))
        for sku, _ in parts:
            expected = json.loads((await ask(lab, supplier, sku))[1])
            if "unit_price" in expected:
                expected["breaks"] = [{"quantity": 1, "unit_price": expected.pop("unit_price")}]
            assert read[sku] == expected, sku


async def test_a_spoiled_batch_price_list_is_left_out(lab: LabClient) -> None:
    """``batch_malformed_entry`` on a reel line: the adapter leaves that line out alone."""
    async with lab.put("/faults/atlas", json={"kind": "batch_malformed_entry", "count": 1}):
        pass
    parts = [("KB-001", 1), ("RES-0402-1K", 7)]
    read = batch_dialect(await batch(lab, "atlas", parts), lines("atlas", parts))
    assert set(read) == {"KB-001"}


# -- the batch adapter's price-list offers ---------------------------------------------------

LISTED: dict[str, Any] = {
    "results": [
        {
            "mpn": "RES-0402-1K",
            "qty": 7,
            "offer": {
                "currency": "EUR",
                "moq": 10,
                "multiple": 5,
                "breaks": [
                    {"quantity": 100, "unitPrice": "0.0060"},
                    {"quantity": 1, "unitPrice": "0.0100"},
                ],
                "shipping": "4.00",
                "stock": 50000,
            },
        }
    ]
}
LINE = lines("atlas", [("RES-0402-1K", 7)])


def with_offer(**changes: Any) -> dict[str, Any]:
    """:data:`LISTED` with its offer's keys changed (``...``: removed)."""
    payload = copy.deepcopy(LISTED)
    offer = payload["results"][0]["offer"]
    for key, value in changes.items():
        if value is ...:
            del offer[key]
        else:
            offer[key] = value
    return payload


def test_the_batch_adapter_sorts_breaks_and_passes_the_fields_through() -> None:
    """Breaks by quantity, ``unitPrice`` → ``unit_price``; currency, moq, multiple as given."""
    assert batch_dialect(LISTED, LINE)["RES-0402-1K"] == {
        "supplier": "atlas",
        "sku": "RES-0402-1K",
        "currency": "EUR",
        "breaks": [
            {"quantity": 1, "unit_price": "0.0100"},
            {"quantity": 100, "unit_price": "0.0060"},
        ],
        "shipping": "4.00",
        "stock": 50000,
        "moq": 10,
        "multiple": 5,
    }


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"currency": ..., "moq": ..., "multiple": ...},
            {"breaks": [{"quantity": 1, "unit_price": "0.0100"}], "shipping": "4.00"},
        ),
        (
            {"breaks": ..., "unitCents": 1, "shipping": ..., "shippingCents": 400},
            {"unit_cents": 1, "shipping_cents": 400},
        ),
    ],
)
def test_the_batch_adapter_takes_each_optional_form(
    changes: dict[str, Any], expected: dict[str, Any]
) -> None:
    """No currency, moq or multiple: none passed; ``unitCents`` and ``shippingCents`` with
    a price-list key beside them: the protocol's integer forms."""
    payload = with_offer(**changes)
    if "breaks" not in changes:
        payload["results"][0]["offer"]["breaks"] = [{"quantity": 1, "unitPrice": "0.0100"}]
    read: Any = batch_dialect(payload, LINE)["RES-0402-1K"]
    for key, value in expected.items():
        assert read[key] == value
    for key in ("currency", "moq", "multiple"):
        assert (key in read) == (key not in changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"currency": "eur"},
        {"currency": "EURO"},
        {"currency": 978},
        {"moq": 0},
        {"moq": 10**9 + 1},
        {"multiple": "5"},
        {"multiple": True},
        {"breaks": []},
        {"breaks": [{"quantity": 1, "unitPrice": 0.01}]},
        {"breaks": [{"quantity": 1, "unitPrice": "0.0000001"}]},
        {"breaks": [{"quantity": 0, "unitPrice": "0.01"}]},
        {"breaks": [{"quantity": 1, "unitPrice": "0.01"}, {"quantity": 1, "unitPrice": "0.02"}]},
        {"breaks": [{"quantity": 1, "unitPrice": "0.01", "currency": "EUR"}]},
        {"breaks": [{"quantity": 1}]},
        {"unitCents": 1},
        {"breaks": ..., "unitPrice": "0.01"},
        {"breaks": ...},
        {"shippingCents": 400},
        {"shipping": ...},
        {"shipping": 4.0},
        {"shipping": "-4.00"},
        {"stock": ...},
        {"stock": -1},
        {"warehouse": "FRA-2"},
    ],
)
def test_the_batch_adapter_leaves_out_a_price_list_it_cannot_read(changes: dict[str, Any]) -> None:
    """Each flaw drops that line alone (QuoteFlow: its ``invalid_data``)."""
    assert batch_dialect(with_offer(**changes), LINE) == {}


# -- through QuoteFlow ---------------------------------------------------------------------


async def quoteflow_on_the_lab(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> TestClient[Any, Any]:
    """QuoteFlow asking atlas, boreal and cedar the classic way, with the lab's rates."""
    lab_server = await aiohttp_server(create_app(LabConfig()))
    lab_url = str(lab_server.make_url("")).rstrip("/")
    entries = [{"name": name, "url": f"{lab_url}/quotes/{name}"} for name in SUPPLIERS]
    path = write_catalogue(tmp_path / "suppliers.toml", entries)
    settings = Settings(
        budget=4 * TEST_BUDGET,
        connect_timeout=TEST_CONNECT_TIMEOUT,
        suppliers_file=path,
        fx_rates=lab_url + FEED_PATH,
    )
    catalogue = load_catalogue(settings, {})
    client: TestClient[Any, Any] = await aiohttp_client(
        create_quoteflow(settings, catalogue=catalogue, environ={})
    )
    return client


async def quoted(client: TestClient[Any, Any], sku: str, quantity: int) -> dict[str, Any]:
    response = await client.post("/api/quotes", json={"sku": sku, "quantity": quantity})
    assert response.status == 200
    answer: dict[str, Any] = await response.json()
    return answer


async def test_quoteflow_buys_legal_quantities_from_the_range(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    """A need of 7 bought as 10 (atlas: moq and multiple 10; cedar: 10 at the 10+ break is
    cheaper than 7), boreal's EUR reel of 5000 converted at 1.0850; 90 bought as 100."""
    client = await quoteflow_on_the_lab(aiohttp_server, aiohttp_client, tmp_path)
    answer = await quoted(client, "RES-0402-1K", 7)
    quotes = {quote["supplier"]: quote for quote in answer["quotes"]}
    # atlas: 10 x 0.0100 = 0.10 USD, + 4.00 shipping.
    assert (quotes["atlas"]["buy_quantity"], quotes["atlas"]["total_cents"]) == (10, 410)
    # cedar: 7 x 0.0200 = 0.14, but 10 x 0.0120 = 0.12; + 2.50.
    assert (quotes["cedar"]["buy_quantity"], quotes["cedar"]["total_cents"]) == (10, 262)
    # boreal: 5000 x 0.0021 = 10.50 EUR -> 11.3925 USD -> 11.39; 6.50 EUR -> 7.0525 -> 7.05.
    assert (quotes["boreal"]["buy_quantity"], quotes["boreal"]["total_cents"]) == (5000, 1844)
    assert quotes["boreal"]["offer"]["currency"] == "EUR"
    assert answer["best"]["supplier"] == "cedar"

    answer = await quoted(client, "CAP-BULK-1", 90)
    quotes = {quote["supplier"]: quote for quote in answer["quotes"]}
    # atlas: 90 x 5.00 = 450.00, but 100 x 4.00 = 400.00 (free shipping).
    assert (quotes["atlas"]["buy_quantity"], quotes["atlas"]["total_cents"]) == (100, 40000)
    # cedar: 90 x 4.60 = 414.00, + 3.00.
    assert quotes["cedar"]["total_cents"] == 41700
    assert "boreal" not in quotes
    assert answer["best"]["supplier"] == "atlas"
