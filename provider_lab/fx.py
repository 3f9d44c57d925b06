"""The lab's rates feed: ``GET /fx/eurofxref-daily.xml``, the European Central Bank's daily format.

Served to anyone, like the suppliers (QuoteFlow's ``--fx-rates`` fetches it)::

    <?xml version="1.0" encoding="UTF-8"?>
    <gesmes:Envelope xmlns:gesmes="http://www.gesmes.org/xml/2002-08-01" xmlns="http://www.ecb.int/vocabulary/2002-08-01/eurofxref">
    \t<gesmes:subject>Reference rates</gesmes:subject>
    \t<gesmes:Sender>
    \t\t<gesmes:name>European Central Bank</gesmes:name>
    \t</gesmes:Sender>
    \t<Cube>
    \t\t<Cube time='2026-12-04'>
    \t\t\t<Cube currency='USD' rate='1.0850'/>
    ...

EUR is the base (not listed); one ``Cube time=`` date, today's in Frankfurt
unless pinned, so the table is fresh; one ``Cube currency= rate=`` row per
currency, :data:`DEFAULT_RATES` unless changed. The control API (loopback only,
:mod:`provider_lab.control`) reads and changes it at ``/fx``: the rates (``PUT
/fx {"rates": {"USD": "0.9000"}}``, ``null`` drops a currency), the date, and a
fault that lasts until changed (:data:`FAULT_KINDS`). Every fetch is counted
(``GET /fx``'s ``fetches``; ``/stats``'s ``fx_fetches`` once there was one).

This module is plain data and the feed's handler (importing nothing else of the lab);
nothing here is simulated:
``cut`` really sends part of the promised ``Content-Length`` and closes,
``hang`` really holds the connection until the client gives up, or the lab
stops (its ``on_shutdown`` lets go, so no handler outlives it).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
from collections import Counter
from collections.abc import Mapping
from typing import Final, Literal

import attrs
from aiohttp import web

logger = logging.getLogger(__name__)

FEED_PATH: Final = "/fx/eurofxref-daily.xml"
"""Where the feed is served; exactly this path is public, anything else under ``/fx`` is not."""
XML: Final = "text/xml"
POLL_S: Final = 0.02
"""How often a ``hang`` looks whether its client left or the lab is stopping."""

DEFAULT_RATES: Final[tuple[tuple[str, str], ...]] = (
    ("USD", "1.0850"),
    ("JPY", "162.50"),
    ("CZK", "25.120"),
    ("DKK", "7.4600"),
    ("GBP", "0.85700"),
    ("HUF", "395.20"),
    ("PLN", "4.2950"),
    ("RON", "4.9750"),
    ("SEK", "11.4500"),
    ("CHF", "0.94200"),
    ("ISK", "150.10"),
    ("NOK", "11.6500"),
    ("TRY", "38.5000"),
    ("AUD", "1.6400"),
    ("BRL", "6.1200"),
    ("CAD", "1.4900"),
    ("CNY", "7.8650"),
    ("HKD", "8.4500"),
    ("IDR", "17500.00"),
    ("ILS", "4.0100"),
    ("INR", "92.150"),
    ("KRW", "1500.00"),
    ("MXN", "20.5000"),
    ("MYR", "4.8000"),
    ("NZD", "1.8000"),
    ("PHP", "62.500"),
    ("SGD", "1.4600"),
    ("THB", "37.000"),
    ("ZAR", "19.8000"),
)
"""The feed's rows unless changed: units of each currency for one euro, in the ECB's order."""

CODE: Final = re.compile(r"[A-Z]{3}")
RATE: Final = re.compile(r"(0|[1-9][0-9]{0,11})(\.[0-9]{1,10})?")
"""A rate as the control API takes it: a plain decimal string, at most 10 decimals, above 0."""
MAX_STALE_DAYS: Final = 3650
FRANKFURT_FALLBACK: Final = datetime.timezone(datetime.timedelta(hours=1), "CET")

FaultKind = Literal["stale", "malformed", "hang", "entity_bomb", "down", "cut"]
FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    "stale",
    "malformed",
    "hang",
    "entity_bomb",
    "down",
    "cut",
)
MALFORMED_VARIANTS: Final = ("rate", "truncated", "no_time", "html")
"""``malformed``'s variants: a rate that is not a number (the first row's ``rate='n/a'``);
half the document in a complete answer; the dated ``Cube`` without its ``time``; an HTML
error page with a 200."""
BOMB_LEVELS: Final = 9
"""``entity_bomb``'s nesting: ten references per level, 10**9 ``lol`` s if expanded."""


