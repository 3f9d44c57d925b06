"""Suppliers' contracts on real sockets: a rate (429 past it), a concurrency (503 past it),
their counts in ``/stats``, the control API, every dialect, ``POST /reset``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from provider_lab import cli
from provider_lab.contracts import (
    RING_SECONDS,
    Contract,
    ContractError,
    Line,
    Rate,
    parse_contract_spec,
    parse_rate,
)
from provider_lab.control_client import LabControl
from tests.lab.conftest import (
    LabClient,
    StartLab,
    ask,
    ask_json,
    ask_path,
    fetch_token,
    lab_process,
    raw_url,
    set_fault,
    stats,
    wait_idle,
)

Answer = tuple[int, bytes, CIMultiDictProxy[str]]
AskIt = Callable[..., Awaitable[Answer]]

RATE_LIMITED = b'{"error": "rate_limited", "supplier": "boreal"}'
NOT_AN_OBJECT = 'body: must be a JSON object {"rate": "N/Ws" or null, "concurrency": N or null}'
NOT_A_RATE = 'rate: must be "<requests>/<window>" like "20/1s" (window in s, m or h) or null'
TOO_MUCH = "rate: at most 1000000 requests per window of at most 86400 s (1 day)"
NOT_A_CONCURRENCY = "concurrency: must be an integer 1–10000 or null"


def over_concurrency(limit: int, supplier: str = "boreal") -> bytes:
    """The 503 body past ``limit`` requests at once."""
    return json.dumps(
        {"error": "over_concurrency", "supplier": supplier, "concurrency": limit}
    ).encode()


async def put_contract(lab: LabClient, supplier: str, body: Any) -> tuple[int, Any]:
    """``PUT /contracts/{supplier}``; the status and the JSON answer."""
    async with lab.put(f"/contracts/{supplier}", json=body) as response:
        return response.status, await response.json()


async def contracts(lab: LabClient) -> dict[str, Any]:
    """``GET /contracts``."""
    async with lab.get("/contracts") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def classic(lab: LabClient, supplier: str = "boreal", sku: str = "KB-001") -> Answer:
    """One classic request, with the answer's headers."""
    async with lab.get(f"/quotes/{supplier}", params={"sku": sku}) as response:
        return response.status, await response.read(), response.headers


@pytest.fixture(params=["classic", "json", "path"])
async def dialect(request: pytest.FixtureRequest, lab: LabClient) -> AskIt:
    """A way to ask boreal (or another supplier) in each dialect, credentials included."""
    if request.param == "classic":

        async def ask_classic(supplier: str = "boreal") -> Answer:
            return await classic(lab, supplier)

        return ask_classic
    if request.param == "json":
        token = await fetch_token(lab)

        async def ask_json_dialect(supplier: str = "boreal") -> Answer:
            order = {"items": [{"partNumber": "KB-001", "quantity": 1}]}
            headers = {"Authorization": f"Bearer {token}"}
            async with lab.post(f"/json/{supplier}/quote", json=order, headers=headers) as answer:
                return answer.status, await answer.read(), answer.headers

        return ask_json_dialect

    async def ask_path_dialect(supplier: str = "boreal") -> Answer:
        url = raw_url(lab, f"/path/{supplier}/parts/KB-001/price?qty=1&key=lab-key")
        async with lab.session.get(url) as answer:
            return answer.status, await answer.read(), answer.headers

    return ask_path_dialect


