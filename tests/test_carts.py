"""Carts: a bill of materials in one request, against fake suppliers on real sockets.

Each supplier here takes one SKU per call (the classic protocol), so a cart's
line is asked of it as a single quote is; batch suppliers are
``test_batch_suppliers.py``'s. What the suppliers received is counted on their
side.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from quoteflow.callers import load_callers
from quoteflow.handlers import cart_body_cap
from tests import fakes
from tests.callers_files import bearer, write_callers
from tests.conftest import LOADED_MARGIN, StartQuoteFlow
from tests.fakes import FakeSuppliers

Client = TestClient[Any, Any]

CART_BUDGET = 1.0


def cart(*skus: str, quantity: int = 1, **extra: Any) -> dict[str, Any]:
    return {"lines": [{"sku": sku, "quantity": quantity} for sku in skus], **extra}


async def post_cart(client: Client, body: object, query: str = "") -> tuple[int, dict[str, Any]]:
    response = await client.post(f"/api/carts{query}", json=body)
    return response.status, await response.json()


# -- what a caller may send ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        ({}, [(["lines"], "required field missing")]),
        ({"lines": {}}, [(["lines"], "must be an array, not an object")]),
        ({"lines": []}, [(["lines"], "must have 1 to 3 lines, got 0")]),
        (cart("A", "B", "C", "D"), [(["lines"], "must have 1 to 3 lines, got 4")]),
        ({"lines": ["A"]}, [(["lines", 0], "must be an object, not a string")]),
        (
            {"lines": [{"sku": "A"}, {"quantity": 2}]},
            [
                (["lines", 0, "quantity"], "required field missing"),
                (["lines", 1, "sku"], "required field missing"),
            ],
        ),
        (
            {"lines": [{"sku": "A", "quantity": 0}, {"sku": "B", "quantity": 100_001}]},
            [
                (["lines", 0, "quantity"], "must be from 1 to 100000, got 0"),
                (["lines", 1, "quantity"], "must be from 1 to 100000, got 100001"),
            ],
        ),
        (
            {"lines": [{"sku": "A", "quantity": "3"}, {"sku": "B", "quantity": True}]},
            [
                (["lines", 0, "quantity"], "must be an integer, not a string"),
                (["lines", 1, "quantity"], "must be an integer, not a boolean"),
            ],
        ),
        (
            {"lines": [{"sku": "", "quantity": 1}, {"sku": 7, "quantity": 1.5}]},
            [
                (["lines", 0, "sku"], "must be 1 to 64 characters, got 0"),
                (["lines", 1, "sku"], "must be a string, not an integer"),
                (
                    ["lines", 1, "quantity"],
                    "must be an integer, not a number with a fraction or exponent",
                ),
            ],
        ),
        (
            {"lines": [{"sku": "A", "quantity": 1, "note": "x"}], "rush": True},
            [(["rush"], "unknown field"), (["lines", 0, "note"], "unknown field")],
        ),
        (
            cart("A", "B", "A"),
            [(["lines", 2, "sku"], "repeats line 0: ask a SKU once")],
        ),
        (
            cart("A", scenario="fast"),
            [(["scenario"], "must be one of normal, slow, broken, malformed, flaky")],
        ),
        (
            {
                "lines": [
                    {"sku": "A", "quantity": 1, "alternates": ["B", "C"]},
                    {"sku": "C", "quantity": 1},
                    {"sku": "E", "quantity": 1, "alternates": ["B", "A"]},
                ]
            },
            [
                (["lines", 1, "sku"], "repeats alternate 1 of line 0: ask a SKU once"),
                (["lines", 2, "alternates", 0], "repeats alternate 0 of line 0: ask a SKU once"),
                (["lines", 2, "alternates", 1], "repeats line 0: ask a SKU once"),
            ],
        ),
        (
            {
                "lines": [
                    {"sku": "A", "quantity": 1, "alternates": ["B", "C", "D", "E", "F"]},
                    {"sku": "G", "quantity": 1, "alternates": ["G", 7, ""]},
                    {"sku": "H", "quantity": 1, "alternates": "I|J", "ref": 12},
                ]
            },
            [
                (["lines", 0, "alternates"], "must have at most 4 SKUs, got 5"),
                (
                    ["lines", 1, "alternates", 0],
                    "is the line's own SKU: list only the SKUs that may replace it",
                ),
                (["lines", 1, "alternates", 1], "must be a string, not an integer"),
                (["lines", 1, "alternates", 2], "must be 1 to 64 characters, got 0"),
                (["lines", 2, "alternates"], "must be an array of SKUs, not a string"),
                (["lines", 2, "ref"], "must be a string, not an integer"),
            ],
        ),
    ],
)
async def test_every_field_error_of_a_cart_is_named_at_its_place_and_nothing_is_asked(
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
    body: object,
    errors: list[tuple[list[object], str]],
) -> None:
    """A 422 lists every problem with its ``loc``; no supplier hears of a refused cart."""
    client = await start_quoteflow(max_cart_lines=3)
    status, answer = await post_cart(client, body)
    assert status == 422
    assert answer["error"] == "invalid_request"
    assert [(e["loc"], e["msg"]) for e in answer["detail"]] == errors
    assert suppliers.received == []


@pytest.mark.parametrize(
    ("raw", "status", "error"),
    [
        (b"{", 400, "invalid_json"),
        (b"[]", 422, "invalid_request"),
        (b'{"lines": [{"sku": "A", "quantity": 1}], "lines": []}', 400, "invalid_json"),
    ],
)
async def test_a_cart_that_is_not_a_json_object_is_refused(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, raw: bytes, status: int, error: str
) -> None:
    """Not JSON (or a duplicate key) is 400 ``invalid_json``; JSON but no object is 422."""
    client = await start_quoteflow()
    response = await client.post(
        "/api/carts", data=raw, headers={"Content-Type": "application/json"}
    )
    assert response.status == status
    assert (await response.json())["error"] == error
    assert suppliers.received == []


async def test_a_cart_over_its_byte_cap_is_413_and_the_largest_allowed_cart_fits(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """The cap is 1 KiB + 1 KiB per allowed line: room for the largest cart, and no more."""
    client = await start_quoteflow(max_cart_lines=4, budget=0.5, cart_budget=CART_BUDGET)
    longest = [{"sku": f"{n}".ljust(64, "X"), "quantity": 100_000} for n in range(4)]
    status, answer = await post_cart(client, {"lines": longest, "scenario": "normal"})
    assert status == 200, answer
    assert len(answer["lines"]) == 4
    padding = " " * cart_body_cap(4)
    response = await client.post(
        "/api/carts",
        data=b'{"lines": []}' + padding.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert response.status == 413
    assert (await response.json())["error"] == "request_too_large"
    # A single quote keeps its own, smaller cap.
    response = await client.post("/api/quotes", data=b"{}" + b" " * 20_000)
    assert response.status == 413


# -- the answer -----------------------------------------------------------------------


async def test_every_line_is_quoted_by_every_supplier_under_the_carts_request_id(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Each line answers as a single quote would; each call carries the cart's X-Request-ID."""
    client = await start_quoteflow(cart_budget=CART_BUDGET)
    response = await client.post(
        "/api/carts?explain=1",
        json=cart("KB-001", "KB-002", quantity=2),
        headers={"X-Request-ID": "cart-1"},
    )
    assert response.status == 200
    answer = await response.json()
    assert answer["request_id"] == "cart-1"
    assert [line["sku"] for line in answer["lines"]] == ["KB-001", "KB-002"]
    for line in answer["lines"]:
        # cedar has 1 in stock: a valid answer, but no quote for 2.
        assert [q["supplier"] for q in line["quotes"]] == ["boreal", "atlas"]
        assert line["failures"] == []
        assert line["best"]["supplier"] == "boreal"
        assert set(line) == {"sku", "quantity", "quotes", "failures", "best"}
    assert suppliers.count("atlas") == suppliers.count("boreal") == suppliers.count("cedar") == 2
    assert {r.request_id for r in suppliers.received} == {"cart-1"}
    basket = answer["basket"]
    # boreal's lines together: its shipping once (250), not twice.
    assert basket["picks"] == [
        {
            "sku": sku,
            "bought_sku": sku,
            "quantity": 2,
            "supplier": "boreal",
            "unit_cents": 1100,
            "line_cents": 2200,
        }
        for sku in ("KB-001", "KB-002")
    ]
    assert basket["shipping"] == [{"supplier": "boreal", "shipping_cents": 250}]
    assert basket["total_cents"] == 2 * 2200 + 250
    assert basket["per_line_total_cents"] == 2 * 2450
    assert basket["complete"] is True
    assert basket["unquoted"] == []
    assert basket["optimal"] is True
    explain = answer["explain"]
    assert explain["budget_ms"] == CART_BUDGET * 1000
    calls = explain["suppliers"]["boreal"]["calls"]
    assert sorted(call["lines"] for call in calls) == [["KB-001"], ["KB-002"]]
    assert all(call["stopped"] == "success" for call in calls)
    assert explain["lines"]["KB-001"] == {
        "atlas": "ok",
        "boreal": "ok",
        "cedar": "insufficient_stock",
    }


