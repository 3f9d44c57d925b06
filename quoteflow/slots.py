"""The outbound limit and each supplier's share of it, taken in one step.

An attempt may start only when both hold: one of the shared outbound slots is
free, and its supplier holds fewer than its share of them (so a supplier that
hangs can never take the capacity the healthy ones need). Two
``asyncio.Semaphore``\\ s in a row would make a busy attempt wait, and be woken,
once for each; here it waits at most once, and is woken only when it can
really start. Under a saturating load most attempts wait, so the wake-ups
were a visible part of QuoteFlow's CPU per request.

No lock: every call comes from the event loop's thread, and nothing between
checking and taking a slot awaits.

A waiter may bring its ``Patience``: how long its attempt could still start
and finish inside its request's deadline (the deadline less what the
supplier has been seen to need). When that runs out it gives its place up
at once — ``acquire`` answers False — rather than take a slot it could only
waste: granted first come, first served to calls that can no longer
finish, the slots convoy behind the deadline and deliver almost nothing
(docs/retries.md, "Slots for calls that can still finish").

Once a call gives its place up, its request will answer without that
supplier: ``OutboundSlots`` then serves the request's other waiting calls
only when no call of a request that can still get every quote can use the
slot, so that the slots' time goes to complete answers first.

A cart's calls wait ``later``: a freed slot goes to them only when no single
quote's call can use it, so that a 200-line cart never stands between a
single quote and its next slot. The order of the hand-out, one place for
both classes: single quotes' calls of whole requests, then of requests that
lost a call, then carts' calls; first come, first served within each.

``OutboundLimiter`` is the seam: the supplier client needs only ``acquire``,
``release`` and ``in_use``. ``OutboundSlots`` holds them for one process;
``fleet.FleetSlots`` holds them for every worker sharing a Redis (fleet mode).
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Container, Iterable, Mapping
from typing import Final, Protocol

BROKEN_KEPT: Final = 1024
"""Requests remembered as having lost a call to the slot queue (request ids are unique)."""


class Patience(Protocol):
    """How long one attempt may still wait for a slot, and whose call it is."""

    @property
    def request_id(self) -> str:
        """The request the attempt serves: its calls are kept together (``OutboundSlots``)."""
        ...

    def left(self, now: float) -> float:
        """Seconds from ``now`` (``time.monotonic()``) the attempt may still wait.

        Zero or less: too late to start one.
        """
        ...


class Impatience:
    """Answers slot waiters False once their patience runs out, unless a slot came first.

    A waiter's patience is read:

    - when its wait begins (already out of time: never queued);
    - by the hand-out, which asks ``ready`` before it gives a freed slot, so
      that the slot goes to a waiter that can still use it — read afresh, as
      the supplier's learned time may have grown, or a shared call's
      deadline moved, since the wait began;
    - by one timer for all the waiters of a limiter, set for the soonest
      patience to run out, so that a waiter no slot reaches is answered
      then, not at its deadline (a timer for each wait cost a saturating
      load, where most attempts wait briefly, more than the rule itself);
    - on ``reconsider``: the supplier client asks for it when a cut attempt
      raised a supplier's learned time.

    The waiter's future is resolved, never cancelled: cancellation is the
    request's deadline (or its caller leaving), and the two must never be
    confused. A hand-out skips a future that is already done, so a waiter
    that gave up is passed over exactly like one that was cancelled.
    """

    def __init__(self) -> None:
        self._waiting: dict[asyncio.Future[bool], Patience] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._due = math.inf
        """``time.monotonic()`` at which the timer fires (inf: none set)."""

    def watch(self, patience: Patience, granted: asyncio.Future[bool]) -> bool:
        """Answer ``granted`` False when ``patience`` runs out; False if it already has."""
        now = time.monotonic()
        wait = patience.left(now)
        if wait <= 0:
            return False
        self._waiting[granted] = patience
        if now + wait < self._due:
            self._set(now, wait)
        return True

    def ready(self, granted: asyncio.Future[bool]) -> bool:
        """Whether a freed slot may go to this waiter; if its patience ran out, answer it False."""
        patience = self._waiting.pop(granted, None)
        if patience is None or patience.left(time.monotonic()) > 0:
            return True
        granted.set_result(False)
        return False

    def forget(self, granted: asyncio.Future[bool]) -> None:
        """The waiter left (cancelled): nothing to check any more."""
        self._waiting.pop(granted, None)

    def reconsider(self) -> None:
        """Read every waiter's patience again now (a supplier's learned time grew)."""
        self._check()

    def _set(self, now: float, wait: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._due = now + wait
        self._timer = asyncio.get_running_loop().call_later(wait, self._check)

    def _check(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._due = None, math.inf
        now = time.monotonic()
        waiting = {}
        soonest = math.inf
        for granted, patience in self._waiting.items():
            if granted.done():
                continue  # answered already
            wait = patience.left(now)
            if wait <= 0:
                granted.set_result(False)
            else:  # not yet; or a shared call's deadline moved later meanwhile
                waiting[granted] = patience
                soonest = min(soonest, wait)
        self._waiting = waiting
        if soonest < math.inf:  # a call to a supplier not seen yet waits without end
            self._set(now, soonest)


class OutboundLimiter(Protocol):
    """The outbound limit and each supplier's share, as the supplier client uses them."""

    @property
    def in_use(self) -> int:
        """Slots this process's attempts hold now."""
        ...

    async def acquire(
        self, supplier: str, patience: Patience | None = None, *, later: bool = False
    ) -> bool:
        """Wait until an attempt at ``supplier`` may start (True), or its ``patience`` runs out.

        False: the attempt could no longer finish in time and holds nothing.
        Without ``patience`` it waits until a slot comes. A cancelled wait holds nothing.
        ``later``: a cart's call, served after every single quote's call that can use the slot.
        """
        ...

    def release(self, supplier: str) -> None:
        """The attempt at ``supplier`` is over: its slot is free for the next one."""
        ...

    def try_acquire(self, supplier: str) -> bool:
        """A slot for ``supplier`` now if one is free within its share, else False: no wait."""
        ...

    def reconsider(self) -> None:
        """A supplier's learned time grew: every waiter's patience is read again now."""
        ...