async def in_flight_reaches(lab: LabClient, supplier: str, count: int) -> dict[str, Any]:
    """Poll ``/stats`` until ``supplier`` has ``count`` requests in flight."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 2
    while True:
        current = await stats(lab)
        if current["in_flight"][supplier] == count:
            return current
        assert loop.time() < end, current["in_flight"]
        await asyncio.sleep(0.01)


async def release(tasks: list[asyncio.Task[Any]]) -> None:
    """Hang up held requests (their client leaves) and wait for them to be gone."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def after_a_second_boundary() -> None:
    """Sleep to just after the loop's next whole second, so a burst counts in one bucket."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    await asyncio.sleep(int(now) + 1 + 0.02 - now)


# -- the rate ----------------------------------------------------------------------------


async def test_a_rate_takes_its_quota_at_once_then_429_with_retry_after(lab: LabClient) -> None:
    """``3/10s``: three at once, then ``429``, ``Retry-After`` rounded up, the small body."""
    assert await put_contract(lab, "boreal", {"rate": "3/10s"}) == (
        200,
        {"supplier": "boreal", "rate": "3/10s", "concurrency": None},
    )
    for _ in range(3):
        assert (await classic(lab))[0] == 200
    status, body, headers = await classic(lab)
    assert (status, body) == (429, RATE_LIMITED)
    assert headers["Content-Type"] == "application/json"
    # One request drains back every 10/3 s: the next is admitted in 3.33 s, so 4.
    assert headers["Retry-After"] == "4"
    assert (await classic(lab, "atlas"))[0] == 200  # per supplier
    current = await stats(lab)
    assert current["rate_refused"] == {"atlas": 0, "boreal": 1, "cedar": 0}
    assert current["concurrency_refused"] == {"atlas": 0, "boreal": 0, "cedar": 0}
    # A refused request was received: counted, and answered as rate_limited.
    assert current["per_supplier"]["boreal"] == 4
    assert current["answers"]["boreal"] == {"ok": 3, "rate_limited": 1}
    assert sum(current["admitted_per_second"]["boreal"]) == 3
    assert set(current["admitted_per_second"]) == {"boreal"}


@pytest.mark.parametrize(
    ("rate", "quota", "retry_after"),
    [("1/60s", 1, "60"), ("2/1m", 2, "30"), ("1/1h", 1, "3600"), ("2/1s", 2, "1")],
)
async def test_retry_after_is_whole_seconds_until_the_next_request_at_least_1(
    lab: LabClient, rate: str, quota: int, retry_after: str
) -> None:
    """``Retry-After`` is the wait for one request to drain back, rounded up, never 0.

    The sub-second case is ``2/1s`` (a request drains back every 0.5 s: "1"),
    not ``20/1s``: the quota and the two refusals go one after another, and
    beside ``stress-ng`` twenty-two of them took longer than the 50 ms in
    which ``20/1s`` drains one back, so the lab rightly admitted the 21st.
    """
    await put_contract(lab, "boreal", {"rate": rate})
    for _ in range(quota):
        assert (await classic(lab))[0] == 200
    status, _, headers = await classic(lab)
    assert (status, headers["Retry-After"]) == (429, retry_after)
    # A refusal changes nothing: asked again at once, the same answer.
    status, _, headers = await classic(lab)
    assert (status, headers["Retry-After"]) == (429, retry_after)


async def test_a_burst_then_the_steady_rate(lab: LabClient) -> None:
    """``10/1s`` asked 50 times a second: the burst of 10, then about 10 a second.

    The counts of requests admitted per second (by loop time) show it from outside.
    """
    await put_contract(lab, "boreal", {"rate": "10/1s"})
    await after_a_second_boundary()
    loop = asyncio.get_running_loop()
    start = loop.time()
    admitted = refused = 0
    while loop.time() - start < 2.3:
        status, _, headers = await classic(lab)
        if status == 200:
            admitted += 1
        else:
            assert (status, headers["Retry-After"]) == (429, "1")
            refused += 1
        await asyncio.sleep(0.02)
    elapsed = loop.time() - start
    # 10 at once, then one each 0.1 s (give or take the last one in flight).
    assert 10 + 10 * elapsed - 2 <= admitted <= 10 + 10 * elapsed + 1
    current = await stats(lab)
    assert current["rate_refused"]["boreal"] == refused > 0
    per_second = current["admitted_per_second"]["boreal"]
    assert len(per_second) == RING_SECONDS
    assert sum(per_second) == admitted
    # Oldest first, the current second last: [burst + ~10, ~10, ~3 so far].
    first, second, third = per_second[-3:]
    assert per_second[:-3] == [0] * (RING_SECONDS - 3)
    assert 18 <= first <= 21
    assert 9 <= second <= 11
    assert third <= 5


async def test_the_ring_moves_with_the_clock(lab: LabClient) -> None:
    """The last bucket is the current second; a second later the counts have moved on one."""
    await put_contract(lab, "boreal", {"concurrency": 100})
    await after_a_second_boundary()
    for _ in range(3):
        await classic(lab)
    assert (await stats(lab))["admitted_per_second"]["boreal"][-1] == 3
    await after_a_second_boundary()
    assert (await stats(lab))["admitted_per_second"]["boreal"][-2:] == [3, 0]


async def test_a_rate_refusal_comes_before_latency_and_uses_no_fault(lab: LabClient) -> None:
    """A request past the rate is answered at once, without the latency or a fault's shot."""
    await put_contract(lab, "boreal", {"rate": "1/60s"})
    assert (await classic(lab))[0] == 200
    async with lab.put("/latency", json={"ms": 300}) as response:
        assert response.status == 200
    await set_fault(lab, "boreal", kind="http_500", count=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await classic(lab))[:2] == (429, RATE_LIMITED)
    assert loop.time() - started < 0.2
    async with lab.get("/faults") as response:
        assert (await response.json())["boreal"][0]["remaining"] == 1


