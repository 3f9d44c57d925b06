"""The circuit breaker, in process: when a supplier is skipped, probed and asked again."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from quoteflow.app import SUPPLIER_CLIENT, create_app
from quoteflow.breaker import JITTER
from quoteflow.config import Settings
from quoteflow.handlers import SERVICE
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT
from tests.fakes import (
    FakeSuppliers,
    Responder,
    delay,
    first_time_per_request_id,
    hang,
    quote,
    raw,
    status,
)
from tests.test_decision_table import ask, failure_of, quoted
from tests.test_limits import _quoteflow_tasks, gated
from tests.test_observability import events, metric

FAILURES = 3
OPEN = 0.2
"""Short open times keep the suite fast; the defaults (1 s, 10 s) are the contract's."""
LONG_OPEN = 5.0
"""For a test that needs the circuit still open a request later, whatever the machine's load."""


@pytest.fixture
async def quoteflow(aiohttp_client: AiohttpClient, suppliers: FakeSuppliers) -> Any:
    """Start QuoteFlow with a breaker that opens after 3 failures for 0.2 s at first."""

    async def start(**overrides: Any) -> TestClient[Any, Any]:
        values: dict[str, Any] = {
            "budget": TEST_BUDGET,
            "connect_timeout": TEST_CONNECT_TIMEOUT,
            "provider_url": suppliers.url,
            "breaker_failures": FAILURES,
            "breaker_open": OPEN,
            "breaker_open_max": 0.5,
        }
        values.update(overrides)
        # As in production (cli.py): a caller that hangs up cancels its fan-out.
        return await aiohttp_client(
            create_app(Settings(**values)), server_kwargs={"handler_cancellation": True}
        )

    return start


async def explain(client: TestClient[Any, Any], **body: Any) -> dict[str, Any]:
    """One request with its budget bill."""
    response = await client.post("/api/quotes?explain=1", json={"quantity": 1, **body})
    assert response.status == 200
    answer: dict[str, Any] = await response.json()
    return answer


async def circuit(client: TestClient[Any, Any], supplier: str = "boreal") -> float:
    """The supplier's ``quoteflow_circuit_state``: 0 closed, 1 half-open, 2 open."""
    text = await (await client.get("/metrics")).text()
    return metric(text, "quoteflow_circuit_state", supplier=supplier)


async def open_boreal(client: TestClient[Any, Any], suppliers: FakeSuppliers) -> None:
    """Fail boreal ``FAILURES`` requests in a row, so that its circuit opens."""
    suppliers.always("boreal", status(503))
    for _ in range(FAILURES):
        assert failure_of(await ask(client), "boreal") == "http_503"
    assert await circuit(client) == 2


async def test_opens_after_failures_in_a_row_and_stops_asking(
    quoteflow: Any, suppliers: FakeSuppliers, caplog: pytest.LogCaptureFixture
) -> None:
    """Three 503 outcomes open boreal's circuit: the fourth request does not reach boreal.

    Open for ``LONG_OPEN``, not the 0.2 s the half-open tests wait out: beside
    ``stress-ng`` a loop turn once outlasted 0.2 s between the third failure and
    the fourth request, which then found the circuit half-open and probed.
    """
    caplog.set_level(logging.INFO, logger="quoteflow")
    client = await quoteflow(breaker_open=LONG_OPEN, breaker_open_max=2 * LONG_OPEN)
    await open_boreal(client, suppliers)
    sent = suppliers.count("boreal")

    body = await explain(client)
    assert body["failures"] == [{"supplier": "boreal", "code": "circuit_open"}]
    assert quoted(body) == ["cedar", "atlas"]
    assert body["explain"]["suppliers"]["boreal"] == {"attempts": [], "stopped": "circuit_open"}
    assert suppliers.count("boreal") == sent

    (opened,) = events(caplog, "circuit_opened")
    assert opened["supplier"] == "boreal"
    assert opened["streak"] == FAILURES
    assert round(LONG_OPEN * JITTER[0], 3) <= opened["open_s"] <= round(LONG_OPEN * JITTER[1], 3)
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_circuit_transitions_total", supplier="boreal", to="open") == 1
    assert metric(text, "quoteflow_circuit_open_answers_total", supplier="boreal") == 1
    assert metric(text, "quoteflow_circuit_state", supplier="atlas") == 0


