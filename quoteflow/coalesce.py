"""Coalescing (``--coalesce``): one supplier call for every request that would send the same one.

Two supplier calls are the same when they ask the same supplier for the same
SKU and scenario (the quantity is priced by QuoteFlow, not by the supplier).
The first request *starts* the call; every request that asks while it is in
flight *joins* it, and takes no outbound slot and no retry token:

    request A ──starts──▶ shared call (its own task) ──▶ atlas
    request B ──joins───┘        │
    request C ──joins───┘        └── one outcome, for A, B and C alike

Whose deadline? Each waiter's own. A waiter awaits the call shielded, under
its request's deadline (``service.py`` holds that timer); when it comes, that
request alone is ``timeout`` and the call goes on for the others. The call
is not cancelled while anyone waits: it runs under the longest deadline of
those still waiting (a ``MovingDeadline``, moved as waiters come and go, so
each attempt's ``X-Deadline-Remaining-Ms`` and each retry decision use it),
and the last waiter to leave cancels it and waits for it to wind up (its
slot given back, its cut-off attempt on the bill) before it goes. The call
needs no timer of its own: its end is its last waiter's, whose timer fires
at that very deadline. A request joins only within the starter's budget;
later it starts a call of its own, so that a call to a hanging supplier
cannot be prolonged for ever by callers that keep coming.

The bill, and the breaker. A shared call's attempts are on exactly one bill,
its *owner*'s: the starter's, or, if the starter leaves first (its deadline,
or it hung up), the waiter with the longest deadline it is *handed over* to
(the leaver's bill names it in ``handed_over``). Every other waiter's bill
shows ``joined`` with the starter's request id and no attempts. The service
judges each request by its own bill, and a bill without attempts teaches the
circuit breaker nothing (``breaker.verdict``): so the breaker learns from
each shared call once, through its owner — including a call cut off at the
last deadline, whose owner is the waiter that cancelled it.

Coalescing is per process: in fleet mode each worker coalesces its own calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import attrs

from quoteflow.models import (
    STOPPED_JOINED,
    Failure,
    MovingDeadline,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)

_Key = tuple[str, str, str, int]
"""Supplier, SKU, scenario: what makes two supplier requests identical."""


class SharingGateway(Protocol):
    """A gateway that can make a shared call: its deadline may move while it runs.

    ``supplier.SupplierClient`` is one: it reads a ``MovingDeadline`` afresh
    for each attempt and each retry decision.
    """

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float | MovingDeadline,
    ) -> SupplierQuote | Failure:
        """As ``service.SupplierGateway.quote``."""
        ...


@attrs.define(eq=False)
class _Waiter:
    """One request waiting for a shared call."""

    trace: SupplierTrace
    request_id: str
    deadline: float


@attrs.define(eq=False)
class _SharedCall:
    """A supplier call in flight and the requests waiting for it."""

    key: _Key
    starter: _Waiter
    bill: SupplierTrace
    """Where the call's attempts are recorded, whoever ends up owning them."""
    owner: _Waiter
    waiters: set[_Waiter]
    deadline: MovingDeadline
    """The longest deadline of those waiting: what the supplier is told, what a retry must fit."""
    task: asyncio.Task[SupplierQuote | Failure] | None = None

    def leave(self, waiter: _Waiter) -> None:
        """``waiter`` no longer waits: a call still running is under the longest of the rest."""
        self.waiters.discard(waiter)
        if self.waiters and self.task is not None and not self.task.done():
            self.deadline.at = max(other.deadline for other in self.waiters)

    @property
    def request_id(self) -> str:
        """The starter's: the id every attempt of the call carries to the supplier."""
        return self.starter.request_id


