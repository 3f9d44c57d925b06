"""Suppliers' contracts: how many requests a second and how many at once a supplier takes.

A contract has two terms, each optional, set per supplier live (``PUT
/contracts/{supplier}``) or at start (``--contract``), and holds in every
dialect, since every dialect's request goes through
:func:`provider_lab.handlers.serve`:

``rate`` (``"20/1s"``)
    At most N requests per W seconds: GCRA with a burst of the whole quota, as
    QuoteFlow's callers' rates and the outbound ``rate`` of its catalogue
    (issue 30) are. The state is one level, ``used`` requests as of ``at``,
    draining at ``quota / window`` a second; a request is admitted when
    ``used + 1 <= quota`` after the drain and then adds 1, a refused one
    changes nothing. So a supplier idle for a window takes its whole quota at
    once, then one request every ``window / quota`` seconds. Why GCRA and not
    a sliding window: the lab must refuse exactly what a client keeping the
    same GCRA would not send. A sliding window of N per W refuses what GCRA
    admits (after a burst of N at 0, GCRA admits one more every W/N; a
    sliding window none until W), so against one a correct client would be
    refused, and the test would blame it. Past the rate: ``429``,
    ``Retry-After`` the whole seconds until the next request would be
    admitted (rounded up, at least 1), ``{"error": "rate_limited",
    "supplier": s}``.
``concurrency`` (``4``)
    At most N requests in flight at once; one past it is answered ``503
    {"error": "over_concurrency", "supplier": s, "concurrency": N}`` at once,
    with no ``Retry-After``.

The order, after the dialect's credentials (a request without a valid key is
not the key's call) and before the latency and the faults: concurrency, then
the rate. Each takes nothing when it refuses: a request refused for
concurrency spends none of the rate, one refused for the rate holds no slot,
and neither uses up a fault. There is no ``await`` between them, so no other
request comes in between.

A ``PUT`` that changes the rate keeps what the supplier has used of it (it
drains at the new rate from then on, as a QuoteFlow reload does); a supplier
given a rate after having none, or whose contract is deleted, starts afresh
with its whole quota. ``POST /reset`` zeroes the counts, not the levels.

Every supplier has a :class:`Line`, contract or not: its requests in flight
and their peak are counted for ``/stats`` either way. Without a contract that
is all the pipeline does (one dict lookup, one ``None`` check, the in-flight
count); with one, it also counts the requests admitted per second, in a ring
of the last 60 seconds of loop time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Final

import attrs
from aiohttp import web

RATE_LIMITED: Final = "rate_limited"
OVER_CONCURRENCY: Final = "over_concurrency"
TERMS: Final = ("rate", "concurrency")
"""The terms a contract may have."""
MAX_QUOTA: Final = 1_000_000
MAX_WINDOW: Final = 86_400
MAX_CONCURRENCY: Final = 10_000
RING_SECONDS: Final = 60
"""How many one-second buckets of admitted requests ``/stats`` shows per supplier."""

_RATE: Final = re.compile(r"(\d{1,9})/(\d{1,9})([smh])")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600}
_SLACK: Final = 1e-9
"""Float noise: a request exactly on time is admitted."""
_RATE_SHAPE: Final = 'must be "<requests>/<window>" like "20/1s" (window in s, m or h) or null'


class ContractError(ValueError):
    """A contract that cannot be used; ``problems`` says why, one line per term."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@attrs.frozen
class Rate:
    """At most ``quota`` requests per ``window`` seconds, GCRA with a burst of the whole quota."""

    quota: int
    window: int

    @property
    def interval(self) -> float:
        """Seconds for one used request to drain back: ``window / quota``."""
        return self.window / self.quota

    def __str__(self) -> str:
        return f"{self.quota}/{self.window}s"


def parse_rate(text: object) -> Rate:
    """``"20/1s"`` (``m`` and ``h`` name units too): a :class:`Rate`, or ``ValueError``."""
    found = _RATE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"rate: {_RATE_SHAPE}")
    quota, window = int(found[1]), int(found[2]) * _UNIT_SECONDS[found[3]]
    if quota < 1:
        raise ValueError("rate: at least 1 request per window")
    if window < 1:
        raise ValueError("rate: the window must be at least 1 s")
    if quota > MAX_QUOTA or window > MAX_WINDOW:
        raise ValueError(
            f"rate: at most {MAX_QUOTA} requests per window of at most {MAX_WINDOW} s (1 day)"
        )
    return Rate(quota, window)


