"""One attempt on the wire: send it, read the answer, classify what came back.

This is the only module that catches aiohttp, socket and decoding errors. An
attempt ends in one of three ways, and the attempt loop (``supplier.py``)
reads only that (``calls.AttemptResult``):

    a 200's body             decoded here into a quote (or a batch's lines)
    failure, retryable       503, one of TRANSIENT_ERRORS, a body cut short,
                             a 401 of a supplier with an OAuth2 client
    failure, final           any other status, invalid data

Any other exception is a bug in QuoteFlow and propagates untouched. Nothing
here catches a bare ``TimeoutError``: the request's deadline is enforced
around the attempt loop, and its cancellation must reach the caller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import attrs
from aiohttp import hdrs
from aiohttp.http_exceptions import ContentLengthError, TransferEncodingError

from quoteflow.calls import Answer, AttemptResult, Call, SupplierState
from quoteflow.catalogue import Adapter
from quoteflow.codec import (
    decode_batch_answer,
    decode_supplier_json,
    decode_supplier_quote,
    supplier_quote_from,
)
from quoteflow.errors import InvalidSupplierData
from quoteflow.logs import log_event
from quoteflow.models import (
    INVALID_DATA,
    NOT_FOUND,
    OK,
    TRANSPORT_ERROR,
    Asked,
    Failure,
    SupplierQuote,
    http_failure_code,
)
from quoteflow.pauses import Pauses, pause_for
from quoteflow.retry import retry_after_delay

log = logging.getLogger("quoteflow")

TRANSIENT_ERRORS: Final = (
    aiohttp.ClientConnectorError,  # refused or unreachable before a byte was sent
    aiohttp.ClientOSError,  # reset by the peer (errno 104) while sending or reading
    aiohttp.ClientConnectionResetError,  # the transport was already closed when writing
    aiohttp.ServerDisconnectedError,  # closed before or while answering
    aiohttp.ConnectionTimeoutError,  # socket connect timeout (ClientTimeout.sock_connect)
    aiohttp.SocketTimeoutError,  # silence while reading (ClientTimeout.sock_read)
)
"""Failures of the connection, not of the supplier's data: worth one more attempt.

Named one by one on purpose: ``aiohttp.ClientError`` would also retry bad data
and misconfiguration. A body cut short is retried too, but it arrives as a
``ClientPayloadError`` shared with bad ``Content-Encoding``; see ``Wire.fetch``.
"""

NEVER_RETRIED: Final = (aiohttp.ClientSSLError,)
"""Subclasses of a transient class that another attempt cannot fix."""

TRUNCATION_CAUSES: Final = (ContentLengthError, TransferEncodingError)
"""Causes of a ``ClientPayloadError`` that mean "the body was cut short"."""


class Wire:
    """Sends attempts through the app's one ``ClientSession`` and reads their answers."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        pauses: Pauses,
        *,
        max_body: int,
        keep_cache_control: bool = False,
    ) -> None:
        self._session = session
        self.pauses = pauses
        """Told of a 429 with ``Retry-After``: nobody asks that supplier until then."""
        self._max_body = max_body
        self._keep_cache_control = keep_cache_control
        """Carry each 200 answer's ``Cache-Control`` out on its quote, for the quote cache."""

    async def fetch(
        self,
        state: SupplierState,
        call: Call,
        headers: Mapping[str, str],
        authorization: str | None,
    ) -> bytes | Answer | AttemptResult:
        """The body of a 200 answer, or the classified failure; the response is always released."""
        shaped = call.shaped
        try:
            async with (
                self._session.get(call.url, headers=headers, **state.get_options)
                if shaped is None
                else self._session.request(
                    state.shape_method,
                    call.url,
                    headers=headers,
                    data=shaped.body,
                    **state.get_options,
                )
            ) as response:
                if response.status != 200:
                    if response.status == 429:
                        # With Retry-After: nobody asks it again until then (pauses.py).
                        asked_to_wait = pause_for(response.headers.get("Retry-After"), time.time())
                        if asked_to_wait is not None:
                            self.pauses.pause(state.spec.name, asked_to_wait)
                    if response.status == 401 and authorization is not None:
                        assert state.tokens is not None
                        state.tokens.drop(authorization)
                        return AttemptResult(
                            None, http_failure_code(401), True, 401, fresh_token=True
                        )
                    retryable = response.status == 503
                    return AttemptResult(
                        None,
                        http_failure_code(response.status),
                        retryable=retryable,
                        status=response.status,
                        retry_after=retry_after_delay(response.headers.get("Retry-After"))
                        if retryable
                        else None,
                    )
                body = await self._read_body(response)
                if self._keep_cache_control:
                    # An answer that varies with the request's headers is never
                    # reused: QuoteFlow's differ on every request (X-Request-ID).
                    varies = hdrs.VARY in response.headers
                    cache_control = None if varies else response.headers.get(hdrs.CACHE_CONTROL)
                    return Answer(body, cache_control)
                return body
        except NEVER_RETRIED:
            return AttemptResult(None, TRANSPORT_ERROR)
        except TRANSIENT_ERRORS:
            return AttemptResult(None, TRANSPORT_ERROR, retryable=True)
        except aiohttp.ClientPayloadError as exc:
            if isinstance(exc.__cause__, TRUNCATION_CAUSES):
                return AttemptResult(None, TRANSPORT_ERROR, retryable=True, status=200)
            return AttemptResult(None, INVALID_DATA, status=200)  # e.g. bad Content-Encoding
        except aiohttp.ClientResponseError:
            # aiohttp's parser rejected the reply as HTTP (it reports status 400,
            # which the supplier never sent): malformed data, not ``http_400``.
            return AttemptResult(None, INVALID_DATA)
        except InvalidSupplierData:  # over the body cap
            return AttemptResult(None, INVALID_DATA, status=200)

    @staticmethod
    def decode(
        state: SupplierState,
        body: bytes,
        supplier: str,
        call: Call,
        cache_control: str | None = None,
    ) -> AttemptResult:
        if call.lines:
            lines = _batch_answer(state, body, call)
            if lines is None:
                return AttemptResult(None, INVALID_DATA, status=200)
            if cache_control is not None:  # the answer's, for each of its quotes
                lines = {
                    sku: attrs.evolve(out, cache_control=cache_control)
                    if isinstance(out, SupplierQuote)
                    else out
                    for sku, out in lines.items()
                }
            return AttemptResult(None, OK, status=200, lines=lines)
        sku = call.request.sku
        try:
            if state.adapter is None:
                quote = decode_supplier_quote(
                    body, supplier=supplier, sku=sku, currency=state.spec.currency
                )
            else:
                quote = _adapted(state, body, sku, call.asked)
        except InvalidSupplierData as exc:
            return AttemptResult(None, INVALID_DATA, status=200, problem=_problem(exc))
        if cache_control is not None:
            quote = attrs.evolve(quote, cache_control=cache_control)
        return AttemptResult(quote, OK, status=200)

    async def _read_body(self, response: aiohttp.ClientResponse) -> bytes:
        """The decoded body, refused as soon as it grows past the cap."""
        declared = response.content_length
        if declared is not None and "Content-Encoding" not in response.headers:
            # Not encoded: Content-Length is the decoded size, known up front.
            if declared > self._max_body:
                raise InvalidSupplierData(f"body of {declared} bytes is over the cap")
            return await response.read()
        body = bytearray()
        async for chunk in response.content.iter_any():
            body += chunk
            if len(body) > self._max_body:
                raise InvalidSupplierData(f"body is over the cap of {self._max_body} bytes")
        return bytes(body)


