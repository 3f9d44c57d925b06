"""A catalogue of suppliers at their own URLs, on real sockets: fan-out, settings, headers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.catalogue import derived_offer
from provider_lab.state import LabConfig
from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.options import load_catalogue
from tests.catalogue_fakes import NamedSuppliers, after, always, offer, write_catalogue
from tests.conftest import LOADED_MARGIN, TEST_BUDGET, TEST_CONNECT_TIMEOUT

Client = TestClient[Any, Any]
Start = Callable[..., Awaitable[Client]]

SECRET = "tok-9f2c-never-logged"


async def _serve(aiohttp_server: AiohttpServer, *names: str) -> NamedSuppliers:
    fake = NamedSuppliers(names)
    server = await aiohttp_server(fake.app)
    fake.url = str(server.make_url("/"))
    return fake


@pytest.fixture
def start(aiohttp_client: AiohttpClient, tmp_path: Path) -> Start:
    """QuoteFlow serving a catalogue file of ``entries``; keywords override settings."""

    async def start_with(
        entries: list[dict[str, Any]], environ: dict[str, str] | None = None, **overrides: Any
    ) -> Client:
        path = write_catalogue(tmp_path / "suppliers.toml", entries)
        values: dict[str, Any] = {
            "budget": TEST_BUDGET,
            "connect_timeout": TEST_CONNECT_TIMEOUT,
            "suppliers_file": path,
            **overrides,
        }
        settings = Settings(**values)
        environ = environ or {}
        catalogue = load_catalogue(settings, environ)
        return await aiohttp_client(create_app(settings, catalogue=catalogue, environ=environ))

    return start_with


def _total(name: str, quantity: int = 2) -> int:
    quote = offer(name)
    return quote["unit_cents"] * quantity + quote["shipping_cents"]


async def test_five_suppliers_on_three_ports_all_quote(
    aiohttp_server: AiohttpServer, start: Start
) -> None:
    """Five suppliers behind three servers: each is asked once, at its own URL, and ranked."""
    first = await _serve(aiohttp_server, "north", "south")
    second = await _serve(aiohttp_server, "east")
    third = await _serve(aiohttp_server, "west", "centre")
    where = {"north": first, "south": first, "east": second, "west": third, "centre": third}
    client = await start([{"name": name, "url": fake.url_of(name)} for name, fake in where.items()])
    response = await client.post("/api/quotes", json={"sku": "A&scenario=broken", "quantity": 2})
    assert response.status == 200
    body = await response.json()
    assert body["failures"] == []
    ranked = sorted(where, key=lambda name: (_total(name), name))
    assert [quote["supplier"] for quote in body["quotes"]] == ranked
    assert body["best"]["total_cents"] == _total(ranked[0])
    for name, fake in where.items():
        (seen,) = [s for s in fake.seen if s.supplier == name]
        assert seen.path == f"/q/{name}"
        assert seen.query == {"sku": "A&scenario=broken", "scenario": "normal"}


async def test_failures_come_in_the_catalogue_order(
    aiohttp_server: AiohttpServer, start: Start
) -> None:
    """``failures`` lists suppliers in the file's order, not by name."""
    fake = await _serve(aiohttp_server, "zulu", "alpha", "mike")
    fake.answers["zulu"] = always(404)
    fake.answers["mike"] = always(500)
    client = await start([{"name": n, "url": fake.url_of(n)} for n in ("zulu", "alpha", "mike")])
    body = await (await client.post("/api/quotes", json={})).json()
    assert body["failures"] == [
        {"supplier": "zulu", "code": "http_404"},
        {"supplier": "mike", "code": "http_500"},
    ]
    assert [quote["supplier"] for quote in body["quotes"]] == ["alpha"]


async def test_a_catalogue_of_one(aiohttp_server: AiohttpServer, start: Start) -> None:
    """One supplier: its quote is the best, and the OpenAPI document names only it."""
    fake = await _serve(aiohttp_server, "solo")
    client = await start([{"name": "solo", "url": fake.url_of("solo")}])
    body = await (await client.post("/api/quotes", json={"quantity": 1})).json()
    assert body["best"]["supplier"] == "solo"
    assert body["failures"] == []
    document = await (await client.get("/openapi.json")).json()
    assert document["components"]["schemas"]["Supplier"]["enum"] == ["solo"]
    assert (
        document["components"]["schemas"]["QuoteResult"]["properties"]["failures"]["maxItems"] == 1
    )


