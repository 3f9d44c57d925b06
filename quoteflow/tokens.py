"""One supplier's OAuth2 access token: fetched, kept, refreshed ahead of its end.

The client-credentials grant (RFC 6749 section 4.4) gives QuoteFlow a bearer
token that expires. A ``TokenKeeper`` per supplier (owned by its supplier
client entry, never global) holds it:

    fetch      one at a time, however many requests need it: every request
               without a valid token waits for the same fetch, each under its
               own deadline (a request leaving does not cancel the fetch)
    refresh    in the background, when 80 % of ``expires_in`` has passed or 60 s
               before the end, whichever is later: in steady state no request
               waits for the token endpoint
    failure    the token endpoint down, slow or refusing: the supplier's
               requests are ``auth_failed`` (``supplier.py``), and the next fetch
               waits 1 s, then 2, 4 ... up to ``RETRY_MAX``; a token still valid
               is used until it ends
    401        the supplier refused the token: ``drop`` forgets it, and the next
               request's wait starts one fresh fetch

A token fetch goes through QuoteFlow's one ``ClientSession`` but holds no
outbound slot: its connection comes from room the connector keeps for token
fetches (``app.py``), never from behind supplier attempts.

The token and the client secret never leave this module but as the
``Authorization`` header of an attempt: not in a log line, an error, a
``repr`` or a metric.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from typing import Final
from urllib.parse import quote_plus

import aiohttp

from quoteflow.catalogue import OAuth2Client
from quoteflow.logs import log_event

log = logging.getLogger("quoteflow")

REFRESH_AT: Final = 0.8
"""Share of a token's lifetime after which a new one is fetched..."""
REFRESH_MARGIN: Final = 60.0
"""...or this many seconds before its end, whichever is later: a fixed margin alone
would refetch a short-lived token without end."""
DEFAULT_LIFETIME: Final = 3600.0
"""A token answered without ``expires_in`` (RFC 6749 only recommends it) is kept this long."""
RETRY_MIN: Final = 1.0
RETRY_MAX: Final = 8.0
"""Seconds between fetches after a failure: from the first, doubling, to the last."""
MAX_TOKEN_BODY: Final = 64 * 1024
MAX_TOKEN_LENGTH: Final = 8192

OK: Final = "ok"
REFUSED: Final = "refused"
"""The token endpoint refused the credentials (400 or 401: ``invalid_client``...)."""
ERROR: Final = "error"
"""Any other status, a body that is no token, or the connection failed."""
TIMEOUT: Final = "timeout"
"""No answer within the ``oauth2.timeout``."""

FetchListener = Callable[[str, str], None]
"""Told of every fetch: the supplier and its outcome (``OK``, ``REFUSED``...)."""


class TokenUnavailable(Exception):
    """No valid token, and none is coming now: the last fetch failed and the next waits."""


