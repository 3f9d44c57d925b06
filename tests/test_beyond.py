"""Beyond the lesson: shares, retries that cannot finish, the retry budget, supplier signals."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import pytest

from quoteflow.app import SUPPLIER_CLIENT
from quoteflow.handlers import SERVICE
from quoteflow.retry import (
    RANK_EVERY,
    AnswerTimes,
    AttemptTimeEstimate,
    RetryBudget,
    retry_after_delay,
)
from tests.conftest import LOADED_MARGIN, TEST_BUDGET, StartQuoteFlow
from tests.fakes import (
    FakeSuppliers,
    before_the_deadline,
    delay,
    first_time_per_request_id,
    hang,
    quote,
    status,
)
from tests.process import quoteflow_process
from tests.test_decision_table import ask, failure_of
from tests.test_observability import explain, metric

# -- 1. one hanging supplier must not starve the others ---------------------------


async def test_hanging_supplier_cannot_starve_healthy_ones(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Full inbound load with boreal hanging: every admitted request keeps atlas and cedar."""
    suppliers.always("boreal", hang())
    client = await start_quoteflow(read_timeout=10.0)  # inbound 8, outbound 6, share 4
    responses = await asyncio.gather(
        *(client.post("/api/quotes", json={"quantity": 1}) for _ in range(12))
    )
    served = [await r.json() for r in responses if r.status == 200]
    assert len(served) == 8
    assert sorted(r.status for r in responses) == [200] * 8 + [503] * 4
    for result in served:
        assert [q["supplier"] for q in result["quotes"]] == ["cedar", "atlas"]
        assert result["failures"] == [{"supplier": "boreal", "code": "timeout"}]
    assert suppliers.max_in_flight_of["boreal"] == 4
    assert suppliers.max_in_flight <= 6


# -- 2. never start an attempt that cannot finish -----------------------------------


