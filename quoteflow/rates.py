"""A supplier's outbound rate: ``rate = "N/Ws"`` in its catalogue entry.

The callers' meter, turned round: the same syntax and GCRA semantics (a
burst of the whole quota, then one every ``W / N`` s), counting every attempt
sent to the supplier, retries included. In one process it is ``LocalRates``;
in fleet mode the callers' ``SharedMeter`` (``kind="supplier"``) holds it in
Redis for every worker, leased where far from the limit, and keeps each
worker to ``rate / live workers`` while Redis is out of reach.

An attempt the rate refuses waits for its turn only while the deadline still
leaves the supplier its learned attempt time, holding no outbound slot while
it waits; otherwise it is not sent: ``rate_limited``. The attempts waiting
for one supplier stand in line (``Turns``), first come first served: the
first asks the meter, those behind it too while the burst has room for them
all, and each of the others reckons its wait as the turns of those ahead of
it (in the fleet, as if every worker's line were as long). So an attempt
whose turn would come too late is refused at once rather than after waiting
nearly its whole deadline for a turn that goes to someone else, and the
attempts woken for a turn are woken one turn apart, not all at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Protocol

from quoteflow.callers import LocalMeter, Rate, Standing
from quoteflow.models import MovingDeadline


class RateMeter(Protocol):
    """Admits one attempt at ``name``'s rate, or says how long until the next one may go."""

    def spend_now(self, name: str, rate: Rate) -> tuple[bool, Standing] | None:
        """The answer if it needs no round trip (a lease, this process's meter), else ``None``."""

    async def spend(self, name: str, rate: Rate) -> tuple[bool, Standing]: ...

    def peek(self, name: str, rate: Rate) -> Standing:
        """Where ``name`` stands now, spending nothing and asking no one."""

    def keep_only(self, names: set[str]) -> None:
        """After a reload: forget the suppliers it removed, and what the old rates decided."""

    def lines(self) -> int:
        """How many processes' lines share these turns (the fleet's live workers; else 1)."""


class LocalRates:
    """Every supplier's rate in this process (one process; no Redis)."""

    def __init__(self) -> None:
        self._meter = LocalMeter()

    def spend_now(self, name: str, rate: Rate) -> tuple[bool, Standing]:
        return self._meter.spend(name, rate, time.monotonic())

    async def spend(self, name: str, rate: Rate) -> tuple[bool, Standing]:
        return self._meter.spend(name, rate, time.monotonic())

    def peek(self, name: str, rate: Rate) -> Standing:
        return self._meter.peek(name, rate, time.monotonic())

    def keep_only(self, names: set[str]) -> None:
        self._meter.keep_only(names)

    def lines(self) -> int:
        return 1


class Turns:
    """Turns of each supplier's rate, and the attempts waiting for one, first come first served."""

    def __init__(self, meter: RateMeter) -> None:
        self._meter = meter
        self._lines: dict[str, list[int]] = {}
        """Tickets of the attempts waiting for each supplier's turn, oldest first."""
        self._tickets = itertools.count()

    def keep_only(self, names: set[str]) -> None:
        """After a reload: the meter forgets removed suppliers and the old rates' decisions."""
        self._meter.keep_only(names)

    def take_now(self, name: str, rate: Rate) -> bool:
        """A turn now, if one is free and nobody stands in line for one (a hedge): never waits."""
        if self._lines.get(name):
            return False
        found = self._meter.spend_now(name, rate)
        return found is not None and found[0]

    async def take(
        self,
        name: str,
        rate: Rate,
        deadline: float | MovingDeadline,
        needed: Callable[[float], float],
    ) -> tuple[bool, float | None]:
        """A turn of ``name``'s ``rate``, waited for while the attempt could still finish.

        ``needed(now)``: the time the attempt needs once sent; it must still
        fit before ``deadline`` (a shared call's moves) when the turn comes.
        Returns whether the turn was had, and how long was waited for it
        (``None``: had at once).
        """
        line = self._lines.get(name)
        if not line:
            # Far from the limit a turn is had without a round trip or a timer.
            found = self._meter.spend_now(name, rate)
            if found is not None and found[0]:
                return True, None
        since = time.monotonic()
        ticket = next(self._tickets)
        line = self._lines.setdefault(name, [])
        line.append(ticket)
        waited = False
        try:
            while True:
                ahead = line.index(ticket)
                now = time.monotonic()
                # A turn ``ahead`` places back is free now while the burst has
                # room for those ahead too. In the fleet every worker's line
                # takes turns of the same rate: counted as if each were as long
                # as this one, so that a turn that would come too late is
                # refused now, not at the end.
                places = ahead * self._meter.lines()
                wait = _turn_in(self._meter.peek(name, rate), places) if ahead else 0.0
                if not wait:
                    # A slow round trip to the fleet's meter must not eat the
                    # attempt's own time: past what is left, there is no turn.
                    try:
                        async with asyncio.timeout(max(0.0, deadline - now - needed(now))):
                            admitted, standing = await self._meter.spend(name, rate)
                    except TimeoutError:
                        return False, time.monotonic() - since
                    if admitted:
                        return True, (time.monotonic() - since) if waited else None
                    wait = _turn_in(standing, places)
                    now = time.monotonic()
                # At least a millisecond: a rate of a million a second must not
                # wake its line a thousand times while one round trip is out.
                wait = max(wait, 0.001)
                if deadline - now - wait < needed(now):
                    return False, now - since
                await asyncio.sleep(wait)
                waited = True
        finally:
            line.remove(ticket)
            if not line:
                del self._lines[name]


def _turn_in(standing: Standing, ahead: int) -> float:
    """Seconds until the turn of the attempt with ``ahead`` others before it in line."""
    return max(0.0, standing.used + ahead + 1 - standing.burst) * standing.interval
