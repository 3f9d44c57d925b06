"""A time limit on one Redis call that our own busy event loop cannot trip.

``asyncio.timeout`` cancels at its deadline whatever kept the reply from us.
When the loop itself was busy past the deadline (one long turn serving
requests), a reply Redis sent in time may be sitting unread in the socket:
cancelled then, the call would count as a Redis failure, and the worker would
fall back for nothing. So the deadline first looks at how late it fired:

- on time (within ``LOOP_LATE``) and no reply yet: Redis did not answer in
  time — the call is cancelled, exactly as ``asyncio.timeout`` would;
- late by more than ``LOOP_LATE``: the loop was busy, not Redis. The deadline
  looks again ``LOOP_LATE`` later, after the loop has read what arrived
  meanwhile (an answered call is then done and the look never comes), and
  goes on doing so while the loop stays late, for at most ``longest`` in all.

So the time limit measures Redis (the round trip while the loop was free to
read it), not the loop's lag. ``loop_was_late`` tells which happened.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from quoteflow.fleet.timing import LOOP_LATE


class LoopFairTimeout:
    """``async with LoopFairTimeout(limit, longest=...)``: ``TimeoutError`` when Redis is slow."""

    def __init__(self, limit: float, *, longest: float) -> None:
        self.limit = limit
        self.longest = max(limit, longest)
        self.loop_was_late = False
        """The deadline came while the loop was busy at least once (and was put off)."""
        self._timeout = asyncio.timeout(None)
        self._handle: asyncio.TimerHandle | None = None
        self._give_up = 0.0

    async def __aenter__(self) -> LoopFairTimeout:
        await self._timeout.__aenter__()
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._give_up = now + self.longest
        self._arm(loop, now + self.limit)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
        await self._timeout.__aexit__(exc_type, exc, tb)  # our cancel becomes TimeoutError

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._handle = loop.call_at(when, self._due, loop, when)

    def _due(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        now = loop.time()
        if now - when > LOOP_LATE and now < self._give_up:
            # Busy past the deadline: a reply may wait unread. Look again once
            # the loop has polled its sockets (the next turn, at the latest).
            self.loop_was_late = True
            self._arm(loop, now + LOOP_LATE)
        else:
            self._timeout.reschedule(now)  # cancels the call: Redis was slow
