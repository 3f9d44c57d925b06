"""Reloading the catalogue in a running app: swapped whole, in-flight requests kept on theirs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis.asyncio import Redis

from quoteflow.app import COORDINATOR, ROSTER, create_app
from quoteflow.config import Settings
from quoteflow.options import load_catalogue
from quoteflow.reload import reload_all
from tests.catalogue_fakes import NamedSuppliers, after, always, write_catalogue
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT
from tests.redis_server import RedisServer

Client = TestClient[Any, Any]


@pytest.fixture
async def fake(aiohttp_server: AiohttpServer) -> NamedSuppliers:
    """Suppliers old, stays and new behind one server, all quoting."""
    suppliers = NamedSuppliers(("old", "stays", "new"))
    server = await aiohttp_server(suppliers.app)
    suppliers.url = str(server.make_url("/"))
    return suppliers


Write = Callable[..., str]


@pytest.fixture
def write(tmp_path: Path, fake: NamedSuppliers) -> Write:
    """Write the catalogue file: ``names`` at the fake's URLs, ``extra`` keys per name."""

    def write_names(*names: str, **extra: dict[str, Any]) -> str:
        entries = [{"name": n, "url": fake.url_of(n), **extra.get(n, {})} for n in names]
        return write_catalogue(tmp_path / "suppliers.toml", entries)

    return write_names


@pytest.fixture
def start(aiohttp_client: AiohttpClient) -> Callable[[str], Awaitable[Client]]:
    """QuoteFlow serving the catalogue file at ``path``."""

    async def start_with(path: str) -> Client:
        settings = Settings(
            budget=TEST_BUDGET, connect_timeout=TEST_CONNECT_TIMEOUT, suppliers_file=path
        )
        catalogue = load_catalogue(settings, {})
        return await aiohttp_client(create_app(settings, catalogue=catalogue, environ={}))

    return start_with


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


async def _suppliers_of(client: Client) -> list[str]:
    body = await (await client.post("/api/quotes", json={"quantity": 1})).json()
    return [quote["supplier"] for quote in body["quotes"]] + [
        failure["supplier"] for failure in body["failures"]
    ]


async def test_a_good_file_is_served_from_the_next_request(
    fake: NamedSuppliers, write: Write, start: Callable[[str], Awaitable[Client]]
) -> None:
    """After a reload new requests ask the new catalogue, and the OpenAPI document names it."""
    client = await start(write("old", "stays"))
    assert sorted(await _suppliers_of(client)) == ["old", "stays"]
    write("stays", "new")
    reload_all(client.app)
    assert sorted(await _suppliers_of(client)) == ["new", "stays"]
    assert (fake.count("old"), fake.count("stays"), fake.count("new")) == (1, 2, 1)
    document = await (await client.get("/openapi.json")).json()
    assert document["components"]["schemas"]["Supplier"]["enum"] == ["stays", "new"]


async def test_requests_in_flight_finish_on_their_catalogue(
    fake: NamedSuppliers, write: Write, start: Callable[[str], Awaitable[Client]]
) -> None:
    """A request that started before the reload still gets the removed supplier's quote."""
    fake.answers["old"] = after(0.15)
    client = await start(write("old", "stays"))
    in_flight = asyncio.create_task(client.post("/api/quotes", json={"quantity": 1}))
    while not fake.in_flight["old"]:  # noqa: ASYNC110 -- the fake server's own counter
        await asyncio.sleep(0.005)
    write("stays", "new")
    reload_all(client.app)
    after_reload = await _suppliers_of(client)
    body = await (await in_flight).json()
    assert sorted(quote["supplier"] for quote in body["quotes"]) == ["old", "stays"]
    assert sorted(after_reload) == ["new", "stays"]


async def test_a_supplier_that_stays_keeps_its_breaker_and_retry_budget(
    fake: NamedSuppliers, write: Write, start: Callable[[str], Awaitable[Client]]
) -> None:
    """An open circuit and a spent retry budget survive a reload that keeps their supplier."""
    fake.answers["stays"] = always(503)
    keys = {"stays": {"breaker_failures": 1, "retry_budget_capacity": 1}}
    client = await start(write("stays", "old", **keys))
    first = await (await client.post("/api/quotes", json={})).json()
    assert first["failures"] == [{"supplier": "stays", "code": "http_503"}]
    assert fake.count("stays") == 2  # the one retry of its budget
    write("stays", "new", **keys)
    reload_all(client.app)
    second = await (await client.post("/api/quotes", json={})).json()
    assert second["failures"] == [{"supplier": "stays", "code": "circuit_open"}]
    assert fake.count("stays") == 2  # not asked: its breaker is the one that opened
    metrics = await (await client.get("/metrics")).text()
    assert 'quoteflow_circuit_state{supplier="stays"} 2.0' in metrics
    tokens = [
        line for line in metrics.splitlines() if line.startswith("quoteflow_retry_budget_tokens")
    ]
    assert [line.split("{")[1].split("}")[0] for line in tokens] == [
        'supplier="stays"',
        'supplier="new"',
    ]
    assert float(tokens[0].split()[-1]) < 1  # still spent