class OutboundSlots:
    """``limit`` slots shared by every supplier, at most its share held by any one."""

    def __init__(self, limit: int, shares: Mapping[str, int]) -> None:
        self.limit = limit
        self.free = limit
        self._share = dict(shares)
        self._held = dict.fromkeys(shares, 0)
        self._current = set(shares)
        self._waiting: collections.deque[tuple[str, asyncio.Future[bool], str | None]] = (
            collections.deque()
        )
        self._later: collections.deque[tuple[str, asyncio.Future[bool], str | None]] = (
            collections.deque()
        )
        """Carts' calls waiting: served once no call in ``_waiting`` can use a slot."""
        self._impatience = Impatience()
        self._broken: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Requests that lost a call to the queue (the newest ``BROKEN_KEPT``): served last."""

    def share(self, supplier: str) -> int:
        """Slots ``supplier`` may hold at once."""
        return self._share[supplier]

    def retarget(self, shares: Mapping[str, int]) -> None:
        """Serve a new catalogue's suppliers and shares from now on.

        A supplier that stays keeps the slots it holds. One that is gone keeps
        its entry and share for the requests still in flight on the old
        catalogue, until ``forget`` drops it.
        """
        self._share.update(shares)
        for supplier in shares:
            self._held.setdefault(supplier, 0)
        self._current = set(shares)
        if self._waiting or self._later:
            self._hand_out()  # a larger share may let a waiter in now

    def forget(self, suppliers: Iterable[str]) -> None:
        """Drop suppliers of an old catalogue once no attempt holds or waits for their slots."""
        waiting = {supplier for supplier, _, _ in (*self._waiting, *self._later)}
        for supplier in suppliers:
            if supplier in self._current or supplier not in self._held:
                continue  # named again by a later catalogue, or already forgotten
            if self._held[supplier] or supplier in waiting:
                continue  # still busy (one budget after the reload: never)
            del self._held[supplier], self._share[supplier]

    @property
    def in_use(self) -> int:
        """Slots held now."""
        return self.limit - self.free

    def held(self, supplier: str) -> int:
        """Slots ``supplier``'s attempts hold now."""
        return self._held[supplier]

    async def acquire(
        self, supplier: str, patience: Patience | None = None, *, later: bool = False
    ) -> bool:
        """Take a slot for ``supplier``, waiting first come, first served until one fits.

        With ``patience``, the wait ends False — holding nothing, out of the
        queue — once the attempt could no longer finish in time. ``later``
        (a cart's call) waits behind every single quote's call.
        """
        if self.free and self._held[supplier] < self._share[supplier]:
            # Nobody waiting could use this slot: release() hands a slot to
            # every waiter it fits the moment it frees, so whoever still waits
            # is waiting for their own supplier's share.
            self.free -= 1
            self._held[supplier] += 1
            return True
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        request_id = None if patience is None else patience.request_id
        if patience is not None and not self._impatience.watch(patience, granted):
            if not later:
                self._lost(patience.request_id)
            return False  # too late already: never queued
        entry = (supplier, granted, request_id)
        # A cart loses lines to the queue as a matter of course: it marks nothing.
        queue = self._later if later else self._waiting
        queue.append(entry)
        try:
            if await granted:
                return True
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.result():
                self.release(supplier)  # handed a slot, then cancelled before using it
            else:
                queue.remove(entry)
                self._impatience.forget(granted)
            raise
        queue.remove(entry)  # gave up: its place goes to whoever can still use it
        if request_id is not None and not later:
            self._lost(request_id)
        return False

    def try_acquire(self, supplier: str) -> bool:
        """A slot now if one is free and ``supplier`` is under its share (a hedge): never waits.

        A free slot is one no waiter could use: ``release`` hands each freed
        slot to the first waiter it fits, so a hedge never takes one from them.
        """
        if self.free and self._held[supplier] < self._share[supplier]:
            self.free -= 1
            self._held[supplier] += 1
            return True
        return False

    def _lost(self, request_id: str) -> None:
        """A call of ``request_id`` gave its place up: its other calls yield to whole requests.

        Slots given to a request that will answer without one supplier
        anyway are better spent on requests that can still get every quote;
        its calls are still served when no whole request's call fits.
        """
        self._broken[request_id] = None
        if len(self._broken) > BROKEN_KEPT:
            self._broken.popitem(last=False)

    def reconsider(self) -> None:
        """A supplier's learned time grew: every waiter's patience is read again now."""
        self._impatience.reconsider()

    def release(self, supplier: str) -> None:
        """Give back ``supplier``'s slot, handing it on to the first waiter it fits."""
        self.free += 1
        self._held[supplier] -= 1
        if self._waiting or self._later:
            self._hand_out()

    def _hand_out(self) -> None:
        broken = self._broken or None
        waiting = self._waiting
        if waiting:
            self._hand_out_to(waiting, broken)
            if broken and self.free and waiting:
                self._hand_out_to(waiting, None)  # what the whole requests' calls could not use
        if self.free and self._later:
            self._hand_out_to(self._later, None)  # what no single quote's call could use

    def _hand_out_to(
        self,
        waiting: collections.deque[tuple[str, asyncio.Future[bool], str | None]],
        passed_over: Container[str | None] | None,
    ) -> None:
        index = 0
        while self.free and index < len(waiting):
            supplier, granted, request_id = waiting[index]
            if (
                granted.done()  # cancelled or given up, about to leave
                or self._held[supplier] >= self._share[supplier]
                or (passed_over is not None and request_id in passed_over)
                or not self._impatience.ready(granted)  # too late to use it: answered False
            ):
                index += 1
                continue
            del waiting[index]
            self.free -= 1
            self._held[supplier] += 1
            granted.set_result(True)
