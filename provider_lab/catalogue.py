"""The lab's suppliers and what each one offers.

The numbers are chosen so the lesson's cases are visible at a glance for
``KB-001``: at quantity 2 boreal is the cheapest (2450), at quantity 1 cedar is
(1100), and at quantity 2 cedar's single unit in stock filters it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

SUPPLIERS: Final = ("atlas", "boreal", "cedar")


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
}


def lookup(supplier: str, sku: str) -> Offer | None:
    """Return ``supplier``'s offer for ``sku``, or ``None`` if it does not sell it."""
    return CATALOGUE.get(sku, {}).get(supplier)
