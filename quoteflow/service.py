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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Protocol

from quoteflow.config import SUPPLIERS
from quoteflow.errors import CapacityExhausted
from quoteflow.models import (
    STOPPED_DEADLINE,
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


class QuoteService:
    """One per process: every request shares its admission counter and gateway."""

    def __init__(
        self,
        gateway: SupplierGateway,
        *,
        budget: float,
        inbound_limit: int,
        answer_reserve: float = 0.0,
    ) -> None:
        self._gateway = gateway
        self._budget = budget
        self._inbound_limit = inbound_limit
        self._answer_reserve = answer_reserve
        self.in_flight = 0
        """Requests admitted and not yet answered."""

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
        self, request: QuoteRequest, request_id: str, admitted_at: float
    ) -> QuoteReport:
        """Every supplier's answer to ``request``, within the budget from ``admitted_at``."""
        # The fan-out stops a little before the budget ends, so that ranking,
        # encoding and sending the answer fit inside it too.
        deadline = admitted_at + self._budget - self._answer_reserve
        traces = tuple(SupplierTrace(supplier) for supplier in SUPPLIERS)
        asked: list[asyncio.Task[SupplierQuote | Failure]] = []

        # The deadline wraps the whole fan-out, never one attempt: a retry
        # cannot win itself a fresh timer, and no inner handler can swallow it.
        # Times here are time.monotonic(): uvloop's loop.time() only has
        # millisecond steps, too coarse for the bill. The timer takes a delay.
        scope = asyncio.timeout(deadline - time.monotonic())
        try:
            async with scope, asyncio.TaskGroup() as group:
                for trace in traces:
                    gateway_call = self._gateway.quote(trace, request, request_id, deadline)
                    asked.append(group.create_task(gateway_call))
        except TimeoutError:
            if not scope.expired():
                raise
        # A supplier call either finished or was cancelled by the deadline: a
        # bug in one would have left the TaskGroup as an exception, not here.
        outcomes: dict[str, SupplierQuote | Failure] = {}
        for trace, task in zip(traces, asked, strict=True):
            if task.cancelled():
                trace.stopped = STOPPED_DEADLINE
            else:
                outcomes[trace.supplier] = task.result()
        result = _rank(request, request_id, outcomes, (time.monotonic() - admitted_at) * 1000)
        return QuoteReport(
            result=result,
            budget=self._budget,
            admitted_at=admitted_at,
            deadline=deadline,
            traces=traces,
        )


def _rank(
    request: QuoteRequest,
    request_id: str,
    outcomes: dict[str, SupplierQuote | Failure],
    elapsed_ms: float,
) -> QuoteResult:
    """Usable quotes cheapest first; a failure for every supplier without one."""
    quotes: list[RankedQuote] = []
    failures: list[Failure] = []
    for supplier in SUPPLIERS:
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
