"""A supplier API as real ones are, on a real socket: any method and path, and a token endpoint.

``ForeignApi`` records every request exactly as it arrived (method, the raw
path, the query, the headers, the body bytes) and answers by script. Its
``/oauth2/token`` is an RFC 6749 client-credentials endpoint with switchable
behaviour, and its bearer check refuses what it did not issue.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote_plus

import attrs
from aiohttp import web

from tests.catalogue_fakes import offer, toml_value


@attrs.frozen
class Arrived:
    """One request as the supplier received it."""

    method: str
    raw_path: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


Answer = Callable[[web.Request, Arrived], Awaitable[web.StreamResponse]]


@attrs.define
class TokenEndpoint:
    """How ``/oauth2/token`` behaves now, and what it saw."""

    client_id: str = "qf-client"
    client_secret: str = "s3cr3t-v@lue"
    expires_in: float = 3600
    mode: str = "ok"
    """``ok``, ``refuse`` (401 invalid_client), ``error`` (500), ``slow``, ``down`` (reset)."""
    delay: float = 0.0
    """Seconds a ``slow`` endpoint waits before answering."""
    fetches: list[dict[str, str]] = attrs.Factory(list)
    """Each token request's form, with ``basic`` set to the Basic credentials if any."""
    fetch_times: list[float] = attrs.Factory(list)
    issued: dict[str, float] = attrs.Factory(dict)
    """Token → when it ends (``time.monotonic()``)."""

    def revoke(self) -> None:
        self.issued.clear()

    def valid(self, authorization: str | None) -> bool:
        if authorization is None or not authorization.startswith("Bearer "):
            return False
        ends = self.issued.get(authorization.removeprefix("Bearer "))
        return ends is not None and time.monotonic() < ends


async def quote_json(request: web.Request, arrived: Arrived) -> web.StreamResponse:
    """The supplier protocol's quote for the SKU in the path's last segment but one."""
    name = request.match_info.get("name", "x")
    return web.json_response({"supplier": name, "sku": request.match_info["sku"], **offer(name)})


class ForeignApi:
    """Routes: ``/oauth2/token``, and any method on ``/{name}/...`` answered by ``answer``."""

    def __init__(self) -> None:
        self.token = TokenEndpoint()
        self.arrived: list[Arrived] = []
        self.answer: Answer | None = None
        self.bearer_required = False
        self.bearer_names = frozenset({"harbor"})
        """The suppliers whose requests need a valid token (when ``bearer_required``)."""
        self.app = web.Application()
        self.app.router.add_post("/oauth2/token", self._token)
        self.app.router.add_route("*", "/{name}/{tail:.*}", self._any)
        self.url = ""

    def refused_tokens(self) -> int:
        return sum(1 for a in self.arrived if a.headers.get("X-Refused") == "1")

    async def _any(self, request: web.Request) -> web.StreamResponse:
        arrived = Arrived(
            request.method,
            request.raw_path,
            request.path,
            dict(request.query),
            dict(request.headers),
            await request.read(),
        )
        self.arrived.append(arrived)
        guarded = self.bearer_required and request.match_info["name"] in self.bearer_names
        if guarded and not self.token.valid(request.headers.get("Authorization")):
            return web.json_response(
                {"error": "invalid_token"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        assert self.answer is not None
        return await self.answer(request, arrived)

    async def _token(self, request: web.Request) -> web.StreamResponse:
        token = self.token
        form = {key: value for key, value in (await request.post()).items() if type(value) is str}
        basic = request.headers.get("Authorization", "")
        if basic.startswith("Basic "):
            pair = base64.b64decode(basic.removeprefix("Basic ")).decode()
            user, _, password = pair.partition(":")
            form["basic"] = f"{unquote_plus(user)}:{unquote_plus(password)}"
        token.fetches.append(form)
        token.fetch_times.append(time.monotonic())
        if token.mode == "down":
            transport = request.transport
            assert transport is not None
            transport.abort()
            return web.Response()
        if token.mode == "slow":
            await asyncio.sleep(token.delay)
        if token.mode == "error":
            return web.json_response({"error": "server_error"}, status=500)
        credentials = form.get("basic") or f"{form.get('client_id')}:{form.get('client_secret')}"
        if token.mode == "refuse" or credentials != f"{token.client_id}:{token.client_secret}":
            return web.json_response({"error": "invalid_client"}, status=401)
        issued = secrets.token_urlsafe(24)
        token.issued[issued] = time.monotonic() + token.expires_in
        return web.json_response(
            {"access_token": issued, "token_type": "Bearer", "expires_in": token.expires_in},
            headers={"Cache-Control": "no-store"},
        )


def catalogue_text(suppliers: list[dict[str, Any]]) -> str:
    """``suppliers`` as a catalogue file's text."""
    tables = []
    for supplier in suppliers:
        lines = ["[[supplier]]"] + [f"{k} = {toml_value(v)}" for k, v in supplier.items()]
        tables.append("\n".join(lines))
    return "\n\n".join(tables) + "\n"
