"""``make demo``: every scenario and a tour of injected faults, against a running pair.

For each case: clear the lab, switch the case's faults on, ask QuoteFlow once,
and read from the lab's ``/stats`` how many requests each supplier received
with that request's id. One table row per case, with the line saying what it
shows, and a check of the failure codes and attempt counts the contract
expects. Exit code 1 if any case did not behave as expected.

The suppliers are the ones QuoteFlow's OpenAPI document names: atlas, boreal
and cedar get the lesson's tour; any other catalogue (the lab started with the
same file) gets a tour of its own, built from its names (``catalogue_cases``).

For atlas, boreal and cedar, then come the cases of coalescing and the quote
cache, when QuoteFlow runs with them (``make run`` does): each sends several
requests and shows one. Last, against a second QuoteFlow asking the same lab's
foreign dialects (``--dialects``; ``make run`` starts it with docs/suppliers.md's
three worked suppliers): boreal's price breaks at quantity 1 and 10, a 401
then success, tokens expiring mid-run, and the token endpoint down and back.

Then carts (``POST /api/carts``): 50 lines through the first QuoteFlow, a call
per line and supplier; then, against a third QuoteFlow asking the same lab's
suppliers in its batch dialect (``--batch``; ``make run`` starts it, 20 lines
a call), the same cart in a few calls, a malformed entry in one of atlas's
calls (that line alone fails), a batch call of boreal's that 503s once (retried
with the cart's request id), a basket that beats each line's best by paying
each supplier's shipping once, a line out of stock everywhere bought as its
approved alternate, and a bill of materials as a file: a KiCad-style
CSV export posted as ``text/csv`` (its refs kept, its DNP and fiducial rows
skipped, its other columns listed), then the same file asked with
``?format=csv``, read with the ``csv`` module and its amounts summed to the
JSON basket's total.

Last, offers as suppliers quote them, each checked against the lab's price lists
by docs/api.md's money rule: through the worked suppliers' QuoteFlow (boreal in
EUR) a ranking that flips when the lab's rates feed changes the USD rate; through
the batch one (else the first) a need of 7 bought as 10, a price break that makes
100 cheaper than 90 and a cart line of a 5000-reel at a fifth of a cent each;
then the rates feed down (QuoteFlow keeps its last good table: the answers do not
change), stale (``no_rate``) and fixed (quoted again). ``make run``'s QuoteFlows
fetch the feed every second; before a case asserts what a feed change does, the demo
waits (a bounded while) until that QuoteFlow has taken it: its answer's rate, or
its ``/metrics`` (``quoteflow_fx_rates_fresh``, ``quoteflow_fx_refresh_failures``).

Between the cache cases and the worked suppliers' comes hedging, against a
QuoteFlow hedging boreal (``--hedged``; ``make run`` starts one with
``--hedge``): boreal's answers get a lognormal tail, a warm-up lets QuoteFlow
learn boreal's answer times, and the banner's request is asked (bounded) until
its bill shows a hedged call: a second attempt sent while the first was late,
the winner, the loser cancelled. Not given (or not hedging), the case is left
out, saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import datetime as dt
import io
import itertools
import json
import math
import re
import secrets
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation, localcontext
from pathlib import Path
from typing import Any, Final

import aiohttp
import attrs

from provider_lab.catalogue import (
    SUPPLIERS,
    PriceList,
    break_price,
    lookup,
    price_breaks,
    price_list,
)
from provider_lab.control_client import LabControl, LabError
from provider_lab.dialects import CURRENCY as JSON_CURRENCY
from provider_lab.run_pair import BOREAL_TAIL, CART_QUANTITY, CART_SKUS

Fault = Mapping[str, object]

CACHE_SKU: Final = "MN-270"
"""The cache cases' SKU: no other case asks for it, so no quote they leave cached is met."""


@attrs.frozen
class Case:
    """One demo request: what is switched on, what is asked, what the contract expects."""

    name: str
    shows: str
    request: Mapping[str, object] = attrs.field(factory=dict)
    faults: Sequence[tuple[str, Fault]] = ()
    best: str | None = "boreal"
    failures: Mapping[str, str] = attrs.field(factory=dict)
    attempts: Mapping[str, int] | None = attrs.field(factory=lambda: {"boreal": 1})
    """Expected requests per supplier (only those named are checked; None: not checked)."""
    retries: tuple[str, ...] = ()
    """Suppliers whose expected outcome needs a retry to be allowed (beyond ``attempts``)."""
    until_s: float = 0.0
    """Keep asking (faults on) until the answer is the expected one, for up to this long.

    For the circuit breaker's cases, whose point is what happens across requests.
    """
    focus: str = "boreal"
    """The supplier whose ``stopped`` the table shows."""
    prices: Mapping[str, int | str] | None = None
    """Expected unit price of each quote; exactly these suppliers quote (None: not checked).

    An integer: the quote's ``unit_cents`` (a quote as today); ``"EUR 9.90"``: the currency
    and unit price of its ``offer`` (another currency, or a price in fractions of a cent)."""

    def needs_retry(self) -> list[str]:
        """Suppliers that must have a retry in QuoteFlow's retry budget for this case."""
        expected = [s for s, n in (self.attempts or {}).items() if n > 1]
        return sorted({*expected, *self.retries})


def boreal(kind: str, count: int | None = None, **params: object) -> Sequence[tuple[str, Fault]]:
    """One fault on boreal."""
    return [("boreal", {"kind": kind, "count": count, **params})]


def bad_data(name: str, shows: str, kind: str, **params: object) -> Case:
    """Boreal answers 200 with a body that is not a valid quote."""
    return Case(
        name,
        shows,
        faults=[("boreal", {"kind": kind, **params})],
        best="atlas",
        failures={"boreal": "invalid_data"},
    )


CASES: Final[Sequence[Case]] = (
    Case(
        "normal",
        "boreal is cheapest at quantity 2 (2450); cedar has 1 in stock: filtered out, no failure",
        attempts={"atlas": 1, "boreal": 1, "cedar": 1},
    ),
    Case(
        "normal, quantity 1",
        "at quantity 1 cedar is cheapest (1100): stock decides, not an error code",
        request={"quantity": 1},
        best="cedar",
    ),
    Case(
        "scenario slow",
        "boreal takes 2 s: it becomes timeout, the others are kept, the reply comes on budget",
        request={"scenario": "slow"},
        best="atlas",
        failures={"boreal": "timeout"},
        attempts=None,
        retries=("boreal",),
    ),
    Case(
        "scenario broken",
        "503 is the status worth retrying: two attempts, then http_503 stands",
        request={"scenario": "broken"},
        best="atlas",
        failures={"boreal": "http_503"},
        attempts={"boreal": 2},
    ),
    Case(
        "scenario malformed",
        'unit_cents came as the string "1100": invalid_data, and bad data is never retried',
        request={"scenario": "malformed"},
        best="atlas",
        failures={"boreal": "invalid_data"},
    ),
    Case(
        "scenario flaky",
        "boreal recovered on its second attempt, same request id",
        request={"scenario": "flaky"},
        attempts={"boreal": 2},
    ),
    Case(
        "http_404",
        "a 404 will not change on a retry: one attempt",
        faults=boreal("http_404"),
        best="atlas",
        failures={"boreal": "http_404"},
    ),
    Case(
        "http_429 Retry-After: 1",
        "429 is final inside the budget: one attempt; its Retry-After pauses boreal for 1 s"
        " for every request (rate_limited at once, boreal not asked), waited out here",
        faults=boreal("http_429", retry_after=1),
        best="atlas",
        failures={"boreal": "http_429"},
    ),
    Case(
        "http_500",
        "a 500 is not retried: one attempt",
        faults=boreal("http_500"),
        best="atlas",
        failures={"boreal": "http_500"},
    ),
    Case(
        "http_503 once",
        "one 503, then the quote: the single retry paid off",
        faults=boreal("http_503", count=1),
        attempts={"boreal": 2},
    ),
    Case(
        "http_503 always, 300 KB bodies",
        "503 twice with bodies past the read buffer: http_503, and no connection is leaked",
        faults=boreal("http_503", size=300_000),
        best="atlas",
        failures={"boreal": "http_503"},
        attempts={"boreal": 2},
    ),
    Case(
        "http_status 302",
        "redirects are not followed: http_302, one attempt",
        faults=boreal("http_status", status=302),
        best="atlas",
        failures={"boreal": "http_302"},
    ),
    Case(
        "truncated once",
        "body cut short (Content-Length unmet): transport error, retried, second attempt good",
        faults=boreal("truncated", count=1),
        attempts={"boreal": 2},
    ),
    Case(
        "reset once",
        "TCP reset: transient, retried once, then the quote",
        faults=boreal("reset", count=1),
        attempts={"boreal": 2},
    ),
    Case(
        "close once",
        "connection closed with no answer: retried once, then the quote",
        faults=boreal("close", count=1),
        attempts={"boreal": 2},
    ),
    Case(
        "close always",
        "every connection dropped: boreal saw exactly 2 requests (aiohttp's own re-send is off)",
        faults=boreal("close"),
        best="atlas",
        failures={"boreal": "transport_error"},
        attempts={"boreal": 2},
    ),
    Case(
        "hang",
        "boreal never answers: timeout at the budget, the other quotes are kept",
        faults=boreal("hang"),
        best="atlas",
        failures={"boreal": "timeout"},
        attempts=None,
        retries=("boreal",),
    ),
    Case(
        "latency 300 ms",
        "slow but within the budget: simply waited for",
        faults=boreal("latency", ms=300),
    ),
    Case(
        "wrong_content_type",
        "a valid quote labelled text/plain is still a valid quote",
        faults=boreal("wrong_content_type"),
    ),
    bad_data(
        "bad_gzip",
        "gzip that does not decode is bad data, not a transport failure: no retry",
        "bad_gzip",
    ),
    bad_data("not_http", "a reply that is not HTTP: invalid_data, never http_400", "not_http"),
    bad_data("not_json (html)", "an HTML error page with status 200: invalid_data", "not_json"),
    bad_data(
        'wrong_types "stock": "50"',
        'a string where an integer belongs ("50"): no lenient conversion',
        "wrong_types",
    ),
    bad_data(
        "wrong_types unit_cents: true",
        "true is not an integer, although Python's int(True) is 1",
        "wrong_types",
        field="unit_cents",
        variant="bool",
    ),
    bad_data(
        "wrong_types unit_cents: 1100.5",
        "a float is not an integer, and is not truncated to one",
        "wrong_types",
        field="unit_cents",
        variant="float",
    ),
    bad_data("negative unit_cents", "negative money is refused", "negative"),
    bad_data(
        "extra_key",
        'an unexpected "warehouse": "FRA-2" key is refused, not dropped',
        "extra_key",
    ),
    bad_data("missing_key stock", "a quote without stock is incomplete", "missing_key"),
    bad_data(
        "duplicate_key unit_cents",
        "a repeated key (second value 1) would silently win in plain json.loads: refused",
        "duplicate_key",
    ),
    bad_data("wrong_supplier", "boreal's answer naming cedar is refused", "wrong_supplier"),
    bad_data("wrong_sku", "an answer for another SKU is refused", "wrong_sku"),
    bad_data(
        "oversized 10 MB",
        "a 10 MB body is refused at the size cap, not read into memory",
        "oversized",
    ),
    bad_data(
        "gzip_bomb 50 MB",
        "50 KB of valid gzip inflating to 50 MB: the decoded-size cap stops it early",
        "gzip_bomb",
    ),
    Case(
        "503, then bad data",
        "after a retry, the last attempt's code stands: invalid_data, and no third attempt",
        faults=[
            ("boreal", {"kind": "http_503", "count": 1}),
            ("boreal", {"kind": "wrong_types", "count": 1}),
        ],
        best="atlas",
        failures={"boreal": "invalid_data"},
        attempts={"boreal": 2},
    ),
    Case(
        'SKU "A&scenario=broken"',
        "the SKU reaches every supplier literally (404), no scenario smuggled in",
        request={"sku": "A&scenario=broken"},
        best=None,
        failures={s: "http_404" for s in SUPPLIERS},
        attempts={s: 1 for s in SUPPLIERS},
    ),
)


def _cheapest(names: Sequence[str], quantity: int = 2, sku: str = "KB-001") -> str | None:
    """Who the lab's offers make best at ``quantity`` (what QuoteFlow must answer)."""
    totals = []
    for name in names:
        offer = lookup(name, sku)
        if offer is not None and offer.stock >= quantity:
            totals.append((offer.unit_cents * quantity + offer.shipping_cents, name))
    return min(totals)[1] if totals else None


def catalogue_cases(names: Sequence[str]) -> list[Case]:
    """A tour for any catalogue the lab serves: the same lessons, per supplier."""
    everyone = dict.fromkeys(names, 1)
    first, last = names[0], names[-1]
    others = [name for name in names if name != first]
    cases = [
        Case(
            "normal",
            f"{len(names)} suppliers asked at once, each once; the cheapest at quantity 2 wins",
            best=_cheapest(names),
            attempts=everyone,
            focus=first,
        )
    ]
    for name in names:
        cases.append(
            Case(
                f"{name}: 503 once",
                f"{name} recovers on its second attempt; nobody else waits for its retry",
                faults=[(name, {"kind": "http_503", "count": 1})],
                best=_cheapest(names),
                attempts={**everyone, name: 2},
                focus=name,
            )
        )
    cases += [
        Case(
            f"{first}: http_404",
            "a 404 is an answer about the SKU: never retried",
            faults=[(first, {"kind": "http_404"})],
            best=_cheapest(others),
            failures={first: "http_404"},
            attempts={first: 1},
            focus=first,
        ),
        Case(
            f"{last}: wrong_types",
            "a string where an integer belongs: invalid_data, never retried",
            faults=[(last, {"kind": "wrong_types"})],
            best=_cheapest([n for n in names if n != last]),
            failures={last: "invalid_data"},
            attempts={last: 1},
            focus=last,
        ),
        Case(
            'SKU "A&scenario=broken"',
            "the SKU reaches every supplier literally (404), no scenario smuggled in",
            request={"sku": "A&scenario=broken"},
            best=None,
            failures=dict.fromkeys(names, "http_404"),
            attempts=everyone,
            focus=first,
        ),
    ]
    return cases


async def supplier_names(session: aiohttp.ClientSession, service_url: str) -> tuple[str, ...]:
    """The suppliers QuoteFlow asks, in order, as its OpenAPI document names them."""
    async with session.get(f"{service_url}/openapi.json") as response:
        document: dict[str, Any] = await response.json()
    return tuple(document["components"]["schemas"]["Supplier"]["enum"])


BREAKER_CASES: Final[Sequence[Case]] = (
    Case(
        "broken, again and again",
        "after failures in a row (5 by default) boreal's circuit opens: it is not asked at "
        "all, and the answer comes as soon as atlas and cedar are done",
        request={"scenario": "broken"},
        best="atlas",
        failures={"boreal": "circuit_open"},
        attempts={"boreal": 0},
        until_s=10.0,
    ),
    Case(
        "circuit open, then a probe",
        "once the open time (1 s at first) has passed, one request probes boreal; its quote "
        "closes the circuit and boreal is back",
        attempts={"boreal": 1},
        until_s=15.0,
    ),
)
"""Shown last, when QuoteFlow's breaker is on: they leave boreal's circuit closed again."""


# Why QuoteFlow may send fewer attempts than the decision table allows, on purpose:
# a retry budget drained by earlier failures of this supplier in the same process,
# or too little time left for a useful second attempt.
THROTTLED: Final = {
    "retry_budget": "the retry budget (drained by earlier failures in this process) "
    "refused the second attempt; restart `make run` to refill it",
    "no_time": "too little budget was left for a useful second attempt",
    "retry_after": "the supplier's Retry-After did not fit in the budget",
}


