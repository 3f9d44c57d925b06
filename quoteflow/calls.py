"""What one supplier call carries and what its attempts teach: the state QuoteFlow keeps
of each supplier, one call's terms, one attempt's result.

``SupplierState`` is built from the supplier's catalogue entry and shared by
every request; a reload builds a new one carrying over what was learned (the
retry budget, the attempt and answer times). Its ``learn``, ``cut`` and
``lost`` are where an attempt's length becomes what the slot rule, the breaker
and a hedge's percentile read next (``slots.py``, ``breaker.py``, ``hedging.py``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Final

import aiohttp
import attrs
from yarl import URL

from quoteflow.catalogue import Adapter, Supplier
from quoteflow.config import Settings
from quoteflow.models import (
    AUTH_FAILED,
    CANCELLED,
    RATE_LIMITED,
    STOPPED_NO_SLOT_IN_TIME,
    STOPPED_NO_TOKEN,
    STOPPED_PAUSED,
    STOPPED_RATE_LIMITED,
    TIMEOUT,
    Asked,
    AttemptRecord,
    CartLine,
    Failure,
    MovingDeadline,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.retry import (
    CUT_MEMORY,
    AnswerTimes,
    AttemptTimeEstimate,
    HedgeLimiter,
    RetryLimiter,
)
from quoteflow.slots import OutboundLimiter
from quoteflow.templates import Shaped
from quoteflow.tokens import TokenKeeper

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
supplier has been seen to need (``Call.left``). Not 1: under a closed loop at
the slots' capacity the waiters' patience runs out at the very moment the
slots they wait for free up (the callers asked again as the last answers
came), and which of a request's three calls is handed a slot and which gives
up was decided by a millisecond — one per supplier, so requests were split
into partial answers. With the margin a request's calls give up together,
before the slots free, and its caller's next request is there to take them."""


@attrs.frozen
class AttemptResult:
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


NO_SLOT_IN_TIME: Final = AttemptResult(None, TIMEOUT, not_sent=STOPPED_NO_SLOT_IN_TIME)
"""An attempt that gave its place in the slot queue up."""
NO_TOKEN: Final = AttemptResult(None, AUTH_FAILED, not_sent=STOPPED_NO_TOKEN)
"""An attempt that got no OAuth2 token: not the supplier's doing."""
PAUSED: Final = AttemptResult(None, RATE_LIMITED, not_sent=STOPPED_PAUSED)
"""An attempt at a supplier paused after a 429 with ``Retry-After``: it asked for the wait."""
NO_TURN: Final = AttemptResult(None, RATE_LIMITED, not_sent=STOPPED_RATE_LIMITED)
"""An attempt the supplier's outbound rate had no turn for while it could still finish."""


@attrs.frozen
class Answer:
    """A 200 body with the answer's ``Cache-Control`` (only when the quote cache wants it)."""

    body: bytes
    cache_control: str | None
    status: int = 200


@attrs.frozen
class Call:
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


def record(
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


URLS_KEPT: Final = 1024
"""Distinct (SKU, scenario) URLs kept per supplier before the cache starts over."""


class SupplierState:
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
        """When a late first attempt is joined by the second (``hedging.py``); None: never."""
        self.answer_times = (answer_times or AnswerTimes()) if self.hedge is not None else None
        """Recent answer times, for a percentile's hedge delay (kept across a reload)."""
        self.hedge_budget: HedgeLimiter | None = None
        """Its hedge tokens, while it is hedged (set by ``SupplierClient``, kept across a
        reload that keeps its ``burst``)."""
        self.item_rate = supplier.batch is not None and supplier.batch.rate_unit == "item"
        """Its ``rate`` counts lines, not calls (``[supplier.batch] rate_unit = "item"``)."""
        self.told_too_large = False
        """A 413 to a batch call was logged (``batch_too_large``): once per catalogue entry."""
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
            if len(self._urls) >= URLS_KEPT:
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
            if len(self._shaped) >= URLS_KEPT:
                self._shaped.clear()  # bounded: a caller cycling through SKUs costs nothing lasting
            self._shaped[key] = shaped
        return shaped

    def learn(
        self,
        call: Call,
        fetched: bytes | Answer | AttemptResult,
        took: float,
        slots: OutboundLimiter,
    ) -> None:
        """An attempt came back after ``took`` seconds: what it teaches of the supplier's time.

        Called before the attempt's slot is handed on: the next waiter is
        judged by what this taught.
        """
        estimate = self.attempt_time
        first = not estimate.seen
        kind = call.request.scenario
        if isinstance(fetched, bytes | Answer):
            # It answered: a useful attempt's length.
            estimate.observe(took, kind=kind)
            if self.answer_times is not None:
                self.answer_times.observe(took)
        elif fetched.status is not None:  # an error, or a 200 whose body could not be read
            estimate.observe(took, full=False, kind=kind)
        if first and estimate.seen:
            # The calls queued while nothing was known had no patience to run
            # out (``Call.left``): every waiter is read again now.
            slots.reconsider()

    def lost(
        self,
        trace: SupplierTrace,
        attempt: int,
        waiting_since: float,
        started: float,
        hedge: bool,
    ) -> None:
        """Cancelled because the other attempt of a hedged race won: bill it as such."""
        now = time.monotonic()
        if self.answer_times is not None:
            self.answer_times.observe(now - started, answered=False)  # at least this long
        trace.attempts.append(record(attempt, waiting_since, started, now, CANCELLED, hedge=hedge))

    def cut(
        self,
        call: Call,
        trace: SupplierTrace,
        attempt: int,
        waiting_since: float,
        started: float,
        slots: OutboundLimiter,
        hedge: bool = False,
    ) -> None:
        """The deadline (or the caller leaving) cut a sent attempt: bill it, learn from it."""
        now = time.monotonic()
        ran = now - started
        if self.answer_times is not None:
            self.answer_times.observe(ran, answered=False)  # at least this long
        estimate = self.attempt_time
        kind = call.request.scenario
        # Cut before it had a fair time: QuoteFlow was late, not the supplier
        # (its breaker does not count it, ``breaker.py``).
        fair = self.fair_time
        if fair is None:
            fair = max(estimate.floor, FAIR_MARGIN * estimate.longest(kind))
        fair = min(fair, self.whole_chance)
        trace.attempts.append(
            record(attempt, waiting_since, started, now, TIMEOUT, cut_short=ran < fair, hedge=hedge)
        )
        if hedge:
            return  # a hedge never makes its supplier look slower to the slot rule
        if ran > estimate.needed_for(kind):
            estimate.cut_after(ran, kind)  # it needs at least this long (``retry.py``)
            slots.reconsider()  # before this slot is handed on to a waiter


def session_timeout(connect: float, read: float, budget: float) -> aiohttp.ClientTimeout:
    """Socket timeouts of one attempt; no ``total``, which can eat the deadline's cancellation."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=connect,
        # A read timeout at or past the budget can never fire before the
        # deadline does: then no timer, instead of one re-armed per read.
        sock_read=read if read < budget else None,
    )
