"""Where QuoteFlow decides to hedge: a late first attempt joined by the second one.

The second attempt the contract allows, started early instead of after a
failure (Dean and Barroso's backup request), for a supplier whose catalogue
entry has a ``hedge`` (or every supplier under ``--hedge``). ``Hedging.race``
sends the first attempt; if it is still out after the hedge delay (a fixed
``delay``, or the supplier's recent answer times at ``percentile``) and
``may_hedge`` agrees, the second goes beside it. A valid quote from either
wins at once and the other is cancelled (its connection closed, its slot
back); a failure waits for the other, and if both fail the later code stands.
A hedge is never a third attempt on the wire.

A hedge never waits for anything: a free slot within the supplier's share, a
turn of its rate and a hedge token must be there at once, or no hedge goes.
Hedge tokens are a bucket of their own (``retry.HedgeBudget``), earned by the
supplier's successful attempts; a hedge never spends a retry token, but an
empty retry budget (the supplier failing) still stops hedging.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

import attrs

from quoteflow.calls import AttemptResult, Call, SupplierState
from quoteflow.models import OK, SupplierTrace
from quoteflow.pauses import Pauses
from quoteflow.rates import Turns
from quoteflow.retry import HEDGE_FLOOR, HEDGE_TAIL
from quoteflow.slots import OutboundLimiter

NOT_LATE = "not_late"
"""A percentile's hedge the supplier's tail does not call for: not asked, not refused."""
NO_TOKEN = "no_token"
NO_SLOT = "no_slot"
NO_TURN = "no_turn"
NO_TIME = "no_time"
REFUSALS = (NO_TOKEN, NO_SLOT, NO_TURN, NO_TIME)
"""Why a hedge the delay asked for did not go (``quoteflow_hedges_refused_total``)."""


@attrs.define
class Race:
    """A hedged call's two attempts: when the first was sent, and which lost."""

    sent: asyncio.Event = attrs.Factory(asyncio.Event)
    sent_at: float = 0.0
    lost: set[int] = attrs.Factory(set)
    """Attempts cancelled because the other won (not the deadline's cut)."""


class Attempt(Protocol):
    """One attempt of the call (``SupplierClient._attempt``)."""

    async def __call__(
        self,
        state: SupplierState,
        call: Call,
        trace: SupplierTrace,
        attempt: int,
        race: Race | None = None,
        *,
        hedge: bool = False,
    ) -> AttemptResult: ...


class Hedging:
    """Decides and runs hedged races; shares the client's slots, turns and pauses."""

    def __init__(self, slots: OutboundLimiter, turns: Turns, pauses: Pauses) -> None:
        self._slots = slots
        self._turns = turns
        self._pauses = pauses

    async def race(
        self, state: SupplierState, call: Call, trace: SupplierTrace, attempt: Attempt
    ) -> AttemptResult:
        """The first attempt; if it is still out after the hedge delay, the second beside it."""
        delay = self.delay(state)
        if delay is None:
            return await attempt(state, call, trace, 1)
        race = Race()
        first = asyncio.create_task(attempt(state, call, trace, 1, race))
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
            if first.done():
                return await first
            refused = self.refusal(state, call, trace, race.sent_at)
            if refused is not None:
                if refused != NOT_LATE:
                    trace.hedge_refused = refused  # the delay asked, and this is why none went
                return await first
            trace.hedged = True
            second = asyncio.create_task(attempt(state, call, trace, 2, race, hedge=True))
            tasks[second] = 2
            failed: AttemptResult | None = None
            pending: set[asyncio.Task[AttemptResult]] = {first, second}
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
                        hedges = state.hedge_budget
                        assert hedges is not None
                        hedges.paid_off()  # a hedge that won earns its token back
                    return result
            assert failed is not None
            return failed
        finally:
            running = [task for task in tasks if not task.done()]
            for task in running:
                task.cancel()  # the deadline, or the caller leaving: both end now
            if running:
                await asyncio.wait(running)

    @staticmethod
    def delay(state: SupplierState) -> float | None:
        """Seconds after the first attempt is sent that a hedge may go; None: not yet known."""
        hedge = state.hedge
        assert hedge is not None
        assert state.answer_times is not None
        if hedge.delay is not None:
            return hedge.delay
        assert hedge.percentile is not None
        found = state.answer_times.percentile(hedge.percentile)
        return None if found is None else max(HEDGE_FLOOR, found)

    def refusal(
        self, state: SupplierState, call: Call, trace: SupplierTrace, sent_at: float
    ) -> str | None:
        """Why no hedge goes now, or None: it goes, its slot, token and turn taken.

        With a percentile's delay, only a supplier whose calls run past the
        time the first attempt had at least ``HEDGE_TAIL`` of the time is
        hedged: one whose slowest answers fit anyway gains only load
        (``NOT_LATE``: the delay did not really ask). Then a hedge needs time
        for a median answer (``no_time``); a supplier that is not paused and
        gives its rate's turn now (``no_turn``); a hedge token, an OAuth2 token
        at hand and a retry budget that is not empty — failures still stop
        hedging — (``no_token``); a slot free within the supplier's share
        (``no_slot``). It never waits for any of them.
        """
        name = trace.supplier
        times = state.answer_times
        hedges = state.hedge_budget
        assert times is not None
        assert hedges is not None
        assert state.hedge is not None
        if state.hedge.delay is None:
            late = times.survival(call.deadline - sent_at)
            if late is None or late < HEDGE_TAIL:
                return NOT_LATE
        median = times.percentile(0.5) or 0.0
        if call.deadline - time.monotonic() < median:
            return NO_TIME
        if self._pauses.active and self._pauses.until(name) is not None:
            return NO_TURN
        if state.tokens is not None and state.tokens.current() is None:
            return NO_TOKEN
        if state.retry_budget.tokens < 1 or not hedges.try_spend():
            return NO_TOKEN  # in the fleet, this worker's pool: a sync refills it
        cart = bool(trace.lines)  # a cart's hedge keeps to the carts' part of the slots
        if not self._slots.try_acquire(name, later=cart):
            hedges.paid_off()  # the token back: nothing was sent
            return NO_SLOT
        rate = state.spec.rate
        if rate is not None and not self._turns.take_now(name, rate):
            self._slots.release(name, later=cart)
            hedges.paid_off()  # the token back: nothing was sent
            return NO_TURN
        return None
