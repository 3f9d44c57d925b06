"""Exchange rates: the ECB's daily reference table, kept fresh off the request path.

``--fx-rates`` names a file or an ``http(s)`` URL in the European Central Bank's
``eurofxref-daily.xml`` format: one ``Cube time=`` date and one ``Cube
currency= rate=`` row per currency, each rate the units of that currency one
euro buys. ``Rates`` holds the last good table; pricing (``offers.py``) asks it
for a cross rate, and gets none when the table is missing, stale or does not
know a currency — the quote is then ``no_rate``, never compared in the wrong
currency.

A request never waits for the feed. A URL is fetched at start (start-up waits
for that first fetch at most ``FIRST_FETCH_WAIT``) and every ``--fx-refresh``
after it by a background task, through a client session of its own (never a
supplier's connection pool), with its own timeout and a size cap; a failure
keeps the last good table, is retried with backoff, and is one
``fx_refresh_failed`` event and one count of ``quoteflow_fx_refresh_failures``.
A file is read at start (a bad one stops start-up) and on ``SIGHUP`` (a bad one
keeps the old table).

The XML parser refuses any document type declaration, so entity declarations
(a "billion laughs" feed) are rejected before anything is expanded.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import pathlib
import random
import time
import xml.parsers.expat
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from typing import Final

import aiohttp
import attrs

from quoteflow.errors import ConfigError
from quoteflow.logs import log_event
from quoteflow.money import CrossRate, minor_unit

log = logging.getLogger("quoteflow")

BASE: Final = "EUR"
"""The ECB's rates are units of each currency per euro."""
PUBLISHED_AT: Final = dt.time(16, 0, tzinfo=dt.timezone(dt.timedelta(hours=1), "CET"))
"""When the ECB publishes a day's rates: a table's age runs from its date at 16:00 CET."""
MAX_FEED_BYTES: Final = 256 * 1024
"""The ECB's daily file is about 1.5 KB; a feed larger than this is refused unread."""
FETCH_TIMEOUT: Final = 10.0
"""Seconds one fetch of a rates URL may take, connecting and reading together."""
FIRST_FETCH_WAIT: Final = 2.0
"""Seconds start-up waits for the first fetch of a URL before serving without it."""
RETRY_FIRST: Final = 1.0
"""Seconds before the first retry of a failed fetch; each failure doubles it, up to the refresh."""


class RatesError(ValueError):
    """A rates feed that cannot be used: the message says why, in one line."""


@attrs.frozen
class RateTable:
    """One day's reference rates: units of each currency per euro (the euro itself 1)."""

    date: dt.date
    rates: dict[str, Decimal]

    @property
    def published(self) -> float:
        """POSIX time of its publication: its date at 16:00 CET."""
        return dt.datetime.combine(self.date, PUBLISHED_AT).timestamp()


