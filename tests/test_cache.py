"""The quote cache (``--cache-size``): quotes reused as their ``Cache-Control`` allows."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from typing import Any

import attrs
import pytest
from aiohttp.test_utils import TestClient

from quoteflow.cache import Freshness, QuoteCache, freshness
from quoteflow.codec import encode_result, to_json
from quoteflow.models import Failure, QuoteResult, RankedQuote, SupplierQuote
from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, cacheable, delay, hang, quote, status
from tests.test_observability import events, metric

Client = TestClient[Any, Any]


async def ask(client: Client, **body: Any) -> dict[str, Any]:
    """One request with its budget bill."""
    response = await client.post("/api/quotes?explain=1", json=body)
    assert response.status == 200
    answer: dict[str, Any] = await response.json()
    return answer


def quote_of(answer: dict[str, Any], supplier: str) -> dict[str, Any] | None:
    """``supplier``'s quote in ``answer``, if it has one."""
    return next((q for q in answer["quotes"] if q["supplier"] == supplier), None)


def bill(answer: dict[str, Any], supplier: str) -> dict[str, Any]:
    """One supplier's part of the budget bill."""
    found: dict[str, Any] = answer["explain"]["suppliers"][supplier]
    return found


async def test_max_age_is_honoured_then_expires(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, caplog: pytest.LogCaptureFixture
) -> None:
    """boreal's max-age=60, capped at 0.3 s: answered from the cache with its age, then expired."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    suppliers.always("boreal", cacheable("public, max-age=60"))
    client = await start_quoteflow(cache_size=100, cache_max_age=0.3)
    first = await ask(client)
    assert "age_s" not in quote_of(first, "boreal")  # type: ignore[operator]
    second = await ask(client)
    cached = quote_of(second, "boreal")
    assert cached is not None
    assert 0 <= cached["age_s"] < 0.3
    assert {k: v for k, v in cached.items() if k != "age_s"} == quote_of(first, "boreal")
    assert bill(second, "boreal") == {"attempts": [], "stopped": "cached"}
    assert "age_s" not in quote_of(second, "atlas")  # type: ignore[operator]
    assert (suppliers.count("boreal"), suppliers.count("atlas")) == (1, 2)  # atlas sent no header
    await asyncio.sleep(0.35)
    third = await ask(client)
    assert "age_s" not in quote_of(third, "boreal")  # type: ignore[operator]
    assert suppliers.count("boreal") == 2
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_cache_answers_total", supplier="boreal", how="fresh") == 1
    assert metric(text, "quoteflow_cache_entries") == 1
    assert [e["shared"] for e in events(caplog, "quote_request")] == [{}, {"boreal": "cached"}, {}]


async def test_stale_if_error_covers_a_503_then_expires(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Past max-age, boreal's quote stands in for its 503s for stale-if-error, then no more."""
    suppliers.script("boreal", cacheable("max-age=0, stale-if-error=60"))
    suppliers.always("boreal", status(503))
    client = await start_quoteflow(cache_size=100, cache_max_age=0.4, breaker_failures=0)
    fresh = await ask(client)
    stale = await ask(client)
    assert stale["failures"] == []
    standing_in = quote_of(stale, "boreal")
    assert standing_in is not None
    assert standing_in["age_s"] >= 0
    assert stale["best"] == standing_in  # priced and ranked like any other quote
    part = bill(stale, "boreal")
    assert [a["outcome"] for a in part["attempts"]] == ["http_503", "http_503"]
    assert (part["stopped"], part["stale_if_error"]) == ("attempts_exhausted", "http_503")
    assert "age_s" not in quote_of(fresh, "boreal")  # type: ignore[operator]
    await asyncio.sleep(0.45)
    expired = await ask(client)
    assert {"supplier": "boreal", "code": "http_503"} in expired["failures"]
    assert "stale_if_error" not in bill(expired, "boreal")
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_cache_answers_total", supplier="boreal", how="stale") == 1
    assert metric(text, "quoteflow_cache_entries") == 0  # dropped once of no use