def test_gcra_admits_requests_exactly_on_time() -> None:
    """After the burst, a request every ``window / quota`` is admitted, one sooner is not."""
    line = Line("boreal")
    line.set(Contract(rate=Rate(20, 1)), 0.0)
    now = 1000.0
    assert [line.enter(now) for _ in range(20)] == [None] * 20
    line.in_flight = 0
    refused = line.enter(now)
    assert refused is not None
    assert (refused[0], refused[1].status, refused[1].headers["Retry-After"]) == (
        "rate_limited",
        429,
        "1",
    )
    for step in range(1, 1001):  # float noise must not refuse a request on time
        assert line.enter(now + step * 0.05) is None, step
        line.in_flight = 0
    assert line.enter(now + 1000 * 0.05 + 0.049) is not None
    assert line.rate_refused == 2


def test_the_ring_forgets_what_is_older_than_a_minute() -> None:
    """Seconds skipped are emptied; after 60 s without a request, every bucket is 0."""
    line = Line("boreal")
    line.set(Contract(concurrency=10), 0.0)
    for now in (100.1, 100.9, 101.5, 104.0):
        assert line.enter(now) is None
        line.in_flight = 0
    assert line.admitted_per_second(104.5)[-5:] == [2, 1, 0, 0, 1]
    assert line.admitted_per_second(163.9)[0] == 1  # 104 is the oldest second kept
    assert line.admitted_per_second(164.0) == [0] * RING_SECONDS


# -- the concurrency ---------------------------------------------------------------------


