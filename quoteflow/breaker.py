"""Per-supplier circuit breakers: stop asking a supplier that keeps failing.

Under one hard budget a hanging supplier costs every request the whole
budget, and an outage costs every request a retry and a backoff. The breaker
remembers across requests what the retry loop cannot, and answers for the
supplier at once (``circuit_open``) while it is out:

    closed ──N failures in a row──▶ open ──open time passed──▶ half-open
      ▲                              ▲                            │
      │                              └──── the probe failed ──────┤ (open time doubles,
      └──────────── the probe got an answer ──────────────────────┘  up to the cap)

What counts is what the supplier did with the attempts it was sent:

    failure   ``timeout`` (the deadline cut an attempt it had been sent, after
              that attempt had a fair time, below), ``transport_error``, a 5xx
              after the last attempt
    success   a quote — also one a retry brought: the streak starts again
    neither   a 4xx (a valid answer about that SKU), ``invalid_data``, a call
              the caller cancelled, a call that timed out before a single
              attempt was sent or gave its place in the slot queue up
              (QuoteFlow's own limits held it back), an attempt the deadline
              cut before it had a fair time (judged by the attempts before
              it, if any), an outcome this request did not ask for itself: a
              shared call's (it is judged once, on the bill of the request
              that holds its attempts) or the cache's

A fair time, the fair-chance rule: a supplier is blamed for an attempt the
deadline cut only if that attempt ran for at least the supplier's
``read_timeout`` — or, where that is longer than the budget, 1.25 times the
longest it was recently seen to need (its answers, and its attempts cut
after running past the estimate: the retry planner's window), never less
than ``min_attempt_time``, which is also what a supplier with no history
gets — and in either case never more than 90 % of the fan-out's time (an
attempt that ran nearly all of it always had its chance). An attempt that
got its slot late because QuoteFlow's own queue was long is cut short by
the deadline through no fault of the supplier's: counted, it would eject
healthy slow suppliers exactly when QuoteFlow is busiest. One that hangs
from its first request still trips: cut at the deadline, it ran most of the
budget. The bill marks an attempt cut short (``cut_short``).

In half-open exactly one request at a time probes, under its normal budget
and rules; every other request gets ``circuit_open`` meanwhile. A probe that
brings any answer from the supplier (a quote, a 4xx, ``invalid_data``) closes
the circuit: the supplier is answering again. A failed probe re-opens it for
twice as long as last time, up to ``open_max``; a probe that ends with neither
(its caller left, or it never got a slot) hands the probe to the next request.

Open times are jittered down (80–100 % of the nominal time), so that the
workers of a fleet do not all probe in the same instant, and never past the
cap. Everything runs on the event loop's thread, with no await between a
check and its change: no lock.
"""

from __future__ import annotations

import enum
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import attrs

from quoteflow.models import (
    RATE_LIMITED,
    TIMEOUT,
    TRANSPORT_ERROR,
    AttemptRecord,
    Failure,
    SupplierQuote,
)


class State(enum.IntEnum):
    """The breaker's state; the value is what ``quoteflow_circuit_state`` exports."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class Permit(enum.Enum):
    """What a request may do with one supplier."""

    CALL = "call"
    """Closed: ask as usual."""
    PROBE = "probe"
    """Half-open: this request alone asks, and its outcome decides."""
    REFUSED = "refused"
    """Open, or another request is probing: answer ``circuit_open`` at once."""


class Verdict(enum.Enum):
    """What one finished supplier call says about the supplier's health."""

    SUCCESS = "success"
    FAILURE = "failure"
    ANSWERED = "answered"
    """The supplier answered, but not with a quote (4xx, invalid data)."""
    UNKNOWN = "unknown"
    """Nothing learned: cancelled, or never sent."""


def verdict(outcome: SupplierQuote | Failure | None, attempts: list[AttemptRecord]) -> Verdict:
    """Judge one supplier call by its outcome (None: cut off by the deadline).

    ``attempts``: the request's bill for the supplier. Without one the
    supplier was told nothing by this request: the call was cut off waiting
    for a slot or gave its place up, or the outcome came from a call another
    request made and reports (``--coalesce``), or from the cache.
    """
    if not attempts:
        return Verdict.UNKNOWN
    if isinstance(outcome, SupplierQuote):
        return Verdict.SUCCESS
    if isinstance(outcome, Failure) and outcome.code == RATE_LIMITED:
        # Paused before a retry: judged by the attempt before the pause.
        return _judge_code(attempts[-1].outcome)
    if outcome is None and attempts[-1].cut_short:
        # Not the supplier's failure: judge what it did before, if anything.
        return _judge_code(attempts[-2].outcome) if len(attempts) > 1 else Verdict.UNKNOWN
    return _judge_code(TIMEOUT if outcome is None else outcome.code)


