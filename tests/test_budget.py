"""The lesson's budget bill: one deadline per request, retries inside it, nothing wedges."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from tests.asking import post
from tests.conftest import TEST_BUDGET, StartQuoteFlow
from tests.fakes import FakeSuppliers, Responder, before_the_deadline, delay, hang, quote, status
from tests.test_decision_table import ask, failure_of, quoted
from tests.test_observability import explain

MARGIN = 0.15
"""Generous slack for a loaded CI machine; the benchmark measures the real figure."""


async def timed_ask(client: Any, **body: Any) -> tuple[dict[str, Any], float]:
    """Ask and measure the wall time the caller saw."""
    started = time.monotonic()
    result = await ask(client, **body)
    return result, time.monotonic() - started


async def test_path_1_immediate_200_is_one_attempt(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Immediate 200: one attempt per supplier, no retry."""
    result = await ask(await start_quoteflow())
    assert quoted(result) == ["boreal", "atlas"]
    assert [suppliers.count(s) for s in ("atlas", "boreal", "cedar")] == [1, 1, 1]


async def test_path_2_503_then_200_after_a_short_backoff(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """503 then 200: the second attempt comes after the 20–30 ms jittered backoff."""
    suppliers.script("boreal", status(503))
    result = await ask(await start_quoteflow())
    assert result["best"]["supplier"] == "boreal"
    first, second = suppliers.of("boreal")
    assert 0.019 <= second.at - first.at <= 0.030 + MARGIN


async def test_path_3_503_twice_then_stop(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """503 then 503: http_503 after two attempts, answered long before the deadline."""
    suppliers.always("boreal", status(503))
    result, took = await timed_ask(await start_quoteflow())
    assert failure_of(result, "boreal") == "http_503"
    assert suppliers.count("boreal") == 2
    assert took < TEST_BUDGET


async def test_path_4_no_time_for_a_useful_second_attempt(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A 503 so late that backoff plus a useful attempt no longer fit: no second attempt.

    The lesson sleeps into the deadline and reports timeout; QuoteFlow sees the
    retry cannot finish and answers at once with the 503 it has. The 503 comes
    0.15 s before QuoteFlow's deadline (a second attempt as long as the first
    would need about 0.3 s): room for a loaded machine's late turns on its way.
    """
    suppliers.always("boreal", before_the_deadline(0.15, status(503)))
    result, took = await timed_ask(await start_quoteflow())
    assert failure_of(result, "boreal") == "http_503"
    assert suppliers.count("boreal") == 1
    assert took < TEST_BUDGET + MARGIN
    assert result["elapsed_ms"] < TEST_BUDGET * 1000


async def test_hanging_suppliers_answer_within_the_budget(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Every supplier hanging: all timeout, and the answer still comes at the deadline."""
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, hang())
    result, took = await timed_ask(await start_quoteflow(read_timeout=10.0))
    assert {f["code"] for f in result["failures"]} == {"timeout"}
    assert result["best"] is None
    assert TEST_BUDGET - 0.01 <= took < TEST_BUDGET + MARGIN


async def test_finished_suppliers_are_kept_when_one_hangs(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Atlas and cedar answered before the deadline: their quotes stay; boreal is timeout."""
    suppliers.always("boreal", hang())
    result = await ask(await start_quoteflow(read_timeout=10.0), quantity=1)
    assert quoted(result) == ["cedar", "atlas"]
    assert result["failures"] == [{"supplier": "boreal", "code": "timeout"}]


async def test_suppliers_do_not_wait_for_each_other(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Atlas is asked at once, while boreal is still between its two attempts."""
    suppliers.always("boreal", delay(0.05, status(503)))
    await ask(await start_quoteflow())
    atlas = suppliers.of("atlas")[0]
    assert atlas.at < suppliers.of("boreal")[0].at + 0.04


async def test_nothing_wedges_after_seconds_of_hanging_suppliers(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """After hanging and 503-with-a-large-body suppliers at the full inbound limit, all recover.

    The course's version loses pooled connections cancelled by the deadline and
    ends answering timeout for every supplier until it is restarted.
    """
    big_503 = status(503, body=b"x" * 300_000)
    suppliers.always("atlas", hang())
    suppliers.always("boreal", big_503)
    suppliers.always("cedar", delay(0.25))
    # The breaker off: this is about connections and slots coming back at once,
    # not after an open circuit's wait (tests/test_breaker.py has that).
    client = await start_quoteflow(
        budget=0.2, inbound_limit=8, outbound_limit=3, breaker_failures=0
    )
    loop_until = time.monotonic() + 2.0
    while time.monotonic() < loop_until:
        answered = await asyncio.gather(
            *(post(client, "/api/quotes", {"quantity": 1}) for _ in range(8))
        )
        assert {status for status, _ in answered} <= {200, 503}
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, quote())
    result = await ask(client, quantity=1)
    assert quoted(result) == ["cedar", "boreal", "atlas"]


async def test_the_fan_out_stops_early_enough_to_answer_within_the_budget(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """The fan-out ends ``answer_reserve`` before the budget, so the answer itself fits in it.

    A reserve of 0.1 s of a 0.4 s budget makes the difference far larger than
    any scheduling noise: a hanging boreal is given up at about 0.3 s, before
    the budget's end (0.4 s), whatever a loaded machine adds below that.
    """
    suppliers.always("boreal", hang())
    client = await start_quoteflow(budget=0.4, answer_reserve=0.1)
    result = await ask(client)
    assert failure_of(result, "boreal") == "timeout"
    assert quoted(result) == ["atlas"]
    assert 300 <= result["elapsed_ms"] < 400


def hog_the_loop(lead: float, turn: float, turns: int) -> Responder:
    """Hang; from ``lead`` before the deadline, make ``turns`` loop turns last ``turn`` s.

    The hog runs first in every turn it lasts (it schedules its next run
    before anything else of that turn can), then blocks the whole loop —
    QuoteFlow's too — so that the turns QuoteFlow takes can be counted in time.
    The deadline is read from the attempt's ``X-Deadline-Remaining-Ms``, not
    reckoned from when the call arrives: on a loaded machine the call may
    arrive tens of milliseconds after admission, and a hog timed from its
    arrival would start after the deadline it is meant to straddle.
    """

    async def respond(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        left = [turns]
        after = int(request.headers["X-Deadline-Remaining-Ms"]) / 1000 - lead

        def hog() -> None:
            left[0] -= 1
            if left[0]:
                loop.call_soon(hog)
            time.sleep(turn)  # on purpose: a loop turn that lasts

        loop.call_at(loop.time() + after, hog)
        return await hang()(request)

    return respond


async def test_the_deadline_cancels_each_supplier_call_in_the_next_loop_turn(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A cut-off call unwinds one loop turn after the deadline's, not two.

    Under load every loop turn is long, and each turn between the deadline
    and the answer makes the answer later. Here every turn lasts 80 ms from
    40 ms before the fan-out's deadline (0.4 s less the 5 ms reserve): the
    deadline's timer runs in the turn after that (about 40 ms late), and
    boreal's cut-off attempt unwinds in the next one, 2.5 turns (200 ms) past
    the deadline — the attempt's ``remaining_ms``. Had the timer cancelled the
    request's task, whose task group then cancels boreal's, it would unwind a
    turn later still: 3.5 turns.
    """
    turn = 0.08
    suppliers.script("boreal", hog_the_loop(lead=turn / 2, turn=turn, turns=6))
    body = await explain(await start_quoteflow(budget=0.4))
    assert failure_of(body, "boreal") == "timeout"
    (attempt,) = body["explain"]["suppliers"]["boreal"]["attempts"]
    assert attempt["outcome"] == "timeout"
    assert -3 * turn * 1000 < attempt["remaining_ms"] <= -2 * turn * 1000
