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

A cart's calls wait ``later``, a class of their own (``CartPart``): while
single quotes are present, all carts together hold at most ``cart_slots``
(``--cart-slots``) and single quotes get the rest. A cart's call below that
part goes before every single quote's call, so that single quotes filling
every slot never starve a cart; beyond it, a free slot is kept for the next
single quote, so that a 200-line cart's calls never stand between a single
quote and its next slot. With no single quote present, carts use every
slot. The order of the hand-out, one place for both classes: carts'
calls while carts hold fewer than their part, then single quotes' calls of
whole requests, then of requests that lost a call, then carts' calls while
no single quote is present; first come, first served within each.

``OutboundLimiter`` is the seam: the supplier client needs only ``acquire``,
``release`` and ``in_use``. ``OutboundSlots`` holds them for one process;
``fleet.FleetSlots`` holds them for every worker sharing a Redis (fleet mode).
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Final, Protocol

from quoteflow.config import Settings

BROKEN_KEPT: Final = 1024
"""Requests remembered as having lost a call to the slot queue (request ids are unique)."""

SINGLES_LINGER: Final = 0.05
"""Seconds single quotes count as present after their last slot was given back.

A caller's next single quote comes a few ms after its answer; were carts to
take every slot in that gap, each single quote would wait for a cart's call
to end (0.68 x their goodput alone, measured before this rule). 50 ms, one
call of the lab's at its bench latency, spans the gap on a loaded machine
and costs carts at most that long on their part once single quotes stop.
"""


