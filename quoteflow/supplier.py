"""One supplier call: at most two HTTP attempts under the request's deadline.

This is the only module that catches aiohttp, socket and decoding errors. Each
attempt ends in one of three ways, and the retry loop reads only that:

    quote                     done
    failure, retryable        503, or one of TRANSIENT_ERRORS: try once more,
                              if ``_plan_retry`` finds it worth sending (the
                              supplier's Retry-After, the time left, the
                              supplier's retry budget: see ``retry.py``);
                              a 401 of a supplier with an OAuth2 client: once
                              more with a fresh token, on the same terms
    failure, final            any other status, invalid data: stop
    not sent                  no slot came while it could still finish
                              (``slots.py``), no OAuth2 token came
                              (``tokens.py``: ``auth_failed``), or the supplier
                              is paused after its 429 (``pauses.py``:
                              ``rate_limited``): answer now

Any other exception is a bug in QuoteFlow and propagates untouched.

The deadline itself is enforced by the caller (``service.py``) *around* this
loop, which is why nothing here catches a bare ``TimeoutError``: the deadline's
cancellation must reach the caller, never be mistaken for a socket timeout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Mapping
from typing import Any, Final, Protocol

import aiohttp
import attrs
from aiohttp import hdrs
from aiohttp.http_exceptions import ContentLengthError, TransferEncodingError
from yarl import URL

from quoteflow.callers import Rate
from quoteflow.catalogue import Adapter, Catalogue, Supplier
from quoteflow.codec import (
    decode_batch_answer,
    decode_supplier_json,
    decode_supplier_quote,
    supplier_quote_from,
)
from quoteflow.config import Settings
from quoteflow.errors import InvalidSupplierData
from quoteflow.logs import log_event
from quoteflow.models import (
    AUTH_FAILED,
    CANCELLED,
    INVALID_DATA,
    NOT_FOUND,
    OK,
    RATE_LIMITED,
    STOPPED_ATTEMPTS_EXHAUSTED,
    STOPPED_NO_SLOT_IN_TIME,
    STOPPED_NO_TIME,
    STOPPED_NO_TOKEN,
    STOPPED_NOT_RETRYABLE,
    STOPPED_PAUSED,
    STOPPED_RATE_LIMITED,
    STOPPED_RETRY_AFTER,
    STOPPED_RETRY_BUDGET,
    STOPPED_SUCCESS,
    TIMEOUT,
    TRANSPORT_ERROR,
    Asked,
    AttemptRecord,
    CartLine,
    Failure,
    MovingDeadline,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
    http_failure_code,
)
from quoteflow.pauses import Pauses, pause_for
from quoteflow.rates import LocalRates, RateMeter, Turns
from quoteflow.retry import (
    CUT_MEMORY,
    HEDGE_FLOOR,
    HEDGE_TAIL,
    AnswerTimes,
    AttemptTimeEstimate,
    RetryBudget,
    RetryLimiter,
    retry_after_delay,
)
from quoteflow.slots import OutboundLimiter, OutboundSlots
from quoteflow.templates import Shaped
from quoteflow.tokens import TokenKeeper, TokenUnavailable

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
``ClientPayloadError`` shared with bad ``Content-Encoding``; see ``_attempt``.
"""

NEVER_RETRIED: Final = (aiohttp.ClientSSLError,)
"""Subclasses of a transient class that another attempt cannot fix."""

FAIR_MARGIN: Final = 1.25
"""An attempt cut by the deadline counts against the supplier once it has run this
many times the longest of the supplier's recent answers (``breaker.py``). Not
1: an attempt QuoteFlow started with just the time it estimated the supplier
needs is QuoteFlow's bet, and answer times jitter by a few milliseconds."""

WHOLE_CHANCE: Final = 0.9
"""Share of the fan-out's time (the budget less the answer's reserve) after which an
attempt cut by the deadline always counts: a supplier that hangs is blamed even when
its recent answers were slow, or its read timeout is nearly the budget."""

SLOT_MARGIN: Final = 1.05
"""A call waits for a slot only while the deadline leaves this many times what its
supplier has been seen to need (``_Call.left``). Not 1: under a closed loop at
the slots' capacity the waiters' patience runs out at the very moment the
slots they wait for free up (the callers asked again as the last answers
came), and which of a request's three calls is handed a slot and which gives
up was decided by a millisecond — one per supplier, so requests were split
into partial answers. With the margin a request's calls give up together,
before the slots free, and its caller's next request is there to take them."""

TRUNCATION_CAUSES: Final = (ContentLengthError, TransferEncodingError)
"""Causes of a ``ClientPayloadError`` that mean "the body was cut short"."""


class AttemptListener(Protocol):
    """Told of each attempt as it is about to be sent (tracing: ``spans.Tracing``)."""

    def sending(self, attempt: int, url: URL, headers: dict[str, str], method: str) -> None:
        """Attempt number ``attempt`` goes to ``url``; ``headers`` may gain headers of its own.

        ``url`` is the one that may be shown: each secret of the catalogue's in it is ``***``.
        """
        ...