@attrs.frozen
class Contract:
    """A supplier's terms: a rate, a concurrency, or both (never neither: that is no contract)."""

    rate: Rate | None = None
    concurrency: int | None = None

    def to_json(self) -> dict[str, object]:
        """The contract as the control API shows and accepts it."""
        return {
            "rate": None if self.rate is None else str(self.rate),
            "concurrency": self.concurrency,
        }


NO_CONTRACT: Final = {"rate": None, "concurrency": None}
"""What the control API shows for a supplier without a contract."""


def contract_from_json(data: object) -> Contract | None:
    """Validate ``{"rate": "N/Ws" | null, "concurrency": N | null}`` (a term left out is null).

    ``None`` when both are null: the supplier has no contract. Raises
    :class:`ContractError` listing every problem.
    """
    if not isinstance(data, dict):
        raise ContractError(
            ['body: must be a JSON object {"rate": "N/Ws" or null, "concurrency": N or null}']
        )
    problems = [
        f"{name}: not a term of a contract ({', '.join(TERMS)})"
        for name in sorted(set(data) - set(TERMS), key=str)
    ]
    rate = None
    raw_rate = data.get("rate")
    if raw_rate is not None:
        try:
            rate = parse_rate(raw_rate)
        except ValueError as exc:
            problems.append(str(exc))
    concurrency = data.get("concurrency")
    if concurrency is not None and (
        type(concurrency) is not int or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        problems.append(f"concurrency: must be an integer 1–{MAX_CONCURRENCY} or null")
    if problems:
        raise ContractError(problems)
    if rate is None and concurrency is None:
        return None
    assert concurrency is None or isinstance(concurrency, int)
    return Contract(rate, concurrency)


def parse_contract_spec(spec: str, suppliers: Sequence[str]) -> tuple[str, Contract | None]:
    """The CLI form ``SUPPLIER:rate=20/1s,concurrency=4`` (``null`` for a term: none)."""
    supplier, sep, terms = spec.partition(":")
    if not sep or supplier not in suppliers:
        raise ContractError(
            [
                f"{spec!r}: expected SUPPLIER:rate=N/Ws,concurrency=N, supplier one of "
                f"{', '.join(suppliers)}"
            ]
        )
    data: dict[str, object] = {}
    for item in terms.split(","):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name:
            raise ContractError([f"{item!r}: expected rate=N/Ws or concurrency=N"])
        if name in data:
            raise ContractError([f"{name}: given twice"])
        if value.lower() in ("none", "null"):
            data[name] = None
        elif name == "concurrency":
            try:
                data[name] = int(value)
            except ValueError:
                raise ContractError([f"concurrency: {value!r} is not an integer"]) from None
        else:
            data[name] = value
    return supplier, contract_from_json(data)


class Line:
    """One supplier's contract, the state of its rate, and its counts for ``/stats``."""

    __slots__ = (
        "_at",
        "_concurrency_body",
        "_rate_body",
        "_ring",
        "_second",
        "_used",
        "concurrency_refused",
        "contract",
        "in_flight",
        "max_in_flight",
        "rate_refused",
        "supplier",
    )

    def __init__(self, supplier: str) -> None:
        self.supplier = supplier
        self.contract: Contract | None = None
        self.in_flight = 0
        """Requests admitted (by credentials and contract) and not answered yet."""
        self.max_in_flight = 0
        self.rate_refused = 0
        self.concurrency_refused = 0
        self._used = 0.0
        self._at = 0.0
        self._ring = [0] * RING_SECONDS
        self._second = -RING_SECONDS  # the loop second the ring's newest bucket counts
        self._rate_body = json.dumps({"error": RATE_LIMITED, "supplier": supplier}).encode()
        self._concurrency_body = b""

    def set(self, contract: Contract | None, now: float) -> None:
        """Hold the supplier to ``contract`` from its next request (``None``: no contract).

        A changed rate keeps what has been used of it as of loop time ``now``,
        draining at the new rate from then on; no rate forgets it.
        """
        old = None if self.contract is None else self.contract.rate
        if contract is None or contract.rate is None or old is None:
            self._used, self._at = 0.0, now
        else:
            self._used, self._at = max(0.0, self._used - (now - self._at) / old.interval), now
        self.contract = contract
        if contract is not None and contract.concurrency is not None:
            self._concurrency_body = json.dumps(
                {
                    "error": OVER_CONCURRENCY,
                    "supplier": self.supplier,
                    "concurrency": contract.concurrency,
                }
            ).encode()

    def enter(self, now: float) -> tuple[str, web.Response] | None:
        """Admit one request at loop time ``now`` (now in flight), or refuse it.

        Only called when the supplier has a contract; without one the
        pipeline counts the request in flight itself.
        """
        contract = self.contract
        assert contract is not None
        limit = contract.concurrency
        if limit is not None and self.in_flight >= limit:
            self.concurrency_refused += 1
            return OVER_CONCURRENCY, web.Response(
                status=503, body=self._concurrency_body, content_type="application/json"
            )
        rate = contract.rate
        if rate is not None:
            interval = rate.interval
            used = max(0.0, self._used - (now - self._at) / interval)
            if used + 1 > rate.quota + _SLACK:
                self.rate_refused += 1
                retry_after = max(1, math.ceil((used + 1 - rate.quota) * interval - _SLACK))
                return RATE_LIMITED, web.Response(
                    status=429,
                    body=self._rate_body,
                    content_type="application/json",
                    headers={"Retry-After": str(retry_after)},
                )
            self._used, self._at = used + 1, now
        self.in_flight += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        second = int(now)
        if second > self._second:
            self._advance(second)
        self._ring[second % RING_SECONDS] += 1
        return None

    def _advance(self, second: int) -> None:
        """Move the ring's newest bucket to ``second``, emptying the seconds skipped."""
        ring = self._ring
        if second - self._second >= RING_SECONDS:
            ring[:] = [0] * RING_SECONDS
        else:
            for skipped in range(self._second + 1, second + 1):
                ring[skipped % RING_SECONDS] = 0
        self._second = second

    def admitted_per_second(self, now: float) -> list[int]:
        """Requests admitted in each of the last 60 loop seconds, oldest first, ``now``'s last."""
        second = int(now)
        if second > self._second:
            self._advance(second)
        return [self._ring[(second + 1 + i) % RING_SECONDS] for i in range(RING_SECONDS)]

    def zero(self) -> None:
        """Zero the counts (``POST /reset``); the contract and its rate's level stay."""
        self.max_in_flight = self.in_flight
        self.rate_refused = 0
        self.concurrency_refused = 0
        self._ring[:] = [0] * RING_SECONDS


class ContractTable:
    """Every supplier's :class:`Line`, by name: what ``/contracts`` sets and ``/stats`` shows."""

    def __init__(self, suppliers: Sequence[str]) -> None:
        self.lines: dict[str, Line] = {s: Line(s) for s in suppliers}

    def set(self, supplier: str, contract: Contract | None, now: float) -> None:
        """Hold ``supplier`` to ``contract`` (``None``: to none) from loop time ``now``."""
        self.lines[supplier].set(contract, now)

    def clear(self) -> None:
        """No supplier has a contract any more."""
        for line in self.lines.values():
            line.set(None, 0.0)

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Every supplier's contract, as ``GET /contracts`` shows it."""
        return {name: self.shown(name) for name in self.lines}

    def shown(self, supplier: str) -> dict[str, object]:
        """One supplier's contract as the control API shows it (nulls for none)."""
        contract = self.lines[supplier].contract
        return dict(NO_CONTRACT) if contract is None else contract.to_json()

    def zero(self) -> None:
        """Zero every supplier's counts; contracts and levels stay."""
        for line in self.lines.values():
            line.zero()

    def to_json(self, now: float) -> dict[str, object]:
        """The contracts' part of ``GET /stats`` at loop time ``now``."""
        lines = self.lines.values()
        return {
            "in_flight": {line.supplier: line.in_flight for line in lines},
            "max_in_flight": {line.supplier: line.max_in_flight for line in lines},
            "rate_refused": {line.supplier: line.rate_refused for line in lines},
            "concurrency_refused": {line.supplier: line.concurrency_refused for line in lines},
            "admitted_per_second": {
                line.supplier: line.admitted_per_second(now)
                for line in lines
                if line.contract is not None
            },
        }
