"""``POST /oauth2/token``: an OAuth2 token endpoint, client credentials grant (RFC 6749 §4.4).

The body is form-encoded (``application/x-www-form-urlencoded``):
``grant_type=client_credentials``, an optional ``scope`` and any other
parameters, which are kept (``GET /oauth2``'s ``last_params``, client
authentication left out) so a test can see what arrived. The client
authenticates by one of RFC 6749 §2.3.1's two forms: HTTP Basic with the
form-urlencoded id and secret, or ``client_id`` and ``client_secret`` in the
body. Checked in this order:

=====================================================  ===================================
the endpoint's fault (``PUT /oauth2``)                 reset, 500, or the rest after ``ms``
not form-encoded, not a form, a parameter repeated,    400 ``invalid_request``
both authentication forms at once, no ``grant_type``
``grant_type`` other than ``client_credentials``       400 ``unsupported_grant_type``
credentials missing, malformed or wrong                401 ``invalid_client``, with
                                                       ``WWW-Authenticate: Basic realm=...``
otherwise                                              200 a fresh bearer token
=====================================================  ===================================

The 200 is ``{"access_token": ..., "token_type": "Bearer", "expires_in": N}``
with ``Cache-Control: no-store`` and ``Pragma: no-cache`` (RFC 6749 §5.1).
Neither the secret nor a token is ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Final
from urllib.parse import parse_qsl, unquote_plus

from aiohttp import web

from provider_lab import answers
from provider_lab.answers import json_response
from provider_lab.state import STATE
from provider_lab.tokens import TokenKeeper

logger = logging.getLogger(__name__)

FORM: Final = "application/x-www-form-urlencoded"
GRANT: Final = "client_credentials"
AUTH_PARAMS: Final = ("client_id", "client_secret")
MAX_FIELDS: Final = 100
_CHALLENGE: Final = {"WWW-Authenticate": 'Basic realm="provider-lab"'}
_NO_STORE: Final = {"Cache-Control": "no-store", "Pragma": "no-cache"}


class _Refused(Exception):
    """A token request answered with an OAuth2 error; ``reason`` is for the log only."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason

    def answer(self) -> web.Response:
        headers = _CHALLENGE if self.status == 401 else {}
        return json_response(self.status, {"error": self.error}, **headers)


async def token(request: web.Request) -> web.StreamResponse:
    """Issue a bearer token to the lab's one client, unless a fault or the request says no."""
    keeper = request.app[STATE].tokens
    fault = keeper.fault
    if fault is not None:
        if fault.kind == "down":
            keeper.failed += 1
            logger.info("token_fault kind=down")
            answers.reset_connection(request)
            return answers.gone()
        if fault.kind == "http_500":
            keeper.failed += 1
            logger.info("token_fault kind=http_500")
            return json_response(500, {"error": "injected_http_500"})
        answered = False
        try:
            answered = await answers.wait_for(request, None, fault.ms / 1000) == "done"
        finally:
            # A client that gives up on a slow endpoint is a failed fetch (even if cancelled).
            if not answered:
                keeper.failed += 1
        if not answered:
            return answers.gone()
    try:
        client_id = _grant(request, await request.read(), keeper)
    except _Refused as refused:
        keeper.refused += 1
        logger.info("token_refused error=%s reason=%s", refused.error, refused.reason)
        return refused.answer()
    issued = keeper.issue(asyncio.get_running_loop().time())
    logger.info("token_issued client_id=%r expires_in=%d", client_id, keeper.expires_in)
    body = {"access_token": issued, "token_type": "Bearer", "expires_in": keeper.expires_in}
    return json_response(200, body, **_NO_STORE)


def _grant(request: web.Request, body: bytes, keeper: TokenKeeper) -> str:
    """The client id of a valid client-credentials request; ``_Refused`` if it is not one."""
    if request.content_type != FORM:
        raise _Refused(400, "invalid_request", f"Content-Type is {request.content_type}")
    try:
        pairs = parse_qsl(
            body.decode("utf-8"),
            keep_blank_values=True,
            strict_parsing=True,
            errors="strict",
            max_num_fields=MAX_FIELDS,
        )
    except ValueError:  # not UTF-8, a field without '=', too many fields
        raise _Refused(400, "invalid_request", "the body is not a form") from None
    params = dict(pairs)
    if len(params) != len(pairs):  # RFC 6749 §3.2: no parameter more than once
        raise _Refused(400, "invalid_request", "a parameter is repeated")
    keeper.last_params = {name: value for name, value in params.items() if name not in AUTH_PARAMS}
    header = request.headers.get("Authorization")
    if header is not None and any(name in params for name in AUTH_PARAMS):
        raise _Refused(400, "invalid_request", "two client authentication methods")
    grant_type = params.get("grant_type")
    if grant_type is None:
        raise _Refused(400, "invalid_request", "no grant_type")
    if grant_type != GRANT:
        raise _Refused(400, "unsupported_grant_type", f"grant_type {grant_type!r}")
    if header is not None:
        client_id, client_secret = basic_credentials(header)
    else:
        client_id, client_secret = params.get("client_id"), params.get("client_secret")
    if not keeper.credentials_match(client_id, client_secret):
        # No id in the reason: a client that mixed its fields up would log its secret.
        raise _Refused(401, "invalid_client", "credentials missing, malformed or wrong")
    assert client_id is not None  # matched
    return client_id


def basic_credentials(header: str) -> tuple[str | None, str | None]:
    """RFC 6749 §2.3.1's HTTP Basic form: ``(client_id, client_secret)``, or ``None`` s.

    ``Basic base64(urlencode(client_id) ":" urlencode(client_secret))``: each part
    form-urlencoded before base64, so either may contain ``:``, ``+`` or ``%``.
    """
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        client_id, colon, client_secret = decoded.partition(":")
        if not colon:
            return None, None
        return unquote_plus(client_id, errors="strict"), unquote_plus(
            client_secret, errors="strict"
        )
    except ValueError:  # not base64 (binascii.Error), not UTF-8
        return None, None
