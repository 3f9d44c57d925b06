"""Batch suppliers: many lines per call, each line failing alone; on real sockets.

A fake batch API (``tests.api_fakes.ForeignApi``) answers QuoteFlow's own
batch protocol, ``{"quotes": [...], "not_found": [...]}``, and records every
call: its lines, its request id and attempt number.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.options import ConfigError, load_catalogue
from quoteflow.reload import reload_all
from tests.api_fakes import Arrived, ForeignApi, catalogue_text
from tests.conftest import TEST_CONNECT_TIMEOUT

Client = TestClient[Any, Any]

Entry = Callable[[str, int], dict[str, Any] | str | None]
"""What the fake answers for one asked line: a quote, ``"not_found"``, or None (left out)."""


def good(sku: str, quantity: int) -> dict[str, Any]:
    return {"supplier": "bulk", "sku": sku, "unit_cents": 100, "shipping_cents": 500, "stock": 999}


class BatchApi:
    """Answers ``POST /bulk/match`` per line through ``entry``, or with ``status`` for the call."""

    def __init__(self, api: ForeignApi) -> None:
        self.api = api
        self.entry: Entry = good
        self.statuses: list[int] = []
        """Answers for the next calls, one each, before the per-line answers resume."""
        api.answer = self._answer

    async def _answer(self, request: web.Request, arrived: Arrived) -> web.StreamResponse:
        if self.statuses:
            return web.json_response({"error": "busy"}, status=self.statuses.pop(0))
        parts = json.loads(arrived.body)["parts"]
        quotes: list[object] = []
        missing: list[str] = []
        for part in parts:
            entry = self.entry(part["mpn"], part["qty"])
            if entry == "not_found":
                missing.append(part["mpn"])
            elif entry is not None:
                quotes.append(entry)
        quotes.reverse()  # matched by SKU, never by position
        return web.json_response({"quotes": quotes, "not_found": missing})

    def calls(self) -> list[list[str]]:
        """The SKUs of each call that arrived, in order."""
        return [[p["mpn"] for p in json.loads(a.body)["parts"]] for a in self.api.arrived]


def bulk(api: ForeignApi, max_items: int = 2, **extra: Any) -> dict[str, Any]:
    return {
        "name": "bulk",
        "url": f"{api.url}/bulk/match",
        "method": "POST",
        "body": {"parts": [{"mpn": "{sku}", "qty": "{quantity}"}], "scenario": "{scenario}"},
        "batch": {"max_items": max_items, "items": "parts"},
        **extra,
    }


class Start:
    def __init__(self, aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
        self.aiohttp_client = aiohttp_client
        self.path = tmp_path / "suppliers.toml"

    async def __call__(self, suppliers: list[dict[str, Any]], **overrides: Any) -> Client:
        self.path.write_text(catalogue_text(suppliers))
        values: dict[str, Any] = {
            "budget": 0.5,
            "cart_budget": 1.0,
            "connect_timeout": TEST_CONNECT_TIMEOUT,
            "suppliers_file": str(self.path),
            **overrides,
        }
        settings = Settings(**values)
        catalogue = load_catalogue(settings, {})
        return await self.aiohttp_client(create_app(settings, catalogue=catalogue, environ={}))


@pytest.fixture
def batch(api: ForeignApi) -> BatchApi:
    return BatchApi(api)


@pytest.fixture
def start(aiohttp_client: AiohttpClient, tmp_path: Path) -> Start:
    return Start(aiohttp_client, tmp_path)


def cart(*skus: str, quantity: int = 3) -> dict[str, Any]:
    return {"lines": [{"sku": sku, "quantity": quantity} for sku in skus]}


async def post_cart(client: Client, body: object, request_id: str = "c-1") -> dict[str, Any]:
    response = await client.post(
        "/api/carts?explain=1", json=body, headers={"X-Request-ID": request_id}
    )
    assert response.status == 200, await response.text()
    return dict(await response.json())


async def test_a_cart_is_asked_in_chunks_of_max_items_all_at_once(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """Five lines, ``max_items = 2``: three calls of 2, 2 and 1, each with the cart's id."""
    client = await start([bulk(api)])
    answer = await post_cart(client, cart("A", "B", "C", "D", "E"))
    assert sorted(batch.calls()) == [["A", "B"], ["C", "D"], ["E"]]
    assert {a.headers["X-Request-ID"] for a in api.arrived} == {"c-1"}
    assert {a.headers["X-Attempt"] for a in api.arrived} == {"1"}
    sent = json.loads(api.arrived[0].body)
    assert sent["scenario"] == "normal"
    assert sent["parts"][0]["qty"] == 3  # the template's "{quantity}" as a number
    for line in answer["lines"]:
        assert [q["supplier"] for q in line["quotes"]] == ["bulk"]
        assert line["best"]["total_cents"] == 3 * 100 + 500
    # One supplier: its shipping once for the whole cart.
    assert answer["basket"]["total_cents"] == 5 * 300 + 500
    assert answer["basket"]["per_line_total_cents"] == 5 * 800
    calls = answer["explain"]["suppliers"]["bulk"]["calls"]
    assert sorted(call["lines"] for call in calls) == [["A", "B"], ["C", "D"], ["E"]]