async def test_a_line_no_supplier_quotes_is_unquoted_and_the_basket_prices_the_rest(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Failures are per line and per supplier; the basket says it is incomplete, and why."""
    nope = fakes.status(404)
    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, _by_sku({"GONE": nope}))
    suppliers.always("cedar", _by_sku({"GONE": nope, "KB-001": fakes.status(500)}))
    client = await start_quoteflow(cart_budget=CART_BUDGET, breaker_failures=0)
    status, answer = await post_cart(client, cart("KB-001", "GONE"))
    assert status == 200
    first, gone = answer["lines"]
    assert [q["supplier"] for q in first["quotes"]] == ["boreal", "atlas"]
    assert first["failures"] == [{"supplier": "cedar", "code": "http_500"}]
    assert gone["quotes"] == []
    assert gone["best"] is None
    assert gone["failures"] == [
        {"supplier": name, "code": "http_404"} for name in ("atlas", "boreal", "cedar")
    ]
    basket = answer["basket"]
    assert basket["complete"] is False
    assert basket["unquoted"] == ["GONE"]
    assert [pick["sku"] for pick in basket["picks"]] == ["KB-001"]
    assert basket["total_cents"] == 1100 + 250


def _by_sku(responders: dict[str, fakes.Responder]) -> fakes.Responder:
    async def respond(request: Any) -> Any:
        chosen = responders.get(request.query["sku"], fakes.quote())
        return await chosen(request)

    return respond


async def test_a_cart_that_runs_out_of_budget_keeps_what_finished(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A line still asked at the cart's deadline is ``timeout`` there; the others are kept."""
    suppliers.always("boreal", _by_sku({"SLOW": fakes.hang()}))
    client = await start_quoteflow(cart_budget=0.6, breaker_failures=0)
    started = time.monotonic()
    status, answer = await post_cart(client, cart("KB-001", "SLOW"))
    elapsed = time.monotonic() - started
    assert status == 200
    assert elapsed < 0.6 + 2 * LOADED_MARGIN
    first, slow = answer["lines"]
    assert len(first["quotes"]) == 3
    assert [q["supplier"] for q in slow["quotes"]] == ["cedar", "atlas"]
    assert slow["failures"] == [{"supplier": "boreal", "code": "timeout"}]


# -- seats and slots -------------------------------------------------------------------


async def test_carts_have_seats_of_their_own_and_give_them_back(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Past ``--cart-limit``: 503 + Retry-After, nothing asked; single quotes keep theirs."""
    gate, arrived = asyncio.Event(), asyncio.Event()

    async def held(request: Any) -> Any:
        arrived.set()
        await gate.wait()
        return await fakes.quote()(request)

    suppliers.always("atlas", held)
    client = await start_quoteflow(cart_limit=1, inbound_limit=1, cart_budget=CART_BUDGET)
    first = asyncio.create_task(post_cart(client, cart("KB-001")))
    await arrived.wait()
    asked = len(suppliers.received)
    response = await client.post("/api/carts", json=cart("KB-002"))
    assert response.status == 503
    assert response.headers["Retry-After"] == "1"
    assert (await response.json()) == {"error": "capacity_exhausted"}
    assert len(suppliers.received) == asked  # the refused cart asked nothing
    suppliers.always("atlas", fakes.quote())
    single = await client.post("/api/quotes", json={"sku": "KB-003"})
    assert single.status == 200  # the cart holds no single quote's seat
    gate.set()
    status, _ = await first
    assert status == 200
    status, answer = await post_cart(client, cart("KB-002"))
    assert status == 200  # the seat came back
    assert len(answer["lines"][0]["quotes"]) == 3


async def test_a_single_quote_gets_the_next_slot_before_a_carts_waiting_calls(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """With one outbound slot, a 12-line cart's waiting calls let a single quote go first."""
    started = asyncio.Event()
    slow = fakes.delay(0.03, fakes.quote())

    async def first_calls(request: Any) -> Any:
        if len(suppliers.received) >= 3:
            started.set()
        return await slow(request)

    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, first_calls)
    client = await start_quoteflow(
        outbound_limit=1, supplier_share=1, cart_budget=3.0, budget=2.0, breaker_failures=0
    )
    skus = [f"C-{n:02d}" for n in range(12)]
    carting = asyncio.create_task(post_cart(client, cart(*skus)))
    await started.wait()
    response = await client.post(
        "/api/quotes", json={"sku": "SINGLE"}, headers={"X-Request-ID": "s"}
    )
    assert response.status == 200
    assert len((await response.json())["quotes"]) == 2  # cedar: stock 1 for 2
    status, answer = await carting
    assert status == 200
    assert all(len(line["quotes"]) == 3 for line in answer["lines"])
    order = [r.query["sku"] for r in suppliers.received]
    single = [n for n, sku in enumerate(order) if sku == "SINGLE"]
    # Its three calls went out back to back, each on the next free slot, with
    # most of the cart's 36 calls still waiting behind them.
    assert single == list(range(single[0], single[0] + 3))
    assert single[0] < 8


class ClassMeter:
    """Counted on the suppliers' side: carts' calls (SKUs ``C-``) in flight, single quotes' too."""

    def __init__(self, suppliers: FakeSuppliers, seconds: float) -> None:
        self.carts = self.singles = 0
        self.carts_most_beside_singles = 0
        """Most carts' calls in flight while a single quote's call was in flight."""
        self.carts_most = 0
        self.slots_full = asyncio.Event()
        """Set once single quotes' calls alone held all 6 slots."""
        slow = fakes.delay(seconds, fakes.quote())

        async def counted(request: Any) -> Any:
            cart = request.query["sku"].startswith("C-")
            if cart:
                self.carts += 1
            else:
                self.singles += 1
                if self.singles == 6:
                    self.slots_full.set()
            self.carts_most = max(self.carts_most, self.carts)
            if self.singles:
                self.carts_most_beside_singles = max(self.carts_most_beside_singles, self.carts)
            try:
                return await slow(request)
            finally:
                if cart:
                    self.carts -= 1
                else:
                    self.singles -= 1

        for name in ("atlas", "boreal", "cedar"):
            suppliers.always(name, counted)


async def test_carts_keep_to_their_slots_beside_single_quotes_and_are_never_starved(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Single quotes fill every slot: a cart still gets its 2 and completes; never more."""
    meter = ClassMeter(suppliers, 0.03)
    client = await start_quoteflow(cart_budget=3.0, budget=2.0, breaker_failures=0)
    answers: list[int] = []
    carted = asyncio.Event()

    async def single_quotes(n: int) -> None:
        while not carted.is_set():
            response = await client.post("/api/quotes", json={"sku": f"S-{n}"})
            answers.append(response.status)

    # 6 callers of 3 calls each want 18 slots of 6, as long as the cart runs.
    callers = [asyncio.create_task(single_quotes(n)) for n in range(6)]
    await asyncio.wait_for(meter.slots_full.wait(), 1.0)
    status, answer = await post_cart(client, cart(*(f"C-{n:02d}" for n in range(8))))
    carted.set()
    await asyncio.gather(*callers)
    assert status == 200
    assert all(len(line["quotes"]) == 3 for line in answer["lines"])
    assert meter.carts_most_beside_singles == meter.carts_most == 2  # its part, no more
    assert answers
    assert set(answers) == {200}


async def test_an_idle_service_gives_a_cart_every_slot(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """With no single quote about, a cart's calls take all 6 slots, not only their part."""
    meter = ClassMeter(suppliers, 0.03)
    client = await start_quoteflow(cart_budget=3.0, breaker_failures=0)
    status, answer = await post_cart(client, cart(*(f"C-{n:02d}" for n in range(12))))
    assert status == 200
    assert all(len(line["quotes"]) == 3 for line in answer["lines"])
    assert meter.carts_most == 6


# -- callers ---------------------------------------------------------------------


async def test_a_cart_spends_one_unit_of_its_callers_rate_per_line(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, tmp_path: Any
) -> None:
    """A 3-line cart spends 3 of a burst of 5; another 3-line cart is refused, asking nothing."""
    path = write_callers(tmp_path / "callers.toml", {"name": "acme", "rate": "5/60s", "seats": 2})
    callers = load_callers(str(path), {})
    client = await start_quoteflow(callers=callers, cart_budget=CART_BUDGET)
    headers = bearer("acme")
    response = await client.post("/api/carts", json=cart("A", "B", "C"), headers=headers)
    assert response.status == 200
    assert response.headers["RateLimit"].startswith('"acme";r=2;')
    asked = len(suppliers.received)
    response = await client.post("/api/carts", json=cart("D", "E", "F"), headers=headers)
    assert response.status == 429
    assert (await response.json())["error"] == "quota_exceeded"
    assert len(suppliers.received) == asked
    for _ in range(2):
        single = await client.post("/api/quotes", json={}, headers=headers)
        assert single.status == 200
    single = await client.post("/api/quotes", json={}, headers=headers)
    assert single.status == 429


# -- alternates ------------------------------------------------------------------------


async def test_a_line_out_of_stock_everywhere_is_bought_as_its_stocked_alternate(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Every SKU is asked of every supplier; the line's one flat list names each quote's SKU."""
    empty = fakes.quote(stock=0)
    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, _by_sku({"CAP-1": empty, "CAP-1C": fakes.status(404)}))
    suppliers.always("cedar", _by_sku({"CAP-1": empty, "CAP-1B": fakes.status(404)}))
    client = await start_quoteflow(cart_budget=CART_BUDGET, breaker_failures=0)
    body = {
        "lines": [
            {"sku": "KB-001", "quantity": 2},
            {"sku": "CAP-1", "quantity": 2, "alternates": ["CAP-1B", "CAP-1C"], "ref": "C1, C2"},
        ]
    }
    response = await client.post("/api/carts?explain=1", json=body)
    assert response.status == 200
    answer = await response.json()
    plain, capacitor = answer["lines"]
    assert set(plain) == {"sku", "quantity", "quotes", "failures", "best"}
    assert capacitor["ref"] == "C1, C2"
    assert capacitor["alternates"] == ["CAP-1B", "CAP-1C"]
    assert [(q["sku"], q["supplier"]) for q in capacitor["quotes"]] == [
        ("CAP-1B", "boreal"),
        ("CAP-1B", "atlas"),
    ]
    assert capacitor["best"] == capacitor["quotes"][0]
    assert capacitor["failures"] == [
        {"supplier": "cedar", "sku": "CAP-1B", "code": "http_404"},
        *({"supplier": name, "sku": "CAP-1C", "code": "http_404"} for name in ("atlas", "boreal")),
    ]
    basket = answer["basket"]
    assert [(p["sku"], p["bought_sku"], p["supplier"]) for p in basket["picks"]] == [
        ("KB-001", "KB-001", "boreal"),
        ("CAP-1", "CAP-1B", "boreal"),
    ]
    assert basket["complete"] is True
    assert basket["total_cents"] == 2 * 2200 + 250
    for name in ("atlas", "boreal", "cedar"):
        asked = sorted(r.query["sku"] for r in suppliers.of(name))
        assert asked == ["CAP-1", "CAP-1B", "CAP-1C", "KB-001"]
    assert answer["explain"]["lines"]["CAP-1B"] == {
        "atlas": "ok",
        "boreal": "ok",
        "cedar": "http_404",
    }
    assert answer["explain"]["lines"]["CAP-1"]["boreal"] == "insufficient_stock"
    drawn = await (await client.post("/api/carts?explain=svg", json=body)).text()
    assert "CAP-1 as CAP-1B × 2: boreal, 2200 ¢" in drawn


async def test_a_cart_spends_one_unit_of_its_callers_rate_per_sku_alternates_too(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, tmp_path: Any
) -> None:
    """Two lines with one alternate each spend 4 of 5; a line with 2 alternates is then refused."""
    path = write_callers(tmp_path / "callers.toml", {"name": "acme", "rate": "5/60s", "seats": 2})
    client = await start_quoteflow(callers=load_callers(str(path), {}), cart_budget=CART_BUDGET)
    headers = bearer("acme")
    lines = [
        {"sku": "A", "quantity": 1, "alternates": ["A2"]},
        {"sku": "B", "quantity": 1, "alternates": ["B2"]},
    ]
    response = await client.post("/api/carts", json={"lines": lines}, headers=headers)
    assert response.status == 200
    assert response.headers["RateLimit"].startswith('"acme";r=1;')
    asked = len(suppliers.received)
    lines = [{"sku": "C", "quantity": 1, "alternates": ["C2"]}]
    response = await client.post("/api/carts", json={"lines": lines}, headers=headers)
    assert response.status == 429
    assert len(suppliers.received) == asked
