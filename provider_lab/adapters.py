"""Adapters for the lab's three foreign dialects, written as a QuoteFlow user would write them.

A catalogue entry names one::

    [[supplier]]
    name = "boreal"
    url = "http://127.0.0.1:9101/json/boreal/quote"
    adapter = "provider_lab.adapters:json_dialect"

QuoteFlow calls ``adapter(payload, asked)``: ``payload`` is the decoded JSON of
a 200, ``asked`` what it asked for (``asked.supplier``, ``asked.sku``,
``asked.quantity``). The adapter returns the supplier protocol's five keys —
``supplier``, ``sku``, ``unit_cents``, ``shipping_cents``, ``stock``, the last
three integers — or raises: whatever it raises is the supplier's data being
unusable (QuoteFlow's ``invalid_data``).

The batch dialect's adapter, :func:`batch_dialect`, reads one call of many
lines: ``asked`` is then a sequence of such objects, one per line of the call,
and it returns a mapping from each SKU it could read to its five keys or to
``"not_found"``. A SKU it leaves out is that line's ``invalid_data`` alone; if
it raises, every line of the call is ``invalid_data``. Its catalogue entry::

    [[supplier]]
    name = "atlas"
    method = "POST"
    url = "http://127.0.0.1:9101/batch/atlas/match"
    adapter = "provider_lab.adapters:batch_dialect"
    [supplier.batch]
    max_items = 50
    items = "parts"
    [supplier.body]
    parts = [ { mpn = "{sku}", qty = "{quantity}" } ]
    scenario = "{scenario}"

All three are pure functions of their arguments and use the standard library only:
nothing from ``quoteflow`` (``asked`` is duck-typed) and nothing from the rest
of the lab, which writes these formats from its own definitions while these
read them from theirs — so a drift between the two fails a test.
"""

from __future__ import annotations

import decimal
import functools
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Final, Protocol

CURRENCY: Final = "EUR"
MAX_MONEY_TEXT: Final = 30
"""Longer decimal strings are refused: with at most 30 digits, cents are computed exactly."""

_MONEY: Final = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# Exact or nothing: any rounding raises instead of passing a price off as another.
_EXACT: Final = decimal.Context(
    prec=2 * MAX_MONEY_TEXT, traps=[decimal.Inexact, decimal.Rounded, decimal.InvalidOperation]
)


class Asked(Protocol):
    """What QuoteFlow asked a supplier for; any object with these attributes will do."""

    @property
    def supplier(self) -> str:
        """The supplier's name in the catalogue."""

    @property
    def sku(self) -> str:
        """The SKU asked for."""

    @property
    def quantity(self) -> int:
        """How many units the caller wants."""


class AdapterError(ValueError):
    """The payload is not a usable quote for what was asked; the message names the field."""


def json_dialect(payload: object, asked: Asked) -> dict[str, str | int]:
    """The ``json`` dialect's price list as the quote for ``asked.quantity`` units.

    The payload::

        {"partNumber": "KB-001", "currency": "EUR",
         "priceBreaks": [{"minQuantity": 1, "unitPrice": "12.00"},
                         {"minQuantity": 10, "unitPrice": "10.80"}, ...],
         "shipping": "3.00", "available": 20}

    The unit price is that of the break with the largest ``minQuantity`` not
    above the quantity asked. Money is a decimal string of euros, turned into
    cents with :class:`~decimal.Decimal` (never a float); refused: a fraction of
    a cent, a number instead of a string, a currency other than EUR, a
    ``partNumber`` other than the SKU asked, a break repeated or malformed (each
    break is checked, not only the one used), no break for the quantity, a stock
    that is not a non-negative integer. Other keys are ignored.

    It runs on every answer of the supplier, so it does one pass over the
    breaks and converts each price string once per process (:func:`cents`).
    """
    if type(payload) is not dict:
        raise AdapterError("payload: not a JSON object")
    sku = asked.sku
    if type(sku) is not str or payload.get("partNumber") != sku:
        raise AdapterError("partNumber: not the SKU asked")
    if payload.get("currency") != CURRENCY:
        raise AdapterError(f"currency: not {CURRENCY}")
    quantity = asked.quantity
    if type(quantity) is not int or quantity < 1:
        raise AdapterError("asked.quantity: not a positive integer")
    breaks = payload.get("priceBreaks")
    if type(breaks) is not list or not breaks:
        raise AdapterError("priceBreaks: not a non-empty list")
    seen: set[int] = set()
    best = unit_cents = 0
    for index, entry in enumerate(breaks):
        if type(entry) is not dict:
            raise AdapterError(f"priceBreaks[{index}]: not an object")
        least = entry.get("minQuantity")
        if type(least) is not int or least < 1:
            raise AdapterError(f"priceBreaks[{index}].minQuantity: not a positive integer")
        if least in seen:
            raise AdapterError(f"priceBreaks[{index}].minQuantity: {least} is repeated")
        seen.add(least)
        price = _cents(entry.get("unitPrice"))
        if price is None:
            cents(entry.get("unitPrice"), f"priceBreaks[{index}].unitPrice")  # raises, naming why
        elif best < least <= quantity:
            best, unit_cents = least, price
    if not best:
        raise AdapterError(f"priceBreaks: none for a quantity of {quantity}")
    return {
        "supplier": asked.supplier,
        "sku": sku,
        "unit_cents": unit_cents,
        "shipping_cents": cents(payload.get("shipping"), "shipping"),
        "stock": _count(payload.get("available"), "available"),
    }