@attrs.frozen
class _AttemptResult:
    quote: SupplierQuote | None
    code: str
    retryable: bool = False
    status: int | None = None
    retry_after: float | None = None
    """Seconds the supplier asked us to wait (``Retry-After`` on a 503)."""
    fresh_token: bool = False
    """A 401 of a supplier with an OAuth2 client: its token was dropped, a new one may work."""
    not_sent: str | None = None
    """Why the attempt was never sent (the bill's ``stopped``), if it was not."""
    lines: dict[str, SupplierQuote | Failure] | None = None
    """A batch call's answer: an outcome for each line's SKU (``code`` is ``OK``)."""
    problem: str | None = None
    """What made a 200 ``invalid_data``: the field and the rule it broke."""


_NO_SLOT_IN_TIME: Final = _AttemptResult(None, TIMEOUT, not_sent=STOPPED_NO_SLOT_IN_TIME)
"""An attempt that gave its place in the slot queue up."""
_NO_TOKEN: Final = _AttemptResult(None, AUTH_FAILED, not_sent=STOPPED_NO_TOKEN)
"""An attempt that got no OAuth2 token: not the supplier's doing."""
_PAUSED: Final = _AttemptResult(None, RATE_LIMITED, not_sent=STOPPED_PAUSED)
_NO_TURN: Final = _AttemptResult(None, RATE_LIMITED, not_sent=STOPPED_RATE_LIMITED)
"""An attempt the supplier's outbound rate had no turn for while it could still finish."""
"""An attempt at a supplier paused after a 429 with ``Retry-After``: it asked for the wait."""


@attrs.define
class _Race:
    """A hedged call's two attempts: when the first was sent, and which lost."""

    sent: asyncio.Event = attrs.Factory(asyncio.Event)
    sent_at: float = 0.0
    lost: set[int] = attrs.Factory(set)
    """Attempts cancelled because the other won (not the deadline's cut)."""


@attrs.frozen
class _Answer:
    """A 200 body with the answer's ``Cache-Control`` (only when the quote cache wants it)."""

    body: bytes
    cache_control: str | None
    status: int = 200


@attrs.frozen
class _Call:
    url: URL
    request: QuoteRequest
    request_id: str
    deadline: float | MovingDeadline
    attempt_time: AttemptTimeEstimate
    shaped: Shaped | None = None
    """The request as the supplier's templates render it (``None``: the classic request)."""
    asked: Asked | None = None
    """What was asked, for an adapter that takes it."""
    lines: tuple[CartLine, ...] = ()
    """A batch call's lines; empty for a call about ``request`` alone."""

    def left(self, now: float) -> float:
        """How long an attempt may still wait for a slot (``slots.Patience``).

        Until the deadline leaves less than the supplier has been seen to need
        (``SLOT_MARGIN`` times). With nothing seen of it yet its time is
        unknown, so without end (the deadline's cancellation ends the wait) —
        but read again as each slot is handed out, so a call that queued
        before the first answers came is not sent once they show it has too
        little time left to finish.
        """
        if not self.attempt_time.seen:
            return math.inf
        return self.deadline - now - SLOT_MARGIN * self.needed(now)

    def needed(self, now: float) -> float:
        """The time the supplier has been seen to need for a request of this kind."""
        return self.attempt_time.needed_at(now, self.request.scenario)


def _record(
    attempt: int,
    waiting_since: float,
    started: float,
    ended: float,
    outcome: str,
    status: int | None = None,
    cut_short: bool = False,
    hedge: bool = False,
    problem: str | None = None,
) -> AttemptRecord:
    return AttemptRecord(
        attempt=attempt,
        started=waiting_since,
        slot_wait=started - waiting_since,
        duration=ended - started,
        outcome=outcome,
        status=status,
        cut_short=cut_short,
        hedge=hedge,
        problem=problem,
    )


_URLS_KEPT: Final = 1024
"""Distinct (SKU, scenario) URLs kept per supplier before the cache starts over."""


