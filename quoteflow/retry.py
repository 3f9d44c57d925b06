"""When is a second attempt worth sending? Three checks, all per supplier.

The lesson's rule — one retry, for 503 and transient transport errors — is
kept. These refine *whether* that retry is sent:

1. ``retry_after_delay``: a 503's own ``Retry-After`` is honoured, but only
   when waiting for it still leaves a useful attempt inside the budget.
2. ``AttemptTimeEstimate``: never start an attempt that cannot finish. The
   time a useful attempt needs is learned from the supplier's recent answers
   (a high percentile of the last few), never less than a configured floor.
3. ``RetryBudget``: retries are spent while they pay off. A retry costs one
   token and a retry that brings a quote gives it back, so a supplier whose
   retries keep working (a flaky one) is never throttled, while one that is
   down drains the bucket and is then retried only on the small trickle that
   every first attempt earns: its load falls from 2x towards 1.1x.

``RetryLimiter`` is the seam for 3: ``RetryBudget`` is one process's bucket;
``fleet.FleetRetryBudget`` shares one bucket per supplier among every worker.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Final, Protocol

RANK_EVERY: Final = 0.02
"""Seconds an attempt waiting for a slot may read a learned time that is not re-ranked."""


class RetryLimiter(Protocol):
    """One supplier's retry budget, as the supplier client uses it (never awaits)."""

    @property
    def tokens(self) -> float:
        """Retries that may still be spent now."""
        ...

    def first_attempt(self) -> None:
        """A request to the supplier earns a small share of a retry."""
        ...

    def try_spend(self) -> bool:
        """Take one retry if there is one."""
        ...

    def paid_off(self) -> None:
        """The retry brought a quote: its token comes back."""
        ...


def retry_after_delay(value: str | None) -> float | None:
    """Seconds asked for by a ``Retry-After: <seconds>`` header, or None.

    An HTTP-date, a negative or a malformed value is ignored (None): the
    supplier's hint is advice, and a hint we cannot read is no hint.
    """
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit():
        return None
    return float(value)


class AttemptTimeEstimate:
    """How long a useful attempt at one supplier takes, learned from its answers.

    The 90th percentile of the last 20 answer times: it follows a supplier
    that slows down within a few answers, and one outlier (a single slow
    answer among fast ones) does not refuse retries that would easily finish.
    """

    def __init__(self, floor: float, window: int = 20) -> None:
        self.floor = floor
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._needed = floor
        self._changed = False
        """An answer came since ``_needed`` was ranked."""
        self._ranked_at = -math.inf
        self.seen = False
        """Whether any attempt has answered yet: without that, nothing is known of its time."""

    def observe(self, seconds: float) -> None:
        """Record how long an attempt that got an answer took."""
        self._recent.append(seconds)
        self._changed = self.seen = True

    @property
    def needed(self) -> float:
        """Seconds a new attempt should have left to be worth starting."""
        if self._changed:
            self._rank(time.monotonic())
        return self._needed

    def needed_at(self, now: float) -> float:
        """``needed``, ranked again at most every ``RANK_EVERY`` seconds.

        Read by every attempt that waits for a slot: under a saturating load
        that is most of them, and sorting the window for each was a visible
        part of a request's cost. ``now`` is ``time.monotonic()``.
        """
        if self._changed and now - self._ranked_at >= RANK_EVERY:
            self._rank(now)
        return self._needed

    def _rank(self, now: float) -> None:
        ranked = sorted(self._recent)
        self._needed = max(self.floor, ranked[int(0.9 * (len(ranked) - 1))])
        self._changed = False
        self._ranked_at = now


class RetryBudget:
    """A per-supplier token bucket of retries that refills when retries pay off."""

    def __init__(self, capacity: float, earn_per_request: float) -> None:
        self.capacity = capacity
        self.earn_per_request = earn_per_request
        self.tokens = capacity

    def first_attempt(self) -> None:
        """Every request to the supplier earns a small share of a retry."""
        self.tokens = min(self.capacity, self.tokens + self.earn_per_request)

    def try_spend(self) -> bool:
        """Take one retry if the bucket holds one."""
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def paid_off(self) -> None:
        """The retry brought a quote: its token comes back."""
        self.tokens = min(self.capacity, self.tokens + 1)