_WORST_FIRST: Final = (Verdict.FAILURE, Verdict.ANSWERED, Verdict.SUCCESS)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst of several calls' verdicts: a cart's calls to one supplier count as one."""
    seen = set(verdicts)
    return next((judged for judged in _WORST_FIRST if judged in seen), Verdict.UNKNOWN)


def _judge_code(code: str) -> Verdict:
    if code in (TIMEOUT, TRANSPORT_ERROR) or code.startswith("http_5"):
        return Verdict.FAILURE
    return Verdict.ANSWERED


JITTER: Final = (0.8, 1.0)
"""Each open time is the nominal one times a factor drawn from this range."""

Listener = Callable[[str, State, Mapping[str, object]], None]
"""Told of every transition: supplier, the new state, the event's fields."""


@attrs.define
class CircuitBreaker:
    """One supplier's breaker."""

    supplier: str
    failures_to_open: int
    open_time: float
    open_max: float
    listener: Listener
    clock: Callable[[], float] = time.monotonic
    state: State = State.CLOSED
    streak: int = 0
    """Failures in a row while closed."""
    reopens: int = 0
    """Failed probes in a row: the open time doubles with each."""
    open_until: float = 0.0
    probing: bool = False

    def permit(self) -> Permit:
        """May a request ask the supplier now? Moves open to half-open when it is time."""
        if self.state is State.CLOSED:
            return Permit.CALL
        if self.state is State.OPEN:
            if self.clock() < self.open_until:
                return Permit.REFUSED
            self._move(State.HALF_OPEN, {})
        if self.probing:
            return Permit.REFUSED
        self.probing = True
        return Permit.PROBE

    def record(self, permit: Permit, judged: Verdict) -> None:
        """Take in the verdict of a call made under ``permit``."""
        if permit is Permit.PROBE:
            self.probing = False
            if judged is Verdict.FAILURE:
                self.reopens += 1
                self._open({"probe": "failed"})
            elif judged is not Verdict.UNKNOWN:
                self.streak = self.reopens = 0
                self._move(State.CLOSED, {"probe": judged.value})
            return
        # A call let through while closed that ends after the circuit opened
        # says nothing the open circuit does not already act on.
        if permit is Permit.CALL and self.state is State.CLOSED:
            if judged is Verdict.SUCCESS:
                self.streak = 0
            elif judged is Verdict.FAILURE:
                self.streak += 1
                if self.streak >= self.failures_to_open:
                    self._open({"streak": self.streak})

    def _open(self, fields: dict[str, object]) -> None:
        nominal = min(self.open_max, self.open_time * 2**self.reopens)
        seconds = nominal * random.uniform(*JITTER)
        self.open_until = self.clock() + seconds
        self._move(State.OPEN, {**fields, "open_s": round(seconds, 3), "reopens": self.reopens})

    def _move(self, state: State, fields: Mapping[str, object]) -> None:
        self.state = state
        self.listener(self.supplier, state, fields)


class Breakers:
    """A breaker for each supplier that has one, shared by every request of the process."""

    def __init__(
        self,
        failures_to_open: Mapping[str, int],
        *,
        open_time: float,
        open_max: float,
        listener: Listener,
        previous: Breakers | None = None,
    ) -> None:
        """One breaker per supplier whose ``failures_to_open`` is above 0.

        ``previous`` (a reload): a supplier that keeps its threshold keeps its
        breaker, state and all.
        """
        kept = {} if previous is None else previous._breakers
        self._breakers: dict[str, CircuitBreaker] = {
            supplier: (
                kept[supplier]
                if supplier in kept and kept[supplier].failures_to_open == failures
                else CircuitBreaker(supplier, failures, open_time, open_max, listener)
            )
            for supplier, failures in failures_to_open.items()
            if failures
        }

    def __bool__(self) -> bool:
        return bool(self._breakers)

    def __getitem__(self, supplier: str) -> CircuitBreaker:
        return self._breakers[supplier]

    def get(self, supplier: str) -> CircuitBreaker | None:
        """``supplier``'s breaker, or ``None`` if it has none."""
        return self._breakers.get(supplier)

    @property
    def suppliers(self) -> tuple[str, ...]:
        """The suppliers with a breaker."""
        return tuple(self._breakers)

    def state(self, supplier: str) -> State:
        """``supplier``'s state as last moved; an open circuit past its time reads open."""
        return self._breakers[supplier].state
