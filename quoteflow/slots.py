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

``OutboundLimiter`` is the seam: the supplier client needs only ``acquire``,
``release`` and ``in_use``. ``OutboundSlots`` holds them for one process;
``fleet.FleetSlots`` holds them for every worker sharing a Redis (fleet mode).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable, Mapping
from typing import Protocol


class OutboundLimiter(Protocol):
    """The outbound limit and each supplier's share, as the supplier client uses them."""

    @property
    def in_use(self) -> int:
        """Slots this process's attempts hold now."""
        ...

    async def acquire(self, supplier: str) -> None:
        """Wait until an attempt at ``supplier`` may start; a cancelled wait holds nothing."""
        ...

    def release(self, supplier: str) -> None:
        """The attempt at ``supplier`` is over: its slot is free for the next one."""
        ...


class OutboundSlots:
    """``limit`` slots shared by every supplier, at most its share held by any one."""

    def __init__(self, limit: int, shares: Mapping[str, int]) -> None:
        self.limit = limit
        self.free = limit
        self._share = dict(shares)
        self._held = dict.fromkeys(shares, 0)
        self._current = set(shares)
        self._waiting: collections.deque[tuple[str, asyncio.Future[None]]] = collections.deque()

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
        if self._waiting:
            self._hand_out()  # a larger share may let a waiter in now

    def forget(self, suppliers: Iterable[str]) -> None:
        """Drop suppliers of an old catalogue once no attempt holds or waits for their slots."""
        waiting = {supplier for supplier, _ in self._waiting}
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

    async def acquire(self, supplier: str) -> None:
        """Take a slot for ``supplier``, waiting first come, first served until one fits."""
        if self.free and self._held[supplier] < self._share[supplier]:
            # Nobody waiting could use this slot: release() hands a slot to
            # every waiter it fits the moment it frees, so whoever still waits
            # is waiting for their own supplier's share.
            self.free -= 1
            self._held[supplier] += 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (supplier, granted)
        self._waiting.append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(supplier)  # handed a slot, then cancelled before using it
            else:
                self._waiting.remove(entry)
            raise

    def release(self, supplier: str) -> None:
        """Give back ``supplier``'s slot, handing it on to the first waiter it fits."""
        self.free += 1
        self._held[supplier] -= 1
        if self._waiting:
            self._hand_out()

    def _hand_out(self) -> None:
        index = 0
        while self.free and index < len(self._waiting):
            supplier, granted = self._waiting[index]
            if granted.done() or self._held[supplier] >= self._share[supplier]:
                index += 1  # cancelled and about to leave, or its supplier is at its share
                continue
            del self._waiting[index]
            self.free -= 1
            self._held[supplier] += 1
            granted.set_result(None)
