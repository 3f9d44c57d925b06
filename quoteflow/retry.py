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

A fourth object serves the hedge (issue 38): ``AnswerTimes`` keeps a
supplier's recent answer times for a live percentile, the delay after which
a late first attempt is joined by the second attempt the contract allows.

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

CUT_MEMORY: Final = 4
"""Budgets a cut attempt's lower bound is held (``AttemptTimeEstimate``)."""


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
    learn from. Such lower bounds are ranked with the answers, but a cut says
    "at least", never "always", so each is held narrowly and briefly:

    - per *kind* of request (the scenario asked for): a request the lab
      makes slow teaches nothing about the ordinary ones beside it;
    - until an answer of that kind comes sooner than it (the supplier is
      quick again: a hang's cut attempts must not refuse the retries of the
      flaky answers that follow it);
    - for ``memory`` seconds at most (``CUT_MEMORY`` budgets). A bound that keeps every call waiting
      for a slot would otherwise never be refuted, since no call is sent to
      refute it. While the supplier stays slow, new cuts renew it; once it
      is quick again the bound lapses by itself and calls are sent again.
    """

    def __init__(self, floor: float, memory: float, window: int = 20) -> None:
        self.floor = floor
        self.memory = memory
        self._window = window
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._answers = floor
        """The 90th percentile of the answers (at least the floor), when last ranked."""
        self._with_cuts: dict[str, float] = {}
        """The same of the answers and each kind's live cuts, for each kind that has any."""
        self._changed = False
        """An answer or a cut came (or a cut lapsed) since the last ranking."""
        self._ranked_at = -math.inf
        self._cuts: dict[str, collections.deque[tuple[float, float]]] = {}
        """Lower bounds per kind: (when, seconds) of attempts cut with no answer."""
        self._lapse_at = math.inf
        """``time.monotonic()`` at which the oldest cut lapses."""
        self.seen = False
        """Whether any attempt has answered or been cut: without that, nothing is known."""

    def observe(self, seconds: float, *, full: bool = True, kind: str = "") -> None:
        """Record how long an attempt that got an answer took.

        ``full``: a 200 whose body was read. Only such an answer, quicker than
        a cut attempt of its kind, refutes that attempt's bound: a supplier
        whose errors stay quick while its quotes slowed down still needs the time.
        """
        self._recent.append(seconds)
        self._changed = self.seen = True
        cuts = self._cuts.get(kind)
        if full and cuts and seconds < max(ran for _, ran in cuts):
            kept = [(at, ran) for at, ran in cuts if ran <= seconds]
            if kept:
                self._cuts[kind] = collections.deque(kept, maxlen=self._window)
            else:
                del self._cuts[kind]

    def cut_after(self, seconds: float, kind: str = "") -> None:
        """An attempt ran ``seconds`` and was cut with no answer: it needs at least that."""
        now = time.monotonic()
        cuts = self._cuts.get(kind)
        if cuts is None:
            cuts = self._cuts[kind] = collections.deque(maxlen=self._window)
        cuts.append((now, seconds))
        self._lapse_at = min(self._lapse_at, now + self.memory)
        self._changed = self.seen = True
        self._ranked_at = -math.inf  # ranked at the next read, however soon: it matters now

    @property
    def needed(self) -> float:
        """Seconds a new attempt of the ordinary kind should have left to be worth starting."""
        return self.needed_for("")

    def needed_for(self, kind: str) -> float:
        """Seconds a new attempt of ``kind`` should have left to be worth starting."""
        now = time.monotonic()
        if self._changed or now >= self._lapse_at:
            self._rank(now)
        return self._with_cuts.get(kind, self._answers)

    def needed_at(self, now: float, kind: str = "") -> float:
        """``needed_for(kind)``, the window ranked again at most every ``RANK_EVERY`` seconds.

        Read by every attempt that waits for a slot: under a saturating load
        that is most of them, and sorting the window for each was a visible
        part of a request's cost. ``now`` is ``time.monotonic()``.
        """
        if (self._changed or now >= self._lapse_at) and now - self._ranked_at >= RANK_EVERY:
            self._rank(now)
        if self._with_cuts:
            return self._with_cuts.get(kind, self._answers)
        return self._answers

    def longest(self, kind: str = "") -> float:
        """The longest ``kind`` was recently seen to need (0 before anything was seen).

        What an attempt cut by the deadline is measured against before it
        counts against the supplier (``breaker.py``'s fair chance). Not the
        90th percentile: a supplier that slows down (0 ms, then 400 ms) keeps
        its fast answers in the window for a while, and blaming it for calls
        it was given less time than it now needs would eject a healthy supplier.
        """
        slowest = max(self._recent) if self._recent else 0.0
        cuts = self._cuts.get(kind)
        return max(slowest, max(ran for _, ran in cuts) if cuts else 0.0)

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
        if now >= self._lapse_at:
            self._forget_lapsed(now)
        answers = sorted(self._recent)
        self._answers = (
            max(self.floor, answers[int(0.9 * (len(answers) - 1))]) if answers else self.floor
        )
        self._with_cuts = {}
        for kind, cuts in self._cuts.items():
            ranked = sorted(itertools.chain(answers, (ran for _, ran in cuts)))
            self._with_cuts[kind] = max(self.floor, ranked[int(0.9 * (len(ranked) - 1))])
        self._changed = False
        self._ranked_at = now

    def _forget_lapsed(self, now: float) -> None:
        oldest = now - self.memory
        lapse_at = math.inf
        for kind in list(self._cuts):
            live = [(at, ran) for at, ran in self._cuts[kind] if at > oldest]
            if live:
                self._cuts[kind] = collections.deque(live, maxlen=self._window)
                lapse_at = min(lapse_at, live[0][0] + self.memory)
            else:
                del self._cuts[kind]
        self._lapse_at = lapse_at


