"""CPU time of pricing offers for a cart: ``python -m bench.offers``.

Issue 47's cost target: the legal buy and the conversion of 200 lines × 8
offers, each with 5 price breaks, a minimum order quantity, an order multiple
and a foreign currency, median ≤ 5 ms; and the basket on such offers within
its own targets (≤ 5 ms for 200 × 8, ≤ 50 ms for 200 × 32).

``offer_cart`` makes a seeded cart: each line needs 1 to 5,000 units
(log-uniform); each supplier quotes it in one of EUR, GBP, JPY or CHF (the
answer is in USD, so every offer is converted), with five all-units breaks at
rising quantities and falling unit prices (0.0008 to 80 major units, six
decimal places), a MOQ of 1 to 100 and a multiple of 1, 5, 10 or 25, and a
stock that sometimes falls short. Pricing is ``Pricing.price`` for every
offer, as ``service._rank`` calls it; the basket is ``service.solve_basket``'s
solve on the ranked lines.

Each cart's CPU time is the least of ``REPEAT`` runs, after a full collection.
"""

from __future__ import annotations

import datetime as dt
import gc
import math
import random
import statistics
import time
from decimal import Decimal
from typing import Any

import attrs

from bench.report import Target
from quoteflow.basket import Line, solve
from quoteflow.fx import Rates, RateTable
from quoteflow.models import OfferTerms, PriceBreak, RankedQuote, SupplierQuote
from quoteflow.money import MICROS_PER_MINOR, minor_unit
from quoteflow.offers import Pricing

NAME = "offers"
CARTS = 30
REPEAT = 3
SIZES = ((200, 8), (200, 32))
CURRENCIES = ("EUR", "GBP", "JPY", "CHF")
RATES = {"USD": "1.0850", "GBP": "0.8600", "JPY": "162.50", "CHF": "0.9400"}
PRICING_TARGET_MS = 5.0
BASKET_TARGET_MS = {"200x8": 5.0, "200x32": 50.0}
BASKET_LIMIT = 0.5
"""Seconds the basket may search, as a cart's answer would allow it (the bench's carts with
falling breaks are now and then hard to prove: the limit keeps a run short)."""


def rates() -> Rates:
    """A fresh table of today's date."""
    found = Rates(max_age=6 * 86400)
    table = {"EUR": Decimal(1), **{code: Decimal(rate) for code, rate in RATES.items()}}
    found.use(RateTable(dt.date.today(), table))
    return found


def offer_cart(seed: int, lines: int, suppliers: int) -> list[tuple[str, int, list[SupplierQuote]]]:
    """``lines`` lines (SKU, need, every supplier's offer), seeded."""
    rng = random.Random(seed)
    names = [f"supplier-{j:02d}" for j in range(suppliers)]
    currency = [CURRENCIES[j % len(CURRENCIES)] for j in range(suppliers)]
    cart = []
    for n in range(lines):
        sku = f"SKU-{n:04d}"
        need = max(1, round(math.exp(rng.uniform(0, math.log(5000)))))
        base = math.exp(rng.uniform(math.log(0.001), math.log(100)))
        offers = []
        for j, name in enumerate(names):
            places = minor_unit(currency[j])
            assert places is not None
            quantities = [1, *sorted(rng.sample(range(2, 20_000), 4))]
            price = base * rng.uniform(0.8, 1.2)
            breaks = []
            for quantity in quantities:
                breaks.append(PriceBreak(quantity, max(1, round(price * 1_000_000))))
                price *= rng.uniform(0.75, 0.97)
            terms = OfferTerms(
                currency=currency[j],
                breaks=tuple(breaks),
                moq=rng.randrange(1, 101),
                multiple=rng.choice((1, 5, 10, 25)),
                exponent=places,
            )
            offers.append(
                SupplierQuote(
                    supplier=name,
                    sku=sku,
                    shipping_cents=rng.randrange(300, 2000) // MICROS_PER_MINOR[places] * 10_000
                    if places
                    else rng.randrange(300, 2000),
                    stock=rng.choice((need * 50, 100_000, need // 2 + 1)),
                    terms=terms,
                )
            )
        cart.append((sku, need, offers))
    return cart


def price_all(cart: list[tuple[str, int, list[SupplierQuote]]], pricing: Pricing) -> None:
    """Every offer priced for its line's need: the legal buy and the conversion alone."""
    price = pricing.price
    for _, need, offers in cart:
        for quote in offers:
            price(quote, need)


def priced_lines(cart: list[tuple[str, int, list[SupplierQuote]]], pricing: Pricing) -> list[Line]:
    """Every offer priced for its line's need: the basket's input."""
    lines = []
    for sku, need, offers in cart:
        ranked = [pricing.price(quote, need) for quote in offers]
        lines.append(Line.of_quotes(sku, need, [q for q in ranked if isinstance(q, RankedQuote)]))
    return lines


def _least_ms(work: Any) -> float:
    spent = []
    for _ in range(REPEAT):
        gc.collect()
        started = time.process_time()
        work()
        spent.append((time.process_time() - started) * 1000)
    return min(spent)


def figures() -> dict[str, Any]:
    """Median, p95 and max CPU ms of pricing (200 × 8) and of the basket on priced offers."""
    pricing = Pricing("USD", {}, rates())
    found: dict[str, Any] = {}
    for lines, suppliers in SIZES:
        key = f"{lines}x{suppliers}"
        carts = [offer_cart(seed, lines, suppliers) for seed in range(CARTS)]
        names = tuple(f"supplier-{j:02d}" for j in range(suppliers))
        pricing_ms = []
        basket_ms = []
        proven = 0
        for cart in carts:
            pricing_ms.append(_least_ms(lambda cart=cart: price_all(cart, pricing)))
            lines_ = priced_lines(cart, pricing)
            basket_ms.append(
                _least_ms(
                    lambda lines_=lines_, names=names: solve(lines_, names, time_limit=BASKET_LIMIT)
                )
            )
            proven += solve(lines_, names, time_limit=BASKET_LIMIT).optimal
        found[key] = {
            "pricing": _summary(pricing_ms),
            "basket": {**_summary(basket_ms), "proven": proven, "carts": len(carts)},
        }
    return found


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "p95_ms": round(ordered[math.ceil(0.95 * len(ordered)) - 1], 2),
        "max_ms": round(ordered[-1], 2),
    }


def targets(found: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 47's cost targets: pricing 200 × 8 and the basket on priced offers."""
    pricing = found["200x8"]["pricing"]["median_ms"]
    rows = [
        Target(
            NAME,
            "legal buy + conversion, 200 lines x 8 offers: median CPU ms",
            f"{pricing}",
            "",
            "",
            f"<= {PRICING_TARGET_MS}",
            pricing <= PRICING_TARGET_MS,
        )
    ]
    for key, limit in BASKET_TARGET_MS.items():
        median = found[key]["basket"]["median_ms"]
        rows.append(
            Target(
                NAME,
                f"basket on priced offers, {key}: median CPU ms",
                f"{median}",
                "",
                "",
                f"<= {limit}",
                median <= limit,
            )
        )
    return [attrs.asdict(row) for row in rows]


def main() -> None:
    """Print each size's pricing and basket CPU."""
    found = figures()
    for key, parts in found.items():
        for part, summary in parts.items():
            proven = (
                f"; {summary['proven']}/{summary['carts']} proven" if "proven" in summary else ""
            )
            print(
                f"{key} {part:8s}: median {summary['median_ms']:.2f} ms,"
                f" p95 {summary['p95_ms']:.2f} ms, max {summary['max_ms']:.2f} ms{proven}"
            )


if __name__ == "__main__":
    main()
