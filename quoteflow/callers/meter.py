"""A caller's rate in one process: GCRA, kept as the level of a leaky bucket.

The Generic Cell Rate Algorithm with a burst of the whole quota. A caller's
state is one number and when it was true: ``used``, the requests it has
used, draining at ``quota / window`` per second. A request is admitted when
``used + 1 <= burst`` after the drain, and then adds 1; a refused request
changes nothing. So a caller that was idle for a window may send its whole
quota at once, and from then on one request per ``window / quota`` seconds.

Why GCRA and not a token bucket with a refill timer: it is the same limit
(a token bucket of ``burst`` tokens refilled at the rate, mirrored), but the
state is one value updated only when a request comes — one field in Redis,
written only when a request is admitted (``quota.lua``), no timer, nothing to
do for an idle caller. Why the level (``used``) and not GCRA's theoretical
arrival time: a level is counted in requests, so when a reload changes a
caller's rate, what it has used stays used and drains at the new rate.

``Standing`` turns a level into the RateLimit fields: ``r`` (requests
available now), ``t`` (seconds until one more is: within them the caller
can use no more than ``r``) and, when refused, ``Retry-After``.
"""

from __future__ import annotations

import math

import attrs

from quoteflow.callers.model import Rate


@attrs.frozen
class Standing:
    """Where a caller stands against its rate: enough for both RateLimit fields."""

    rate: Rate
    """The caller's policy, as ``RateLimit-Policy`` advertises it."""
    used: float
    """Requests used, after this one if it was admitted."""
    burst: float
    """Most requests that may be used at once (the quota, or this worker's share of it)."""
    interval: float
    """Seconds for one used request to drain back."""

    @property
    def remaining(self) -> int:
        """``r``: requests the caller may send now."""
        return max(0, math.floor(self.burst - self.used))

    @property
    def wait(self) -> float:
        """Seconds until one more request than ``remaining`` is available."""
        return max(0.0, (self.used - (self.burst - self.remaining - 1)) * self.interval)

    @property
    def retry_after(self) -> int:
        """Whole seconds until the next request may be admitted, rounded up, at least 1."""
        return max(1, math.ceil(self.wait))

    def fields(self, name: str) -> tuple[str, str]:
        """``RateLimit-Policy`` and ``RateLimit`` (draft-ietf-httpapi-ratelimit-headers-11)."""
        rate = self.rate
        # t rounds up like Retry-After, so that a 429's Retry-After is never before t ends.
        return (
            f'"{name}";q={rate.quota};w={rate.window}',
            f'"{name}";r={self.remaining};t={math.ceil(self.wait)}',
        )


class Bucket:
    """One caller's level: ``used`` requests as of ``at`` (``time.monotonic()``)."""

    __slots__ = ("at", "used")

    def __init__(self, used: float = 0.0, at: float = 0.0) -> None:
        self.used = used
        self.at = at

    def level(self, now: float, interval: float) -> float:
        """Requests used as of ``now``: what was used, less what has drained since."""
        return max(0.0, self.used - (now - self.at) / interval)

    def take(self, now: float, burst: float, interval: float) -> bool:
        """Admit one request if it fits under ``burst``; a refusal changes nothing."""
        used = self.level(now, interval)
        if used + 1 > burst:
            return False
        self.used, self.at = used + 1, now
        return True


class LocalMeter:
    """Every caller's bucket in this process, by caller name (kept across a reload).

    ``share``: this process keeps to 1/share of each rate (the fleet's fallback
    while Redis is out of reach): the rate drains ``share`` times slower, and
    the burst is ``quota / share`` (at least one request).
    """

    def __init__(self) -> None:
        self.buckets: dict[str, Bucket] = {}

    def spend(self, name: str, rate: Rate, now: float, share: int = 1) -> tuple[bool, Standing]:
        """Admit one request of ``name`` at ``rate`` or refuse it; where it stands after."""
        bucket = self.buckets.get(name)
        if bucket is None:
            bucket = self.buckets[name] = Bucket(0.0, now)
        burst, interval = _scaled(rate, share)
        admitted = bucket.take(now, burst, interval)
        used = bucket.used if admitted else bucket.level(now, interval)
        return admitted, Standing(rate, used, burst, interval)

    def peek(self, name: str, rate: Rate, now: float, share: int = 1) -> Standing:
        """Where ``name`` stands now, spending nothing."""
        burst, interval = _scaled(rate, share)
        bucket = self.buckets.get(name)
        used = 0.0 if bucket is None else bucket.level(now, interval)
        return Standing(rate, used, burst, interval)

    def keep_only(self, names: set[str]) -> None:
        """Forget the callers a reload removed."""
        for name in set(self.buckets) - names:
            del self.buckets[name]


def _scaled(rate: Rate, share: int) -> tuple[float, float]:
    """Burst and drain interval of ``1/share`` of ``rate``."""
    if share == 1:
        return float(rate.quota), rate.interval
    return max(1.0, rate.quota / share), rate.interval * share
