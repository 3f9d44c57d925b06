"""The lab's suppliers and what each one offers.

The numbers are chosen so the lesson's cases are visible at a glance for
``KB-001``: at quantity 2 boreal is the cheapest (2450), at quantity 1 cedar is
(1100), and at quantity 2 cedar's single unit in stock filters it out.

The lab serves atlas, boreal and cedar unless told other names (``--names``,
or the names of a QuoteFlow catalogue file, ``--suppliers``). A supplier
outside the table below offers every SKU of the table at a price and stock
derived from its name and the SKU (``derived_offer``), so a test can predict
them; ``CB-404`` and ``CAP-100N`` stay out of stock for everyone.

The foreign dialects (:mod:`provider_lab.dialects`) price by quantity from the
same offers: ``price_breaks`` derives 10+ and 100+ prices from the unit price.

Parts sold as distributors really sell passives are in :data:`PRICE_LISTS`, not
:data:`CATALOGUE`: a reel-packed range of 0402 resistors (``RES-0402-*``) at
sub-cent prices with a minimum order, an order multiple and all-units price
breaks, in USD and (boreal) EUR, and ``CAP-BULK-1``, whose 100+ break makes 100
cheaper than 90. Only atlas, boreal and cedar sell them, answering in the
offer protocol's own fields at ``/quotes/{supplier}`` and in the batch
dialect's price-list offer; the ``json`` and ``path`` dialects do not list them
(404).
"""

from __future__ import annotations

import re
import tomllib
import zlib
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal
from typing import Final

import attrs

SUPPLIERS: Final = ("atlas", "boreal", "cedar")
"""The lab's suppliers when it is given no others."""

NAME: Final = re.compile(r"[a-z0-9_-]{1,32}")
"""A supplier name, as QuoteFlow's catalogue allows it."""


@attrs.frozen
class Offer:
    """One supplier's price and stock for one SKU."""

    unit_cents: int
    shipping_cents: int
    stock: int


CATALOGUE: Final[Mapping[str, Mapping[str, Offer]]] = {
    # HOT-01 … HOT-50: fifty SKUs everyone sells, for the benchmark's ``hot``
    # workload (many callers, a few popular SKUs: coalescing and the cache).
    **{
        f"HOT-{n:02d}": {
            "atlas": Offer(unit_cents=1000 + 10 * n, shipping_cents=300, stock=40),
            "boreal": Offer(unit_cents=990 + 10 * n, shipping_cents=250, stock=40),
            "cedar": Offer(unit_cents=1010 + 10 * n, shipping_cents=200, stock=40),
        }
        for n in range(1, 51)
    },
    # BOM-001 … BOM-200: the parts of a bill of materials, for carts (``POST
    # /api/carts``). Each supplier is cheapest for some parts; cedar ships for
    # least and atlas for most, so the cheapest line by line (cedar's, often)
    # is not the cheapest cart (fewer suppliers, each shipping once).
    **{
        f"BOM-{n:03d}": {
            "atlas": Offer(unit_cents=400 + (37 * n) % 300, shipping_cents=900, stock=50_000),
            "boreal": Offer(unit_cents=400 + (53 * n) % 300, shipping_cents=600, stock=50_000),
            "cedar": Offer(unit_cents=430 + (71 * n) % 300, shipping_cents=300, stock=50_000),
        }
        for n in range(1, 201)
    },
    "KB-001": {
        "atlas": Offer(unit_cents=1200, shipping_cents=300, stock=20),
        "boreal": Offer(unit_cents=1100, shipping_cents=250, stock=50),
        "cedar": Offer(unit_cents=900, shipping_cents=200, stock=1),
    },
    # A mouse that only atlas and cedar sell: boreal answers 404 for it.
    "MS-010": {
        "atlas": Offer(unit_cents=2500, shipping_cents=0, stock=100),
        "cedar": Offer(unit_cents=2400, shipping_cents=150, stock=8),
    },
    # A monitor where atlas wins on shipping despite the higher unit price.
    "MN-270": {
        "atlas": Offer(unit_cents=18900, shipping_cents=0, stock=5),
        "boreal": Offer(unit_cents=18500, shipping_cents=900, stock=3),
        "cedar": Offer(unit_cents=18000, shipping_cents=1500, stock=2),
    },
    # Out of stock everywhere: every answer is valid, every quote is filtered out.
    "CB-404": {
        "atlas": Offer(unit_cents=300, shipping_cents=100, stock=0),
        "boreal": Offer(unit_cents=280, shipping_cents=120, stock=0),
        "cedar": Offer(unit_cents=250, shipping_cents=150, stock=0),
    },
    # A 100 nF capacitor out of stock everywhere, and its approved alternate (another
    # make of the same part), which only boreal sells: a cart line listing the
    # alternate is bought as it; a line without is unquoted.
    "CAP-100N": {
        "atlas": Offer(unit_cents=12, shipping_cents=300, stock=0),
        "boreal": Offer(unit_cents=11, shipping_cents=250, stock=0),
        "cedar": Offer(unit_cents=10, shipping_cents=200, stock=0),
    },
    "CAP-100N-B": {
        "boreal": Offer(unit_cents=14, shipping_cents=250, stock=10_000),
    },
}


