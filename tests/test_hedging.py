"""Hedged attempts: a late first attempt joined by the second, on real sockets.

The fake suppliers (``tests.fakes``) count what really arrived: attempts,
their ``X-Attempt`` and request id, and whether a cancelled attempt's
connection was closed on the supplier's side.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient

from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.options import ConfigError, load_catalogue
from tests import fakes
from tests.catalogue_fakes import write_catalogue
from tests.fakes import FakeSuppliers

Client = TestClient[Any, Any]


class Start:
    """QuoteFlow on a catalogue of the fake's atlas, boreal and cedar, ``boreal`` keys added."""

    def __init__(self, aiohttp_client: AiohttpClient, tmp_path: Path, fake: FakeSuppliers) -> None:
        self.aiohttp_client = aiohttp_client
        self.tmp_path = tmp_path
        self.fake = fake

    async def __call__(self, boreal: dict[str, Any] | None = None, **overrides: Any) -> Client:
        entries = [
            {"name": name, "url": f"{self.fake.url.rstrip('/')}/quotes/{name}"}
            for name in ("atlas", "boreal", "cedar")
        ]
        entries[1].update(boreal or {})
        path = write_catalogue(self.tmp_path / "suppliers.toml", entries)
        values: dict[str, Any] = {"budget": 0.8, "connect_timeout": 1.0, "suppliers_file": path}
        values.update(overrides)
        settings = Settings(**values)
        app = create_app(settings, catalogue=load_catalogue(settings, {}), environ={})
        return await self.aiohttp_client(app)


@pytest.fixture
def start(aiohttp_client: AiohttpClient, tmp_path: Path, suppliers: FakeSuppliers) -> Start:
    return Start(aiohttp_client, tmp_path, suppliers)


class Watched:
    """A responder that answers after ``seconds``, noting whether its client hung up first."""

    def __init__(self, seconds: float, then: fakes.Responder | None = None) -> None:
        self.seconds = seconds
        self.then = then or fakes.quote()
        self.closed: list[str] = []
        """The ``X-Attempt`` of each request whose connection closed before its answer."""

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        attempt = request.headers.get("X-Attempt", "")
        ends = asyncio.get_running_loop().time() + self.seconds
        try:
            while asyncio.get_running_loop().time() < ends:
                transport = request.transport
                if transport is None or transport.is_closing():
                    self.closed.append(attempt)
                    return web.Response()  # nobody to answer
                await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            self.closed.append(attempt)  # aiohttp cancels a handler whose client went away
            raise
        return await self.then(request)


async def ask(client: Client, request_id: str, **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/api/quotes?explain=1", json=body, headers={"X-Request-ID": request_id}
    )
    assert response.status == 200, await response.text()
    return dict(await response.json())