class TokenBucket:
    """Tokens up to ``capacity``, full at start: one taken per extra attempt, one given back
    when that attempt brought the quote. What refills it is the subclass's rule."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.tokens = capacity

    def try_spend(self) -> bool:
        """Take one token if the bucket holds one."""
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def paid_off(self) -> None:
        """The extra attempt brought a quote: its token comes back."""
        self.tokens = min(self.capacity, self.tokens + 1)


class RetryBudget(TokenBucket):
    """A per-supplier token bucket of retries that refills when retries pay off."""

    def __init__(self, capacity: float, earn_per_request: float) -> None:
        super().__init__(capacity)
        self.earn_per_request = earn_per_request

    def first_attempt(self) -> None:
        """Every request to the supplier earns a small share of a retry."""
        self.tokens = min(self.capacity, self.tokens + self.earn_per_request)


class HedgeLimiter(Protocol):
    """One supplier's hedge budget, as the hedging decision uses it (never awaits)."""

    @property
    def tokens(self) -> float:
        """Hedges that may still be sent now."""
        ...

    @property
    def held(self) -> float:
        """Hedges this process holds itself (in the fleet, its pool): what its gauge shows."""
        ...

    def earned(self) -> None:
        """An attempt sent to the supplier brought a valid quote: a share of a hedge."""
        ...

    def try_spend(self) -> bool:
        """Take one hedge if there is one."""
        ...

    def paid_off(self) -> None:
        """The hedge won: its token comes back."""
        ...


class HedgeBudget(TokenBucket):
    """A per-supplier token bucket of hedges, earned by the supplier's successes.

    Retries and hedges protect different things: a retry answers a failure and
    must stop when a supplier fails; a hedge answers slowness, and its cost is
    a bounded share of extra load. So a hedge has a bucket of its own (as
    Cloud Pub/Sub's publisher does): one token per hedge, ``earn`` tokens for
    each attempt actually sent that brought a valid quote, at most ``burst``,
    full at start. A supplier that fails, hangs or times out earns nothing,
    and its hedges stop once the bucket is spent.
    """

    def __init__(self, burst: int, earn: float) -> None:
        super().__init__(float(burst))
        self.earn = earn

    @property
    def held(self) -> float:
        """Hedges this process holds: all of its bucket."""
        return self.tokens

    def earned(self) -> None:
        """A sent attempt brought a valid quote: ``earn`` more, up to the burst."""
        self.tokens = min(self.capacity, self.tokens + self.earn)


