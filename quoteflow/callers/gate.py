"""The way in for one caller's request: seats, then the inbound limit, then the rate.

    key ──▶ Callers.identify ──▶ Pass.enter:
              (401 if none)        1. a seat of the caller's  (429 seats_exceeded)
                                   2. the inbound limit       (503 capacity_exhausted)
                                   3. one request of its rate (429 quota_exceeded)
                                 ... served ...
                                 Pass.leave: the seat back

Each step takes nothing when it refuses, and the steps before it give back
what they took, so a request refused for its seats spends no quota, one
refused for its rate (or the inbound limit) holds no seat, and no refused
request reaches the service. Locally all three run with no ``await`` in
between. With a fleet-wide rate (``shared.SharedMeter``) step 3 may wait for
one Redis round trip; the request holds its seat meanwhile (nobody else can
take it and overshoot), and gives it back if it is then refused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from quoteflow.callers.file import load_callers
from quoteflow.callers.meter import LocalMeter, Standing
from quoteflow.callers.model import Caller, Callers
from quoteflow.callers.shared import SharedMeter
from quoteflow.errors import QuotaExceeded, SeatsExceeded

SEATS_EXCEEDED = "seats_exceeded"
QUOTA_EXCEEDED = "quota_exceeded"


class Gate:
    """Every caller's seats and rate in this process; ``callers`` is swapped whole on reload."""

    def __init__(self, callers: Callers, shared: SharedMeter | None = None) -> None:
        self.callers = callers
        self.local = LocalMeter()
        self.shared = shared
        """Fleet mode: the rate is held in Redis for every worker together."""
        self.seated: dict[str, int] = {}
        """Seats in use now, by caller name."""

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller an ``Authorization`` value names by its key, or ``None``."""
        return self.callers.identify(authorization)

    def swap(self, callers: Callers) -> None:
        """Serve ``callers`` from now on (reload).

        A caller that stays keeps what it has used and the seats it holds,
        measured against its new rate and seats from now on; a removed caller's
        state is forgotten (its requests in flight still give their seats back).
        """
        self.callers = callers
        self.local.keep_only(set(callers.names))
        if self.shared is not None:
            self.shared.keep_only(set(callers.names))

    def peek(self, caller: Caller) -> Standing | None:
        """Where ``caller`` stands against its rate, spending nothing (``None``: no rate)."""
        if caller.rate is None:
            return None
        if self.shared is not None:
            return self.shared.peek(caller.name, caller.rate)
        return self.local.peek(caller.name, caller.rate, time.monotonic())

    def take_seat(self, caller: Caller) -> None:
        """One more of ``caller``'s seats, or ``SeatsExceeded`` (taking nothing)."""
        seats = caller.seats
        if seats is not None:
            taken = self.seated.get(caller.name, 0)
            if taken >= seats:
                raise SeatsExceeded(caller.name, seats)
            self.seated[caller.name] = taken + 1

    def give_seat(self, caller: Caller) -> None:
        """Give back a seat ``take_seat`` took."""
        if caller.seats is not None:
            left = self.seated[caller.name] - 1
            if left:
                self.seated[caller.name] = left
            else:
                del self.seated[caller.name]


class Pass:
    """One request's way through its caller's gate; ``leave`` once it is answered."""

    __slots__ = ("_seated", "caller", "gate", "refused", "standing", "waited")

    def __init__(self, gate: Gate, caller: Caller) -> None:
        self.gate = gate
        self.caller = caller
        self.standing: Standing | None = None
        """Where the caller stands after this request's rate check (``None``: not made)."""
        self.refused: str | None = None
        """``seats_exceeded`` or ``quota_exceeded`` when the gate refused this request."""
        self.waited = 0.0
        """Seconds the rate check waited for Redis: they count against the budget."""
        self._seated = False

    async def enter(self, ensure_capacity: Callable[[], None], units: int = 1) -> None:
        """Take a seat, check the inbound limit, spend ``units`` of the rate — or refuse.

        ``units``: a cart spends one per SKU (alternates too), so that a 200-line cart is no
        loophole in a quota. It is refused unless the caller may send them all
        now (a cart larger than the caller's burst never is); spent one by
        one, a cart whose fleet-wide units run out midway keeps what it spent.
        Raises ``SeatsExceeded``, ``CapacityExhausted`` or ``QuotaExceeded``,
        holding nothing.
        """
        gate, caller = self.gate, self.caller
        try:
            gate.take_seat(caller)
        except SeatsExceeded:
            self.refused = SEATS_EXCEEDED
            raise
        self._seated = True
        try:
            ensure_capacity()
            rate = caller.rate
            if rate is None:
                return
            if units > 1:
                standing = gate.peek(caller)
                if standing is not None and standing.remaining < units:
                    self.standing = standing
                    self.refused = QUOTA_EXCEEDED
                    raise QuotaExceeded(caller.name, standing.retry_after)
            shared = gate.shared
            started = time.monotonic()
            for _ in range(units):
                if shared is None:
                    admitted, self.standing = gate.local.spend(caller.name, rate, started)
                else:
                    admitted, self.standing = await shared.spend(caller.name, rate)
                if not admitted:
                    self.refused = QUOTA_EXCEEDED
                    raise QuotaExceeded(caller.name, self.standing.retry_after)
            if shared is not None:
                self.waited = time.monotonic() - started
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        """Give back the seat (once, whatever happened)."""
        if self._seated:
            self._seated = False
            self.gate.give_seat(self.caller)

    def fields(self) -> tuple[str, str] | None:
        """``RateLimit-Policy`` and ``RateLimit`` for this request's answer (``None``: no rate)."""
        standing = self.standing or self.gate.peek(self.caller)
        return None if standing is None else standing.fields(self.caller.name)


class CallersFile:
    """The callers file as ``reload.Reloadable``: re-read on ``SIGHUP``, swapped whole or kept."""

    name = "callers"

    def __init__(self, gate: Gate, path: str, environ: Mapping[str, str] = os.environ) -> None:
        self.gate = gate
        self.path = path
        self.environ = environ

    def reload(self) -> None:
        """Check the file as at start-up; serve it from now on, or raise ``ConfigError``."""
        self.gate.swap(load_callers(self.path, self.environ))
