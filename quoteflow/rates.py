"""A supplier's outbound rate: ``rate = "N/Ws"`` in its catalogue entry.

The callers' meter, turned round: the same syntax and GCRA semantics (a
burst of the whole quota, then one every ``W / N`` s), counting every attempt
sent to the supplier, retries included. In one process it is ``LocalRates``;
in fleet mode the callers' ``SharedMeter`` (``kind="supplier"``) holds it in
Redis for every worker, leased where far from the limit, and keeps each
worker to ``rate / live workers`` while Redis is out of reach.

An attempt the rate refuses waits for its turn only while the deadline still
leaves the supplier its learned attempt time (``supplier.py``), holding no
outbound slot while it waits; otherwise it is not sent: ``rate_limited``.
"""

from __future__ import annotations

import time
from typing import Protocol

from quoteflow.callers import LocalMeter, Rate, Standing


class RateMeter(Protocol):
    """Admits one attempt at ``name``'s rate, or says how long until the next one may go."""

    def spend_now(self, name: str, rate: Rate) -> tuple[bool, Standing] | None:
        """The answer if it needs no round trip (a lease, this process's meter), else ``None``."""

    async def spend(self, name: str, rate: Rate) -> tuple[bool, Standing]: ...


class LocalRates:
    """Every supplier's rate in this process (one process; no Redis)."""

    def __init__(self) -> None:
        self._meter = LocalMeter()

    def spend_now(self, name: str, rate: Rate) -> tuple[bool, Standing]:
        return self._meter.spend(name, rate, time.monotonic())

    async def spend(self, name: str, rate: Rate) -> tuple[bool, Standing]:
        return self._meter.spend(name, rate, time.monotonic())