def frankfurt_today() -> datetime.date:
    """Today's date in Frankfurt (``Europe/Berlin``; UTC+1 if the time zone data is missing)."""
    try:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        zone: datetime.tzinfo = ZoneInfo("Europe/Berlin")
    except (ImportError, ZoneInfoNotFoundError):  # pragma: no cover - tzdata is there
        zone = FRANKFURT_FALLBACK
    return datetime.datetime.now(zone).date()


@attrs.frozen
class FxFault:
    """How the feed misbehaves until told otherwise (not a one-shot queue).

    ``stale``: the table dated ``days`` ago; ``malformed``: not the format (``variant``);
    ``hang``: no answer until the client goes away; ``entity_bomb``: the table behind a
    billion-laughs ``DOCTYPE``; ``down``: ``503``; ``cut``: half the promised body, then
    the connection is closed.
    """

    kind: FaultKind
    days: int = 10
    variant: str = "rate"

    def to_json(self) -> dict[str, object]:
        """The control API's form: ``{"kind": ...}``, plus the kind's parameter."""
        if self.kind == "stale":
            return {"kind": self.kind, "days": self.days}
        if self.kind == "malformed":
            return {"kind": self.kind, "variant": self.variant}
        return {"kind": self.kind}


def fault_from_json(value: object) -> FxFault | None:
    """``null`` or ``{"kind": ..., ...}``; ``ValueError`` naming the field if not one."""
    if value is None:
        return None
    if not isinstance(value, dict) or "kind" not in value:
        raise ValueError(f'fault: must be null or {{"kind": {" | ".join(FAULT_KINDS)}}}')
    kind = value["kind"]
    if kind not in FAULT_KINDS:
        raise ValueError(f"fault.kind: must be one of {', '.join(FAULT_KINDS)}")
    params = {"stale": {"days"}, "malformed": {"variant"}}.get(kind, set())
    extra = sorted(set(value) - {"kind"} - params)
    if extra:
        raise ValueError(f"fault.{extra[0]}: not a parameter of {kind}")
    days = value.get("days", 10)
    if type(days) is not int or not 1 <= days <= MAX_STALE_DAYS:
        raise ValueError(f"fault.days: must be an integer 1–{MAX_STALE_DAYS}")
    variant = value.get("variant", "rate")
    if variant not in MALFORMED_VARIANTS:
        raise ValueError(f"fault.variant: must be one of {', '.join(MALFORMED_VARIANTS)}")
    return FxFault(kind, days=days, variant=variant)


def parse_fault_spec(spec: str) -> FxFault:
    """The CLI's ``KIND[:KEY=VALUE,...]`` (``stale:days=30``, ``malformed:variant=html``)."""
    kind, _, options = spec.partition(":")
    data: dict[str, object] = {"kind": kind}
    for item in filter(None, options.split(",")):
        name, eq, text = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r}: expected KEY=VALUE")
        name = name.strip()
        data[name] = int(text) if name == "days" and text.strip().isdigit() else text.strip()
    fault = fault_from_json(data)
    assert fault is not None
    return fault


def rates_problems(value: object) -> list[str]:
    """What is wrong with a ``rates`` change: ``{"USD": "1.0850" | null, ...}``."""
    if not isinstance(value, dict):
        return ['rates: must be an object {"USD": "1.0850" or null, ...}']
    problems = []
    for code, rate in value.items():
        if not CODE.fullmatch(code) or code == "EUR":
            problems.append(f"rates.{code}: not a three-letter upper-case code other than EUR")
        elif rate is not None and (
            type(rate) is not str or not RATE.fullmatch(rate) or not float(rate) > 0
        ):
            problems.append(
                f"rates.{code}: must be null or a decimal string above 0 (at most 10 decimals)"
            )
    return problems