def parse_ecb(body: bytes) -> RateTable:
    """The ECB's ``eurofxref-daily.xml`` as a table; ``RatesError`` naming what is wrong.

    Only what the format promises is read: the ``Cube`` with a ``time`` (exactly
    one) and the ``Cube`` rows with a ``currency`` and a ``rate`` under it. A
    rate is a plain positive decimal; a currency is an ISO 4217 code with a
    minor unit, listed once. Other elements (the envelope, the sender) are
    ignored, and a document type declaration refuses the whole feed.
    """
    parser = xml.parsers.expat.ParserCreate()
    dates: list[str] = []
    rows: list[tuple[str, str]] = []

    def refuse_doctype(*_: object) -> None:
        raise RatesError("a document type declaration (entities are never expanded)")

    def start(name: str, attributes: dict[str, str]) -> None:
        if name.rpartition(":")[2] != "Cube" and name.rpartition("}")[2] != "Cube":
            return
        if "time" in attributes:
            dates.append(attributes["time"])
        elif "currency" in attributes or "rate" in attributes:
            rows.append((attributes.get("currency", ""), attributes.get("rate", "")))

    parser.StartDoctypeDeclHandler = refuse_doctype
    parser.EntityDeclHandler = refuse_doctype
    parser.StartElementHandler = start
    try:
        parser.Parse(body, True)
    except xml.parsers.expat.ExpatError as exc:
        raise RatesError(f"not XML: {exc}") from None
    if len(dates) != 1:
        raise RatesError(f"{len(dates)} Cube dates, not one")
    try:
        date = dt.date.fromisoformat(dates[0])
    except ValueError:
        raise RatesError(f"Cube time {dates[0][:20]!r} is not a date") from None
    rates: dict[str, Decimal] = {BASE: Decimal(1)}
    for currency, rate in rows:
        if minor_unit(currency) is None or currency == BASE:
            raise RatesError(f"currency {currency[:10]!r} is not an ISO 4217 code to convert")
        if currency in rates:
            raise RatesError(f"currency {currency} is listed twice")
        if not _plain_decimal(rate):
            raise RatesError(f"rate of {currency} {rate[:20]!r} is not a plain decimal")
        value = Decimal(rate)
        if not value > 0:
            raise RatesError(f"rate of {currency} is not above 0")
        rates[currency] = value
    if len(rates) == 1:
        raise RatesError("no rates")
    return RateTable(date, rates)


def _plain_decimal(text: str) -> bool:
    """A rate may have more places than a price: digits, one point, digits, at most 30 chars."""
    whole, point, fraction = text.partition(".")
    return (
        0 < len(text) <= 30
        and whole.isascii()
        and whole.isdigit()
        and (not point or (fraction.isascii() and fraction.isdigit()))
    )


class Rates:
    """The rates pricing reads: the last good table, fresh or not, and its cross rates."""

    def __init__(self, max_age: float, clock: Callable[[], float] = time.time) -> None:
        self.max_age = max_age
        """Seconds after publication a table is still fresh (``--fx-max-age``)."""
        self._clock = clock
        self.table: RateTable | None = None
        self._stale_at = 0.0
        self._crosses: dict[tuple[str, str], CrossRate | None] = {}

    def use(self, table: RateTable) -> None:
        """Price with ``table`` from now on."""
        self.table = table
        self._stale_at = table.published + self.max_age
        self._crosses = {}

    @property
    def date(self) -> str | None:
        """The table's date, as the answer names it (``rate_date``)."""
        return None if self.table is None else self.table.date.isoformat()

    def fresh(self) -> bool:
        """A table is here and younger than ``max_age`` since it was published."""
        return self.table is not None and self._clock() < self._stale_at

    def knows(self, currency: str) -> bool:
        """The table (fresh or not) lists ``currency``: a request may ask for answers in it."""
        return self.table is not None and currency in self.table.rates

    def cross(self, offered: str, answered: str) -> CrossRate | None:
        """How to convert ``offered`` minor units to ``answered``'s; None: no fresh rate."""
        if self.table is None or self._clock() >= self._stale_at:  # fresh(), inlined
            return None
        key = (offered, answered)
        try:
            return self._crosses[key]
        except KeyError:
            pass
        table = self.table
        assert table is not None
        found = None
        rate_from, rate_to = table.rates.get(offered), table.rates.get(answered)
        exp_from, exp_to = minor_unit(offered), minor_unit(answered)
        if rate_from is not None and rate_to is not None:
            assert exp_from is not None
            assert exp_to is not None
            date = table.date.isoformat()
            found = CrossRate(rate_from, rate_to, exp_from, exp_to, date)
        self._crosses[key] = found
        return found


def is_url(source: str) -> bool:
    """``--fx-rates`` names a URL (fetched and refreshed), not a file."""
    return source.startswith(("http://", "https://"))


def read_file(path: str) -> RateTable:
    """A rates file, or ``ConfigError`` in one line naming it."""
    try:
        body = pathlib.Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--fx-rates {path}: cannot be read ({exc.strerror})") from None
    try:
        return parse_ecb(body)
    except RatesError as exc:
        raise ConfigError(f"--fx-rates {path}: {exc}") from None


