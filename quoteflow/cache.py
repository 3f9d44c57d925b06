"""The quote cache (``--cache-size N``): a supplier's quote reused as long as its answer allows.

The supplier decides, in the ``Cache-Control`` header of its 200 answer
(RFC 9111, and RFC 5861 for ``stale-if-error``); QuoteFlow is a shared cache,
serving many callers:

    no-store, no-cache, private, no max-age   never stored (nor an answer with Vary:
                                              ``wire.py`` leaves its Cache-Control out)
    max-age=S (s-maxage=S wins when present)  reused for S seconds (at most --cache-max-age)
    stale-if-error=E                          then, for E more seconds (same cap), it may
                                              stand in when the supplier fails: timeout,
                                              transport_error, 5xx, circuit_open
    must-revalidate, proxy-revalidate,        no stale use at all (RFC 9111 §4.2.4)
    s-maxage

Entries are keyed by supplier, SKU and scenario; a quote is priced for each
request's quantity afterwards. At most N entries: the least recently used goes
first, and an entry past its stale time is dropped when next looked up.

Two places use it. ``CachingGateway`` wraps the supplier gateway: a fresh entry
answers without asking the supplier (bill: ``stopped: "cached"``), and every
quote that may be stored is stored. ``QuoteCache.cover`` runs in the service
after each fan-out, once the breakers have judged the real outcomes: a
failure that a stale entry may cover becomes that quote (bill:
``stale_if_error`` with the failure). Only there can it cover a ``timeout``
(the deadline has cancelled the supplier call) or a ``circuit_open`` (the
supplier was never called). A quote from the cache carries ``age_s``.
"""

from __future__ import annotations

import functools
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import attrs

from quoteflow.models import (
    CIRCUIT_OPEN,
    STOPPED_CACHED,
    TIMEOUT,
    TRANSPORT_ERROR,
    CartLine,
    Failure,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.service import BatchGateway, SupplierGateway

_Key = tuple[str, str, str, int]
"""Supplier, SKU, scenario."""

_DIRECTIVE: Final = re.compile(
    r"""([!#$%&'*+.^_`|~0-9A-Za-z-]+)(?:[ \t]*=[ \t]*("(?:[^"\\]|\\.)*"|[^,\s"]*))?[ \t]*"""
)
"""One ``Cache-Control`` directive: a token, optionally ``=`` a token or a quoted string."""
_SEPARATORS: Final = re.compile(r"[ \t,]*")
"""Between directives: commas and blanks (a list may have empty elements, RFC 9110 §5.6.1)."""

_NEVER_STORED: Final = frozenset({"no-store", "no-cache", "private"})
_NO_STALE: Final = frozenset({"must-revalidate", "proxy-revalidate", "s-maxage"})


@attrs.frozen
class Freshness:
    """How long a quote may be reused: fresh, then stale only in place of a failure."""

    fresh_for: float
    stale_for: float


@functools.lru_cache(maxsize=1024)
def freshness(cache_control: str | None, cap: float) -> Freshness | None:
    """What ``cache_control`` lets a shared cache do with the answer; None: never store it.

    Anything QuoteFlow cannot read with certainty — a malformed header, a
    ``max-age`` that is not a number of seconds, the same directive twice
    with two values — is not stored: a price reused wrongly costs more than
    one asked again. Remembered: a supplier sends the same few headers again
    and again.
    """
    if cache_control is None:
        return None
    directives: dict[str, str | None] = {}
    position = 0
    while True:
        separators = _SEPARATORS.match(cache_control, position)
        assert separators is not None  # it matches the empty string too
        position = separators.end()
        if position == len(cache_control):
            break
        if directives and "," not in separators.group():
            return None  # two directives with no comma between them
        found = _DIRECTIVE.match(cache_control, position)
        if found is None:
            return None
        name, value = found.group(1).lower(), found.group(2)
        if value is not None and value.startswith('"'):
            value = value[1:-1]
        if name in directives and directives[name] != value:
            return None
        directives[name] = value
        position = found.end()
    if not _NEVER_STORED.isdisjoint(directives):
        return None
    age = _seconds(directives.get("s-maxage", directives.get("max-age")))
    if age is None:
        return None
    stale = (
        0 if not _NO_STALE.isdisjoint(directives) else _seconds(directives.get("stale-if-error"))
    )
    found_freshness = Freshness(min(age, cap), min(stale or 0, cap))
    if found_freshness.fresh_for + found_freshness.stale_for <= 0:
        return None
    return found_freshness


_LONGEST: Final = 2**31
"""RFC 9111 §1.2.2: a delta-seconds too large to represent counts as 2^31 s."""


def _seconds(value: str | None) -> int | None:
    """RFC 9111 delta-seconds: digits only."""
    if value is None or not value.isascii() or not value.isdigit():
        return None
    # int() refuses more than 4,300 digits, and a header may carry 8,000.
    return _LONGEST if len(value) > 10 else min(int(value), _LONGEST)


COVERED: Final = frozenset({TIMEOUT, TRANSPORT_ERROR, CIRCUIT_OPEN})
"""Failures a stale quote may stand in for, with every 5xx (``http_5..``)."""


def covers(code: str) -> bool:
    """May a stale quote stand in for the failure ``code``?"""
    return code in COVERED or (code.startswith("http_5") and len(code) == 8)


@attrs.frozen
class _Entry:
    quote: SupplierQuote
    stored_at: float
    fresh_until: float
    stale_until: float


class QuoteCache:
    """At most ``size`` quotes, the least recently used out first; one per process."""

    def __init__(
        self,
        size: int,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        per_quantity: Callable[[str], bool] = lambda supplier: False,
    ) -> None:
        self._per_quantity = per_quantity
        """Whether a supplier's quote depends on the quantity asked (``SupplierClient``)."""
        self._size = size
        self._max_age = max_age
        self._clock = clock
        self._entries: OrderedDict[_Key, _Entry] = OrderedDict()
        self.served: dict[tuple[str, str], int] = {}
        """Quotes answered from the cache, by supplier and ``fresh``/``stale`` (running totals)."""

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, supplier: str, request: QuoteRequest) -> _Key:
        """Where ``supplier``'s quote for ``request`` is kept: per quantity if priced so."""
        quantity = request.quantity if self._per_quantity(supplier) else 0
        return (supplier, request.sku, request.scenario, quantity)

    def fresh(self, key: _Key) -> SupplierQuote | None:
        """The fresh quote for ``key``, aged, if there is one."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._clock()
        if now >= entry.fresh_until:
            if now >= entry.stale_until:
                del self._entries[key]  # of no use any more, even in place of a failure
            return None
        self._entries.move_to_end(key)
        return self._served(key, entry, now, "fresh")

    def keep(self, key: _Key, quote: SupplierQuote) -> None:
        """Store ``quote`` if its answer's ``Cache-Control`` allows, for as long as it does."""
        held = self._entries.get(key)
        if held is not None and held.quote is quote:
            return  # the same answer again: the waiters of one shared call each bring it
        allowed = freshness(quote.cache_control, self._max_age)
        if allowed is None:
            # The supplier's newest word on this quote: an older one must not stand in.
            if held is not None:
                del self._entries[key]
            return
        now = self._clock()
        fresh_until = now + allowed.fresh_for
        self._entries[key] = _Entry(quote, now, fresh_until, fresh_until + allowed.stale_for)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def cover(
        self,
        request: QuoteRequest,
        traces: tuple[SupplierTrace, ...],
        outcomes: dict[str, SupplierQuote | Failure],
    ) -> None:
        """Put a stale quote in ``outcomes`` wherever one may stand in for the failure there.

        A supplier missing from ``outcomes`` is one the deadline cut off: ``timeout``.
        """
        now: float | None = None
        for trace in traces:
            outcome = outcomes.get(trace.supplier)
            if isinstance(outcome, SupplierQuote):
                continue
            code = TIMEOUT if outcome is None else outcome.code
            if not covers(code):
                continue
            key = self.key(trace.supplier, request)
            entry = self._entries.get(key)
            if entry is None:
                continue
            now = self._clock() if now is None else now
            if now >= entry.stale_until:
                del self._entries[key]
                continue
            self._entries.move_to_end(key)
            if now < entry.fresh_until:
                # Stored since this request asked (or the supplier was never
                # asked: circuit_open): a fresh quote, not a stale one.
                outcomes[trace.supplier] = self._served(key, entry, now, "fresh")
                trace.stopped = STOPPED_CACHED
                continue
            outcomes[trace.supplier] = self._served(key, entry, now, "stale")
            trace.stale_if_error = code

    def _served(self, key: _Key, entry: _Entry, now: float, how: str) -> SupplierQuote:
        counted = (key[0], how)
        self.served[counted] = self.served.get(counted, 0) + 1
        return attrs.evolve(entry.quote, age_s=round(now - entry.stored_at, 3))


