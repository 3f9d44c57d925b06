"""``--coalesce``: identical supplier calls in flight are shared, each waiter on its deadline."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from quoteflow.app import SUPPLIER_CLIENT, create_app
from quoteflow.coalesce import CoalescingGateway
from quoteflow.config import Settings
from quoteflow.handlers import SERVICE
from quoteflow.models import (
    TIMEOUT,
    AttemptRecord,
    Failure,
    MovingDeadline,
    QuoteReport,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.service import Lineup, QuoteService
from tests.conftest import TEST_CONNECT_TIMEOUT
from tests.fakes import FakeSuppliers, delay, first_time_per_request_id, hang, quote, status
from tests.test_observability import events, metric

Client = TestClient[Any, Any]

SUPPLIERS = ("atlas", "boreal", "cedar")


@pytest.fixture
def start(aiohttp_client: AiohttpClient, suppliers: FakeSuppliers) -> Any:
    """QuoteFlow with ``--coalesce``; a caller hanging up cancels its handler, as in production."""

    async def start(**overrides: Any) -> Client:
        values: dict[str, Any] = {
            "budget": 0.5,
            "connect_timeout": TEST_CONNECT_TIMEOUT,
            "provider_url": suppliers.url,
            "coalesce": True,
        }
        values.update(overrides)
        return await aiohttp_client(
            create_app(Settings(**values)), server_kwargs={"handler_cancellation": True}
        )

    return start


async def ask(client: Client, request_id: str, **body: Any) -> dict[str, Any]:
    """One request with its budget bill, under a request id of the test's choosing."""
    response = await client.post(
        "/api/quotes?explain=1", json=body, headers={"X-Request-ID": request_id}
    )
    assert response.status == 200
    answer: dict[str, Any] = await response.json()
    return answer


def bill(answer: dict[str, Any], supplier: str) -> dict[str, Any]:
    """One supplier's part of the budget bill."""
    found: dict[str, Any] = answer["explain"]["suppliers"][supplier]
    return found


async def settled(client: Client) -> str:
    """The metrics once every shared call and slot is given back (or after a second)."""
    for _ in range(100):
        text = await (await client.get("/metrics")).text()
        if (
            metric(text, "quoteflow_coalesced_calls_in_flight") == 0
            and client.app[SUPPLIER_CLIENT].in_flight == 0
            and client.app[SERVICE].in_flight == 0
        ):
            return text
        await asyncio.sleep(0.01)
    raise AssertionError("a shared call or a slot was never given back")


async def joins(client: Client, supplier: str) -> float:
    """Requests that joined ``supplier``'s calls in flight so far (the joins metric)."""
    text = await (await client.get("/metrics")).text()
    return metric(text, "quoteflow_coalesced_joins_total", supplier=supplier)


def shared_tasks() -> list[asyncio.Task[Any]]:
    """Shared calls still running as tasks of their own."""
    return [
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") == "CoalescingGateway._run"
    ]


async def test_identical_requests_reach_each_supplier_once(
    start: Any, suppliers: FakeSuppliers, caplog: pytest.LogCaptureFixture
) -> None:
    """8 identical requests at once, 100 ms suppliers: one call each, eight full answers."""
    caplog.set_level(logging.INFO, logger="quoteflow")
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.1))
    client = await start()
    # The quantity is QuoteFlow's to price: requests for 1 and 2 units share the call.
    answers = await asyncio.gather(*(ask(client, f"r{n}", quantity=1 + n % 2) for n in range(8)))
    assert [suppliers.count(supplier) for supplier in SUPPLIERS] == [1, 1, 1]
    for n, answer in enumerate(answers):
        assert answer["failures"] == []
        expected = ["cedar", "boreal", "atlas"] if n % 2 == 0 else ["boreal", "atlas"]
        assert [q["supplier"] for q in answer["quotes"]] == expected
    starter = suppliers.of("atlas")[0].request_id
    for answer in answers:
        for supplier in SUPPLIERS:
            part = bill(answer, supplier)
            if answer["request_id"] == starter:
                assert [a["outcome"] for a in part["attempts"]] == ["ok"]
                assert "joined" not in part
            else:
                assert part == {"attempts": [], "stopped": "joined", "joined": starter}
    shared = sorted(
        (event["request_id"], event["shared"]) for event in events(caplog, "quote_request")
    )
    joined = dict.fromkeys(SUPPLIERS, f"joined:{starter}")
    assert shared == sorted((f"r{n}", {} if f"r{n}" == starter else joined) for n in range(8))
    text = await settled(client)
    for supplier in SUPPLIERS:
        assert metric(text, "quoteflow_coalesced_joins_total", supplier=supplier) == 7
        attempts = {"supplier": supplier, "attempt": "1", "outcome": "ok"}
        assert metric(text, "quoteflow_supplier_attempts_total", **attempts) == 1