HEDGE_FLOOR: Final = 0.020
"""The least hedge delay: sooner, a hedge would double calls that were never late."""
HEDGE_SEEN: Final = 10
"""Answers seen before a percentile's hedge delay is trusted; until then no hedge."""
HEDGE_TAIL: Final = 0.01
"""A percentile's hedge goes only for a supplier whose calls run past the time the first
attempt has this often at least: one whose slowest answers fit anyway gains only load."""
HEDGE_WINDOW: Final = 100
"""Recent answer times the estimate is taken over."""


class AnswerTimes:
    """A supplier's recent answer times, read as a live percentile (the hedge's delay).

    Finagle's backup requests send theirs at a percentile of recent
    latencies, re-read every few seconds; here the estimate is re-made at
    most every ``RANK_EVERY`` seconds, on the first read after a change.

    Some times are only lower bounds: an attempt cut by the deadline, or
    cancelled because the other attempt of a hedged call won, ran *at least*
    that long. Dropping them would keep the slowest calls out and drag the
    percentile down; counting them as answers would too. They are censored
    observations, and the estimate is Kaplan and Meier's (survival analysis):
    ``survival(t)``, the share of calls still unanswered after ``t``, and
    ``percentile(p)``, the least ``t`` by which a share ``p`` has answered.
    """

    def __init__(self, window: int = HEDGE_WINDOW) -> None:
        self._times: collections.deque[tuple[float, bool]] = collections.deque(maxlen=window)
        """(seconds, answered): False for a lower bound (cut or cancelled)."""
        self._steps: list[tuple[float, float]] = []
        """(t, survival just after t), at each answer's time, ascending."""
        self._answers = 0
        self._ranked_at = -math.inf
        self._changed = False

    def observe(self, seconds: float, *, answered: bool = True) -> None:
        """An attempt answered after ``seconds``; or (``answered=False``) ran at least that long."""
        self._times.append((seconds, answered))
        self._changed = True

    def survival(self, seconds: float) -> float | None:
        """Share of calls still unanswered after ``seconds``; None before ``HEDGE_SEEN`` answers."""
        steps = self._estimate()
        if steps is None:
            return None
        left = 1.0
        for at, after in steps:
            if at > seconds:
                break
            left = after
        return left

    def percentile(self, share: float) -> float | None:
        """Least time by which ``share`` (0 to 1) of calls answered; the longest answer if the
        estimate never gets there; None before ``HEDGE_SEEN`` answers."""
        steps = self._estimate()
        if steps is None:
            return None
        for at, after in steps:
            if 1.0 - after >= share:
                return at
        return steps[-1][0] if steps else None

    def _estimate(self) -> list[tuple[float, float]] | None:
        now = time.monotonic()
        if self._changed and now - self._ranked_at >= RANK_EVERY:
            ranked = sorted(self._times)
            at_risk = len(ranked)
            left, steps, answers = 1.0, [], 0
            index = 0
            while index < len(ranked):
                at = ranked[index][0]
                answered = gone = 0
                while index < len(ranked) and ranked[index][0] == at:
                    answered += ranked[index][1]
                    gone += 1
                    index += 1
                if answered:
                    left *= 1.0 - answered / at_risk
                    steps.append((at, left))
                    answers += answered
                at_risk -= gone
            self._steps, self._answers = steps, answers
            self._ranked_at, self._changed = now, False
        return self._steps if self._answers >= HEDGE_SEEN else None