async def test_a_lines_alternates_are_lines_of_the_batch_calls(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """Each SKU of a line is one line of a call; an alternate fills a line not found."""
    batch.entry = lambda sku, q: "not_found" if sku == "B" else good(sku, q)
    client = await start([bulk(api, max_items=3)])
    lines = [{"sku": "A", "quantity": 3}, {"sku": "B", "quantity": 3, "alternates": ["B2", "B3"]}]
    answer = await post_cart(client, {"lines": lines})
    assert sorted(batch.calls()) == [["A", "B", "B2"], ["B3"]]
    second = answer["lines"][1]
    assert [q["sku"] for q in second["quotes"]] == ["B2", "B3"]
    assert second["failures"] == [{"supplier": "bulk", "sku": "B", "code": "not_found"}]
    picks = answer["basket"]["picks"]
    assert [(p["sku"], p["bought_sku"]) for p in picks] == [("A", "A"), ("B", "B2")]
    assert answer["basket"]["total_cents"] == 2 * 300 + 500


@pytest.mark.parametrize(
    ("entry", "code"),
    [
        (lambda sku, q: "not_found", "not_found"),
        (lambda sku, q: None, "invalid_data"),  # missing from the answer
        (lambda sku, q: {**good(sku, q), "unit_cents": "100"}, "invalid_data"),  # malformed
        (lambda sku, q: good("OTHER", q), "invalid_data"),  # another SKU's
        (lambda sku, q: {**good(sku, q), "supplier": "someone"}, "invalid_data"),
    ],
)
async def test_a_bad_entry_fails_its_line_alone(
    start: Start, api: ForeignApi, batch: BatchApi, entry: Entry, code: str
) -> None:
    """Line B's entry is bad: B has the code, A and C in the same call keep their quotes."""
    batch.entry = lambda sku, q: entry(sku, q) if sku == "B" else good(sku, q)
    client = await start([bulk(api, max_items=3)])
    answer = await post_cart(client, cart("A", "B", "C"))
    assert len(api.arrived) == 1  # never retried
    by_sku = {line["sku"]: line for line in answer["lines"]}
    assert by_sku["B"]["failures"] == [{"supplier": "bulk", "code": code}]
    assert by_sku["B"]["quotes"] == []
    for sku in ("A", "C"):
        assert [q["supplier"] for q in by_sku[sku]["quotes"]] == ["bulk"]
    assert answer["basket"]["unquoted"] == ["B"]


async def test_a_whole_call_that_is_not_the_protocol_is_invalid_data_for_its_lines(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """A body that is not ``{quotes, not_found}``: every line of that call, never retried."""

    async def answer(request: web.Request, arrived: Arrived) -> web.StreamResponse:
        return web.json_response({"quotes": [], "extra": 1})

    api.answer = answer
    client = await start([bulk(api, max_items=3)])
    answer_body = await post_cart(client, cart("A", "B"))
    assert len(api.arrived) == 1
    assert [line["failures"] for line in answer_body["lines"]] == [
        [{"supplier": "bulk", "code": "invalid_data"}]
    ] * 2
    bill = answer_body["explain"]["suppliers"]["bulk"]["calls"][0]
    assert bill["attempts"][0]["outcome"] == "invalid_data"


async def test_a_batch_503_is_retried_once_with_the_same_request_id(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """Each call may be tried twice; the retry carries the cart's id and ``X-Attempt: 2``."""
    batch.statuses = [503]
    client = await start([bulk(api, max_items=3)])
    answer = await post_cart(client, cart("A", "B"), request_id="c-503")
    assert [(a.headers["X-Request-ID"], a.headers["X-Attempt"]) for a in api.arrived] == [
        ("c-503", "1"),
        ("c-503", "2"),
    ]
    assert all(len(line["quotes"]) == 1 for line in answer["lines"])
    bill = answer["explain"]["suppliers"]["bulk"]["calls"][0]
    assert [a["outcome"] for a in bill["attempts"]] == ["http_503", "ok"]


async def test_a_413_fails_the_calls_lines_with_http_413_and_is_logged_once(
    start: Start, api: ForeignApi, batch: BatchApi, caplog: pytest.LogCaptureFixture
) -> None:
    """``max_items`` too large for the supplier: ``http_413`` on those lines, never retried."""
    batch.statuses = [413, 413]
    client = await start([bulk(api, max_items=2)])
    with caplog.at_level(logging.WARNING, logger="quoteflow"):
        answer = await post_cart(client, cart("A", "B", "C", "D"))
    assert len(api.arrived) == 2
    assert {line["failures"][0]["code"] for line in answer["lines"]} == {"http_413"}
    assert [r.event for r in caplog.records].count("batch_too_large") == 1  # type: ignore[attr-defined]


async def test_a_carts_calls_count_once_for_the_breaker(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """Three failing calls of one cart are one failure: two carts open a 2-failure breaker."""
    batch.statuses = [500] * 3
    client = await start([bulk(api, max_items=1, breaker_failures=2)])
    answer = await post_cart(client, cart("A", "B", "C"))
    assert {line["failures"][0]["code"] for line in answer["lines"]} == {"http_500"}
    response = await client.post("/api/quotes", json={"sku": "ONE"})
    one = await response.json()
    assert one["best"]["supplier"] == "bulk"  # still closed: the cart was one failure
    assert batch.calls()[-1] == ["ONE"]  # a single quote is a one-line batch call
    batch.statuses = [500] * 6
    await post_cart(client, cart("A", "B", "C"))
    await post_cart(client, cart("A", "B", "C"))
    arrived = len(api.arrived)
    answer = await post_cart(client, cart("A", "B"))
    assert {line["failures"][0]["code"] for line in answer["lines"]} == {"circuit_open"}
    assert len(api.arrived) == arrived


async def test_a_single_quote_of_a_batch_supplier_is_a_one_line_call(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """``POST /api/quotes`` asks a batch supplier a batch of one; its no is ``not_found``."""
    batch.entry = lambda sku, q: "not_found" if sku == "NOPE" else good(sku, q)
    client = await start([bulk(api)])
    response = await client.post("/api/quotes", json={"sku": "KB-9", "quantity": 4})
    answer = await response.json()
    assert answer["best"]["total_cents"] == 4 * 100 + 500
    assert json.loads(api.arrived[0].body)["parts"] == [{"mpn": "KB-9", "qty": 4}]
    response = await client.post("/api/quotes", json={"sku": "NOPE"})
    assert (await response.json())["failures"] == [{"supplier": "bulk", "code": "not_found"}]


async def test_a_delimited_query_batch_joins_the_skus_and_asks_a_separator_sku_alone(
    start: Start, api: ForeignApi
) -> None:
    """``query = "pn"``, ``separator = "|"``: one value per call; ``X|Y`` is asked by itself."""

    async def answer(request: web.Request, arrived: Arrived) -> web.StreamResponse:
        value = request.query["pn"]
        skus = [value] if value == "X|Y" else value.split("|")  # the fake knows its odd part
        return web.json_response({"quotes": [good(sku, 1) for sku in skus], "not_found": []})

    api.answer = answer
    mouser = {
        "name": "bulk",
        "url": f"{api.url}/bulk/search",
        "query": {"pn": "{sku}", "qty": "{quantity}"},
        "batch": {"max_items": 10, "query": "pn", "separator": "|"},
    }
    client = await start([mouser])
    body = {"lines": [{"sku": s, "quantity": 2} for s in ("A", "X|Y", "B")]}
    answer_body = await post_cart(client, body)
    values = sorted(a.query["pn"] for a in api.arrived)
    assert values == ["A|B", "X|Y"]
    assert {a.query["qty"] for a in api.arrived} == {"2"}
    assert [len(line["quotes"]) for line in answer_body["lines"]] == [1, 1, 1]


async def test_lines_of_different_quantities_go_in_different_calls_when_the_query_has_one(
    start: Start, api: ForeignApi
) -> None:
    """A query naming ``{quantity}`` outside the line carries one quantity per call."""

    async def answer(request: web.Request, arrived: Arrived) -> web.StreamResponse:
        skus = request.query["pn"].split(",")
        return web.json_response({"quotes": [good(sku, 1) for sku in skus], "not_found": []})

    api.answer = answer
    mouser = {
        "name": "bulk",
        "url": f"{api.url}/bulk/search",
        "query": {"pn": "{sku}", "qty": "{quantity}"},
        "batch": {"max_items": 10, "query": "pn"},
    }
    client = await start([mouser])
    body = {
        "lines": [
            {"sku": "A", "quantity": 1},
            {"sku": "B", "quantity": 5},
            {"sku": "C", "quantity": 1},
        ]
    }
    await post_cart(client, body)
    assert sorted((a.query["pn"], a.query["qty"]) for a in api.arrived) == [
        ("A,C", "1"),
        ("B", "5"),
    ]


@pytest.mark.parametrize(
    ("batch_table", "extra", "message"),
    [
        ({"items": "parts"}, {}, "batch.max_items: must be an integer from 1 to 1000"),
        (
            {"max_items": 0, "items": "parts"},
            {},
            "batch.max_items: must be an integer from 1 to 1000",
        ),
        (
            {"max_items": 5},
            {},
            'batch: needs one of "items" (a body array) or "query" (a query value)',
        ),
        ({"max_items": 5, "items": "lines"}, {}, "batch.items: the body has no 'lines'"),
        ({"max_items": 5, "items": "parts", "size": 1}, {}, "batch.size: unknown key"),
        (
            {"max_items": 5, "items": "parts", "rate_unit": "item"},
            {},
            'batch.rate_unit: "item" needs the supplier\'s rate',
        ),
        (
            {"max_items": 5, "items": "parts"},
            {"body": {"parts": [{"mpn": "{sku}"}, {"mpn": "{sku}"}]}},
            "batch.items: body.parts must be an array of one element: a line",
        ),
        (
            {"max_items": 5, "items": "parts"},
            {"body": {"parts": [{"mpn": "{sku}"}], "note": "{quantity}"}},
            "batch.items: {sku} and {quantity} belong in the element: one value per line",
        ),
    ],
)
async def test_a_bad_batch_table_is_one_line_naming_the_supplier_and_field(
    tmp_path: Path,
    api: ForeignApi,
    batch_table: dict[str, Any],
    extra: dict[str, Any],
    message: str,
) -> None:
    """At start: ``ConfigError`` (exit 2) naming ``supplier 'bulk'`` and the key at fault."""
    path = tmp_path / "suppliers.toml"
    path.write_text(catalogue_text([{**bulk(api), **extra, "batch": batch_table}]))
    with pytest.raises(ConfigError) as raised:
        load_catalogue(Settings(suppliers_file=str(path)), {})
    assert f"supplier 'bulk': {message}" in str(raised.value)


async def test_a_reload_with_a_bad_batch_table_is_refused_and_the_old_one_serves(
    start: Start, api: ForeignApi, batch: BatchApi, caplog: pytest.LogCaptureFixture
) -> None:
    """``reload_refused`` names the field; carts keep their chunks of the old catalogue."""
    client = await start([bulk(api, max_items=2)])
    start.path.write_text(
        catalogue_text([{**bulk(api), "batch": {"max_items": 0, "items": "parts"}}])
    )
    with caplog.at_level(logging.INFO, logger="quoteflow"):
        reload_all(client.app)
    refused = [r for r in caplog.records if r.event == "reload_refused"]  # type: ignore[attr-defined]
    assert len(refused) == 1
    assert "batch.max_items" in refused[0].fields["error"]  # type: ignore[attr-defined]
    await post_cart(client, cart("A", "B", "C"))
    assert sorted(map(len, batch.calls())) == [1, 2]


async def test_every_line_of_a_cart_timing_out_keeps_the_calls_that_finished(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """A chunk that hangs is ``timeout`` on its lines at the cart's deadline; the other is kept."""

    async def answer(request: web.Request, arrived: Arrived) -> web.StreamResponse:
        parts = json.loads(arrived.body)["parts"]
        if parts[0]["mpn"] == "C":
            await asyncio.sleep(5)
        return web.json_response({"quotes": [good(p["mpn"], 1) for p in parts], "not_found": []})

    api.answer = answer
    client = await start([bulk(api, max_items=2)], cart_budget=0.5)
    body = await post_cart(client, cart("A", "B", "C"))
    codes = {line["sku"]: [f["code"] for f in line["failures"]] for line in body["lines"]}
    assert codes == {"A": [], "B": [], "C": ["timeout"]}


async def test_with_the_cache_on_a_line_held_fresh_is_not_asked_again(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """A batch answer's ``Cache-Control`` fills the cache per line; a later call asks the rest."""

    async def answer(request: web.Request, arrived: Arrived) -> web.StreamResponse:
        parts = json.loads(arrived.body)["parts"]
        quotes = [good(p["mpn"], p["qty"]) for p in parts]
        body = {"quotes": quotes, "not_found": []}
        return web.json_response(body, headers={"Cache-Control": "max-age=60"})

    api.answer = answer
    client = await start([bulk(api, max_items=5)], cache_size=100)
    await post_cart(client, cart("A", "B"))
    answer_body = await post_cart(client, cart("A", "B", "C"))
    assert batch.calls() == [["A", "B"], ["C"]]
    assert all(len(line["quotes"]) == 1 for line in answer_body["lines"])
    by_sku = {line["sku"]: line["quotes"][0] for line in answer_body["lines"]}
    assert "age_s" in by_sku["A"]
    assert "age_s" not in by_sku["C"]
    answer_body = await post_cart(client, cart("C", "B"))
    assert len(api.arrived) == 2  # every line fresh: the supplier is not asked
    assert answer_body["explain"]["suppliers"]["bulk"]["calls"][0]["stopped"] == "cached"


async def test_a_rate_counted_in_items_caps_the_chunk_and_spends_a_turn_per_line(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """``rate = "4/10s"``, ``rate_unit = "item"``: a chunk is never over 4 lines, nor more sent.

    Six lines: a call of 4 spends the rate's whole burst; the call of 2 finds
    no turn before the cart's deadline, and its lines are ``rate_limited``.
    """
    table = {"max_items": 10, "items": "parts", "rate_unit": "item"}
    client = await start([bulk(api, rate="4/10s", batch=table)], cart_budget=0.6)
    answer = await post_cart(client, cart("A", "B", "C", "D", "E", "F"))
    assert batch.calls() == [["A", "B", "C", "D"]]
    codes = {line["sku"]: [f["code"] for f in line["failures"]] for line in answer["lines"]}
    assert codes == {
        "A": [],
        "B": [],
        "C": [],
        "D": [],
        "E": ["rate_limited"],
        "F": ["rate_limited"],
    }


async def test_a_supplier_whose_circuit_is_open_is_not_asked_for_any_line(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """An open circuit: every line ``circuit_open``, no call; the cart is answered at once."""
    batch.statuses = [500]
    client = await start([bulk(api, breaker_failures=1)])
    response = await client.post("/api/quotes", json={"sku": "X"})
    assert (await response.json())["failures"] == [{"supplier": "bulk", "code": "http_500"}]
    answer = await post_cart(client, cart("A", "B", "C"))
    assert len(api.arrived) == 1
    assert [line["failures"] for line in answer["lines"]] == [
        [{"supplier": "bulk", "code": "circuit_open"}]
    ] * 3
    assert answer["explain"]["suppliers"] == {}


async def test_a_half_open_supplier_is_probed_by_one_call_of_a_cart_and_closes_again(
    start: Start, api: ForeignApi, batch: BatchApi
) -> None:
    """After its open time, one call of the next cart probes it; its other calls wait, coded.

    The probe's success closes the circuit: the cart after is asked in full.
    """
    batch.statuses = [500]
    client = await start([bulk(api, max_items=1, breaker_failures=1)], breaker_open=0.05)
    await client.post("/api/quotes", json={"sku": "X"})  # opens the circuit
    await asyncio.sleep(0.1)  # past its open time (0.05 s at most, jittered)
    answer = await post_cart(client, cart("A", "B", "C"))
    assert batch.calls()[1:] == [["A"]]  # the probe: one call
    codes = {line["sku"]: [f["code"] for f in line["failures"]] for line in answer["lines"]}
    assert codes == {"A": [], "B": ["circuit_open"], "C": ["circuit_open"]}
    assert answer["explain"]["suppliers"]["bulk"]["calls"][0]["probe"] is True
    answer = await post_cart(client, cart("A", "B", "C"))
    assert sorted(batch.calls()[2:]) == [["A"], ["B"], ["C"]]
    assert all(line["failures"] == [] for line in answer["lines"])


async def test_items_may_be_a_dotted_path_into_the_body(start: Start, api: ForeignApi) -> None:
    """``items = "variables.queries"`` (a GraphQL API's shape): lines go in that nested array."""

    async def answer(request: web.Request, arrived: Arrived) -> web.StreamResponse:
        queries = json.loads(arrived.body)["variables"]["queries"]
        quotes = [good(q["mpn"], 1) for q in queries]
        return web.json_response({"quotes": quotes, "not_found": []})

    api.answer = answer
    graphql = {
        "name": "bulk",
        "url": f"{api.url}/bulk/graphql",
        "method": "POST",
        "body": {
            "query": "query M($queries: [Q!]!) { match(queries: $queries) { mpn } }",
            "variables": {"queries": [{"mpn": "{sku}", "limit": 1}]},
        },
        "batch": {"max_items": 10, "items": "variables.queries"},
    }
    client = await start([graphql])
    answer_body = await post_cart(client, cart("A", "B"))
    sent = json.loads(api.arrived[0].body)
    assert sent["variables"]["queries"] == [{"mpn": "A", "limit": 1}, {"mpn": "B", "limit": 1}]
    assert sent["query"].startswith("query M")
    assert all(len(line["quotes"]) == 1 for line in answer_body["lines"])