async def test_a_joiner_whose_deadline_comes_first_is_timeout_alone(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """Boreal answers at 0.85 s: the two requests whose deadlines came first time out, alone.

    The starter's deadline comes at 0.6 s, the first joiner's at 0.65 s; the
    call goes on for the second joiner (deadline 1.1 s), which gets the quote
    and the call's bill, handed over to it when the starter left. Each side
    of the answer has 0.2 s or more for a loaded machine's lateness.
    """
    suppliers.always("boreal", delay(0.85))
    client = await start(budget=0.6)

    async def later(seconds: float, request_id: str) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return await ask(client, request_id)

    starter, first, second = await asyncio.gather(
        ask(client, "starter"), later(0.05, "first"), later(0.5, "second")
    )
    assert suppliers.count("boreal") == 1
    assert {"supplier": "boreal", "code": "timeout"} in starter["failures"]
    assert {"supplier": "boreal", "code": "timeout"} in first["failures"]
    assert second["failures"] == []
    assert second["best"]["supplier"] == "boreal"
    assert bill(starter, "boreal") == {
        "attempts": [],
        "stopped": "deadline",
        "handed_over": "second",
    }
    assert bill(first, "boreal") == {"attempts": [], "stopped": "deadline", "joined": "starter"}
    owner = bill(second, "boreal")
    assert [a["outcome"] for a in owner["attempts"]] == ["ok"]
    assert (owner["stopped"], owner["joined"]) == ("success", "starter")
    await settled(client)


async def test_the_starter_hanging_up_costs_the_joiners_nothing(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """The starter's caller leaves mid-call: the joiners get full answers; nothing is left.

    The starter's caller hangs up once both joiners have joined every
    supplier's call (``quoteflow_coalesced_joins_total``), not at a fixed
    time: a loaded machine once let it leave before they came, and they
    rightly started calls of their own.
    """
    for supplier in SUPPLIERS:
        suppliers.always(supplier, delay(0.5))
    client = await start(budget=1.0)

    async def joined() -> bool:
        return all([await joins(client, supplier) == 2 for supplier in SUPPLIERS])

    async def hang_up() -> None:
        starter = asyncio.create_task(client.post("/api/quotes", json={}))
        while not await joined():
            assert not starter.done(), "the shared calls ended before both joiners came"
            await asyncio.sleep(0.01)
        starter.cancel()  # the connection is closed mid-call
        with pytest.raises(asyncio.CancelledError):
            await starter

    async def join(request_id: str) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return await ask(client, request_id)

    _, *joiners = await asyncio.gather(hang_up(), join("j1"), join("j2"))
    assert [suppliers.count(supplier) for supplier in SUPPLIERS] == [1, 1, 1]
    for answer in joiners:
        assert answer["failures"] == []
        assert [q["supplier"] for q in answer["quotes"]] == ["boreal", "atlas"]
    # The call was handed to one of them; its bill holds the attempt.
    owners = [a for a in joiners if bill(a, "boreal")["attempts"]]
    assert len(owners) == 1
    text = await settled(client)
    assert metric(text, "quoteflow_caller_disconnects_total") == 1
    assert shared_tasks() == []
    assert suppliers.in_flight == 0


async def test_flaky_through_a_shared_call(start: Any, suppliers: FakeSuppliers) -> None:
    """Boreal's 503 comes once, to the shared call: one retry, and a quote for every request."""
    suppliers.always(
        "boreal", first_time_per_request_id(delay(0.1, status(503)), delay(0.1, quote()))
    )
    client = await start(budget=1.0)
    answers = await asyncio.gather(*(ask(client, f"r{n}") for n in range(4)))
    assert suppliers.count("boreal") == 2
    assert len({r.request_id for r in suppliers.of("boreal")}) == 1  # the starter's id, twice
    for answer in answers:
        assert answer["failures"] == []
        assert answer["best"]["supplier"] == "boreal"
    outcomes = sorted(
        [a["outcome"] for a in bill(answer, "boreal")["attempts"]] for answer in answers
    )
    assert outcomes == [[], [], [], ["http_503", "ok"]]
    text = await settled(client)
    assert metric(text, "quoteflow_retries_total", supplier="boreal", reason="http_503") == 1


async def test_the_breaker_learns_from_each_shared_call_once(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """Four requests share one failing call: one failure for the breaker, not four."""
    suppliers.always("boreal", delay(0.1, status(500)))
    client = await start(breaker_failures=2)
    await asyncio.gather(*(ask(client, f"a{n}") for n in range(4)))
    assert metric(await settled(client), "quoteflow_circuit_state", supplier="boreal") == 0
    await asyncio.gather(*(ask(client, f"b{n}") for n in range(4)))
    assert metric(await settled(client), "quoteflow_circuit_state", supplier="boreal") == 2
    assert suppliers.count("boreal") == 2


async def test_a_shared_call_to_a_hanging_supplier_counts_as_its_timeout(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """The last waiter cancels the call and takes its cut-off attempt: the breaker opens."""
    suppliers.always("boreal", hang())
    client = await start(budget=0.3, breaker_failures=2, read_timeout=5.0)
    for round_ in range(2):
        answers = await asyncio.gather(*(ask(client, f"{round_}-{n}") for n in range(3)))
        timed_out = [bill(a, "boreal") for a in answers if bill(a, "boreal")["attempts"]]
        assert len(timed_out) == 1
        assert [a["outcome"] for a in timed_out[0]["attempts"]] == ["timeout"]
        await settled(client)
    answer = await ask(client, "after")
    assert {"supplier": "boreal", "code": "circuit_open"} in answer["failures"]
    assert suppliers.count("boreal") == 2
    assert shared_tasks() == []


async def test_a_retry_is_planned_on_the_longest_deadline_of_those_waiting(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """Boreal's 503 comes too late for the starter's budget, not for a joiner's: it is retried.

    The 503 comes 0.3 s before the starter's deadline (a 0.6 s budget), as the
    attempt states it: the starter alone would have 0.3 s left, not enough
    for the backoff and another attempt as long as the first; the joiner,
    250 ms later, has 0.55 s, enough for the 30 ms backoff and 0.3 s with
    room for a loop late by 100 ms (lateness counts twice: the first attempt
    looks longer and less is left; seen: no retry with the joiner 150 ms
    later, in a quiet fresh run). The 503 also waits until the joiner has
    joined (the joins metric): on a loaded machine a call may arrive late, or
    the joiner only after a 503 sent at a fixed time (seen beside stress-ng).
    """
    joined = asyncio.Event()

    async def late_503(request: web.Request) -> web.StreamResponse:
        due = time.monotonic() + int(request.headers["X-Deadline-Remaining-Ms"]) / 1000 - 0.3
        await joined.wait()
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        return await status(503)(request)

    suppliers.script("boreal", late_503)
    client = await start(budget=0.6)

    async def join() -> dict[str, Any]:
        await asyncio.sleep(0.25)
        asking = asyncio.create_task(ask(client, "joiner"))
        while True:
            # Done without joining: it came too late to join (and fails below).
            if await joins(client, "boreal") >= 1 or asking.done():
                break
            await asyncio.sleep(0.005)
        joined.set()
        return await asking

    starter, joiner = await asyncio.gather(ask(client, "starter"), join())
    first, second = suppliers.of("boreal")
    assert first.request_id == second.request_id == "starter"
    # The retry is told the joiner's deadline, later than the starter's by its 250 ms.
    starters_left = int(first.headers["X-Deadline-Remaining-Ms"]) - (second.at - first.at) * 1000
    assert int(second.headers["X-Deadline-Remaining-Ms"]) >= starters_left + 100
    assert joiner["best"]["supplier"] == "boreal"
    assert starter["best"]["supplier"] == "boreal"
    outcomes = [a["outcome"] for a in bill(starter, "boreal")["attempts"]]
    assert outcomes == ["http_503", "ok"]


async def test_a_call_is_joined_only_within_its_starters_budget(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """Past the starter's deadline a hanging call takes no more joiners: the next starts anew."""
    suppliers.always("boreal", hang())
    client = await start(budget=0.3, read_timeout=5.0)

    async def later(seconds: float, request_id: str) -> dict[str, Any]:
        await asyncio.sleep(seconds)
        return await ask(client, request_id)

    answers = await asyncio.gather(ask(client, "s"), later(0.2, "j"), later(0.4, "late"))
    assert [r.request_id for r in suppliers.of("boreal")] == ["s", "late"]
    assert bill(answers[1], "boreal")["joined"] == "s"
    assert "joined" not in bill(answers[2], "boreal")
    await settled(client)
    assert shared_tasks() == []


async def test_a_joiner_with_a_shorter_deadline_than_the_starter_leaves_alone(
    start: Any, suppliers: FakeSuppliers
) -> None:
    """A request admitted with less budget left joins, times out at its deadline, alone.

    No caller can ask for a shorter budget over HTTP, so this one is sent to
    the app's own service, as the handler sends it, admitted as if 0.35 s of
    its 0.5 s budget were gone. The HTTP requests around it get boreal's quote.
    """
    suppliers.always("boreal", delay(0.3))
    client = await start(budget=0.5)
    service: QuoteService = client.app[SERVICE]

    async def short() -> QuoteReport:
        await asyncio.sleep(0.05)
        with service.admitted() as admitted_at:
            return await service.quote(QuoteRequest(), "short", admitted_at - 0.35)

    async def later() -> dict[str, Any]:
        await asyncio.sleep(0.1)
        return await ask(client, "later")

    starter, cut_short, joiner = await asyncio.gather(ask(client, "starter"), short(), later())
    assert suppliers.count("boreal") == 1
    assert Failure("boreal", "timeout") in cut_short.result.failures
    boreal = next(trace for trace in cut_short.traces if trace.supplier == "boreal")
    assert (boreal.joined, boreal.stopped, boreal.attempts) == ("starter", "deadline", [])
    for answer in (starter, joiner):
        assert answer["best"]["supplier"] == "boreal"
        assert answer["failures"] == []
    await settled(client)


class _BuggyCall:
    """A supplier call that raises a bug of ours after 50 ms (no HTTP server can)."""

    def __init__(self) -> None:
        self.calls = 0

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float | MovingDeadline,
    ) -> SupplierQuote | Failure:
        self.calls += 1
        await asyncio.sleep(0.05)
        raise RuntimeError("a bug in supplier handling")


async def test_a_bug_in_a_shared_call_reaches_every_waiter() -> None:
    """Each request waiting for the call sees the bug (a 500 for each); nothing is left running."""
    inner = _BuggyCall()
    coalescing = CoalescingGateway(inner)
    deadline = time.monotonic() + 1.0

    async def wait(request_id: str) -> BaseException | None:
        try:
            await coalescing.quote(SupplierTrace("boreal"), QuoteRequest(), request_id, deadline)
        except RuntimeError as exc:
            return exc
        return None

    raised = await asyncio.gather(wait("a"), wait("b"), wait("c"))
    assert inner.calls == 1
    assert all(isinstance(exc, RuntimeError) for exc in raised)
    assert coalescing.in_flight == 0
    assert shared_tasks() == []


class _SlowToWindUp:
    """A supplier call that hangs, and when cancelled takes 50 ms to put its cut-off attempt
    on the bill (no HTTP server can make the client's own wind-up last)."""

    def __init__(self) -> None:
        self.wound_up = asyncio.Event()

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float | MovingDeadline,
    ) -> SupplierQuote | Failure:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            trace.attempts.append(
                AttemptRecord(
                    attempt=1,
                    started=0.0,
                    slot_wait=0.0,
                    duration=0.0,
                    outcome=TIMEOUT,
                    status=None,
                )
            )
            self.wound_up.set()
            raise
        raise AssertionError("not reached")


async def test_a_caller_leaving_after_the_deadline_still_waits_for_the_call_to_wind_up() -> None:
    """Deadline, then the caller hangs up mid-wind-up: two cancellations; the cut-off attempt
    still reaches the bill before the request ends, and nothing is left running."""
    inner = _SlowToWindUp()
    service = QuoteService(
        CoalescingGateway(inner), Lineup(("boreal",)), budget=0.2, inbound_limit=8
    )
    admitted = time.monotonic()
    request = asyncio.ensure_future(service.quote(QuoteRequest(), "r1", admitted))
    await asyncio.sleep(0.2 + 0.01)  # the deadline has come; the call is winding up
    request.cancel()  # the caller hangs up now
    with pytest.raises(asyncio.CancelledError):
        await request
    assert inner.wound_up.is_set()  # the request ended only once the call had wound up
    assert shared_tasks() == []
