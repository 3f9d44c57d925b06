"""Adapters: a foreign JSON shape through the documented adapter, and one that fails."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_aiohttp import AiohttpClient, AiohttpServer

from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.options import load_catalogue
from tests.catalogue_fakes import NamedSuppliers, json_answer, write_catalogue
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT

DOC = Path(__file__).parent.parent / "docs" / "suppliers.md"

ACME = {
    "item": {"code": "KB-001"},
    "price": {"amount": "11.50", "currency": "EUR"},
    "delivery": {"cost": "2.00"},
    "available": 40,
}


def _worked_adapter() -> str:
    """The Python block under "A worked adapter" in docs/suppliers.md, as written there."""
    section = DOC.read_text().split("### A worked adapter", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def _raising(payload: Any) -> dict[str, Any]:
    raise RuntimeError(f"cannot read {payload!r}")  # the message quotes the body: never logged


def _not_a_mapping(payload: Any) -> list[int]:
    return [1, 2, 3]


@pytest.fixture
def adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package ``doc_adapters`` importable by QuoteFlow, holding the docs' adapter."""
    package = tmp_path / "doc_adapters"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "acme.py").write_text(_worked_adapter())
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "doc_adapters.acme:acme"
    for name in [m for m in sys.modules if m.startswith("doc_adapters")]:
        del sys.modules[name]


AT_ONCE_BUDGET = 4 * TEST_BUDGET
"""Every fake here answers at once and no test waits out a deadline: a budget with room
for a loaded machine's stalls costs nothing (seen: an instant answer cut at 0.5 s beside
three other test workers)."""


async def _quoteflow(
    aiohttp_client: AiohttpClient, tmp_path: Path, entries: list[dict[str, Any]]
) -> Any:
    path = write_catalogue(tmp_path / "suppliers.toml", entries)
    settings = Settings(
        budget=AT_ONCE_BUDGET, connect_timeout=TEST_CONNECT_TIMEOUT, suppliers_file=path
    )
    catalogue = load_catalogue(settings, {})
    return await aiohttp_client(create_app(settings, catalogue=catalogue, environ={}))


async def _serve(aiohttp_server: AiohttpServer, *names: str) -> NamedSuppliers:
    fake = NamedSuppliers(names)
    server = await aiohttp_server(fake.app)
    fake.url = str(server.make_url("/"))
    return fake


async def test_the_documented_adapter_turns_acme_json_into_a_quote(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient, tmp_path: Path, adapters: str
) -> None:
    """The docs' worked adapter makes ACME's decimal euros a ranked quote in cents."""
    fake = await _serve(aiohttp_server, "acme")
    fake.answers["acme"] = json_answer(ACME)
    client = await _quoteflow(
        aiohttp_client,
        tmp_path,
        [{"name": "acme", "url": fake.url_of("acme"), "adapter": adapters}],
    )
    body = await (await client.post("/api/quotes", json={"quantity": 2})).json()
    assert body["quotes"] == [
        {
            "supplier": "acme",
            "sku": "KB-001",
            "unit_cents": 1150,
            "shipping_cents": 200,
            "stock": 40,
            "total_cents": 2500,
        }
    ]


@pytest.mark.parametrize(
    "foreign",
    [
        {**ACME, "price": {"amount": "11.50", "currency": "USD"}},  # the adapter raises
        {**ACME, "available": "40"},  # the adapter passes a string: the strict checks refuse
        {**ACME, "price": {"amount": "11.505", "currency": "EUR"}},  # a fraction of a cent
        {"unexpected": True},  # KeyError in the adapter
    ],
)
async def test_what_the_documented_adapter_cannot_use_is_invalid_data(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    adapters: str,
    foreign: dict[str, Any],
) -> None:
    """An adapter that raises, or returns a wrong type, gives invalid_data after one attempt."""
    fake = await _serve(aiohttp_server, "acme")
    fake.answers["acme"] = json_answer(foreign)
    client = await _quoteflow(
        aiohttp_client,
        tmp_path,
        [{"name": "acme", "url": fake.url_of("acme"), "adapter": adapters}],
    )
    body = await (await client.post("/api/quotes", json={})).json()
    assert body["failures"] == [{"supplier": "acme", "code": "invalid_data"}]
    assert fake.count("acme") == 1


@pytest.mark.parametrize(
    ("adapter", "error"),
    [
        ("tests.test_adapters:_raising", "RuntimeError"),
        ("tests.test_adapters:_not_a_mapping", "returned list"),
    ],
)
async def test_a_failing_adapter_is_logged_by_class_never_by_body(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    adapter: str,
    error: str,
) -> None:
    """One ``adapter_failed`` event with the supplier and the exception class; the body unseen."""
    fake = await _serve(aiohttp_server, "odd", "fine")
    fake.answers["odd"] = json_answer({"secret_field": "do-not-log-me"})
    client = await _quoteflow(
        aiohttp_client,
        tmp_path,
        [
            {"name": "odd", "url": fake.url_of("odd"), "adapter": adapter},
            {"name": "fine", "url": fake.url_of("fine")},
        ],
    )
    with caplog.at_level(logging.DEBUG, logger="quoteflow"):
        body = await (await client.post("/api/quotes", json={})).json()
    assert body["failures"] == [{"supplier": "odd", "code": "invalid_data"}]
    assert [quote["supplier"] for quote in body["quotes"]] == ["fine"]
    assert fake.count("odd") == 1
    failed = [r for r in caplog.records if getattr(r, "event", None) == "adapter_failed"]
    assert [r.fields for r in failed] == [{"supplier": "odd", "error": error}]  # type: ignore[attr-defined]
    logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "do-not-log-me" not in logged
