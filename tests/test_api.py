"""The inbound API: validation answers, result shape, ranking and the stock filter."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, quote, status
from tests.test_decision_table import ask


async def test_health(start_quoteflow: StartQuoteFlow) -> None:
    """GET /health answers ok."""
    response = await (await start_quoteflow()).get("/health")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_result_has_the_contract_shape(start_quoteflow: StartQuoteFlow) -> None:
    """Every key of the contract's result, best equal to the first quote."""
    result = await ask(await start_quoteflow())
    assert set(result) == {
        "sku",
        "quantity",
        "currency",
        "quotes",
        "failures",
        "best",
        "elapsed_ms",
        "request_id",
    }
    assert (result["sku"], result["quantity"], result["currency"]) == ("KB-001", 2, "USD")
    assert result["best"] == result["quotes"][0]
    assert result["best"] == {
        "supplier": "boreal",
        "sku": "KB-001",
        "unit_cents": 1100,
        "shipping_cents": 250,
        "stock": 50,
        "total_cents": 2450,
    }
    assert re.fullmatch(r"[0-9a-f]{32}", result["request_id"])
    assert isinstance(result["elapsed_ms"], float)


async def test_defaults_apply_to_an_empty_object(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """{} asks for KB-001, quantity 2, scenario normal."""
    response = await (await start_quoteflow()).post("/api/quotes", json={})
    result = await response.json()
    assert (result["sku"], result["quantity"]) == ("KB-001", 2)
    assert suppliers.of("atlas")[0].query == {"sku": "KB-001", "scenario": "normal"}


async def test_stock_filter_is_not_a_failure(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Cedar (stock 1) is cheapest at quantity 1 and silently left out at 2, never retried."""
    client = await start_quoteflow()
    one = await ask(client, quantity=1)
    assert one["best"]["supplier"] == "cedar"
    assert one["best"]["total_cents"] == 1100
    two = await ask(client, quantity=2)
    assert [q["supplier"] for q in two["quotes"]] == ["boreal", "atlas"]
    assert two["failures"] == []
    assert suppliers.count("cedar") == 2


async def test_ties_are_broken_by_supplier_name(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Equal totals are ordered by supplier name."""
    for supplier in ("cedar", "boreal", "atlas"):
        suppliers.always(supplier, quote(unit_cents=500, shipping_cents=100, stock=9))
    result = await ask(await start_quoteflow())
    assert [q["supplier"] for q in result["quotes"]] == ["atlas", "boreal", "cedar"]


async def test_failures_are_listed_in_supplier_order(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Failures come in the order atlas, boreal, cedar, each with its own code."""
    suppliers.always("cedar", status(404))
    suppliers.always("boreal", status(503))
    suppliers.always("atlas", status(500))
    result = await ask(await start_quoteflow())
    assert result["failures"] == [
        {"supplier": "atlas", "code": "http_500"},
        {"supplier": "boreal", "code": "http_503"},
        {"supplier": "cedar", "code": "http_404"},
    ]
    assert result["best"] is None


@pytest.mark.parametrize("sku", ["A&scenario=broken", "../x", "a b/c?d=e#f", "KB-001%2F"])
async def test_sku_reaches_the_supplier_unchanged(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, sku: str
) -> None:
    """A SKU that looks like a query or a path is sent URL-encoded, as the SKU."""
    result = await ask(await start_quoteflow(), sku=sku)
    assert result["sku"] == sku
    assert [q["sku"] for q in result["quotes"]] == [sku, sku]
    for received in suppliers.received:
        assert received.query == {"sku": sku, "scenario": "normal"}


@pytest.mark.parametrize("scenario", ["normal", "slow", "broken", "malformed", "flaky"])
async def test_scenario_is_forwarded(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, scenario: str
) -> None:
    """The scenario reaches every supplier as a query parameter."""
    await ask(await start_quoteflow(), scenario=scenario)
    assert {r.query["scenario"] for r in suppliers.received} == {scenario}


INVALID_REQUESTS: dict[str, tuple[Any, list[dict[str, Any]]]] = {
    "quantity true": ({"quantity": True}, [{"loc": ["quantity"]}]),
    "quantity 2.0": ({"quantity": 2.0}, [{"loc": ["quantity"]}]),
    "quantity '2'": ({"quantity": "2"}, [{"loc": ["quantity"]}]),
    "quantity 0": ({"quantity": 0}, [{"loc": ["quantity"]}]),
    "quantity 101": ({"quantity": 101}, [{"loc": ["quantity"]}]),
    "quantity null": ({"quantity": None}, [{"loc": ["quantity"]}]),
    "empty sku": ({"sku": ""}, [{"loc": ["sku"]}]),
    "sku of 65": ({"sku": "x" * 65}, [{"loc": ["sku"]}]),
    "sku not a string": ({"sku": 7}, [{"loc": ["sku"]}]),
    "unknown scenario": ({"scenario": "chaos"}, [{"loc": ["scenario"]}]),
    "unknown key": ({"url": "http://evil"}, [{"loc": ["url"]}]),
    "every field wrong": (
        {"sku": "", "quantity": "2", "scenario": 1, "supplier": "atlas"},
        [{"loc": ["sku"]}, {"loc": ["quantity"]}, {"loc": ["scenario"]}, {"loc": ["supplier"]}],
    ),
    "array": ([1, 2], [{"loc": []}]),
    "string": ("KB-001", [{"loc": []}]),
    "null": (None, [{"loc": []}]),
}


@pytest.mark.parametrize(
    ("body", "expected"), INVALID_REQUESTS.values(), ids=INVALID_REQUESTS.keys()
)
async def test_invalid_request_is_422_with_every_field_error(
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
    body: Any,
    expected: list[dict[str, Any]],
) -> None:
    """JSON that is not a valid request is 422 listing every bad field; no supplier is asked."""
    data = json.dumps(body).encode()
    response = await (await start_quoteflow()).post("/api/quotes", data=data)
    assert response.status == 422
    answer = await response.json()
    assert answer["error"] == "invalid_request"
    assert [{"loc": d["loc"]} for d in answer["detail"]] == expected
    assert all(isinstance(d["msg"], str) and d["msg"] for d in answer["detail"])
    assert suppliers.received == []


@pytest.mark.parametrize(
    "body", [b"", b"{", b"not json", b"{'sku': 1}", b'{"quantity": NaN}', b"\xff\xfe\x00"]
)
async def test_body_that_is_not_json_is_400(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, body: bytes
) -> None:
    """A body that is not JSON is 400 invalid_json."""
    response = await (await start_quoteflow()).post("/api/quotes", data=body)
    assert response.status == 400
    assert (await response.json())["error"] == "invalid_json"
    assert suppliers.received == []


async def test_oversized_body_is_413(start_quoteflow: StartQuoteFlow) -> None:
    """A body over the 16 KiB cap is 413 with a JSON error."""
    body = b'{"sku": "' + b"x" * 20_000 + b'"}'
    response = await (await start_quoteflow()).post("/api/quotes", data=body)
    assert response.status == 413
    assert (await response.json())["error"] == "request_too_large"


async def test_unknown_path_and_method_are_json(start_quoteflow: StartQuoteFlow) -> None:
    """404 and 405 answers are JSON too; 405 keeps its Allow header."""
    client = await start_quoteflow()
    missing = await client.get("/nope")
    assert missing.status == 404
    assert (await missing.json())["error"] == "not_found"
    wrong = await client.get("/api/quotes")
    assert wrong.status == 405
    assert (await wrong.json())["error"] == "method_not_allowed"
    assert "POST" in wrong.headers["Allow"]
