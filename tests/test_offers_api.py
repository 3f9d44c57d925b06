"""Offers end to end: four suppliers in four currencies, an ECB feed, all on real sockets.

Every expected figure is computed here, independently of ``quoteflow.offers``:
each legal buy by trying every quantity, each amount with ``fractions.Fraction``
(whose ``round`` is half-even), each basket by trying every split.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.fx import FIRST_FETCH_WAIT
from quoteflow.options import load_catalogue
from tests.catalogue_fakes import write_catalogue
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, json_body, payload

EXPONENT = {"USD": 2, "EUR": 2, "GBP": 2, "JPY": 0, "KWD": 3}
RATES = {"USD": "1.0850", "JPY": "162.50", "GBP": "0.8600", "KWD": "0.3330"}

# name → (its catalogue currency or None, its quote for each SKU)
OFFERS: dict[str, dict[str, dict[str, Any]]] = {
    "atlas": {  # US dollars, today's shape
        "KB-001": {"unit_cents": 1200, "shipping_cents": 300, "stock": 500},
        "CAP-1": {"unit_cents": 480, "shipping_cents": 300, "stock": 500},
        "RES-1": {"unit_cents": 1, "shipping_cents": 300, "stock": 100000},
    },
    "boreal": {  # euros, price breaks as decimal strings
        "KB-001": {
            "currency": "EUR",
            "breaks": [
                {"quantity": 1, "unit_price": "11.00"},
                {"quantity": 10, "unit_price": "9.90"},
            ],
            "shipping": "3.00",
            "stock": 500,
        },
        "CAP-1": {
            "currency": "EUR",
            "breaks": [
                {"quantity": 1, "unit_price": "5.00"},
                {"quantity": 100, "unit_price": "4.00"},
            ],
            "shipping": "0",
            "stock": 500,
        },
        "RES-1": {
            "currency": "EUR",
            "unit_price": "0.0034",
            "moq": 10,
            "multiple": 10,
            "shipping_cents": 150,
            "stock": 100000,
        },
    },
    "cedar": {  # yen by its catalogue entry: today's shape, but no cents
        "KB-001": {"unit_cents": 1650, "shipping_cents": 500, "stock": 500},
        "CAP-1": {"unit_cents": 700, "shipping_cents": 0, "stock": 80},
        "RES-1": {"unit_cents": 1, "shipping_cents": 200, "stock": 100000},
    },
    "dune": {  # Kuwaiti dinars (three places), sub-cent breaks in unit_cents, a moq
        "KB-001": {
            "currency": "KWD",
            "breaks": [{"quantity": 5, "unit_cents": 3900}, {"quantity": 50, "unit_cents": 3500}],
            "moq": 5,
            "shipping": "1.250",
            "stock": 500,
        },
        "CAP-1": {"currency": "KWD", "unit_price": "1.6", "shipping_cents": 0, "stock": 500},
        "RES-1": {
            "currency": "KWD",
            "unit_price": "0.0011",
            "multiple": 5000,
            "shipping_cents": 100,
            "stock": 100000,
        },
    },
}
NATIVE = {"atlas": "USD", "boreal": "EUR", "cedar": "JPY", "dune": "KWD"}


def ecb_xml(date: dt.date, rates: dict[str, str]) -> bytes:
    """The ECB's daily file for ``date`` with ``rates``."""
    rows = "".join(f"<Cube currency='{c}' rate='{r}'/>" for c, r in rates.items())
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<gesmes:Envelope xmlns:gesmes="http://www.gesmes.org/xml/2002-08-01"'
        ' xmlns="http://www.ecb.int/vocabulary/2002-08-01/eurofxref">'
        "<gesmes:subject>Reference rates</gesmes:subject>"
        f"<Cube><Cube time='{date.isoformat()}'>{rows}</Cube></Cube></gesmes:Envelope>"
    ).encode()