async def test_a_header_from_the_environment_reaches_the_supplier_and_no_log(
    aiohttp_server: AiohttpServer, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """``${VAR}`` in a header is sent on every attempt, and appears in no log, metric or bill."""
    fake = await _serve(aiohttp_server, "vault", "plain")
    fake.answers["vault"] = always(503)  # two attempts, both logged at info
    entries = [
        {
            "name": "vault",
            "url": fake.url_of("vault"),
            "headers": {"Authorization": "Bearer ${VAULT_TOKEN}", "X-Tenant": "acme"},
        },
        {"name": "plain", "url": fake.url_of("plain")},
    ]
    with caplog.at_level(logging.DEBUG):
        client = await start(entries, environ={"VAULT_TOKEN": SECRET})
        answer = await client.post("/api/quotes?explain=1", json={})
        text = await answer.text()
        metrics = await (await client.get("/metrics")).text()
    vault = [seen for seen in fake.seen if seen.supplier == "vault"]
    assert len(vault) == 2
    assert {seen.headers["Authorization"] for seen in vault} == {f"Bearer {SECRET}"}
    assert {seen.headers["X-Tenant"] for seen in vault} == {"acme"}
    assert all(seen.headers["X-Request-ID"] for seen in vault)  # QuoteFlow's own still sent
    (plain,) = [seen for seen in fake.seen if seen.supplier == "plain"]
    assert "Authorization" not in plain.headers
    logged = "\n".join(f"{record.getMessage()} {record.__dict__}" for record in caplog.records)
    assert "supplier_attempt" in logged
    for where in (logged, text, metrics):
        assert SECRET not in where


async def test_each_supplier_has_its_own_read_timeout(
    aiohttp_server: AiohttpServer, start: Start
) -> None:
    """A short read timeout on one supplier makes its slow answer a transport error, twice."""
    fake = await _serve(aiohttp_server, "hasty", "patient")
    fake.answers["hasty"] = after(0.15)
    fake.answers["patient"] = after(0.15)
    entries = [
        {"name": "hasty", "url": fake.url_of("hasty"), "read_timeout": 0.05},
        {"name": "patient", "url": fake.url_of("patient")},
    ]
    client = await start(entries, budget=1.0)
    body = await (await client.post("/api/quotes?explain=1", json={})).json()
    assert body["failures"] == [{"supplier": "hasty", "code": "transport_error"}]
    assert [quote["supplier"] for quote in body["quotes"]] == ["patient"]
    assert fake.count("hasty") == 2
    assert fake.count("patient") == 1


async def test_each_supplier_has_its_own_share(aiohttp_server: AiohttpServer, start: Start) -> None:
    """A supplier with share 1 never has two attempts in flight; the other may have more."""
    fake = await _serve(aiohttp_server, "narrow", "wide")
    fake.answers["narrow"] = after(0.03)
    fake.answers["wide"] = after(0.03)
    entries = [
        {"name": "narrow", "url": fake.url_of("narrow"), "share": 1},
        {"name": "wide", "url": fake.url_of("wide")},
    ]
    client = await start(entries, budget=1.0)
    answers = await asyncio.gather(*(client.post("/api/quotes", json={}) for _ in range(5)))
    bodies = [await answer.json() for answer in answers]
    assert all(body["failures"] == [] for body in bodies)
    assert fake.max_in_flight["narrow"] == 1
    assert fake.max_in_flight["wide"] > 1


async def test_each_supplier_has_its_own_breaker(
    aiohttp_server: AiohttpServer, start: Start
) -> None:
    """breaker_failures = 1 opens after one failure; 0 keeps that supplier asked every time."""
    fake = await _serve(aiohttp_server, "touchy", "stoic")
    fake.answers["touchy"] = always(500)
    fake.answers["stoic"] = always(500)
    entries = [
        {"name": "touchy", "url": fake.url_of("touchy"), "breaker_failures": 1},
        {"name": "stoic", "url": fake.url_of("stoic"), "breaker_failures": 0},
    ]
    client = await start(entries)
    for _ in range(3):
        body = await (await client.post("/api/quotes", json={})).json()
    assert body["failures"] == [
        {"supplier": "touchy", "code": "circuit_open"},
        {"supplier": "stoic", "code": "http_500"},
    ]
    assert (fake.count("touchy"), fake.count("stoic")) == (1, 3)
    metrics = await (await client.get("/metrics")).text()
    assert 'quoteflow_circuit_state{supplier="touchy"} 2.0' in metrics
    assert 'quoteflow_circuit_state{supplier="stoic"}' not in metrics


async def test_more_suppliers_than_slots_answer_within_the_budget(
    aiohttp_server: AiohttpServer, start: Start
) -> None:
    """Eight suppliers, two slots: they queue under the one deadline and the answer is on time."""
    names = [f"s{i}" for i in range(8)]
    fake = await _serve(aiohttp_server, *names)
    for name in names:
        fake.answers[name] = after(0.1)
    client = await start(
        [{"name": n, "url": fake.url_of(n)} for n in names], outbound_limit=2, budget=0.35
    )
    started = time.monotonic()
    body = await (await client.post("/api/quotes", json={})).json()
    elapsed = time.monotonic() - started
    # The budget and the closed-loop margin: the caller shares QuoteFlow's loop
    # (seen: 0.69 s beside three other test workers).
    assert elapsed < 0.35 + 2 * LOADED_MARGIN
    codes = {failure["code"] for failure in body["failures"]}
    assert codes <= {"timeout"}
    assert 2 <= len(body["quotes"]) < 8  # some answered, the rest ran out of budget
    assert [f["supplier"] for f in body["failures"]] == [
        n for n in names if n not in {q["supplier"] for q in body["quotes"]}
    ]


async def test_two_labs_serve_one_catalogue_file(
    aiohttp_server: AiohttpServer, start: Start
) -> None:
    """Two provider labs serve the names of one catalogue; QuoteFlow ranks their derived offers."""
    names = ("north", "south", "east", "west")
    labs = [await aiohttp_server(create_lab(LabConfig(suppliers=names))) for _ in range(2)]
    entries = [
        {"name": name, "url": str(labs[index % 2].make_url(f"/quotes/{name}"))}
        for index, name in enumerate(names)
    ]
    client = await start(entries)
    body = await (await client.post("/api/quotes", json={"sku": "MN-270", "quantity": 1})).json()
    expected = []
    for name in names:
        offer = derived_offer(name, "MN-270")
        if offer.stock >= 1:
            expected.append((offer.unit_cents + offer.shipping_cents, name))
    assert [(q["total_cents"], q["supplier"]) for q in body["quotes"]] == sorted(expected)
    assert body["failures"] == []
