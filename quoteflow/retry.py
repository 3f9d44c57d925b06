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
import itertools
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

    An attempt the deadline cut after running longer than that teaches
    something too: the supplier needs at least this long. Without it a
    supplier that slows down past its estimate could keep it for good —
    every waiter let in with too little time is cut, so no answer comes to
    learn from. Such lower bounds are ranked with the answers, and each
    holds until an answer comes sooner than it (the supplier is quick
    again: a hang's cut attempts must not refuse the retries of the flaky
    answers that follow it).
    """

    def __init__(self, floor: float, window: int = 20) -> None:
        self.floor = floor
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._percentile = floor
        """The 90th percentile (at least the floor) of the answers and cuts, when last ranked."""
        self._answers = floor
        """The same of the answers alone (``answer_time``)."""
        self._changed = False
        """An answer or a cut came since ``_percentile`` was ranked."""
        self._ranked_at = -math.inf
        self._cuts: collections.deque[float] = collections.deque(maxlen=window)
        """Lower bounds: attempts cut with no answer after running longer than ``needed``."""
        self.seen = False
        """Whether any attempt has answered or been cut: without that, nothing is known."""

    def observe(self, seconds: float, *, full: bool = True) -> None:
        """Record how long an attempt that got an answer took.

        ``full``: a 200 whose body was read. Only such an answer, quicker than
        a cut attempt, refutes that attempt's bound: a supplier whose errors
        stay quick while its quotes slowed down still needs the time.
        """
        self._recent.append(seconds)
        self._changed = self.seen = True
        if full and self._cuts and seconds < max(self._cuts):
            self._cuts = collections.deque(
                (cut for cut in self._cuts if cut <= seconds), maxlen=self._cuts.maxlen
            )

    def cut_after(self, seconds: float) -> None:
        """An attempt ran ``seconds`` and was cut with no answer: it needs at least that."""
        self._cuts.append(seconds)
        self._changed = self.seen = True
        self._ranked_at = -math.inf  # ranked at the next read, however soon: it matters now

    @property
    def needed(self) -> float:
        """Seconds a new attempt should have left to be worth starting."""
        if self._changed:
            self._rank(time.monotonic())
        return self._percentile

    def needed_at(self, now: float) -> float:
        """``needed``, the window ranked again at most every ``RANK_EVERY`` seconds.

        Read by every attempt that waits for a slot: under a saturating load
        that is most of them, and sorting the window for each was a visible
        part of a request's cost. ``now`` is ``time.monotonic()``.
        """
        if self._changed and now - self._ranked_at >= RANK_EVERY:
            self._rank(now)
        return self._percentile

    @property
    def longest(self) -> float:
        """The longest the supplier was recently seen to need (0 before anything was seen).

        What an attempt cut by the deadline is measured against before it
        counts against the supplier (``breaker.py``'s fair chance). Not the
        90th percentile: a supplier that slows down (0 ms, then 400 ms) keeps
        its fast answers in the window for a while, and blaming it for calls
        it was given less time than it now needs would eject a healthy supplier.
        """
        slowest = max(self._recent) if self._recent else 0.0
        return max(slowest, max(self._cuts) if self._cuts else 0.0)

    @property
    def answer_time(self) -> float:
        """The 90th percentile of the recent answers alone (at least the floor), cuts aside.

        What a retry needs: it follows an answer the supplier just gave. A
        hang's cut attempts, still ranked in ``needed``, must not refuse the
        retries of a flaky supplier that answers quickly now: its 503s never
        refute them, and without a retry no quote would come that does.
        """
        if self._changed:
            self._rank(time.monotonic())
        return self._answers

    def _rank(self, now: float) -> None:
        ranked = sorted(itertools.chain(self._recent, self._cuts))  # never empty once changed
        self._percentile = max(self.floor, ranked[int(0.9 * (len(ranked) - 1))])
        if self._cuts:
            answers = sorted(self._recent)
            self._answers = (
                max(self.floor, answers[int(0.9 * (len(answers) - 1))]) if answers else self.floor
            )
        else:
            self._answers = self._percentile
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