def path_dialect(payload: object, asked: Asked) -> dict[str, str | int]:
    """The ``path`` dialect's answer, its fields renamed.

    The payload::

        {"part": "KB-001", "qty": 10, "unitPriceCents": 1080, "freightCents": 300, "onHand": 20}

    The supplier has already priced the quantity, so the fields map one to one:
    ``unitPriceCents`` → ``unit_cents``, ``freightCents`` → ``shipping_cents``,
    ``onHand`` → ``stock``. Refused: a ``part`` other than the SKU asked, a
    ``qty`` other than the quantity asked (the price would be another break's),
    any of the three numbers not a non-negative integer (``true``, ``1080.0``
    and ``"1080"`` included).
    """
    if type(payload) is not dict:
        raise AdapterError("payload: not a JSON object")
    if type(asked.sku) is not str or payload.get("part") != asked.sku:
        raise AdapterError("part: not the SKU asked")
    qty = payload.get("qty")
    if type(qty) is not int or qty != asked.quantity:
        raise AdapterError("qty: not the quantity asked")
    return {
        "supplier": asked.supplier,
        "sku": asked.sku,
        "unit_cents": _count(payload.get("unitPriceCents"), "unitPriceCents"),
        "shipping_cents": _count(payload.get("freightCents"), "freightCents"),
        "stock": _count(payload.get("onHand"), "onHand"),
    }


NOT_FOUND: Final = "not_found"
"""What :func:`batch_dialect` maps a SKU to when the supplier said it has no such part."""
OFFER_KEYS: Final = ("unitCents", "shippingCents", "stock")
_OFFERED: Final = frozenset({"mpn", "qty", "offer"})
_REFUSED: Final = frozenset({"mpn", "qty", "error"})
_ERROR_KEYS: Final = frozenset({"code", "message"})

BatchResult = dict[str, str | int] | str
"""One line's result: the protocol's five keys, or :data:`NOT_FOUND`."""


