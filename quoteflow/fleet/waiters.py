"""This worker's waiting calls in fleet mode: one line per supplier, and whose turn a slot is.

A call that finds no leased slot idle waits here, in its supplier's line,
until ``FleetSlots`` has a slot for it: one a local attempt released, one a
sync granted, or — on its own, Redis away — room within the safe share. The
lines are first come, first served, with one exception: a cart's call
(``later``) waits behind every single quote's call of its supplier.

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

from quoteflow.slots import Impatience, Patience

LATER: Final = 1 << 62
"""Added to a cart's call's place in its line: every single quote's call comes first."""

Waiter = tuple[int, asyncio.Future[bool]]
"""A place in a line: its turn (smaller first) and the future a slot resolves."""


class LocalWaiters:
    """Per supplier, this worker's calls waiting for a slot, in turn; their patience watched."""

    def __init__(self, suppliers: Iterable[str]) -> None:
        self._lines: dict[str, collections.deque[Waiter]] = {
            supplier: collections.deque() for supplier in suppliers
        }
        self._turns = itertools.count()
        self._impatience = Impatience()

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

    def join(self, supplier: str, granted: asyncio.Future[bool], *, later: bool) -> Waiter:
        """Put ``granted`` in ``supplier``'s line: at its end, or before the carts' calls."""
        line = self._lines[supplier]
        if later:
            waiter = (LATER + next(self._turns), granted)
            line.append(waiter)
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

    def next_ready(self, supplier: str) -> asyncio.Future[bool] | None:
        """Out of ``supplier``'s line: its first waiter that can still use a slot now, if any.

        Passed over on the way, and out of the line: waiters cancelled or
        answered already, and those whose patience has run out (``ready``
        answers them False).
        """
        line = self._lines[supplier]
        while line:
            _, granted = line.popleft()
            if not granted.done() and self._impatience.ready(granted):
                return granted
        return None

    def next_in_turn(self, fits: Callable[[str], bool]) -> tuple[str, asyncio.Future[bool]] | None:
        """Out of its line: the longest-waiting head among the suppliers that ``fits`` allows.

        Heads already answered or cancelled are dropped first. The waiter is
        returned whether or not its patience has run out: ask ``ready``.
        """
        chosen: str | None = None
        first = -1
        for supplier, line in self._lines.items():
            while line and line[0][1].done():
                line.popleft()
            if line and fits(supplier) and (chosen is None or line[0][0] < first):
                chosen, first = supplier, line[0][0]
        if chosen is None:
            return None
        return chosen, self._lines[chosen].popleft()[1]
