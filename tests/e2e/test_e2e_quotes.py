"""Every scenario and every injectable fault, through QuoteFlow's HTTP API, as real processes.

Each case switches faults on in the lab, asks QuoteFlow once, and checks the
failure codes in the answer and how many requests boreal received for that
request id according to the lab's ``/stats``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from provider_lab.control_client import LabControl
from provider_lab.faults import Kind
from tests.conftest import LOADED_MARGIN
from tests.e2e.conftest import (
    BUDGET_S,
    INBOUND_LIMIT,
    OUTBOUND_LIMIT,
    Pair,
    ask_quoteflow,
    wait_unpaused,
)

BOREAL_QUOTE = {
    "supplier": "boreal",
    "sku": "KB-001",
    "unit_cents": 1100,
    "shipping_cents": 250,
    "stock": 50,
    "total_cents": 2450,
}
ON_BUDGET_S = BUDGET_S + 0.1
"""A hanging supplier must not delay the answer by more than this."""


async def test_normal_boreal_is_best_and_cedar_filtered(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """Quantity 2: boreal best at 2450, atlas second, cedar filtered out; one request each."""
    asked = await ask_quoteflow(session, pair, lab)
    assert asked.status == 200
    assert asked.body["best"] == BOREAL_QUOTE
    assert asked.quoted == ["boreal", "atlas"]
    assert asked.failures == {}
    assert asked.attempts == {"atlas": 1, "boreal": 1, "cedar": 1}


async def test_quantity_one_makes_cedar_best(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """Quantity 1: cedar is best at 1100."""
    asked = await ask_quoteflow(session, pair, lab, quantity=1)
    assert asked.body["best"]["supplier"] == "cedar"
    assert asked.body["best"]["total_cents"] == 1100


async def test_slow_is_timeout_on_budget(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """``slow``: boreal is ``timeout``, the others are kept, the answer comes on budget."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    asked = await ask_quoteflow(session, pair, lab, scenario="slow")
    elapsed = loop.time() - started
    assert asked.failures == {"boreal": "timeout"}
    assert asked.quoted == ["atlas"]
    assert BUDGET_S * 0.9 <= elapsed < ON_BUDGET_S + LOADED_MARGIN