class CartPart:
    """Carts' part of a process's slots beside single quotes (``--cart-slots``; issue 49).

    One rule for ``OutboundSlots`` and ``fleet.FleetSlots``. While single
    quotes are *present* — a single quote's call holds or waits for a slot,
    or one gave its slot back less than ``SINGLES_LINGER`` ago — carts
    together hold at most ``most`` slots; below it a cart's call goes first.
    With none present, carts may hold every slot; once single quotes come
    back, slots carts give back go to them until carts are down to ``most``
    (a call in flight is never cut).
    """

    def __init__(self, most: int) -> None:
        self.most = most
        self.held = 0
        """Slots carts' calls hold now."""
        self.singles_until = -math.inf
        """``time.monotonic()`` until which single quotes count as present with no slot held."""
        self._wake: asyncio.TimerHandle | None = None

    def singles_gone(self) -> None:
        """Single quotes just gave their last slot back: present for ``SINGLES_LINGER`` more."""
        self.singles_until = time.monotonic() + SINGLES_LINGER

    def room(self, singles_busy: bool) -> bool:
        """Whether a cart's call may take one more slot; ``singles_busy``: one holds or waits."""
        return self.held < self.most or (
            not singles_busy and time.monotonic() >= self.singles_until
        )

    def spare(self, singles_busy: bool) -> float:
        """How many more slots carts' calls may take now (inf: every one)."""
        if singles_busy or time.monotonic() < self.singles_until:
            return max(0, self.most - self.held)
        return math.inf

    def wake_after_linger(self, singles_busy: bool, wake: Callable[[], None]) -> None:
        """Call ``wake`` when single quotes' linger is over, if only it holds carts back now.

        Without it a slot left free for single quotes that did not come back
        would wait for the next slot given back before a cart's call got it.
        """
        if self._wake is not None or singles_busy or self.held < self.most:
            return
        left = self.singles_until - time.monotonic()
        if left > 0:
            self._wake = asyncio.get_running_loop().call_later(left, self._woken, wake)

    def _woken(self, wake: Callable[[], None]) -> None:
        self._wake = None
        wake()


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
        ``later``: a cart's call, served by the carts' part of the slots (``CartPart``).
        """
        ...

    def release(self, supplier: str, *, later: bool = False) -> None:
        """The attempt at ``supplier`` is over: its slot is free for the next one.

        ``later`` as the slot was taken: a cart's call gives back a cart's slot.
        """
        ...

    def try_acquire(self, supplier: str, *, later: bool = False) -> bool:
        """A slot for ``supplier`` now if one is free within its share, else False: no wait."""
        ...

    def reconsider(self) -> None:
        """A supplier's learned time grew: every waiter's patience is read again now."""
        ...


Queue = collections.deque[tuple[str, asyncio.Future[bool], str | None]]


class OutboundSlots:
    """``limit`` slots shared by every supplier, at most its share held by any one.

    ``cart_slots``: the carts' part (``CartPart``); 0, carts get only what no
    single quote's call can use.
    """

    def __init__(self, limit: int, shares: Mapping[str, int], *, cart_slots: int = 0) -> None:
        self.limit = limit
        self.free = limit
        self._share = dict(shares)
        self._held = dict.fromkeys(shares, 0)
        self._current = set(shares)
        self._waiting: Queue = collections.deque()
        self._later: Queue = collections.deque()
        """Carts' calls waiting, served as ``CartPart`` says."""
        self.carts = CartPart(cart_slots)
        self._impatience = Impatience()
        self._broken: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Requests that lost a call to the queue (the newest ``BROKEN_KEPT``): served last."""

    @classmethod
    def of(cls, settings: Settings, shares: Mapping[str, int]) -> OutboundSlots:
        """The slots ``settings`` ask for: the outbound limit, and the carts' part of it."""
        return cls(settings.outbound_limit, shares, cart_slots=settings.carts_part)

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

    def _singles_busy(self) -> bool:
        """Whether a single quote's call holds a slot or waits for one."""
        return bool(self._waiting) or self.limit - self.free > self.carts.held

    async def acquire(
        self, supplier: str, patience: Patience | None = None, *, later: bool = False
    ) -> bool:
        """Take a slot for ``supplier``, waiting first come, first served until one fits.

        With ``patience``, the wait ends False — holding nothing, out of the
        queue — once the attempt could no longer finish in time. ``later``
        (a cart's call) waits as ``CartPart`` says.
        """
        if self.free and self._held[supplier] < self._share[supplier]:
            # Nobody waiting could use this slot: release() hands a slot to
            # every waiter it fits the moment it frees, so whoever still waits
            # is waiting for their own supplier's share (or, a cart's call,
            # for the carts' part).
            if not later:
                self.free -= 1
                self._held[supplier] += 1
                return True
            if self.carts.room(self._singles_busy()):
                self.free -= 1
                self._held[supplier] += 1
                self.carts.held += 1
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
        if later and self.free:  # a free slot only single quotes' linger may keep
            self.carts.wake_after_linger(self._singles_busy(), self._linger_over)
        try:
            if await granted:
                return True
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.result():
                # handed a slot, then cancelled before using it
                self.release(supplier, later=later)
            else:
                queue.remove(entry)
                self._impatience.forget(granted)
            raise
        queue.remove(entry)  # gave up: its place goes to whoever can still use it
        if request_id is not None and not later:
            self._lost(request_id)
        return False

    def try_acquire(self, supplier: str, *, later: bool = False) -> bool:
        """A slot now if one is free and ``supplier`` is under its share (a hedge): never waits.

        A free slot is one no waiter could use: ``release`` hands each freed
        slot to the first waiter it fits, so a hedge never takes one from them.
        A cart's hedge keeps to the carts' part as its first attempt does.
        """
        if self.free and self._held[supplier] < self._share[supplier]:
            if later:
                if not self.carts.room(self._singles_busy()):
                    return False
                self.carts.held += 1
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

    def release(self, supplier: str, *, later: bool = False) -> None:
        """Give back ``supplier``'s slot, handing it on to the first waiter it fits."""
        self.free += 1
        self._held[supplier] -= 1
        if later:
            self.carts.held -= 1
        elif self.limit - self.free == self.carts.held and not self._waiting:
            self.carts.singles_gone()  # the last single quote's slot
        if self._waiting or self._later:
            self._hand_out()

    def _hand_out(self) -> None:
        carts = self.carts
        later = self._later
        if later and carts.held < carts.most:
            self._hand_out_to(later, None, carts=True)  # the carts' part comes first
        broken = self._broken or None
        waiting = self._waiting
        if waiting and self.free:
            self._hand_out_to(waiting, broken)
            if broken and self.free and waiting:
                self._hand_out_to(waiting, None)  # what the whole requests' calls could not use
        if self.free and later:
            self._hand_out_to(later, None, carts=True)  # what no single quote's call could use
            if self.free and later:
                self.carts.wake_after_linger(self._singles_busy(), self._linger_over)

    def _linger_over(self) -> None:
        if self._later:
            self._hand_out()

    def _hand_out_to(
        self, waiting: Queue, passed_over: Container[str | None] | None, *, carts: bool = False
    ) -> None:
        index = 0
        while self.free and index < len(waiting):
            if carts and not self.carts.room(self._singles_busy()):
                return
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
            if carts:
                self.carts.held += 1
            granted.set_result(True)