@pytest.mark.parametrize(
    ("failing", "code"),
    [(hang(), "timeout"), (status(500), "http_500"), (status(404), None), (quote(stock=-1), None)],
    ids=["timeout", "http_500", "404-not-covered", "invalid_data-not-covered"],
)
async def test_which_failures_a_stale_quote_covers(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, failing: Any, code: str | None
) -> None:
    """Timeouts and 5xx are covered; a 4xx or invalid data is the supplier's answer and stands."""
    suppliers.script("boreal", cacheable("max-age=0, stale-if-error=30"))
    suppliers.always("boreal", failing)
    client = await start_quoteflow(cache_size=10, budget=0.3, read_timeout=5.0)
    await ask(client)
    answer = await ask(client)
    if code is None:
        assert quote_of(answer, "boreal") is None
        assert "stale_if_error" not in bill(answer, "boreal")
    else:
        assert quote_of(answer, "boreal") is not None
        assert bill(answer, "boreal")["stale_if_error"] == code


async def test_a_stale_quote_covers_an_open_circuit(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """boreal fails until its circuit opens; its stale quote answers for it, the breaker unmoved."""
    suppliers.script("boreal", cacheable("max-age=0, stale-if-error=30"))
    suppliers.always("boreal", status(500))
    client = await start_quoteflow(cache_size=10, breaker_failures=2, breaker_open=5.0)
    for _ in range(3):  # one quote, then two failures open the circuit
        await ask(client)
    sent = suppliers.count("boreal")
    answer = await ask(client)
    assert suppliers.count("boreal") == sent == 3  # not asked: the circuit is open
    assert quote_of(answer, "boreal") is not None
    assert bill(answer, "boreal")["stale_if_error"] == "circuit_open"
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_circuit_state", supplier="boreal") == 2


@pytest.mark.parametrize(
    "header",
    [
        "no-store, max-age=60",
        "no-cache, max-age=60",
        "max-age=60, private",
        'private="Set-Cookie", max-age=60',
        "public",
        "max-age=soon",
        "max-age=60, max-age=30",
        "max-age=60,,;",
    ],
)
async def test_what_the_supplier_forbids_is_never_stored(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers, header: str
) -> None:
    """A quote whose Cache-Control forbids storing it, or cannot be read, is asked every time."""
    suppliers.always("boreal", cacheable(header))
    client = await start_quoteflow(cache_size=10)
    for _ in range(2):
        answer = await ask(client)
        assert "age_s" not in quote_of(answer, "boreal")  # type: ignore[operator]
    assert suppliers.count("boreal") == 2


async def test_an_answer_that_varies_is_never_stored(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """``Vary: X-Request-ID``: every request of QuoteFlow's differs, so none may reuse it."""
    suppliers.always("boreal", cacheable("max-age=60", Vary="X-Request-ID"))
    client = await start_quoteflow(cache_size=10)
    for _ in range(2):
        answer = await ask(client)
        assert "age_s" not in quote_of(answer, "boreal")  # type: ignore[operator]
    assert suppliers.count("boreal") == 2


async def test_a_non_200_answer_is_never_stored(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A 404 carrying max-age is not reused: the next request asks again."""
    suppliers.always("boreal", status(404, headers={"Cache-Control": "max-age=60"}))
    client = await start_quoteflow(cache_size=10)
    for _ in range(2):
        answer = await ask(client)
        assert {"supplier": "boreal", "code": "http_404"} in answer["failures"]
    assert suppliers.count("boreal") == 2


async def test_a_cache_of_10_under_1000_skus_holds_10(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """1,000 distinct SKUs through a cache of 10: 10 entries, the newest kept, the oldest gone."""
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, cacheable("max-age=60"))
    client = await start_quoteflow(cache_size=10, budget=2.0)  # no slot wait may time out

    async def worker(first: int) -> None:
        for n in range(first, 1000, 8):
            response = await client.post("/api/quotes", json={"sku": f"SKU-{n}"})
            assert response.status == 200

    await asyncio.gather(*(worker(first) for first in range(8)))
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_cache_entries") == 10
    sent = len(suppliers.received)
    assert sent == 3000  # no SKU asked twice: nothing from the cache
    await ask(client, sku="NEWEST")
    again = await ask(client, sku="NEWEST")
    assert all("age_s" in q for q in again["quotes"])
    oldest = await ask(client, sku="SKU-0")
    assert not any("age_s" in q for q in oldest["quotes"])
    assert len(suppliers.received) == sent + 6


async def test_cache_and_coalescing_together(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """8 identical requests share one call each; the one after them is answered from the cache."""
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, delay(0.1, cacheable("max-age=60")))
    client = await start_quoteflow(cache_size=10, coalesce=True)
    answers = await asyncio.gather(*(ask(client) for _ in range(8)))
    assert all(len(a["quotes"]) == 2 and a["failures"] == [] for a in answers)
    assert len(suppliers.received) == 3
    after = await ask(client)
    assert all("age_s" in q for q in after["quotes"])
    assert len(suppliers.received) == 3


# -- Cache-Control, read as a shared cache reads it --------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("max-age=10", Freshness(10, 0)),
        (" , max-age=10, ", Freshness(10, 0)),  # empty list elements are allowed
        ("public,max-age=10", Freshness(10, 0)),
        ("max-age=10 stale-if-error=20", None),  # no comma between them
        ("Max-Age=10, Stale-If-Error=20", Freshness(10, 20)),
        ('max-age="10"', Freshness(10, 0)),
        ("max-age=600, stale-if-error=600", Freshness(30, 30)),  # both capped
        ("max-age=60, s-maxage=5, stale-if-error=20", Freshness(5, 0)),  # shared: s-maxage wins
        ("max-age=10, must-revalidate, stale-if-error=20", Freshness(10, 0)),
        ("max-age=10, proxy-revalidate, stale-if-error=20", Freshness(10, 0)),
        ("max-age=10, stale-if-error=-1", Freshness(10, 0)),
        ("max-age=0, stale-if-error=5", Freshness(0, 5)),
        ("max-age=0", None),
        ("max-age=" + "9" * 5000, Freshness(30, 0)),  # past int()'s digit limit: 2^31 s, capped
        ("max-age=-1", None),
        ("max-age=1.5", None),
        ("max-age=١٠", None),  # Unicode digits are not delta-seconds
        ("stale-if-error=5", None),
        ("no-store", None),
        ("", None),
        (None, None),
    ],
)
def test_freshness_from_cache_control(header: str | None, expected: Freshness | None) -> None:
    """Each Cache-Control header gives the fresh and stale times RFC 9111 and RFC 5861 allow."""
    assert freshness(header, cap=30) == expected


def _quote(sku: str) -> SupplierQuote:
    return SupplierQuote(
        supplier="boreal",
        sku=sku,
        unit_cents=1100,
        shipping_cents=250,
        stock=50,
        cache_control="max-age=60",
    )


def test_memory_stays_bounded_under_100000_distinct_skus() -> None:
    """100,000 distinct SKUs through a cache of 1,000: its memory is that of 1,000 entries."""
    cache = QuoteCache(1000, 30)
    quotes = [_quote(f"SKU-{n:06d}") for n in range(100_000)]
    tracemalloc.start()
    try:
        for quote_ in quotes[:10_000]:
            cache.keep(("boreal", quote_.sku, "normal", 0), quote_)
        early, _ = tracemalloc.get_traced_memory()
        for quote_ in quotes[10_000:]:
            cache.keep(("boreal", quote_.sku, "normal", 0), quote_)
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(cache) == 1000
    assert late < early * 1.05  # 90,000 SKUs later: entries replaced, nothing added
    assert late < 1000 * 500  # the cache's own bytes per entry (the quotes were made before)


def test_an_answer_without_the_cache_is_the_same_bytes() -> None:
    """``age_s`` is written only for a quote from the cache, as the quote's last key."""
    fresh = RankedQuote.for_quantity(_quote("KB-001"), 2)
    aged = RankedQuote.for_quantity(attrs.evolve(_quote("KB-001"), age_s=4.208), 2)
    result = QuoteResult(
        sku="KB-001",
        quantity=2,
        quotes=(fresh,),
        failures=(Failure("cedar", "timeout"),),
        elapsed_ms=1.5,
        request_id="r1",
        currency="USD",
    )
    quote = (
        b'{"supplier":"boreal","sku":"KB-001","unit_cents":1100,"shipping_cents":250,'
        b'"stock":50,"total_cents":2450'
    )
    tail = b'"failures":[{"supplier":"cedar","code":"timeout"}],'
    assert to_json(encode_result(result)) == (
        b'{"sku":"KB-001","quantity":2,"currency":"USD","quotes":[' + quote + b"}],"
        + tail + b'"best":' + quote + b'},"elapsed_ms":1.5,"request_id":"r1"}'
    )  # fmt: skip
    with_age = to_json(encode_result(attrs.evolve(result, quotes=(aged,))))
    assert with_age.count(quote + b',"age_s":4.208}') == 2  # in quotes and in best
