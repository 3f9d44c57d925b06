"""Admission, the request deadline, the fan-out to every supplier, and the ranking.

No aiohttp here: suppliers are reached through ``SupplierGateway``, so this
module reads as the policy it is. The budget bill of one request:

    admitted ──┬── atlas:  [slot wait, attempt] ─────────────────────── quote
               ├── boreal: [slot wait, attempt 1] backoff [slot wait, attempt 2]
               └── cedar:  [slot wait, attempt] ─────────────────────── quote
               └──────────────── one deadline: admitted + budget ────────┘

Everything a supplier does — waiting for an outbound slot, both attempts and
the backoff between them — runs under that single deadline. Whatever has
finished when it comes is kept; every supplier still working is ``timeout``.

Before the fan-out each supplier's circuit breaker (``breaker.py``) is asked;
a supplier whose circuit is open is not called at all (``circuit_open``), and
every call's outcome is reported back to its breaker afterwards. With the
quote cache on, a stale quote may then stand in for a failure (``cache.py``).

Which suppliers are asked, and their breakers, come from the catalogue as a
``Lineup`` handed in by the app. A reload hands in a new one (``use``); each
request reads it once when it starts and keeps it to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Protocol

import attrs

from quoteflow.breaker import Breakers, Permit, Verdict, verdict
from quoteflow.errors import CapacityExhausted
from quoteflow.models import (
    AUTH_FAILED,
    CIRCUIT_OPEN,
    STOPPED_CIRCUIT_OPEN,
    STOPPED_DEADLINE,
    STOPPED_NO_TOKEN,
    TIMEOUT,
    Failure,
    QuoteReport,
    QuoteRequest,
    QuoteResult,
    RankedQuote,
    SupplierQuote,
    SupplierTrace,
)


class SupplierGateway(Protocol):
    """How the service asks one supplier; ``supplier.SupplierClient`` is the real one."""

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> SupplierQuote | Failure:
        """Ask ``trace.supplier``, recording each attempt in ``trace``.

        ``deadline`` is a ``time.monotonic()`` value; the caller enforces it.
        """
        ...


class StaleQuotes(Protocol):
    """Quotes that may stand in for a failing supplier; ``cache.QuoteCache`` is the real one."""

    def cover(
        self,
        request: QuoteRequest,
        traces: tuple[SupplierTrace, ...],
        outcomes: dict[str, SupplierQuote | Failure],
    ) -> None:
        """Replace each failure in ``outcomes`` that a stale quote may stand in for.

        A supplier missing from ``outcomes`` timed out. Called once the
        breakers have judged the real outcomes.
        """
        ...


@attrs.frozen
class Lineup:
    """The suppliers one catalogue names, in the order failures are listed, and their breakers."""

    suppliers: tuple[str, ...]
    breakers: Breakers | None = None
    """None: every supplier is asked on every request (no supplier has a breaker)."""


class QuoteService:
    """One per process: every request shares its admission counter and gateway."""

    def __init__(
        self,
        gateway: SupplierGateway,
        lineup: Lineup,
        *,
        budget: float,
        inbound_limit: int,
        answer_reserve: float = 0.0,
        stale_quotes: StaleQuotes | None = None,
        circuit_open: Callable[[str], None] | None = None,
    ) -> None:
        self._gateway = gateway
        self.lineup = lineup
        """Who is asked; replaced whole by ``use``, read once by each request."""
        self._stale_quotes = stale_quotes
        """None: a failure is always the answer (the quote cache is off)."""
        self._circuit_open = circuit_open
        """Told of each supplier not asked because its circuit is open (tracing)."""
        self._budget = budget
        self._inbound_limit = inbound_limit
        self._answer_reserve = answer_reserve
        self.in_flight = 0
        """Requests admitted and not yet answered."""

    def use(self, lineup: Lineup) -> None:
        """Ask ``lineup``'s suppliers from the next request on; requests in flight keep theirs."""
        self.lineup = lineup

    def ensure_capacity(self) -> None:
        """Refuse at once, taking nothing, when every inbound slot is taken."""
        if self.in_flight >= self._inbound_limit:
            raise CapacityExhausted

    @contextlib.contextmanager
    def admitted(self) -> Iterator[float]:
        """Take an inbound slot for the ``with`` block, or refuse at once.

        Yields the admission time, from which the request's deadline runs.
        Raises ``CapacityExhausted`` when every inbound slot is taken.
        """
        # Check and take the slot with no await in between: no other request
        # can slip in, and a refused request never holds one.
        if self.in_flight >= self._inbound_limit:
            raise CapacityExhausted
        self.in_flight += 1
        try:
            yield time.monotonic()
        finally:
            self.in_flight -= 1

    async def quote(
        self,
        request: QuoteRequest,
        request_id: str,
        admitted_at: float,
        caller: str | None = None,
    ) -> QuoteReport:
        """Every supplier's answer to ``request``, within the budget from ``admitted_at``.

        ``caller``: the name of who asked, carried into the bill and the log.
        """
        # The fan-out stops a little before the budget ends, so that ranking,
        # encoding and sending the answer fit inside it too.
        deadline = admitted_at + self._budget - self._answer_reserve
        lineup = self.lineup
        breakers = lineup.breakers
        traces = tuple(SupplierTrace(supplier) for supplier in lineup.suppliers)
        outcomes: dict[str, SupplierQuote | Failure] = {}
        asked: list[tuple[SupplierTrace, Permit, asyncio.Task[SupplierQuote | Failure]]] = []
        judged = False

        # The deadline wraps each supplier's whole call, never one attempt: a
        # retry cannot win itself a fresh timer, and no inner handler can
        # swallow it. Its timer cancels the supplier tasks itself rather than
        # this task (as asyncio.timeout would, whose task group would then
        # cancel them): one loop turn less between the deadline and the
        # answer, which under load is what makes a cut-off answer late.
        # Times here are time.monotonic(): uvloop's loop.time() only has
        # millisecond steps, too coarse for the bill; the timer is set from it.
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    for trace in traces:
                        permit = _permit(breakers, trace.supplier)
                        if permit is Permit.REFUSED:
                            # Not asked at all: the answer waits only for the others.
                            trace.stopped = STOPPED_CIRCUIT_OPEN
                            outcomes[trace.supplier] = Failure(trace.supplier, CIRCUIT_OPEN)
                            if self._circuit_open is not None:
                                self._circuit_open(trace.supplier)
                            continue
                        if permit is Permit.PROBE:
                            trace.probe = True
                        gateway_call = self._gateway.quote(trace, request, request_id, deadline)
                        asked.append((trace, permit, group.create_task(gateway_call)))
                    if asked:
                        when = loop.time() + deadline - time.monotonic()
                        timer = loop.call_at(when, _cut_off, asked)
            finally:
                if timer is not None:
                    timer.cancel()
            # A supplier call either finished or was cancelled by the deadline: a
            # bug in one would have left the TaskGroup as an exception, not here.
            for trace, permit, task in asked:
                if task.cancelled():
                    if trace.stopped == STOPPED_NO_TOKEN:
                        # It waited for its OAuth2 token and sent nothing: the
                        # token endpoint's failure, not a supplier's timeout.
                        no_token = Failure(trace.supplier, AUTH_FAILED)
                        outcomes[trace.supplier] = no_token
                        _judge(breakers, trace, permit, no_token)
                        continue
                    trace.stopped = STOPPED_DEADLINE
                    _judge(breakers, trace, permit, None)
                else:
                    outcomes[trace.supplier] = outcome = task.result()
                    _judge(breakers, trace, permit, outcome)
            judged = True
            if self._stale_quotes is not None:
                # After judging: the breaker learns what the supplier did, not what stood in.
                self._stale_quotes.cover(request, traces, outcomes)
        finally:
            if not judged and breakers is not None:
                # The caller left, or a bug: nothing learned, but a probe must
                # not stay taken for good.
                for trace, permit, _ in asked:
                    _judge(breakers, trace, permit, None, Verdict.UNKNOWN)
        elapsed_ms = (time.monotonic() - admitted_at) * 1000
        result = _rank(request, request_id, lineup.suppliers, outcomes, elapsed_ms)
        return QuoteReport(
            result=result,
            budget=self._budget,
            admitted_at=admitted_at,
            deadline=deadline,
            traces=traces,
            caller=caller,
        )