def batch_dialect(payload: object, asked: Iterable[Asked]) -> dict[str, BatchResult]:
    """The ``batch`` dialect's results for the lines of one call, by SKU.

    The payload::

        {"results": [
            {"mpn": "KB-001", "qty": 10,
             "offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20}},
            {"mpn": "NOPE", "qty": 1,
             "error": {"code": "not_found", "message": "atlas has no part NOPE"}}]}

    ``asked`` holds one object per line of the call (``supplier``, ``sku``,
    ``quantity``). Entries are matched to lines by ``mpn``, never by position,
    so results in any order are read alike. An entry becomes the five keys
    (``unitCents`` → ``unit_cents``, ``shippingCents`` → ``shipping_cents``,
    ``stock`` → ``stock``), or ``"not_found"`` for the error code
    ``not_found``. Left out of the mapping (QuoteFlow: that line's
    ``invalid_data``): a line no entry answers, an entry whose ``qty`` is not
    the line's quantity (its price would be another break's), any key more or
    less than the shapes above, a number that is not a non-negative integer
    (``true``, ``1080.0`` and ``"1080"`` included), another error code, and a
    part answered twice. An entry for a part not asked is ignored.

    Raises :class:`AdapterError` (every line of the call ``invalid_data``) if the
    payload is not exactly ``{"results": [...]}``, or if a SKU is asked twice or
    is not a string (the lines cannot be told apart).
    """
    lines: dict[str, Asked] = {}
    for line in asked:
        sku = line.sku
        if type(sku) is not str or sku in lines:
            raise AdapterError("asked: a SKU that is not a string, or asked twice")
        lines[sku] = line
    if type(payload) is not dict or set(payload) != {"results"}:
        raise AdapterError('payload: not a JSON object {"results": [...]}')
    results = payload["results"]
    if type(results) is not list:
        raise AdapterError("results: not a list")
    found: dict[str, BatchResult] = {}
    refused: set[str] = set()
    for entry in results:
        mpn = entry.get("mpn") if type(entry) is dict else None
        if type(mpn) is not str or mpn not in lines:
            continue  # not an entry for a line of this call: nothing to read
        if mpn in found or mpn in refused:
            found.pop(mpn, None)  # answered twice: which one holds is anyone's guess
            refused.add(mpn)
            continue
        result = _batch_entry(entry, lines[mpn])
        if result is None:
            refused.add(mpn)
        else:
            found[mpn] = result
    return {sku: found[sku] for sku in lines if sku in found}


def _batch_entry(entry: dict[str, object], line: Asked) -> BatchResult | None:
    """One entry for ``line`` as its result, or ``None`` if it cannot be read."""
    qty = entry.get("qty")
    if type(qty) is not int or qty != line.quantity:
        return None
    keys = entry.keys()
    if keys == _OFFERED:
        offer = entry["offer"]
        if type(offer) is not dict or offer.keys() != set(OFFER_KEYS):
            return None
        unit, shipping, stock = (offer[key] for key in OFFER_KEYS)
        if not all(type(value) is int and value >= 0 for value in (unit, shipping, stock)):
            return None
        return {
            "supplier": line.supplier,
            "sku": line.sku,
            "unit_cents": unit,
            "shipping_cents": shipping,
            "stock": stock,
        }
    if keys == _REFUSED:
        error = entry["error"]
        if (
            type(error) is dict
            and error.keys() == _ERROR_KEYS
            and error["code"] == NOT_FOUND
            and type(error["message"]) is str
        ):
            return NOT_FOUND
    return None


def cents(value: object, field: str) -> int:
    """A decimal string of euros (``"10.80"``) as whole cents (1080), exactly.

    Only plain decimals: ASCII digits, an optional point and more digits; no
    sign, exponent, spaces or underscores (all of which :class:`Decimal` would
    accept), at most ``MAX_MONEY_TEXT`` characters. ``AdapterError`` naming
    ``field`` if the value is not one, or holds a fraction of a cent.
    """
    amount = _cents(value)
    if amount is not None:
        return amount
    if type(value) is not str or len(value) > MAX_MONEY_TEXT or not _MONEY.fullmatch(value):
        raise AdapterError(f"{field}: not a decimal string of euros")
    raise AdapterError(f"{field}: a fraction of a cent")


def _cents(value: object) -> int | None:
    """:func:`cents`, or ``None`` for anything it refuses."""
    return _text_cents(value) if type(value) is str else None


@functools.lru_cache(maxsize=4096)
def _text_cents(text: str) -> int | None:
    # Memoised: a supplier sends the same few price strings on every answer, and
    # the result depends on the text alone, so the adapter stays a pure function.
    if len(text) > MAX_MONEY_TEXT or not _MONEY.fullmatch(text):
        return None
    whole, denominator = _EXACT.multiply(Decimal(text), 100).as_integer_ratio()
    return whole if denominator == 1 else None


def _count(value: object, field: str) -> int:
    if type(value) is not int or value < 0:
        raise AdapterError(f"{field}: not a non-negative integer")
    return value