async def test_one_past_the_concurrency_is_503_at_once(lab: LabClient) -> None:
    """Two held requests at ``concurrency: 2``: the third is a 503 at once, no Retry-After,
    without using up a fault; other suppliers are not affected."""
    assert await put_contract(lab, "boreal", {"concurrency": 2}) == (
        200,
        {"supplier": "boreal", "rate": None, "concurrency": 2},
    )
    await set_fault(lab, "boreal", kind="hang", count=2)
    await set_fault(lab, "boreal", kind="http_500", count=1, append=True)
    held = [asyncio.create_task(classic(lab)) for _ in range(2)]
    try:
        await in_flight_reaches(lab, "boreal", 2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, body, headers = await classic(lab)
        assert loop.time() - started < 0.2
        assert (status, body) == (503, over_concurrency(2))
        assert "Retry-After" not in headers
        assert (await classic(lab, "atlas"))[0] == 200
        current = await stats(lab)
        assert current["concurrency_refused"]["boreal"] == 1
        assert current["in_flight"] == {"atlas": 0, "boreal": 2, "cedar": 0}
        assert current["active"] == 2
    finally:
        await release(held)
    current = await wait_idle(lab)
    assert current["in_flight"]["boreal"] == 0
    assert current["max_in_flight"] == {"atlas": 1, "boreal": 2, "cedar": 0}
    # The refused request took no fault: the 500 is still next, then normal answers.
    assert (await classic(lab))[0] == 500
    assert (await classic(lab))[0] == 200
    assert current["answers"]["boreal"] == {"hang": 2, "over_concurrency": 1}


async def test_a_slot_is_free_again_once_its_request_is_answered(lab: LabClient) -> None:
    """Sequential requests never meet ``concurrency: 1``; held ones free their slot on leaving."""
    await put_contract(lab, "boreal", {"concurrency": 1})
    for _ in range(5):
        assert (await classic(lab))[0] == 200
    await set_fault(lab, "boreal", kind="hang", count=1)
    held = [asyncio.create_task(classic(lab))]
    await in_flight_reaches(lab, "boreal", 1)
    assert (await classic(lab))[0] == 503
    await release(held)
    await wait_idle(lab)
    assert (await classic(lab))[0] == 200


async def test_a_lowered_concurrency_cuts_nothing_in_flight(lab: LabClient) -> None:
    """Requests in flight when the concurrency is lowered go on; it is reached as they finish.

    A contract set while requests are in flight counts them too.
    """
    await set_fault(lab, "boreal", kind="hang", count=2)
    held = [asyncio.create_task(classic(lab)) for _ in range(2)]
    await in_flight_reaches(lab, "boreal", 2)
    await put_contract(lab, "boreal", {"concurrency": 1})
    assert (await classic(lab))[0] == 503
    await release(held[:1])
    await in_flight_reaches(lab, "boreal", 1)
    assert (await classic(lab))[0] == 503
    await release(held[1:])
    await in_flight_reaches(lab, "boreal", 0)
    assert (await classic(lab))[0] == 200
    assert (await stats(lab))["concurrency_refused"]["boreal"] == 2


async def test_concurrency_refusals_spend_no_rate_and_rate_refusals_hold_no_slot(
    lab: LabClient,
) -> None:
    """Concurrency is checked first and takes nothing; the rate takes nothing when it refuses."""
    await put_contract(lab, "boreal", {"rate": "2/60s", "concurrency": 1})
    await set_fault(lab, "boreal", kind="hang", count=1)
    held = [asyncio.create_task(classic(lab))]  # one of the rate's two
    await in_flight_reaches(lab, "boreal", 1)
    for _ in range(3):
        assert (await classic(lab))[:2] == (503, over_concurrency(1))
    await release(held)
    await wait_idle(lab)
    assert (await classic(lab))[0] == 200  # the rate's second: the 503s spent none
    for _ in range(3):
        assert (await classic(lab))[0] == 429
    current = await stats(lab)
    assert (current["concurrency_refused"]["boreal"], current["rate_refused"]["boreal"]) == (3, 3)
    assert (current["in_flight"]["boreal"], current["max_in_flight"]["boreal"]) == (0, 1)


async def test_max_in_flight_is_counted_without_a_contract(lab: LabClient) -> None:
    """Every supplier's peak in flight is counted, contract or not; no ring without one."""
    await set_fault(lab, "boreal", kind="hang")
    await set_fault(lab, "atlas", kind="hang")
    held = [asyncio.create_task(classic(lab, s)) for s in ("boreal", "boreal", "boreal", "atlas")]
    try:
        current = await in_flight_reaches(lab, "boreal", 3)
        assert current["in_flight"] == {"atlas": 1, "boreal": 3, "cedar": 0}
    finally:
        await release(held)
    current = await wait_idle(lab)
    assert current["in_flight"] == {"atlas": 0, "boreal": 0, "cedar": 0}
    assert current["max_in_flight"] == {"atlas": 1, "boreal": 3, "cedar": 0}
    assert current["admitted_per_second"] == {}


# -- every dialect -----------------------------------------------------------------------


async def test_the_rate_holds_in_every_dialect(lab: LabClient, dialect: AskIt) -> None:
    """The same 429, body and ``Retry-After`` whichever way boreal is asked."""
    await put_contract(lab, "boreal", {"rate": "1/60s"})
    assert (await dialect())[0] == 200
    status, body, headers = await dialect()
    assert (status, body, headers["Retry-After"]) == (429, RATE_LIMITED, "60")
    assert (await dialect("atlas"))[0] == 200
    assert (await stats(lab))["rate_refused"]["boreal"] == 1


async def test_the_concurrency_holds_in_every_dialect(lab: LabClient, dialect: AskIt) -> None:
    """The same 503 whichever way boreal is asked."""
    await put_contract(lab, "boreal", {"concurrency": 1})
    await set_fault(lab, "boreal", kind="hang", count=1)
    held: list[asyncio.Task[Any]] = [asyncio.ensure_future(dialect())]
    try:
        await in_flight_reaches(lab, "boreal", 1)
        status, body, headers = await dialect()
        assert (status, body) == (503, over_concurrency(1))
        assert "Retry-After" not in headers
    finally:
        await release(held)
    await wait_idle(lab)
    assert (await dialect())[0] == 200


async def test_a_fixed_pause_is_the_http_429_fault(lab: LabClient, dialect: AskIt) -> None:
    """``http_429`` with ``retry_after: 2`` and no count: every request 429 ``Retry-After: 2``."""
    await set_fault(lab, "boreal", kind="http_429", retry_after=2)
    for _ in range(3):
        status, body, headers = await dialect()
        assert (status, body, headers["Retry-After"]) == (
            429,
            b'{"error": "injected_http_429"}',
            "2",
        )
    assert (await dialect("atlas"))[0] == 200


async def test_contracts_come_after_the_credentials(lab: LabClient) -> None:
    """A request without a valid token or key spends none of the rate and holds no slot."""
    await put_contract(lab, "boreal", {"rate": "1/60s", "concurrency": 1})
    for _ in range(3):
        assert (await ask_json(lab, token="expired-or-wrong"))[0] == 401
        assert (await ask_path(lab, key="wrong"))[0] == 403
    assert (await ask_path(lab))[0] == 200
    assert (await ask_json(lab, token=await fetch_token(lab)))[0] == 429
    current = await stats(lab)
    assert current["answers"]["boreal"] == {
        "invalid_token": 3,
        "invalid_api_key": 3,
        "ok": 1,
        "rate_limited": 1,
    }
    assert current["max_in_flight"]["boreal"] == 1


async def test_an_admitted_answer_is_byte_for_byte_as_without_a_contract(lab: LabClient) -> None:
    """A contract changes nothing in the answers it admits."""
    status, before, before_headers = await classic(lab)
    await put_contract(lab, "boreal", {"rate": "100/1s", "concurrency": 10})
    status_after, after, after_headers = await classic(lab)
    assert (
        (status, before)
        == (status_after, after)
        == (
            200,
            b'{"supplier": "boreal", "sku": "KB-001", "unit_cents": 1100, '
            b'"shipping_cents": 250, "stock": 50}',
        )
    )
    assert {k: v for k, v in before_headers.items() if k != "Date"} == {
        k: v for k, v in after_headers.items() if k != "Date"
    }


async def test_a_refused_attempt_is_counted_with_its_request_id(lab: LabClient) -> None:
    """Refused requests were received: ``attempts`` and ``headers`` show them per id."""
    await put_contract(lab, "boreal", {"rate": "1/60s"})
    await ask(lab, request_id="r1", **{"X-Attempt": "1"})
    assert (await ask(lab, request_id="r1", **{"X-Attempt": "2"}))[0] == 429
    current = await stats(lab)
    assert current["attempts_per_supplier"]["r1"] == {"boreal": 2}
    assert [h["x_attempt"] for h in current["headers"]["r1"]] == ["1", "2"]


# -- the control API ---------------------------------------------------------------------


async def test_contracts_are_listed_set_and_cleared(lab: LabClient) -> None:
    """``GET``, ``PUT``, ``DELETE`` one and all; a rate is shown in seconds."""
    none = {"rate": None, "concurrency": None}
    assert await contracts(lab) == {"atlas": none, "boreal": none, "cedar": none}
    assert await put_contract(lab, "boreal", {"rate": "2/1m", "concurrency": 3}) == (
        200,
        {"supplier": "boreal", "rate": "2/60s", "concurrency": 3},
    )
    assert await put_contract(lab, "atlas", {"concurrency": 5}) == (
        200,
        {"supplier": "atlas", "rate": None, "concurrency": 5},
    )
    assert await contracts(lab) == {
        "atlas": {"rate": None, "concurrency": 5},
        "boreal": {"rate": "2/60s", "concurrency": 3},
        "cedar": none,
    }
    # A PUT replaces the whole contract: a term left out is null; both null is none.
    assert (await put_contract(lab, "boreal", {"rate": "5/1s"}))[1]["concurrency"] is None
    assert await put_contract(lab, "boreal", {"rate": None, "concurrency": None}) == (
        200,
        {"supplier": "boreal", **none},
    )
    assert "boreal" not in (await stats(lab))["admitted_per_second"]
    async with lab.delete("/contracts/atlas") as response:
        assert (response.status, await response.json()) == (200, {"supplier": "atlas", **none})
    await put_contract(lab, "cedar", {"rate": "1/1s"})
    async with lab.delete("/contracts") as response:
        assert (response.status, await response.json()) == (
            200,
            {"atlas": none, "boreal": none, "cedar": none},
        )
    for _ in range(3):
        assert (await classic(lab, "cedar"))[0] == 200


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ([], [NOT_AN_OBJECT]),
        ("20/1s", [NOT_AN_OBJECT]),
        ({"rate": 20}, [NOT_A_RATE]),
        ({"rate": "20/s"}, [NOT_A_RATE]),
        ({"rate": "20 / 1s"}, [NOT_A_RATE]),
        ({"rate": "0/1s"}, ["rate: at least 1 request per window"]),
        ({"rate": "1/0s"}, ["rate: the window must be at least 1 s"]),
        ({"rate": "1000001/1s"}, [TOO_MUCH]),
        ({"rate": "1/25h"}, [TOO_MUCH]),
        ({"concurrency": 0}, [NOT_A_CONCURRENCY]),
        ({"concurrency": 10001}, [NOT_A_CONCURRENCY]),
        ({"concurrency": True}, [NOT_A_CONCURRENCY]),
        ({"concurrency": 1.0}, [NOT_A_CONCURRENCY]),
        ({"concurrency": "4"}, [NOT_A_CONCURRENCY]),
        (
            {"burst": 3, "rate": "x", "concurrency": -1},
            [
                "burst: not a term of a contract (rate, concurrency)",
                NOT_A_RATE,
                NOT_A_CONCURRENCY,
            ],
        ),
    ],
)
async def test_a_bad_contract_is_422_naming_every_term(
    lab: LabClient, body: Any, detail: list[str]
) -> None:
    """Strict validation: a detail line per bad term, and nothing changed."""
    await put_contract(lab, "boreal", {"concurrency": 7})
    assert await put_contract(lab, "boreal", body) == (
        422,
        {"error": "invalid_contract", "detail": detail},
    )
    assert (await contracts(lab))["boreal"] == {"rate": None, "concurrency": 7}