async def test_a_quote_starts_the_streak_again(quoteflow: Any, suppliers: FakeSuppliers) -> None:
    """Two failures, a quote, two failures: never three in a row, so boreal is always asked."""
    client = await quoteflow()
    for responder in (status(503), status(503), quote(), status(503), status(503)):
        suppliers.always("boreal", responder)
        await ask(client)
    assert await circuit(client) == 0
    assert failure_of(await ask(client), "boreal") == "http_503"  # the third in a row
    assert await circuit(client) == 2


def entering(entered: asyncio.Event, then: Responder) -> Responder:
    """``then``, after setting ``entered``: the test learns a request arrived."""

    async def respond(request: Any) -> Any:
        entered.set()
        return await then(request)

    return respond


async def test_half_open_sends_one_probe_and_its_quote_closes_the_circuit(
    quoteflow: Any, suppliers: FakeSuppliers, caplog: pytest.LogCaptureFixture
) -> None:
    """After the open time one request probes; the others meanwhile get circuit_open at once."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    client = await quoteflow(budget=2.0)
    await open_boreal(client, suppliers)
    gate, entered = asyncio.Event(), asyncio.Event()
    suppliers.always("boreal", gated(gate, entered))
    await asyncio.sleep(OPEN + 0.05)
    sent = suppliers.count("boreal")

    probe = asyncio.create_task(explain(client))
    await entered.wait()
    assert await circuit(client) == 1
    others = await asyncio.gather(*(explain(client) for _ in range(3)))
    assert [failure_of(body, "boreal") for body in others] == ["circuit_open"] * 3
    assert suppliers.count("boreal") == sent + 1  # one probe in flight, no more

    gate.set()
    assert quoted(await probe) == ["cedar", "boreal", "atlas"]
    assert await circuit(client) == 0
    assert [e["probe"] for e in events(caplog, "circuit_closed")] == ["success"]
    assert quoted(await ask(client, quantity=1)) == ["cedar", "boreal", "atlas"]
    assert suppliers.count("boreal") == sent + 2


async def test_a_failed_probe_opens_the_circuit_for_longer_up_to_the_cap(
    quoteflow: Any, suppliers: FakeSuppliers, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed probe doubles the open time (0.2, 0.4, then the 0.5 s cap), with jitter."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    client = await quoteflow()
    await open_boreal(client, suppliers)
    for _ in range(2):
        opened_for = events(caplog, "circuit_opened")[-1]["open_s"]
        await asyncio.sleep(opened_for + 0.02)
        assert failure_of(await ask(client), "boreal") == "http_503"  # the probe
    reopened = events(caplog, "circuit_opened")
    assert [e["reopens"] for e in reopened] == [0, 1, 2]
    nominal = [OPEN, 2 * OPEN, 0.5]
    for event, seconds in zip(reopened, nominal, strict=True):
        # open_s is logged to the millisecond.
        assert round(seconds * JITTER[0], 3) <= event["open_s"] <= round(seconds * JITTER[1], 3)
    # Within the longer open time nobody probes.
    sent = suppliers.count("boreal")
    await asyncio.sleep(OPEN)
    assert failure_of(await ask(client), "boreal") == "circuit_open"
    assert suppliers.count("boreal") == sent


async def test_a_hanging_supplier_stops_costing_every_request_the_budget(
    quoteflow: Any, suppliers: FakeSuppliers
) -> None:
    """Once boreal's circuit opens, answers come at once with atlas and cedar."""
    suppliers.always("boreal", hang())
    client = await quoteflow(
        read_timeout=10.0, breaker_open=LONG_OPEN, breaker_open_max=2 * LONG_OPEN
    )
    for _ in range(FAILURES):
        assert failure_of(await ask(client), "boreal") == "timeout"
    started = time.monotonic()
    body = await ask(client, quantity=1)
    took = time.monotonic() - started
    assert quoted(body) == ["cedar", "atlas"]
    assert failure_of(body, "boreal") == "circuit_open"
    assert took < TEST_BUDGET / 2
    assert client.app[SUPPLIER_CLIENT].in_flight == 0