@attrs.frozen
class PriceList:
    """One supplier's offer for one part as distributors quote passives: the offer protocol's
    optional fields (``currency``, ``moq``, ``multiple``, ``breaks`` or ``unit_price``,
    ``shipping`` or ``shipping_cents``) with its stock."""

    currency: str
    breaks: tuple[tuple[int, str], ...]
    """``(quantity, unit price)`` from that many units, all-units, quantities rising; the
    price a decimal string of major units (``"0.0034"``)."""
    shipping: str | int
    """A decimal string of major units (``"4.00"``), or minor units (``shipping_cents``)."""
    stock: int
    moq: int = 1
    multiple: int = 1
    single: bool = False
    """One price from 1 unit, answered as ``unit_price`` (``breaks`` holds it at 1)."""

    def classic(self) -> Offer:
        """The five classic keys' values nearest this offer: what a fault that spoils a
        field starts from (the unit price is the first break's, rounded up to a cent)."""
        cents = Decimal(self.breaks[0][1]) * 100
        shipping = self.shipping if isinstance(self.shipping, int) else Decimal(self.shipping)
        return Offer(
            unit_cents=int(cents.to_integral_value(ROUND_CEILING)),
            shipping_cents=shipping if isinstance(shipping, int) else int(shipping * 100),
            stock=self.stock,
        )


def _reel(
    currency: str,
    breaks: tuple[tuple[int, str], ...],
    shipping: str | int,
    stock: int,
    moq: int = 1,
    multiple: int = 1,
) -> PriceList:
    return PriceList(currency, breaks, shipping, stock, moq, multiple)


CUT_TAPE_10: Final = ((1, "0.0100"), (100, "0.0060"), (1000, "0.0034"))
"""Atlas's 0402 prices: 1 cent each, 0.6 from 100, 0.34 from 1000 (bought in tens)."""

PRICE_LISTS: Final[Mapping[str, Mapping[str, PriceList]]] = {
    # 0402 resistors. atlas: moq 10, multiple 10 (a need of 7 is bought as 10), USD;
    # boreal: EUR; cedar: cut tape from 1 unit, or a reel of 5000.
    "RES-0402-1K": {
        "atlas": _reel("USD", CUT_TAPE_10, "4.00", 50_000, moq=10, multiple=10),
        "boreal": _reel("EUR", ((5000, "0.0021"),), "6.50", 200_000, moq=5000, multiple=5000),
        "cedar": _reel("USD", ((1, "0.0200"), (10, "0.0120"), (100, "0.0075")), "2.50", 3_000),
    },
    "RES-0402-10K": {
        "atlas": _reel(
            "USD", ((1, "0.0100"), (100, "0.0058"), (1000, "0.0033")), "4.00", 40_000, 10, 10
        ),
        "boreal": _reel(
            "EUR", ((10, "0.0095"), (100, "0.0052"), (1000, "0.0030")), "3.00", 80_000, 10, 10
        ),
        "cedar": _reel("USD", ((5000, "0.0019"),), 500, 100_000, moq=5000, multiple=5000),
    },
    "RES-0402-100K": {
        "atlas": _reel(
            "USD", ((1, "0.0110"), (100, "0.0062"), (1000, "0.0036")), "4.00", 25_000, 10, 10
        ),
        "boreal": PriceList("EUR", ((1, "0.0041"),), "3.00", 60_000, 100, 100, single=True),
        "cedar": _reel("USD", ((1, "0.0180"), (50, "0.0090")), "2.50", 500),
    },
    # boreal does not sell this one (404).
    "RES-0402-4K7": {
        "atlas": _reel("USD", CUT_TAPE_10, "4.00", 30_000, moq=10, multiple=10),
        "cedar": _reel("USD", ((5000, "0.0020"),), "5.00", 50_000, moq=5000, multiple=5000),
    },
    # Bulk capacitors: at atlas 90 cost 450.00 but 100 cost 400.00 (the 100+ break);
    # cedar's one price, 4.60, is between. boreal does not sell them (404).
    "CAP-BULK-1": {
        "atlas": _reel("USD", ((1, "5.00"), (100, "4.00")), "0.00", 500),
        "cedar": PriceList("USD", ((1, "4.60"),), 300, 1_000, single=True),
    },
}
"""Parts quoted in the offer protocol's fields, by SKU and supplier (atlas, boreal, cedar)."""