async def test_contract_errors_for_bad_json_and_unknown_suppliers(lab: LabClient) -> None:
    """Not JSON: 400; a supplier the lab does not serve: 404, for PUT and DELETE."""
    async with lab.put("/contracts/boreal", data=b"{rate") as response:
        assert (response.status, (await response.json())["error"]) == (400, "invalid_json")
    status, body = await put_contract(lab, "zephyr", {"concurrency": 1})
    assert (status, body["error"], body["supplier"]) == (404, "unknown_supplier", "zephyr")
    async with lab.delete("/contracts/zephyr") as response:
        assert response.status == 404


async def test_a_changed_rate_keeps_what_was_used_a_new_one_starts_afresh(lab: LabClient) -> None:
    """Like a QuoteFlow reload: a PUT keeps the level; after DELETE the whole quota is back."""
    await put_contract(lab, "boreal", {"rate": "2/60s"})
    assert [(await classic(lab))[0] for _ in range(3)] == [200, 200, 429]
    await put_contract(lab, "boreal", {"rate": "2/60s", "concurrency": 5})
    assert (await classic(lab))[0] == 429  # still used up
    await put_contract(lab, "boreal", {"rate": "3/60s"})
    assert [(await classic(lab))[0] for _ in range(2)] == [200, 429]  # one more fits
    await put_contract(lab, "boreal", {"concurrency": 5})  # no rate: forgotten
    await put_contract(lab, "boreal", {"rate": "2/60s"})
    assert [(await classic(lab))[0] for _ in range(3)] == [200, 200, 429]
    async with lab.delete("/contracts/boreal"):
        pass
    await put_contract(lab, "boreal", {"rate": "2/60s"})
    assert [(await classic(lab))[0] for _ in range(3)] == [200, 200, 429]