class World:
    """The four suppliers at ``/offers/{name}`` and the rates feed at ``/fx.xml``."""

    def __init__(self) -> None:
        self.feed: bytes = ecb_xml(dt.date.today(), RATES)
        self.feed_fault: str | None = None
        self.feed_fetches = 0
        self.asked: list[tuple[str, str]] = []
        self.delay = 0.0
        """Seconds each supplier takes to answer."""
        self.cache_control: str | None = None
        self.released = asyncio.Event()
        """Set when the test ends: a hanging feed answer lets go, so the server stops at once."""
        self.url = ""
        self.app = web.Application()
        self.app.router.add_get("/offers/{name}", self._offer)
        self.app.router.add_get("/fx.xml", self._feed)

    async def _offer(self, request: web.Request) -> web.StreamResponse:
        name, sku = request.match_info["name"], request.query["sku"]
        self.asked.append((name, sku))
        if self.delay:
            await asyncio.sleep(self.delay)
        headers = {} if self.cache_control is None else {"Cache-Control": self.cache_control}
        return web.json_response(
            {"supplier": name, "sku": sku, **OFFERS[name][sku]}, headers=headers
        )

    async def _feed(self, request: web.Request) -> web.StreamResponse:
        self.feed_fetches += 1
        if self.feed_fault == "hang":
            await self.released.wait()
        if self.feed_fault == "down":
            return web.Response(status=503)
        if self.feed_fault == "cut":
            response = web.StreamResponse(headers={"Content-Length": str(len(self.feed))})
            await response.prepare(request)
            await response.write(self.feed[:100])
            assert request.transport is not None
            request.transport.close()
            return response
        return web.Response(body=self.feed, content_type="text/xml")


@pytest.fixture
async def world(aiohttp_server: AiohttpServer) -> AsyncIterator[World]:
    found = World()
    server = await aiohttp_server(found.app)
    found.url = str(server.make_url("")).rstrip("/")
    yield found
    found.released.set()


async def start(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path, **settings: Any
) -> TestClient[Any, Any]:
    path = tmp_path / "suppliers.toml"
    entries = [{"name": name, "url": f"{world.url}/offers/{name}"} for name in OFFERS]
    entries[2]["currency"] = "JPY"  # cedar names no currency in its quotes
    write_catalogue(path, entries)
    values: dict[str, Any] = {
        "suppliers_file": str(path),
        "fx_rates": f"{world.url}/fx.xml",
        "budget": 0.8,
        "breaker_failures": 0,
        **settings,
    }
    found = Settings(**values)
    app = create_app(found, catalogue=load_catalogue(found, {}))
    return await aiohttp_client(app)


# -- the independent computation ----------------------------------------------------------


def price_of(sku: str, name: str, need: int, answer: str, rates: dict[str, str]) -> dict[str, Any]:
    """What ``name``'s offer for ``sku`` costs for ``need`` units in ``answer``; {} if unbuyable."""
    offer = OFFERS[name][sku]
    currency = offer.get("currency", NATIVE[name])
    places = EXPONENT[currency]
    if "breaks" in offer:
        breaks = [
            (
                b["quantity"],
                Fraction(b["unit_price"])
                if "unit_price" in b
                else Fraction(b["unit_cents"], 10**places),
            )
            for b in offer["breaks"]
        ]
    elif "unit_price" in offer:
        breaks = [(1, Fraction(offer["unit_price"]))]
    else:
        breaks = [(1, Fraction(offer["unit_cents"], 10**places))]
    shipping = (
        Fraction(offer["shipping"])
        if "shipping" in offer
        else Fraction(offer["shipping_cents"], 10**places)
    )
    best: tuple[int, int] | None = None
    for units in range(need, offer["stock"] + 1):
        if units < offer.get("moq", 1) or units % offer.get("multiple", 1):
            continue
        prices = [p for q, p in breaks if q <= units]
        if not prices:
            continue
        amount = round(prices[-1] * units * 10**places)
        if best is None or amount < best[1]:
            best = (units, amount)
        if units > 20_000 and best is not None:
            break  # enough: the fixtures' breaks all lie below
    if best is None:
        return {}
    every = {"EUR": Fraction(1), **{c: Fraction(r) for c, r in rates.items()}}
    ratio = every[answer] / every[currency] * Fraction(10 ** EXPONENT[answer], 10**places)
    line = round(best[1] * ratio)
    ship = round(shipping * 10**places * ratio)
    return {"units": best[0], "line": line, "shipping": ship, "total": line + ship}


async def quote(client: TestClient[Any, Any], **body: Any) -> dict[str, Any]:
    response = await client.post("/api/quotes", json=body)
    assert response.status == 200, await response.text()
    found: dict[str, Any] = await response.json()
    return found