async def test_a_removed_suppliers_slots_and_series_go_after_one_budget(
    fake: NamedSuppliers, write: Write, start: Callable[[str], Awaitable[Client]]
) -> None:
    """One budget (and a second) after it is removed, a supplier has no metric series left."""
    client = await start(write("old", "stays"))
    await _suppliers_of(client)
    write("stays")
    reload_all(client.app)
    metrics = await (await client.get("/metrics")).text()
    assert 'quoteflow_supplier_attempts_total{attempt="1",outcome="ok",supplier="old"}' in metrics
    await asyncio.sleep(TEST_BUDGET + 1.1)
    metrics = await (await client.get("/metrics")).text()
    assert 'supplier="old"' not in metrics
    assert 'supplier="stays"' in metrics
    assert await _suppliers_of(client) == ["stays"]


async def test_a_bad_file_changes_nothing_and_says_why_once(
    fake: NamedSuppliers,
    write: Write,
    start: Callable[[str], Awaitable[Client]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A file that fails a check: one error event, and the old catalogue keeps answering 200."""
    path = write("old", "stays")
    client = await start(path)
    _write(path, '[[supplier]]\nname = "stays"\nurl = "ftp://nowhere/q"\n')
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="quoteflow"):
        reload_all(client.app)
    events = [(r.levelno, r.event, r.fields) for r in caplog.records]  # type: ignore[attr-defined]
    assert events == [
        (
            logging.ERROR,
            "reload_refused",
            {
                "file": "suppliers",
                "error": f"supplier catalogue {path}: supplier 'stays': url: "
                "must be an http:// or https:// URL with a host",
            },
        )
    ]
    response = await client.post("/api/quotes", json={})
    assert response.status == 200
    assert sorted(await _suppliers_of(client)) == ["old", "stays"]
    assert client.app[ROSTER].catalogue.names == ("old", "stays")


async def test_without_a_file_there_is_nothing_to_reload(
    fake: NamedSuppliers, aiohttp_client: AiohttpClient
) -> None:
    """The default catalogue registers no reloadable: SIGHUP leaves it as it is."""
    client = await aiohttp_client(create_app(Settings(provider_url=fake.url)))
    reload_all(client.app)
    assert client.app[ROSTER].catalogue.names == ("atlas", "boreal", "cedar")


async def test_fleet_mode_reloads_names_shares_and_budgets_live(
    fake: NamedSuppliers,
    write: Write,
    aiohttp_client: AiohttpClient,
    redis_server: RedisServer,
) -> None:
    """With Redis, a SIGHUP may add and remove suppliers and change shares and retry budgets.

    The next request asks the new catalogue; the worker's next syncs send the
    new shares and buckets (Redis keeps none of its own), and a removed
    supplier leaves Redis' record of this worker once no request can ask it.
    """
    path = write("old", "stays")
    settings = Settings(
        budget=TEST_BUDGET,
        connect_timeout=TEST_CONNECT_TIMEOUT,
        suppliers_file=path,
        redis_url=redis_server.url,
        redis_timeout=0.2,
    )
    app = create_app(settings, catalogue=load_catalogue(settings, {}), environ={})
    client = await aiohttp_client(app)
    assert sorted(await _suppliers_of(client)) == ["old", "stays"]
    write("stays", "new", stays={"share": 1, "retry_budget_capacity": 3}, new={"share": 2})
    reload_all(client.app)
    assert sorted(await _suppliers_of(client)) == ["new", "stays"]
    coordinator = client.app[COORDINATOR]
    assert coordinator.shares["stays"] == 1
    assert coordinator.budgets["stays"].capacity == 3
    assert coordinator.shares["new"] == 2
    # Five requests at once: "stays" never has more than its new share in flight.
    fake.answers["stays"] = after(0.05)
    await asyncio.gather(*(_suppliers_of(client) for _ in range(5)))
    assert fake.max_in_flight["stays"] == 1
    await asyncio.sleep(TEST_BUDGET + 1.2)  # "old" is forgotten one budget (and a second) after
    assert "old" not in coordinator.slots.suppliers
    async with Redis.from_url(redis_server.url) as redis:
        records = await redis.hgetall("quoteflow:state")
    [record] = records.values()
    assert b"old" not in record
    assert b"new" in record