def parse_rate_spec(spec: str) -> tuple[str, str]:
    """The CLI's ``CODE=RATE`` (``USD=0.9000``); ``ValueError`` if it is not one."""
    code, eq, rate = spec.partition("=")
    problems = rates_problems({code.strip(): rate.strip()}) if eq else ["expected CODE=RATE"]
    if problems:
        raise ValueError(f"{spec!r}: {problems[0]}")
    return code.strip(), rate.strip()


def render(date: datetime.date, rates: Mapping[str, str]) -> bytes:
    """The ECB's daily document for ``date`` with ``rates`` (units per euro), byte for byte."""
    rows = "".join(
        f"\t\t\t<Cube currency='{code}' rate='{rate}'/>\n" for code, rate in rates.items()
    )
    return _document(f"\t\t<Cube time='{date.isoformat()}'>\n{rows}\t\t</Cube>\n").encode()


def _document(cube: str, *, doctype: str = "", subject: str = "Reference rates") -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"{doctype}"
        '<gesmes:Envelope xmlns:gesmes="http://www.gesmes.org/xml/2002-08-01" '
        'xmlns="http://www.ecb.int/vocabulary/2002-08-01/eurofxref">\n'
        f"\t<gesmes:subject>{subject}</gesmes:subject>\n"
        "\t<gesmes:Sender>\n"
        "\t\t<gesmes:name>European Central Bank</gesmes:name>\n"
        "\t</gesmes:Sender>\n"
        f"\t<Cube>\n{cube}\t</Cube>\n"
        "</gesmes:Envelope>\n"
    )


def entity_bomb(date: datetime.date, rates: Mapping[str, str]) -> bytes:
    """The table behind a billion-laughs ``DOCTYPE``: ``lol9`` expands to 10**9 ``lol`` s.

    The subject refers to ``&lol9;``: a parser that expands entities builds gigabytes; one
    that refuses entity declarations (as QuoteFlow's must) rejects the document.
    """
    lines = ['<!DOCTYPE gesmes:Envelope [\n <!ENTITY lol "lol">\n']
    previous = "lol"
    for level in range(1, BOMB_LEVELS + 1):
        name = f"lol{level}"
        lines.append(f' <!ENTITY {name} "{f"&{previous};" * 10}">\n')
        previous = name
    lines.append("]>\n")
    table = render(date, rates).decode()
    cube = table.split("\t<Cube>\n", 1)[1].rsplit("\t</Cube>\n", 1)[0]
    return _document(cube, doctype="".join(lines), subject=f"&{previous};").encode()


class FxFeed:
    """The feed's table, its fault, and how often it was fetched; one per lab."""

    def __init__(
        self,
        rates: Mapping[str, str] | None = None,
        date: datetime.date | None = None,
        fault: FxFault | None = None,
    ) -> None:
        self.rates: dict[str, str] = dict(DEFAULT_RATES if rates is None else rates)
        self.date = date
        """The table's date; ``None``: today's in Frankfurt, whenever it is fetched."""
        self.fault = fault
        self.active = 0
        """Fetches being answered now (a ``hang`` holds one until the client leaves)."""
        self.stopping = False
        """Set when the lab shuts down: a ``hang`` lets go."""
        self.zero()

    def zero(self) -> None:
        """Zero the fetch counts (``POST /reset``)."""
        self.fetches = 0
        self.answers: Counter[str] = Counter()

    def defaults(self) -> None:
        """The default rates, today's date, no fault (``DELETE /fx``); counts stay."""
        self.rates = dict(DEFAULT_RATES)
        self.date = None
        self.fault = None

    def change_rates(self, changes: Mapping[str, str | None]) -> None:
        """Set each rate given (validated by :func:`rates_problems`); ``None`` drops one."""
        for code, rate in changes.items():
            if rate is None:
                self.rates.pop(code, None)
            else:
                self.rates[code] = rate

    def table_date(self) -> datetime.date:
        """The date the feed shows now (a ``stale`` fault's aside)."""
        return self.date or frankfurt_today()

    def to_json(self) -> dict[str, object]:
        """The body of ``GET /fx``."""
        return {
            "path": FEED_PATH,
            "date": self.table_date().isoformat(),
            "pinned_date": None if self.date is None else self.date.isoformat(),
            "rates": dict(self.rates),
            "fault": None if self.fault is None else self.fault.to_json(),
            "fetches": self.fetches,
            "answers": dict(self.answers),
            "active": self.active,
        }