def price_list(supplier: str, sku: str) -> PriceList | None:
    """``supplier``'s price list for ``sku`` (:data:`PRICE_LISTS`), or ``None``."""
    offers = PRICE_LISTS.get(sku)
    return None if offers is None else offers.get(supplier)


def lookup(supplier: str, sku: str) -> Offer | None:
    """Return ``supplier``'s offer for ``sku``, or ``None`` if it does not sell it."""
    offers = CATALOGUE.get(sku)
    if offers is None:
        return None
    if supplier in SUPPLIERS:
        return offers.get(supplier)
    return derived_offer(supplier, sku)


OUT_OF_STOCK: Final = frozenset({"CB-404", "CAP-100N"})
"""SKUs no supplier has in stock, whatever its name."""


def derived_offer(supplier: str, sku: str) -> Offer:
    """The offer of a supplier outside the table: a function of its name and the SKU.

    ``h = crc32("{supplier}:{sku}")``; unit ``500 + h % 2000`` cents, shipping
    ``(h >> 11) % 500`` cents, stock ``1 + (h >> 20) % 99`` (0 for ``OUT_OF_STOCK``).
    """
    h = zlib.crc32(f"{supplier}:{sku}".encode())
    stock = 0 if sku in OUT_OF_STOCK else 1 + (h >> 20) % 99
    return Offer(unit_cents=500 + h % 2000, shipping_cents=(h >> 11) % 500, stock=stock)


BREAKS: Final = ((1, 100), (10, 90), (100, 80))
"""Price breaks of the foreign dialects: from this many units, this percentage of the unit price."""


def price_breaks(offer: Offer) -> tuple[tuple[int, int], ...]:
    """``(min_quantity, unit_cents)`` from 1, 10 and 100 units, ascending.

    The 1+ price is ``offer.unit_cents`` (what ``/quotes/{supplier}`` answers);
    10+ is 90 % of it and 100+ 80 %, rounded to whole cents, half up.
    """
    return tuple((least, (offer.unit_cents * percent + 50) // 100) for least, percent in BREAKS)


def break_price(offer: Offer, quantity: int) -> int:
    """The unit price in cents for ``quantity`` units: the break with the largest minimum ≤ it."""
    price = offer.unit_cents
    for least, unit_cents in price_breaks(offer):
        if least <= quantity:
            price = unit_cents
    return price


class NamesError(ValueError):
    """A list of supplier names, or a catalogue file, the lab cannot serve."""


def check_names(names: list[str], source: str) -> tuple[str, ...]:
    """``names`` if each is a valid supplier name, once; else ``NamesError``."""
    if not names:
        raise NamesError(f"{source}: no supplier names")
    for name in names:
        if not NAME.fullmatch(name):
            raise NamesError(f"{source}: {name!r} is not 1-32 characters of a-z, 0-9, _ and -")
    if len(set(names)) != len(names):
        raise NamesError(f"{source}: a supplier is named twice")
    return tuple(names)


def names_from_file(path: str) -> tuple[str, ...]:
    """The supplier names of a QuoteFlow catalogue file, in its order (the rest is ignored)."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise NamesError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise NamesError(f"{path}: not TOML: {exc}") from None
    tables = document.get("supplier")
    if not isinstance(tables, list):
        raise NamesError(f"{path}: no [[supplier]] table")
    names = [table.get("name") if isinstance(table, dict) else None for table in tables]
    if not all(isinstance(name, str) for name in names):
        raise NamesError(f"{path}: a [[supplier]] table without a name")
    return check_names([str(name) for name in names], path)
