"""Pricing an offer for one request: the legal buy, the line's amount, the conversion.

A supplier's quote is kept as it gave it (``SupplierQuote``: the cache and
coalescing share it as is); this module prices it for a need of ``n`` units in
the answer's currency, per request, so a cached offer is priced at today's rate
and two requests sharing one call each get their own quantity and currency.

    legal buy   b ≥ n, b ≥ moq, b ≥ the first break, b a multiple of ``multiple``,
                b ≤ stock; among the smallest legal b ≥ n and the smallest legal b
                at or above each break, the least line amount (ties: the smaller b)
    line        half_even(unit price of b's break × b)        the offer's minor units
    converted   half_even(line × rate_to ÷ rate_from)         the answer's minor units
                (shipping converted on its own the same way)

Why those candidates are enough: between two break quantities the unit price is
constant, so the amount only grows with b; the cheapest b of each stretch is
its smallest legal one (``tests/test_offers.py`` holds this to a brute force over
every b up to the stock). A later break whose price is not below the best found
so far cannot win either (more units at no less each), so it is skipped unpriced.

Rounding is ``money.half_even``'s alone. A quote in today's shape, in the
answer's currency, takes a fast path that computes exactly what QuoteFlow
always did (``unit_cents * n + shipping_cents``).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

import attrs

from quoteflow.fx import Rates
from quoteflow.models import (
    INVALID_DATA,
    MAX_SUPPLIED_NUMBER,
    NO_RATE,
    Failure,
    OfferTerms,
    RankedQuote,
    ShownOffer,
    SupplierQuote,
)
from quoteflow.money import (
    MICROS_PER_MINOR,
    CrossRate,
    half_even,
    minor_unit,
)


class Buy(NamedTuple):
    """The legal buy chosen for a need: how many, at which unit price, for what amount."""

    units: int
    micros: int
    """The unit price in force for ``units`` (``money.MICROS`` per major unit)."""
    amount: int
    """``units`` × that price, rounded half-even to the offer currency's minor unit."""