FX: Final = web.AppKey("provider_lab.fx", FxFeed)
"""Where the application keeps its feed (also ``LabState.fx``)."""


async def feed(request: web.Request) -> web.StreamResponse:
    """``GET /fx/eurofxref-daily.xml``: today's table, or what the feed's fault makes of it."""
    fx = request.app[FX]
    fx.fetches += 1
    fx.active += 1
    fault = fx.fault
    what = "ok" if fault is None else fault.kind
    fx.answers[what] += 1
    try:
        if fault is not None:
            logger.info("fx_fault_served kind=%s", fault.kind)
        return await _answer(request, fx, fault)
    finally:
        fx.active -= 1


async def _answer(request: web.Request, fx: FxFeed, fault: FxFault | None) -> web.StreamResponse:
    date = fx.table_date()
    if fault is None:
        return web.Response(body=render(date, fx.rates), content_type=XML)
    match fault.kind:
        case "stale":
            stale = date - datetime.timedelta(days=fault.days)
            return web.Response(body=render(stale, fx.rates), content_type=XML)
        case "malformed":
            return _malformed(fault.variant, render(date, fx.rates))
        case "entity_bomb":
            return web.Response(body=entity_bomb(date, fx.rates), content_type=XML)
        case "down":
            return web.Response(status=503, text="Service Unavailable", content_type="text/plain")
        case "hang":
            return await _hang(request, fx)
        case "cut":
            return await _cut(request, render(date, fx.rates))
    raise AssertionError(fault.kind)  # pragma: no cover - every kind is above


async def _hang(request: web.Request, fx: FxFeed) -> web.StreamResponse:
    """Nothing until the client leaves, or the lab stops (then the connection is closed).

    aiohttp's shutdown waits for running handlers before it closes their connections, so
    the lab's own ``on_shutdown`` (:func:`stopping`) is what ends a hang when it stops.
    """
    while True:
        transport = request.transport
        if transport is None or transport.is_closing() or fx.stopping:
            break
        await asyncio.sleep(POLL_S)
    transport = request.transport
    if transport is not None:
        transport.close()
    return web.StreamResponse(status=499)  # never sent: the connection is gone


async def stopping(app: web.Application) -> None:
    """``on_shutdown``: a hanging fetch ends now, before aiohttp waits for its handler."""
    app[FX].stopping = True


def _malformed(variant: str, document: bytes) -> web.Response:
    match variant:
        case "rate":
            body = re.sub(rb"rate='[^']*'", b"rate='n/a'", document, count=1)
        case "truncated":
            body = document[: len(document) // 2]
        case "no_time":
            body = re.sub(rb" time='[^']*'", b"", document, count=1)
        case _:
            body = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            return web.Response(body=body, content_type="text/html")
    return web.Response(body=body, content_type=XML)


async def _cut(request: web.Request, document: bytes) -> web.StreamResponse:
    """The whole ``Content-Length`` promised, half the document sent, then a close (FIN)."""
    response = web.StreamResponse()
    response.content_type = XML
    response.content_length = len(document)
    try:
        await response.prepare(request)
        await response.write(document[: len(document) // 2])
    except ConnectionError:
        return response
    transport = request.transport
    if transport is not None:
        transport.close()
    return response
