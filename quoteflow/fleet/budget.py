"""The fleet's buckets: ``FleetRetryBudget`` and ``FleetHedgeBudget``, a worker's pool drawn
from one bucket per supplier in Redis."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

from quoteflow.retry import HedgeBudget, RetryBudget


class _LocalBucket(Protocol):
    """This process's own bucket, which decides while Redis is out of reach."""

    capacity: float
    tokens: float

    def try_spend(self) -> bool: ...

    def paid_off(self) -> None: ...


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
        self._retries = RetryBudget(capacity, earn_per_request)
        self.local: _LocalBucket = self._retries
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
        self._retries.first_attempt()
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


class FleetHedgeBudget(FleetRetryBudget):
    """One supplier's hedge bucket: a local pool drawn from the fleet's, as retries are.

    Satisfies ``retry.HedgeLimiter``. Its tokens are earned by successful
    attempts (``earned``), not per request; spending, paying back, the pool
    and the fallback while Redis is away are the retry budget's. A hedge is
    decided on this pool alone and never waits on Redis. In Redis the bucket
    rides each sync as an entry of its own, ``<supplier>#hedge``, which holds
    no slots (``coordinator.HEDGE_ENTRY``).
    """

    def __init__(
        self, burst_size: int, earn: float, *, burst: int, need_sync: Callable[[float], None]
    ) -> None:
        super().__init__(float(burst_size), earn, burst=burst, need_sync=need_sync)
        self._hedges = HedgeBudget(burst_size, earn)
        self.local = self._hedges

    @property
    def earn(self) -> float:
        """Tokens each successful attempt earns."""
        return self.earn_per_request

    def first_attempt(self) -> None:
        """Hedge tokens are not earned per request (see ``earned``)."""

    def earned(self) -> None:
        """A sent attempt brought a valid quote: ``earn`` tokens, in both books.

        In the fleet's they go to the bucket at the next sync, never straight
        into this worker's pool: the script adds them only while the bucket
        and every pool together hold less than one bucket, so workers earning
        at once cannot hold a pool each beyond it.
        """
        self._hedges.earned()
        if self.fleet:
            self._surplus += self.earn_per_request

    @property
    def held(self) -> float:
        """Hedges this worker holds now: its pool (its own bucket while Redis is away)."""
        return self.pool if self.fleet else self._hedges.tokens

    def re_earn(self, earn: float) -> None:
        """A reload's ``earn`` (the bucket's size, ``resize``, goes with the next sync)."""
        self.earn_per_request = self._hedges.earn = earn


def rehedge(
    budgets: dict[str, FleetHedgeBudget],
    hedges: Mapping[str, tuple[int, float]],
    burst: int,
    need_sync: Callable[[float], None],
) -> None:
    """``budgets`` made those of ``hedges`` (supplier → its bucket's size and ``earn``).

    A supplier no longer hedged loses its bucket (its entry leaves this worker's
    record at the next sync); one that stays keeps its pool, its new size sent
    with the next sync, as a retry bucket's is.
    """
    for supplier in [name for name in budgets if name not in hedges]:
        del budgets[supplier]
    for supplier, (size, earn) in hedges.items():
        found = budgets.get(supplier)
        if found is None:
            budgets[supplier] = FleetHedgeBudget(size, earn, burst=burst, need_sync=need_sync)
            continue
        found.re_earn(earn)
        if found.capacity != size:
            found.resize(float(size))