class _SupplierState:
    """What the process knows about one supplier, shared by every request.

    Built from the supplier's catalogue entry; a reload builds a new one,
    carrying over what was learned (the retry budget, the attempt times).
    """

    def __init__(
        self,
        supplier: Supplier,
        settings: Settings,
        retry_budget: RetryLimiter,
        attempt_time: AttemptTimeEstimate | None = None,
        answer_times: AnswerTimes | None = None,
    ) -> None:
        self.spec = supplier
        self.url = URL(supplier.url)
        self._urls: dict[tuple[str, str], URL] = {}
        self.attempt_time = attempt_time or AttemptTimeEstimate(
            settings.min_attempt_time, CUT_MEMORY * settings.budget
        )
        self.retry_budget = retry_budget
        self.headers = dict(supplier.headers)
        """The catalogue's headers, sent on every attempt (empty for the lab's suppliers)."""
        self.shape = supplier.shape
        self._shaped: dict[tuple[str, int, str], Shaped] = {}
        self.tokens: TokenKeeper | None = None
        """The OAuth2 token of a supplier with an ``oauth2`` client (set by ``SupplierClient``)."""
        self.hedge = supplier.hedge if supplier.batch is None else None
        """When a late first attempt is joined by the second (``_hedged``); None: never."""
        self.answer_times = (answer_times or AnswerTimes()) if self.hedge is not None else None
        """Recent answer times, for a percentile's hedge delay (kept across a reload)."""
        self.item_rate = supplier.batch is not None and supplier.batch.rate_unit == "item"
        self.told_too_large = False
        """A 413 to a batch call was logged (``batch_too_large``): once per catalogue entry."""
        """Its ``rate`` counts lines, not calls (``[supplier.batch] rate_unit = "item"``)."""
        self.adapter: Adapter | None = supplier.adapter
        self.asks_adapter = supplier.adapter_takes_asked
        self.shape_method = "GET" if supplier.shape is None else supplier.shape.method
        self.per_quantity = self.asks_adapter or (
            supplier.shape is not None and "quantity" in supplier.shape.uses
        )
        self.fair_time = supplier.read_timeout if supplier.read_timeout < settings.budget else None
        """Time an attempt cut by the deadline must have had to count against the supplier:
        its read timeout, or (None) ``FAIR_MARGIN`` times the longest it was seen to need."""
        self.whole_chance = WHOLE_CHANCE * (settings.budget - settings.answer_reserve)
        """An attempt that ran this long had nearly all the fan-out's time: always a fair time."""
        self.get_options: dict[str, Any] = {"allow_redirects": False}
        """Keyword arguments of every ``session.get``, fixed here rather than per attempt."""
        if (supplier.connect_timeout, supplier.read_timeout) != (
            settings.connect_timeout,
            settings.read_timeout,
        ):
            # A request's own ClientTimeout replaces the session's whole one:
            # never ``total`` (it can eat the deadline's cancellation, contract 8).
            self.get_options["timeout"] = session_timeout(
                supplier.connect_timeout, supplier.read_timeout, settings.budget
            )

    def url_for(self, request: QuoteRequest) -> URL:
        """The supplier's URL for ``request``'s SKU and scenario, built once and reused.

        Callers ask for the same few SKUs again and again. Building the query
        string was a visible part of each attempt's cost, and a reused
        ``URL`` also keeps what yarl and aiohttp cache on it (host, port,
        the encoded path and query) from one request to the next.
        """
        key = (request.sku, request.scenario)
        url = self._urls.get(key)
        if url is None:
            if len(self._urls) >= _URLS_KEPT:
                self._urls.clear()  # bounded: a caller cycling through SKUs costs nothing lasting
            url = self._urls[key] = self.url.with_query(sku=request.sku, scenario=request.scenario)
        return url

    def shaped(self, request: QuoteRequest, request_id: str) -> Shaped:
        """``request`` as the supplier's templates say, rendered once for all its attempts.

        Unless a template names ``{request_id}``, the rendering depends on the
        SKU, quantity and scenario only, and is kept for the next request that
        asks the same (as ``url_for`` keeps its URLs): the URL, the headers and
        the body, ready as aiohttp's payload.
        """
        shape = self.shape
        assert shape is not None
        per_request = "request_id" in shape.uses
        if not per_request:
            key = (request.sku, request.quantity, request.scenario)
            kept = self._shaped.get(key)
            if kept is not None:
                return kept
        values = {
            "sku": request.sku,
            "quantity": str(request.quantity),
            "scenario": request.scenario,
            "request_id": request_id,
        }
        url, shown = shape.url(values)
        body = shape.render_body(values)
        shaped = Shaped(
            url,
            shown,
            shape.render_headers(values),
            # A payload of bytes may be written again and again (aiohttp
            # ``BytesPayload``): built once, it is no work per attempt.
            None if body is None else aiohttp.BytesPayload(body, content_type=shape.content_type),
        )
        if not per_request:
            if len(self._shaped) >= _URLS_KEPT:
                self._shaped.clear()  # bounded: a caller cycling through SKUs costs nothing lasting
            self._shaped[key] = shaped
        return shaped


