"""A supplier's 429 with ``Retry-After``: the supplier paused for every request.

A supplier that answers ``429 Too Many Requests`` with ``Retry-After`` says
when it will take calls again. Sending before then only earns more 429s and
spends the supplier's patience with our key, so QuoteFlow stops asking it
until then — every request, not only the one that was told:

    429 + Retry-After: N     pause the supplier for N s (an HTTP-date: until
                             then), at most ``pause_max`` (60 s); meanwhile its
                             code is ``rate_limited`` at once, no attempt sent
    the pause ends           the attempts then waiting for a slot go (at most
                             the supplier's share: one wave), and the next 429
                             pauses it again
    429 without Retry-After  nothing: the code is ``http_429``, as always
    503 (+ Retry-After)      nothing: the retry rules of ``retry.py``

In fleet mode the pause is everyone's: the worker that was told publishes it
(``fleet.Coordinator.announce_pause``) and every other worker pauses the
supplier too. A worker that misses the message learns it from its own next
429. A pause is never the supplier's failure for its breaker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Final

from quoteflow.logs import log_event

log = logging.getLogger("quoteflow")

MARGIN: Final = 0.05
"""A pause that ends within this of one already set is the same pause: no new event
or message for each request of the wave that got the same 429."""


def pause_for(header: str | None, now_epoch: float) -> float | None:
    """Seconds a ``Retry-After`` value asks for: whole seconds or an HTTP-date; else ``None``."""
    if header is None:
        return None
    value = header.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None  # RFC 9110 dates are GMT; one without a zone is not one
    return max(0.0, when.timestamp() - now_epoch)


class Pauses:
    """Which suppliers are paused, until when (``time.monotonic()``); one per process."""

    def __init__(self, pause_max: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pause_max = pause_max
        self._clock = clock
        self.active: dict[str, float] = {}
        """When each paused supplier's pause ends; empty while none is (the common case)."""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.announce: Callable[[str, float], None] | None = None
        """Told of each new pause this process learned from a supplier (fleet mode)."""
        self.started: dict[str, int] = {}
        """Pauses begun, per supplier (running totals, for ``/metrics``)."""
        self.on_start: Callable[[str], None] | None = None
        """Told of each supplier's pause as it begins (``/metrics`` shows what is left of it)."""

    def until(self, supplier: str) -> float | None:
        """When ``supplier``'s pause ends, if it is paused now."""
        end = self.active.get(supplier)
        if end is None or end <= self._clock():
            return None
        return end

    def left(self, supplier: str) -> float:
        """Seconds of ``supplier``'s pause still to run (0: not paused)."""
        end = self.active.get(supplier)
        return 0.0 if end is None else max(0.0, end - self._clock())

    def pause(self, supplier: str, seconds: float, *, told_by: str = "supplier") -> None:
        """Pause ``supplier`` for ``seconds`` (capped); ``told_by``: the supplier, or the fleet."""
        seconds = min(seconds, self.pause_max)
        if seconds <= 0:
            return
        now = self._clock()
        end = now + seconds
        current = self.active.get(supplier)
        if current is not None and current > now and end <= current + MARGIN:
            return  # the same pause, told again by another attempt of the wave
        fresh = current is None or current <= now
        self.active[supplier] = end
        timer = self._timers.pop(supplier, None)
        if timer is not None:
            timer.cancel()
        self._timers[supplier] = asyncio.get_running_loop().call_later(
            seconds, self._ended, supplier
        )
        if fresh:
            self.started[supplier] = self.started.get(supplier, 0) + 1
            if self.on_start is not None:
                self.on_start(supplier)
            log_event(
                log,
                logging.WARNING,
                "supplier_paused",
                {"supplier": supplier, "seconds": round(seconds, 3), "told_by": told_by},
            )
        if told_by == "supplier" and self.announce is not None:
            self.announce(supplier, seconds)

    def forget(self, suppliers: tuple[str, ...]) -> None:
        """Drop removed suppliers' pauses (a reload)."""
        for supplier in suppliers:
            self.active.pop(supplier, None)
            timer = self._timers.pop(supplier, None)
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        """At shutdown: no timer outlives the app."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    def _ended(self, supplier: str) -> None:
        self._timers.pop(supplier, None)
        if self.active.pop(supplier, None) is not None:
            log_event(log, logging.INFO, "supplier_resumed", {"supplier": supplier})
