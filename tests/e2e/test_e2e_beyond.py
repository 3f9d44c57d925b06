"""Beyond the lesson, end to end: a QuoteFlow process of its own (the retry budget is
process-wide) against the real provider lab, with the contract's default budget."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from provider_lab.control_client import LabControl
from tests.conftest import LOADED_MARGIN
from tests.e2e.conftest import Pair, own_quoteflow


@pytest.fixture(scope="module")
def service(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh QuoteFlow with the defaults (budget 0.8 s, inbound 8, outbound 6), no breaker."""
    log = tmp_path_factory.mktemp("e2e-beyond") / "quoteflow.log"
    # The breaker off: the refinements of the retry loop are the subject here.
    with own_quoteflow(pair, log, "--breaker-failures", "0") as url:
        yield url


BUDGET_MS = 800
"""The contract's default budget, which this module's QuoteFlow runs with."""


async def post(session: aiohttp.ClientSession, url: str, **body: Any) -> tuple[int, Any]:
    """One quote request with the bill; the status and the body."""
    async with session.post(f"{url}/api/quotes?explain=1", json=body) as response:
        return response.status, await response.json()


async def steady(
    session: aiohttp.ClientSession, url: str, count: int, **body: Any
) -> list[dict[str, Any]]:
    """``count`` requests, four at a time: a steady load below the inbound limit."""
    results: list[dict[str, Any]] = []
    for _ in range(count // 4):
        answers = await asyncio.gather(*(post(session, url, **body) for _ in range(4)))
        assert {status for status, _ in answers} == {200}
        results += [answer for _, answer in answers]
    return results


async def test_hanging_boreal_costs_no_healthy_quote(
    session: aiohttp.ClientSession, service: str, lab: LabControl
) -> None:
    """12 callers, boreal hanging: every admitted request keeps atlas and cedar."""
    answers = await asyncio.gather(
        *(post(session, service, quantity=1, scenario="slow") for _ in range(12))
    )
    served = [body for status, body in answers if status == 200]
    assert len(served) == 8
    for body in served:
        assert [q["supplier"] for q in body["quotes"]] == ["cedar", "atlas"]
        assert body["failures"] == [{"supplier": "boreal", "code": "timeout"}]
        # The contract: the budget plus a few ms. The fan-out itself ends 5 ms
        # early (its answer reserve, pinned in tests/test_budget.py); beside the
        # suite's other workers a loaded loop may add more (seen: 826 ms against
        # 800 + 25), so the bound is the budget plus the documented margin.
        assert body["elapsed_ms"] <= BUDGET_MS + LOADED_MARGIN * 1000
    await lab.wait_idle()
    assert (await lab.stats())["max_active"] <= 6


async def test_suppliers_receive_the_attempt_and_the_budget_left(
    session: aiohttp.ClientSession, service: str, lab: LabControl
) -> None:
    """The lab records X-Attempt 1 then 2, and less budget left on the second attempt."""
    status, body = await post(session, service, scenario="flaky")
    assert status == 200
    assert body["best"]["supplier"] == "boreal"
    await lab.wait_idle()
    seen = (await lab.stats(body["request_id"]))["headers"][body["request_id"]]
    boreal = [h for h in seen if h["supplier"] == "boreal"]
    assert [h["x_attempt"] for h in boreal] == ["1", "2"]
    first, second = (int(str(h["x_deadline_remaining_ms"])) for h in boreal)
    assert 700 <= first <= 800
    assert second < first


async def test_retry_after_past_the_budget_is_not_waited_for(
    session: aiohttp.ClientSession, service: str, lab: LabControl
) -> None:
    """A 503 asking for 1 s, in a 0.8 s budget: one attempt, answered at once."""
    await lab.add_fault("boreal", {"kind": "http_503", "retry_after": 1})
    status, body = await post(session, service)
    assert status == 200
    assert body["explain"]["suppliers"]["boreal"]["stopped"] == "retry_after"
    assert body["elapsed_ms"] < LOADED_MARGIN * 1000  # at once, far from the 0.8 s deadline
    assert await lab.attempts(body["request_id"]) == {"atlas": 1, "boreal": 1, "cedar": 1}


async def test_flaky_then_outage_then_comeback(
    session: aiohttp.ClientSession, service: str, lab: LabControl
) -> None:
    """Flaky: all recovered. Broken: at most 1.2 boreal requests per inbound. Back: retries pay."""
    flaky = await steady(session, service, 200, scenario="flaky")
    assert all(body["best"]["supplier"] == "boreal" for body in flaky)

    await lab.fresh()
    broken = await steady(session, service, 400, scenario="broken")
    assert all({"supplier": "boreal", "code": "http_503"} in body["failures"] for body in broken)
    await lab.wait_idle()
    assert (await lab.stats())["per_supplier"]["boreal"] / len(broken) <= 1.2

    back = await steady(session, service, 100, scenario="flaky")
    recovered = [body["best"]["supplier"] == "boreal" for body in back]
    assert all(recovered[40:])