def _batch_answer(
    state: SupplierState, body: bytes, call: Call
) -> dict[str, SupplierQuote | Failure] | None:
    """A batch call's 200 read line by line: a bad entry fails its own line alone.

    Entries are matched by SKU, never by position. None: the body is not the
    protocol (or an adapter raised), ``invalid_data`` for every line.
    """
    supplier = state.spec.name
    invalid = Failure(supplier, INVALID_DATA)
    entries: Mapping[str, object]
    try:
        if state.adapter is None:
            entries = decode_batch_answer(body)
        else:
            entries = _batch_adapted(state.adapter, body, supplier, call)
    except InvalidSupplierData:
        return None
    answer: dict[str, SupplierQuote | Failure] = {}
    for line in call.lines:
        entry = entries.get(line.sku)
        if entry == NOT_FOUND:
            answer[line.sku] = Failure(supplier, NOT_FOUND)
            continue
        try:
            answer[line.sku] = supplier_quote_from(
                entry,
                supplier=supplier,
                sku=line.sku,
                currency=state.spec.currency,
                adapted=state.adapter is not None,
            )
        except InvalidSupplierData as exc:
            answer[line.sku] = invalid  # missing, malformed, or another SKU's
            fields = {"supplier": supplier, "sku": line.sku, "problem": _problem(exc)}
            log_event(log, logging.WARNING, "invalid_line", fields)
    return answer


def _problem(exc: InvalidSupplierData) -> str:
    """The rule a supplier's data broke, for the bill and the log: the field first, bounded."""
    text = str(exc)
    return text if len(text) <= 200 else text[:199] + "…"


def _batch_adapted(adapter: Adapter, body: bytes, supplier: str, call: Call) -> Mapping[str, Any]:
    """A batch body through the catalogue's adapter: SKU → quote mapping or ``"not_found"``."""
    scenario = call.request.scenario
    asked = [Asked(supplier, line.sku, line.quantity, scenario) for line in call.lines]
    mapped = _mapping_from(adapter, decode_supplier_json(body), asked, supplier)
    return {
        sku: (entry if entry == NOT_FOUND else dict(entry) if isinstance(entry, Mapping) else None)
        for sku, entry in mapped.items()
        if isinstance(sku, str)
    }


def _adapted(state: SupplierState, body: bytes, sku: str, asked: Asked | None) -> SupplierQuote:
    """A foreign body through the catalogue's adapter, then the same strict checks as any."""
    adapter, supplier = state.adapter, state.spec.name
    assert adapter is not None
    mapped = _mapping_from(adapter, decode_supplier_json(body), asked, supplier)
    return supplier_quote_from(
        dict(mapped), supplier=supplier, sku=sku, currency=state.spec.currency, adapted=True
    )


def _mapping_from(
    adapter: Adapter, payload: Any, asked: object | None, supplier: str
) -> Mapping[Any, Any]:
    """What the adapter makes of ``payload`` (and ``asked``), if it is a mapping.

    Whatever goes wrong in the adapter is the supplier's data being unusable:
    ``invalid_data``, logged with the supplier and the exception's class only
    (its message might quote the body).
    """
    try:
        # Foreign code: its type hint is a hope.
        mapped: object = adapter(payload) if asked is None else adapter(payload, asked)
    except Exception as exc:  # any failure of foreign code is bad data
        failed = type(exc).__name__
        log_event(log, logging.WARNING, "adapter_failed", {"supplier": supplier, "error": failed})
        raise InvalidSupplierData(f"adapter raised {failed}") from None
    if not isinstance(mapped, Mapping):
        returned = f"returned {type(mapped).__name__}"
        log_event(log, logging.WARNING, "adapter_failed", {"supplier": supplier, "error": returned})
        raise InvalidSupplierData("adapter returned no mapping")
    return mapped