class TokenKeeper:
    """The access token of one supplier's OAuth2 client, always one fetch at a time."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        client: OAuth2Client,
        supplier: str,
        listener: FetchListener | None = None,
    ) -> None:
        self._session = session
        self.client = client
        self.supplier = supplier
        self._listener = listener
        self._authorization: str | None = None
        """``Bearer <token>``, ready for the header; ``None`` without a valid token."""
        self._expires_at = 0.0
        self._fetched_at = -math.inf
        self._dropped = False
        """A token was refused since the last fetch..."""
        self._replaces_dropped = False
        """...and the token held now was fetched after such a refusal."""
        self._fetch: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._failures = 0
        self._not_before = 0.0
        """No fetch starts before this (``time.monotonic()``) after a failure."""
        self._closed = False
        self._form, self._headers = _token_request(client)

    def __repr__(self) -> str:
        return f"<TokenKeeper supplier={self.supplier!r} valid={self.current() is not None}>"

    @property
    def fetching(self) -> bool:
        """A token request is under way."""
        return self._fetch is not None

    def start(self) -> None:
        """Fetch the first token now, before any request needs it."""
        self._begin()

    def current(self) -> str | None:
        """The ``Authorization`` value of a valid token, or ``None``: then ``wait``."""
        authorization = self._authorization
        if authorization is not None and time.monotonic() >= self._expires_at:
            self._authorization = authorization = None
        return authorization

    async def wait(self) -> str:
        """A valid token's ``Authorization`` value, after the one fetch under way if need be.

        Raises ``TokenUnavailable`` at once while fetches back off after a
        failure, or when the fetch waited for brings no token. Cancelling the
        waiter (its deadline) leaves the fetch running for the others.
        """
        authorization = self.current()
        if authorization is not None:
            return authorization
        fetch = self._fetch or self._begin()
        if fetch is None:
            raise TokenUnavailable(self.supplier)
        await asyncio.shield(fetch)
        authorization = self.current()
        if authorization is None:
            raise TokenUnavailable(self.supplier)
        return authorization

    def drop(self, authorization: str) -> None:
        """The supplier refused ``authorization`` (a 401): never send it again.

        The next ``wait`` fetches a new one at once. But if that one is refused
        too within ``RETRY_MIN`` of its fetch, the next waits until then: a
        supplier that refuses every token must not turn each request into a
        token fetch.
        """
        if self._authorization == authorization:
            self._authorization = None
            if self._replaces_dropped and time.monotonic() - self._fetched_at < RETRY_MIN:
                self._not_before = max(self._not_before, self._fetched_at + RETRY_MIN)
            self._dropped = True

    def retire(self) -> None:
        """No more fetches or refreshes (a reload replaced this client); one under way ends."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def close(self) -> None:
        """At shutdown: stop refreshing and end a fetch under way."""
        self.retire()
        fetch = self._fetch
        if fetch is not None:
            fetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fetch

    def _begin(self) -> asyncio.Task[None] | None:
        """Start the one fetch, unless one runs, a failure's wait is not over, or retired."""
        if self._fetch is not None:
            return self._fetch
        if self._closed or time.monotonic() < self._not_before:
            return None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fetch = asyncio.get_running_loop().create_task(
            self._run(), name=f"quoteflow-token-{self.supplier}"
        )
        return self._fetch

    def _again(self, delay: float) -> None:
        """The next fetch, ``delay`` seconds from now, whether or not a request asks."""
        if self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._begin)

    async def _run(self) -> None:
        try:
            sent = time.monotonic()
            outcome, token, lifetime = await self._request()
            if self._listener is not None:
                self._listener(self.supplier, outcome)
            if token is not None:
                self._failures = 0
                self._not_before = 0.0
                # From when it was asked for: the token endpoint's clock started then at the latest.
                self._authorization = f"Bearer {token}"
                self._expires_at = sent + lifetime
                self._fetched_at = time.monotonic()
                self._replaces_dropped, self._dropped = self._dropped, False
                self._again(max(REFRESH_AT * lifetime, lifetime - REFRESH_MARGIN))
                return
            self._failures += 1
            delay = min(RETRY_MAX, RETRY_MIN * 2 ** (self._failures - 1))
            delay *= random.uniform(1.0, 1.2)  # workers that failed together spread out
            self._not_before = time.monotonic() + delay
            log_event(
                log,
                logging.WARNING,
                "token_fetch_failed",
                {
                    "supplier": self.supplier,
                    "outcome": outcome,
                    "failures": self._failures,
                    "retry_in_ms": round(delay * 1000),
                },
            )
            self._again(delay)
        finally:
            self._fetch = None

    async def _request(self) -> tuple[str, str | None, float]:
        """One token request: its outcome, and the token with its lifetime if it gave one."""
        client = self.client
        try:
            async with asyncio.timeout(client.timeout):
                async with self._session.post(
                    client.token_url,
                    data=self._form,
                    headers=self._headers,
                    allow_redirects=False,
                ) as response:
                    if response.status in (400, 401):
                        return REFUSED, None, 0.0
                    if response.status != 200:
                        return ERROR, None, 0.0
                    body = await response.content.read(MAX_TOKEN_BODY + 1)
        except TimeoutError:
            return TIMEOUT, None, 0.0
        except aiohttp.ClientError:
            return ERROR, None, 0.0
        if len(body) > MAX_TOKEN_BODY:
            return ERROR, None, 0.0
        found = _token_from(body)
        if found is None:
            return ERROR, None, 0.0
        return OK, found[0], found[1]


def _token_request(client: OAuth2Client) -> tuple[dict[str, str], dict[str, str]]:
    """The form and headers of every token request of ``client``, built once."""
    form = {"grant_type": "client_credentials"}
    if client.scope:
        form["scope"] = client.scope
    form.update(client.params)
    headers = {"Accept": "application/json"}
    if client.auth == "basic":
        # Section 2.3.1: each part form-encoded before they are joined and encoded.
        pair = f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    else:
        form["client_id"] = client.client_id
        form["client_secret"] = client.client_secret
    return form, headers


def _token_from(body: bytes) -> tuple[str, float] | None:
    """The access token and its lifetime from a token answer, or ``None`` if it has none."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    token = answer.get("access_token")
    if (
        type(token) is not str
        or not 0 < len(token) <= MAX_TOKEN_LENGTH
        or not token.isascii()
        or not token.isprintable()
        or " " in token
    ):
        return None
    token_type = answer.get("token_type", "Bearer")
    if type(token_type) is not str or token_type.lower() != "bearer":
        return None
    lifetime = answer.get("expires_in", DEFAULT_LIFETIME)
    if type(lifetime) is str and lifetime.isdigit():
        lifetime = int(lifetime)  # some token endpoints send a string
    if type(lifetime) not in (int, float) or not math.isfinite(lifetime) or lifetime <= 0:
        return None
    return token, float(lifetime)