# -- single quotes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sku", "need", "answer"),
    [
        ("KB-001", 10, "USD"),
        ("KB-001", 3, "EUR"),
        ("KB-001", 60, "JPY"),
        ("CAP-1", 90, "USD"),
        ("CAP-1", 81, "KWD"),
        ("RES-1", 7, "USD"),
        ("RES-1", 100, "GBP"),
    ],
)
async def test_every_quote_is_the_independent_figure(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path, sku: str, need: int, answer: str
) -> None:
    client = await start(aiohttp_client, world, tmp_path)
    result = await quote(client, sku=sku, quantity=need, currency=answer)
    assert result["currency"] == answer
    expected = {name: price_of(sku, name, need, answer, RATES) for name in OFFERS}
    got = {q["supplier"]: q for q in result["quotes"]}
    assert set(got) == {name for name, found in expected.items() if found}
    for name, found in got.items():
        want = expected[name]
        assert found["total_cents"] == want["total"], name
        assert found["shipping_cents"] == want["shipping"], name
        assert found.get("buy_quantity", need) == want["units"], name
        if "unit_cents" in found:  # answered as today: the formula holds
            assert found["total_cents"] == found["unit_cents"] * need + found["shipping_cents"]
            assert "offer" not in found
            assert "line_cents" not in found
        else:
            assert found["line_cents"] == want["line"], name
            assert found["offer"]["currency"] == OFFERS[name][sku].get("currency", NATIVE[name])
    ranking = sorted(got.values(), key=lambda q: (q["total_cents"], q["supplier"]))
    assert result["quotes"] == ranking
    assert result["best"] == (ranking[0] if ranking else None)
    assert result["failures"] == []