async def test_reset_zeroes_the_counts_and_keeps_the_contracts(lab: LabClient) -> None:
    """``POST /reset``: refusals, peaks and the ring zeroed; contracts and levels kept."""
    await put_contract(lab, "boreal", {"rate": "1/60s", "concurrency": 4})
    assert [(await classic(lab))[0] for _ in range(2)] == [200, 429]
    current = await stats(lab)
    assert (current["rate_refused"]["boreal"], current["max_in_flight"]["boreal"]) == (1, 1)
    await set_fault(lab, "atlas", kind="hang")
    held = [asyncio.create_task(classic(lab, "atlas"))]
    await in_flight_reaches(lab, "atlas", 1)
    async with lab.post("/reset") as response:
        assert response.status == 409  # as ever while a request is in flight
    await release(held)
    await wait_idle(lab)
    async with lab.post("/reset") as response:
        assert response.status == 200
    current = await stats(lab)
    assert current["rate_refused"]["boreal"] == 0
    assert current["max_in_flight"] == {"atlas": 0, "boreal": 0, "cedar": 0}
    assert current["admitted_per_second"] == {"boreal": [0] * RING_SECONDS}
    assert (await contracts(lab))["boreal"] == {"rate": "1/60s", "concurrency": 4}
    status, _, headers = await classic(lab)
    assert (status, headers["Retry-After"]) == (429, "60")  # the rate's level stayed