def _cut_off(
    asked: list[tuple[SupplierTrace, Permit, asyncio.Task[SupplierQuote | Failure]]],
) -> None:
    """The deadline: every supplier call still running ends now, as ``timeout``."""
    for _, _, task in asked:
        # One already cancelled (its task group aborting: the caller left) is
        # ending already; a second cancellation would only cut its wind-up.
        if not task.cancelling():
            task.cancel()  # one already done ignores it


def _permit(breakers: Breakers | None, supplier: str) -> Permit:
    if breakers is None:
        return Permit.CALL
    breaker = breakers.get(supplier)
    return Permit.CALL if breaker is None else breaker.permit()


def _judge(
    breakers: Breakers | None,
    trace: SupplierTrace,
    permit: Permit,
    outcome: SupplierQuote | Failure | None,
    judged: Verdict | None = None,
) -> None:
    if breakers is not None:
        breaker = breakers.get(trace.supplier)
        if breaker is not None:
            judged = verdict(outcome, trace.attempts) if judged is None else judged
            breaker.record(permit, judged)


def _rank(
    request: QuoteRequest,
    request_id: str,
    suppliers: tuple[str, ...],
    outcomes: dict[str, SupplierQuote | Failure],
    elapsed_ms: float,
) -> QuoteResult:
    """Usable quotes cheapest first; a failure for every supplier without one."""
    quotes: list[RankedQuote] = []
    failures: list[Failure] = []
    for supplier in suppliers:
        outcome = outcomes.get(supplier)
        if isinstance(outcome, SupplierQuote):
            # Too little stock is a valid answer, not a failure: leave it out.
            if outcome.stock >= request.quantity:
                quotes.append(RankedQuote.for_quantity(outcome, request.quantity))
        else:
            failures.append(outcome or Failure(supplier, TIMEOUT))
    quotes.sort(key=lambda quote: (quote.total_cents, quote.supplier))
    return QuoteResult(
        sku=request.sku,
        quantity=request.quantity,
        quotes=tuple(quotes),
        failures=tuple(failures),
        elapsed_ms=elapsed_ms,
        request_id=request_id,
    )