async def test_the_ranking_flips_with_the_rate(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    """boreal's 9.90 EUR against atlas's 12.00 USD: cheaper at 1.0850, dearer at 1.30."""
    client = await start(aiohttp_client, world, tmp_path, fx_refresh=1)
    before = await quote(client, sku="KB-001", quantity=10)
    assert before["best"]["supplier"] == "boreal"
    world.feed = ecb_xml(dt.date.today(), {**RATES, "USD": "1.3000"})
    fetched = world.feed_fetches
    await _until(lambda: world.feed_fetches > fetched, 5)
    await asyncio.sleep(0.1)
    after = await quote(client, sku="KB-001", quantity=10)
    assert after["best"]["supplier"] == "atlas"
    boreal = next(q for q in after["quotes"] if q["supplier"] == "boreal")
    assert (
        boreal["total_cents"]
        == price_of("KB-001", "boreal", 10, "USD", {**RATES, "USD": "1.3000"})["total"]
    )
    assert boreal["offer"]["rate"] == "1.3"


async def test_a_stale_table_makes_foreign_quotes_no_rate(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    world.feed = ecb_xml(dt.date.today() - dt.timedelta(days=10), RATES)
    client = await start(aiohttp_client, world, tmp_path)
    result = await quote(client, sku="KB-001", quantity=10)
    assert [q["supplier"] for q in result["quotes"]] == ["atlas"]
    assert result["failures"] == [
        {"supplier": "boreal", "code": "no_rate"},
        {"supplier": "cedar", "code": "no_rate"},
        {"supplier": "dune", "code": "no_rate"},
    ]
    # no_rate is never retried: each supplier was asked once.
    explained = await (await client.post("/api/quotes?explain=1", json={"quantity": 10})).json()
    assert all(len(bill["attempts"]) == 1 for bill in explained["explain"]["suppliers"].values())


async def test_a_feed_that_hangs_or_dies_changes_no_answer_and_rates_come_back(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    """Down at start: no_rate, answered at once; a hanging or cut feed keeps the last table."""
    world.feed_fault = "down"
    client = await start(aiohttp_client, world, tmp_path, fx_refresh=1)
    result = await quote(client, sku="KB-001", quantity=10)
    assert {f["code"] for f in result["failures"]} == {"no_rate"}
    assert result["elapsed_ms"] < 400
    world.feed_fault = None  # the feed is back: the retry (1 s, then 2 s) takes it
    await _until(lambda: _fresh(client), 6)
    result = await quote(client, sku="KB-001", quantity=10)
    assert result["failures"] == []
    for fault in ("cut", "hang"):
        world.feed_fault = fault
        fetched = world.feed_fetches
        began = time.monotonic()
        # Asked while the feed fails (and for half a second after it was seen failing).
        while time.monotonic() - began < 5:
            answered = await quote(client, sku="KB-001", quantity=10)
            assert answered["failures"] == []  # the last good table serves
            assert answered["elapsed_ms"] < 400
            if world.feed_fetches > fetched and time.monotonic() - began > 0.5:
                break
            await asyncio.sleep(0.05)
        assert world.feed_fetches > fetched
    metrics = await (await client.get("/metrics")).text()
    assert 'quoteflow_fx_refresh_failures_total{reason="http"}' in metrics
    assert 'quoteflow_fx_refresh_failures_total{reason="transport"}' in metrics
    world.feed_fault = None


async def _fresh(client: TestClient[Any, Any]) -> bool:
    """The service's metrics say its rates table is fresh."""
    text = await (await client.get("/metrics")).text()
    return "quoteflow_fx_rates_fresh 1.0" in text


async def _until(condition: Callable[[], bool | Awaitable[bool]], within: float) -> None:
    began = time.monotonic()
    while True:
        done = condition()
        if not isinstance(done, bool):
            done = await done
        if done:
            return
        assert time.monotonic() - began < within, "never happened"
        await asyncio.sleep(0.05)


# -- carts ------------------------------------------------------------------------------------


async def test_a_carts_basket_is_the_cheapest_split(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    client = await start(aiohttp_client, world, tmp_path)
    lines = [("KB-001", 10), ("CAP-1", 90), ("RES-1", 7)]
    body = {"lines": [{"sku": s, "quantity": q} for s, q in lines], "currency": "EUR"}
    response = await client.post("/api/carts", json=body)
    assert response.status == 200, await response.text()
    cart = await response.json()
    assert cart["currency"] == "EUR"
    priced = {(s, n): price_of(s, n, q, "EUR", RATES) for s, q in lines for n in OFFERS}
    best_total = None
    for split in itertools.product(OFFERS, repeat=len(lines)):
        if not all(priced[line[0], name] for line, name in zip(lines, split, strict=True)):
            continue
        goods = sum(priced[line[0], name]["line"] for line, name in zip(lines, split, strict=True))
        charged: dict[str, int] = {}
        for line, name in zip(lines, split, strict=True):
            charged[name] = max(charged.get(name, 0), priced[line[0], name]["shipping"])
        total = goods + sum(charged.values())
        best_total = total if best_total is None else min(best_total, total)
    basket = cart["basket"]
    assert basket["total_cents"] == best_total
    assert basket["optimal"] is True
    for pick in basket["picks"]:
        want = priced[pick["sku"], pick["supplier"]]
        assert pick["line_cents"] == want["line"]
        need = dict(lines)[pick["sku"]]
        assert pick.get("buy_quantity", need) == want["units"]


# -- the request's currency ---------------------------------------------------------------------


@pytest.mark.parametrize("currency", ["XAU", "usd", "EURO", 978, "CHF"])
async def test_an_unknown_answer_currency_is_422(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path, currency: Any
) -> None:
    client = await start(aiohttp_client, world, tmp_path)
    for path, body in (
        ("/api/quotes", {"currency": currency}),
        ("/api/carts", {"lines": [{"sku": "KB-001", "quantity": 1}], "currency": currency}),
    ):
        response = await client.post(path, json=body)
        assert response.status == 422, (path, currency)
        detail = (await response.json())["detail"]
        assert [error["loc"] for error in detail] == [["currency"]]


async def test_the_bill_names_the_rule_an_offer_broke(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    """invalid_data, never retried, with the field in the bill (and the attempt's log event)."""
    bad = {**payload("boreal"), "unit_price": "9.1234567"}
    del bad["unit_cents"]
    suppliers.always("boreal", json_body(bad))
    client = await start_quoteflow()
    response = await client.post("/api/quotes?explain=1", json={})
    answer = await response.json()
    assert {"supplier": "boreal", "code": "invalid_data"} in answer["failures"]
    (attempt,) = answer["explain"]["suppliers"]["boreal"]["attempts"]
    assert attempt["outcome"] == "invalid_data"
    assert attempt["problem"].startswith("unit_price: must be a decimal string")
    assert suppliers.count("boreal") == 1
    suppliers.always("boreal", json_body({**payload("boreal"), "moq": 0}))
    answer = await (await client.post("/api/quotes?explain=1", json={})).json()
    (attempt,) = answer["explain"]["suppliers"]["boreal"]["attempts"]
    assert attempt["problem"].startswith("moq: must be from 1 to 10**9")


async def test_the_drawn_bill_carries_each_offers_money(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    """?explain=svg draws offers too: their buy, line and rate as data attributes."""
    client = await start(aiohttp_client, world, tmp_path)
    response = await client.post("/api/quotes?explain=svg", json={"sku": "RES-1", "quantity": 7})
    assert response.status == 200
    drawing = await response.text()
    assert 'data-quote-supplier="boreal"' in drawing
    assert 'data-buy-quantity="10"' in drawing
    assert 'data-offer-currency="EUR"' in drawing
    assert 'data-rate="1.085"' in drawing
    body = {"lines": [{"sku": "RES-1", "quantity": 7}, {"sku": "CAP-1", "quantity": 90}]}
    response = await client.post("/api/carts?explain=svg", json=body)
    assert response.status == 200
    drawing = await response.text()
    assert 'class="pick"' in drawing
    assert "data-line-cents=" in drawing


async def test_joiners_of_one_call_each_get_their_own_quantity_and_currency(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    """--coalesce shares the supplier call; the legal buy and the conversion stay per request."""
    world.delay = 0.2
    client = await start(aiohttp_client, world, tmp_path, coalesce=True)
    asked = [("RES-1", 7, "USD"), ("RES-1", 100, "GBP"), ("RES-1", 30000, "JPY")]
    answers = await asyncio.gather(
        *(quote(client, sku=sku, quantity=min(need, 100), currency=cur) for sku, need, cur in asked)
    )
    assert len(world.asked) == len(OFFERS)  # one call per supplier, shared by all three
    for (sku, need, currency), answer in zip(asked, answers, strict=True):
        need = min(need, 100)
        assert answer["currency"] == currency
        for found in answer["quotes"]:
            want = price_of(sku, found["supplier"], need, currency, RATES)
            assert found["total_cents"] == want["total"], (found["supplier"], currency)
            assert found.get("buy_quantity", need) == want["units"]


async def test_a_cached_offer_is_priced_at_todays_rate(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    """The cache keeps the offer as given; a new table reprices it without asking again."""
    world.cache_control = "max-age=30"
    client = await start(aiohttp_client, world, tmp_path, cache_size=100, fx_refresh=1)
    first = await quote(client, sku="KB-001", quantity=10)
    asked = len(world.asked)
    world.feed = ecb_xml(dt.date.today(), {**RATES, "USD": "1.3000"})
    fetched = world.feed_fetches
    await _until(lambda: world.feed_fetches > fetched, 5)
    await asyncio.sleep(0.1)
    second = await quote(client, sku="KB-001", quantity=10)
    assert len(world.asked) == asked  # every quote from the cache
    boreal = [next(q for q in r["quotes"] if q["supplier"] == "boreal") for r in (first, second)]
    assert [q["offer"]["rate"] for q in boreal] == ["1.085", "1.3"]
    rates = {**RATES, "USD": "1.3000"}
    assert boreal[1]["total_cents"] == price_of("KB-001", "boreal", 10, "USD", rates)["total"]


async def test_a_feed_that_hangs_at_start_delays_start_up_briefly_and_nothing_after(
    aiohttp_client: AiohttpClient, world: World, tmp_path: Path
) -> None:
    """Start-up waits for the first fetch at most FIRST_FETCH_WAIT; then no_rate, at once."""
    world.feed_fault = "hang"
    began = time.monotonic()
    client = await start(aiohttp_client, world, tmp_path)
    assert time.monotonic() - began < FIRST_FETCH_WAIT + 1.5
    result = await quote(client, sku="KB-001", quantity=10)
    assert {f["code"] for f in result["failures"]} == {"no_rate"}
    assert result["elapsed_ms"] < 400
    stopping = time.monotonic()
    await client.close()  # the fetch still hangs: shutting down cancels it
    assert time.monotonic() - stopping < 2