def legal_buy(need: int, stock: int, terms: OfferTerms) -> Buy | None:
    """The cheapest legal buy of at least ``need`` units, or None when none is legal."""
    quantities, prices, multiple = terms.quantities, terms.prices, terms.multiple
    least = max(need, terms.moq, quantities[0])
    units = -(-least // multiple) * multiple
    if units > stock:
        return None
    scale = MICROS_PER_MINOR[terms.exponent]
    best_units = units
    best_micros = prices[bisect_right(quantities, units) - 1]
    best_exact = best_micros * units
    best_amount = half_even(best_exact, scale)
    for later in range(bisect_right(quantities, units), len(quantities)):
        if prices[later] >= best_micros:
            continue  # no cheaper per unit, and more units: it cannot win
        units = -(-quantities[later] // multiple) * multiple
        if units > stock:
            break  # nor can any break after it be bought
        micros = prices[bisect_right(quantities, units) - 1]
        exact = micros * units
        if exact >= best_exact:
            continue  # rounding keeps the order: its amount is no less
        amount = half_even(exact, scale)
        if amount < best_amount:  # equal once rounded: the smaller buy stays
            best_units, best_micros, best_exact, best_amount = units, micros, exact, amount
    return Buy(best_units, best_micros, best_amount)


@attrs.frozen
class Pricing:
    """What prices one request's quotes: its answer currency, the rates, the suppliers' own."""

    currency: str
    """The answer's currency."""
    native: dict[str, str]
    """Each supplier's default currency, for a quote that names none."""
    rates: Rates | None = None
    """None: no ``--fx-rates``; only quotes in the answer's currency are usable."""

    def price(self, quote: SupplierQuote, need: int) -> RankedQuote | Failure | None:
        """``quote`` priced for ``need`` units; None: no legal buy (too little stock).

        A ``Failure``: ``no_rate`` (its currency has no fresh rate to the
        answer's), or ``invalid_data`` (an amount past 2**53 - 1 minor units,
        which no JSON reader keeps exact).
        """
        terms = quote.terms
        currency = self.currency
        if terms is None:
            offered = self.native.get(quote.supplier, currency)
            if offered == currency:
                # Today's shape in the answer's currency: exactly what it always was.
                if quote.stock < need:
                    return None
                unit_cents = quote.unit_cents
                assert unit_cents is not None
                if unit_cents * need + quote.shipping_cents > MAX_SUPPLIED_NUMBER:
                    return Failure(quote.supplier, INVALID_DATA)
                return RankedQuote.for_quantity(quote, need)
            return self._converted_as_given(quote, need, offered)
        offered = terms.currency or self.native.get(quote.supplier, currency)
        exponent = terms.exponent
        cross = None
        if offered != currency:
            rates = self.rates
            cross = None if rates is None else rates.cross(offered, currency)
            if cross is None:
                return Failure(quote.supplier, NO_RATE)
        buy = legal_buy(need, quote.stock, terms)
        if buy is None:
            return None
        line, shipping = buy.amount, quote.shipping_cents
        if line > MAX_SUPPLIED_NUMBER:
            return Failure(quote.supplier, INVALID_DATA)
        if cross is not None:
            line, shipping = cross.convert(line), cross.convert(shipping)
        total = line + shipping
        if total > MAX_SUPPLIED_NUMBER:
            return Failure(quote.supplier, INVALID_DATA)
        scale = MICROS_PER_MINOR[exponent]
        if cross is None and buy.units == need and buy.micros % scale == 0:
            # Bought as asked, in the answer's currency, a whole number of minor
            # units each: answered as today, ``total = unit_cents * n + shipping``.
            return RankedQuote(
                supplier=quote.supplier,
                sku=quote.sku,
                unit_cents=buy.micros // scale,
                shipping_cents=shipping,
                stock=quote.stock,
                total_cents=total,
                age_s=quote.age_s,
            )
        return self._offered(quote, need, offered, exponent, buy, cross, line, shipping)

    def _converted_as_given(
        self, quote: SupplierQuote, need: int, offered: str
    ) -> RankedQuote | Failure | None:
        """A quote in today's shape in another currency: bought as asked, then converted."""
        rates = self.rates
        cross = None if rates is None else rates.cross(offered, self.currency)
        if cross is None:
            return Failure(quote.supplier, NO_RATE)
        if quote.stock < need:
            return None
        unit_cents = quote.unit_cents
        assert unit_cents is not None
        amount = unit_cents * need
        if amount > MAX_SUPPLIED_NUMBER:
            return Failure(quote.supplier, INVALID_DATA)
        line, shipping = cross.convert(amount), cross.convert(quote.shipping_cents)
        if line + shipping > MAX_SUPPLIED_NUMBER:
            return Failure(quote.supplier, INVALID_DATA)
        exponent = minor_unit(offered)
        assert exponent is not None  # checked where the settings were read
        buy = Buy(need, unit_cents * MICROS_PER_MINOR[exponent], amount)
        return self._offered(quote, need, offered, exponent, buy, cross, line, shipping)

    def _offered(
        self,
        quote: SupplierQuote,
        need: int,
        offered: str,
        exponent: int,
        buy: Buy,
        cross: CrossRate | None,
        line: int,
        shipping: int,
    ) -> RankedQuote:
        """A quote not answered as today: its line, its buy and its offer as given."""
        shown = ShownOffer(
            currency=offered,
            unit_micros=buy.micros,
            shipping=quote.shipping_cents,
            exponent=exponent,
            rate=None if cross is None else cross.shown,
            rate_date=None if cross is None else cross.date,
        )
        return RankedQuote(
            supplier=quote.supplier,
            sku=quote.sku,
            shipping_cents=shipping,
            stock=quote.stock,
            total_cents=line + shipping,
            line_cents=line,
            buy_quantity=None if buy.units == need else buy.units,
            offer=shown,
            age_s=quote.age_s,
        )
