"""The catalogue, the wire format and the five lesson scenarios."""

from __future__ import annotations

import asyncio
import json

import pytest

from provider_lab.catalogue import CATALOGUE, SUPPLIERS
from tests.lab.conftest import SLOW_MS, LabClient, StartLab, ask, stats

QUOTE_KEYS = ["supplier", "sku", "unit_cents", "shipping_cents", "stock"]


def total(supplier: str, quantity: int) -> int:
    """What QuoteFlow will compute for ``KB-001``."""
    offer = CATALOGUE["KB-001"][supplier]
    return offer.unit_cents * quantity + offer.shipping_cents


def test_kb001_is_shaped_for_the_lesson() -> None:
    """At quantity 2 boreal is cheapest and cedar is out; at quantity 1 cedar is cheapest."""
    in_stock_2 = [s for s in SUPPLIERS if CATALOGUE["KB-001"][s].stock >= 2]
    assert min(in_stock_2, key=lambda s: total(s, 2)) == "boreal"
    assert total("boreal", 2) == 2450
    assert "cedar" not in in_stock_2
    assert min(SUPPLIERS, key=lambda s: total(s, 1)) == "cedar"
    assert total("cedar", 1) == 1100


@pytest.mark.parametrize("supplier", SUPPLIERS)
async def test_normal_answer_is_exactly_the_wire_quote(lab: LabClient, supplier: str) -> None:
    """A normal answer is 200 JSON with exactly the five keys, integers as integers."""
    async with lab.get(f"/quotes/{supplier}", params={"sku": "KB-001"}) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        body = json.loads(await response.read())
    offer = CATALOGUE["KB-001"][supplier]
    assert list(body) == QUOTE_KEYS
    assert body == {
        "supplier": supplier,
        "sku": "KB-001",
        "unit_cents": offer.unit_cents,
        "shipping_cents": offer.shipping_cents,
        "stock": offer.stock,
    }
    assert all(type(body[k]) is int for k in QUOTE_KEYS[2:])


async def test_every_catalogue_entry_is_served(lab: LabClient) -> None:
    """Every SKU and supplier in the catalogue answers its own numbers."""
    for sku, offers in CATALOGUE.items():
        for supplier in SUPPLIERS:
            status, body = await ask(lab, supplier, sku)
            if supplier in offers:
                assert status == 200
                assert json.loads(body)["unit_cents"] == offers[supplier].unit_cents
            else:
                assert status == 404


async def test_unknown_supplier_is_404_json(lab: LabClient) -> None:
    """An unknown supplier answers 404 with a JSON error and is not counted."""
    status, body = await ask(lab, "zephyr")
    assert status == 404
    assert json.loads(body)["error"] == "unknown_supplier"
    assert (await stats(lab))["total"] == 0


@pytest.mark.parametrize("sku", ["KB-999", "A&scenario=broken", "../x", "kb-001", " KB-001"])
async def test_sku_is_taken_literally(lab: LabClient, sku: str) -> None:
    """Any SKU string is looked up as it arrives; unknown ones answer 404 echoing it."""
    status, body = await ask(lab, "boreal", sku)
    assert status == 404
    assert json.loads(body) == {"error": "unknown_sku", "supplier": "boreal", "sku": sku}


async def test_encoded_scenario_inside_sku_does_not_switch_scenario(lab: LabClient) -> None:
    """A SKU containing ``&scenario=broken`` stays a SKU: no 503, and the 404 echoes it."""
    async with lab.get("/quotes/boreal?sku=A%26scenario%3Dbroken") as response:
        assert response.status == 404
        assert (await response.json())["sku"] == "A&scenario=broken"


async def test_missing_sku_is_400(lab: LabClient) -> None:
    """A supplier request without ``sku`` is a 400."""
    async with lab.get("/quotes/atlas") as response:
        assert response.status == 400
        assert (await response.json())["error"] == "missing_sku"


async def test_unknown_scenario_is_400(lab: LabClient) -> None:
    """An unknown scenario answers 400 listing the allowed ones."""
    status, body = await ask(lab, "atlas", scenario="chaotic")
    assert status == 400
    assert json.loads(body)["allowed"] == ["normal", "slow", "broken", "malformed", "flaky"]


