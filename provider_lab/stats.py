"""What the lab has seen: in-flight count, per-supplier counts, attempts per request id.

Everything keyed by request id is bounded: the oldest ids are forgotten first,
so a long benchmark cannot grow the lab's memory without limit.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Collection, Mapping
from typing import Final

import attrs

HEADERS_PER_ID: Final = 32
DRAWS_PER_SUPPLIER: Final = 1000
"""The ``latency`` fault's lognormal draws ``/stats`` keeps per supplier: the most recent."""


class RecentIds:
    """A set of the most recently seen ids, forgetting the oldest beyond ``limit``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> bool:
        """Remember ``key``; ``True`` if it was not remembered before."""
        if key in self._ids:
            self._ids.move_to_end(key)
            return False
        self._ids[key] = None
        if len(self._ids) > self._limit:
            self._ids.popitem(last=False)
        return True

    def clear(self) -> None:
        """Forget every id."""
        self._ids.clear()

    def __len__(self) -> int:
        return len(self._ids)


@attrs.define
class _RequestRecord:
    per_supplier: Counter[str] = attrs.field(factory=Counter)
    headers: list[dict[str, str | None]] = attrs.field(factory=list)
    batch_sizes: dict[str, list[int]] = attrs.field(factory=dict)
    """Per supplier, the parts of each batch call, in arrival order (at most 32 in all)."""
    batch_calls: int = 0
    latency_drawn_ms: dict[str, list[float]] = attrs.field(factory=dict)
    """Per supplier, the ``latency`` fault's draws for this id's requests (at most 32 in all)."""
    latency_draws: int = 0


class Stats:
    """Counters behind ``GET /stats``; ``reset`` zeroes them."""

    def __init__(self, id_limit: int, suppliers: tuple[str, ...]) -> None:
        self._id_limit = id_limit
        self._suppliers = suppliers
        self.active = 0
        self.reset()

    def reset(self) -> None:
        """Zero everything except the in-flight count (which is live, not history)."""
        self.max_active = self.active
        self.total = 0
        self.deadline_expired = 0
        self.per_supplier: Counter[str] = Counter({s: 0 for s in self._suppliers})
        self.answers: dict[str, Counter[str]] = {s: Counter() for s in self._suppliers}
        self.batch_sizes: dict[str, Counter[int]] = {}
        """Per supplier that had batch calls, how many of them carried each number of parts."""
        self.latency_drawn_ms: dict[str, deque[float]] = {}
        """Per supplier that drew any, the ``latency`` fault's lognormal delays, oldest first."""
        self._requests: OrderedDict[str, _RequestRecord] = OrderedDict()

    def started(
        self,
        supplier: str,
        request_id: str | None,
        attempt: str | None,
        remaining: str | None,
        traceparent: str | None = None,
        parts: int | None = None,
    ) -> None:
        """Count one supplier request now in flight, with the headers it carried (and, for a
        batch call, how many ``parts`` it asked for)."""
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.total += 1
        self.per_supplier[supplier] += 1
        if parts is not None:
            self.batch_sizes.setdefault(supplier, Counter())[parts] += 1
        if request_id is None:
            return
        record = self._requests.get(request_id)
        if record is None:
            record = self._requests[request_id] = _RequestRecord()
            if len(self._requests) > self._id_limit:
                self._requests.popitem(last=False)
        else:
            self._requests.move_to_end(request_id)
        record.per_supplier[supplier] += 1
        if len(record.headers) < HEADERS_PER_ID:
            record.headers.append(
                {
                    "supplier": supplier,
                    "x_attempt": attempt,
                    "x_deadline_remaining_ms": remaining,
                    # W3C trace context: which of the caller's spans this request was.
                    "traceparent": traceparent,
                }
            )
        if parts is not None and record.batch_calls < HEADERS_PER_ID:
            record.batch_calls += 1
            record.batch_sizes.setdefault(supplier, []).append(parts)

    def latency_drawn(self, supplier: str, request_id: str | None, ms: float) -> None:
        """Record the delay the ``latency`` fault drew for one of ``supplier``'s requests."""
        ms = round(ms, 3)
        drawn = self.latency_drawn_ms.get(supplier)
        if drawn is None:
            drawn = self.latency_drawn_ms[supplier] = deque(maxlen=DRAWS_PER_SUPPLIER)
        drawn.append(ms)
        record = None if request_id is None else self._requests.get(request_id)
        if record is not None and record.latency_draws < HEADERS_PER_ID:
            record.latency_draws += 1
            record.latency_drawn_ms.setdefault(supplier, []).append(ms)

    def answered(self, supplier: str, what: str) -> None:
        """Record how one supplier request was answered (``ok``, a fault kind, ...)."""
        self.answers[supplier][what] += 1

    def finished(self) -> None:
        """One supplier request is no longer in flight."""
        self.active -= 1

    def to_json(
        self, request_ids: Collection[str] | None = None, *, draws: bool = True
    ) -> dict[str, object]:
        """The body of ``GET /stats``; per-id maps limited to ``request_ids`` if given.

        ``batch_sizes`` and ``batch_sizes_per_id`` are there only once a batch call has
        been counted since the last reset, ``latency_drawn_ms`` and
        ``latency_drawn_ms_per_id`` only once the ``latency`` fault has drawn a delay (and
        ``draws`` is true): without them, the body is what it always was.
        """
        requests: Mapping[str, _RequestRecord]
        if request_ids is None:
            requests = self._requests
        else:
            requests = {r: self._requests[r] for r in request_ids if r in self._requests}
        extras: dict[str, object] = {}
        if self.batch_sizes:
            extras = {
                "batch_sizes": {
                    supplier: {str(size): n for size, n in sorted(sizes.items())}
                    for supplier, sizes in self.batch_sizes.items()
                },
                "batch_sizes_per_id": {
                    rid: {s: list(sizes) for s, sizes in r.batch_sizes.items()}
                    for rid, r in requests.items()
                    if r.batch_sizes
                },
            }
        if draws and self.latency_drawn_ms:
            extras["latency_drawn_ms"] = {
                supplier: list(drawn) for supplier, drawn in self.latency_drawn_ms.items()
            }
            extras["latency_drawn_ms_per_id"] = {
                rid: {s: list(drawn) for s, drawn in r.latency_drawn_ms.items()}
                for rid, r in requests.items()
                if r.latency_drawn_ms
            }
        return {
            "active": self.active,
            "max_active": self.max_active,
            "total": self.total,
            "per_supplier": dict(self.per_supplier),
            "answers": {s: dict(c) for s, c in self.answers.items()},
            "deadline_expired": self.deadline_expired,
            "attempts": {rid: r.per_supplier.total() for rid, r in requests.items()},
            "attempts_per_supplier": {rid: dict(r.per_supplier) for rid, r in requests.items()},
            "headers": {rid: list(r.headers) for rid, r in requests.items()},
            **extras,
        }