@attrs.frozen
class Outcome:
    """What one case produced and whether it matched the expectation."""

    case: Case
    best: str | None
    failures: dict[str, str]
    attempts: dict[str, int]
    stopped: str
    elapsed_ms: float
    problems: list[str]
    notes: list[str] = attrs.field(factory=list)


TOKENS_METRIC: Final = "quoteflow_retry_budget_tokens"


async def retry_tokens(
    session: aiohttp.ClientSession, service_url: str, supplier: str
) -> float | None:
    """``supplier``'s retry budget from QuoteFlow's ``/metrics``, if it publishes one."""
    async with session.get(f"{service_url}/metrics") as response:
        if response.status != 200:
            return None
        text = await response.text()
    prefix = f'{TOKENS_METRIC}{{supplier="{supplier}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


async def wait_unpaused(
    session: aiohttp.ClientSession, service_url: str, within_s: float = 65.0
) -> None:
    """Until QuoteFlow pauses no supplier: a 429 with Retry-After pauses one until then."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while loop.time() < end:
        async with session.get(f"{service_url}/metrics") as response:
            text = await response.text()
        if not any(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("quoteflow_supplier_pause_seconds{")
        ):
            return
        await asyncio.sleep(0.05)


async def earn_a_retry(session: aiohttp.ClientSession, service_url: str, supplier: str) -> str:
    """If ``supplier``'s retry budget is under one retry, earn one back with normal requests.

    QuoteFlow's retry budget is drained by retries that fail (earlier demo runs
    in the same process do that) and refilled a little by every request; a case
    that shows a retry needs one retry in the bucket. Returns a note, or "".
    """
    before = await retry_tokens(session, service_url, supplier)
    if before is None or before >= 1:
        return ""
    sent = 0
    tokens: float | None = before
    while tokens is not None and tokens < 1 and sent < 200:
        async with session.post(f"{service_url}/api/quotes", json={}) as response:
            await response.read()
        sent += 1
        tokens = await retry_tokens(session, service_url, supplier)
    return (
        f"{supplier}'s retry budget was down to {before:.2f} (failed retries of earlier runs); "
        f"{sent} ordinary requests earned one retry back first"
    )


async def breaker_on(session: aiohttp.ClientSession, service_url: str) -> bool:
    """Whether QuoteFlow runs a circuit breaker (it then exports each circuit's state)."""
    async with session.get(f"{service_url}/metrics") as response:
        return response.status == 200 and "quoteflow_circuit_state{" in await response.text()


SVG_NS: Final = "{http://www.w3.org/2000/svg}"
SVG_QUOTE_NUMBERS: Final = (
    "unit_cents",
    "line_cents",
    "buy_quantity",
    "shipping_cents",
    "stock",
    "total_cents",
)
"""A quote's integers in its drawing (``unit_cents``, ``line_cents`` and ``buy_quantity``
only where the answer has them)."""
SVG_OFFER: Final = (
    ("currency", "data-offer-currency"),
    ("unit_price", "data-offer-unit-price"),
    ("shipping", "data-offer-shipping"),
    ("rate", "data-rate"),
    ("rate_date", "data-rate-date"),
)
"""A converted or decimal-priced quote's ``offer``, as its drawing carries it."""


def answer_from_svg(drawing: str) -> dict[str, Any]:
    """The parts of a quote's answer the demo checks, read back from its waterfall.

    ``?explain=svg`` draws the answer with every value a tool needs as ``data-*``
    attributes (docs/api.md): the request id, the time, each supplier's
    ``stopped``, the quotes and the failures. Read from the picture itself, so
    the case checked is the case drawn, and the lab still shares no code with
    QuoteFlow.
    """
    root = ET.fromstring(drawing)
    quotes: list[dict[str, Any]] = []
    best = None
    failures = []
    suppliers: dict[str, dict[str, Any]] = {}
    for element in root.iter():
        found = element.attrib
        if element.tag == f"{SVG_NS}g" and "data-supplier" in found:
            suppliers[found["data-supplier"]] = {"stopped": found["data-stopped"]}
        elif "data-quote-supplier" in found:
            quote: dict[str, Any] = {
                "supplier": found["data-quote-supplier"],
                "sku": found["data-sku"],
            }
            for key in SVG_QUOTE_NUMBERS:
                if (value := found.get("data-" + key.replace("_", "-"))) is not None:
                    quote[key] = int(value)
            offer = {key: found[name] for key, name in SVG_OFFER if name in found}
            if offer:
                quote["offer"] = offer
            quotes.append(quote)
            if found.get("data-best") == "true":
                best = quote
        elif "data-failure-supplier" in found:
            failures.append(
                {"supplier": found["data-failure-supplier"], "code": found["data-code"]}
            )
    return {
        "request_id": root.attrib["data-request-id"],
        "elapsed_ms": float(root.attrib["data-elapsed-ms"]),
        "quotes": quotes,
        "best": best,
        "failures": failures,
        "explain": {"suppliers": suppliers},
    }


def svg_name(case: Case) -> str:
    """The file a case's waterfall is written to: its name, lower-case, dashes."""
    return re.sub(r"[^a-z0-9]+", "-", case.name.lower()).strip("-") + ".svg"


async def run_case(
    session: aiohttp.ClientSession,
    lab: LabControl,
    service_url: str,
    case: Case,
    suppliers: tuple[str, ...] = SUPPLIERS,
    svg: Path | None = None,
) -> Outcome:
    """Set the lab up for ``case``, ask QuoteFlow once, and compare with the expectation.

    ``svg``: a folder; the answer is asked for drawn (``?explain=svg``), checked from
    the drawing's attributes, and the drawing written there as ``svg_name(case)``.
    """
    await lab.fresh()
    await wait_unpaused(session, service_url)
    notes = []
    for supplier in case.needs_retry():
        if note := await earn_a_retry(session, service_url, supplier):
            notes.append(note)
            await lab.fresh()
    if not case.until_s:
        # One clean answer first: the failures of earlier cases must not add
        # up to a streak that opens boreal's circuit in the middle of the tour.
        async with session.post(f"{service_url}/api/quotes", json={}) as response:
            await response.read()
        await lab.fresh()
    for supplier, fault in case.faults:
        await lab.add_fault(supplier, fault)
    url = f"{service_url}/api/quotes?explain={'1' if svg is None else 'svg'}"
    loop = asyncio.get_running_loop()
    give_up = loop.time() + case.until_s
    drawing = ""
    while True:
        async with session.post(url, json=dict(case.request)) as response:
            status = response.status
            if svg is not None and status == 200:
                drawing = await response.text()
                result: dict[str, Any] = answer_from_svg(drawing)
            else:
                result = await response.json()
        failures = {f["supplier"]: f["code"] for f in result.get("failures", ())}
        best = result["best"]["supplier"] if result.get("best") else None
        expected = best == case.best and failures == dict(case.failures)
        if status != 200 or expected or loop.time() >= give_up:
            break
        await asyncio.sleep(0.1)
    await lab.clear_faults()
    if status != 200:
        return Outcome(case, None, {}, {}, "-", 0.0, [f"QuoteFlow answered {status}: {result}"])
    if svg is not None:
        (svg / svg_name(case)).write_text(drawing, encoding="utf-8")
    bill = result.get("explain", {}).get("suppliers", {})
    stopped = {s: str(bill.get(s, {}).get("stopped", "?")) for s in suppliers}
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"], suppliers)
    problems = []
    if best != case.best:
        problems.append(f"best {best}, expected {case.best}")
    if failures != dict(case.failures):
        problems.append(f"failures {failures}, expected {dict(case.failures)}")
    for supplier, expected in (case.attempts or {}).items():
        if attempts[supplier] == expected:
            continue
        if attempts[supplier] < expected and stopped[supplier] in THROTTLED:
            notes.append(f"{supplier}: {THROTTLED[stopped[supplier]]}")
        else:
            problems.append(f"{supplier} got {attempts[supplier]} requests, expected {expected}")
    problems += _price_problems(case, result)
    return Outcome(
        case,
        best,
        failures,
        attempts,
        stopped[case.focus],
        float(result["elapsed_ms"]),
        problems,
        notes,
    )


def _unit_price(quote: Mapping[str, Any]) -> int | str:
    """A quote's unit price as ``Case.prices`` has it: ``unit_cents``, else ``"EUR 9.90"``."""
    if "unit_cents" in quote:
        cents: int = quote["unit_cents"]
        return cents
    offer = quote.get("offer", {})
    return f"{offer.get('currency')} {offer.get('unit_price')}"


def _same_price(quoted: int | str, expected: int | str) -> bool:
    """Equal prices: the same cents, or the same currency and decimal (``9.9`` is ``9.90``)."""
    if isinstance(quoted, int) or isinstance(expected, int):
        return quoted == expected
    (currency, price), (wanted, at) = quoted.split(" ", 1), expected.split(" ", 1)
    try:
        return currency == wanted and Decimal(price) == Decimal(at)
    except InvalidOperation:
        return False


def _price_problems(case: Case, result: dict[str, Any]) -> list[str]:
    """How ``result``'s quotes differ from the unit prices ``case`` expects."""
    if case.prices is None:
        return []
    quoted = {quote["supplier"]: _unit_price(quote) for quote in result.get("quotes", ())}
    expected = dict(case.prices)
    if quoted.keys() == expected.keys() and all(
        _same_price(price, expected[supplier]) for supplier, price in quoted.items()
    ):
        return []
    return [f"prices {quoted}, expected {expected}"]


COLUMNS: Final = ("case", "best", "failures", "attempts a/b/c", "boreal stopped", "ms", "")
CATALOGUE_COLUMNS: Final = ("case", "best", "failures", "attempts", "stopped", "ms", "")
WIDTHS: Final = (31, 7, 24, 14, 18, 6, 2)
RIGHT: Final = 5  # the ms column


def _row(cells: Sequence[str]) -> str:
    return "  ".join(
        cell.rjust(width) if i == RIGHT else cell.ljust(width)
        for i, (cell, width) in enumerate(zip(cells, WIDTHS, strict=True))
    ).rstrip()


def format_outcome(outcome: Outcome, suppliers: tuple[str, ...] = SUPPLIERS) -> list[str]:
    """The table row and the line explaining it (plus any mismatch)."""
    codes = set(outcome.failures.values())
    if len(outcome.failures) == len(suppliers) and len(codes) == 1:
        failures = f"all: {codes.pop()}"
    else:
        failures = ", ".join(f"{s}:{c}" for s, c in outcome.failures.items()) or "-"
    attempts = "/".join(str(outcome.attempts.get(s, 0)) for s in suppliers)
    mark = "ok" if not outcome.problems else "!!"
    lines = [
        _row(
            [
                outcome.case.name,
                outcome.best or "-",
                failures,
                attempts,
                outcome.stopped,
                f"{outcome.elapsed_ms:.1f}",
                mark,
            ]
        ),
        f"    {outcome.case.shows}",
    ]
    lines += [f"    note: {note}" for note in outcome.notes]
    lines += [f"    !! {problem}" for problem in outcome.problems]
    return lines


# -- coalescing and the quote cache: cases of several requests each ---------------------

SharingRun = Callable[[aiohttp.ClientSession, LabControl, str], Awaitable[Outcome]]


async def _explained(
    session: aiohttp.ClientSession, service_url: str, request_id: str, **body: object
) -> dict[str, Any]:
    """One request with its budget bill, under ``request_id``."""
    async with session.post(
        f"{service_url}/api/quotes?explain=1", json=body, headers={"X-Request-ID": request_id}
    ) as response:
        result: dict[str, Any] = await response.json()
        if response.status != 200:
            raise LabError(f"QuoteFlow answered {response.status}: {result}")
        return result


async def _after(seconds: float, asked: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    await asyncio.sleep(seconds)
    return await asked


def _row_of(
    case: Case,
    result: dict[str, Any],
    attempts: dict[str, int],
    problems: list[str],
    notes: Sequence[str] = (),
) -> Outcome:
    """The table row of one of ``result``'s requests, checked against ``case``."""
    failures = {f["supplier"]: f["code"] for f in result["failures"]}
    best = result["best"]["supplier"] if result["best"] else None
    if best != case.best:
        problems.append(f"best {best}, expected {case.best}")
    if failures != dict(case.failures):
        problems.append(f"failures {failures}, expected {dict(case.failures)}")
    for supplier, expected in (case.attempts or {}).items():
        if attempts[supplier] != expected:
            problems.append(f"{supplier} got {attempts[supplier]} requests, expected {expected}")
    problems += _price_problems(case, result)
    stopped = str(result["explain"]["suppliers"]["boreal"]["stopped"])
    return Outcome(
        case, best, failures, attempts, stopped, float(result["elapsed_ms"]), problems, list(notes)
    )


def _boreal_bill(result: dict[str, Any]) -> dict[str, Any]:
    bill: dict[str, Any] = result["explain"]["suppliers"]["boreal"]
    return bill


JOINED: Final = Case(
    "coalesce: a joined call",
    "sent 50 ms after an identical one (300 ms suppliers): it joined that call, sent nothing "
    "of its own, and got the same full answer",
    attempts={s: 0 for s in SUPPLIERS},
)


async def joined_call(session: aiohttp.ClientSession, lab: LabControl, service_url: str) -> Outcome:
    """Two identical requests 50 ms apart: the second joins the first one's supplier calls."""
    await lab.fresh()
    await lab.set_latency(300)
    tag = secrets.token_hex(3)
    first, second = await asyncio.gather(
        _explained(session, service_url, f"first-{tag}"),
        _after(0.05, _explained(session, service_url, f"second-{tag}")),
    )
    await lab.wait_idle()
    problems = []
    if (sent := await lab.attempts(first["request_id"])) != {s: 1 for s in SUPPLIERS}:
        problems.append(f"the first request's calls reached the suppliers {sent} times")
    if (joined := _boreal_bill(second).get("joined")) != first["request_id"]:
        problems.append(f"boreal's bill says joined {joined!r}, not {first['request_id']!r}")
    if second["quotes"] != first["quotes"]:
        problems.append("the two answers differ")
    return _row_of(JOINED, second, await lab.attempts(second["request_id"]), problems)


LEFT_AT_DEADLINE: Final = Case(
    "coalesce: a joiner leaves",
    "boreal's 503 came late; the retry, planned on a later joiner's deadline, came after "
    "the starter's and this joiner's: each is timeout at its own, the later one got the quote",
    best="atlas",
    failures={"boreal": "timeout"},
    attempts={s: 0 for s in SUPPLIERS},
)


async def joiner_leaving(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> Outcome:
    """Three identical requests; boreal's retry outlives the first two deadlines, not the third.

    Every supplier answers after 55 % of the budget; boreal's first answer is
    a 503. The starter (deadline 1.0 budget) and a joiner sent at 0.05
    budget (deadline 1.05) are gone when the retry's quote comes, at about
    1.15; a joiner sent at 0.5 budget (deadline 1.5) gets it.
    """
    await lab.fresh()
    tag = secrets.token_hex(3)
    probe = await _explained(session, service_url, f"budget-{tag}")
    budget = float(probe["explain"]["budget_ms"]) / 1000
    await lab.fresh()
    await lab.set_latency(round(budget * 550))
    await lab.add_fault("boreal", {"kind": "http_503", "count": 1})
    starter, leaver, stayer = await asyncio.gather(
        _explained(session, service_url, f"starter-{tag}"),
        _after(0.05 * budget, _explained(session, service_url, f"leaver-{tag}")),
        _after(0.5 * budget, _explained(session, service_url, f"stayer-{tag}")),
    )
    await lab.wait_idle()
    problems = []
    if (sent := (await lab.attempts(starter["request_id"]))["boreal"]) != 2:
        problems.append(f"boreal got {sent} requests from the shared call, expected 2")
    if (stayer["best"] or {}).get("supplier") != "boreal":
        problems.append(f"the last joiner's best is {stayer['best']}, expected boreal's quote")
    if _boreal_bill(starter).get("handed_over") != stayer["request_id"]:
        problems.append("the starter did not hand the call over to the last joiner")
    notes = [f"budget {budget:.2f} s; suppliers answered after {budget * 0.55:.2f} s"]
    return _row_of(
        LEFT_AT_DEADLINE, leaver, await lab.attempts(leaver["request_id"]), problems, notes
    )


CACHED: Final = Case(
    "cache: a cached quote",
    "boreal said Cache-Control: max-age=1: the next request got its quote from the cache, "
    "with its age_s, and boreal was not asked",
    request={"sku": CACHE_SKU},
    best="cedar",
    attempts={"atlas": 1, "boreal": 0, "cedar": 1},
)


async def cached_quote(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> Outcome:
    """boreal's quote with max-age=1, then the same request again within the second."""
    await lab.fresh()
    await lab.set_cache_control("boreal", "max-age=1")
    await asyncio.sleep(1.05)  # an entry of an earlier run has expired
    tag = secrets.token_hex(3)
    await _explained(session, service_url, f"store-{tag}", sku=CACHE_SKU)
    again = await _explained(session, service_url, f"again-{tag}", sku=CACHE_SKU)
    problems = []
    quote: dict[str, Any] = next((q for q in again["quotes"] if q["supplier"] == "boreal"), {})
    if "age_s" not in quote:
        problems.append(f"boreal's quote has no age_s: {quote}")
    await lab.set_cache_control("boreal", None)
    return _row_of(CACHED, again, await lab.attempts(again["request_id"]), problems)


STALE: Final = Case(
    "cache: stale covers a 503",
    "max-age=1, stale-if-error=30: a second later boreal failed with 503 twice, and its stale "
    "quote stood in, with its age_s",
    request={"sku": CACHE_SKU},
    best="cedar",
    attempts={"atlas": 1, "boreal": 2, "cedar": 1},
)


async def stale_quote(session: aiohttp.ClientSession, lab: LabControl, service_url: str) -> Outcome:
    """boreal's quote with stale-if-error, then past its max-age boreal answers 503."""
    await lab.fresh()
    await lab.set_cache_control("boreal", "max-age=1, stale-if-error=30")
    await asyncio.sleep(1.05)  # the last case's entry is past its max-age
    tag = secrets.token_hex(3)
    await _explained(session, service_url, f"store-{tag}", sku=CACHE_SKU)
    await asyncio.sleep(1.05)
    await lab.add_fault("boreal", {"kind": "http_503"})
    stale = await _explained(session, service_url, f"stale-{tag}", sku=CACHE_SKU)
    await lab.clear_faults()
    problems = []
    if (covered := _boreal_bill(stale).get("stale_if_error")) != "http_503":
        problems.append(f"boreal's bill says stale_if_error {covered!r}, not 'http_503'")
    quote: dict[str, Any] = next((q for q in stale["quotes"] if q["supplier"] == "boreal"), {})
    if quote.get("age_s", 0) < 1:
        problems.append(f"boreal's stale quote has no age_s past 1 s: {quote}")
    await lab.set_cache_control("boreal", None)
    return _row_of(STALE, stale, await lab.attempts(stale["request_id"]), problems)


# -- slow suppliers: a burst at QuoteFlow's own limits (issue 28) -------------------------

BURST: Final = 8
"""Requests sent at once: the default inbound limit, so every one is admitted."""
BURST_LATENCY_MS: Final = 400
BURST_GRACE_MS: Final = 150.0
"""No answer later than the budget + this at the client (the benchmark's slow-suppliers rule)."""
BURST_LEAD: Final = (
    f"slow suppliers: every supplier answers after {BURST_LATENCY_MS} ms and {BURST} requests "
    "arrive at once, each for its own SKU (HOT-01 ... HOT-08, quantity 1: nothing is shared)"
)


def _burst_shows(result: dict[str, Any], client_ms: float) -> str:
    """One answer of the burst in words: its quotes, why each other supplier has none, timing."""
    quoted = [quote["supplier"] for quote in result["quotes"]]
    bill = result.get("explain", {}).get("suppliers", {})
    why: dict[str, list[str]] = {}  # "timeout (deadline)" -> the suppliers it stands for
    for failure in result["failures"]:
        stopped = bill.get(failure["supplier"], {}).get("stopped", "?")
        why.setdefault(f"{failure['code']} ({stopped})", []).append(failure["supplier"])
    missing = [f"{', '.join(names)} {reason}" for reason, names in why.items()]
    got = f"{len(quoted)} quote{'' if len(quoted) == 1 else 's'}" + (
        f" ({', '.join(quoted)})" if quoted else ""
    )
    return "; ".join([got, *missing, f"{client_ms:.0f} ms at the client"])


async def _circuits_closed_after(
    session: aiohttp.ClientSession, service_url: str, within_s: float
) -> tuple[float | None, dict[str, str]]:
    """Ask normally until all three quotes come back: seconds it took, and the first failures."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    first: dict[str, str] | None = None
    while True:
        async with session.post(f"{service_url}/api/quotes", json={"quantity": 1}) as response:
            result: dict[str, Any] = await response.json()
        failures = {f["supplier"]: f["code"] for f in result.get("failures", ())}
        first = failures if first is None else first
        if response.status == 200 and len(result.get("quotes", ())) == len(SUPPLIERS):
            return loop.time() - began, first
        if loop.time() - began > TOKEN_WITHIN_S:
            return None, first
        await asyncio.sleep(0.2)


async def slow_burst(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[Outcome]:
    """Every supplier at 400 ms, 8 requests at once: one row per answer, in the order sent.

    The outbound slots (6 by default) allow 6 × budget ÷ 0.4 s supplier calls
    in one budget, so only some answers can be complete. What the contract
    asks (section 11): every request admitted and answered on time, each
    supplier without a quote marked ``timeout`` (never ``circuit_open``),
    every supplier quoted at least once, and afterwards no circuit open — a
    healthy supplier is never ejected because QuoteFlow queued its calls.
    """
    await lab.fresh()
    tag = secrets.token_hex(3)
    probe = await _explained(session, service_url, f"budget-{tag}")
    budget_ms = float(probe["explain"]["budget_ms"])
    await lab.fresh()
    await lab.set_latency(BURST_LATENCY_MS)
    loop = asyncio.get_running_loop()

    async def ask(index: int) -> tuple[int, dict[str, Any], float]:
        sent = loop.time()
        async with session.post(
            f"{service_url}/api/quotes?explain=1",
            json={"sku": f"HOT-{index:02d}", "quantity": 1},
            headers={"X-Request-ID": f"burst{index}-{tag}"},
        ) as response:
            result: dict[str, Any] = await response.json()
            return response.status, result, 1000 * (loop.time() - sent)

    answers = await asyncio.gather(*(ask(index) for index in range(1, BURST + 1)))
    await lab.wait_idle()
    outcomes: list[Outcome] = []
    quoted: set[str] = set()
    for index, (status, result, client_ms) in enumerate(answers, start=1):
        name = f"400 ms x{BURST}: #{index} HOT-{index:02d}"
        if status != 200:
            case = Case(name, f"QuoteFlow answered {status}", best=None, attempts=None)
            outcomes.append(Outcome(case, None, {}, {}, "-", 0.0, [f"status {status}: {result}"]))
            continue
        failures = {f["supplier"]: f["code"] for f in result["failures"]}
        quoted |= {quote["supplier"] for quote in result["quotes"]}
        problems = [
            f"{supplier}: {code}, expected timeout (a healthy supplier, only slow)"
            for supplier, code in failures.items()
            if code != "timeout"
        ]
        if client_ms > budget_ms + BURST_GRACE_MS:
            problems.append(
                f"answered after {client_ms:.0f} ms, past the budget + {BURST_GRACE_MS:.0f} ms"
            )
        case = Case(name, _burst_shows(result, client_ms), attempts=None)
        outcomes.append(
            Outcome(
                case,
                result["best"]["supplier"] if result["best"] else None,
                failures,
                await lab.attempts(result["request_id"]),
                str(
                    result.get("explain", {}).get("suppliers", {}).get("boreal", {}).get("stopped")
                ),
                float(result["elapsed_ms"]),
                problems,
            )
        )
    complete = sum(1 for _, result, _ in answers if len(result.get("quotes", ())) == 3)
    last = outcomes[-1]
    calls = int(6 * budget_ms / BURST_LATENCY_MS)
    last.notes.append(
        f"{complete} of {BURST} answers with all three quotes; with the default 6 outbound slots "
        f"one budget of {budget_ms:.0f} ms holds {calls} calls of {BURST_LATENCY_MS} ms "
        f"({calls // 3} complete answers at most)"
    )
    stops = [
        str(r.get("explain", {}).get("suppliers", {}).get("boreal", {}).get("stopped"))
        for _, r, _ in answers
    ]
    if "no_slot_in_time" in stops:
        last.notes.append(
            "deadline: let in with the time QuoteFlow's estimate (learned at 0 ms) allowed, and "
            "cut (not counted against the supplier); no_slot_in_time: gave its place up, "
            "answered at once"
        )
    if budget_ms > BURST_LATENCY_MS + 50:
        if unquoted := [s for s in SUPPLIERS if s not in quoted]:
            last.problems.append(f"never quoted in the burst: {', '.join(unquoted)}")
    else:
        last.notes.append(f"a budget of {budget_ms:.0f} ms leaves no time for a 400 ms supplier")
    await lab.fresh()
    after_s, first = await _circuits_closed_after(session, service_url, within_s=15.0)
    opened = sorted(s for s, code in first.items() if code == "circuit_open")
    if opened:
        last.problems.append(
            f"right after the burst {', '.join(opened)} circuit_open: QuoteFlow's own queue was "
            "blamed on healthy suppliers"
            + ("" if after_s is None else f" (closed again after {after_s:.1f} s)")
        )
    elif after_s is None:
        last.problems.append(f"no answer with all three quotes after the burst: {first}")
    else:
        last.notes.append("right after, at 0 ms again: all three quotes, no circuit open")
    return outcomes


async def _metric_names(session: aiohttp.ClientSession, service_url: str) -> str:
    async with session.get(f"{service_url}/metrics") as response:
        return await response.text() if response.status == 200 else ""


async def sharing_runs(
    session: aiohttp.ClientSession, service_url: str
) -> tuple[list[SharingRun], list[str]]:
    """The coalescing and cache cases QuoteFlow can show, and a line for each it cannot."""
    metrics = await _metric_names(session, service_url)
    runs: list[SharingRun] = []
    missing = []
    if "quoteflow_coalesced_calls_in_flight" in metrics:
        runs += [joined_call, joiner_leaving]
    else:
        missing.append("coalescing is off (--coalesce): its cases are left out.")
    if "quoteflow_cache_entries" in metrics:
        runs += [cached_quote, stale_quote]
    else:
        missing.append("the quote cache is off (--cache-size N): its cases are left out.")
    return runs, missing


# -- hedging: a supplier with a tail, a late first attempt joined by a hedge (issue 48) ----

HEDGE_LEAD: Final = (
    "hedging: boreal's answers with a lognormal tail (PUT /faults/boreal latency, median "
    f"{BOREAL_TAIL['ms']} ms, sigma {BOREAL_TAIL['sigma']}), through the hedged QuoteFlow "
    "(--hedge: a second attempt once the first is out past boreal's 0.65 percentile of recent "
    "answer times) at"
)
NO_HEDGED: Final = (
    "No hedged QuoteFlow {why}; the hedge case is left out (make run starts one at 9105; "
    "--hedged URL)."
)
"""``why``: ``given``, or where none answers, or what the one there lacks."""
HEDGE_WARM_UP: Final = 8
"""Requests each warm-up caller asks: QuoteFlow trusts a percentile's delay after 10 of boreal's
answers, and hedges only once some of its calls ran past the time a first attempt has."""
HEDGE_WARM_UP_SKUS: Final = ("HOT-01", "HOT-02", "HOT-03")
"""One SKU per warm-up caller (quantity 1): no two requests in flight are identical."""
HEDGE_TRIES: Final = 80
HEDGE_WITHIN_S: Final = 45.0
"""At most this many requests, for at most this long, until one's bill shows a hedge that won."""
HEDGED: Final = Case(
    "hedge: boreal's tail",
    "boreal's first attempt was still out past its hedge delay: QuoteFlow sent a second beside "
    'it ("hedge": true), the first quote to come won ("won") and the other attempt was '
    "cancelled, its connection closed; boreal's quote, on budget",
    attempts=None,
)


async def hedged_at(session: aiohttp.ClientSession, url: str) -> str | None:
    """Why the QuoteFlow at ``url`` cannot show the hedge case (None: it can)."""
    if not await worked_suppliers_at(session, url):
        return f"asking atlas, boreal and cedar at {url}"
    if 'quoteflow_hedge_tokens{supplier="boreal"}' not in await _metric_names(session, url):
        return f"at {url}: the QuoteFlow there does not hedge boreal (no --hedge)"
    return None


def attempts_from_svg(drawing: str, supplier: str) -> dict[str, Any]:
    """``supplier``'s attempts and ``won`` as its row of the waterfall carries them."""
    for row in ET.fromstring(drawing).iter(f"{SVG_NS}g"):
        if row.get("data-supplier") != supplier:
            continue
        attempts: list[dict[str, Any]] = []
        won = None
        for element in row.iter(f"{SVG_NS}g"):
            found = element.attrib
            if "data-attempt" in found:
                attempt: dict[str, Any] = {
                    "attempt": int(found["data-attempt"]),
                    "outcome": found["data-outcome"],
                    "start_ms": float(found["data-start-ms"]),
                    "slot_wait_ms": float(found["data-slot-wait-ms"]),
                    "duration_ms": float(found["data-duration-ms"]),
                }
                if found.get("data-hedge") == "true":
                    attempt["hedge"] = True
                attempts.append(attempt)
            elif found.get("data-mark") == "won":
                won = int(found["data-mark-value"])
        return {"attempts": attempts, "won": won}
    return {"attempts": [], "won": None}


def _why_unhedged(bill: Mapping[str, Any]) -> str:
    """How a bill of boreal's with no winning hedge reads: no hedge, a refused one, no winner."""
    if any(attempt.get("hedge") for attempt in bill.get("attempts", ())):
        return "hedged with no winner in the bill"
    if (why := bill.get("hedge_refused")) is not None:
        return f"hedge refused ({why})"
    return "not hedged (boreal answered within its hedge delay, or none was due yet)"


def _won(result: dict[str, Any]) -> bool:
    """Whether boreal's bill shows a hedged call: two attempts, the second a hedge, a winner."""
    bill = _boreal_bill(result)
    hedges = [attempt for attempt in bill.get("attempts", ()) if attempt.get("hedge")]
    return len(hedges) == 1 and bill.get("won") in (1, 2)


async def _hedge_asked(
    session: aiohttp.ClientSession, service_url: str, request_id: str, drawn: bool
) -> tuple[dict[str, Any], str]:
    """The banner's request (``{}``) under ``request_id``: the answer with its bill, and its
    waterfall if ``drawn`` (the answer then read from the drawing)."""
    if not drawn:
        return await _explained(session, service_url, request_id), ""
    async with session.post(
        f"{service_url}/api/quotes?explain=svg", json={}, headers={"X-Request-ID": request_id}
    ) as response:
        drawing = await response.text()
        if response.status != 200:
            raise LabError(f"QuoteFlow answered {response.status}: {drawing}")
    result = answer_from_svg(drawing)
    result["explain"]["suppliers"]["boreal"].update(attempts_from_svg(drawing, "boreal"))
    return result, drawing


def _hedge_words(result: dict[str, Any]) -> tuple[list[str], list[str]]:
    """What a user reads in boreal's bill of a hedged call, and how it differs from a hedge's
    rule: notes, problems."""
    bill = _boreal_bill(result)
    attempts = {attempt["attempt"]: attempt for attempt in bill["attempts"]}
    won = int(bill["won"])
    problems = []
    if sorted(attempts) != [1, 2] or not attempts[2].get("hedge") or attempts[1].get("hedge"):
        problems.append(f"boreal's attempts {bill['attempts']}, expected 1 and its hedge 2")
        return [], problems
    winner, loser = attempts[won], attempts[3 - won]
    if winner["outcome"] != "ok":
        problems.append(f"attempt {won} won with the outcome {winner['outcome']}, not ok")
    if loser["outcome"] != "cancelled":
        problems.append(f"the losing attempt's outcome is {loser['outcome']}, not cancelled")
    first, hedge = attempts[1], attempts[2]
    sent = first["start_ms"] + first["slot_wait_ms"]
    after = hedge["start_ms"] - sent
    if after <= 0:
        problems.append(f"the hedge began {after:.1f} ms after the first attempt was sent")
    ends = {n: a["start_ms"] + a["slot_wait_ms"] + a["duration_ms"] for n, a in attempts.items()}
    notes = [
        f"boreal's attempt 1 went at {sent:.1f} ms and was still out {after:.1f} ms later (its "
        f"hedge delay): attempt 2, the hedge, went at {hedge['start_ms']:.1f} ms",
        f"attempt {won} won: its quote came at {ends[won]:.1f} ms, after "
        f"{winner['duration_ms']:.1f} ms on the wire; attempt {3 - won} was cancelled at "
        f"{ends[3 - won]:.1f} ms (outcome {loser['outcome']}), not a failure; the answer in "
        f"{float(result['elapsed_ms']):.1f} ms",
    ]
    return notes, problems


async def hedged_call(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str, svg: Path | None = None
) -> Outcome:
    """boreal's tail on; a warm-up; then the banner's request until its bill shows a hedge.

    ``svg``: the hedged request is asked drawn (``?explain=svg``), checked from the drawing,
    and the drawing written there as ``svg_name(HEDGED)``.
    """
    await lab.fresh()
    notes = []
    if note := await earn_a_retry(session, service_url, "boreal"):
        notes.append(note)  # an empty retry budget stops hedges too
        await lab.fresh()
    tag = secrets.token_hex(3)
    loop = asyncio.get_running_loop()
    await lab.add_fault("boreal", BOREAL_TAIL)
    try:

        async def caller(sku: str) -> None:
            for n in range(HEDGE_WARM_UP):
                await _explained(session, service_url, f"warm-{sku}-{n}-{tag}", sku=sku, quantity=1)

        began = loop.time()
        await asyncio.gather(*(caller(sku) for sku in HEDGE_WARM_UP_SKUS))
        warm_s = loop.time() - began
        asked, unhedged = 0, collections.Counter[str]()
        give_up = loop.time() + HEDGE_WITHIN_S
        while True:
            asked += 1
            result, drawing = await _hedge_asked(
                session, service_url, f"hedge{asked}-{tag}", svg is not None
            )
            if _won(result) or asked >= HEDGE_TRIES or loop.time() >= give_up:
                break
            unhedged[_why_unhedged(_boreal_bill(result))] += 1
    finally:
        await lab.clear_faults()
    await lab.wait_idle()
    if svg is not None and drawing:
        (svg / svg_name(HEDGED)).write_text(drawing, encoding="utf-8")
    warmed = len(HEDGE_WARM_UP_SKUS) * HEDGE_WARM_UP
    before = ", ".join(f"{n} {why}" for why, n in unhedged.items())
    notes.append(
        f"warm-up: {warmed} requests by {len(HEDGE_WARM_UP_SKUS)} callers in {warm_s:.1f} s "
        f"(QuoteFlow hedges after 10 of boreal's answers, once some ran past a first attempt's "
        f"time); then the banner's request, asked {_count(asked, 'time')}, was hedged"
        + (f"; before it, {before}" if before else "")
    )
    problems: list[str] = []
    if _won(result):
        words, problems = _hedge_words(result)
        notes += words
    else:
        problems.append(
            f"no hedged call that won in {asked} requests ({HEDGE_WITHIN_S:g} s at most): "
            f"boreal's last bill {_boreal_bill(result)}"
        )
    attempts = await lab.attempts(result["request_id"])
    if _won(result) and attempts["boreal"] != 2:
        notes.append(
            f"the lab received {attempts['boreal']} of boreal's attempts: the loser was "
            "cancelled before its request reached it"
        )
    return _row_of(HEDGED, result, attempts, problems, notes)


# -- the lab's dialects: docs/suppliers.md's three worked suppliers (issue 29) ------------

DIALECTS_LEAD: Final = (
    "the lab's dialects, through the QuoteFlow of docs/suppliers.md's worked suppliers "
    "(atlas classic; boreal POST JSON with an OAuth2 token, price breaks; cedar the SKU in the "
    "path, an API key) at"
)
EVERYONE_ONCE: Final = {"atlas": 1, "boreal": 1, "cedar": 1}
AT_10: Final = {"quantity": 10}
"""From 10 units boreal's second price break applies; cedar (1 in stock) has no quote."""

PRICE_BREAKS: Final[Sequence[Case]] = (
    Case(
        "price break at quantity 1",
        "boreal's break from 1 unit, 11.00 EUR, converted to USD at the lab's rate (atlas 1200 "
        "cents, cedar 900); cedar has 1 in stock and is cheapest",
        request={"quantity": 1},
        best="cedar",
        attempts=EVERYONE_ONCE,
        prices={"atlas": 1200, "boreal": "EUR 11.00", "cedar": 900},
    ),
    Case(
        "price break at quantity 10",
        "boreal's adapter passed its EUR breaks on, QuoteFlow took the one from 10, 9.90 EUR; "
        "atlas 1200 cents as at 1; "
        "cedar answered, 1 in stock: no quote, no failure",
        request=AT_10,
        attempts=EVERYONE_ONCE,
        prices={"atlas": 1200, "boreal": "EUR 9.90"},
    ),
)

TOKEN_WITHIN_S: Final = 12.0
"""How long boreal may take to quote again after a token fetch failed: the fetches back
off 1 s, 2, 4, at most 8 (plus 20 % jitter)."""


async def _boreal_quoting(
    session: aiohttp.ClientSession, service_url: str, **body: object
) -> tuple[float | None, dict[str, Any]]:
    """Ask every 0.2 s until boreal quotes: the seconds it took (None: not within
    ``TOKEN_WITHIN_S``), and the last answer."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    tag = secrets.token_hex(3)
    asked = 0
    while True:
        result = await _explained(session, service_url, f"until{asked}-{tag}", **body)
        if _quoted(result, "boreal"):
            return loop.time() - began, result
        if loop.time() - began > TOKEN_WITHIN_S:
            return None, result
        asked += 1
        await asyncio.sleep(0.2)


def _quoted(result: dict[str, Any], supplier: str) -> bool:
    return any(quote["supplier"] == supplier for quote in result["quotes"])


async def _token_held(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[str]:
    """A clean start for a token case: boreal holds a token and may retry; lab counts zeroed."""
    await lab.fresh()
    notes = []
    if note := await earn_a_retry(session, service_url, "boreal"):
        notes.append(note)
    took, _ = await _boreal_quoting(session, service_url)
    if took is None or took > 0.5:
        notes.append(
            "boreal had no token at first (an earlier fetch failed and the next backed off): "
            + ("none came" if took is None else f"it quoted after {took:.1f} s")
        )
    await lab.fresh()
    return notes


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _statuses(result: dict[str, Any]) -> list[int | None]:
    return [attempt.get("status") for attempt in _boreal_bill(result)["attempts"]]


REFUSED_AGAIN_S: Final = 1.1
REFUSED: Final = Case(
    "401, then success",
    "the lab revoked every token: boreal's attempt was a 401; QuoteFlow dropped the token, "
    "fetched one fresh token and sent the attempt again at once: attempts [401, 200] in the "
    "bill, and the quote",
    request=AT_10,
    attempts={"atlas": 1, "boreal": 2, "cedar": 1},
    prices={"atlas": 1200, "boreal": "EUR 9.90"},
)


async def refused_token(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[Outcome]:
    """Every token revoked (``DELETE /oauth2/tokens``), then one request."""
    notes = await _token_held(session, lab, service_url)
    await lab.revoke_tokens()
    result = await _explained(session, service_url, f"refused-{secrets.token_hex(3)}", **AT_10)
    await lab.wait_idle()
    problems = []
    if (statuses := _statuses(result)) != [401, 200]:
        problems.append(f"boreal's attempts were {statuses}, expected [401, 200]")
    issued = (await lab.oauth2())["fetches"]["issued"]
    if issued != 1:
        problems.append(f"the token endpoint issued {issued} tokens, expected the one fresh one")
    # A token refused within a second of a fetch that replaced a refused one makes
    # QuoteFlow wait out that second (a supplier refusing every token must not turn
    # each request into a fetch): the next case's revocation comes after it.
    await asyncio.sleep(REFUSED_AGAIN_S)
    waited = float(_boreal_bill(result).get("token_wait_ms", 0.0))
    if not problems:
        notes.append(
            f"boreal's attempts in the bill: {statuses}, the second after {waited:.1f} ms "
            "waiting for the fresh token (token_wait_ms); the token endpoint issued 1"
        )
    return [_row_of(REFUSED, result, await lab.attempts(result["request_id"]), problems, notes)]


TOKEN_TTL_S: Final = 2
PHASE_S: Final = 2.0
PHASE_CALLERS: Final = (1, 4)
PHASE_SKUS: Final = ("KB-001", "HOT-01", "HOT-02", "HOT-03")
"""One SKU per caller: no two requests in flight are identical, so none joins another."""
PAUSE_S: Final = 0.05

REFRESH_S: Final = 0.8 * TOKEN_TTL_S
"""QuoteFlow refreshes a token when 80 % of its lifetime has passed (60 s before the end of
a longer one)."""
EXPIRING: Final = Case(
    "token expired mid-run",
    f"tokens of {TOKEN_TTL_S} s from now on (PUT /oauth2 expires_in), every token revoked, "
    f"then {PHASE_S:g} s of requests by {PHASE_CALLERS[0]} caller and {PHASE_S:g} s by "
    f"{PHASE_CALLERS[1]}: every answer has boreal's quote, none waited for a token; a new one "
    f"came every {REFRESH_S:g} s, refreshed in the background: with time, not with requests",
    request=AT_10,
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "boreal": "EUR 9.90"},
)


async def expiring_tokens(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[Outcome]:
    """Short-lived tokens under a steady stream of requests: fetched with time, not requests.

    The row is the run's last request (KB-001 at quantity 10).
    """
    notes = await _token_held(session, lab, service_url)
    before = int((await lab.oauth2())["expires_in"])
    tag = secrets.token_hex(3)
    loop = asyncio.get_running_loop()
    problems: list[str] = []
    answers: list[dict[str, Any]] = []

    async def caller(index: int, until: float) -> None:
        n = 0
        while loop.time() < until:
            answers.append(
                await _explained(
                    session,
                    service_url,
                    f"expiring{index}-{n}-{tag}",
                    sku=PHASE_SKUS[index],
                    quantity=10,
                )
            )
            n += 1
            await asyncio.sleep(PAUSE_S)

    await lab.set_oauth2(expires_in=TOKEN_TTL_S)
    try:
        await lab.revoke_tokens()
        first = await _explained(session, service_url, f"expiring-{tag}", **AT_10)
        if _statuses(first) != [401, 200]:
            problems.append(f"after the revocation boreal's attempts were {_statuses(first)}")
        began = loop.time()
        phases: list[tuple[int, int, int]] = []  # callers, requests, tokens issued
        for callers in PHASE_CALLERS:
            issued = (await lab.oauth2())["fetches"]["issued"]
            sent = len(answers)
            until = loop.time() + PHASE_S
            await asyncio.gather(*(caller(index, until) for index in range(callers)))
            issued = (await lab.oauth2())["fetches"]["issued"] - issued
            phases.append((callers, len(answers) - sent, issued))
        ran_s = loop.time() - began
        last = await _explained(session, service_url, f"expiring-last-{tag}", **AT_10)
        answers.append(last)
    finally:
        await lab.set_oauth2(expires_in=before)
    await lab.wait_idle()
    issued = (await lab.oauth2())["fetches"]["issued"]
    without = [answer for answer in answers if not _quoted(answer, "boreal")]
    if without:
        codes = sorted(
            {f["code"] for a in without for f in a["failures"] if f["supplier"] == "boreal"}
        )
        problems.append(
            f"{len(without)} of {len(answers)} answers had no quote of boreal's "
            f"({', '.join(codes) or 'no failure'})"
        )
    late = [a for a in answers if _statuses(a) != [200] or "token_wait_ms" in _boreal_bill(a)]
    if late:
        problems.append(
            f"{len(late)} answers after the first waited for a token or got a 401: "
            "a refresh came late"
        )
    # One fresh token after the revocation, then one per 80 % of a lifetime (and the
    # last refresh may be under way).
    most = 2 + math.ceil(ran_s / REFRESH_S)
    if not 2 <= issued <= most:
        problems.append(
            f"the token endpoint issued {issued} tokens in {ran_s:.1f} s, expected 2 to {most}"
        )
    for callers, sent, fetched in phases:
        if fetched > 1 + math.ceil(PHASE_S / REFRESH_S):
            problems.append(f"{fetched} tokens for {sent} requests by {callers} in {PHASE_S:g} s")
    said = [
        f"{_count(c, 'caller')}: {_count(n, 'request')}, {_count(t, 'token')}" for c, n, t in phases
    ]
    notes.append(
        f"{'; '.join(said)}; {_count(len(answers) + 1, 'request')} and "
        f"{_count(issued, 'token')} in all (the first for the first request, whose revoked "
        "token got a 401)"
    )
    if before != TOKEN_TTL_S:
        notes.append(f"expires_in is {before} s again for the tokens issued from now on")
    return [_row_of(EXPIRING, last, await lab.attempts(last["request_id"]), problems, notes)]


DOWN_S: Final = 2.0
DOWN: Final = Case(
    "token endpoint down",
    "the token endpoint resets every connection and every token is revoked: boreal's 401 "
    "found no fresh token, auth_failed at once; atlas and cedar quoted, on budget",
    request={"quantity": 1},
    best="cedar",
    failures={"boreal": "auth_failed"},
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "cedar": 900},
)
BACK: Final = Case(
    "token endpoint back",
    "the fault cleared: the next token fetch (backing off after each failure: 1 s, 2, 4, at "
    "most 8) brought a token, and boreal quoted again",
    request={"quantity": 1},
    best="cedar",
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "boreal": "EUR 11.00", "cedar": 900},
)


async def token_endpoint_down(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[Outcome]:
    """The token endpoint down for a while, then up again: two rows."""
    notes = await _token_held(session, lab, service_url)
    tag = secrets.token_hex(3)
    budget_ms = 0.0
    loop = asyncio.get_running_loop()
    await lab.set_token_fault({"kind": "down"})
    try:
        # Counted from here: a refresh of an earlier case's token may have been just before.
        before = (await lab.oauth2())["fetches"]
        await lab.revoke_tokens()
        first = await _explained(session, service_url, f"down-{tag}", quantity=1)
        budget_ms = float(first["explain"]["budget_ms"])
        began = loop.time()
        later: list[dict[str, Any]] = []
        while loop.time() - began < DOWN_S:
            await asyncio.sleep(0.2)
            later.append(
                await _explained(session, service_url, f"down{len(later)}-{tag}", quantity=1)
            )
        down_s = loop.time() - began
        fetches = {k: n - before[k] for k, n in (await lab.oauth2())["fetches"].items()}
    finally:
        await lab.set_token_fault(None)
    problems = []
    if _statuses(first) != [401]:
        problems.append(f"boreal's attempts were {_statuses(first)}, expected [401]")
    for answer in (first, *later):
        failures = {f["supplier"]: f["code"] for f in answer["failures"]}
        if failures != {"boreal": "auth_failed"}:
            problems.append(f"{answer['request_id']}: failures {failures}")
        if answer["elapsed_ms"] > budget_ms:
            problems.append(f"{answer['request_id']}: answered after {answer['elapsed_ms']} ms")
    if asked := [a["request_id"] for a in later if _statuses(a)]:
        problems.append(f"boreal was asked without a token: {asked}")
    most = 1 + math.ceil(down_s)  # at most one fetch a second after the first failure
    if fetches["failed"] > most or fetches["issued"]:
        problems.append(
            f"the token endpoint was asked {fetches} in {down_s:.1f} s; at most {most} expected"
        )
    slowest = max(a["elapsed_ms"] for a in (first, *later))
    notes.append(
        f"then {len(later)} requests in {down_s:.1f} s: auth_failed at once, boreal not asked, the "
        f"slowest answer {slowest:.1f} ms of the {budget_ms:.0f} ms budget; "
        f"the token endpoint was asked {_count(fetches['failed'], 'time')}, "
        f"not {len(later) + 1}"
    )
    down = _row_of(DOWN, first, await lab.attempts(first["request_id"]), problems, notes)
    took, answer = await _boreal_quoting(session, service_url, quantity=1)
    back_problems = []
    if took is None:
        back_problems.append(
            f"boreal had no quote {TOKEN_WITHIN_S:.0f} s after the fault was cleared"
        )
    await lab.wait_idle()
    back = _row_of(
        BACK,
        answer,
        await lab.attempts(answer["request_id"]),
        back_problems,
        [] if took is None else [f"boreal quoted again {took:.1f} s after the fault was cleared"],
    )
    return [down, back]


TOKEN_RUNS: Final[
    Sequence[Callable[[aiohttp.ClientSession, LabControl, str], Awaitable[list[Outcome]]]]
] = (
    refused_token,
    expiring_tokens,
    token_endpoint_down,
)
"""The token cases, in this order: each starts with boreal holding a token, fetched over a
second before (the first after ``refused_token``'s pause, the last by a refresh)."""


async def worked_suppliers_at(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether a QuoteFlow answers at ``url``, asking atlas, boreal and cedar."""
    try:
        async with session.get(f"{url}/health") as response:
            if response.status != 200:
                return False
        return await supplier_names(session, url) == SUPPLIERS
    except aiohttp.ClientError:
        return False


async def dialect_outcomes(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> AsyncIterator[Outcome]:
    """The price breaks and the token cases against the worked suppliers' QuoteFlow."""
    await _boreal_quoting(session, service_url)  # a token fetch of an earlier failure backing off
    for case in PRICE_BREAKS:
        yield await run_case(session, lab, service_url, case)
    for run in TOKEN_RUNS:
        for outcome in await run(session, lab, service_url):
            yield outcome


# -- carts: a bill of materials in one request, and batch suppliers (issue 37) -------------

CART_LINES: Final = tuple(f"BOM-{n:03d}" for n in range(1, 51))
"""The carts of 50 lines: every supplier sells each, with stock to spare."""
CART_LEAD: Final = (
    "carts (POST /api/carts), a bill of materials in one request: best is the basket's "
    "suppliers (a+b+c: all three), failures any line's, attempts the supplier calls that "
    "carried the cart's request id (lab /stats), boreal stopped how its calls ended"
)
NO_BATCH: Final = (
    "No QuoteFlow of the batch suppliers at {url} (make run starts one): only the classic "
    "cart is shown."
)

CLASSIC_CART: Final = Case(
    f"cart of {len(CART_LINES)} lines, classic",
    f"{len(CART_LINES)} lines (BOM-001 ... BOM-050, quantity 1) through the first QuoteFlow: "
    "each line asked of each supplier as a single quote is",
    best=None,
    attempts=dict.fromkeys(SUPPLIERS, len(CART_LINES)),
)
BATCH_CART: Final = Case(
    f"cart of {len(CART_LINES)} lines, batch",
    "the same cart through the batch suppliers' QuoteFlow: each supplier asked for many lines a "
    "call, its calls at once",
    best=None,
    attempts=None,
)
BAD_ENTRY: Final = Case(
    "batch: malformed entry (atlas)",
    "batch_malformed_entry once on atlas: in one of its calls the last part's entry had "
    "unitCents as a string; that line is invalid_data from atlas alone, never retried, and "
    "every other line of the call kept its quote",
    best=None,
    failures={"atlas": "invalid_data"},
    attempts=None,
)
CALL_503: Final = Case(
    "batch: one call 503s (boreal)",
    "http_503 once on boreal: one of its calls answered 503 and was retried once, with the "
    "cart's request id, and got its lines' quotes: every line quoted by all three",
    best=None,
    attempts=None,
)
CHEAPER_BASKET: Final = Case(
    "basket beats each line's best",
    "cedar ships for least and is every line's best on its own; the basket pays each "
    "supplier's shipping once and buys elsewhere",
    best=None,
    attempts=None,
)


@attrs.frozen
class Basket:
    """What the cheapest basket of a cart costs, from the lab's catalogue."""

    total_cents: int
    suppliers: tuple[str, ...]


def _unit_cents(supplier: str, sku: str, quantity: int, batch: bool) -> int | None:
    """What ``supplier`` quotes a unit of ``sku`` at: the batch dialect prices by quantity."""
    offer = lookup(supplier, sku)
    if offer is None or offer.stock < quantity:
        return None
    return break_price(offer, quantity) if batch else offer.unit_cents


def baskets(
    skus: Sequence[str], quantity: int | Mapping[str, int], batch: bool = True
) -> list[Basket]:
    """Every way to buy ``skus`` from a set of the lab's suppliers, cheapest first.

    ``quantity``: every line's, or each SKU's. For each set, each line goes to the set's
    lowest unit price, and each supplier used ships once, its largest shipping among its
    lines (docs/api.md's basket). Exact for carts whose suppliers ship every line for the
    same price, as the BOM parts.
    """
    found: dict[tuple[str, ...], int] = {}
    for size in range(1, len(SUPPLIERS) + 1):
        for names in itertools.combinations(SUPPLIERS, size):
            units, shipping = 0, dict[str, int]()
            for sku in skus:
                need = quantity if isinstance(quantity, int) else quantity[sku]
                prices = [(_unit_cents(s, sku, need, batch), s) for s in names]
                offered = [(price, names.index(s), s) for price, s in prices if price is not None]
                if not offered:
                    break
                price, _, supplier = min(offered)
                units += price * need
                offer = lookup(supplier, sku)
                assert offer is not None
                shipping[supplier] = max(shipping.get(supplier, 0), offer.shipping_cents)
            else:
                used = tuple(s for s in SUPPLIERS if s in shipping)
                found[used] = units + sum(shipping.values())
    ranked = sorted(
        found.items(),
        key=lambda item: (item[1], len(item[0]), [SUPPLIERS.index(s) for s in item[0]]),
    )
    return [Basket(total, used) for used, total in ranked]


async def _cart(
    session: aiohttp.ClientSession,
    service_url: str,
    request_id: str,
    skus: Sequence[str] = CART_LINES,
    quantity: int = 1,
) -> dict[str, Any]:
    """One cart with its bill, under ``request_id``."""
    body = {"lines": [{"sku": sku, "quantity": quantity} for sku in skus]}
    async with session.post(
        f"{service_url}/api/carts?explain=1", json=body, headers={"X-Request-ID": request_id}
    ) as response:
        result: dict[str, Any] = await response.json()
        if response.status != 200:
            raise LabError(f"QuoteFlow answered {response.status}: {result}")
        return result


def _basket_suppliers(result: dict[str, Any]) -> tuple[str, ...]:
    picked = {pick["supplier"] for pick in result["basket"]["picks"]}
    return tuple(s for s in SUPPLIERS if s in picked)


def _initials(suppliers: Sequence[str]) -> str:
    return suppliers[0] if len(suppliers) == 1 else "+".join(s[0] for s in suppliers) or "-"


def _line_failures(result: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Per supplier, the lines it failed and with which code, in cart order."""
    failed: dict[str, list[tuple[str, str]]] = {}
    for line in result["lines"]:
        for failure in line["failures"]:
            failed.setdefault(failure["supplier"], []).append((line["sku"], failure["code"]))
    return failed


def _calls(result: dict[str, Any], supplier: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = result["explain"]["suppliers"].get(supplier, {}).get("calls", [])
    return calls


def _cart_row(
    case: Case,
    result: dict[str, Any],
    attempts: dict[str, int],
    problems: list[str],
    notes: Sequence[str] = (),
) -> Outcome:
    """The table row of a cart: checks every line's quotes and failures against ``case``."""
    failed = _line_failures(result)
    failures = {supplier: lines[0][1] for supplier, lines in failed.items()}
    if failures != dict(case.failures):
        problems.append(f"failures {failed}, expected one line each of {dict(case.failures)}")
    for supplier, expected in (case.attempts or {}).items():
        if attempts[supplier] != expected:
            problems.append(f"{supplier} got {attempts[supplier]} calls, expected {expected}")
    failing = {sku for lines in failed.values() for sku, _ in lines}
    short = [
        line["sku"]
        for line in result["lines"]
        if line["sku"] not in failing and len(line["quotes"]) != len(SUPPLIERS)
    ]
    if short:
        problems.append(f"lines without every supplier's quote and no failure: {short}")
    if not result["basket"]["complete"] or not result["basket"]["optimal"]:
        problems.append(f"basket not complete and optimal: {result['basket']}")
    stopped = sorted({str(call["stopped"]) for call in _calls(result, case.focus)})
    return Outcome(
        case,
        _initials(_basket_suppliers(result)),
        failures,
        attempts,
        ",".join(stopped) or "-",
        float(result["elapsed_ms"]),
        problems,
        list(notes),
    )


def _quoted_lines(result: dict[str, Any]) -> int:
    return sum(1 for line in result["lines"] if line["quotes"])


async def classic_cart(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> Outcome:
    """50 lines through the first QuoteFlow: a call per line and supplier."""
    await lab.fresh()
    result = await _cart(session, service_url, f"cart-classic-{secrets.token_hex(3)}")
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"])
    problems = []
    expected = baskets(CART_LINES, 1, batch=False)[0]
    if result["basket"]["total_cents"] != expected.total_cents:
        problems.append(
            f"basket total_cents {result['basket']['total_cents']}, expected {expected.total_cents}"
        )
    calls = sum(attempts.values())
    notes = [
        f"{_quoted_lines(result)} of {len(CART_LINES)} lines quoted; {calls} supplier calls "
        f"({'/'.join(str(attempts[s]) for s in SUPPLIERS)}); basket "
        f"{result['basket']['total_cents']} cents from {', '.join(_basket_suppliers(result))}"
    ]
    return _cart_row(CLASSIC_CART, result, attempts, problems, notes)


async def batch_cart(
    session: aiohttp.ClientSession,
    lab: LabControl,
    batch_url: str,
    classic: Outcome | None = None,
) -> Outcome:
    """The same 50 lines through the batch suppliers' QuoteFlow: a few calls per supplier."""
    await lab.fresh()
    result = await _cart(session, batch_url, f"cart-batch-{secrets.token_hex(3)}")
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"])
    sizes = await lab.batch_sizes_of(result["request_id"])
    problems = []
    for supplier in SUPPLIERS:
        parts = sizes.get(supplier, [])
        if sum(parts) != len(CART_LINES) or len(parts) != attempts[supplier]:
            problems.append(
                f"{supplier}'s batch calls carried {parts} parts, expected {len(CART_LINES)} "
                f"lines in all, each once, in {attempts[supplier]} calls"
            )
    expected = baskets(CART_LINES, 1)[0]
    if result["basket"]["total_cents"] != expected.total_cents:
        problems.append(
            f"basket total_cents {result['basket']['total_cents']}, expected {expected.total_cents}"
        )
    calls = sum(attempts.values())
    said = ", ".join(
        f"{s} {'+'.join(map(str, sorted(sizes.get(s, []), reverse=True)))}" for s in SUPPLIERS
    )
    notes = [
        f"{_quoted_lines(result)} of {len(CART_LINES)} lines quoted; {calls} supplier calls, "
        f"their parts: {said} (lab batch_sizes_per_id); the same basket, "
        f"{result['basket']['total_cents']} cents"
    ]
    if classic is not None:
        notes.append(
            f"classic: {sum(classic.attempts.values())} calls, {classic.elapsed_ms:.0f} ms; "
            f"batch: {calls} calls, {float(result['elapsed_ms']):.0f} ms"
        )
    return _cart_row(BATCH_CART, result, attempts, problems, notes)


async def bad_entry(session: aiohttp.ClientSession, lab: LabControl, batch_url: str) -> Outcome:
    """One malformed entry in one of atlas's calls: its line alone fails, for atlas alone."""
    await lab.fresh()
    await lab.add_fault("atlas", {"kind": "batch_malformed_entry", "count": 1})
    try:
        result = await _cart(session, batch_url, f"cart-entry-{secrets.token_hex(3)}")
    finally:
        await lab.clear_faults()
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"])
    problems = []
    failed = [sku for sku, _ in _line_failures(result).get("atlas", [])]
    spoiled = [call for call in _calls(result, "atlas") if call["lines"][-1:] == failed[:1]]
    notes = []
    if len(failed) != 1:
        problems.append(f"atlas failed {len(failed)} lines, expected 1: {failed}")
    elif not spoiled:
        problems.append(f"{failed[0]} is not the last line of any of atlas's calls")
    else:
        sku = failed[0]
        line = next(line for line in result["lines"] if line["sku"] == sku)
        quoted = [s for s in SUPPLIERS if any(q["supplier"] == s for q in line["quotes"])]
        if quoted != ["boreal", "cedar"]:
            problems.append(f"{sku} was quoted by {quoted}, expected boreal and cedar")
        lines = spoiled[0]["lines"]
        notes.append(
            f"atlas's call of {len(lines)} ({lines[0]} ... {lines[-1]}): {sku}, its last part, "
            f"invalid_data from atlas, quoted by {' and '.join(quoted)}; the other "
            f"{len(result['lines']) - 1} lines (the call's {len(lines) - 1} among them) quoted "
            "by all three"
        )
    if attempts["atlas"] != len(_calls(result, "atlas")):
        problems.append(
            f"atlas got {attempts['atlas']} calls for {len(_calls(result, 'atlas'))} chunks: "
            "bad data was retried"
        )
    return _cart_row(BAD_ENTRY, result, attempts, problems, notes)


async def call_503(session: aiohttp.ClientSession, lab: LabControl, batch_url: str) -> Outcome:
    """One of boreal's calls answers 503 once: retried with the cart's id, every line quoted."""
    await lab.fresh()
    notes = []
    if note := await earn_a_retry(session, batch_url, "boreal"):
        notes.append(note)
        await lab.fresh()
    await lab.add_fault("boreal", {"kind": "http_503", "count": 1})
    try:
        result = await _cart(session, batch_url, f"cart-503-{secrets.token_hex(3)}")
    finally:
        await lab.clear_faults()
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"])
    sizes = await lab.batch_sizes_of(result["request_id"])
    problems = []
    calls = _calls(result, "boreal")
    retried = [call for call in calls if len(call["attempts"]) > 1]
    statuses = [[a.get("status") for a in call["attempts"]] for call in retried]
    if statuses != [[503, 200]]:
        problems.append(f"boreal's retried calls had statuses {statuses}, expected one [503, 200]")
        throttled = {str(call["stopped"]) for call in calls} & set(THROTTLED)
        notes += [f"boreal: {THROTTLED[reason]}" for reason in sorted(throttled)]
    if attempts["boreal"] != len(calls) + 1:
        problems.append(
            f"boreal got {attempts['boreal']} calls for {len(calls)} chunks, expected one more"
        )
    if retried and not problems:
        lines = retried[0]["lines"]
        backoff = retried[0]["attempts"][0].get("backoff_ms") or 0.0
        notes.append(
            f"boreal's call of {len(lines)} ({lines[0]} ... {lines[-1]}): 503, then after "
            f"{backoff:.0f} ms the same call again with the same X-Request-ID: 200; the parts "
            f"of boreal's calls at the lab: {'+'.join(map(str, sizes.get('boreal', [])))}"
        )
    return _cart_row(CALL_503, result, attempts, problems, notes)


async def cheaper_basket(
    session: aiohttp.ClientSession, lab: LabControl, batch_url: str
) -> Outcome:
    """A cart whose cheapest basket is not its lines' best quotes: shipping paid once."""
    await lab.fresh()
    result = await _cart(
        session, batch_url, f"cart-basket-{secrets.token_hex(3)}", CART_SKUS, CART_QUANTITY
    )
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"])
    basket = result["basket"]
    expected, *others = baskets(CART_SKUS, CART_QUANTITY)
    per_line = [line["best"]["supplier"] if line["best"] else None for line in result["lines"]]
    problems = []
    if (_basket_suppliers(result), basket["total_cents"]) != (
        expected.suppliers,
        expected.total_cents,
    ):
        problems.append(
            f"basket {basket['total_cents']} cents from {_basket_suppliers(result)}, expected "
            f"{expected.total_cents} from {expected.suppliers}"
        )
    if basket["total_cents"] >= basket["per_line_total_cents"]:
        problems.append("the basket costs no less than each line's best")
    if set(per_line) & set(expected.suppliers):
        problems.append(f"each line's best was {per_line}: the basket did not buy elsewhere")
    shipping = ", ".join(f"{s['supplier']} {s['shipping_cents']}" for s in basket["shipping"])
    best_of_lines = sorted({s for s in per_line if s})
    runner_up = others[0] if others else None
    notes = [
        f"{len(CART_SKUS)} lines ({CART_SKUS[0]} ... {CART_SKUS[-1]}, quantity {CART_QUANTITY}): "
        f"each line's best {', '.join(best_of_lines)}, per_line_total_cents "
        f"{basket['per_line_total_cents']} (shipping paid on every line); the basket "
        f"{basket['total_cents']} from {', '.join(_basket_suppliers(result))}, shipping once "
        f"({shipping}), {basket['per_line_total_cents'] - basket['total_cents']} less"
        + (
            ""
            if runner_up is None
            else f"; the next cheapest, {'+'.join(runner_up.suppliers)}: {runner_up.total_cents}"
        )
    ]
    return _cart_row(CHEAPER_BASKET, result, attempts, problems, notes)


# -- a bill of materials as buyers keep it: CSV in, the basket as CSV out (issue 49) --------

BOM_FILE: Final = (
    '"Source:";"/home/kb/sensor.kicad_sch"\n'
    '"Date:";"2026-12-01"\n'
    '"Tool:";"Eeschema 6.0.11"\n'
    "\n"
    '"Reference";"Value";"Footprint";"Qty";"MPN";"Manufacturer"\n'
    '"R1,R2,R3";"10k";"R_0402";"3";"BOM-001";"Yageo"\n'
    '"C1,C2";"100n";"C_0402";"2";"BOM-002";"Murata"\n'
    '"C3";"10u";"C_0805";"DNP";"BOM-003";"Murata"\n'
    '"U1";"MCU";"LQFP-48";"1";"BOM-004";"ST"\n'
    '"FID1,FID2";"Fiducial";"Fiducial_1mm";"2";"";""\n'
    '"J1";"USB-C";"USB_C_Receptacle";"1";"BOM-005";"GCT"\n'
)
"""A KiCad-style export: its tool's lines above the header, semicolons, a part not placed
(DNP) and fiducials with no MPN; the parts are the lab's. Sent with a byte-order mark."""
BOM_LINES: Final = (
    ("R1,R2,R3", "BOM-001", 3),
    ("C1,C2", "BOM-002", 2),
    ("U1", "BOM-004", 1),
    ("J1", "BOM-005", 1),
)
"""The file's lines to buy, in file order: (ref, SKU, quantity)."""
BOM_SKIPPED: Final = (8, 10)
"""The physical rows skipped: C3 (DNP) and the fiducials (no MPN)."""
BOM_IGNORED: Final = ("Value", "Footprint", "Manufacturer")
BASKET_COLUMNS: Final = (
    "kind",
    "ref",
    "sku",
    "bought_sku",
    "quantity",
    "buy_quantity",
    "supplier",
    "unit_price",
    "amount",
    "currency",
    "reason",
)
"""The basket's CSV header (docs/api.md's "CSV out")."""

BOM_CSV: Final = Case(
    "BOM as CSV: a KiCad export",
    "a KiCad-style export posted as text/csv (a byte-order mark, Source:/Date:/Tool: lines "
    "above the header, semicolons): its four parts quoted with their refs, the DNP row and "
    "the fiducials skipped and listed, the columns it does not read listed",
    best=None,
    attempts=dict.fromkeys(SUPPLIERS, 1),
)
BASKET_CSV: Final = Case(
    "BOM as CSV: the basket as CSV",
    "the same file asked with ?format=csv and read with Python's csv module: a line row per "
    "part, a shipping row per supplier, their amounts adding up to the total row's, which is "
    "the JSON basket's total_cents",
    best=None,
    attempts=dict.fromkeys(SUPPLIERS, 1),
)


async def _posted_bom(
    session: aiohttp.ClientSession, url: str, request_id: str
) -> tuple[int, bytes, float]:
    """BOM_FILE posted as ``text/csv`` with a byte-order mark: status, body, ms at the client."""
    loop = asyncio.get_running_loop()
    sent = loop.time()
    async with session.post(
        url,
        data=("\ufeff" + BOM_FILE).encode(),
        headers={"Content-Type": "text/csv", "X-Request-ID": request_id},
    ) as response:
        body = await response.read()
        return response.status, body, (loop.time() - sent) * 1000


def _bom_problems(result: dict[str, Any]) -> list[str]:
    """What a CSV cart's JSON answer should say about BOM_FILE: refs, skipped rows, columns."""
    problems = []
    lines = [(line.get("ref"), line["sku"], line["quantity"]) for line in result["lines"]]
    if lines != list(BOM_LINES):
        problems.append(f"lines (ref, sku, quantity) {lines}, expected {list(BOM_LINES)}")
    rows = tuple(skipped["row"] for skipped in result.get("skipped_rows", []))
    if rows != BOM_SKIPPED:
        problems.append(f"skipped rows {rows}, expected {BOM_SKIPPED}")
    if tuple(result.get("ignored_columns", [])) != BOM_IGNORED:
        problems.append(f"ignored columns {result.get('ignored_columns')}, expected {BOM_IGNORED}")
    quantities = {sku: quantity for _, sku, quantity in BOM_LINES}
    expected = baskets([sku for _, sku, _ in BOM_LINES], quantities)[0]
    if result["basket"]["total_cents"] != expected.total_cents:
        problems.append(
            f"basket total_cents {result['basket']['total_cents']}, expected {expected.total_cents}"
        )
    return problems


def _csv_problems(body: bytes, answer: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """The basket's CSV read as a spreadsheet would, and what disagrees with ``answer``."""
    problems = []
    if not body.startswith(b"\xef\xbb\xbf"):
        problems.append("no UTF-8 byte-order mark")
    if body.count(b"\r\n") != body.count(b"\n"):
        problems.append("not every line ends in CRLF")
    rows = list(csv.reader(io.StringIO(body.decode("utf-8-sig"), newline="")))
    if not rows or tuple(rows[0]) != BASKET_COLUMNS:
        return rows, [*problems, f"header {rows[:1]}, expected {list(BASKET_COLUMNS)}"]
    rows = rows[1:]
    kinds = [row[0] for row in rows]
    lines = [(row[1], row[2], int(row[4])) for row in rows if row[0] == "line"]
    if lines != list(BOM_LINES):
        problems.append(f"line rows (ref, sku, quantity) {lines}, expected {list(BOM_LINES)}")
    if kinds[-1:] != ["total"] or kinds.count("total") != 1:
        problems.append(f"rows of kinds {kinds}: not one total row, last")
        return rows, problems
    try:
        summed = sum(Decimal(row[8]) for row in rows if row[0] in ("line", "shipping"))
        total = Decimal(rows[-1][8])
    except InvalidOperation as exc:
        return rows, [*problems, f"an amount is not a decimal: {exc}"]
    if summed != total:
        problems.append(f"line and shipping amounts sum to {summed}, the total row says {total}")
    cents = answer["basket"]["total_cents"]
    if total != cents * CENT:
        problems.append(f"the total row says {total}, the JSON basket {cents} cents")
    if {row[9] for row in rows} != {answer["currency"]}:
        problems.append(f"currencies {sorted({row[9] for row in rows})}, the answer's is USD")
    return rows, problems


def _csv_line(cells: Sequence[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(cells)
    return out.getvalue()


async def csv_round_trip(
    session: aiohttp.ClientSession, lab: LabControl, batch_url: str
) -> list[Outcome]:
    """A KiCad-style BOM posted as CSV; then the same file asked for its basket as CSV."""
    await lab.fresh()
    url = f"{batch_url}/api/carts"
    status, body, _ = await _posted_bom(session, f"{url}?explain=1", f"bom-{secrets.token_hex(3)}")
    result: dict[str, Any] = json.loads(body)
    if status != 200:
        raise LabError(f"QuoteFlow answered {status}: {result}")
    await lab.wait_idle()
    attempts = await lab.attempts(result["request_id"])
    problems = _bom_problems(result)
    picks = {pick["sku"]: pick for pick in result["basket"]["picks"]}
    bought = "; ".join(
        f"{line.get('ref')} {line['sku']} x {line['quantity']}: "
        + (
            f"{picks[line['sku']]['supplier']} {picks[line['sku']]['line_cents']}"
            if line["sku"] in picks
            else "unquoted"
        )
        for line in result["lines"]
    )
    skipped = ", ".join(f"row {s['row']} ({s['reason']})" for s in result["skipped_rows"])
    notes = [
        f"lines: {bought}",
        f"skipped_rows: {skipped}; ignored_columns: {', '.join(result['ignored_columns'])}",
        f"basket {result['basket']['total_cents']} cents from "
        f"{', '.join(_basket_suppliers(result))}",
    ]
    first = _cart_row(BOM_CSV, result, attempts, problems, notes)

    await lab.fresh()
    request_id = f"bom-csv-{secrets.token_hex(3)}"
    status, body, client_ms = await _posted_bom(session, f"{url}?format=csv", request_id)
    await lab.wait_idle()
    attempts = await lab.attempts(request_id)
    if status != 200:
        problems = [f"QuoteFlow answered {status}: {body[:200]!r}"]
        rows: list[list[str]] = []
    else:
        rows, problems = _csv_problems(body, result)
    for supplier, expected in (BASKET_CSV.attempts or {}).items():
        if attempts[supplier] != expected:
            problems.append(f"{supplier} got {attempts[supplier]} calls, expected {expected}")
    shipped = tuple(s for s in SUPPLIERS if any(r[:1] == ["shipping"] and r[6] == s for r in rows))
    shown = (0, 1, 2, 4, 6, 7, 8)  # kind, ref, sku, quantity, supplier, unit_price, amount
    notes = [
        f"{len(body)} bytes, {len(rows) + 1} rows (CRLF, a byte-order mark); read back, "
        "some columns:",
        *(
            f"  {_csv_line([row[i] for i in shown if i < len(row)])}"
            for row in [list(BASKET_COLUMNS), *rows]
        ),
        f"line + shipping amounts = total row = the JSON basket's "
        f"{result['basket']['total_cents']} cents",
    ]
    if problems:
        notes.pop()
    second = Outcome(BASKET_CSV, _initials(shipped), {}, attempts, "-", client_ms, problems, notes)
    return [first, second]


# -- approved alternates: a line bought as another make of the same part (issue 49) --------

OUT_OF_STOCK_SKU: Final = "CAP-100N"
ALTERNATE_SKU: Final = "CAP-100N-B"
ALTERNATE_LINES: Final = (
    ("R1,R2", "BOM-001", 2, ()),
    ("C1-C10", OUT_OF_STOCK_SKU, 10, (ALTERNATE_SKU,)),
)
"""(ref, SKU, quantity, alternates) of the cart: CAP-100N is out of stock at every supplier,
its alternate in stock at boreal alone (the lab's catalogue)."""
ALTERNATE_PICKED: Final = Case(
    "basket: an alternate picked",
    "C1-C10's CAP-100N is out of stock everywhere; its approved alternate CAP-100N-B, asked "
    "of every supplier in the same batch calls, is in stock at boreal: the line is bought as "
    "CAP-100N-B (bought_sku), the basket complete",
    best=None,
    failures={"atlas": "not_found", "cedar": "not_found"},
    attempts=dict.fromkeys(SUPPLIERS, 1),
)


async def alternate_picked(
    session: aiohttp.ClientSession, lab: LabControl, batch_url: str
) -> Outcome:
    """A line whose own SKU nobody has in stock, bought as its alternate."""
    await lab.fresh()
    request_id = f"cart-alternate-{secrets.token_hex(3)}"
    body = {
        "lines": [
            {
                "sku": sku,
                "quantity": quantity,
                "ref": ref,
                **({"alternates": list(alt)} if alt else {}),
            }
            for ref, sku, quantity, alt in ALTERNATE_LINES
        ]
    }
    async with session.post(
        f"{batch_url}/api/carts?explain=1", json=body, headers={"X-Request-ID": request_id}
    ) as response:
        result: dict[str, Any] = await response.json()
        if response.status != 200:
            raise LabError(f"QuoteFlow answered {response.status}: {result}")
    await lab.wait_idle()
    attempts = await lab.attempts(request_id)
    sizes = await lab.batch_sizes_of(request_id)
    problems = []
    if sizes != {name: [3] for name in SUPPLIERS}:
        problems.append(f"parts of each supplier's calls {sizes}, expected one call of 3 each")
    line = result["lines"][1]
    quoted = [(quote["sku"], quote["supplier"]) for quote in line["quotes"]]
    if quoted != [(ALTERNATE_SKU, "boreal")]:
        problems.append(
            f"{OUT_OF_STOCK_SKU}'s line quoted {quoted}, expected only boreal's {ALTERNATE_SKU}"
        )
    named = {(f["supplier"], f.get("sku")) for f in line["failures"]}
    if named != {("atlas", ALTERNATE_SKU), ("cedar", ALTERNATE_SKU)}:
        problems.append(
            f"failures name {sorted(named)}, expected atlas's and cedar's {ALTERNATE_SKU}"
        )
    pick = next((p for p in result["basket"]["picks"] if p["sku"] == OUT_OF_STOCK_SKU), None)
    offer = lookup("boreal", ALTERNATE_SKU)
    assert offer is not None
    # The batch dialect prices each part at its quantity's break.
    expected = (ALTERNATE_SKU, "boreal", break_price(offer, 10) * 10)
    got = None if pick is None else (pick.get("bought_sku"), pick["supplier"], pick["line_cents"])
    if got != expected:
        problems.append(
            f"the line's pick (bought_sku, supplier, line_cents) {got}, expected {expected}"
        )
    notes = [
        f"{OUT_OF_STOCK_SKU} x 10 (C1-C10): in stock nowhere; {ALTERNATE_SKU}: "
        + ", ".join(f"{f['supplier']} {f['code']}" for f in line["failures"])
        + f", boreal {break_price(offer, 10)} cents a unit at 10; each supplier asked all 3 SKUs "
        "in one call",
        "picks: "
        + "; ".join(
            f"{p['sku']} bought as {p['bought_sku']} from {p['supplier']} ({p['line_cents']})"
            for p in result["basket"]["picks"]
        )
        + f"; basket {result['basket']['total_cents']} cents",
    ]
    return _cart_row(ALTERNATE_PICKED, result, attempts, problems, notes)


async def cart_outcomes(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str, batch_url: str | None
) -> AsyncIterator[Outcome]:
    """The classic cart against the first QuoteFlow; the batch cases against ``batch_url``."""
    classic = await classic_cart(session, lab, service_url)
    yield classic
    if batch_url is None:
        return
    yield await batch_cart(session, lab, batch_url, classic)
    for run in (bad_entry, call_503, cheaper_basket, alternate_picked):
        yield await run(session, lab, batch_url)
    for outcome in await csv_round_trip(session, lab, batch_url):
        yield outcome


# -- offers: currencies at dated rates, sub-cent prices, MOQ, multiples, breaks (issue 47) --

OFFERS_LEAD: Final = (
    "offers, as suppliers quote them: each in its own currency, converted to the answer's "
    "(USD) at the lab's ECB-format rates (GET /fx/eurofxref-daily.xml, fetched by make run's "
    "QuoteFlows every second), sub-cent prices, minimum orders, order multiples and price "
    "breaks; every quote checked against the lab's price lists by docs/api.md's money rule"
)
NO_RATES: Final = (
    "QuoteFlow at {url} reads no rates (make run gives each the lab's: --fx-rates): "
    "its offer cases are left out."
)
ANSWERED_IN: Final = "USD"
"""The answers' currency: QuoteFlow's ``--currency`` as ``make run`` starts it (the default)."""
CENT: Final = Decimal("0.01")
"""The minor unit of every currency the lab's offers are in (USD, EUR)."""
FX_WITHIN_S: Final = 10.0
"""How long a QuoteFlow may take to fetch a changed feed: ``make run``'s refresh is 2 s, and a
failed fetch is retried after 1 s, then 2 (at most the refresh), each ± 20 %."""
STALE_DAYS: Final = 10
"""The stale feed's age: past ``--fx-max-age`` (6 days by default)."""
RATE_UP: Final = "1.3000"
"""A USD rate at which boreal's euros cost more than atlas's dollars (KB-001 × 10)."""
REEL_SKU: Final = "RES-0402-10K"
REEL: Final = 5000


@attrs.frozen
class Priced:
    """What one offer costs a buyer, by the money rule, in the answer currency's cents."""

    buy: int
    line_cents: int
    shipping_cents: int

    @property
    def total_cents(self) -> int:
        """The line and the shipping: what the ranking compares."""
        return self.line_cents + self.shipping_cents


def _cents(amount: Decimal, rate_from: Decimal, rate_to: Decimal) -> int:
    """``amount`` (major units) as invoiced, half-even to the cent, then converted (× ``rate_to``
    ÷ ``rate_from``, 34 digits) and rounded half-even once: cents of the answer's currency."""
    with localcontext() as context:
        context.prec = 34
        invoiced = amount.quantize(CENT, ROUND_HALF_EVEN)
        return int((invoiced * rate_to / rate_from * 100).to_integral_value(ROUND_HALF_EVEN))


def _priced(listed: PriceList, need: int, rate_from: Decimal, rate_to: Decimal) -> Priced | None:
    """The cheapest legal buy of ``need`` from ``listed`` (on a tie the smaller), found by
    trying every legal buy up to its stock; None: none is legal."""
    least = max(need, listed.moq, listed.breaks[0][0])
    first = -(-least // listed.multiple) * listed.multiple
    found: tuple[int, int] | None = None  # (line cents, buy)
    for buy in range(first, listed.stock + 1, listed.multiple):
        unit = next(price for start, price in reversed(listed.breaks) if start <= buy)
        line = _cents(Decimal(unit) * buy, rate_from, rate_to)
        if found is None or line < found[0]:
            found = (line, buy)
    if found is None:
        return None
    shipping = listed.shipping
    amount = Decimal(shipping) if isinstance(shipping, str) else Decimal(shipping) / 100
    return Priced(found[1], found[0], _cents(amount, rate_from, rate_to))


def _listed(supplier: str, sku: str, worked: bool) -> PriceList | None:
    """``supplier``'s offer for ``sku`` as the QuoteFlow asking it gets it: a price list (the
    classic and batch dialects), boreal's EUR price breaks (``worked``: the json dialect of
    docs/suppliers.md's worked suppliers), else one price in USD, as today."""
    listed = price_list(supplier, sku)
    if listed is not None:
        return listed
    offer = lookup(supplier, sku)
    if offer is None:
        return None
    if worked and supplier == "boreal":
        breaks = tuple((start, str(Decimal(cents) / 100)) for start, cents in price_breaks(offer))
        return PriceList(JSON_CURRENCY, breaks, offer.shipping_cents, offer.stock)
    unit = str(Decimal(offer.unit_cents) / 100)
    return PriceList(ANSWERED_IN, ((1, unit),), offer.shipping_cents, offer.stock)


def expected_offers(
    sku: str, need: int, rates: Mapping[str, Decimal], worked: bool = False
) -> dict[str, Priced]:
    """What QuoteFlow must answer for ``need`` of ``sku`` at ``rates`` (units per euro: the
    lab's feed), per supplier with a legal buy."""
    found = {}
    for supplier in SUPPLIERS:
        listed = _listed(supplier, sku, worked)
        if listed is None:
            continue
        priced = _priced(listed, need, rates[listed.currency], rates[ANSWERED_IN])
        if priced is not None:
            found[supplier] = priced
    return found


async def _lab_rates(lab: LabControl) -> dict[str, Decimal]:
    """The lab feed's rates now, units per euro (EUR itself 1)."""
    feed = await lab.fx()
    return {"EUR": Decimal(1), **{code: Decimal(rate) for code, rate in feed["rates"].items()}}


def _offer_problems(
    quotes: Sequence[Mapping[str, Any]], expected: Mapping[str, Priced], need: int
) -> list[str]:
    """How ``quotes`` differ from ``expected``: who quotes, what each buys, and its cents."""
    got = {quote["supplier"]: quote for quote in quotes}
    problems = []
    if set(got) != set(expected):
        problems.append(f"quotes from {sorted(got)}, expected {sorted(expected)}")
    for supplier, priced in expected.items():
        if (quote := got.get(supplier)) is None:
            continue
        line = quote.get("line_cents", quote.get("unit_cents", 0) * need)
        seen = (
            quote.get("buy_quantity", need),
            line,
            quote["shipping_cents"],
            quote["total_cents"],
        )
        wanted = (priced.buy, priced.line_cents, priced.shipping_cents, priced.total_cents)
        if seen != wanted:
            problems.append(f"{supplier}: bought, line, shipping, total {seen}, expected {wanted}")
    return problems


def _offer_words(quote: Mapping[str, Any], need: int) -> str:
    """A quote as a buyer reads it: how many at what price, and what that makes in cents."""
    offer = quote.get("offer")
    if offer is None:
        return (
            f"{quote['supplier']} {need} x {quote['unit_cents']} + {quote['shipping_cents']} = "
            f"{quote['total_cents']}"
        )
    rate = f" at {offer['rate']} ({offer['rate_date']})" if "rate" in offer else ""
    return (
        f"{quote['supplier']} {quote.get('buy_quantity', need)} x {offer['unit_price']} "
        f"{offer['currency']} + {offer['shipping']}{rate}: {quote['line_cents']} + "
        f"{quote['shipping_cents']} = {quote['total_cents']}"
    )


def _quotes_words(quotes: Sequence[Mapping[str, Any]], need: int) -> str:
    return "; ".join(_offer_words(quote, need) for quote in quotes) + " (cents)"


def _rate(result: Mapping[str, Any], supplier: str) -> Decimal | None:
    """The rate ``supplier``'s quote in ``result`` was converted at (None: not converted)."""
    for quote in result.get("quotes", ()):
        if quote["supplier"] == supplier and "rate" in quote.get("offer", {}):
            return Decimal(quote["offer"]["rate"])
    return None


def _quote_of(result: Mapping[str, Any], supplier: str) -> Mapping[str, Any] | None:
    return next((q for q in result.get("quotes", ()) if q["supplier"] == supplier), None)


async def _asked_until(
    session: aiohttp.ClientSession,
    service_url: str,
    done: Callable[[dict[str, Any]], bool],
    **body: object,
) -> tuple[float | None, dict[str, Any]]:
    """Ask every 0.2 s until ``done(answer)``: the seconds it took (None: not within
    ``FX_WITHIN_S``), and the last answer."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    tag = secrets.token_hex(3)
    asked = 0
    while True:
        result = await _explained(session, service_url, f"offers{asked}-{tag}", **body)
        if done(result):
            return loop.time() - began, result
        if loop.time() - began > FX_WITHIN_S:
            return None, result
        asked += 1
        await asyncio.sleep(0.2)


async def _at_the_feeds_rate(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str, **body: object
) -> tuple[list[str], dict[str, Any], dict[str, Decimal]]:
    """Ask until boreal's quote is converted at the feed's USD rate now (QuoteFlow takes a
    changed feed at its next fetch): a note or a problem, the answer, the feed's rates."""
    rates = await _lab_rates(lab)
    usd = rates[ANSWERED_IN]
    took, result = await _asked_until(
        session, service_url, lambda r: _rate(r, "boreal") == usd, **body
    )
    if took is None:
        return (
            [
                f"boreal's quote was not converted at the feed's USD {usd} within "
                f"{FX_WITHIN_S:g} s (make run has QuoteFlow fetch the rates every second)"
            ],
            result,
            rates,
        )
    return [], result, rates


@attrs.frozen
class FxState:
    """What a QuoteFlow's ``/metrics`` says of its rates."""

    fresh: float | None
    """``quoteflow_fx_rates_fresh``: 1 while its table is younger than ``--fx-max-age``
    (None: it reads no rates)."""
    failures: float
    """``quoteflow_fx_refresh_failures_total``, every reason together."""


async def fx_state(session: aiohttp.ClientSession, service_url: str) -> FxState:
    """A QuoteFlow's rates, as its ``/metrics`` has them."""
    fresh, failures = None, 0.0
    for line in (await _metric_names(session, service_url)).splitlines():
        if line.startswith("quoteflow_fx_rates_fresh "):
            fresh = float(line.rsplit(" ", 1)[1])
        elif line.startswith("quoteflow_fx_refresh_failures_total"):
            failures += float(line.rsplit(" ", 1)[1])
    return FxState(fresh, failures)


async def _fx_until(
    session: aiohttp.ClientSession, service_url: str, done: Callable[[FxState], bool]
) -> tuple[float | None, FxState]:
    """Read ``/metrics`` every 0.1 s until ``done``: the seconds it took (None: not within
    ``FX_WITHIN_S``), and the last state."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        state = await fx_state(session, service_url)
        if done(state):
            return loop.time() - began, state
        if loop.time() - began > FX_WITHIN_S:
            return None, state
        await asyncio.sleep(0.1)


async def _offer_row(
    lab: LabControl,
    case: Case,
    result: dict[str, Any],
    problems: list[str],
    notes: Sequence[str] = (),
) -> Outcome:
    await lab.wait_idle()
    return _row_of(case, result, await lab.attempts(result["request_id"]), problems, notes)


RATE_DAY: Final = Case(
    "KB-001 x 10, USD 1.0850",
    "through the worked suppliers: boreal quotes in EUR (9.90 from 10, shipping 2.50), "
    "converted at the feed's rate, its offer shown as given; atlas in USD as today "
    "(unit_cents); boreal is cheapest",
    request=AT_10,
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "boreal": "EUR 9.90"},
)
RATE_FLIPPED: Final = Case(
    f"KB-001 x 10, USD {RATE_UP}",
    f'the feed set to USD {RATE_UP} (PUT /fx {{"rates": {{"USD": "{RATE_UP}"}}}}): once '
    "QuoteFlow fetched it, the same 9.90 EUR cost more dollars and the ranking flipped",
    request=AT_10,
    best="atlas",
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "boreal": "EUR 9.90"},
)


async def ranking_by_rate(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[Outcome]:
    """KB-001 × 10 at the feed's rates, then with USD at 1.3000: boreal best, then atlas."""
    await lab.fresh()
    problems, day, rates = await _at_the_feeds_rate(session, lab, service_url, **AT_10)
    problems += _offer_problems(day["quotes"], expected_offers("KB-001", 10, rates, True), 10)
    outcomes = [await _offer_row(lab, RATE_DAY, day, problems, [_quotes_words(day["quotes"], 10)])]
    loop = asyncio.get_running_loop()
    await lab.set_fx(rates={"USD": RATE_UP})
    changed = loop.time()
    try:
        problems, flipped, rates = await _at_the_feeds_rate(session, lab, service_url, **AT_10)
    finally:
        await lab.reset_fx()
    took = loop.time() - changed
    problems += _offer_problems(flipped["quotes"], expected_offers("KB-001", 10, rates, True), 10)
    notes = [
        _quotes_words(flipped["quotes"], 10),
        f"QuoteFlow converted at {_rate(flipped, 'boreal')}, {took:.1f} s after the feed changed",
    ]
    outcomes.append(await _offer_row(lab, RATE_FLIPPED, flipped, problems, notes))
    return outcomes


NEED_7: Final = Case(
    "RES-0402-1K: need 7, buy 10",
    "0402 resistors at fractions of a cent: atlas sells from 10 in tens (moq, multiple), "
    "cedar's 10+ break makes 10 cheaper than 7, boreal sells reels of 5000 in EUR: each "
    "quote buys its cheapest legal quantity (buy_quantity), and cedar's 10 cost least",
    request={"sku": "RES-0402-1K", "quantity": 7},
    best="cedar",
    attempts=EVERYONE_ONCE,
    prices={"atlas": "USD 0.01", "boreal": "EUR 0.0021", "cedar": "USD 0.012"},
)
BREAK_100: Final = Case(
    "CAP-BULK-1: need 90, buy 100",
    "atlas's all-units break, 4.00 from 100, makes 100 (400.00) cheaper than 90 at 5.00 "
    "(450.00): QuoteFlow buys 100; cedar's 90 at 4.60 and 3.00 shipping come second; boreal "
    "does not sell it",
    request={"sku": "CAP-BULK-1", "quantity": 90},
    best="atlas",
    failures={"boreal": "not_found"},
    attempts=EVERYONE_ONCE,
    prices={"atlas": "USD 4.00", "cedar": 460},
)
REEL_LINE: Final = Case(
    f"cart: {REEL_SKU} x {REEL}",
    f"a cart line of {REEL} resistors: cedar's reel at 0.0019 USD each, a fifth of a cent, "
    "is 9.50 exactly (line_cents 950, no unit_cents: a unit costs no whole cent), and the "
    "basket buys it; boreal's 0.0030 EUR converted, atlas's 0.0033",
    best=None,
    attempts=None,
)


async def reel_offers(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str, batch: bool
) -> list[Outcome]:
    """A need of 7 bought as 10, 100 cheaper than 90, and a reel as a cart line: the lab's
    price lists, answered in its batch dialect (``batch``) or in the classic protocol."""
    await lab.fresh()
    # boreal's EUR reel: an earlier case's rate may be in this QuoteFlow's table until its
    # next fetch, so asked until it is the feed's.
    sku, need = "RES-0402-1K", 7
    problems, result, rates = await _at_the_feeds_rate(
        session, lab, service_url, sku=sku, quantity=need
    )
    problems += _offer_problems(result["quotes"], expected_offers(sku, need, rates), need)
    notes = [_quotes_words(result["quotes"], need)]
    outcomes = [await _offer_row(lab, NEED_7, result, problems, notes)]
    await lab.fresh()
    sku, need = "CAP-BULK-1", 90
    result = await _explained(
        session, service_url, f"break-{secrets.token_hex(3)}", sku=sku, quantity=need
    )
    problems = _offer_problems(result["quotes"], expected_offers(sku, need, rates), need)
    # The classic protocol answers 404 for a part a supplier does not sell.
    case = BREAK_100 if batch else attrs.evolve(BREAK_100, failures={"boreal": "http_404"})
    notes = [_quotes_words(result["quotes"], need)]
    outcomes.append(await _offer_row(lab, case, result, problems, notes))
    await lab.fresh()
    cart_id = f"cart-reel-{secrets.token_hex(3)}"
    result = await _cart(session, service_url, cart_id, (REEL_SKU,), REEL)
    await lab.wait_idle()
    (line,) = result["lines"]
    expected = expected_offers(REEL_SKU, REEL, rates)
    problems = _offer_problems(line["quotes"], expected, REEL)
    cheapest = min(expected, key=lambda supplier: expected[supplier].total_cents)
    picks = result["basket"]["picks"]
    if [(p["supplier"], p.get("line_cents"), "unit_cents" in p) for p in picks] != [
        (cheapest, expected[cheapest].line_cents, False)
    ]:
        problems.append(f"the basket's picks {picks}, expected {cheapest}'s line alone")
    shipping = " + ".join(str(s["shipping_cents"]) for s in result["basket"]["shipping"])
    notes = [
        _quotes_words(line["quotes"], REEL),
        f"the basket: {', '.join(p['supplier'] for p in picks)}'s line_cents "
        f"{', '.join(str(p.get('line_cents')) for p in picks)} + shipping {shipping} = "
        f"{result['basket']['total_cents']}",
    ]
    attempts = await lab.attempts(result["request_id"])
    outcomes.append(_cart_row(REEL_LINE, result, attempts, problems, notes))
    return outcomes


FEED_DOWN: Final = Case(
    "rates feed down: table kept",
    "the feed answers 503 (PUT /fx, fault down): each fetch fails and is retried with backoff, "
    "and QuoteFlow keeps its last good table: the same answer. A feed that is down alone "
    "makes no_rate only for a QuoteFlow with no table yet (started while it is down), or "
    "once the kept table is older than --fx-max-age (6 days): the next case",
    request=AT_10,
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "boreal": "EUR 9.90"},
)
RATES_STALE: Final = Case(
    "rates stale: no_rate",
    f"the feed answers again, with a table dated {STALE_DAYS} days ago (fault stale); once "
    "QuoteFlow fetched it (/metrics: quoteflow_fx_rates_fresh 0), boreal's EUR quote is "
    "no_rate, never ranked at an old rate: boreal was asked as today, once, and not retried; "
    "atlas's USD quote needs no rate",
    request=AT_10,
    best="atlas",
    failures={"boreal": "no_rate"},
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200},
)
RATES_BACK: Final = Case(
    "rates back: boreal best again",
    "the feed fixed (DELETE /fx): at its next fetch QuoteFlow took today's table "
    "(quoteflow_fx_rates_fresh 1), and boreal's quote is converted, and cheapest, again",
    request=AT_10,
    attempts=EVERYONE_ONCE,
    prices={"atlas": 1200, "boreal": "EUR 9.90"},
)


async def rates_feed_faults(
    session: aiohttp.ClientSession, lab: LabControl, service_url: str
) -> list[Outcome]:
    """The feed down (the last good table kept), then stale (``no_rate``), then fixed."""
    await lab.fresh()
    setup, before, rates = await _at_the_feeds_rate(session, lab, service_url, **AT_10)
    expected = expected_offers("KB-001", 10, rates, worked=True)
    start = await fx_state(session, service_url)
    tag = secrets.token_hex(3)
    outcomes = []
    try:
        await lab.set_fx_fault({"kind": "down"})
        _, state = await _fx_until(session, service_url, lambda s: s.failures >= start.failures + 2)
        down = await _explained(session, service_url, f"fx-down-{tag}", **AT_10)
        failed = state.failures - start.failures
        problems = [*setup, *_offer_problems(down["quotes"], expected, 10)]
        if failed < 2:
            problems.append(
                f"quoteflow_fx_refresh_failures_total rose by {failed:g} in {FX_WITHIN_S:g} s "
                "of the feed down, expected 2 (a fetch and its retry)"
            )
        if state.fresh != 1.0:
            problems.append(f"quoteflow_fx_rates_fresh {state.fresh} while the table was kept")
        if _quote_of(down, "boreal") != _quote_of(before, "boreal"):
            problems.append("boreal's quote changed while the feed was down")
        served = (await lab.fx())["answers"].get("down", 0)
        notes = [
            f"the feed answered {served} fetch{'' if served == 1 else 'es'} 503 (make run's "
            "QuoteFlows'), this one's quoteflow_fx_refresh_failures_total rose by "
            f"{failed:g} (retried after about 1 s, then 2), its quoteflow_fx_rates_fresh still 1: "
            + _quotes_words(down["quotes"], 10)
            + ", as before"
        ]
        outcomes.append(await _offer_row(lab, FEED_DOWN, down, problems, notes))
        feed = await lab.set_fx(fault={"kind": "stale", "days": STALE_DAYS})
        dated = dt.date.fromisoformat(feed["date"]) - dt.timedelta(days=STALE_DAYS)
        took, state = await _fx_until(session, service_url, lambda s: s.fresh == 0.0)
        stale = await _explained(session, service_url, f"fx-stale-{tag}", **AT_10)
    finally:
        await lab.reset_fx()
    problems = _offer_problems(stale["quotes"], {"atlas": expected["atlas"]}, 10)
    if took is None:
        problems.append(
            f"quoteflow_fx_rates_fresh still {state.fresh} {FX_WITHIN_S:g} s after the feed "
            "went stale"
        )
    notes = [
        f"QuoteFlow took the table of {dated} {took or 0:.1f} s after the feed changed: "
        + _quotes_words(stale["quotes"], 10)
    ]
    outcomes.append(await _offer_row(lab, RATES_STALE, stale, problems, notes))
    await lab.fresh()
    took, state = await _fx_until(session, service_url, lambda s: s.fresh == 1.0)
    problems, back, rates = await _at_the_feeds_rate(session, lab, service_url, **AT_10)
    problems += _offer_problems(back["quotes"], expected_offers("KB-001", 10, rates, True), 10)
    if took is None:
        problems.append(f"quoteflow_fx_rates_fresh still {state.fresh} after {FX_WITHIN_S:g} s")
    notes = [
        f"quoteflow_fx_rates_fresh 1 again {took or 0:.1f} s after the feed was fixed: "
        + _quotes_words(back["quotes"], 10)
    ]
    outcomes.append(await _offer_row(lab, RATES_BACK, back, problems, notes))
    return outcomes


async def offer_outcomes(
    session: aiohttp.ClientSession,
    lab: LabControl,
    reels_url: str | None,
    batch: bool,
    rates_url: str | None,
) -> AsyncIterator[Outcome]:
    """The lab's price lists through ``reels_url`` (its batch suppliers' QuoteFlow if
    ``batch``); the rates cases through ``rates_url`` (the worked suppliers', boreal in EUR)."""
    if rates_url is not None:
        for outcome in await ranking_by_rate(session, lab, rates_url):
            yield outcome
    if reels_url is not None:
        for outcome in await reel_offers(session, lab, reels_url, batch):
            yield outcome
    if rates_url is not None:
        for outcome in await rates_feed_faults(session, lab, rates_url):
            yield outcome


async def demo(
    service_url: str,
    lab_url: str,
    dialects_url: str | None = None,
    batch_url: str | None = None,
    svg: Path | None = None,
    hedged_url: str | None = None,
) -> int:
    """Run every case in order and print the table; 0 if all behaved as expected.

    ``dialects_url``: a QuoteFlow asking docs/suppliers.md's worked suppliers at
    the same lab (``make run`` starts one); its cases come after the first
    QuoteFlow's. ``batch_url``: a QuoteFlow asking the same lab's suppliers in
    its batch dialect (``make run`` starts one); given, the cart cases come
    last: the classic cart against ``service_url`` (it needs nothing else),
    the batch ones against ``batch_url`` if a QuoteFlow answers there.
    ``hedged_url``: a QuoteFlow hedging boreal (``--hedge``; ``make run`` starts one);
    given, the hedge case comes after the coalescing and cache cases.
    """
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        lab = LabControl(session, lab_url)
        for name, url in (("QuoteFlow", service_url), ("provider lab", lab_url)):
            try:
                async with session.get(f"{url}/health") as response:
                    response.raise_for_status()
            except aiohttp.ClientError:
                print(f"demo: no {name} at {url}; start the pair with `make run` first")
                return 1
        suppliers = await supplier_names(session, service_url)
        outcomes = []
        if suppliers == SUPPLIERS:
            print(
                f"QuoteFlow {service_url}, provider lab {lab_url}; faults act on boreal.\n"
                "attempts: requests each supplier received with the request's id (lab /stats);\n"
                "boreal stopped: why QuoteFlow made no further attempt (its budget bill).\n"
            )
            print(_row(COLUMNS))
            cases = list(CASES)
            if await breaker_on(session, service_url):
                cases += BREAKER_CASES
            else:
                print("QuoteFlow's circuit breaker is off: its cases are left out.\n")
            runs, missing = await sharing_runs(session, service_url)
            for line in missing:
                print(f"QuoteFlow's {line}")
            if hedged_url is None:
                missing.append("--hedged")
                print(NO_HEDGED.format(why="given"))
            elif why := await hedged_at(session, hedged_url):
                missing.append(hedged_url)
                print(NO_HEDGED.format(why=why))
                hedged_url = None
            if dialects_url and not await worked_suppliers_at(session, dialects_url):
                missing.append(dialects_url)
                print(
                    f"No QuoteFlow of the worked suppliers at {dialects_url} (make run starts "
                    "one): the cases of the lab's dialects are left out."
                )
                dialects_url = None
            carts = batch_url is not None
            offers = True
            if batch_url and not await worked_suppliers_at(session, batch_url):
                missing.append(batch_url)
                print(NO_BATCH.format(url=batch_url))
                batch_url = None
            if missing:
                print()
        else:
            print(
                f"QuoteFlow {service_url} asks a catalogue of {len(suppliers)}: "
                f"{', '.join(suppliers)}; provider lab {lab_url} serves them.\n"
                f"attempts: requests each received ({'/'.join(suppliers)}); stopped: why the "
                "case's supplier got no further attempt.\n"
            )
            print(_row(CATALOGUE_COLUMNS))
            cases = catalogue_cases(suppliers)
            runs = []  # the coalescing and cache cases are written for the lesson's three
            hedged_url = None  # so is the hedge case
            dialects_url = None  # so are the worked suppliers
            carts = False  # and the carts
            offers = False  # and the offers
        print(_row(["-" * w for w in WIDTHS]))
        for case in cases:
            outcome = await run_case(session, lab, service_url, case, suppliers, svg)
            outcomes.append(outcome)
            print("\n".join(format_outcome(outcome, suppliers)), flush=True)
        if suppliers == SUPPLIERS:
            print(f"{BURST_LEAD}:", flush=True)
            for outcome in await slow_burst(session, lab, service_url):
                outcomes.append(outcome)
                print("\n".join(format_outcome(outcome)), flush=True)
        for run in runs:
            outcome = await run(session, lab, service_url)
            outcomes.append(outcome)
            print("\n".join(format_outcome(outcome)), flush=True)
        if hedged_url:
            print(f"{HEDGE_LEAD} {hedged_url}:", flush=True)
            outcome = await hedged_call(session, lab, hedged_url, svg)
            outcomes.append(outcome)
            print("\n".join(format_outcome(outcome)), flush=True)
        if dialects_url:
            print(f"{DIALECTS_LEAD} {dialects_url}:", flush=True)
            async for outcome in dialect_outcomes(session, lab, dialects_url):
                outcomes.append(outcome)
                print("\n".join(format_outcome(outcome)), flush=True)
        if carts:
            where = f"the classic QuoteFlow {service_url} asks each line apart" + (
                "" if batch_url is None else f", the batch suppliers' {batch_url} many a call"
            )
            print(f"{CART_LEAD}; {where}:", flush=True)
            async for outcome in cart_outcomes(session, lab, service_url, batch_url):
                outcomes.append(outcome)
                print("\n".join(format_outcome(outcome)), flush=True)
        if offers:
            reels_url: str | None = batch_url or service_url
            for url in dict.fromkeys(u for u in (reels_url, dialects_url) if u):
                if (await fx_state(session, url)).fresh is None:
                    print(NO_RATES.format(url=url), flush=True)
                    reels_url, dialects_url = (
                        None if reels_url == url else reels_url,
                        None if dialects_url == url else dialects_url,
                    )
            through = [f"the reels through {reels_url}"] if reels_url else []
            if dialects_url:
                through.insert(0, f"the rates through the worked suppliers' {dialects_url}")
            if through:
                print(f"{OFFERS_LEAD}; {', '.join(through)}:", flush=True)
            batch = reels_url is not None and reels_url == batch_url
            async for outcome in offer_outcomes(session, lab, reels_url, batch, dialects_url):
                outcomes.append(outcome)
                print("\n".join(format_outcome(outcome)), flush=True)
        await lab.fresh()
    wrong = [o.case.name for o in outcomes if o.problems]
    print()
    if wrong:
        print(f"{len(wrong)} of {len(outcomes)} cases did not behave as expected: {wrong}")
        return 1
    print(f"All {len(outcomes)} cases behaved as the contract says.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m provider_lab.demo [--service URL] [--lab URL] [--dialects URL]
    [--batch URL] [--hedged URL] [--svg DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m provider_lab.demo",
        description="Drive every scenario and fault through a running QuoteFlow and lab.",
    )
    parser.add_argument("--service", default="http://127.0.0.1:9100", help="QuoteFlow's URL")
    parser.add_argument("--lab", default="http://127.0.0.1:9101", help="the provider lab's URL")
    parser.add_argument(
        "--dialects",
        default="http://127.0.0.1:9103",
        help="the URL of a QuoteFlow asking docs/suppliers.md's worked suppliers at the same lab "
        "(make run starts one; '': leave their cases out)",
    )
    parser.add_argument(
        "--batch",
        default="http://127.0.0.1:9104",
        help="the URL of a QuoteFlow asking the same lab's suppliers in its batch dialect "
        "(make run starts one); the cart cases come last ('': leave them out)",
    )
    parser.add_argument(
        "--hedged",
        default="",
        help="the URL of a QuoteFlow hedging boreal (--hedge) at the same lab (make run starts "
        "one at http://127.0.0.1:9105); its hedge case comes after the cache cases (not given: "
        "left out)",
    )
    parser.add_argument(
        "--svg",
        type=Path,
        metavar="DIR",
        help="write each case of the main table, and the hedge case, as a waterfall, "
        "DIR/<case>.svg (the answer asked with ?explain=svg and checked from the drawing)",
    )
    args = parser.parse_args(argv)
    if args.svg is not None:
        args.svg.mkdir(parents=True, exist_ok=True)
    return asyncio.run(
        demo(
            args.service.rstrip("/"),
            args.lab.rstrip("/"),
            args.dialects.rstrip("/") or None,
            args.batch.rstrip("/") or None,
            args.svg,
            args.hedged.rstrip("/") or None,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
