"""The circuit breaker end to end: a QuoteFlow process with its breaker on, against the lab."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from provider_lab.control_client import LabControl
from tests.e2e.conftest import Pair, own_quoteflow

BUDGET_S = 0.3
OPEN_S = 0.3
OPEN_MAX_S = 0.6


@pytest.fixture(scope="module")
def service(pair: Pair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """QuoteFlow with the default breaker (5 failures), short budget and open times."""
    log = tmp_path_factory.mktemp("e2e-breaker") / "quoteflow.log"
    flags = ["--budget", str(BUDGET_S), "--breaker-open", str(OPEN_S)]
    with own_quoteflow(pair, log, *flags, "--breaker-open-max", str(OPEN_MAX_S)) as url:
        yield url


async def post(session: aiohttp.ClientSession, url: str, **body: Any) -> dict[str, Any]:
    """One quote request with its bill; it must be answered 200."""
    async with session.post(f"{url}/api/quotes?explain=1", json=body) as response:
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


def boreal_code(body: dict[str, Any]) -> str | None:
    """Boreal's failure code in ``body``, or None when it gave a usable quote."""
    return {f["supplier"]: f["code"] for f in body["failures"]}.get("boreal")


async def until_closed(session: aiohttp.ClientSession, url: str, **body: Any) -> float:
    """Ask every 20 ms until boreal is quoted again; the seconds that took."""
    started = time.monotonic()
    while boreal_code(await post(session, url, **body)) is not None:
        assert time.monotonic() - started < 5, "boreal did not come back"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.fixture(autouse=True)
async def closed_circuit(session: aiohttp.ClientSession, service: str, lab: LabControl) -> None:
    """Each test starts with no fault and boreal's circuit closed, whatever the last one left.

    The QuoteFlow process is the module's: a test that failed half-way (with
    boreal still hanging, or its circuit open) would otherwise fail the next.
    """
    await lab.clear_faults()
    await until_closed(session, service, quantity=1)


async def test_a_hang_opens_the_circuit_and_answers_come_at_once(
    session: aiohttp.ClientSession, service: str, lab: LabControl
) -> None:
    """Boreal hangs: five timeouts, then answers in milliseconds with atlas and cedar."""
    await lab.add_fault("boreal", {"kind": "hang"})
    for _ in range(5):
        assert boreal_code(await post(session, service, quantity=1)) == "timeout"
    await lab.wait_idle()
    before = (await lab.stats())["per_supplier"]["boreal"]
    fast = [await post(session, service, quantity=1) for _ in range(20)]
    # On a loaded machine the 20 may outlast the open time (0.3 s): then one of
    # them is the half-open probe, cut at the deadline, and the circuit reopens.
    probes = [body for body in fast if body["explain"]["suppliers"]["boreal"].get("probe")]
    assert len(probes) <= 2
    for body in fast:
        assert [q["supplier"] for q in body["quotes"]] == ["cedar", "atlas"]
        if body in probes:
            assert body["failures"] == [{"supplier": "boreal", "code": "timeout"}]
            continue
        assert body["failures"] == [{"supplier": "boreal", "code": "circuit_open"}]
        assert body["explain"]["suppliers"]["boreal"] == {"attempts": [], "stopped": "circuit_open"}
    # Nothing near the budget: each answer waited only for atlas and cedar.
    assert sorted(body["elapsed_ms"] for body in fast)[10] < BUDGET_S * 1000 / 3
    # Probes (one at a time, after each open time) are all boreal was sent.
    assert (await lab.stats())["per_supplier"]["boreal"] - before <= 2

    await lab.clear_faults()
    assert await until_closed(session, service, quantity=1) < OPEN_MAX_S + BUDGET_S + 0.5


async def test_an_outage_costs_boreal_almost_nothing_once_open(
    session: aiohttp.ClientSession, service: str, lab: LabControl
) -> None:
    """Scenario broken: once the circuit is open, boreal gets ≤ 0.05 requests per inbound one."""
    for _ in range(5):
        assert boreal_code(await post(session, service, scenario="broken")) == "http_503"
    await lab.wait_idle()
    before = (await lab.stats())["per_supplier"]["boreal"]
    bodies = [await post(session, service, scenario="broken") for _ in range(200)]
    assert all(boreal_code(body) in ("circuit_open", "http_503") for body in bodies)
    await lab.wait_idle()
    sent = (await lab.stats())["per_supplier"]["boreal"] - before
    assert sent / len(bodies) <= 0.05
    assert await until_closed(session, service) < OPEN_MAX_S + 0.5


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"scenario": "flaky"}, id="flaky"),
        pytest.param({"sku": "MS-010"}, id="unknown-to-boreal"),
        pytest.param({"scenario": "malformed"}, id="malformed"),
    ],
)
async def test_never_trips(
    session: aiohttp.ClientSession, service: str, lab: LabControl, body: dict[str, Any]
) -> None:
    """Recovered retries, a SKU boreal does not carry, bad data: never circuit_open."""
    answers = [await post(session, service, **body) for _ in range(30)]
    assert all(boreal_code(answer) != "circuit_open" for answer in answers)
    if body == {"scenario": "flaky"}:
        assert all(boreal_code(answer) is None for answer in answers)