async def test_slow_503_is_not_retried_without_time_for_a_useful_attempt(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A supplier whose 503 took most of the budget is not retried with too little left.

    The 503 comes 0.3 s before the deadline, after an attempt of about 0.5 s:
    less is left than the backoff and another such attempt. It is timed from
    the deadline the attempt states, not from its arrival, which a loaded
    machine may delay (seen: a fixed 150 ms of a 0.3 s budget came too late).
    """
    suppliers.always("boreal", before_the_deadline(0.3, status(503)))
    budget = 0.8
    body = await explain(await start_quoteflow(budget=budget))
    assert failure_of(body, "boreal") == "http_503"
    assert suppliers.count("boreal") == 1
    assert body["explain"]["suppliers"]["boreal"]["stopped"] == "no_time"
    assert body["elapsed_ms"] < budget * 1000 - 80  # answered at once, not at the deadline


async def test_fast_503_is_still_retried(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A quick 503 early in the budget keeps the lesson's retry."""
    suppliers.always("boreal", status(503))
    body = await explain(await start_quoteflow())
    assert suppliers.count("boreal") == 2
    assert body["explain"]["suppliers"]["boreal"]["stopped"] == "attempts_exhausted"


def test_attempt_time_is_learned_and_never_below_the_floor() -> None:
    """The estimate follows the supplier's answer times, floored."""
    estimate = AttemptTimeEstimate(floor=0.05, memory=3.2)
    assert estimate.needed == 0.05
    for _ in range(50):
        estimate.observe(0.001)
    assert estimate.needed == 0.05
    for _ in range(50):
        estimate.observe(0.2)
    assert estimate.needed == 0.2


def test_one_slow_answer_does_not_refuse_later_retries() -> None:
    """A single outlier among fast answers leaves the estimate at the fast answers."""
    estimate = AttemptTimeEstimate(floor=0.05, memory=3.2)
    estimate.observe(0.7)
    assert estimate.needed == 0.7  # all we know so far
    for _ in range(3):
        estimate.observe(0.001)
    assert estimate.needed == 0.05


async def test_fast_503_after_one_slow_answer_is_still_retried(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A cold start with one slow answer does not cost the next flaky requests their retry."""
    suppliers.script("boreal", delay(0.2))
    client = await start_quoteflow(budget=0.5)
    await ask(client)
    suppliers.always("boreal", first_time_per_request_id(status(503)))
    results = [await ask(client) for _ in range(4)]
    assert all(r["best"]["supplier"] == "boreal" for r in results)


# -- 3. the retry budget ----------------------------------------------------------


async def run_sequential(client: Any, count: int) -> list[dict[str, Any]]:
    """``count`` requests, a few at a time, like steady load."""
    results: list[dict[str, Any]] = []
    for _ in range(count // 4):
        results += await asyncio.gather(*(ask(client) for _ in range(4)))
    return results


async def test_outage_amplification_is_capped(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Boreal always 503: after a burst, about 1.1 requests per inbound request, not 2."""
    suppliers.always("boreal", status(503))
    # The retry budget's own bound: with the breaker on, boreal would not be asked at all.
    client = await start_quoteflow(budget=1.0, breaker_failures=0)
    results = await run_sequential(client, 400)
    assert {failure_of(r, "boreal") for r in results} == {"http_503"}
    assert suppliers.count("boreal") / len(results) <= 1.2
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_retries_refused_total", supplier="boreal", reason="retry_budget")
    assert metric(text, "quoteflow_retry_budget_tokens", supplier="boreal") < 1


async def test_flaky_supplier_recovers_every_time(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """Every first attempt fails, every retry works: every request gets boreal's quote."""
    suppliers.always("boreal", first_time_per_request_id(status(503)))
    results = await run_sequential(await start_quoteflow(budget=1.0), 400)
    assert all(r["best"]["supplier"] == "boreal" for r in results)
    assert suppliers.count("boreal") == 800


async def test_isolated_blips_always_recover(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """5 % of requests fail once: every one of them recovers."""
    chance = random.Random(14)
    normal = quote()
    blip = first_time_per_request_id(status(503))

    async def sometimes(request: Any) -> Any:
        if request.headers.get("X-Attempt") == "2" or chance.random() < 0.05:
            return await blip(request)
        return await normal(request)

    suppliers.always("boreal", sometimes)
    results = await run_sequential(await start_quoteflow(budget=1.0), 400)
    assert all(r["best"]["supplier"] == "boreal" for r in results)
    assert suppliers.count("boreal") > 400


async def test_retries_resume_after_an_outage(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """After an outage drained the budget, recoveries come back within a few dozen requests."""
    suppliers.always("boreal", status(503))
    # The retry budget's own recovery: the breaker's is tested in test_breaker.py.
    client = await start_quoteflow(budget=1.0, breaker_failures=0)
    await run_sequential(client, 200)
    suppliers.always("boreal", first_time_per_request_id(status(503)))
    results = await run_sequential(client, 100)
    recovered = [r["best"]["supplier"] == "boreal" for r in results]
    assert all(recovered[40:])


def test_retry_budget_refunds_retries_that_pay_off() -> None:
    """A retry that brings a quote costs nothing; one that fails costs a token."""
    budget = RetryBudget(capacity=2, earn_per_request=0.1)
    for _ in range(100):
        budget.first_attempt()
        assert budget.try_spend()
        budget.paid_off()
    assert budget.tokens == 2
    assert budget.try_spend()
    assert budget.try_spend()
    assert not budget.try_spend()
    for _ in range(11):  # ten tenths, and one for floating point
        budget.first_attempt()
    assert budget.try_spend()


# -- 4. the supplier's own signal, and the budget on the wire ----------------------


@pytest.mark.parametrize(
    ("header", "attempts", "stopped"),
    [("0", 2, "attempts_exhausted"), ("1", 1, "retry_after"), ("120", 1, "retry_after")],
)
async def test_503_retry_after_is_honoured_only_when_it_fits(
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
    header: str,
    attempts: int,
    stopped: str,
) -> None:
    """Retry-After: 0 is retried; a wait the budget cannot afford is not, answered at once."""
    suppliers.always("boreal", status(503, headers={"Retry-After": header}))
    body = await explain(await start_quoteflow())
    assert suppliers.count("boreal") == attempts
    assert body["explain"]["suppliers"]["boreal"]["stopped"] == stopped
    assert body["elapsed_ms"] < TEST_BUDGET * 1000 / 2


async def test_short_retry_after_is_waited_for(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A Retry-After that fits is the backoff: the retry comes no sooner."""
    suppliers.script("boreal", status(503, headers={"Retry-After": "1"}))
    client = await start_quoteflow(budget=2.0, retry_after_cap=1.5)
    result = await ask(client)
    first, second = suppliers.of("boreal")
    assert second.at - first.at >= 0.99
    assert result["best"]["supplier"] == "boreal"


async def test_429_with_retry_after_is_not_retried(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """429 stays final, whatever its Retry-After says."""
    suppliers.always("boreal", status(429, headers={"Retry-After": "0"}))
    result = await ask(await start_quoteflow())
    assert failure_of(result, "boreal") == "http_429"
    assert suppliers.count("boreal") == 1


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        ("3", 3.0),
        (" 2 ", 2.0),
        ("-1", None),
        ("1.5", None),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        (None, None),
    ],
)
def test_retry_after_parsing(value: str | None, seconds: float | None) -> None:
    """Only delta-seconds are read; anything else is no hint."""
    assert retry_after_delay(value) == seconds


async def test_suppliers_are_told_the_attempt_and_the_budget_left(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """X-Attempt and X-Deadline-Remaining-Ms go with every attempt."""
    suppliers.script("boreal", delay(0.05, status(503)))
    await ask(await start_quoteflow())
    first, second = suppliers.of("boreal")
    assert (first.headers["X-Attempt"], second.headers["X-Attempt"]) == ("1", "2")
    first_left = int(first.headers["X-Deadline-Remaining-Ms"])
    second_left = int(second.headers["X-Deadline-Remaining-Ms"])
    # Generous: on a loaded machine a fresh app's first attempt may leave late.
    assert TEST_BUDGET * 1000 - 250 <= first_left <= TEST_BUDGET * 1000
    assert first_left - second_left >= 50 + 20


# -- 5. a caller who hangs up stops paying -----------------------------------------


async def test_caller_hanging_up_cancels_the_fan_out(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """The caller leaves: supplier calls are cancelled and every slot is back at once."""
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, hang())
    client = await start_quoteflow(budget=5.0, read_timeout=10.0, inbound_limit=1)
    with pytest.raises(asyncio.TimeoutError):
        await client.post("/api/quotes", json={}, timeout=aiohttp.ClientTimeout(total=0.1))
    end = time.monotonic() + 5  # a poll, not a time: a loaded machine may be slow to see it
    while time.monotonic() < end:
        if client.app[SERVICE].in_flight == 0 and suppliers.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert client.app[SERVICE].in_flight == 0
    assert client.app[SUPPLIER_CLIENT].in_flight == 0
    assert suppliers.in_flight == 0  # the supplier connections were closed
    text = await (await client.get("/metrics")).text()
    assert metric(text, "quoteflow_caller_disconnects_total") == 1
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, quote())
    assert (await client.post("/api/quotes", json={})).status == 200


async def test_real_process_cancels_when_the_caller_leaves(suppliers: FakeSuppliers) -> None:
    """`python -m quoteflow` frees the inbound slot within milliseconds of a hang-up."""
    for supplier in ("atlas", "boreal", "cedar"):
        suppliers.always(supplier, hang())
    flags = ("--budget", "5", "--read-timeout", "10", "--log-level", "warning")
    async with (
        quoteflow_process(suppliers.url, *flags) as running,
        aiohttp.ClientSession() as session,
    ):
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                running.url + "/api/quotes", json={}, timeout=aiohttp.ClientTimeout(total=0.2)
            )
        # Polled, with the documented loaded-machine margin: the slot is freed when
        # the process notices the hang-up, which a stalled loop may delay.
        end = time.monotonic() + 0.1 + LOADED_MARGIN
        while True:
            async with session.get(running.url + "/metrics") as response:
                text = await response.text()
            if metric(text, "quoteflow_inbound_in_flight") == 0 or time.monotonic() > end:
                break
            await asyncio.sleep(0.01)
    assert metric(text, "quoteflow_inbound_in_flight") == 0
    assert metric(text, "quoteflow_caller_disconnects_total") == 1


def test_a_cut_bounds_only_its_own_kind_of_request() -> None:
    """Cut attempts of the ``slow`` scenario raise what ``slow`` needs, not what ``normal`` does."""
    estimate = AttemptTimeEstimate(floor=0.05, memory=3.2)
    for _ in range(5):
        estimate.observe(0.01, kind="normal")
    for _ in range(5):
        estimate.cut_after(0.7, kind="slow")
    assert estimate.needed_for("slow") == 0.7
    assert estimate.needed_for("normal") == 0.05
    assert estimate.longest("normal") == 0.01
    estimate.observe(0.01, kind="slow")  # a quick answer of its own kind refutes them
    assert estimate.needed_for("slow") == 0.05


def test_a_cut_lapses_after_its_memory_with_nothing_new_observed() -> None:
    """A lower bound that no answer refutes is forgotten ``memory`` seconds after its cut."""
    estimate = AttemptTimeEstimate(floor=0.05, memory=0.05)
    for _ in range(5):
        estimate.cut_after(0.7)
    assert estimate.needed == 0.7
    time.sleep(0.06)
    assert estimate.needed == 0.05
    assert estimate.needed_at(time.monotonic()) == 0.05


def test_answer_times_read_cut_and_cancelled_attempts_as_at_least() -> None:
    """Kaplan-Meier: a lower bound keeps the share still unanswered up; ten answers first."""
    times = AnswerTimes()
    for _ in range(9):
        times.observe(0.1)
    assert times.survival(0.5) is None  # fewer than ten answers: nothing said yet
    times.observe(0.1)
    time.sleep(RANK_EVERY)  # the estimate is re-made at most this often
    assert times.survival(0.5) == 0.0
    assert times.percentile(0.7) == 0.1
    times.observe(0.8, answered=False)  # cut at the deadline: at least 0.8 s
    times.observe(0.3, answered=False)  # a hedge's loser: at least 0.3 s
    time.sleep(RANK_EVERY)
    assert times.survival(0.05) == 1.0
    assert times.survival(0.5) == pytest.approx(2 / 12)
    assert times.percentile(0.5) == 0.1
    assert times.percentile(0.9) == 0.1  # never reached: the longest answer
