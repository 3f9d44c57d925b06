"""How long each supplier's leased slots have stood idle: the clock of the ``LINGER`` rule.

A slot Redis leased this worker that no attempt of its own holds is *idle*. It
is kept a while for a taker of our own (one comes within a few ms under load,
between one request's attempt and the next one's) and goes back to the fleet
at the first sync after it has been idle for ``LINGER``. One clock per
supplier, started when one of its leases goes idle and stopped when none is.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from quoteflow.fleet.timing import IDLE_SLACK, LINGER


class IdleClock:
    """Per supplier, since when (monotonic) a leased slot has stood idle, if one has."""

    def __init__(self, suppliers: Iterable[str]) -> None:
        self._since: dict[str, float | None] = dict.fromkeys(suppliers)

    def add_supplier(self, supplier: str) -> None:
        """A supplier new to this worker: nothing leased, nothing idle."""
        self._since[supplier] = None

    def drop_supplier(self, supplier: str) -> None:
        """A supplier a reload removed."""
        self._since.pop(supplier, None)

    def update(self, supplier: str, held: int, leased: int) -> None:
        """Start ``supplier``'s clock if a lease stands idle now, or stop it if none does."""
        if held >= leased:
            self._since[supplier] = None
        elif self._since[supplier] is None:
            self._since[supplier] = time.monotonic()

    def taken(self, supplier: str, held: int, leased: int) -> None:
        """A slot was taken: the clock stops once no lease of ``supplier`` stands idle."""
        if held >= leased:
            self._since[supplier] = None

    def idle_long(self, supplier: str, now: float) -> bool:
        """Whether a leased slot of ``supplier`` has been idle for ``LINGER``."""
        since = self._since[supplier]
        return since is not None and now - since >= LINGER - IDLE_SLACK

    def linger_left(self) -> float:
        """Seconds until the oldest idle slot has been idle for ``LINGER`` (inf: none is)."""
        since = [at for at in self._since.values() if at is not None]
        if not since:
            return math.inf
        return max(0.0, min(since) + LINGER - time.monotonic())
