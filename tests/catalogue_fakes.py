"""Suppliers of any name on real sockets, and catalogue files that point at them."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
from aiohttp import web

Answer = Callable[[web.Request, str], Awaitable[web.StreamResponse]]


def offer(name: str) -> dict[str, int]:
    """The price and stock a fake supplier called ``name`` quotes: derived from the name."""
    seed = zlib.crc32(name.encode())
    return {
        "unit_cents": 500 + seed % 1000,
        "shipping_cents": 100 + (seed >> 10) % 400,
        "stock": 10 + (seed >> 20) % 90,
    }


async def protocol_answer(request: web.Request, name: str) -> web.StreamResponse:
    """QuoteFlow's supplier protocol: this supplier's quote for the SKU asked."""
    return web.json_response({"supplier": name, "sku": request.query["sku"], **offer(name)})


@attrs.frozen
class Seen:
    """One request as a fake supplier received it."""

    supplier: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


class NamedSuppliers:
    """Suppliers of any name behind one server, at ``/q/{name}``, answering by script."""

    def __init__(self, names: Iterable[str]) -> None:
        self.answers: dict[str, Answer] = dict.fromkeys(names, protocol_answer)
        self.seen: list[Seen] = []
        self.in_flight: dict[str, int] = dict.fromkeys(self.answers, 0)
        self.max_in_flight: dict[str, int] = dict.fromkeys(self.answers, 0)
        self.app = web.Application()
        self.app.router.add_get("/q/{name}", self._handle)
        self.url = ""
        """Base URL, known once the server listens."""

    def url_of(self, name: str) -> str:
        """The URL a catalogue entry gives for supplier ``name``."""
        return f"{self.url}q/{name}"

    def count(self, name: str) -> int:
        """How many requests reached supplier ``name``."""
        return sum(1 for seen in self.seen if seen.supplier == name)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.seen.append(Seen(name, request.path, dict(request.query), dict(request.headers)))
        answer = self.answers.get(name)
        if answer is None:
            return web.json_response({"error": "unknown supplier"}, status=404)
        self.in_flight[name] += 1
        self.max_in_flight[name] = max(self.max_in_flight[name], self.in_flight[name])
        try:
            return await answer(request, name)
        finally:
            self.in_flight[name] -= 1


def always(status: int) -> Answer:
    """Answer every request with ``status`` and a small JSON error body."""

    async def answer(request: web.Request, name: str) -> web.StreamResponse:
        return web.json_response({"error": "no"}, status=status)

    return answer


def after(seconds: float, then: Answer = protocol_answer) -> Answer:
    """Wait ``seconds``, then answer as ``then`` does."""

    async def answer(request: web.Request, name: str) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await then(request, name)

    return answer


def json_answer(obj: Any) -> Answer:
    """A 200 with ``obj`` as its JSON body, whatever was asked (a foreign shape)."""

    async def answer(request: web.Request, name: str) -> web.StreamResponse:
        return web.json_response(obj)

    return answer


def toml_value(value: Any) -> str:
    """A Python value as TOML (the few types a catalogue uses: inline tables and arrays too)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[ " + ", ".join(toml_value(v) for v in value) + " ]"
    return repr(value)


def write_catalogue(path: Path, suppliers: Iterable[dict[str, Any]]) -> str:
    """Write ``suppliers`` as a catalogue file of ``[[supplier]]`` tables; return its path."""
    tables = []
    for supplier in suppliers:
        lines = ["[[supplier]]"] + [f"{k} = {toml_value(v)}" for k, v in supplier.items()]
        tables.append("\n".join(lines))
    path.write_text("\n\n".join(tables) + "\n")
    return str(path)
