"""The fleet retry budget: ``FleetRetryBudget``, a worker's pool drawn from one bucket in Redis."""

from __future__ import annotations

import math
from collections.abc import Callable

from quoteflow.retry import RetryBudget


class FleetRetryBudget:
    """One supplier's retry budget: a local pool drawn from the fleet's bucket in Redis.

    Satisfies ``retry.RetryLimiter``; nothing here awaits. Spending and
    paying off touch only the pool. A pool below half its ``target`` asks the
    next sync (at once, while the bucket had tokens) to withdraw up to the
    target; what is earned or paid back above it is deposited at the next
    sync. While Redis is out of reach ``local``, a per-process
    ``RetryBudget`` holding this worker's safe share of the bucket, decides
    instead.

    The target is one burst of this worker: every request it serves at once
    may need its retry in the same millisecond (eight 503s together), before
    any sync could answer. Pools count against the bucket (see ``sync.lua``),
    so a larger pool never lets the fleet spend more than one bucket.
    """

    def __init__(
        self,
        capacity: float,
        earn_per_request: float,
        *,
        burst: int,
        need_sync: Callable[[float], None],
    ) -> None:
        self.capacity = capacity
        self.earn_per_request = earn_per_request
        self._burst = burst
        self.target = min(capacity, max(2.0, burst))
        self.local = RetryBudget(capacity, earn_per_request)
        self.fleet = False
        self.pool = 0.0
        """Tokens withdrawn from the fleet's bucket, ours to spend."""
        self.bucket = capacity
        """The fleet bucket's level at the last sync."""
        self._surplus = 0.0
        self._need_sync = need_sync

    def resize(self, capacity: float) -> None:
        """A reload's bucket size: sent with the next sync; the local bucket follows now."""
        self.capacity = capacity
        self.target = min(capacity, max(2.0, self._burst))
        self.local.capacity = min(self.local.capacity, capacity)
        self.local.tokens = min(self.local.tokens, self.local.capacity)
        self.pool = min(self.pool, capacity)
        self._need_sync(0.0)

    @property
    def tokens(self) -> float:
        """Retries this worker could still spend now (its pool and the bucket it last saw)."""
        return self.pool + self.bucket if self.fleet else self.local.tokens

    @property
    def wants_tokens(self) -> bool:
        """The pool is low and the bucket had tokens: worth a sync of its own."""
        return self.fleet and self.pool < self.target / 2 and self.bucket >= 1

    def first_attempt(self) -> None:
        """Every request earns a small share of a retry (in both books: see the class)."""
        self.local.first_attempt()
        if self.fleet:
            self._credit(self.earn_per_request)

    def try_spend(self) -> bool:
        """Take one retry from the pool (or, while Redis is away, from ``local``)."""
        if not self.fleet:
            return self.local.try_spend()
        if self.pool < 1:
            if self.bucket >= 1:
                self._need_sync(0.0)
            return False
        self.pool -= 1
        if self.pool < self.target / 2 and self.bucket >= 1:
            self._need_sync(0.0)
        return True

    def paid_off(self) -> None:
        """The retry brought a quote: its token comes back."""
        if self.fleet:
            self._credit(1.0)
        else:
            self.local.paid_off()

    def _credit(self, amount: float) -> None:
        self.pool += amount
        if self.pool > self.target:
            self._surplus += self.pool - self.target
            self.pool = self.target

    def report(self, leaving: bool) -> tuple[float, int, float]:
        """For the next sync: tokens to deposit (handed over now), to withdraw, and the pool."""
        deposit, self._surplus = self._surplus, 0.0
        if leaving:
            deposit, self.pool = deposit + self.pool, 0.0
            return deposit, 0, 0.0
        withdraw = math.ceil(self.target - self.pool) if self.pool < self.target / 2 else 0
        return deposit, withdraw, self.pool

    def apply(self, taken: int, level: float) -> None:
        """A sync's answer: the tokens withdrawn, and the bucket's level."""
        self.fleet = True
        self.pool += taken
        self.bucket = level

    def go_local(self, workers: int) -> None:
        """Redis is out of reach: ``local`` decides until it is back, with a safe share.

        The bucket's capacity divided by the live workers the last sync saw
        (all of it when none was seen yet), as the outbound limit is: the
        workers on their own together hold one bucket's worth, not one each.
        """
        self.fleet = False
        self.local.capacity = self.capacity / max(1, workers)
        self.local.tokens = min(self.local.tokens, self.local.capacity)