@pytest.mark.parametrize(
    ("responder", "code"),
    [
        pytest.param(status(404), "http_404", id="unknown-sku"),
        pytest.param(status(429), "http_429", id="too-many-requests"),
        pytest.param(raw(b"not a quote"), "invalid_data", id="invalid-data"),
        pytest.param(first_time_per_request_id(status(503)), None, id="flaky"),
        pytest.param(delay(0.1), None, id="slow-within-budget"),
    ],
)
async def test_never_trips_on_answers_or_recovered_retries(
    quoteflow: Any, suppliers: FakeSuppliers, responder: Responder, code: str | None
) -> None:
    """4xx, invalid data, a flaky supplier, a slow one: never circuit_open."""
    suppliers.always("boreal", responder)
    client = await quoteflow()
    for _ in range(3 * FAILURES):
        assert failure_of(await ask(client), "boreal") == code
    assert await circuit(client) == 0


async def test_a_timeout_before_anything_was_sent_does_not_count(
    quoteflow: Any, suppliers: FakeSuppliers
) -> None:
    """Calls held back by QuoteFlow's own share of slots never reached boreal: no failure.

    Four requests time out on a hanging boreal, but with a share of one slot
    only the first (and perhaps the next, handed the slot as the first one's
    deadline frees it) was ever sent: fewer than three failures, so the
    circuit stays closed.
    """
    suppliers.always("boreal", hang())
    client = await quoteflow(outbound_limit=3, read_timeout=10.0)  # share 1
    bodies = await asyncio.gather(*(ask(client) for _ in range(4)))
    assert [failure_of(body, "boreal") for body in bodies] == ["timeout"] * 4
    assert suppliers.count("boreal") < FAILURES
    assert await circuit(client) == 0


async def test_a_probe_whose_caller_leaves_hands_the_probe_on(
    quoteflow: Any, suppliers: FakeSuppliers
) -> None:
    """The probe's caller hangs up: nothing is learned, and the next request probes."""
    client = await quoteflow(budget=2.0, read_timeout=10.0)
    await open_boreal(client, suppliers)
    entered = asyncio.Event()
    suppliers.always("boreal", entering(entered, hang()))
    await asyncio.sleep(OPEN + 0.05)
    leaving = asyncio.create_task(client.post("/api/quotes", json={}))
    await entered.wait()
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    for _ in range(100):  # the server notices the hang-up on its next loop turns
        if not client.app[SERVICE].in_flight:
            break
        await asyncio.sleep(0.01)
    assert client.app[SERVICE].in_flight == 0
    assert await circuit(client) == 1

    assert not _quoteflow_tasks()  # the probe's fan-out ended with its caller

    suppliers.always("boreal", quote())
    assert quoted(await ask(client)) == ["boreal", "atlas"]
    assert await circuit(client) == 0
    assert client.app[SUPPLIER_CLIENT].in_flight == 0


async def test_breaker_off_asks_every_time(quoteflow: Any, suppliers: FakeSuppliers) -> None:
    """``breaker_failures=0``: boreal is asked on every request however often it fails."""
    suppliers.always("boreal", status(503))
    client = await quoteflow(breaker_failures=0)
    for _ in range(4 * FAILURES):
        assert failure_of(await ask(client), "boreal") == "http_503"
    assert suppliers.count("boreal") >= 4 * FAILURES
    text = await (await client.get("/metrics")).text()
    assert "quoteflow_circuit_state{" not in text
