"""When is a second attempt worth sending? Three checks, all per supplier.

The lesson's rule — one retry, for 503 and transient transport errors — is
kept. These refine *whether* that retry is sent:

1. ``retry_after_delay``: a 503's own ``Retry-After`` is honoured, but only
   when waiting for it still leaves a useful attempt inside the budget.
2. ``AttemptTimeEstimate``: never start an attempt that cannot finish. The
   time a useful attempt needs is learned from the supplier's recent answers
   (smoothed mean plus four mean deviations, as TCP estimates its
   retransmission timeout, RFC 6298), never less than a configured floor.
3. ``RetryBudget``: retries are spent while they pay off. A retry costs one
   token and a retry that brings a quote gives it back, so a supplier whose
   retries keep working (a flaky one) is never throttled, while one that is
   down drains the bucket and is then retried only on the small trickle that
   every first attempt earns: its load falls from 2x towards 1.1x.
"""

from __future__ import annotations


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
    """How long a useful attempt at one supplier takes, learned from its answers."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self._mean: float | None = None
        self._deviation = 0.0

    def observe(self, seconds: float) -> None:
        """Record how long an attempt that got an answer took."""
        if self._mean is None:
            self._mean, self._deviation = seconds, seconds / 2
            return
        self._deviation += (abs(seconds - self._mean) - self._deviation) / 4
        self._mean += (seconds - self._mean) / 8

    @property
    def needed(self) -> float:
        """Seconds a new attempt should have left to be worth starting."""
        if self._mean is None:
            return self.floor
        return max(self.floor, self._mean + 4 * self._deviation)


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