class CachingGateway:
    """A ``SupplierGateway`` that answers from ``cache`` while a quote is fresh, and fills it."""

    def __init__(self, inner: SupplierGateway, cache: QuoteCache) -> None:
        self._inner = inner
        self._cache = cache

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> SupplierQuote | Failure:
        """A fresh quote from the cache, or the supplier's answer (stored if it may be)."""
        key = self._cache.key(trace.supplier, request)
        cached = self._cache.fresh(key)
        if cached is not None:
            trace.stopped = STOPPED_CACHED
            return cached
        outcome = await self._inner.quote(trace, request, request_id, deadline)
        if isinstance(outcome, SupplierQuote):
            self._cache.keep(key, outcome)
        return outcome


class CachingBatches:
    """A ``BatchGateway`` whose calls ask only for the lines ``cache`` holds no fresh quote of.

    Every quote a batch call brings is stored per line, as a single call's
    is: the answer's ``Cache-Control`` covers each of its quotes. A call whose
    every line is fresh in the cache is answered without the supplier
    (``stopped: "cached"``).
    """

    def __init__(self, inner: BatchGateway, cache: QuoteCache) -> None:
        self._inner = inner
        self._cache = cache

    def chunks(self, supplier: str, lines: tuple[CartLine, ...]) -> list[tuple[CartLine, ...]]:
        """The supplier's own chunking: the cache is read when each call starts."""
        return self._inner.chunks(supplier, lines)

    async def batch(
        self,
        trace: SupplierTrace,
        lines: tuple[CartLine, ...],
        scenario: str,
        request_id: str,
        deadline: float,
    ) -> dict[str, SupplierQuote | Failure]:
        """Fresh quotes from the cache, the other lines from the supplier (and stored)."""
        cache = self._cache
        keys = {
            line.sku: cache.key(
                trace.supplier,
                QuoteRequest(sku=line.sku, quantity=line.quantity, scenario=scenario),
            )
            for line in lines
        }
        found: dict[str, SupplierQuote | Failure] = {}
        missing: list[CartLine] = []
        for line in lines:
            cached = cache.fresh(keys[line.sku])
            if cached is None:
                missing.append(line)
            else:
                found[line.sku] = cached
        if not missing:
            trace.stopped = STOPPED_CACHED
            return found
        answered = await self._inner.batch(trace, tuple(missing), scenario, request_id, deadline)
        for sku, outcome in answered.items():
            if isinstance(outcome, SupplierQuote):
                cache.keep(keys[sku], outcome)
        return found | answered