# -- LabControl, the CLI and start-up ---------------------------------------------------------


async def test_lab_control_drives_the_contracts(lab: LabClient) -> None:
    """``LabControl``'s contract methods, ``reset`` and ``fresh`` against a real lab."""
    control = LabControl(lab.session, str(lab.make_url("/")))
    assert await control.set_contract("boreal", rate="1/60s", concurrency=2) == {
        "supplier": "boreal",
        "rate": "1/60s",
        "concurrency": 2,
    }
    assert (await control.contracts())["boreal"] == {"rate": "1/60s", "concurrency": 2}
    assert [(await classic(lab))[0] for _ in range(2)] == [200, 429]
    counts = await control.contract_counts("boreal")
    assert counts["rate_refused"] == 1
    assert (counts["in_flight"], counts["max_in_flight"], counts["concurrency_refused"]) == (
        0,
        1,
        0,
    )
    assert sum(counts["admitted_per_second"]) == 1
    assert (await control.contract_counts("atlas"))["admitted_per_second"] is None
    await control.reset()
    assert (await control.contract_counts("boreal"))["rate_refused"] == 0
    await control.clear_contract("boreal")
    await control.set_contract("atlas", concurrency=1)
    await control.clear_contracts()
    assert all(
        c == {"rate": None, "concurrency": None} for c in (await control.contracts()).values()
    )
    await control.set_contract("cedar", rate="1/60s")
    await control.fresh()
    assert (await control.contracts())["cedar"] == {"rate": None, "concurrency": None}


async def test_start_up_contracts_come_from_the_config(start_lab: StartLab) -> None:
    """``LabConfig.contracts`` (what ``--contract`` fills) holds from the first request."""
    lab = await start_lab(contracts=[parse_contract_spec("boreal:rate=1/60s", ("boreal",))])
    assert (await contracts(lab))["boreal"] == {"rate": "1/60s", "concurrency": None}
    assert [(await classic(lab))[0] for _ in range(2)] == [200, 429]


def test_contract_specs_parse() -> None:
    """``SUPPLIER:rate=N/Ws,concurrency=N``; ``null`` for a term; both null is no contract."""
    suppliers = ("atlas", "boreal")
    assert parse_contract_spec("boreal:rate=20/1s,concurrency=4", suppliers) == (
        "boreal",
        Contract(Rate(20, 1), 4),
    )
    assert parse_contract_spec("atlas:concurrency=2", suppliers) == ("atlas", Contract(None, 2))
    assert parse_contract_spec("atlas:rate=null", suppliers) == ("atlas", None)
    assert parse_rate("3/2h") == Rate(3, 7200)
    with pytest.raises(ContractError, match="concurrency: 'many' is not an integer"):
        parse_contract_spec("atlas:concurrency=many", suppliers)


@pytest.mark.parametrize(
    "spec",
    [
        "boreal",
        "zephyr:rate=1/1s",
        "boreal:",
        "boreal:rate",
        "boreal:rate=fast",
        "boreal:rate=1/1s,rate=2/1s",
        "boreal:concurrency=0",
        "boreal:burst=3",
    ],
)
def test_bad_contract_arguments_are_one_line_and_exit_2(
    spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad ``--contract`` stops the lab with exit code 2 and a single error line."""
    with pytest.raises(SystemExit) as caught:
        cli.main(["--contract", spec])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "argument --contract:" in err


async def test_real_process_takes_contracts() -> None:
    """``--contract`` reaches a lab run as a process, the rate and the concurrency."""
    async with (
        lab_process("--contract", "cedar:rate=1/60s", "--contract", "atlas:concurrency=3") as url,
        aiohttp.ClientSession(url) as session,
    ):
        statuses = []
        for _ in range(2):
            async with session.get("/quotes/cedar", params={"sku": "KB-001"}) as response:
                statuses.append(response.status)
        assert statuses == [200, 429]
        async with session.get("/contracts") as response:
            assert (await response.json())["atlas"] == {"rate": None, "concurrency": 3}
