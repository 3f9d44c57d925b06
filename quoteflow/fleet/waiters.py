"""This worker's waiting calls in fleet mode: one line per supplier, and whose turn a slot is.

A call that finds no leased slot idle waits here, in its supplier's line,
until ``FleetSlots`` has a slot for it: one a local attempt released, one a
sync granted, or — on its own, Redis away — room within the safe share. The
lines are first come, first served within each class: a cart's call
(``later``) stands behind every single quote's call of its supplier, and is
served first only while this worker's carts hold less than their part of
the slots (``slots.CartPart``, the same rule as ``OutboundSlots``'). One
difference: a leased slot serves one supplier, so a freed slot that no
waiting single quote's call can use (they all wait for other suppliers)
goes to a cart's call even beyond the part; kept, it would stand idle until
it went back to Redis. Measured, single quotes that fill every slot kept
0.53-0.61 x their goodput beside carts without it, 0.67 x with it.

A waiter is a future resolved True (a slot is its) or False (its patience
ran out: ``slots.Impatience`` answers it), never cancelled by the lines;
cancellation is its request's deadline. A waiter that is answered or
cancelled stays in its line until it leaves (its ``acquire`` removes it) or
a hand-out passes over it, so a line's length is not its live waiters:
``live`` counts those, ``queued`` asks only whether anything stands in it
(a new call never overtakes a line, even one whose head is about to leave).

No lock: every call comes from the event loop's thread, as in ``FleetSlots``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Callable, Iterable
from typing import Final

from quoteflow.slots import CartPart, Impatience, Patience

LATER: Final = 1 << 62
"""Added to a cart's call's place in its line: every single quote's call comes first."""

Waiter = tuple[int, asyncio.Future[bool]]
"""A place in a line: its turn (smaller first) and the future a slot resolves."""


