"""Adapters for the lab's three foreign dialects, written as a QuoteFlow user would write them.

A catalogue entry names one::

    [[supplier]]
    name = "boreal"
    url = "http://127.0.0.1:9101/json/boreal/quote"
    adapter = "provider_lab.adapters:json_dialect"

QuoteFlow calls ``adapter(payload, asked)``: ``payload`` is the decoded JSON of
a 200, ``asked`` what it asked for (``asked.supplier``, ``asked.sku``,
``asked.quantity``). The adapter returns the supplier protocol's offer — the
five keys ``supplier``, ``sku``, ``unit_cents``, ``shipping_cents``, ``stock``
as they always were, or an offer with the protocol's optional fields
(``currency``; ``unit_price`` or ``breaks`` as decimal strings of major units
instead of ``unit_cents``; ``shipping`` instead of ``shipping_cents``; ``moq``,
``multiple``) — or raises: whatever it raises is the supplier's data being
unusable (QuoteFlow's ``invalid_data``). An adapter passes the supplier's offer
through, in its own currency and at its own prices: QuoteFlow picks the quantity
it buys (breaks, MOQ, multiple) and converts the currency.

The batch dialect's adapter, :func:`batch_dialect`, reads one call of many
lines: ``asked`` is then a sequence of such objects, one per line of the call,
and it returns a mapping from each SKU it could read to its offer or to
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

import re
from collections.abc import Iterable
from typing import Final, Protocol

MAX_MONEY_TEXT: Final = 30
"""Longer decimal strings are refused."""
MAX_COUNT: Final = 1_000_000_000
"""The largest ``moq`` and ``multiple`` an offer may carry."""

_DECIMAL: Final = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]{1,6})?")
"""A decimal string of the offer protocol: no sign or exponent, at most six decimals."""
_CURRENCY: Final = re.compile(r"[A-Z]{3}")


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


def json_dialect(payload: object, asked: Asked) -> dict[str, object]:
    """The ``json`` dialect's price list as the supplier's offer, passed through.

    The payload::

        {"partNumber": "KB-001", "currency": "EUR",
         "priceBreaks": [{"minQuantity": 1, "unitPrice": "12.00"},
                         {"minQuantity": 10, "unitPrice": "10.80"}, ...],
         "shipping": "3.00", "available": 20}

    The offer, in the supplier's own currency and its own decimal strings (QuoteFlow
    picks the break for the quantity it buys, and converts the currency)::

        {"supplier": "boreal", "sku": "KB-001", "currency": "EUR",
         "breaks": [{"quantity": 1, "unit_price": "12.00"},
                    {"quantity": 10, "unit_price": "10.80"}, ...],
         "shipping": "3.00", "stock": 20}

    The breaks are sorted by quantity; the currency is passed through as given (any
    three upper-case letters: whether QuoteFlow knows it is QuoteFlow's to say). Refused:
    a currency that is not such a code, a ``partNumber`` other than the SKU asked, no
    breaks, a break repeated or malformed, a price that is not a plain decimal string of
    at most six decimals (a JSON number, a sign, an exponent, spaces, ``NaN``), a stock
    that is not a non-negative integer. Sub-cent prices are fine (``"0.0034"``). Other
    keys are ignored.
    """
    if type(payload) is not dict:
        raise AdapterError("payload: not a JSON object")
    sku = asked.sku
    if type(sku) is not str or payload.get("partNumber") != sku:
        raise AdapterError("partNumber: not the SKU asked")
    currency = payload.get("currency")
    if type(currency) is not str or not _CURRENCY.fullmatch(currency):
        raise AdapterError("currency: not a three-letter upper-case code")
    breaks = payload.get("priceBreaks")
    if type(breaks) is not list or not breaks:
        raise AdapterError("priceBreaks: not a non-empty list")
    read: dict[int, str] = {}
    for index, entry in enumerate(breaks):
        if type(entry) is not dict:
            raise AdapterError(f"priceBreaks[{index}]: not an object")
        least = entry.get("minQuantity")
        if type(least) is not int or least < 1:
            raise AdapterError(f"priceBreaks[{index}].minQuantity: not a positive integer")
        if least in read:
            raise AdapterError(f"priceBreaks[{index}].minQuantity: {least} is repeated")
        read[least] = decimal_text(entry.get("unitPrice"), f"priceBreaks[{index}].unitPrice")
    return {
        "supplier": asked.supplier,
        "sku": sku,
        "currency": currency,
        "breaks": [{"quantity": least, "unit_price": read[least]} for least in sorted(read)],
        "shipping": decimal_text(payload.get("shipping"), "shipping"),
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
"""A batch offer as it always was: the unit price for the line's quantity, in cents."""
PRICE_LIST_KEYS: Final = frozenset(
    {"unitCents", "breaks", "shippingCents", "shipping", "stock", "currency", "moq", "multiple"}
)
"""What a batch offer may carry besides: its currency, an order's minimum and multiple,
all-units price breaks, shipping as a decimal string."""
_BREAK_KEYS: Final = frozenset({"quantity", "unitPrice"})
_OFFERED: Final = frozenset({"mpn", "qty", "offer"})
_REFUSED: Final = frozenset({"mpn", "qty", "error"})
_ERROR_KEYS: Final = frozenset({"code", "message"})

BatchResult = dict[str, object] | str
"""One line's result: the protocol's offer, or :data:`NOT_FOUND`."""


def batch_dialect(payload: object, asked: Iterable[Asked]) -> dict[str, BatchResult]:
    """The ``batch`` dialect's results for the lines of one call, by SKU.

    The payload::

        {"results": [
            {"mpn": "KB-001", "qty": 10,
             "offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20}},
            {"mpn": "RES-0402-1K", "qty": 7,
             "offer": {"currency": "USD", "moq": 10, "multiple": 10,
                       "breaks": [{"quantity": 1, "unitPrice": "0.0100"},
                                  {"quantity": 100, "unitPrice": "0.0060"}],
                       "shipping": "4.00", "stock": 50000}},
            {"mpn": "NOPE", "qty": 1,
             "error": {"code": "not_found", "message": "atlas has no part NOPE"}}]}

    ``asked`` holds one object per line of the call (``supplier``, ``sku``,
    ``quantity``). Entries are matched to lines by ``mpn``, never by position,
    so results in any order are read alike. An offer of exactly ``unitCents``,
    ``shippingCents`` and ``stock`` becomes the five keys as it always did
    (``unitCents`` → ``unit_cents``, ``shippingCents`` → ``shipping_cents``,
    ``stock`` → ``stock``). A price list — any of :data:`PRICE_LIST_KEYS`, with
    ``stock``, exactly one of ``unitCents`` and ``breaks``, exactly one of
    ``shippingCents`` and ``shipping`` — becomes the protocol's offer:
    ``currency``, ``moq`` and ``multiple`` as given, ``breaks`` → ``breaks``
    (``[{"quantity", "unit_price"}]``, sorted by quantity), ``shipping`` →
    ``shipping``. The error code ``not_found`` becomes ``"not_found"``. Left out
    of the mapping (QuoteFlow: that line's ``invalid_data``): a line no entry
    answers, an entry whose ``qty`` is not the line's quantity (its price would
    be another break's), any key more or less than the shapes above, a count that
    is not a non-negative integer (``true``, ``1080.0`` and ``"1080"`` included),
    a ``moq`` or ``multiple`` not in 1–10**9, a currency not three upper-case
    letters, a price not a plain decimal string of at most six decimals, a break
    quantity repeated, another error code, and a part answered twice. An entry
    for a part not asked is ignored.

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
        if type(offer) is not dict:
            return None
        if offer.keys() == set(OFFER_KEYS):
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
        return _price_list(offer, line)
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


def _price_list(offer: dict[str, object], line: Asked) -> dict[str, object] | None:
    """A batch offer with any of :data:`PRICE_LIST_KEYS` as the protocol's offer, or ``None``."""
    if not offer.keys() <= PRICE_LIST_KEYS or "stock" not in offer:
        return None
    if ("unitCents" in offer) == ("breaks" in offer):
        return None  # exactly one unit price
    if ("shippingCents" in offer) == ("shipping" in offer):
        return None  # exactly one shipping
    read: dict[str, object] = {"supplier": line.supplier, "sku": line.sku}
    currency = offer.get("currency")
    if currency is not None:
        if type(currency) is not str or not _CURRENCY.fullmatch(currency):
            return None
        read["currency"] = currency
    try:
        if "breaks" in offer:
            read["breaks"] = _breaks(offer["breaks"])
        else:
            read["unit_cents"] = _count(offer["unitCents"], "unitCents")
        if "shipping" in offer:
            read["shipping"] = decimal_text(offer["shipping"], "shipping")
        else:
            read["shipping_cents"] = _count(offer["shippingCents"], "shippingCents")
        read["stock"] = _count(offer["stock"], "stock")
        for key in ("moq", "multiple"):
            if key in offer:
                value = offer[key]
                if type(value) is not int or not 1 <= value <= MAX_COUNT:
                    return None
                read[key] = value
    except AdapterError:
        return None
    return read


def _breaks(value: object) -> list[dict[str, object]]:
    """A batch offer's ``breaks`` as the protocol's, sorted by quantity; ``AdapterError`` if
    not a non-empty list of ``{"quantity": N, "unitPrice": "..."}``, each quantity once."""
    if type(value) is not list or not value:
        raise AdapterError("breaks: not a non-empty list")
    read: dict[int, str] = {}
    for index, entry in enumerate(value):
        if type(entry) is not dict or entry.keys() != _BREAK_KEYS:
            raise AdapterError(f"breaks[{index}]: not {{quantity, unitPrice}}")
        quantity = entry["quantity"]
        if type(quantity) is not int or not 1 <= quantity <= MAX_COUNT or quantity in read:
            raise AdapterError(f"breaks[{index}].quantity: not a positive integer, once")
        read[quantity] = decimal_text(entry["unitPrice"], f"breaks[{index}].unitPrice")
    return [{"quantity": quantity, "unit_price": read[quantity]} for quantity in sorted(read)]


def decimal_text(value: object, field: str) -> str:
    """``value`` if it is a plain decimal string of the offer protocol, else ``AdapterError``.

    ``^(0|[1-9][0-9]*)(\\.[0-9]{1,6})?$`` and at most ``MAX_MONEY_TEXT`` characters: ASCII
    digits, no leading zero, at most six decimals; no sign, exponent, spaces, underscores
    or commas (all of which :class:`~decimal.Decimal` or a float would accept), and never a
    JSON number, whose reading through a float could change it.
    """
    if type(value) is not str or len(value) > MAX_MONEY_TEXT or not _DECIMAL.fullmatch(value):
        raise AdapterError(f"{field}: not a decimal string (at most 6 decimals)")
    return value


def _count(value: object, field: str) -> int:
    if type(value) is not int or value < 0:
        raise AdapterError(f"{field}: not a non-negative integer")
    return value