def check_rates_file(source: str | None) -> None:
    """At start-up: a rates file that cannot be read or parsed is one ``ConfigError`` line."""
    if source is not None and not is_url(source):
        read_file(source)


class RatesFile:
    """A rates file: read at start, re-read on ``SIGHUP`` (a ``reload.Reloadable``)."""

    name = "fx_rates"

    def __init__(self, path: str, rates: Rates) -> None:
        self.path = path
        self.rates = rates
        rates.use(read_file(path))

    def reload(self) -> None:
        """Re-read the file; ``ConfigError`` (the old table kept) if it is bad."""
        self.rates.use(read_file(self.path))


class RatesFeed:
    """A rates URL, fetched at start and every ``refresh`` seconds in the background."""

    def __init__(
        self,
        url: str,
        rates: Rates,
        *,
        refresh: float,
        timeout: float = FETCH_TIMEOUT,
        retry_first: float = RETRY_FIRST,
    ) -> None:
        self.url = url
        self.rates = rates
        self.refresh = refresh
        self.timeout = timeout
        self.retry_first = retry_first
        self.failures: dict[str, int] = {}
        """Failed fetches by reason (``timeout``, ``transport``, ``http``, ``malformed``)."""
        self.fetches = 0
        """Tables fetched and taken."""

    async def running(self, _: object = None) -> AsyncIterator[None]:
        """A ``cleanup_ctx``: the first fetch (waited for briefly), then the refresh loop."""
        session = aiohttp.ClientSession(
            # The whole fetch is bounded by asyncio.timeout in ``fetch``; these only
            # name a stalled connect or read as such (never ClientTimeout's total,
            # which can swallow a cancellation: CONTRACT.md section 8).
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.timeout, sock_read=self.timeout
            ),
            trust_env=False,
            connector=aiohttp.TCPConnector(limit=1, force_close=True),
        )
        first = asyncio.Event()
        task = asyncio.create_task(self._loop(session, first), name="fx-rates")
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(FIRST_FETCH_WAIT, self.timeout)):
                    await first.wait()
            yield
        finally:
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await session.close()

    async def _loop(self, session: aiohttp.ClientSession, first: asyncio.Event) -> None:
        wait = self.retry_first
        while True:
            ok = await self.fetch(session)
            first.set()
            if ok:
                wait = self.retry_first
                await asyncio.sleep(self.refresh)
            else:
                # Jittered, so that workers started together do not ask together.
                await asyncio.sleep(wait * random.uniform(0.8, 1.2))
                wait = min(wait * 2, self.refresh)

    async def fetch(self, session: aiohttp.ClientSession) -> bool:
        """One fetch; True if a table was taken. Every failure is logged and counted."""
        body = bytearray()
        try:
            async with asyncio.timeout(self.timeout):
                async with session.get(self.url, allow_redirects=False) as response:
                    if response.status != 200:
                        return self._failed("http", f"HTTP {response.status}")
                    async for chunk in response.content.iter_any():
                        body += chunk
                        if len(body) > MAX_FEED_BYTES:
                            return self._failed("malformed", f"over {MAX_FEED_BYTES} bytes")
        except TimeoutError:  # asyncio.timeout's, or a stalled socket's (both TimeoutError)
            return self._failed("timeout", f"no answer in {self.timeout} s")
        except aiohttp.ClientError as exc:
            return self._failed("transport", type(exc).__name__)
        try:
            table = parse_ecb(bytes(body))
        except RatesError as exc:
            return self._failed("malformed", str(exc))
        before = self.rates.table
        self.rates.use(table)
        self.fetches += 1
        # A new day's table is news; the same table fetched again is not.
        level = logging.DEBUG if before is not None and before.date == table.date else logging.INFO
        log_event(log, level, "fx_refreshed", {"date": table.date.isoformat()})
        return True

    def _failed(self, reason: str, detail: str) -> bool:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        fields = {"reason": reason, "error": detail, "kept": self.rates.date}
        log_event(log, logging.WARNING, "fx_refresh_failed", fields)
        return False