def session_timeout(connect: float, read: float, budget: float) -> aiohttp.ClientTimeout:
    """Socket timeouts of one attempt; no ``total``, which can eat the deadline's cancellation."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=connect,
        # A read timeout at or past the budget can never fire before the
        # deadline does: then no timer, instead of one re-armed per read.
        sock_read=read if read < budget else None,
    )


class SupplierClient:
    """Asks suppliers for quotes through one shared session and outbound limit.

    Each supplier may hold at most its share of the outbound slots, so one
    that hangs can never take the capacity the healthy ones need.

    ``slots`` and ``retry_budgets`` (one per supplier) are injected by the
    composition root: in-memory for one process, Redis-backed in fleet mode.
    Left out, they are this process's own ``OutboundSlots`` and ``RetryBudget`` objects.
    ``attempts`` is told of every attempt before it is sent (tracing), if given.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: Settings,
        catalogue: Catalogue,
        *,
        slots: OutboundLimiter | None = None,
        retry_budgets: Mapping[str, RetryLimiter] | None = None,
        attempts: AttemptListener | None = None,
        keep_cache_control: bool = False,
        pauses: Pauses | None = None,
        rates: RateMeter | None = None,
    ) -> None:
        self._session = session
        self.pauses = pauses or Pauses(settings.pause_max)
        """Suppliers paused after a 429 with ``Retry-After`` (shared by the fleet's workers)."""
        self._turns = Turns(rates or LocalRates())
        """Each supplier's outbound rate (``rates.py``): this process's, or the fleet's."""
        self._turn_slack = 0.0 if rates is None else settings.redis_timeout
        """Time a turn must leave beyond the attempt's own: in the fleet, a sync's, to lease
        a slot. A turn won with only the attempt's time left found the supplier's slots
        lapsed after the wait, and was spent for nothing."""
        self.token_fetches = {}
        self._retired: set[TokenKeeper] = set()
        """Keepers a reload replaced: a fetch of theirs may still run until shutdown."""
        self._listener = attempts
        self._settings = settings
        self._keep_cache_control = keep_cache_control
        """Carry each 200 answer's ``Cache-Control`` out on its quote, for the quote cache."""
        if slots is None:
            slots = OutboundSlots(settings.outbound_limit, catalogue.shares())
        self._slots = slots
        self._suppliers: dict[str, _SupplierState] = {}
        self.use(catalogue, retry_budgets)
        self._attempts = settings.attempts
        self._backoff = (settings.backoff_min, settings.backoff_max)
        self._retry_after_cap = settings.retry_after_cap
        self._max_body = settings.max_supplier_body_bytes

    token_fetches: dict[tuple[str, str], int]
    """Token requests by supplier and outcome (``tokens.OK``...), for ``/metrics``."""

    def use(
        self, catalogue: Catalogue, retry_budgets: Mapping[str, RetryLimiter] | None = None
    ) -> None:
        """Ask ``catalogue``'s suppliers from now on (a reload); calls in flight keep theirs.

        A supplier that stays keeps its retry budget (unless ``retry_budgets``
        brings one, or its capacity changed) and its learned attempt times.
        One that is gone stays reachable under its old entry until ``forget``:
        a request that started before the reload may still ask it.
        """
        settings = self._settings
        states = dict(self._suppliers)
        for supplier in catalogue.suppliers:
            old = states.get(supplier.name)
            if retry_budgets is not None:
                budget = retry_budgets[supplier.name]
            elif (
                old is not None and old.spec.retry_budget_capacity == supplier.retry_budget_capacity
            ):
                budget = old.retry_budget
            else:
                budget = RetryBudget(supplier.retry_budget_capacity, settings.retry_budget_earn)
            attempt_time = None if old is None else old.attempt_time
            answer_times = None if old is None else old.answer_times
            state = states[supplier.name] = _SupplierState(
                supplier, settings, budget, attempt_time, answer_times
            )
            state.tokens = self._keeper(supplier, old)
        self._suppliers = states  # swapped whole: no request sees half of it
        self._turns.keep_only(set(catalogue.names))

    def _keeper(self, supplier: Supplier, old: _SupplierState | None) -> TokenKeeper | None:
        """The supplier's token keeper: the old one if its OAuth2 client is unchanged."""
        kept = None if old is None else old.tokens
        if kept is not None and supplier.oauth2 == kept.client:
            return kept
        if kept is not None:
            kept.retire()  # new credentials: the old token is never sent again
            self._keep_retired(kept)
        if supplier.oauth2 is None:
            return None
        keeper = TokenKeeper(self._session, supplier.oauth2, supplier.name, self._token_fetched)
        keeper.start()
        return keeper

    def _keep_retired(self, keeper: TokenKeeper) -> None:
        """Hold on to a retired keeper only while a fetch of its own may still run."""
        self._retired = {old for old in self._retired if old.fetching}
        self._retired.add(keeper)

    def _token_fetched(self, supplier: str, outcome: str) -> None:
        key = (supplier, outcome)
        self.token_fetches[key] = self.token_fetches.get(key, 0) + 1

    async def close(self) -> None:
        """At shutdown, before the session closes: no token fetch outlives it."""
        keepers = {state.tokens for state in self._suppliers.values()} | self._retired
        for keeper in keepers:
            if keeper is not None:
                await keeper.close()

    def forget(self, suppliers: tuple[str, ...]) -> None:
        """Drop suppliers an old catalogue named, once no request can still ask them."""
        for name in suppliers:
            state = self._suppliers.get(name)
            if state is not None and state.tokens is not None:
                state.tokens.retire()
                self._keep_retired(state.tokens)
        self._suppliers = {
            name: state for name, state in self._suppliers.items() if name not in suppliers
        }

    @property
    def in_flight(self) -> int:
        """Attempts holding an outbound slot right now."""
        return self._slots.in_use

    def priced_per_quantity(self, supplier: str) -> bool:
        """Whether ``supplier``'s quote depends on the quantity asked.

        It does when its request carries ``{quantity}`` or its adapter reads
        what was asked: its quotes are then shared and cached per quantity.
        """
        state = self._suppliers.get(supplier)
        return state is not None and state.per_quantity

    def retry_tokens(self, supplier: str) -> float:
        """Retries ``supplier`` may still spend now."""
        return self._suppliers[supplier].retry_budget.tokens

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float | MovingDeadline,
    ) -> SupplierQuote | Failure:
        """Ask ``trace.supplier`` for ``request``; the caller enforces ``deadline``.

        A ``MovingDeadline`` (a shared call's) is read afresh for each
        attempt's ``X-Deadline-Remaining-Ms`` and each retry decision.
        """
        state = self._suppliers[trace.supplier]
        if state.spec.batch is not None:
            # A batch supplier takes a single quote as a batch of one line.
            line = CartLine(request.sku, request.quantity)
            answered = await self._batch(state, trace, (line,), request, request_id, deadline)
            return answered[request.sku]
        asked = None
        if state.asks_adapter:
            asked = Asked(trace.supplier, request.sku, request.quantity, request.scenario)
        shaped = None if state.shape is None else state.shaped(request, request_id)
        url = state.url_for(request) if shaped is None else shaped.url
        call = _Call(url, request, request_id, deadline, state.attempt_time, shaped, asked)
        result = await self._ask(state, call, trace)
        return result.quote if result.quote is not None else Failure(trace.supplier, result.code)

    def chunks(self, supplier: str, lines: tuple[CartLine, ...]) -> list[tuple[CartLine, ...]]:
        """A cart's ``lines`` as the calls a batch supplier is asked in; empty for any other."""
        spec = self._suppliers[supplier].spec
        batch = spec.batch
        if batch is None:
            return []
        burst = spec.rate.quota if batch.rate_unit == "item" and spec.rate is not None else None
        return batch.chunks(lines, burst)  # type: ignore[return-value]  # CartLines in, out

    async def batch(
        self,
        trace: SupplierTrace,
        lines: tuple[CartLine, ...],
        scenario: str,
        request_id: str,
        deadline: float,
    ) -> dict[str, SupplierQuote | Failure]:
        """Ask a batch supplier for ``lines`` in one call: an outcome for every line's SKU."""
        state = self._suppliers[trace.supplier]
        first = lines[0]
        request = QuoteRequest(sku=first.sku, quantity=first.quantity, scenario=scenario)
        return await self._batch(state, trace, lines, request, request_id, deadline)

    async def _batch(
        self,
        state: _SupplierState,
        trace: SupplierTrace,
        lines: tuple[CartLine, ...],
        request: QuoteRequest,
        request_id: str,
        deadline: float | MovingDeadline,
    ) -> dict[str, SupplierQuote | Failure]:
        batch, shape = state.spec.batch, state.shape
        assert batch is not None
        assert shape is not None
        shaped, body = batch.render(shape, lines, request.scenario, request_id)
        if body is not None:
            payload = aiohttp.BytesPayload(body, content_type=shape.content_type)
            shaped = attrs.evolve(shaped, body=payload)
        call = _Call(
            shaped.url, request, request_id, deadline, state.attempt_time, shaped, lines=lines
        )
        result = await self._ask(state, call, trace)
        if result.lines is not None:
            return result.lines
        if result.status == 413 and not state.told_too_large:
            state.told_too_large = True
            log_event(
                log,
                logging.WARNING,
                "batch_too_large",
                {"supplier": state.spec.name, "items": len(lines), "max_items": batch.max_items},
            )
        failure = Failure(trace.supplier, result.code)
        return dict.fromkeys((line.sku for line in lines), failure)

    async def _ask(
        self, state: _SupplierState, call: _Call, trace: SupplierTrace
    ) -> _AttemptResult:
        """The attempt loop: at most two attempts under the deadline; the last result stands."""
        state.retry_budget.first_attempt()
        result: _AttemptResult | None = None
        for attempt in range(1, self._attempts + 1):
            if attempt == 1 and state.hedge is not None and not trace.probe:
                tried = await self._hedged(state, call, trace)  # maybe with attempt 2 beside it
            else:
                tried = await self._attempt(
                    state, call, trace, attempt
                )  # slot taken and given back
            if tried.not_sent is not None:
                # Not sent (no slot came in time, no token, the supplier paused):
                # answer now. A retry that gave its place up keeps the code the
                # first attempt got; the others have a code of their own.
                trace.stopped = tried.not_sent
                if result is None or tried is not _NO_SLOT_IN_TIME:
                    result = tried
                break
            result = tried
            if result.code == OK:
                if attempt > 1:
                    state.retry_budget.paid_off()
                trace.stopped = STOPPED_SUCCESS
                return result
            if trace.hedged:  # both attempts were out at once; the later failure stands
                trace.stopped = STOPPED_ATTEMPTS_EXHAUSTED
                break
            if not result.retryable:
                trace.stopped = STOPPED_NOT_RETRYABLE
                break
            if attempt == self._attempts:
                trace.stopped = STOPPED_ATTEMPTS_EXHAUSTED
                break
            backoff, refusal = self._plan_retry(state, result, call.deadline)
            if refusal is not None:
                trace.stopped = refusal  # answer now: waiting could not bring a quote
                break
            # Back off outside the slot, so a failing supplier does not hold
            # capacity a healthy one could use; the caller's deadline still runs.
            trace.attempts[-1] = attrs.evolve(trace.attempts[-1], backoff=backoff)
            await asyncio.sleep(backoff)
        assert result is not None
        return result

    def _plan_retry(
        self, state: _SupplierState, failed: _AttemptResult, deadline: float | MovingDeadline
    ) -> tuple[float, str | None]:
        """The backoff before a second attempt, or why there will be none."""
        # A refused token is put right by a fresh one, not by waiting: its
        # fetch (``tokens.py``, one for every request that needs it) is the wait.
        backoff = 0.0 if failed.fresh_token else random.uniform(*self._backoff)
        if failed.retry_after is not None:
            if failed.retry_after > self._retry_after_cap:
                return backoff, STOPPED_RETRY_AFTER
            backoff = max(backoff, failed.retry_after)
        remaining = deadline - time.monotonic()
        if remaining < backoff + state.attempt_time.answer_time:
            asked_to_wait = failed.retry_after is not None and failed.retry_after > 0
            return backoff, (STOPPED_RETRY_AFTER if asked_to_wait else STOPPED_NO_TIME)
        if not state.retry_budget.try_spend():
            return backoff, STOPPED_RETRY_BUDGET
        return backoff, None

    async def _hedged(
        self, state: _SupplierState, call: _Call, trace: SupplierTrace
    ) -> _AttemptResult:
        """The first attempt; if it is still out after the hedge delay, the second beside it.

        The second attempt the contract allows, started early instead of after
        a failure (Dean and Barroso's backup request): a valid quote from
        either wins at once and the other is cancelled (its connection
        closed, its slot back); a failure waits for the other, and if both
        fail the later code stands. ``_may_hedge`` says when one is sent.
        """
        delay = self._hedge_delay(state)
        if delay is None:
            return await self._attempt(state, call, trace, 1)
        race = _Race()
        first = asyncio.create_task(self._attempt(state, call, trace, 1, race))
        tasks = {first: 1}
        try:
            sent = asyncio.ensure_future(race.sent.wait())
            try:
                await asyncio.wait((first, sent), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sent.cancel()
            if not first.done():
                late = race.sent_at + delay - time.monotonic()
                await asyncio.wait((first,), timeout=max(0.0, late))
            if first.done() or not self._may_hedge(state, call, trace, race.sent_at):
                return await first
            trace.hedged = True
            second = asyncio.create_task(self._attempt(state, call, trace, 2, race, hedge=True))
            tasks[second] = 2
            failed: _AttemptResult | None = None
            pending: set[asyncio.Task[_AttemptResult]] = {first, second}
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    result = task.result()  # a bug of ours propagates
                    if result.code != OK:
                        failed = result  # the later failure stands
                        continue
                    for other in pending:
                        race.lost.add(tasks[other])
                        other.cancel()
                    if pending:
                        await asyncio.wait(pending)  # the loser bills itself, frees its slot
                    trace.won = tasks[task]
                    if trace.won == 2:
                        state.retry_budget.paid_off()  # a hedge that won earns its token back
                    return result
            assert failed is not None
            return failed
        finally:
            running = [task for task in tasks if not task.done()]
            for task in running:
                task.cancel()  # the deadline, or the caller leaving: both end now
            if running:
                await asyncio.wait(running)

    def _hedge_delay(self, state: _SupplierState) -> float | None:
        """Seconds after the first attempt is sent that a hedge may go; None: not yet known."""
        hedge = state.hedge
        assert hedge is not None
        assert state.answer_times is not None
        if hedge.delay is not None:
            return hedge.delay
        assert hedge.percentile is not None
        found = state.answer_times.percentile(hedge.percentile)
        return None if found is None else max(HEDGE_FLOOR, found)

    def _may_hedge(
        self, state: _SupplierState, call: _Call, trace: SupplierTrace, sent_at: float
    ) -> bool:
        """Whether a hedge goes now: a tail that threatens the deadline, time for a median
        answer, a free slot, a token, a turn.

        With a percentile's delay, only a supplier whose calls run past the
        time the first attempt had at least ``HEDGE_TAIL`` of the time is
        hedged: one whose slowest answers fit anyway gains only load. It
        never waits for anything: not for a slot (one free within the
        supplier's share, or none), not for its rate's turn, not for an
        OAuth2 token; and none while the supplier is paused.
        Its token comes from the retry budget the supplier's retries spend.
        """
        name = trace.supplier
        times = state.answer_times
        assert times is not None
        assert state.hedge is not None
        if state.hedge.delay is None:
            late = times.survival(call.deadline - sent_at)
            if late is None or late < HEDGE_TAIL:
                return False
        median = times.percentile(0.5) or 0.0
        if call.deadline - time.monotonic() < median:
            return False
        if self.pauses.active and self.pauses.until(name) is not None:
            return False
        if state.tokens is not None and state.tokens.current() is None:
            return False
        if not self._slots.try_acquire(name):
            return False
        if not state.retry_budget.try_spend():
            self._slots.release(name)
            return False
        rate = state.spec.rate
        if rate is not None and not self._turns.take_now(name, rate):
            self._slots.release(name)
            state.retry_budget.paid_off()  # the token back: nothing was sent
            return False
        return True

    async def _attempt(
        self,
        state: _SupplierState,
        call: _Call,
        trace: SupplierTrace,
        attempt: int,
        race: _Race | None = None,
        *,
        hedge: bool = False,
    ) -> _AttemptResult:
        """One attempt: wait for a slot, fetch, give the slot back, then decode.

        In a hedged race (``race``) a hedge (``hedge``) comes with its slot
        and turn already taken by ``_may_hedge``.
        """
        waiting_since = time.monotonic()
        if hedge:
            # Its slot and its turn were taken by ``_may_hedge``: a hedge never waits.
            authorization = None if state.tokens is None else state.tokens.current()
        else:
            # Wait for a slot only while the attempt could still finish: the time
            # this supplier has been seen to need must be left when it starts. With
            # no answer seen yet nothing is known, so it waits until the first
            # answers say otherwise (``_Call.left``); the half-open probe always
            # waits, the only way a supplier's circuit closes again. A
            # wait the deadline (or the caller leaving) cancels never reached the
            # supplier: it is not an attempt, and goes on no bill.
            patience = None if trace.probe else call
            pauses = self.pauses
            # ``pauses.active`` is empty unless some supplier said 429 lately: no call then.
            if pauses.active and pauses.until(trace.supplier) is not None:
                return _PAUSED
            rate = state.spec.rate
            if rate is not None:
                if not await self._turn(call, trace, rate):
                    return _NO_TURN
                if call.lines and state.item_rate:
                    # A rate that counts parts: one turn per line of the call (the
                    # first is had). Turns had before one that does not come are
                    # spent: the supplier is sent less than the rate, never more.
                    for _ in range(len(call.lines) - 1):
                        if not await self._turn(call, trace, rate):
                            return _NO_TURN
            authorization = None
            if state.tokens is not None:
                # Before the slot: a wait for the token holds none of the outbound capacity.
                authorization = state.tokens.current()
                if authorization is None:
                    authorization = await self._token(state.tokens, trace)
                    if authorization is None:
                        return _NO_TOKEN
            # One wait for both the shared slot and room in the supplier's share; a
            # cart's call waits behind single quotes' (``slots.py``).
            if not (
                await self._slots.acquire(trace.supplier, patience)
                if not trace.lines
                else await self._slots.acquire(trace.supplier, patience, later=True)
            ):
                trace.gave_up_after = time.monotonic() - waiting_since
                return _NO_SLOT_IN_TIME
            if pauses.active and pauses.until(trace.supplier) is not None:
                # Paused while this attempt waited: the wave that got the 429 was enough.
                self._slots.release(trace.supplier)
                return _PAUSED
        try:
            started = time.monotonic()
            if race is not None and attempt == 1:
                race.sent_at = started
                race.sent.set()
            headers = {
                "X-Request-ID": call.request_id,
                "X-Attempt": str(attempt),
                # Measured once the slot is ours: the wait is not the supplier's time.
                "X-Deadline-Remaining-Ms": str(max(0, int((call.deadline - started) * 1000))),
            }
            shaped = call.shaped
            if shaped is not None:
                headers.update(shaped.headers)  # the catalogue's (never QuoteFlow's own)
            elif state.headers:
                headers.update(state.headers)
            if authorization is not None:
                headers[hdrs.AUTHORIZATION] = authorization
            if self._listener is not None:  # e.g. traceparent
                if shaped is None:
                    self._listener.sending(attempt, call.url, headers, "GET")
                else:
                    self._listener.sending(attempt, shaped.shown_url, headers, state.shape_method)
            fetched = await self._fetch(state, call, headers, authorization)
            ended = time.monotonic()
            # Before the slot is handed on: the next waiter is judged by what this taught.
            self._learn(state, call, fetched, ended - started)
        except asyncio.CancelledError:
            if race is not None and attempt in race.lost:
                # The other attempt won: not the supplier's failure, not its slowness
                # to the slot rule; at least this long for the hedge's percentile.
                self._lost(state, trace, attempt, waiting_since, started, hedge)
                raise
            # Before the slot is handed on: the next waiter is judged by what this taught.
            self._cut(state, call, trace, attempt, waiting_since, started, hedge)
            raise
        finally:
            self._slots.release(trace.supplier)
        if isinstance(fetched, bytes):
            fetched = self._decode(state, fetched, trace.supplier, call)
        elif isinstance(fetched, _Answer):
            fetched = self._decode(state, fetched.body, trace.supplier, call, fetched.cache_control)
        outcome = fetched.code
        trace.attempts.append(
            _record(
                attempt,
                waiting_since,
                started,
                ended,
                outcome,
                fetched.status,
                hedge=hedge,
                problem=fetched.problem,
            )
        )
        return fetched

    def _learn(
        self,
        state: _SupplierState,
        call: _Call,
        fetched: bytes | _Answer | _AttemptResult,
        took: float,
    ) -> None:
        """An attempt came back after ``took`` seconds: what it teaches of the supplier's time."""
        estimate = state.attempt_time
        first = not estimate.seen
        kind = call.request.scenario
        if isinstance(fetched, bytes | _Answer):
            # It answered: a useful attempt's length.
            estimate.observe(took, kind=kind)
            if state.answer_times is not None:
                state.answer_times.observe(took)
        elif fetched.status is not None:  # an error, or a 200 whose body could not be read
            estimate.observe(took, full=False, kind=kind)
        if first and estimate.seen:
            # The calls queued while nothing was known had no patience to run
            # out (``_Call.left``): every waiter is read again now.
            self._slots.reconsider()

    def _lost(
        self,
        state: _SupplierState,
        trace: SupplierTrace,
        attempt: int,
        waiting_since: float,
        started: float,
        hedge: bool,
    ) -> None:
        """Cancelled because the other attempt of a hedged race won: bill it as such."""
        now = time.monotonic()
        if state.answer_times is not None:
            state.answer_times.observe(now - started, answered=False)  # at least this long
        trace.attempts.append(_record(attempt, waiting_since, started, now, CANCELLED, hedge=hedge))

    def _cut(
        self,
        state: _SupplierState,
        call: _Call,
        trace: SupplierTrace,
        attempt: int,
        waiting_since: float,
        started: float,
        hedge: bool = False,
    ) -> None:
        """The deadline (or the caller leaving) cut a sent attempt: bill it, learn from it."""
        now = time.monotonic()
        ran = now - started
        if state.answer_times is not None:
            state.answer_times.observe(ran, answered=False)  # at least this long
        estimate = state.attempt_time
        kind = call.request.scenario
        # Cut before it had a fair time: QuoteFlow was late, not the supplier
        # (its breaker does not count it, ``breaker.py``).
        fair = state.fair_time
        if fair is None:
            fair = max(estimate.floor, FAIR_MARGIN * estimate.longest(kind))
        fair = min(fair, state.whole_chance)
        trace.attempts.append(
            _record(
                attempt, waiting_since, started, now, TIMEOUT, cut_short=ran < fair, hedge=hedge
            )
        )
        if hedge:
            return  # a hedge never makes its supplier look slower to the slot rule
        if ran > estimate.needed_for(kind):
            estimate.cut_after(ran, kind)  # it needs at least this long (``retry.py``)
            self._slots.reconsider()  # before this slot is handed on to a waiter

    async def _turn(self, call: _Call, trace: SupplierTrace, rate: Rate) -> bool:
        """A turn of the supplier's outbound rate, waited for while the attempt could finish.

        The wait holds no outbound slot, and ends as soon as the supplier's
        learned attempt time would no longer fit before the deadline.
        """
        slack, needed = self._turn_slack, call.needed
        since = time.monotonic()
        try:
            admitted, waited = await self._turns.take(
                trace.supplier,
                rate,
                call.deadline,
                (lambda now: needed(now) + slack) if slack else needed,
            )
        except asyncio.CancelledError:
            # Cut in the line (the deadline, or the caller gone): the bill still
            # shows the wait, or a call that sent nothing would look as if it
            # never stood in the rate's line at all.
            trace.rate_wait = (trace.rate_wait or 0.0) + time.monotonic() - since
            raise
        if waited is not None:
            trace.rate_wait = (trace.rate_wait or 0.0) + waited
        return admitted

    async def _token(self, tokens: TokenKeeper, trace: SupplierTrace) -> str | None:
        """Wait for the one token fetch under way; ``None`` if it brings no token."""
        since = time.monotonic()
        try:
            return await tokens.wait()
        except TokenUnavailable:
            return None
        except asyncio.CancelledError:
            # The deadline came first: ``auth_failed``, not ``timeout`` (``service.py``).
            trace.stopped = STOPPED_NO_TOKEN
            raise
        finally:
            trace.token_wait = (trace.token_wait or 0.0) + time.monotonic() - since

    async def _fetch(
        self,
        state: _SupplierState,
        call: _Call,
        headers: Mapping[str, str],
        authorization: str | None,
    ) -> bytes | _Answer | _AttemptResult:
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
                        return _AttemptResult(
                            None, http_failure_code(401), True, 401, fresh_token=True
                        )
                    retryable = response.status == 503
                    return _AttemptResult(
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
                    return _Answer(body, cache_control)
                return body
        except NEVER_RETRIED:
            return _AttemptResult(None, TRANSPORT_ERROR)
        except TRANSIENT_ERRORS:
            return _AttemptResult(None, TRANSPORT_ERROR, retryable=True)
        except aiohttp.ClientPayloadError as exc:
            if isinstance(exc.__cause__, TRUNCATION_CAUSES):
                return _AttemptResult(None, TRANSPORT_ERROR, retryable=True, status=200)
            return _AttemptResult(None, INVALID_DATA, status=200)  # e.g. bad Content-Encoding
        except aiohttp.ClientResponseError:
            # aiohttp's parser rejected the reply as HTTP (it reports status 400,
            # which the supplier never sent): malformed data, not ``http_400``.
            return _AttemptResult(None, INVALID_DATA)
        except InvalidSupplierData:  # over the body cap
            return _AttemptResult(None, INVALID_DATA, status=200)

    @staticmethod
    def _decode(
        state: _SupplierState,
        body: bytes,
        supplier: str,
        call: _Call,
        cache_control: str | None = None,
    ) -> _AttemptResult:
        if call.lines:
            lines = _batch_answer(state, body, call)
            if lines is None:
                return _AttemptResult(None, INVALID_DATA, status=200)
            if cache_control is not None:  # the answer's, for each of its quotes
                lines = {
                    sku: attrs.evolve(out, cache_control=cache_control)
                    if isinstance(out, SupplierQuote)
                    else out
                    for sku, out in lines.items()
                }
            return _AttemptResult(None, OK, status=200, lines=lines)
        sku = call.request.sku
        try:
            if state.adapter is None:
                quote = decode_supplier_quote(
                    body, supplier=supplier, sku=sku, currency=state.spec.currency
                )
            else:
                quote = _adapted(state, body, sku, call.asked)
        except InvalidSupplierData as exc:
            return _AttemptResult(None, INVALID_DATA, status=200, problem=_problem(exc))
        if cache_control is not None:
            quote = attrs.evolve(quote, cache_control=cache_control)
        return _AttemptResult(quote, OK, status=200)

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
    state: _SupplierState, body: bytes, call: _Call
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


def _batch_adapted(adapter: Adapter, body: bytes, supplier: str, call: _Call) -> Mapping[str, Any]:
    """A batch body through the catalogue's adapter: SKU → quote mapping or ``"not_found"``."""
    scenario = call.request.scenario
    asked = [Asked(supplier, line.sku, line.quantity, scenario) for line in call.lines]
    mapped = _mapping_from(adapter, decode_supplier_json(body), asked, supplier)
    return {
        sku: (entry if entry == NOT_FOUND else dict(entry) if isinstance(entry, Mapping) else None)
        for sku, entry in mapped.items()
        if isinstance(sku, str)
    }


def _adapted(state: _SupplierState, body: bytes, sku: str, asked: Asked | None) -> SupplierQuote:
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