async def test_a_late_first_attempt_is_joined_by_a_hedge_that_wins_and_the_loser_is_closed(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """``delay = 0.05``: a slow first attempt gets a hedge, which wins; the first is closed."""
    slow = Watched(2.0)
    suppliers.script("boreal", slow)  # the first attempt; the hedge gets the default quote
    client = await start({"hedge": {"delay": 0.05}})
    answer = await ask(client, "h-1")
    assert answer["best"]["supplier"] == "boreal"
    seen = suppliers.of("boreal")
    assert [(r.request_id, r.headers["X-Attempt"]) for r in seen] == [("h-1", "1"), ("h-1", "2")]
    assert seen[1].at - seen[0].at >= 0.04  # sent at its delay, not at once
    bill = answer["explain"]["suppliers"]["boreal"]
    assert bill["won"] == 2
    assert bill["stopped"] == "success"
    outcomes = {a["attempt"]: (a["outcome"], a.get("hedge", False)) for a in bill["attempts"]}
    assert outcomes == {1: ("cancelled", False), 2: ("ok", True)}
    for _ in range(100):  # the closed connection reaches the fake on its next check
        if slow.closed:
            break
        await asyncio.sleep(0.01)
    assert slow.closed == ["1"]
    assert client.app  # the slot came back: the next request is served at once
    assert (await ask(client, "h-2"))["best"]["supplier"] == "boreal"


async def test_a_first_attempt_that_wins_cancels_the_hedge(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """The hedge is the slower one: the first attempt's quote wins, the hedge is cancelled."""
    hedge = Watched(2.0)
    suppliers.script("boreal", fakes.delay(0.15), hedge)
    client = await start({"hedge": {"delay": 0.05}})
    answer = await ask(client, "h-3")
    bill = answer["explain"]["suppliers"]["boreal"]
    assert bill["won"] == 1
    outcomes = {a["attempt"]: a["outcome"] for a in bill["attempts"]}
    assert outcomes == {1: "ok", 2: "cancelled"}
    assert answer["best"]["supplier"] == "boreal"


async def test_after_a_hedge_a_503_is_not_retried_the_later_failure_stands(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """Two attempts at most on the wire: a hedge that 503s, then the first 500s, and no third."""
    suppliers.script("boreal", fakes.delay(0.2, fakes.status(500)), fakes.status(503))
    client = await start({"hedge": {"delay": 0.05}})
    answer = await ask(client, "h-4")
    assert suppliers.count("boreal") == 2
    assert {"supplier": "boreal", "code": "http_500"} in answer["failures"]
    bill = answer["explain"]["suppliers"]["boreal"]
    assert bill["stopped"] == "attempts_exhausted"
    assert "won" not in bill


async def test_a_retried_call_is_never_hedged(start: Start, suppliers: FakeSuppliers) -> None:
    """A 503 at once: the retry is the second attempt; its slowness sends no hedge."""
    suppliers.script("boreal", fakes.status(503), fakes.delay(0.3))
    client = await start({"hedge": {"delay": 0.05}})
    answer = await ask(client, "h-5")
    assert suppliers.count("boreal") == 2
    assert answer["best"]["supplier"] == "boreal"
    bill = answer["explain"]["suppliers"]["boreal"]
    assert [a.get("hedge", False) for a in bill["attempts"]] == [False, False]


@pytest.mark.parametrize(
    ("why", "overrides", "boreal"),
    [
        ("no free slot", {"outbound_limit": 1, "supplier_share": 1}, {}),
        ("no hedge token", {"hedge_burst": 1, "hedge_earn": 0.1}, {}),
        ("an empty retry budget", {"retry_budget_capacity": 1, "retry_budget_earn": 0.0}, {}),
        ("no turn of its rate", {}, {"rate": "1/10s"}),
    ],
)
async def test_no_hedge_without_a_slot_a_token_or_a_turn(
    start: Start,
    suppliers: FakeSuppliers,
    why: str,
    overrides: dict[str, Any],
    boreal: dict[str, Any],
) -> None:
    """A hedge never waits: without a free slot, a hedge token or its rate's turn, none is sent;
    nor while failures have emptied the retry budget. The bill and the metrics say why."""
    for name in ("atlas", "cedar"):
        suppliers.always(name, fakes.quote())
    client = await start({"hedge": {"delay": 0.05}, **boreal}, **overrides)
    if why == "no hedge token":
        suppliers.script("boreal", fakes.delay(0.1), fakes.delay(1.0))
        await ask(client, "spend")  # the one token goes on this hedge, which loses
        assert suppliers.count("boreal") == 2
    if why == "an empty retry budget":
        suppliers.script("boreal", fakes.status(503), fakes.status(503))
        await ask(client, "spend")  # the one retry token goes on a retry that fails too
        assert suppliers.count("boreal") == 2
    before = suppliers.count("boreal")
    suppliers.script("boreal", fakes.delay(0.25))
    answer = await ask(client, "h-6")
    assert suppliers.count("boreal") == before + 1, why
    assert answer["best"]["supplier"] == "boreal"
    bill = answer["explain"]["suppliers"]["boreal"]
    assert all(not a.get("hedge") for a in bill["attempts"])
    reason = {
        "no free slot": "no_slot",
        "no hedge token": "no_token",
        "an empty retry budget": "no_token",
        "no turn of its rate": "no_turn",
    }[why]
    assert bill["hedge_refused"] == reason
    metrics = await (await client.get("/metrics")).text()
    assert f'quoteflow_hedges_refused_total{{reason="{reason}",supplier="boreal"}} 1.0' in metrics


async def test_a_cancelled_loser_is_no_failure_for_the_breaker(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """With a breaker of one failure, slow first attempts that lose never open boreal's circuit."""
    client = await start({"hedge": {"delay": 0.05}, "breaker_failures": 1})
    for n in range(4):
        suppliers.script("boreal", Watched(2.0))
        answer = await ask(client, f"h-b{n}")
        assert answer["best"]["supplier"] == "boreal"
        assert answer["explain"]["suppliers"]["boreal"]["won"] == 2
    assert suppliers.count("boreal") == 8


async def test_off_means_off(start: Start, suppliers: FakeSuppliers) -> None:
    """No ``hedge`` key and no ``--hedge``: a slow first attempt is waited for, alone."""
    suppliers.script("boreal", fakes.delay(0.3))
    client = await start()
    answer = await ask(client, "h-7")
    assert suppliers.count("boreal") == 1
    bill = answer["explain"]["suppliers"]["boreal"]
    assert "won" not in bill
    assert [set(a) - {"hedge"} == set(a) for a in bill["attempts"]] == [True]


async def test_a_percentile_hedge_waits_for_answers_and_goes_only_where_the_tail_is_late(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """``--hedge``: none before ten answers; then boreal, whose calls sometimes run out the
    budget, is hedged at the 20 ms floor, and atlas, whose answers all fit, never is."""
    client = await start(hedge=True)
    suppliers.script("boreal", fakes.delay(0.2))
    await ask(client, "early")
    assert suppliers.count("boreal") == 1  # nothing known yet: no hedge
    for n in range(10):
        await ask(client, f"warm-{n}")
    suppliers.script("boreal", fakes.hang())
    answer = await ask(client, "tail")  # boreal's tail: cut at the deadline, at least that long
    assert {"supplier": "boreal", "code": "timeout"} in answer["failures"]
    before = suppliers.count("boreal")
    suppliers.script("boreal", fakes.delay(0.3))
    suppliers.script("atlas", fakes.delay(0.3))
    answer = await ask(client, "late")
    arrived = suppliers.of("boreal")[before:]
    assert [r.headers["X-Attempt"] for r in arrived] == ["1", "2"]
    assert arrived[1].at - arrived[0].at >= 0.015
    assert answer["explain"]["suppliers"]["boreal"]["won"] == 2
    assert [r.headers["X-Attempt"] for r in suppliers.of("atlas")[-1:]] == ["1"]
    assert "won" not in answer["explain"]["suppliers"]["atlas"]


@pytest.mark.parametrize(
    ("hedge", "message"),
    [
        ({"percentile": 1.5}, "hedge.percentile: must be between 0 and 1"),
        ({"delay": 0.001}, "hedge.delay: must be from 0.02 to 60 seconds"),
        ({"delay": 0.1, "percentile": 0.5}, "hedge: must have exactly one of percentile"),
        ({"earn": 0.5}, "hedge: must have exactly one of percentile"),
        ({"delay": 0.1, "earn": 0}, "hedge.earn: must be more than 0 and at most 1"),
        ({"delay": 0.1, "earn": 1.5}, "hedge.earn: must be more than 0 and at most 1"),
        ({"delay": 0.1, "burst": 0}, "hedge.burst: must be a whole number from 1 to 1000"),
        ({"delay": 0.1, "burst": 2.5}, "hedge.burst: must be a whole number from 1 to 1000"),
        ({"delay": 0.1, "surge": 1}, "hedge: must be true, false"),
        ("yes", "hedge: must be true, false"),
    ],
)
def test_a_bad_hedge_key_is_one_line_naming_the_supplier(
    tmp_path: Path, hedge: object, message: str
) -> None:
    """A catalogue's bad ``hedge``: ``ConfigError`` naming the supplier and the key."""
    path = write_catalogue(
        tmp_path / "s.toml", [{"name": "boreal", "url": "http://x/q", "hedge": hedge}]
    )
    with pytest.raises(ConfigError) as raised:
        load_catalogue(Settings(suppliers_file=path), {})
    assert f"supplier 'boreal': {message}" in str(raised.value)


async def test_hedges_come_back_once_successes_have_earned_a_token(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """A hedge token spent on a losing hedge: the next slow call is not hedged; once successful
    attempts have earned a token back (half a token each here), the one after is hedged again."""
    client = await start({"hedge": {"delay": 0.05, "burst": 1, "earn": 0.5}})
    # Each request's first attempt answers in 0.15 s; a hedge would take 1 s and lose.
    suppliers.always("boreal", fakes.first_time_per_request_id(fakes.delay(0.15), fakes.delay(1.0)))
    hedged: list[bool] = []
    for n in range(3):
        before = suppliers.count("boreal")
        await ask(client, f"budget-{n}")
        hedged.append(suppliers.count("boreal") - before == 2)
    # 1 token: spent (the hedge loses), 0.5 earned by the first attempt's quote; none;
    # 1.0 earned back: hedged again.
    assert hedged == [True, False, True]


async def test_a_hedge_spends_no_retry_token_and_a_winning_hedge_gets_its_own_back(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """Hedges and retries have buckets of their own: /metrics shows which one paid."""
    client = await start({"hedge": {"delay": 0.05, "burst": 3, "earn": 0.2}})
    suppliers.script("boreal", fakes.delay(0.3))  # the hedge (the default quote) wins
    answer = await ask(client, "own-1")
    assert answer["explain"]["suppliers"]["boreal"]["won"] == 2
    metrics = await (await client.get("/metrics")).text()
    # Spent, given back as it won, and 0.2 earned by its quote: still full.
    assert 'quoteflow_hedge_tokens{supplier="boreal"} 3.0' in metrics
    assert 'quoteflow_retry_budget_tokens{supplier="boreal"} 20.0' in metrics
    suppliers.script("boreal", fakes.delay(0.15), fakes.delay(1.0))  # this hedge loses
    await ask(client, "own-2")
    metrics = await (await client.get("/metrics")).text()
    assert 'quoteflow_hedge_tokens{supplier="boreal"} 2.2' in metrics  # 3 - 1 + 0.2
    assert 'quoteflow_retry_budget_tokens{supplier="boreal"} 20.0' in metrics
    assert 'quoteflow_hedge_tokens{supplier="atlas"}' not in metrics  # not hedged


async def test_a_hanging_supplier_stops_earning_and_its_hedges_stop(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """Only a sent attempt's valid quote earns: a supplier whose every call times out spends
    its burst on hedges and sends no more, and earns again once it answers."""
    client = await start({"hedge": {"delay": 0.05, "burst": 2, "earn": 0.5}}, budget=0.4)
    suppliers.always("boreal", fakes.hang())
    sent = []
    for n in range(4):
        before = suppliers.count("boreal")
        answer = await ask(client, f"hang-{n}")
        assert {"supplier": "boreal", "code": "timeout"} in answer["failures"]
        sent.append(suppliers.count("boreal") - before)
    assert sent == [2, 2, 1, 1]  # two hedges, then the bucket is empty
    suppliers.always("boreal", fakes.quote())
    for n in range(2):  # two quick successes earn one token back
        await ask(client, f"back-{n}")
    suppliers.script("boreal", fakes.delay(0.25))
    before = suppliers.count("boreal")
    await ask(client, "hedged-again")
    assert suppliers.count("boreal") - before == 2


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--hedge-earn", "0"], "hedge_earn"),
        (["--hedge-earn", "1.5"], "hedge_earn"),
        (["--hedge-burst", "0"], "hedge_burst"),
        (["--hedge-burst", "1001"], "hedge_burst"),
        (["--hedge-burst", "2.5"], "--hedge-burst"),
    ],
)
def test_a_bad_hedge_default_stops_start_up_in_one_line(argv: list[str], named: str) -> None:
    from quoteflow.options import parse_settings

    with pytest.raises(ConfigError, match=named):
        parse_settings(argv, {})


async def test_a_reload_that_keeps_the_burst_keeps_the_buckets_level(
    start: Start, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """As the retry budget: a reload with the same ``burst`` keeps the tokens; another refills."""
    from quoteflow.reload import reload_all

    client = await start({"hedge": {"delay": 0.05, "burst": 2}})
    suppliers.script("boreal", fakes.delay(0.15), fakes.delay(1.0))  # a hedge that loses
    await ask(client, "lvl-1")

    async def level() -> str:
        metrics = await (await client.get("/metrics")).text()
        (line,) = [m for m in metrics.splitlines() if m.startswith("quoteflow_hedge_tokens{")]
        return line.rsplit(" ", 1)[1]

    assert await level() == "1.2"
    entries: list[dict[str, Any]] = [
        {"name": name, "url": f"{suppliers.url.rstrip('/')}/quotes/{name}"}
        for name in ("atlas", "boreal", "cedar")
    ]
    entries[1]["hedge"] = {"delay": 0.06, "burst": 2, "earn": 0.5}
    write_catalogue(tmp_path / "suppliers.toml", entries)
    reload_all(client.app)
    assert await level() == "1.2"
    entries[1]["hedge"] = {"delay": 0.06, "burst": 4}
    write_catalogue(tmp_path / "suppliers.toml", entries)
    reload_all(client.app)
    assert await level() == "4.0"


async def test_with_coalescing_the_bill_still_says_which_attempt_won(
    start: Start, suppliers: FakeSuppliers
) -> None:
    """--coalesce runs the call as a shared one: its race's ``won`` reaches the caller's bill."""
    suppliers.script("boreal", Watched(2.0))  # the first is slow: the hedge wins
    client = await start({"hedge": {"delay": 0.05}}, coalesce=True)
    bill = (await ask(client, "co-1"))["explain"]["suppliers"]["boreal"]
    assert bill["won"] == 2
    assert [
        a.get("hedge", False) for a in sorted(bill["attempts"], key=lambda a: a["attempt"])
    ] == [
        False,
        True,
    ]
    suppliers.script("boreal", fakes.delay(0.25))
    client_two = await start(
        {"hedge": {"delay": 0.05}}, coalesce=True, outbound_limit=1, supplier_share=1
    )
    refused = (await ask(client_two, "co-2"))["explain"]["suppliers"]["boreal"]
    assert refused["hedge_refused"] == "no_slot"