class CoalescingGateway:
    """A ``SupplierGateway`` that shares identical calls in flight; wraps the real one."""

    def __init__(
        self, inner: SharingGateway, per_quantity: Callable[[str], bool] = lambda supplier: False
    ) -> None:
        self._inner = inner
        self._per_quantity = per_quantity
        self._calls: dict[_Key, _SharedCall] = {}
        self.joins: dict[str, int] = {}
        """Requests that joined a call in flight, by supplier (a running total)."""

    @property
    def in_flight(self) -> int:
        """Shared calls running now (each holds at most one outbound slot at a time)."""
        return len(self._calls)

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> SupplierQuote | Failure:
        """``trace.supplier``'s outcome for ``request``: from a call in flight if there is one."""
        # A supplier whose quote depends on the quantity (it is sent, or its
        # adapter reads it) shares a call only with requests for as many.
        quantity = request.quantity if self._per_quantity(trace.supplier) else 0
        key = (trace.supplier, request.sku, request.scenario, quantity)
        waiter = _Waiter(trace, request_id, deadline)
        call = self._calls.get(key)
        # Joined only within the starter's own budget: the supplier was told
        # about that one, and a call that anyone arriving could prolong would
        # never end (nor be judged) while a hanging supplier had callers.
        if call is None or time.monotonic() >= call.starter.deadline:
            call = self._start(key, waiter, request)
        else:
            call.waiters.add(waiter)
            call.deadline.at = max(call.deadline.at, deadline)
            self.joins[trace.supplier] = self.joins.get(trace.supplier, 0) + 1
        assert call.task is not None
        try:
            # Shielded: this request's deadline (or its caller leaving) ends
            # its wait, never the call the others are waiting for.
            outcome = await asyncio.shield(call.task)
        except asyncio.CancelledError:
            await self._leave(call, waiter)
            raise
        except BaseException:
            call.leave(waiter)  # a bug in the call: every waiter sees it
            raise
        call.leave(waiter)
        self._settle(call, waiter)
        return outcome

    def _start(self, key: _Key, starter: _Waiter, request: QuoteRequest) -> _SharedCall:
        bill = SupplierTrace(starter.trace.supplier, probe=starter.trace.probe)
        deadline = MovingDeadline(starter.deadline)
        call = _SharedCall(key, starter, bill, starter, {starter}, deadline)
        # Its own task, outside the starter's cancel scope: the starter leaving
        # must not cost the others the call.
        call.task = asyncio.get_running_loop().create_task(self._run(call, request))
        self._calls[key] = call
        return call

    async def _run(self, call: _SharedCall, request: QuoteRequest) -> SupplierQuote | Failure:
        try:
            return await self._inner.quote(call.bill, request, call.request_id, call.deadline)
        finally:
            # Forgotten the moment it ends: a request arriving later starts a new call.
            self._forget(call)

    def _forget(self, call: _SharedCall) -> None:
        if self._calls.get(call.key) is call:
            del self._calls[call.key]

    def _settle(self, call: _SharedCall, waiter: _Waiter) -> None:
        """Write ``waiter``'s bill once the call is over: the attempts, or ``joined``."""
        if waiter is call.owner:
            waiter.trace.attempts.extend(call.bill.attempts)
            waiter.trace.stopped = call.bill.stopped
            waiter.trace.gave_up_after = call.bill.gave_up_after
            waiter.trace.token_wait = call.bill.token_wait
            waiter.trace.rate_wait = call.bill.rate_wait
            # A hedged call's race: which attempt won, or why no hedge went.
            waiter.trace.hedged = call.bill.hedged
            waiter.trace.won = call.bill.won
            waiter.trace.hedge_refused = call.bill.hedge_refused
        elif waiter is not call.starter:
            waiter.trace.stopped = STOPPED_JOINED
        if waiter is not call.starter:
            waiter.trace.joined = call.request_id

    async def _leave(self, call: _SharedCall, waiter: _Waiter) -> None:
        """``waiter``'s deadline came or its caller left before the call ended."""
        assert call.task is not None
        call.leave(waiter)
        if call.task.done() and not call.waiters:
            # It ended in the same instant: the bill goes with this waiter's.
            self._settle(call, waiter)
            return
        if call.waiters:
            # (If it ended in the same instant, those still waiting are about
            # to get its outcome: the bill goes to one of them.)
            if waiter is call.owner:
                # Handed over to whoever can wait longest: the likeliest to see it end.
                call.owner = max(call.waiters, key=lambda other: other.deadline)
                waiter.trace.handed_over = call.owner.request_id
            if waiter is not call.starter:
                waiter.trace.joined = call.request_id
            return
        # Nobody waits any more: stop the call, and wait for it to give its
        # slot back and put its cut-off attempt on the bill this waiter takes.
        # Forgotten first, so that a request arriving meanwhile starts afresh
        # instead of joining a call that is being cancelled.
        self._forget(call)
        call.task.cancel()
        # Until it has wound up, even if this waiter is cancelled again
        # meanwhile: the deadline's timer and the caller hanging up can each
        # cancel it, and a second cancellation must not cut the wind-up short
        # (this waiter goes on to its own CancelledError either way).
        while not call.task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(call.task)
        self._settle(call, waiter)
