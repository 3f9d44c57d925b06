"""A caller's rate for the whole fleet: at most one EVALSHA of ``quota.lua`` per admission.

Redis holds each caller's level (``meter``) under ``<prefix>:caller:<name>``;
the script drains it by Redis' own clock, admits or refuses, and writes only
when it admits. The client is the fleet coordinator's (``quoteflow.fleet``),
so fleet mode keeps one Redis connection pool per worker.

Round trips: at most one per admitted request, and none for a request refused
while the retry time Redis gave its caller has not passed — that refusal is
remembered here (``_retry_at``) and answered locally, so a caller in a retry
loop costs the fleet nothing.

**Leases.** A round trip costs about as much CPU as a third of a whole
answered request (measured: ~150 µs in the worker, ~50 µs in Redis), so far
from its quota a caller's requests are granted a few at a time: the script
counts them all at once and this worker admits the rest locally (``Lease``).
A lease is at most an eighth of what is free divided among the live workers
(and at most ``MAX_LEASE``), so close to the quota (and always for a small
one: 20/60s on two workers) requests are granted one by one, and the quota
holds exactly.

What a lease costs: its requests are counted in Redis before they are sent.
Counted early never lets the fleet send more than the quota while Redis'
level is above zero (it drained them no sooner than they came); the only
slack is the drain Redis credited them while its level sat at zero: at most
the leases' requests, and at most the rate times how long a lease lasts.
``lease_time`` keeps that to 1 % of the quota either way: a lease no bigger
than a hundredth of the quota (divided among the workers) may last
``MAX_LEASE_TIME``, a bigger one a hundredth of the window at most. So a
window admits at most 1 % of the quota more, ordinarily not one request.
Requests of a lease whose worker's traffic stops are counted but never sent:
the caller may get up to that many fewer (at most an eighth of what was
free, divided among the workers) until they drain.

Redis down, frozen or emptied: a call is bounded by ``redis_timeout`` of
Redis' time (``deadline``: the fleet's ``LoopFairTimeout``, so a reply read
late by this worker's busy loop is not a failure); past it, or on any Redis
error, this worker keeps to its own share of each rate — ``quota / live
workers`` as the coordinator last counted them, drained as slowly (never
unlimited) — and the request is answered, never a 5xx. It
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
from types import TracebackType
from typing import TYPE_CHECKING, Final, Protocol

from quoteflow.callers.meter import Bucket, LocalMeter, Standing
from quoteflow.callers.model import Rate
from quoteflow.logs import log_event

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("quoteflow")

SCRIPT: Final = resources.files(__package__).joinpath("quota.lua").read_text(encoding="utf-8")
RECONNECT: Final = 0.5
"""Seconds after a failed call before this worker asks Redis again."""
MAX_LEASE: Final = 32
"""Most requests of one caller Redis grants one worker in one round trip."""
MAX_LEASE_TIME: Final = 2.0
"""Longest a lease lasts, seconds; unused by then, its requests are lost, never reused."""


def lease_time(rate: Rate, units: int, workers: int) -> float:
    """Seconds a lease of ``units`` requests of ``rate`` lasts (the module's docstring).

    The slack a lease can give is the smaller of its requests and what the
    rate drains while it lasts; either is kept to a hundredth of the quota.
    A high rate's lease of a few requests lasts ``MAX_LEASE_TIME``, so one
    round trip serves a whole lease; a lease too big for that, a hundredth of
    the window, at most ``MAX_LEASE_TIME``.
    """
    if units * 100 * workers <= rate.quota:
        return MAX_LEASE_TIME
    return min(MAX_LEASE_TIME, rate.window / 100)


class Deadline(Protocol):
    """The time limit of one call (``fleet.LoopFairTimeout``): ``TimeoutError`` past it."""

    loop_was_late: bool
    """The limit came while this worker's loop was busy, and was put off."""

    async def __aenter__(self) -> object: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Lease:
    """Requests of one caller Redis has counted and granted this worker, usable until ``until``."""

    __slots__ = ("units", "until")

    def __init__(self, units: int, until: float) -> None:
        self.units = units
        self.until = until


class SharedMeter:
    """Every caller's rate held in Redis for the fleet, with a local share as the fallback."""

    def __init__(
        self,
        redis: Redis,
        *,
        prefix: str,
        deadline: Callable[[], Deadline],
        workers: Callable[[], int],
        coordinated: Callable[[], bool],
        kind: str = "caller",
    ) -> None:
        """``kind``: what the names are, in the Redis keys (``caller``, ``supplier``).

        A supplier's rate is a promise to the supplier, a caller's one to
        ourselves: a supplier's is spent on this worker's own share only
        while Redis is out for the fleet as this worker can tell it (its own
        round trip failed and the coordinator's sync too). One round trip
        lost while the coordinator still reaches Redis is most likely this
        worker's loop being slow, with the other workers spending the whole
        rate through Redis meanwhile: spending a share beside them would send
        the supplier more than its rate, so the attempt is refused for now
        (its turn is waited for again) and the next one asks Redis.
        """
        self._strict = kind == "supplier"
        from redis.exceptions import RedisError

        self._script = redis.register_script(SCRIPT)
        self._prefix = f"{prefix}:{kind}"
        self._switched = f"{prefix}:switched"
        """Set by the fleet's sync when it found itself on another server (``quota.lua``)."""
        self._deadline = deadline
        """A new time limit for each call: ``--redis-timeout`` of Redis' time, not the loop's."""
        self._workers = workers
        """Live workers the coordinator last saw (this one included)."""
        self._coordinated = coordinated
        """Whether the coordinator's last sync succeeded."""
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)
        self._retry_at: dict[str, float] = {}
        """Refused until then (``time.monotonic()``), by caller: answered without Redis."""
        self._last: dict[str, Bucket] = {}
        """Each caller's level as Redis last gave it, for answers that spend nothing."""
        self._leases: dict[str, Lease] = {}
        """Requests Redis granted this worker ahead of time, by caller."""
        self._asking: dict[str, asyncio.Event] = {}
        """The round trip others wait for, by caller, set once its answer is recorded."""
        self.fallback = LocalMeter()
        """This worker's share of each rate while Redis is out of reach."""
        self.down = False
        self._retry_redis_at = -math.inf
        self.calls = {"ok": 0, "late_loop": 0, "failed": 0}

    def spend_now(self, name: str, rate: Rate) -> tuple[bool, Standing] | None:
        """Admit or refuse ``name`` without a round trip, if this worker can; ``None``: ask Redis.

        It can from a lease, a refusal Redis already gave, or its own share
        while Redis is out of reach: the common case far from the quota.
        """
        now = time.monotonic()
        retry_at = self._retry_at.get(name)
        if retry_at is not None:
            if now < retry_at:
                return False, _refused_until(rate, retry_at - now)
            del self._retry_at[name]
        lease = self._leases.get(name)
        if lease is not None:
            if lease.units and now < lease.until:
                lease.units -= 1
                return True, self._standing(name, rate, now)
            del self._leases[name]
        if self._on_own_share(now):
            return self._spend_locally(name, rate, now)
        return None

    def _on_own_share(self, now: float) -> bool:
        """Whether a request is admitted from this worker's own share, without Redis."""
        if self._strict:
            return now < self._retry_redis_at and not self._coordinated()
        return now < self._retry_redis_at or not self._coordinated()

    async def spend(self, name: str, rate: Rate) -> tuple[bool, Standing]:
        """Admit one request of ``name`` for the fleet, or refuse it; where it stands after.

        A request that finds a round trip of its name in flight waits for it
        once: what it brings back (a lease, or a refusal until a time) may
        answer this one without a round trip of its own. Without that,
        requests woken together for the same turn would each ask Redis and
        all but one be refused. Once only: after it, a request that still
        needs Redis asks for itself, at once, as before, so concurrent
        requests never queue behind one another's round trips.
        """
        found = self.spend_now(name, rate)
        if found is not None:
            return found
        asking = self._asking.get(name)
        if asking is not None:
            await asking.wait()
            found = self.spend_now(name, rate)
            if found is not None:
                return found
        # Concurrent requests of one name must not each take a lease sized
        # for one worker: only the one others wait for asks for more than itself.
        first = name not in self._asking
        asked = asyncio.Event()
        if first:
            self._asking[name] = asked
        try:
            want = self._lease_size(name, rate, time.monotonic()) if first else 1
            # The time limit is Redis': a reply that came in time but was read late
            # because this loop was busy is not a Redis failure (fleet.deadline).
            deadline = self._deadline()
            async with deadline:
                reply = await self._script(
                    keys=[f"{self._prefix}:{name}", self._switched],
                    args=[rate.quota, f"{rate.interval * 1000:.3f}", want],
                )
            granted, used = int(reply[0]), float(reply[1])
        except self._errors as exc:
            self.calls["failed"] += 1
            self._lost(f"{type(exc).__name__}: {exc}".strip())
            now = time.monotonic()
            if self._strict and self._coordinated():
                return False, _refused_until(rate, rate.interval / rate.quota)
            return self._spend_locally(name, rate, now)
        else:
            return self._heard(name, rate, granted, used, late=deadline.loop_was_late)
        finally:
            # After what it brought back is recorded, so the requests woken find it.
            if first:
                del self._asking[name]
                asked.set()

    def _heard(
        self, name: str, rate: Rate, granted: int, used: float, *, late: bool
    ) -> tuple[bool, Standing]:
        """Record Redis' answer: the fleet's level, a lease, or a refusal until a time."""
        self.calls["late_loop" if late else "ok"] += 1
        if self.fallback.buckets:
            self.fallback.buckets.clear()  # the fleet's level counts again, not our share
        if self.down:
            self._found()
        at = time.monotonic()
        self._last[name] = Bucket(used, at)
        if granted > 1:
            self._leases[name] = Lease(granted - 1, at + lease_time(rate, granted, self._share()))
        standing = self._standing(name, rate, at)
        if not granted:
            # Measured from the answer, not the question: never earlier than Redis said.
            self._retry_at[name] = at + standing.wait
        return granted > 0, standing

    def void_leases(self) -> None:
        """The fleet moved to another server: requests leased from the old one are not ours.

        The new server counts every rate as spent at the switch (``quota.lua``);
        a lease granted before it would come on top.
        """
        self._leases.clear()
        self._retry_at.clear()

    def peek(self, name: str, rate: Rate) -> Standing:
        """Where ``name`` stands as this worker last heard, spending nothing (no round trip)."""
        now = time.monotonic()
        retry_at = self._retry_at.get(name)
        if retry_at is not None and now < retry_at:
            return _refused_until(rate, retry_at - now)
        if self.down or not self._coordinated():
            return self.fallback.peek(name, rate, now, self._share())
        return self._standing(name, rate, now)

    def lines(self) -> int:
        """Workers taking turns of the same rates: the live ones, or 1 on this one's own share."""
        if self.down or not self._coordinated():
            return 1
        return self._share()

    def keep_only(self, names: set[str]) -> None:
        """Forget the names a reload removed; give up every lease and every refusal.

        A rate may have changed: a lease was sized, and a refusal timed, by
        the old one (raised from 1/60s to 60/1s, a refusal kept would hold
        for up to a minute). The level as last heard stays; it drains at the
        new rate, as Redis' does.
        """
        for name in set(self._last) - names:
            del self._last[name]
        self._retry_at.clear()
        self._leases.clear()
        self.fallback.keep_only(names)

    def _standing(self, name: str, rate: Rate, now: float) -> Standing:
        """Where ``name`` stands fleet-wide as last heard: what Redis counts, less our lease."""
        last = self._last.get(name)
        used = 0.0 if last is None else last.level(now, rate.interval)
        lease = self._leases.get(name)
        if lease is not None and now < lease.until:
            used = max(0.0, used - lease.units)  # granted to us, not yet sent by the caller
        return Standing(rate, used, rate.quota, rate.interval)

    def _lease_size(self, name: str, rate: Rate, now: float) -> int:
        """Requests to ask Redis for at once: 1 near the quota, more only far from it.

        At most an eighth of what is free, divided among the live workers, so
        that what one worker holds can never starve another: a caller of
        20/60s on two workers is always asked for one at a time, exactly.
        """
        last = self._last.get(name)
        if last is None:
            return 1
        free = rate.quota - last.level(now, rate.interval)
        return max(1, min(MAX_LEASE, math.floor(free / (8 * self._share()))))

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