@pytest.mark.parametrize("scenario", ["slow", "broken", "malformed", "flaky"])
@pytest.mark.parametrize("supplier", ["atlas", "cedar"])
async def test_scenarios_leave_atlas_and_cedar_alone(
    lab: LabClient, scenario: str, supplier: str
) -> None:
    """Scenarios act on boreal only: atlas and cedar answer their normal quote."""
    status, body = await ask(lab, supplier, scenario=scenario, request_id="r1")
    assert status == 200
    assert json.loads(body)["supplier"] == supplier


async def test_slow_boreal_answers_after_the_slow_delay(lab: LabClient) -> None:
    """``slow``: boreal's valid quote arrives only after the configured delay."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, body = await ask(lab, "boreal", scenario="slow")
    assert status == 200
    assert json.loads(body)["unit_cents"] == 1100
    assert loop.time() - started >= SLOW_MS / 1000 * 0.95


async def test_slow_stops_at_the_callers_deadline(lab: LabClient) -> None:
    """``slow`` with ``X-Deadline-Remaining-Ms: 50`` gives up with a 504 after a 50 ms grace."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, body = await ask(lab, "boreal", scenario="slow", **{"X-Deadline-Remaining-Ms": "50"})
    elapsed = loop.time() - started
    assert status == 504
    assert json.loads(body)["error"] == "deadline_passed"
    assert 0.095 <= elapsed < SLOW_MS / 1000
    assert (await stats(lab))["deadline_expired"] == 1


async def test_broken_boreal_is_always_503(lab: LabClient) -> None:
    """``broken``: boreal answers 503 every time, whatever the request id."""
    for request_id in ("a", "a", "b", None):
        status, _ = await ask(lab, "boreal", scenario="broken", request_id=request_id)
        assert status == 503


async def test_malformed_boreal_sends_unit_cents_as_a_string(lab: LabClient) -> None:
    """``malformed``: boreal's ``unit_cents`` is the string ``"1100"``."""
    status, body = await ask(lab, "boreal", scenario="malformed")
    assert status == 200
    assert json.loads(body)["unit_cents"] == "1100"


async def test_flaky_boreal_fails_once_per_request_id(lab: LabClient) -> None:
    """``flaky``: 503 the first time an X-Request-ID is seen, 200 for it afterwards."""
    assert (await ask(lab, "boreal", scenario="flaky", request_id="id-1"))[0] == 503
    assert (await ask(lab, "boreal", scenario="flaky", request_id="id-1"))[0] == 200
    assert (await ask(lab, "boreal", scenario="flaky", request_id="id-1"))[0] == 200
    assert (await ask(lab, "boreal", scenario="flaky", request_id="id-2"))[0] == 503


async def test_flaky_without_request_id_never_recovers(lab: LabClient) -> None:
    """``flaky`` without X-Request-ID treats every request as a first sight: always 503."""
    for _ in range(3):
        assert (await ask(lab, "boreal", scenario="flaky"))[0] == 503


async def test_flaky_memory_is_bounded(start_lab: StartLab) -> None:
    """The flaky memory keeps only the most recent ids: an evicted id fails again."""
    lab = await start_lab(flaky_id_limit=2)
    for request_id in ("a", "b", "c"):
        assert (await ask(lab, "boreal", scenario="flaky", request_id=request_id))[0] == 503
    assert (await ask(lab, "boreal", scenario="flaky", request_id="c"))[0] == 200
    assert (await ask(lab, "boreal", scenario="flaky", request_id="a"))[0] == 503


@pytest.mark.parametrize("supplier", SUPPLIERS)
async def test_every_supplier_sells_the_fifty_hot_skus(lab: LabClient, supplier: str) -> None:
    """HOT-01 … HOT-50, for the benchmark's hot section: a quote from everyone, HOT-51 none."""
    for sku in ("HOT-01", "HOT-50"):
        status, body = await ask(lab, supplier, sku)
        assert status == 200
        assert json.loads(body)["sku"] == sku
    assert (await ask(lab, supplier, "HOT-51"))[0] == 404
