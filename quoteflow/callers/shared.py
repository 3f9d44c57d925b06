"""A caller's rate for the whole fleet: one EVALSHA of ``quota.lua`` per admitted request.

Redis holds each caller's level (``meter``) under ``<prefix>:caller:<name>``;
the script drains it by Redis' own clock, admits or refuses, and writes only
when it admits. The client is the fleet coordinator's (``quoteflow.fleet``),
so fleet mode keeps one Redis connection pool per worker.

Round trips: one per admitted request, and none for a request refused while
the retry time Redis gave its caller has not passed — that refusal is
remembered here (``_retry_at``) and answered locally, so a caller in a retry
loop costs the fleet nothing.

Redis down, frozen or emptied: a call is bounded by ``redis_timeout``; past
it, or on any Redis error, this worker keeps to its own share of each rate —
``quota / live workers`` as the coordinator last counted them, drained as
slowly (never unlimited) — and the request is answered, never a 5xx. It
tries Redis again ``RECONNECT`` seconds later, and as soon as the coordinator
finds Redis again (``quoteflow_coordination_up`` back to 1). A Redis that
was emptied has forgotten every level: each caller starts with a full quota.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Final

from quoteflow.callers.meter import Bucket, LocalMeter, Standing
from quoteflow.callers.model import Rate
from quoteflow.logs import log_event

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("quoteflow")

SCRIPT: Final = resources.files(__package__).joinpath("quota.lua").read_text(encoding="utf-8")
RECONNECT: Final = 0.5
"""Seconds after a failed call before this worker asks Redis again."""


class SharedMeter:
    """Every caller's rate held in Redis for the fleet, with a local share as the fallback."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        timeout: float,
        workers: Callable[[], int],
        coordinated: Callable[[], bool],
    ) -> None:
        from redis.exceptions import RedisError

        self._script = redis.register_script(SCRIPT)
        self._prefix = prefix
        self._timeout = timeout
        self._workers = workers
        """Live workers the coordinator last saw (this one included)."""
        self._coordinated = coordinated
        """Whether the coordinator's last sync succeeded."""
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._retry_at: dict[str, float] = {}
        """Refused until then (``time.monotonic()``), by caller: answered without Redis."""
        self._last: dict[str, Bucket] = {}
        """Each caller's level as Redis last gave it, for answers that spend nothing."""
        self.fallback = LocalMeter()
        """This worker's share of each rate while Redis is out of reach."""
        self.down = False
        self._retry_redis_at = -math.inf
        self.calls = {"ok": 0, "failed": 0}

    async def spend(self, name: str, rate: Rate) -> tuple[bool, Standing]:
        """Admit one request of ``name`` for the fleet, or refuse it; where it stands after."""
        now = time.monotonic()
        retry_at = self._retry_at.get(name)
        if retry_at is not None:
            if now < retry_at:
                return False, _refused_until(rate, retry_at - now)
            del self._retry_at[name]
        if now < self._retry_redis_at or not self._coordinated():
            return self._spend_locally(name, rate, now)
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._script(
                    keys=[f"{self._prefix}:caller:{name}"],
                    args=[rate.quota, f"{rate.interval * 1000:.3f}"],
                )
            admitted, used = int(reply[0]) == 1, float(reply[1])
        except self._errors as exc:
            self.calls["failed"] += 1
            self._lost(f"{type(exc).__name__}: {exc}".strip())
            return self._spend_locally(name, rate, time.monotonic())
        self.calls["ok"] += 1
        if self.fallback.buckets:
            self.fallback.buckets.clear()  # the fleet's level counts again, not our share
        if self.down:
            self._found()
        at = time.monotonic()
        self._last[name] = Bucket(used, at)
        standing = Standing(rate, used, rate.quota, rate.interval)
        if not admitted:
            # Measured from the answer, not the question: never earlier than Redis said.
            self._retry_at[name] = at + standing.wait
        return admitted, standing

    def peek(self, name: str, rate: Rate) -> Standing:
        """Where ``name`` stands as this worker last heard, spending nothing (no round trip)."""
        now = time.monotonic()
        retry_at = self._retry_at.get(name)
        if retry_at is not None and now < retry_at:
            return _refused_until(rate, retry_at - now)
        if self.down or not self._coordinated():
            return self.fallback.peek(name, rate, now, self._share())
        last = self._last.get(name)
        used = 0.0 if last is None else last.level(now, rate.interval)
        return Standing(rate, used, rate.quota, rate.interval)

    def keep_only(self, names: set[str]) -> None:
        """Forget the callers a reload removed."""
        for table in (self._retry_at, self._last):
            for name in set(table) - names:
                del table[name]
        self.fallback.keep_only(names)

    def _share(self) -> int:
        return max(1, self._workers())

    def _spend_locally(self, name: str, rate: Rate, now: float) -> tuple[bool, Standing]:
        share = self._share()
        last = self._last.get(name)
        if name not in self.fallback.buckets and last is not None:
            # What the caller had used fleet-wide, this worker's part of it.
            self.fallback.buckets[name] = Bucket(last.level(now, rate.interval) / share, now)
        return self.fallback.spend(name, rate, now, share)

    def _lost(self, reason: str) -> None:
        self._retry_redis_at = time.monotonic() + RECONNECT
        if not self.down:
            self.down = True
            log_event(
                log,
                logging.WARNING,
                "quota_coordination_down",
                {"reason": reason, "fallback": "rate / live workers", "workers": self._share()},
            )

    def _found(self) -> None:
        self.down = False
        log_event(log, logging.INFO, "quota_coordination_up", {})


def _refused_until(rate: Rate, wait: float) -> Standing:
    """A refusal ``wait`` seconds before the next request may go: ``r=0``, Retry-After ≥ wait."""
    interval = rate.interval
    return Standing(rate, rate.quota - 1 + wait / interval, rate.quota, interval)