async def test_broken_is_503_after_two_attempts(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """``broken``: two attempts, then ``http_503``."""
    asked = await ask_quoteflow(session, pair, lab, scenario="broken")
    assert asked.failures == {"boreal": "http_503"}
    assert asked.attempts["boreal"] == 2


async def test_malformed_is_invalid_data_after_one_attempt(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """``malformed``: ``invalid_data`` after one attempt; the others' quotes stay."""
    asked = await ask_quoteflow(session, pair, lab, scenario="malformed")
    assert asked.failures == {"boreal": "invalid_data"}
    assert asked.attempts == {"atlas": 1, "boreal": 1, "cedar": 1}
    assert asked.quoted == ["atlas"]


async def test_flaky_recovers_on_the_second_attempt_with_the_same_id(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """``flaky``: boreal's quote after exactly two attempts carrying the same request id."""
    asked = await ask_quoteflow(session, pair, lab, scenario="flaky")
    assert asked.failures == {}
    assert asked.body["best"] == BOREAL_QUOTE
    assert asked.attempts["boreal"] == 2
    headers = (await lab.stats())["headers"][asked.body["request_id"]]
    boreal = [h for h in headers if h["supplier"] == "boreal"]
    assert [h["x_attempt"] for h in boreal] == ["1", "2"]
    remaining = [int(h["x_deadline_remaining_ms"]) for h in boreal]
    assert BUDGET_S * 1000 >= remaining[0] > remaining[1] >= 0


FAULT_CASES: list[tuple[str, list[dict[str, Any]], str | None, int]] = [
    # (case id, faults queued on boreal, expected code or None for a quote, boreal requests)
    ("http_404", [{"kind": "http_404"}], "http_404", 1),
    ("http_429", [{"kind": "http_429", "retry_after": 1}], "http_429", 1),
    ("http_500", [{"kind": "http_500"}], "http_500", 1),
    ("http_503 always", [{"kind": "http_503"}], "http_503", 2),
    ("http_503 once", [{"kind": "http_503", "count": 1}], None, 2),
    ("http_503 big bodies", [{"kind": "http_503", "size": 300_000}], "http_503", 2),
    ("http_status 302", [{"kind": "http_status", "status": 302}], "http_302", 1),
    ("http_status 502", [{"kind": "http_status", "status": 502}], "http_502", 1),
    ("bad_gzip", [{"kind": "bad_gzip"}], "invalid_data", 1),
    ("gzip_bomb", [{"kind": "gzip_bomb"}], "invalid_data", 1),
    ("oversized", [{"kind": "oversized"}], "invalid_data", 1),
    ("truncated once", [{"kind": "truncated", "count": 1}], None, 2),
    ("truncated always", [{"kind": "truncated"}], "transport_error", 2),
    ("reset once", [{"kind": "reset", "count": 1}], None, 2),
    ("reset always", [{"kind": "reset"}], "transport_error", 2),
    ("reset mid_body once", [{"kind": "reset", "variant": "mid_body", "count": 1}], None, 2),
    ("close once", [{"kind": "close", "count": 1}], None, 2),
    ("close always", [{"kind": "close"}], "transport_error", 2),
    ("not_http", [{"kind": "not_http"}], "invalid_data", 1),
    ("latency in budget", [{"kind": "latency", "ms": 100}], None, 1),
    ("slow_body in budget", [{"kind": "slow_body", "ms": 50}], None, 1),
    ("wrong_content_type", [{"kind": "wrong_content_type"}], None, 1),
    ("blip", [{"kind": "blip", "probability": 1.0}], None, 2),
    (
        "503 then bad data",
        [{"kind": "http_503", "count": 1}, {"kind": "wrong_types", "count": 1}],
        "invalid_data",
        2,
    ),
    (
        "truncated then 503",
        [{"kind": "truncated", "count": 1}, {"kind": "http_503", "count": 1}],
        "http_503",
        2,
    ),
    ("503 then reset", [{"kind": "http_503", "count": 1}, {"kind": "reset"}], "transport_error", 2),
]
NOT_JSON = ["html", "text", "empty", "array", "null", "partial"]
WRONG_TYPES = ["string", "bool", "float", "integral_float", "null", "nan", "huge"]
FAULT_CASES += [
    (f"not_json {v}", [{"kind": "not_json", "variant": v}], "invalid_data", 1) for v in NOT_JSON
]
FAULT_CASES += [
    (f"wrong_types {f} {v}", [{"kind": "wrong_types", "field": f, "variant": v}], "invalid_data", 1)
    for f, v in [("unit_cents", v) for v in WRONG_TYPES] + [("stock", "string")]
]
FAULT_CASES += [
    (f"negative {f}", [{"kind": "negative", "field": f}], "invalid_data", 1)
    for f in ("unit_cents", "shipping_cents", "stock")
]
FAULT_CASES += [
    (f"missing_key {f}", [{"kind": "missing_key", "field": f}], "invalid_data", 1)
    for f in ("supplier", "sku", "unit_cents", "shipping_cents", "stock")
]
FAULT_CASES += [
    (kind, [{"kind": kind}], "invalid_data", 1)
    for kind in ("extra_key", "duplicate_key", "wrong_supplier", "wrong_sku")
]


@pytest.mark.parametrize(
    ("faults", "code", "requests"),
    [pytest.param(f, c, n, id=name) for name, f, c, n in FAULT_CASES],
)
async def test_fault_gives_the_contract_code_and_attempts(
    session: aiohttp.ClientSession,
    pair: Pair,
    lab: LabControl,
    faults: list[Mapping[str, object]],
    code: str | None,
    requests: int,
) -> None:
    """A fault on boreal gives the decision table's code after the right number of requests.

    A 429 with ``Retry-After`` also pauses boreal until then: the next request
    is ``rate_limited`` without asking it (and the next case waits it out).
    """
    await wait_unpaused(session, pair)
    for fault in faults:
        await lab.add_fault("boreal", fault)
    asked = await ask_quoteflow(session, pair, lab)
    assert asked.status == 200
    if code is None:
        assert asked.failures == {}
        assert asked.body["best"] == BOREAL_QUOTE
    else:
        assert asked.failures == {"boreal": code}
        assert asked.quoted == ["atlas"]
    assert asked.attempts == {"atlas": 1, "boreal": requests, "cedar": 1}
    if any(f["kind"] == "http_429" and f.get("retry_after") for f in faults):
        await lab.clear_faults()
        paused = await ask_quoteflow(session, pair, lab)
        assert paused.failures == {"boreal": "rate_limited"}
        assert paused.attempts == {"atlas": 1, "boreal": 0, "cedar": 1}
        await wait_unpaused(session, pair)


TIMEOUT_FAULTS: list[dict[str, Any]] = [
    {"kind": "hang"},
    {"kind": "latency", "ms": 2000},
    {"kind": "slow_body", "ms": 2000},
]


@pytest.mark.parametrize("fault", TIMEOUT_FAULTS, ids=[f["kind"] for f in TIMEOUT_FAULTS])
async def test_no_answer_within_budget_is_timeout_on_budget(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl, fault: Mapping[str, object]
) -> None:
    """A supplier that does not finish in time is ``timeout``; the reply still comes on budget."""
    await lab.add_fault("boreal", fault)
    loop = asyncio.get_running_loop()
    started = loop.time()
    asked = await ask_quoteflow(session, pair, lab)
    elapsed = loop.time() - started
    assert asked.failures == {"boreal": "timeout"}
    assert asked.quoted == ["atlas"]
    assert elapsed < ON_BUDGET_S + LOADED_MARGIN  # and the lab seeing the hang-up
    assert asked.body["elapsed_ms"] < ON_BUDGET_S * 1000


async def test_every_supplier_failing_still_answers_200(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """All three suppliers failing differently: 200, no best, codes in supplier order."""
    await lab.add_fault("atlas", {"kind": "http_500"})
    await lab.add_fault("boreal", {"kind": "reset"})
    await lab.add_fault("cedar", {"kind": "extra_key"})
    asked = await ask_quoteflow(session, pair, lab)
    assert asked.status == 200
    assert asked.body["best"] is None
    assert asked.body["failures"] == [
        {"supplier": "atlas", "code": "http_500"},
        {"supplier": "boreal", "code": "transport_error"},
        {"supplier": "cedar", "code": "invalid_data"},
    ]
    assert asked.attempts == {"atlas": 1, "boreal": 2, "cedar": 1}


@pytest.mark.parametrize("sku", ["A&scenario=broken", "../x", "KB-999"])
async def test_unknown_skus_reach_suppliers_literally(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl, sku: str
) -> None:
    """A SKU with URL syntax reaches every supplier unchanged: three 404s, one request each."""
    asked = await ask_quoteflow(session, pair, lab, sku=sku)
    assert asked.failures == {s: "http_404" for s in ("atlas", "boreal", "cedar")}
    assert asked.attempts == {"atlas": 1, "boreal": 1, "cedar": 1}


async def test_lab_wide_latency_is_waited_for(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """The lab's added latency within the budget delays, but does not fail, the answer."""
    await lab.set_latency(100)
    asked = await ask_quoteflow(session, pair, lab)
    assert asked.failures == {}
    assert asked.body["elapsed_ms"] >= 95


async def test_outbound_attempts_never_exceed_the_limit(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """Eight requests at once (24 supplier calls) never put more than 6 attempts on the wire."""
    await lab.set_latency(40)
    results = await asyncio.gather(
        *(ask_quoteflow(session, pair, lab) for _ in range(INBOUND_LIMIT))
    )
    assert [r.status for r in results] == [200] * INBOUND_LIMIT
    assert all(r.failures == {} for r in results)
    stats = await lab.stats()
    assert 3 <= stats["max_active"] <= OUTBOUND_LIMIT  # the limit is reached, never passed
    assert stats["total"] == 3 * INBOUND_LIMIT


async def test_inbound_capacity_rejects_at_once(
    session: aiohttp.ClientSession, pair: Pair, lab: LabControl
) -> None:
    """Beyond the inbound limit, requests get 503 ``capacity_exhausted`` at once, not queued."""
    for supplier in ("atlas", "boreal", "cedar"):
        await lab.add_fault(supplier, {"kind": "hang"})
    loop = asyncio.get_running_loop()

    async def timed() -> tuple[int, float]:
        started = loop.time()
        async with session.post(f"{pair.service_url}/api/quotes", json={}) as response:
            await response.read()
            return response.status, loop.time() - started

    results = await asyncio.gather(*(timed() for _ in range(INBOUND_LIMIT + 4)))
    rejected = [elapsed for status, elapsed in results if status == 503]
    assert len(rejected) == 4
    assert max(rejected) < BUDGET_S / 2
    assert sorted(status for status, _ in results).count(200) == INBOUND_LIMIT


def test_every_fault_kind_is_covered() -> None:
    """Every kind the lab can inject appears in these end-to-end cases."""
    covered = {f["kind"] for _, faults, _, _ in FAULT_CASES for f in faults}
    covered |= {f["kind"] for f in TIMEOUT_FAULTS}
    assert sorted(set(Kind) - covered) == []