class LocalWaiters:
    """Per supplier, this worker's calls waiting for a slot, in turn; their patience watched.

    ``in_use`` is what this worker's attempts hold, as ``FleetSlots`` counts
    it: with ``carts.held`` it tells whether a single quote holds a slot.
    ``wake`` is called when carts' calls may take more slots than they could
    (single quotes' linger passed), with one standing idle for them.
    """

    def __init__(self, suppliers: Iterable[str], carts: CartPart, wake: Callable[[], None]) -> None:
        self._lines: dict[str, collections.deque[Waiter]] = {
            supplier: collections.deque() for supplier in suppliers
        }
        self._turns = itertools.count()
        self._impatience = Impatience()
        self.carts = carts
        self._wake = wake

    def add_supplier(self, supplier: str) -> None:
        """A supplier new to this worker (a reload): an empty line."""
        self._lines[supplier] = collections.deque()

    def drop_supplier(self, supplier: str) -> None:
        """A supplier a reload removed: its line goes (nobody can wait in it any more)."""
        self._lines.pop(supplier, None)

    def watch(self, patience: Patience, granted: asyncio.Future[bool]) -> bool:
        """Answer ``granted`` False when ``patience`` runs out; False if it already has."""
        return self._impatience.watch(patience, granted)

    def ready(self, granted: asyncio.Future[bool]) -> bool:
        """Whether a slot may go to this waiter now; if its patience ran out, answer it False."""
        return self._impatience.ready(granted)

    def forget(self, granted: asyncio.Future[bool]) -> None:
        """The waiter was cancelled: its patience needs no watching any more."""
        self._impatience.forget(granted)

    def reconsider(self) -> None:
        """A supplier's learned time grew: every waiter's patience is read again now."""
        self._impatience.reconsider()

    def join(
        self, supplier: str, granted: asyncio.Future[bool], *, later: bool, in_use: int
    ) -> Waiter:
        """Put ``granted`` in ``supplier``'s line: at its end, or before the carts' calls."""
        line = self._lines[supplier]
        if later:
            waiter = (LATER + next(self._turns), granted)
            line.append(waiter)
            self._cart_room(in_use)()  # held back by single quotes' linger: woken once it ends
        elif line and line[-1][0] >= LATER:
            # Before the carts' calls: a single quote never waits behind a cart.
            waiter = (next(self._turns), granted)
            index = len(line)
            while index and line[index - 1][0] >= LATER:
                index -= 1
            line.insert(index, waiter)
        else:
            waiter = (next(self._turns), granted)
            line.append(waiter)
        return waiter

    def leave(self, supplier: str, waiter: Waiter) -> None:
        """``waiter`` leaves ``supplier``'s line, if a hand-out has not passed over it already."""
        with contextlib.suppress(ValueError):
            self._lines[supplier].remove(waiter)

    def queued(self, supplier: str) -> bool:
        """Whether anyone stands in ``supplier``'s line, live or about to leave."""
        return bool(self._lines[supplier])

    def may_take(self, supplier: str, later: bool, in_use: int) -> bool:
        """Whether a new call may take an idle slot of ``supplier`` rather than queue.

        Never past a call of its class or one before it (a single quote's call
        goes before carts' calls), and a cart's only within the carts' part.
        """
        line = self._lines[supplier]
        if not later:
            return not line or line[0][0] >= LATER
        return not line and self.carts.room(self._singles_busy(in_use))

    def _singles_busy(self, in_use: int) -> bool:
        """Whether a single quote's call holds a slot or waits for one."""
        return in_use > self.carts.held or self._singles_waiting()

    def _singles_waiting(self) -> bool:
        """Whether a single quote's call of any supplier still waits."""
        return any(
            turn < LATER and not granted.done()
            for line in self._lines.values()
            for turn, granted in line
        )

    def _cart_room(self, in_use: int) -> Callable[[], bool]:
        def room() -> bool:
            busy = self._singles_busy(in_use)
            if self.carts.room(busy):
                return True
            # A slot may stand idle for carts only while single quotes linger.
            self.carts.wake_after_linger(busy, self._wake)
            return False

        return room

    def wanted(self, supplier: str, in_use: int) -> int:
        """``supplier``'s live waiters, carts' calls only as many as may take a slot now."""
        cart_spare = self.carts.spare(self._singles_busy(in_use))
        singles = carts = 0
        for turn, granted in self._lines[supplier]:
            if not granted.done():
                if turn < LATER:
                    singles += 1
                else:
                    carts += 1
        return singles + int(min(carts, cart_spare))

    def live(self, supplier: str) -> int:
        """``supplier``'s waiters still waiting: neither granted, answered nor cancelled."""
        return sum(1 for _, granted in self._lines[supplier] if not granted.done())

    @property
    def total(self) -> int:
        """Waiters still waiting, for every supplier."""
        return sum(map(self.live, self._lines))

    def any_live(self) -> bool:
        """Whether any supplier has a waiter still waiting."""
        return any(not granted.done() for line in self._lines.values() for _, granted in line)

    def next_ready(self, supplier: str, in_use: int) -> tuple[asyncio.Future[bool], bool] | None:
        """Out of ``supplier``'s line: the waiter a slot goes to now, and whether it is a cart's.

        Below the carts' part, the first cart's call that can use it, before
        single quotes'; then the first single quote's; then the first cart's
        if the carts' part has room, or if single quotes' calls wait only for
        other suppliers. Passed over on the way, and out of the line: waiters
        cancelled or answered already, and those whose patience has run out
        (``ready`` answers them False).
        """
        line = self._lines[supplier]
        carts_first = self.carts.held < self.carts.most
        cart_room = self._cart_room(in_use)
        if carts_first:
            index = _first_cart(line)
            while index is not None:
                granted = line[index][1]
                del line[index]
                if self._impatience.ready(granted):
                    return granted, True
                index = _first_cart(line)
        while line and line[0][0] < LATER:
            _, granted = line.popleft()
            if not granted.done() and self._impatience.ready(granted):
                return granted, False
        if line and (self._singles_waiting() or cart_room()):
            while line:
                _, granted = line.popleft()
                if not granted.done() and self._impatience.ready(granted):
                    return granted, True
        return None

    def next_in_turn(
        self, fits: Callable[[str], bool], in_use: int
    ) -> tuple[str, asyncio.Future[bool], bool] | None:
        """Out of its line: the longest-waiting head among the suppliers that ``fits`` allows.

        A cart's call is a head once no single quote's call stands before it;
        below the carts' part, the first cart's call of a line goes before
        every single quote's; else a cart's call goes only if the part has room.
        Heads already answered or cancelled are dropped first. The waiter is
        returned whether or not its patience has run out: ask ``ready``. The
        bool: whether it is a cart's call.
        """
        carts_first = self.carts.held < self.carts.most
        chosen: str | None = None
        first = at = -1
        for supplier, line in self._lines.items():
            while line and line[0][1].done():
                line.popleft()
            if not line or not fits(supplier):
                continue
            cart = _first_cart(line) if carts_first else None
            index = 0 if cart is None else cart
            turn = line[index][0]
            if chosen is None or _sooner(turn, first, carts_first):
                chosen, first, at = supplier, turn, index
        if chosen is None or (first >= LATER and not carts_first and not self._cart_room(in_use)()):
            return None
        line = self._lines[chosen]
        granted = line[at][1]
        del line[at]
        return chosen, granted, first >= LATER


def _first_cart(line: collections.deque[Waiter]) -> int | None:
    """Where the first cart's call still waiting stands in ``line``, if one does."""
    for index, (turn, granted) in enumerate(line):
        if turn >= LATER and not granted.done():
            return index
    return None


def _sooner(turn: int, other: int, carts_first: bool) -> bool:
    """Whether the call of ``turn`` goes before that of ``other``: a cart's first, if so asked."""
    if carts_first and (turn >= LATER) != (other >= LATER):
        return turn >= LATER
    return turn < other
